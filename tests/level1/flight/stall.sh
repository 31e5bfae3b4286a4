#!/usr/bin/env bash
# A SIGSTOPped rank is named, with where it is, within stall_seconds + a few
# seconds; with on_stall: warn a SIGCONT lets the run finish with the same
# losses as an undisturbed run. dp=2 (its collectives), pp=2 (a stage
# receive inside the schedule), tp=2 (its forward all-reduces), cp=2
# (the ring's messages) and per-module degrees (a module's view groups).
source "$(dirname "$0")/lib.sh"
BIN=$1
small_config "$WORK/c.yaml"
stall_case dp2 2 1 "stall on group 'dp': rank 1 (has not entered|entered) [a-z_]+ #[0-9]+ (and|but) its heartbeat stopped \(last seen in step [0-9]+, "
STEPS=100 stall_case tp2 2 1 "stall on group 'tp': rank 1 (has not entered|entered) [a-z_]+ #[0-9]+ (and|but) its heartbeat stopped \(last seen in step [0-9]+, " \
  --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
# 16 micro-batches: stage 1 mostly waits in a stage receive; the report names
# the stopped stage's last action, and the waiting stage's own (micro-batch, chunk, stage);
# a stage stopped between posting a send and its delivery is named as the sender,
# and one stopped inside a collective all ranks entered is named as frozen in it;
# stopped after its last backward, stage 1 waits in the step's gradient sync instead;
# stopped before the step's first barrier, stage 1 waits in that barrier (at "forward");
# a receive posted ahead is named with where it was issued and where stage 1 is now;
# stage 1 done with its schedule and blocked on its last send names stage 0 as not receiving.
STEPS=60 stall_case pp2 2 0 "stall on group 'pp': rank 0 (has not sent message #[0-9]+ to rank 1|has not received message #[0-9]+ from rank 1|has not entered [a-z_]+ #[0-9]+|entered [a-z_]+ #[0-9]+|posted message #[0-9]+ to rank 1 but it never arrived) and its heartbeat stopped \(last seen in step [0-9]+, [a-z ]+.*\(pipeline stage 0\); last heartbeat [0-9.]+ s ago\); rank 1 has waited [0-9.]+ s in [a-z_]+ \((issued in step [0-9]+, [^;]+; now in )?step [0-9]+, ([a-z]+ of micro-batch [0-9]+, chunk [0-9]|forward|gradient sync|optimizer) \(pipeline stage 1\)\)" \
  --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2 --set training.global_batch_size=32
# Context parallel: the ring's point-to-point messages are recorded like
# stage messages, so a stopped cp rank is named with the message it owes
# (or, between attention layers, the collective it has not entered).
STEPS=60 stall_case cp2 2 1 "stall on group 'cp': rank 1 (has not sent message #[0-9]+ to rank 0|has not received message #[0-9]+ from rank 0|has not entered [a-z_]+ #[0-9]+|entered [a-z_]+ #[0-9]+|posted message #[0-9]+ to rank 0 but it never arrived) and its heartbeat stopped \(last seen in step [0-9]+, " \
  --set features.context_parallel.enabled=true
# Per-module degrees (RFC 0013): attention data-parallel, the FFN at 2 over
# its view; the waiting rank is inside a module's gather or reduce-scatter
# or the gradient sync, and the report names that group.
STEPS=60 stall_case modules 2 1 "stall on group '(ffn_tp_outer|ffn_tp_inner|ffn_tp|dp|world)': rank 1 (has not entered|entered) [a-z_]+ #[0-9]+ (and|but) its heartbeat stopped \(last seen in step [0-9]+, " \
  --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=1 --set features.tensor_parallel.ffn_size=2
echo PASS
