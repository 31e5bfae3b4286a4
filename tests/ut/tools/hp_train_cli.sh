#!/usr/bin/env bash
# hp-train's command line: --dry-run prints the resolved config and the mesh;
# a config with three mistakes prints three lines, exits 2 and starts nothing.
set -uo pipefail
HP_TRAIN=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cat > "$dir/ok.yaml" <<'YAML'
model: {layers: 2, hidden: 64, heads: 4}
data: {type: synthetic}
training: {max_steps: 3, global_batch_size: 8, micro_batch_size: 2}
YAML

out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 4 --dry-run 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "dry-run exit $rc: $out"
grep -q "^  layers: 2$" <<<"$out" || fail "resolved config missing: $out"
grep -q "^  lr: 0.001$" <<<"$out" || fail "defaults not filled in: $out"
grep -q "mesh dp=4 (world 4)" <<<"$out" || fail "mesh missing: $out"
grep -q "rank 3 -> dp 3 ->" <<<"$out" || fail "rank table missing: $out"
grep -q "hp-launch" <<<"$out" && fail "dry-run launched workers: $out"
grep -q "^  groups dp: 1 of 4; rank 0 in \[0,1,2,3\], rank 3 in \[0,1,2,3\]$" <<<"$out" || fail "group summary missing: $out"

# A dry run starts nothing, so it checks any world size: 16,384 ranks
# (pp 8 x dp 256 x tp 8) print the summary, not 16,384 rank lines (those on
# request); resolving the mesh is O(world), so it takes about what 4 ranks take.
big=(--nproc 16384 --set model.layers=16 --set model.heads=8 --set training.global_batch_size=2048
     --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=8
     --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=8)
out=$("$HP_TRAIN" "$dir/ok.yaml" "${big[@]}" --dry-run 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "dry-run at 16384 ranks: exit $rc: $out"
grep -q "mesh pp=8 dp=256 tp=8 (world 16384)" <<<"$out" || fail "16384-rank mesh missing: $out"
grep -q "^  groups dp: 64 of 256; rank 0 in \[0,8,16,24,...,2032,2040\]" <<<"$out" || fail "dp summary: $out"
grep -q "^  (16384 ranks: one line each with --dry-run --all-ranks)$" <<<"$out" || fail "no note on --all-ranks: $out"
grep -q "^  rank " <<<"$out" && fail "rank lines without --all-ranks at 16384 ranks"
n=$("$HP_TRAIN" "$dir/ok.yaml" "${big[@]}" --dry-run --all-ranks 2>&1 | grep -c "^  rank ")
[[ $n -eq 16384 ]] || fail "--all-ranks printed $n rank lines, expected 16384"
# The experts' kernel chosen from the environment: a bad choice is refused
# before anything starts, exit 2, naming the variable and the legal values.
out=$(HP_PACKED_GEMM_KERNEL=avx3 "$HP_TRAIN" "$dir/ok.yaml" --nproc 2 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "HP_PACKED_GEMM_KERNEL=avx3: expected exit 2, got $rc: $out"
grep -qxF "hp-train: HP_PACKED_GEMM_KERNEL='avx3' is not a packed expert kernel (legal: avx2, avx512; unset: the CPU's best); nothing was started" <<<"$out" || fail "$out"
grep -q "hp-launch" <<<"$out" && fail "a bad kernel choice started workers: $out"
if ! grep -qw avx512f /proc/cpuinfo; then
  out=$(HP_PACKED_GEMM_KERNEL=avx512 "$HP_TRAIN" "$dir/ok.yaml" --dry-run 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "HP_PACKED_GEMM_KERNEL=avx512 without AVX-512F: expected exit 2, got $rc: $out"
  grep -qF "HP_PACKED_GEMM_KERNEL=avx512: this CPU lacks AVX-512F" <<<"$out" || fail "$out"
fi
# Threads per worker must be positive; dump steps are steps (from 1).
out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 2 --threads-per-worker 0 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "--threads-per-worker 0: expected exit 2, got $rc: $out"
grep -q "threads-per-worker" <<<"$out" || fail "--threads-per-worker 0: $out"
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set 'training.dump_routing_steps=[0,2]' 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "dump_routing_steps [0,2]: expected exit 2, got $rc: $out"
grep -q "^config error: training.dump_routing_steps = \[0, 2\]" <<<"$out" || fail "$out"
# Started for real, that many local processes is refused, exit 2.
out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 5000 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "--nproc 5000: expected exit 2, got $rc: $out"
grep -qF "hp-train: --nproc 5000: at most 4096 local processes can be started" <<<"$out" || fail "$out"

# Three different mistakes: unknown key, wrong type, cross-field rule.
out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 4 --dry-run --set model.layerz=3 \
      --set optimizer.lr=fast --set training.micro_batch_size=3 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "expected exit 2, got $rc: $out"
[[ $(grep -c "^config error: " <<<"$out") -eq 3 ]] || fail "expected 3 error lines: $out"
grep -q "model.layerz = 3: unknown key (did you mean 'model.layers'?)" <<<"$out" || fail "$out"
grep -q "optimizer.lr = fast: expected a number (legal: a number in \[0, 10\])" <<<"$out" || fail "$out"
grep -q "training.global_batch_size = 8: must be divisible by micro_batch_size x data-parallel size = 3 x 4 = 12" <<<"$out" || fail "$out"

# The same refusal without --dry-run: still nothing is started (no launcher,
# no worker, no process group) and the exit code is 2.
out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 4 --set model.layerz=3 --set optimizer.lr=fast \
      --set training.micro_batch_size=3 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "expected exit 2 without dry-run, got $rc"
grep -qE "hp-launch|\[rank|joined" <<<"$out" && fail "something started: $out"

# run.profile: a listed step the run never reaches is refused (only with the
# profile on); profile options off by default need nothing.
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set run.profile.enabled=true --set 'run.profile.steps=[2,40]' 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "profile steps past max_steps: expected exit 2, got $rc: $out"
grep -qF "config error: run.profile.steps = [2, 40]: step 40 is past training.max_steps = 3, so it would never be recorded (legal: steps 1 .. 3)" <<<"$out" || fail "$out"
"$HP_TRAIN" "$dir/ok.yaml" --dry-run --set 'run.profile.steps=[2,40]' > /dev/null 2>&1 || fail "profile off refused its steps"

# A missing config file and malformed YAML are config errors too.
out=$("$HP_TRAIN" "$dir/nope.yaml" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "cannot read the config file" <<<"$out" || fail "missing file: $rc $out"
printf 'model: {layers: 2\n' > "$dir/bad.yaml"
out=$("$HP_TRAIN" "$dir/bad.yaml" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "bad.yaml:.*not valid YAML" <<<"$out" || fail "bad yaml: $rc $out"

# --options-markdown prints the table the RFCs carry.
out=$("$HP_TRAIN" --options-markdown 2>&1) || fail "options-markdown failed"
grep -q '| `training.micro_batch_size` | int | `4` | no |' <<<"$out" || fail "$out"
# The unet model and the field task go together; the grid halves, so it is even.
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set model.type=unet --set model.seq_len=15 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "unet on synthetic: expected exit 2, got $rc: $out"
grep -qF "data.type = synthetic: model 'unet' reads input 'field', which this dataset does not produce (legal: field)" <<<"$out" || fail "$out"
grep -qF "model.seq_len = 15: unet halves the grid in its down-sample block, so it must be even (legal: an even number)" <<<"$out" || fail "$out"
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set data.type=field 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "field with gpt: expected exit 2, got $rc: $out"
grep -qF "data.type = field: model 'gpt' reads input 'tokens', which this dataset does not produce (legal: text, synthetic, tokens)" <<<"$out" || fail "$out"
# A text corpus yields bytes: a smaller vocabulary is refused, naming the model's own key.
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set data.type=text --set model.vocab_size=100 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "vocab 100 on text: expected exit 2, got $rc: $out"
grep -qF "model.vocab_size = 100: is below 256, but data.type text yields tokens 0..255 (legal: >= 256)" <<<"$out" || fail "$out"
# zero has stages 1 to 3: each is accepted, a fourth refused by its range.
for st in 1 2 3; do
  out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 2 --dry-run --set features.zero.enabled=true --set features.zero.stage=$st 2>&1) \
    || fail "zero stage $st refused: $out"
done
out=$("$HP_TRAIN" "$dir/ok.yaml" --nproc 2 --dry-run --set features.zero.enabled=true --set features.zero.stage=4 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "zero stage 4: expected exit 2, got $rc: $out"
grep -qxF "config error: features.zero.stage = 4: out of range (legal: an integer in [1, 3])" <<<"$out" || fail "$out"
# A stall is reported while the others still wait: below the timeout.
out=$("$HP_TRAIN" "$dir/ok.yaml" --dry-run --set distributed.stall_seconds=400 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "stall above timeout: expected exit 2, got $rc: $out"
grep -qF "distributed.stall_seconds = 400.0: must be below distributed.timeout_seconds = 300.0 (a stall is reported while the others still wait) (legal: less than 300.0)" <<<"$out" || fail "$out"
echo "PASS"
