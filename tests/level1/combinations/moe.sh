#!/usr/bin/env bash
# Layout combinations of the MoE GPT (4 experts, top 2, z-loss) against one
# process (docs/PARITY.md: 20 steps, dropout $DROPOUT, evaluation at steps 10 and
# 20, first-step loss and every step-1 gradient within 1e-5, losses within
# 1e-4), all from one reference run:
#   ep=2 under interleaved 1F1B (pp=2, 2 chunks per rank; 4 processes);
#   the same with selective recompute, bitwise equal to it;
#   ep=2 over 4 processes with zero: the expert parameters are replicated
#   over edp=2, so their optimizer state is sharded as well as the dense one;
#   ep=2 under interleaved 1F1B with block attention (model.attention:
#   block) and selective recompute, against the eager reference.
# HP_TEST_DROPOUT=0 runs them without dropout.
source "$(dirname "$0")/lib.sh"
BIN=$1
CONFIG="$WORK/c.yaml"
small_config "$CONFIG"
COMMON+=(--set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.z_loss_coef=0.001)
t0=$SECONDS
# shellcheck disable=SC2046
{
run ref 1 ""
run ppi2ep2 4 "pp=2 dp=2 ep=2 edp=1" $(ppi 2) $(ep 2)
run ppi2ep2rcs 4 "pp=2 dp=2 ep=2 edp=1" $(ppi 2) $(ep 2) $(rc selective)
run ep2dp4z 4 "dp=4 ep=2 edp=2" $(ep 2) $(zero)
run ppi2ep2rcsblk 4 "pp=2 dp=2 ep=2 edp=1" $(ppi 2) $(ep 2) $(rc selective) $(blk)
}
parity ref ppi2ep2 "interleaved pipeline x expert parallel"
replayed_every_step "$WORK/ppi2ep2rcs" || fail "selective recompute did not run under interleaved pp x ep"
bitwise ppi2ep2 ppi2ep2rcs "selective recompute under interleaved pipeline x expert parallel"
parity ref ep2dp4z "expert parallel x zero (edp=2)"
replayed_every_step "$WORK/ppi2ep2rcsblk" || fail "selective recompute did not run with block attention under pp x ep"
parity ref ppi2ep2rcsblk "block attention under interleaved pipeline x expert parallel x selective recompute"
# zero shards the expert state too: each of the 4 ranks holds a quarter of
# the one-process optimizer state (half the experts, halved again over edp=2;
# without sharding over edp a rank would hold the dense quarter plus half
# the expert state).
python3 - "$WORK/ref.log" "$WORK/ep2dp4z.log" <<'PY' || FAILED+=("zero x ep: optimizer state per rank")
import re, sys
state = lambda f: [int(x) for x in re.findall(r"this rank: optimizer state (\d+) bytes", open(f).read())]
whole, ranks = state(sys.argv[1])[0], state(sys.argv[2])
print(f"optimizer state: one process {whole} bytes; ep=2 x dp=4 with zero, per rank {ranks}")
sys.exit(0 if len(ranks) == 4 and all(abs(r / whole - 0.25) <= 0.01 for r in ranks) else 1)
PY
echo "MoE combinations: $((SECONDS - t0)) s"
finish
