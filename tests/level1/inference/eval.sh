#!/usr/bin/env bash
# hp-eval: a checkpoint's loss on the validation samples training evaluates.
# A byte-level GPT trained 20 steps on a fortune file, checkpoints and
# evaluations at steps 10 and 20; hp-eval of the step-10 checkpoint at the
# training layout prints that step's eval loss bitwise (eval.json against
# metrics.jsonl), and at tp=2 with sequence parallel, pp=2 and cp=2 within
# docs/PARITY.md's eval bar (1e-5); --data another corpus gives another
# finite loss; a path that is no checkpoint is refused (exit 2, one line).
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
export HP_INTRA_OP_THREADS=1
text_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --set checkpoint.interval=10 --set run.output_dir="$WORK/ref" > "$WORK/ref.log" 2>&1 \
  || { tail "$WORK/ref.log"; fail "training"; }
ck="$WORK/ref/checkpoints/step_00000010"
ev() {  # ev NAME ARGS...: hp-eval of the step-10 checkpoint into $WORK/NAME
  local name=$1; shift
  "$BIN/hp-eval" "$ck" --out "$WORK/$name" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" \
    || { tail "$WORK/$name.err"; fail "hp-eval $name ($*)"; }
  cat "$WORK/$name.out"
}
ev one
grep -q "^step 10 | eval loss" "$WORK/one.out" || fail "the printed line"
ev tp2 --nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.tensor_parallel.sequence_parallel=true
ev pp2 --nproc 2 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2
ev cp2 --nproc 2 --set features.context_parallel.enabled=true --set features.context_parallel.size=2
ev other --data /usr/share/games/fortunes/science
python3 - "$WORK" <<'PY' || fail "hp-eval disagrees with the training run's eval loss"
import json, math, sys
w = sys.argv[1]
want = next(json.loads(l)["eval_loss"] for l in open(w + "/ref/metrics.jsonl") if json.loads(l)["step"] == 10)
got = {n: json.load(open("%s/%s/eval.json" % (w, n)))["eval_loss"] for n in ["one", "tp2", "pp2", "cp2", "other"]}
print("training eval loss at step 10: %r" % want)
for n, v in got.items():
    print("  hp-eval %-5s %r (relative %.2e)" % (n, v, abs(v - want) / want))
ok = got["one"] == want
ok &= all(abs(got[n] - want) <= 1e-5 * abs(want) for n in ["tp2", "pp2", "cp2"])
ok &= math.isfinite(got["other"]) and got["other"] != want
sys.exit(0 if ok else 1)
PY
out=$("$BIN/hp-eval" "$WORK" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "a directory that is no checkpoint: exit $rc"
[[ $(wc -l <<<"$out") -eq 1 ]] && grep -q "is neither a checkpoint step directory" <<<"$out" || fail "refusal text: $out"
echo PASS
