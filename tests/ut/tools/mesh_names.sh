#!/usr/bin/env bash
# Framework code works from mesh roles: outside backends/dist/mesh.* (which
# owns only the data-parallel remainder's name) and plugins/, no source names
# a mesh dimension ("tp", "pp", "ep", "cp", "dp", "edp") as a string
# (comments aside). tools/hp_ckpt/layout.* is the one exception: it builds
# the shipped features' layouts for hp-ckpt's --tp/--dp/--ep/--pp and the
# tests, making the same claims the plugins make.
# Plugins name only their own dimensions: never the mesh's data dimension
# ("dp") and never a joined group ("tp+dp"); they ask the mesh for those.
set -uo pipefail
ROOT=$1
cd "$ROOT" || exit 1
status=0
hits=$(grep -rnE '"(tp|pp|ep|cp|dp|edp)([+"])' --include=*.cpp --include=*.h framework backends checkpoint tools \
         | grep -v '^backends/dist/mesh\.' | grep -v '^tools/hp_ckpt/layout\.' | grep -vE '^[^:]+:[0-9]+:\s*//' )
if [[ -n "$hits" ]]; then
  echo "FAIL: mesh dimensions named outside the mesh and the plugins:"
  echo "$hits"
  status=1
fi
hits=$(grep -rnE '"dp"|"[a-z_]+\+[a-z_+]+"' --include=*.cpp --include=*.h plugins | grep -vE '^[^:]+:[0-9]+:\s*//')
if [[ -n "$hits" ]]; then
  echo "FAIL: a plugin spells the data dimension or a joined role group (ask BuildContext::data_sync / the mesh):"
  echo "$hits"
  status=1
fi
[[ $status == 0 ]] && echo PASS
exit $status
