#!/usr/bin/env bash
# No plugin spells a checkpoint file name: include/hp/checkpoint/file_names.h is the one
# place that knows them (model_file_name, optim_file_name, part_file_name,
# failed_file_name, staging_dir, step_dir_name, kManifestFileName, ...), and
# every checkpoint IO calls it. Greps every file under plugins/ for the
# patterns of those names; first proves on a planted file that each pattern
# is caught, so the check cannot pass by matching nothing.
# Usage: plugin_checkpoint_names.sh SOURCE_DIR. Exit 1 naming file:line per hit.
set -uo pipefail
SRC=${1:?usage: plugin_checkpoint_names.sh SOURCE_DIR}

# rule|Perl regex
rules=(
  'a tensor file (ckpt::model_file_name / optim_file_name)|safetensors'
  'a per-rank file name pattern (include/hp/checkpoint/file_names.h)|rank%0?\d*d'
  'the manifest (ckpt::kManifestFileName)|manifest\.json'
  'the run state file (ckpt::kStateFileName)|\bstate\.json\b'
  'a rank part of the manifest (ckpt::part_file_name)|shards-rank'
  'a failed-rank file (ckpt::failed_file_name)|failed-rank'
  'a step directory name (ckpt::step_dir_name)|step_%|step_\d{8}'
  'the staging directory (ckpt::staging_dir)|\.tmp\b'
  'the latest pointer (ckpt::kLatestFileName)|"latest"'
)

# scan DIR: prints file:line: rule: text for every hit, returns the count.
scan() {
  local dir=$1 found=0 r what re hit f rest
  mapfile -t files < <(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cc' -o -name '*.hpp' \
                                              -o -name '*.txt' -o -name '*.cmake' -o -name '*.sh' -o -name '*.py' \) | sort)
  ((${#files[@]})) || { echo "FAIL: no source files under $dir"; exit 1; }
  for r in "${rules[@]}"; do
    what=${r%%|*} re=${r#*|}
    while IFS= read -r hit; do
      f=${hit%%:*} rest=${hit#*:}
      echo "${f#"$SRC"/}:${rest%%:*}: $what: ${rest#*:}"
      found=$((found + 1))
    done < <(grep -InHP -- "$re" "${files[@]}")
  done
  return $((found > 255 ? 255 : found))
}

# Every rule catches its own planted line.
plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
cat > "$plant/planted.cpp" <<'CPP'
std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind, rank);
auto p = dir / "manifest.json"; auto s = dir / "state.json";
auto part = "shards-rank00001.json"; auto why = "failed-rank00001.txt";
auto step = "step_%08lld"; auto staging = name + ".tmp"; auto l = root / "latest";
CPP
planted=$(scan "$plant")
for r in "${rules[@]}"; do
  grep -qF -- ": ${r%%|*}: " <<<"$planted" || { echo "FAIL: the rule '${r%%|*}' does not catch its planted line"; exit 1; }
done

scan "$SRC/plugins"
n=$?
if ((n)); then
  echo "FAIL: $n place(s) in plugins/ spell a checkpoint file name; call include/hp/checkpoint/file_names.h instead"
  exit 1
fi
echo "PASS: no plugin spells a checkpoint file name (${#rules[@]} patterns, each proven on a planted line)"
