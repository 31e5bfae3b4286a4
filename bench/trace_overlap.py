"""Fraction of gradient-reduction time hidden behind backward, from an hp-train
profile (run.profile.enabled): per rank, the time of the asynchronous
all_reduce spans (Chrome "X" events, category "comm", name "all_reduce",
args.async = 1) that lies inside a backward span (category "compute", name
"backward") of the same rank, over the total time of those all_reduce spans.
With --gathers: the fraction of zero stage 3's parameter-gather time hidden
behind compute instead: per rank, 1 - (time in "zero_gather_wait" spans, a
block waiting for its gather and writing it into the parameters) / (time of
the asynchronous all_gather spans, issue to completion), both counted only
when they start inside a forward or backward span (a checkpoint save's
gathers have no compute to hide behind). Standard library only.

  python3 bench/trace_overlap.py [--gathers] RUN_DIR_OR_TRACE_JSON...

A run directory is read through its merged trace.json (one pid per rank), or
its trace/rank*.json when there is no merged file.
"""

import glob
import json
import os
import sys


def load_events(path):
    if os.path.isdir(path):
        merged = os.path.join(path, "trace.json")
        files = [merged] if os.path.exists(merged) else sorted(glob.glob(os.path.join(path, "trace", "rank*.json")))
    else:
        files = [path]
    events = []
    for i, f in enumerate(files):
        with open(f) as fh:
            d = json.load(fh)
        evs = d.get("traceEvents", []) if isinstance(d, dict) else d
        for e in evs:
            # Per-rank files may all say pid 0: tell them apart by file.
            events.append((e.get("pid", 0) if len(files) == 1 else (i, e.get("pid", 0)), e))
    return files, events


def is_async(e):
    v = (e.get("args") or {}).get("async")
    return v in (1, True, "1", "true")


def union(intervals):
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def covered(b, e, merged):
    return sum(max(0.0, min(e, me) - max(b, mb)) for mb, me in merged)


def complete_spans(path):
    """Every complete ("X") event of the run as (rank, event, begin, end) in
    microseconds, or None (said why) when the run has no trace."""
    files, events = load_events(path)
    if not files:
        print(f"{path}: no trace.json nor trace/rank*.json (was run.profile.enabled on?)")
        return None
    return [(rank, e, float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for rank, e in events if e.get("ph") == "X"]


def analyse(path):
    spans = complete_spans(path)
    if spans is None:
        return None
    backward, reduce_async, reduce_sync = {}, {}, {}
    for rank, e, b, end in spans:
        span = (b, end)
        if e.get("cat") == "compute" and e.get("name") == "backward":
            backward.setdefault(rank, []).append(span)
        elif e.get("cat") == "comm" and e.get("name") == "all_reduce":
            (reduce_async if is_async(e) else reduce_sync).setdefault(rank, []).append(span)
    n_sync = sum(len(v) for v in reduce_sync.values())
    if not reduce_async:
        print(f"{path}: no asynchronous all_reduce spans (args.async = 1) on any rank; "
              f"{n_sync} synchronous all_reduce span(s): nothing hidden to measure")
        return None
    total = hidden = 0.0
    for rank in sorted(reduce_async, key=str):
        merged = union(backward.get(rank, []))
        t = sum(e - b for b, e in reduce_async[rank])
        h = sum(covered(b, e, merged) for b, e in reduce_async[rank])
        total, hidden = total + t, hidden + h
        print(f"  rank {rank}: {len(reduce_async[rank])} async all_reduce spans, {t / 1e3:.1f} ms, "
              f"{h / 1e3:.1f} ms inside backward ({100 * h / t if t else 0:.1f}%)")
    frac = hidden / total if total else 0.0
    print(f"{path}: fraction of gradient-reduction time hidden behind backward: {100 * frac:.1f}% "
          f"({hidden / 1e3:.1f} of {total / 1e3:.1f} ms of async all_reduce, all ranks; "
          f"{n_sync} synchronous all_reduce span(s) not counted)")
    return frac


def analyse_gathers(path):
    spans = complete_spans(path)
    if spans is None:
        return None
    # Only the gathers of forward and backward count: those of a save (every
    # parameter gathered at once, nothing to hide behind) start outside them.
    compute, gathers, waits = {}, {}, {}
    for rank, e, b, end in spans:
        span = (b, end - b)
        if e.get("cat") == "compute" and e.get("name") in ("forward", "backward"):
            compute.setdefault(rank, []).append((b, end))
        elif e.get("cat") == "comm" and e.get("name") == "all_gather" and is_async(e):
            gathers.setdefault(rank, []).append(span)
        elif e.get("cat") == "comm" and e.get("name") == "zero_gather_wait":
            waits.setdefault(rank, []).append(span)
    flight, waited = {}, {}
    for rank in gathers:
        merged = union(compute.get(rank, []))
        inside = lambda t: any(b <= t <= e for b, e in merged)
        flight[rank] = sum(d for t, d in gathers[rank] if inside(t))
        waited[rank] = sum(d for t, d in waits.get(rank, []) if inside(t))
    if not flight:
        print(f"{path}: no asynchronous all_gather spans: not a zero stage-3 run with the trace on")
        return None
    total, wait = sum(flight.values()), sum(waited.values())
    for rank in sorted(flight, key=str):
        t, w = flight[rank], waited.get(rank, 0.0)
        print(f"  rank {rank}: gathers in flight {t / 1e3:.1f} ms, blocks waited {w / 1e3:.1f} ms")
    frac = max(0.0, 1.0 - wait / total)
    print(f"{path}: fraction of parameter-gather time hidden behind compute: {100 * frac:.1f}% "
          f"({wait / 1e3:.1f} ms waited of {total / 1e3:.1f} ms in flight, all ranks)")
    return frac


if __name__ == "__main__":
    args = sys.argv[1:]
    gathers = "--gathers" in args
    args = [a for a in args if a != "--gathers"]
    if not args:
        sys.exit("usage: trace_overlap.py [--gathers] RUN_DIR_OR_TRACE_JSON...")
    for p in args:
        (analyse_gathers if gathers else analyse)(p)
