"""How evenly the expert-parallel ranks' experts are loaded, from an hp-train
profile (run.profile.enabled) of an expert-parallel run: every "moe.experts"
span (category "compute", one per MoE layer and micro-batch on each rank,
args.rows = the assignment rows the rank's experts ran on) is paired with
the spans of the same index on the other ranks of the ep group (every rank
runs the same layers and micro-batches in the same order). Each such event
ends in an exchange that waits for its busiest rank, so the figures are
  - per event, the busiest rank's rows over the ranks' mean, averaged
    weighted by rows (1.0: even): the work the exchanges wait for;
  - the same for the spans' durations (forward, and "moe.experts.backward");
  - each rank's share of all rows over the run (a persistent skew).
Figures printed, never asserted. Standard library only.

  python3 bench/moe_rank_load.py RUN_DIR_OR_TRACE_JSON [EP_SIZE]

EP_SIZE (default: every rank in the trace) groups the ranks in blocks of
consecutive ranks, as the mesh carves ep out of dp.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_overlap import load_events  # noqa: E402  (the run directory's or file's trace events, with their rank)


def spans(events, name):
    by_rank = {}
    for rank, e in events:
        if e.get("ph") == "X" and e.get("name") == name:
            by_rank.setdefault(rank, []).append(e)
    for v in by_rank.values():
        v.sort(key=lambda e: e["ts"])
    return by_rank


def busiest_over_mean(groups, value):
    """Sum over events of the busiest rank's value over the sum of the means."""
    top = mean = 0.0
    for group in groups:
        n = min(len(g) for g in group)
        for i in range(n):
            v = [value(g[i]) for g in group]
            top += max(v)
            mean += sum(v) / len(v)
    return top / mean if mean else float("nan")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    _, events = load_events(sys.argv[1])
    fwd, bwd = spans(events, "moe.experts"), spans(events, "moe.experts.backward")
    ranks = sorted(fwd)
    if len(ranks) < 2:
        sys.exit("moe_rank_load: fewer than two ranks with moe.experts spans in " + sys.argv[1])
    ep = int(sys.argv[2]) if len(sys.argv) > 2 else len(ranks)
    blocks = [ranks[i:i + ep] for i in range(0, len(ranks), ep)]
    if any("rows" not in e.get("args", {}) for r in ranks for e in fwd[r]):
        sys.exit("moe_rank_load: moe.experts spans without args.rows (a build before session 25?)")
    rows = lambda e: e["args"]["rows"]
    dur = lambda e: e["dur"]
    print(f"{sys.argv[1]}: {min(len(fwd[r]) for r in ranks)} expert spans per rank, ep groups {blocks}")
    fwd_groups = [[fwd[r] for r in b] for b in blocks]
    print(f"  busiest rank / mean, per event: rows {busiest_over_mean(fwd_groups, rows):.3f}, "
          f"forward ms {busiest_over_mean(fwd_groups, dur):.3f}, "
          f"backward ms {busiest_over_mean([[bwd.get(r, []) for r in b] for b in blocks], dur) if bwd else float('nan'):.3f}")
    for b in blocks:
        total = {r: sum(rows(e) for e in fwd[r]) for r in b}
        mean = sum(total.values()) / len(b)
        print("  share of the rows over the run: " + ", ".join(f"rank {r} {total[r] / mean:.3f}" for r in b))


if __name__ == "__main__":
    main()
