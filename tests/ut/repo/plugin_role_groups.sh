#!/usr/bin/env bash
# Plugins state placements, never group strings: no plugin joins groups with
# '+' ("tp+dp"), names the mesh's own data dimension ("dp": gradients are
# summed over what the mesh's roles say, BuildContext derives it), or names a
# dimension another plugin registers. A plugin may spell the dimensions it
# registers itself (plan.claim / carve / view / flatten, directly or through
# a `const char* kName = "..."` used there), but not what a carve leaves of
# the data ranks: the mesh names that (ProcessMesh::carve_remainder, "ep" ->
# "edp"), so no plugin spells it. First proves on planted folders
# that every rule catches its line, so the check cannot pass by matching
# nothing. Usage: plugin_role_groups.sh SOURCE_DIR. Exit 1 naming file:line.
set -uo pipefail
SRC=${1:?usage: plugin_role_groups.sh SOURCE_DIR}

sources() { find "$1" -type f \( -name '*.h' -o -name '*.cpp' \) | sort; }

# The dimension names a plugin folder registers.
owned() {
  local dir=$1 consts line
  mapfile -t files < <(sources "$dir")
  ((${#files[@]})) || return 0
  consts=$(grep -hoP 'const char\s*\*\s*\Kk\w+\s*=\s*"[a-z_]+"' "${files[@]}" | tr -d ' ')
  grep -hP 'plan\.(claim|carve|view|flatten)\(' "${files[@]}" | while IFS= read -r line; do
    grep -oP '"\K[a-z_]{1,8}(?=")' <<<"$line"
    for c in $consts; do
      [[ $line == *"${c%%=*}"* ]] && { v=${c#*=}; echo "${v//\"/}"; }
    done
  done | sort -u
}

# The names the mesh gives the remainders of the carves in a plugin folder:
# the carved dimension without a trailing 'p', then "dp".
remainders() {
  local dir=$1 consts line arg
  mapfile -t files < <(sources "$dir")
  ((${#files[@]})) || return 0
  consts=$(grep -hoP 'const char\s*\*\s*\Kk\w+\s*=\s*"[a-z_]+"' "${files[@]}" | tr -d ' ')
  grep -hoP 'plan\.carve\(\s*\K[^,]+' "${files[@]}" | while IFS= read -r arg; do
    arg=${arg//\"/}
    for c in $consts; do [[ $arg == "${c%%=*}" ]] && { arg=${c#*=}; arg=${arg//\"/}; }; done
    [[ ${#arg} -gt 1 && $arg == *p ]] && arg=${arg%p}
    echo "${arg}dp"
  done | sort -u
}

# scan ROOT: prints dir/file:line: rule: text per hit; returns the count.
scan() {
  local root=$1 found=0 d f hit name
  declare -A own
  local all=()
  local mesh_named=(dp)
  for d in "$root"/*/; do
    own[$d]=$(owned "$d")
    all+=(${own[$d]})
    mesh_named+=($(remainders "$d"))
  done
  for d in "$root"/*/; do
    mapfile -t files < <(sources "$d")
    ((${#files[@]})) || continue
    while IFS= read -r hit; do
      echo "${root##*/}/${hit#"$root"/}: a '+'-joined group string (state placements; BuildContext derives gradient sums)"
      found=$((found + 1))
    done < <(grep -InHP -- '"[a-z_]+\+[a-z_]+"|"\+"|'"'"'\+'"'" "${files[@]}")
    for name in $(printf '%s\n' "${mesh_named[@]}" | sort -u); do
      while IFS= read -r hit; do
        echo "${root##*/}/${hit#"$root"/}: names mesh dimension '$name', which the mesh names (its data dimension, or what a carve leaves of it)"
        found=$((found + 1))
      done < <(grep -InHP -- "\"$name\"" "${files[@]}")
    done
    for name in $(printf '%s\n' "${all[@]}" | sort -u); do
      [[ " ${own[$d]//$'\n'/ } " == *" $name "* ]] && continue
      while IFS= read -r hit; do
        echo "${root##*/}/${hit#"$root"/}: names mesh dimension '$name', which this plugin does not register"
        found=$((found + 1))
      done < <(grep -InHP -- "\"$name\"" "${files[@]}")
    done
  done
  return $((found > 255 ? 255 : found))
}

plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant/a" "$plant/b"
cat > "$plant/a/a.cpp" <<'CPP'
const char* kRows = "xa";
const char* kCols = "xp";
void plan_mesh(MeshPlan& plan) { plan.claim(kRows, 2, "a", MeshRole::kSplit); plan.carve(kCols, 2, "a", MeshRole::kSplit); }
auto s = ctx.param(m, n, l, shape, init, {{kRows, Placement::shard(0)}});
auto g = ctx.group("xdp");
CPP
cat > "$plant/b/b.cpp" <<'CPP'
void plan_mesh(MeshPlan& plan) { plan.claim("xb", 2, "b", MeshRole::kSplit); }
auto g = ctx.group("xa");
auto h = ctx.group("dp");
std::string joined = "xb+dp";
CPP
planted=$(scan "$plant")
for want in "b/b.cpp:2:.*: names mesh dimension 'xa'" "b/b.cpp:3:.*: names mesh dimension 'dp'" \
            "b/b.cpp:4:.*: a '[+]'-joined group string" "a/a.cpp:5:.*: names mesh dimension 'xdp', which the mesh names"; do
  grep -qE -- "$want" <<<"$planted" || { echo "FAIL: the planted line '$want' was not caught; got: $planted"; exit 1; }
done
(($(wc -l <<<"$planted") == 4)) || { echo "FAIL: the planted folders gave other hits: $planted"; exit 1; }

scan "$SRC/plugins"
n=$?
if ((n)); then
  echo "FAIL: $n place(s) in plugins/ spell role groups; state placements (include/hp/comm/placement.h) instead"
  exit 1
fi
echo "PASS: no plugin spells a role group (joins, the data dimension or a carve's remainder, another plugin's dimensions; each rule proven on a planted line)"
