#!/usr/bin/env bash
# The unet model (skip-connection encoder-decoder on the field task; it has
# no dropout) at dp=2, and at the layout of configs/unet_pp2.yaml
# (interleaved pp=2, 2 chunks per rank) with tp=2, against one process
# (docs/PARITY.md: first-step loss and every step-1 gradient 1e-5, 20-step losses
# 1e-4, evaluation at steps 10 and 20).
source "$(dirname "$0")/lib.sh"
BIN=$1
CONFIG="$WORK/u.yaml"
unet_config "$CONFIG"
COMMON=(--set training.eval_interval=10 --set training.dump_grads_at_step=1 --set metrics.peak_flops=1e10)
t0=$SECONDS
# shellcheck disable=SC2046
{
run ref 1 ""
run dp2 2 "dp=2 over"
run ppi2tp2 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2)
}
parity ref dp2 "unet data parallel"
parity ref ppi2tp2 "unet interleaved pipeline x tensor parallel"
echo "unet combinations: $((SECONDS - t0)) s"
finish
