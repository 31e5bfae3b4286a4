#!/usr/bin/env bash
# A 2-rank mixture-of-experts GPT with its experts split over 2 ranks: the
# loss falls; config errors name key, value, rule and legal values (the
# device-level balance loss's groups among them).
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2 --set features.expert_parallel.enabled=true
     --set features.expert_parallel.size=2)
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${moe[@]}" --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "training failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall"
grep -q "mesh dp=2 ep=2 edp=1 over 2 ranks" "$WORK/log" || fail "mesh line missing"
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "MoE figures missing from metrics.jsonl"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
for key in ("aux_loss_load_balance", "aux_loss_router_z", "moe_load_imbalance_max", "moe_dropped_fraction_max",
            "comm_bytes_ep_all_to_all", "comm_seconds_ep_all_to_all"):
    assert key in last, key
assert last["comm_bytes_ep_all_to_all"] > 0 and last["moe_load_imbalance_max"] >= 1.0
print("load balance %.4f, imbalance %.2f, all-to-all %.0f bytes per step" % (
    last["aux_loss_load_balance"], last["moe_load_imbalance_max"], last["comm_bytes_ep_all_to_all"]))
PY
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "${moe[@]}" --set model.moe.num_experts=3 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "3 experts over 2: expected exit 2, got $rc: $out"
grep -qF "features.expert_parallel.size = 2: the expert count = 3 (model.moe.num_experts) is not divisible by it (legal: a divisor of 3)" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "${moe[@]}" --set model.moe.top_k=5 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "top_k 5 of 4: expected exit 2, got $rc"
grep -qF "model.moe.top_k = 5: is more than model.moe.num_experts = 4 (legal: 1 .. 4)" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "${moe[@]}" --set model.moe.device_balance_coef=0.05 \
      --set model.moe.device_groups=3 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "3 device groups of 4 experts: expected exit 2, got $rc"
grep -qF "model.moe.device_groups = 3: must divide model.moe.num_experts = 4 (legal: a divisor of 4 that is at least 2 (usually the expert parallel size))" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set features.expert_parallel.enabled=true 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "ep without experts: expected exit 2, got $rc"
grep -qF "features.expert_parallel.enabled = true: model 'gpt' has no experts to split (it builds no moe layer) (legal: model.moe.num_experts > 0, or disable expert_parallel)" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "${moe[@]}" --set features.expert_parallel.size=4 --set model.moe.num_experts=8 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "ep 4 over dp 2: expected exit 2, got $rc"
grep -qF "distributed = ep=4 dp=2: ep (claimed by expert_parallel) is carved out of dp and must divide its size (legal: a ep size dividing 2)" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run --set model.moe.num_experts=4 --set features.tensor_parallel.enabled=true \
      --set features.tensor_parallel.sequence_parallel=true 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "sequence parallel with experts: expected exit 2, got $rc"
grep -qF "features.tensor_parallel.sequence_parallel = true: a mixture-of-experts model routes and balances per whole sequence, which a sequence split does not see (not supported yet) (legal: false for a model with experts)" <<<"$out" || fail "$out"
echo PASS
