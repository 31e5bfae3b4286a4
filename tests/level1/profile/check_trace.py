#!/usr/bin/env python3
"""check_trace.py TRACE FIRST_STEP LAST_STEP SCHEDULE_RANK0 SCHEDULE_RANK1

Checks a merged trace.json written by hp-train with run.profile.enabled:
valid Chrome trace-event JSON (an object with traceEvents; "X" events with
name, cat, pid, tid, ts >= 0, dur >= 0; spans nest per pid and tid; one
named process track per rank), and, on each rank and each profiled step, the
forward and backward spans (category "compute") in exactly the order of the
rank's schedule action list. Also: collectives carry their group and bytes,
the stage-message waits, the optimizer step, evaluation and checkpoint save
of the first step are there.
"""
import json
import sys


def ns(us):
    return round(us * 1000)


def load(path):
    """The trace's spans by pid, after the checks every trace must pass:
    trace-event JSON, "X" events with every field, spans nested per pid and
    tid, one named process track per rank 0..N-1."""
    trace = json.load(open(path))
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list), "not a trace-event object"
    names, spans = {}, {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M":
            if e["name"] == "process_name":
                assert e["pid"] not in names, f"process {e['pid']} named twice"
                names[e["pid"]] = e["args"]["name"]
            continue
        assert e["ph"] == "X", e
        for key in ("name", "cat", "pid", "tid", "ts", "dur", "args"):
            assert key in e, (key, e)
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        spans.setdefault(e["pid"], []).append(e)
    ranks = len(spans)
    assert sorted(spans) == list(range(ranks)), f"tracks {sorted(spans)}, expected one per rank 0..{ranks - 1}"
    assert sorted(names) == list(range(ranks)), f"process names {names}"
    for pid, events in spans.items():
        assert names[pid].startswith(f"rank {pid}"), names[pid]
        by_thread = {}
        for e in events:
            by_thread.setdefault(e["tid"], []).append(e)
        for tid, es in by_thread.items():
            es.sort(key=lambda e: (ns(e["ts"]), -ns(e["dur"])))
            open_ends = []
            for e in es:
                b, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
                while open_ends and open_ends[-1] <= b:
                    open_ends.pop()
                assert not open_ends or end <= open_ends[-1], f"rank {pid} tid {tid}: {e} overlaps its parent"
                open_ends.append(end)
    return spans


def step_windows(events, rank, first, last):
    """{step: the rank's spans inside that step's span}; the profiled steps
    must be exactly first..last."""
    steps = {int(e["args"]["step"]): e for e in events if e["name"] == "step" and e["cat"] == "step"}
    assert sorted(steps) == list(range(first, last + 1)), f"rank {rank}: profiled steps {sorted(steps)}"
    out = {}
    for s, step in steps.items():
        b, end = ns(step["ts"]), ns(step["ts"]) + ns(step["dur"])
        out[s] = [e for e in events if b <= ns(e["ts"]) and ns(e["ts"]) + ns(e["dur"]) <= end]
    return out


def main():
    path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    schedules = [open(p).read().split() for p in sys.argv[4:]]
    spans = load(path)
    ranks = len(schedules)
    assert len(spans) == ranks, f"{len(spans)} tracks, expected {ranks}"
    for rank in range(ranks):
        events = spans[rank]
        for s, inside in step_windows(events, rank, first, last).items():
            compute = sorted((e for e in inside if e["cat"] == "compute" and e["name"] in ("forward", "backward")),
                             key=lambda e: ns(e["ts"]))
            got = [("F" if e["name"] == "forward" else "B") + f"{int(e['args']['chunk'])}.{int(e['args']['mb'])}"
                   for e in compute]
            assert got == schedules[rank], f"rank {rank} step {s}: trace order {got}\n  schedule {schedules[rank]}"
            for name in ("optimizer_step", "grad_sync"):
                assert any(e["name"] == name for e in inside), f"rank {rank} step {s}: no {name} span"
            comm = [e for e in inside if e["cat"] == "comm" and e["name"] in ("all_reduce", "recv", "barrier")]
            assert comm, f"rank {rank} step {s}: no collective span"
            for e in comm:
                assert e["args"].get("group") and "bytes" in e["args"], f"collective without group and bytes: {e}"
            waits = [e for e in inside if e["name"] == "stage_recv"]
            assert waits, f"rank {rank} step {s}: no stage-message wait"
            direction = "forward" if rank == 1 else "backward"
            assert any(w["args"]["direction"] == direction for w in waits), (rank, s, waits[:2])
        # The first profiled step evaluates and saves after its step span.
        steps = {int(e["args"]["step"]): e for e in events if e["name"] == "step" and e["cat"] == "step"}
        nxt = ns(steps[first + 1]["ts"]) if first + 1 in steps else float("inf")
        after = [e for e in events if ns(steps[first]["ts"]) + ns(steps[first]["dur"]) <= ns(e["ts"]) < nxt]
        for name in ("evaluate", "checkpoint_save"):
            assert any(e["name"] == name for e in after), f"rank {rank}: no {name} span after step {first}"
        assert any(e["cat"] == "eval" and e["name"] == "forward" for e in after), f"rank {rank}: no eval forward"
    print(f"trace OK: {sum(len(v) for v in spans.values())} spans, {ranks} ranks, steps {first}..{last}")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
