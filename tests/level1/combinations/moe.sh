#!/usr/bin/env bash
# Layout combinations of the MoE GPT (4 experts, top 2, z-loss) against one
# process (PARITY.md: 20 steps, dropout $DROPOUT, evaluation at steps 10 and
# 20, first-step loss and every step-1 gradient within 1e-5, losses within
# 1e-4), all from one reference run:
#   ep=2 under interleaved 1F1B (pp=2, 2 chunks per rank; 4 processes);
#   the same with selective recompute, bitwise equal to it;
#   ep=2 over 4 processes with zero: the expert parameters are replicated
#   over edp=2, so their optimizer state is sharded as well as the dense one.
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
run ppi2ep2 4 "pp=2 dp=2 tp=1" $(ppi 2) $(ep 2)
run ppi2ep2rcs 4 "pp=2 dp=2 tp=1" $(ppi 2) $(ep 2) $(rc selective)
run ep2dp4z 4 "pp=1 dp=4 tp=1" $(ep 2) $(zero)
}
parity ref ppi2ep2 "interleaved pipeline x expert parallel"
bitwise ppi2ep2 ppi2ep2rcs "selective recompute under interleaved pipeline x expert parallel"
parity ref ep2dp4z "expert parallel x zero (edp=2)"
echo "MoE combinations: $((SECONDS - t0)) s"
finish
