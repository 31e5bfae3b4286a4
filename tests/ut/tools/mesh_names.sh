#!/usr/bin/env bash
# Framework code works from mesh roles: outside the mesh (backends/comm/mesh.cpp
# and include/hp/comm/mesh.h, which
# owns the data-parallel remainder's name and names what a carve leaves of
# it) and plugins/, no source names
# a mesh dimension ("tp", "pp", "ep", "cp", "dp", "edp") as a string
# (comments aside). tools/hp_ckpt/layout.* is the one exception: it builds
# the shipped features' layouts for hp-ckpt's --tp/--dp/--ep/--pp and the
# tests, making the same claims the plugins make.
# What plugins may name is checked by ut.repo.plugin_role_groups.
set -uo pipefail
ROOT=$1
cd "$ROOT" || exit 1
status=0
hits=$(grep -rnE '"(tp|pp|ep|cp|dp|edp)([+"])' --include=*.cpp --include=*.h framework backends checkpoint include tools \
         | grep -v '^backends/comm/mesh\.' | grep -v '^include/hp/comm/mesh\.h' | grep -v '^tools/hp_ckpt/layout\.' | grep -vE '^[^:]+:[0-9]+:\s*//' )
if [[ -n "$hits" ]]; then
  echo "FAIL: mesh dimensions named outside the mesh and the plugins:"
  echo "$hits"
  status=1
fi
[[ $status == 0 ]] && echo PASS
exit $status
