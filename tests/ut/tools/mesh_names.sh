#!/usr/bin/env bash
# Framework code works from mesh roles: outside backends/dist/mesh.* and
# plugins/, no source names a mesh dimension ("tp", "pp", "ep", "cp", "dp",
# "edp") as a string (comments aside).
set -uo pipefail
ROOT=$1
cd "$ROOT" || exit 1
hits=$(grep -rnE '"(tp|pp|ep|cp|dp|edp)([+"])' --include=*.cpp --include=*.h framework backends checkpoint tools \
         | grep -v '^backends/dist/mesh\.' | grep -vE '^[^:]+:[0-9]+:\s*//' )
if [[ -n "$hits" ]]; then
  echo "FAIL: mesh dimensions named outside the mesh and the plugins:"
  echo "$hits"
  exit 1
fi
echo PASS
