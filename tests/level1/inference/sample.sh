#!/usr/bin/env bash
# training.sample_interval: a byte-level GPT trained 10 steps on a fortune
# file, sampling every 5 steps, at one process, pp=2 and ZeRO-3 over two
# ranks: the losses equal (bitwise: same machine, layout and kernels) those
# of the same run without sampling (generating leaves training untouched);
# rank 0 logs each sample and metrics.jsonl holds it as `sample` at steps 5
# and 10, beginning with the prompt; hp-report lists them. Refused before
# start (exit 2, one line naming the key): an empty prompt, a data type
# without a tokenizer, a prompt longer than model.seq_len.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1
text_config "$WORK/c.yaml" 48
sed -i 's/max_steps: 20/max_steps: 10/' "$WORK/c.yaml"
SAMPLE=(--set training.sample_interval=5 --set "training.sample_prompt=The computer" --set training.sample_tokens=12)
run() {  # NAME NPROC ARGS...
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" --set run.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 \
    || { tail "$WORK/$name.log"; fail "training $name"; }
}
run one 1
run one_s 1 "${SAMPLE[@]}"
PP=(--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2)
run pp 2 "${PP[@]}"
run pp_s 2 "${PP[@]}" "${SAMPLE[@]}"
Z3=(--set features.zero.enabled=true --set features.zero.stage=3)
run z3 2 "${Z3[@]}"
run z3_s 2 "${Z3[@]}" "${SAMPLE[@]}"
python3 - "$WORK" <<'PY' || fail "sampling changed training, or the samples are missing"
import json, sys
w = sys.argv[1]
bad = 0
for name in ["one", "pp", "z3"]:
    a = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (w, name))]
    b = [json.loads(l) for l in open("%s/%s_s/metrics.jsonl" % (w, name))]
    la = [(r["step"], r["loss"]) for r in a if "loss" in r]
    lb = [(r["step"], r["loss"]) for r in b if "loss" in r]
    samples = {r["step"]: r["sample"] for r in b if "sample" in r}
    ok = la == lb and len(la) > 0 and sorted(samples) == [5, 10] and all(
        s.startswith("The computer") and len(s) > len("The computer") for s in samples.values())
    print("%s: %d logged losses %s; samples %s" % (name, len(la), "equal" if la == lb else "DIFFER", samples))
    bad += not ok
sys.exit(1 if bad else 0)
PY
grep -q "step 10 | sample (12 tokens" "$WORK/pp_s.log" || fail "rank 0 did not log the sample"
"$BIN/hp-report" "$WORK/one_s" > /dev/null 2>&1 || fail "hp-report"
grep -q 'id="samples"' "$WORK/one_s/report.html" && grep -q '<pre class="sample">The computer' "$WORK/one_s/report.html" \
  || fail "the report page does not list the samples"
refused() {  # WHAT PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  local out rc
  out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set run.output_dir="$WORK/bad" "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] && grep -q -- "$pattern" <<<"$out" || fail "$what: exit $rc: $out"
  [[ -d "$WORK/bad" ]] && fail "$what: the refused run created its output directory"
  echo "refused ($what): $(grep -- "$pattern" <<<"$out" | head -1)"
}
refused "empty prompt" "training.sample_prompt" --set training.sample_interval=5
refused "no tokenizer" "training.sample_interval" --set training.sample_interval=5 --set data.type=synthetic \
  --set model.vocab_size=64 --set "training.sample_prompt=x"
refused "long prompt" "model.seq_len 48 holds at most 47" --set training.sample_interval=5 \
  --set "training.sample_prompt=$(printf 'y%.0s' $(seq 50))"
echo PASS
