#!/usr/bin/env bash
# Layout combinations of the dense GPT against one process (docs/PARITY.md: 20
# steps, dropout $DROPOUT, evaluation at steps 10 and 20, first-step loss
# and every step-1 gradient within 1e-5, losses within 1e-4), all from one
# reference run. To stay in budget, features are stacked in one run where
# they act on different things:
#   interleaved 1F1B (pp=2, 2 chunks per rank) x tp=2 with sequence parallel;
#   the same with selective recompute, bitwise equal to it;
#   interleaved 1F1B x dp=2 under zero (zero's sharded update under pp);
#   pp=2 x tp=2 x dp=2 (8 processes);
#   interleaved 1F1B x tp=2 with sequence parallel and selective recompute,
#   with block attention (model.attention: block) against the eager reference.
# HP_TEST_DROPOUT=0 runs them without dropout.
source "$(dirname "$0")/lib.sh"
BIN=$1
CONFIG="$WORK/c.yaml"
small_config "$CONFIG"
t0=$SECONDS
# shellcheck disable=SC2046
{
run ref 1 ""
run ppi2tp2sp 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2) $(sp)
run ppi2tp2sprcs 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2) $(sp) $(rc selective)
run ppi2dp2z 4 "pp=2 dp=2" $(ppi 2) $(zero)
run pp2tp2dp2 8 "pp=2 dp=2 tp=2" $(pp 2) $(tp 2)
run ppi2tp2sprcsblk 4 "pp=2 dp=1 tp=2" $(ppi 2) $(tp 2) $(sp) $(rc selective) $(blk)
}
parity ref ppi2tp2sp "interleaved pipeline x tensor parallel x sequence parallel"
replayed_every_step "$WORK/ppi2tp2sprcs" || fail "selective recompute did not run under interleaved pp x tp"
bitwise ppi2tp2sp ppi2tp2sprcs "selective recompute under interleaved pipeline x tensor/sequence parallel"
parity ref ppi2dp2z "interleaved pipeline x data parallel x zero"
parity ref pp2tp2dp2 "pipeline x tensor x data parallel"
replayed_every_step "$WORK/ppi2tp2sprcsblk" || fail "selective recompute did not run with block attention"
parity ref ppi2tp2sprcsblk "block attention under interleaved pipeline x tensor/sequence parallel x selective recompute"
echo "dense combinations: $((SECONDS - t0)) s"
finish
