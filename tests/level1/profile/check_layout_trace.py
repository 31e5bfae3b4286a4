#!/usr/bin/env python3
"""check_layout_trace.py TRACE RANKS FIRST_STEP LAST_STEP GROUP:OP...

Checks a merged trace.json of a run without pipeline parallel: what every
trace must be (check_trace.load: trace-event JSON, nested spans, one named
track per rank) with RANKS tracks; on each rank and each profiled step, the
step's forward and backward spans (category "compute"), the gradient sync
and the optimizer step; every collective span carries its group and bytes;
and inside the profiled steps every rank has a span of each GROUP:OP given
(for example tp:all_reduce, ep:all_to_all), with bytes > 0.
"""
import sys

from check_trace import load, step_windows


def main():
    path, ranks, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    wanted = [tuple(a.split(":")) for a in sys.argv[5:]]
    spans = load(path)
    assert len(spans) == ranks, f"{len(spans)} tracks, expected {ranks}"
    seen = {}
    for rank in range(ranks):
        events = spans[rank]
        for s, inside in step_windows(events, rank, first, last).items():
            for cat, name in (("compute", "forward"), ("compute", "backward"), ("comm", "grad_sync"),
                              ("optimizer", "optimizer_step")):
                assert any(e["cat"] == cat and e["name"] == name for e in inside), \
                    f"rank {rank} step {s}: no {cat} span {name}"
            for e in inside:
                if e["cat"] != "comm" or e["name"] == "grad_sync":
                    continue
                assert e["args"].get("group") and "bytes" in e["args"], f"collective without group and bytes: {e}"
                key = (e["args"]["group"], e["name"])
                got = seen.setdefault(rank, {})
                got[key] = got.get(key, 0) + int(e["args"]["bytes"])
        for group, op in wanted:
            assert seen.get(rank, {}).get((group, op), 0) > 0, \
                f"rank {rank}: no {op} on group '{group}' with bytes in steps {first}..{last}; " \
                f"seen: {sorted(seen.get(rank, {}))}"
    print(f"trace OK: {sum(len(v) for v in spans.values())} spans, {ranks} ranks, steps {first}..{last}; "
          f"rank 0's collectives (group, op): bytes {dict(sorted(seen[0].items()))}")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
