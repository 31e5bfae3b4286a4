#!/usr/bin/env bash
# The plugin API is the folder include/hp/ and nothing else:
#  - a plugin (plugins/<name>/) includes headers of include/hp/ ("hp/...")
#    and its own ("plugins/<name>/..."), no other header of the project;
#  - a header of include/hp/ includes only headers of include/hp/ (no
#    forwarding to framework/, backends/ or checkpoint/);
#  - the core (framework/, backends/, checkpoint/, include/) includes nothing
#    from tools/ or plugins/.
# First proves on a planted tree that each rule catches its own violation,
# so the check cannot pass by matching nothing.
# Usage: plugin_api.sh SOURCE_DIR. Exit 1 naming file:line and the rule per hit.
set -uo pipefail
SRC=${1:?usage: plugin_api.sh SOURCE_DIR}

# check ROOT: prints "file:line: rule: include" per violation; returns the count.
check() {
  local root=$1 found=0 f line inc rel name
  # include "X" or include <X> naming a project folder.
  local re='^\s*#\s*include\s*[<"]((hp|plugins|framework|backends|checkpoint|tools|include)/[^">]+)[">]'
  while IFS= read -r f; do
    rel=${f#"$root"/}
    name=${rel#plugins/}; name=${name%%/*}
    while IFS=: read -r line inc; do
      case $inc in
        hp/*|plugins/"$name"/*) ;;
        *) echo "$rel:$line: a plugin includes only include/hp/ and its own folder: $inc"; found=$((found + 1)) ;;
      esac
    done < <(grep -nP "$re" "$f" | sed -E 's/^([0-9]+):.*[<"]([^">]+)[">].*/\1:\2/')
  done < <(find "$root/plugins" -mindepth 2 -type f \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null | sort)
  while IFS= read -r f; do
    rel=${f#"$root"/}
    while IFS=: read -r line inc; do
      if [[ $inc != hp/* ]]; then
        echo "$rel:$line: a header of the plugin API includes only include/hp/: $inc"; found=$((found + 1))
      elif [[ ! -f $root/include/$inc && $inc != hp/plugin/api_hash.h ]]; then
        echo "$rel:$line: a header of the plugin API includes one that is not in include/hp/: $inc"; found=$((found + 1))
      fi
    done < <(grep -nP "$re" "$f" | sed -E 's/^([0-9]+):.*[<"]([^">]+)[">].*/\1:\2/')
  done < <(find "$root/include" -type f -name '*.h' 2>/dev/null | sort)
  while IFS= read -r f; do
    rel=${f#"$root"/}
    while IFS=: read -r line inc; do
      case $inc in
        tools/*|plugins/*) echo "$rel:$line: the core includes nothing from tools/ or plugins/: $inc"; found=$((found + 1)) ;;
      esac
    done < <(grep -nP "$re" "$f" | sed -E 's/^([0-9]+):.*[<"]([^">]+)[">].*/\1:\2/')
  done < <(find "$root/framework" "$root/backends" "$root/checkpoint" "$root/include" -type f \
             \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null | sort)
  return $((found > 255 ? 255 : found))
}

# Each rule catches its planted line.
plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant"/plugins/bad "$plant"/include/hp/x "$plant"/framework/trainer
printf '#include "hp/x/ok.h"\n#include "plugins/bad/own.h"\n#include "framework/trainer/trainer.h"\n#include "plugins/other/y.h"\n#include <backends/comm/mesh.h>\n' \
  > "$plant/plugins/bad/bad.cpp"
printf '#include "hp/x/ok.h"\n#include "checkpoint/reader.h"\n#include "hp/x/missing.h"\n' > "$plant/include/hp/x/fwd.h"
printf '#pragma once\n' > "$plant/include/hp/x/ok.h"
printf '#include "tools/hp_report/report.h"\n' > "$plant/framework/trainer/run.cpp"
out=$(check "$plant")
n=$?
expect=(
  "plugins/bad/bad.cpp:3: a plugin includes only include/hp/ and its own folder: framework/trainer/trainer.h"
  "plugins/bad/bad.cpp:4: a plugin includes only include/hp/ and its own folder: plugins/other/y.h"
  "plugins/bad/bad.cpp:5: a plugin includes only include/hp/ and its own folder: backends/comm/mesh.h"
  "include/hp/x/fwd.h:2: a header of the plugin API includes only include/hp/: checkpoint/reader.h"
  "include/hp/x/fwd.h:3: a header of the plugin API includes one that is not in include/hp/: hp/x/missing.h"
  "framework/trainer/run.cpp:1: the core includes nothing from tools/ or plugins/: tools/hp_report/report.h"
)
for e in "${expect[@]}"; do
  grep -qxF -- "$e" <<<"$out" || { echo "FAIL: the planted violation was not reported: $e"; echo "$out"; exit 1; }
done
((n == ${#expect[@]})) || { echo "FAIL: $n reports on the planted tree, expected ${#expect[@]}:"; echo "$out"; exit 1; }

check "$SRC"
n=$?
if ((n)); then
  echo "FAIL: $n include(s) outside the plugin API; move what a plugin needs into include/hp/ (an extension point)"
  exit 1
fi
plugins=$(find "$SRC/plugins" -mindepth 1 -maxdepth 1 -type d | wc -l)
headers=$(find "$SRC/include/hp" -name '*.h' | wc -l)
echo "PASS: $plugins plugins include only include/hp/ ($headers headers) and their own files; the API includes only itself; the core includes nothing from tools/ or plugins/ (each rule proven on a planted line)"
