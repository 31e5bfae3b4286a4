# Shared by the config-error tests: hp-train --dry-run on "$dir/c.yaml".
# Source it after setting HP_TRAIN; write the config to "$dir/c.yaml".
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# refused EXPECTED-LINE NPROC ARGS...: the dry run exits 2 and prints the line.
refused() {
  local want=$1 n=$2
  shift 2
  out=$("$HP_TRAIN" "$dir/c.yaml" --nproc "$n" --dry-run "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "expected exit 2, got $rc: $out"
  grep -qF -- "$want" <<<"$out" || fail "missing '$want' in: $out"
}
