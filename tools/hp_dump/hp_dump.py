#!/usr/bin/env python3
"""Compare the tensor dumps of two runs (training.dump_activations_steps,
training.dump_routing_steps; framework/model/tensor_dump.h). Pure Python:
the dumps are small and safetensors is a JSON header and raw bytes.

  hp_dump.py diff REF_RUN RUN --step N [--kind activations|routing]
      Lists the recorded tensors in the reference's recording order (the
      order its forward computed them) and names the first one whose bits
      differ, with its largest absolute and relative difference, then how
      many differ in all. Exit 0 when every common tensor is bitwise equal,
      1 when one differs, 2 on bad input.

  hp_dump.py routing REF_RUN RUN --steps 1-20 [--equal 1] [--near-tie X]
      Compares every MoE routing decision of the steps token by token (layer,
      global sample, global position): the top-k choice, each assignment's
      place in its (sequence, expert) capacity order and the capacity drops.
      A changed top-k choice is a flip; a changed drop inside a group whose
      members did not change is a capacity flip; drops changed because a
      top-k flip changed the group's members are counted as its
      consequences. Each flip's score gap (relative, in the reference) is
      reported (the larger of the two runs' gaps); up to the first step with
      a flip, a flip whose gap is not below --near-tie (default 1e-6) is a
      failure; after it the runs trained on different routings, and a flip
      must lie within twice the largest score difference measured between
      them at that step. At the --equal steps any difference at all is a
      failure (exit 1).
"""
import argparse
import glob
import json
import math
import os
import struct
import sys
from array import array

FORMATS = {"F32": "f", "F64": "d", "I64": "q", "I32": "i", "U8": "B", "BOOL": "B", "I8": "b"}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[b:end])
    return meta, out


def load_dump(run, kind, step):
    """{key: (dtype, shape, bytes, rank)} in recording order, rank by rank,
    and each rank's metadata."""
    d = os.path.join(run, f"{kind}_step{step}")
    files = sorted(glob.glob(os.path.join(d, f"{kind}-rank*.safetensors")))
    if not files:
        # A routing dump taken with the activations lives in their file.
        if kind == "routing":
            return load_dump(run, "activations", step)
        print(f"hp_dump: no {kind} dump of step {step} in {run} (expected {d}/{kind}-rank*.safetensors; "
              f"training.dump_{kind}_steps takes the steps)", file=sys.stderr)
        sys.exit(2)
    records, metas = [], []
    for path in files:
        meta, tensors = read_safetensors(path)
        metas.append(meta)
        rank = int(meta.get("rank", len(metas) - 1))
        for name, (dt, shape, raw) in tensors.items():
            records.append((name, dt, shape, raw, rank))
    return records, metas


def values(dt, raw):
    a = array(FORMATS[dt])
    a.frombytes(raw)
    return a


def cmd_diff(args):
    ref, ref_meta = load_dump(args.ref, args.kind, args.step)
    run, run_meta = load_dump(args.run, args.kind, args.step)
    print(f"reference: {args.ref} ({ref_meta[0].get('kernels', '?')}; mesh {ref_meta[0].get('mesh')})")
    print(f"run:       {args.run} ({run_meta[0].get('kernels', '?')}; mesh {run_meta[0].get('mesh')})")
    theirs = {}
    for name, dt, shape, raw, rank in run:
        theirs.setdefault(name, (dt, shape, raw, rank))
    first, differing, compared, missing = None, 0, 0, 0
    for name, dt, shape, raw, rank in ref:
        if name not in theirs:
            missing += 1
            continue
        odt, oshape, oraw, orank = theirs.pop(name)
        if (odt, oshape) != (dt, shape):
            missing += 1
            continue
        compared += 1
        if raw == oraw:
            continue
        differing += 1
        if first is None:
            a, b = values(dt, raw), values(odt, oraw)
            diffs = [abs(x - y) for x, y in zip(a, b)]
            peak = max(abs(x) for x in a) or 1.0
            ndiff = sum(1 for x, y in zip(a, b) if x != y)
            first = (name, shape, ndiff, len(a), max(diffs), max(diffs) / peak, rank, orank)
    print(f"{compared} tensors compared, {differing} differ, {missing + len(theirs)} on one side only or shaped differently")
    if compared == 0:
        print("hp_dump: the two dumps have no tensor in common (same key and shape): nothing was compared")
        return 2
    if first is None:
        print("every compared tensor is bitwise equal")
        return 0
    name, shape, ndiff, total, mad, rel = first[:6]
    print(f"first to differ: {name} {shape} (reference rank {first[6]}, run rank {first[7]}): "
          f"{ndiff} of {total} elements, max |diff| {mad:.3e}, relative to its max {rel:.3e}")
    return 1


def parse_key(key):
    layer, rest = key.split(":", 1)
    what, site = rest.split("@s", 1)
    return layer, what, int(site.split("#")[0])


def routing_tokens(run, step):
    """{(layer, sample, position): dict(scores, probs, experts, kept)}, and
    the number of replica disagreements (tensor-parallel ranks hold the same
    tokens and must decide alike)."""
    records, metas = load_dump(run, "routing", step)
    by = {}
    for name, dt, shape, raw, rank in records:
        layer, what, first = parse_key(name)
        if what not in ("scores", "probs", "experts", "kept", "positions"):
            continue
        by.setdefault((layer, first, rank), {})[what] = (shape, values(dt, raw))
    tokens, disagree = {}, 0
    for (layer, first, rank), t in by.items():
        (n, k), experts = t["experts"]
        e = t["probs"][0][1]
        positions = t["positions"][1]
        local = len(positions)
        for row in range(n):
            key = (layer, first + row // local, positions[row % local])
            rec = {
                "probs": tuple(t["probs"][1][row * e:(row + 1) * e]),
                "scores": tuple(t["scores"][1][row * e:(row + 1) * e]),
                "experts": tuple(experts[row * k:(row + 1) * k]),
                "kept": tuple(bool(x) for x in t["kept"][1][row * k:(row + 1) * k]),
            }
            if key in tokens:
                disagree += tokens[key] != rec
            else:
                tokens[key] = rec
    return tokens, disagree, metas[0].get("kernels", "?")


def rel_gap(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def topk_gap(scores, k):
    s = sorted(scores, reverse=True)
    return rel_gap(s[k - 1], s[k]) if k < len(s) else math.inf


def groups(tokens):
    """{(layer, sample, expert): [(position, prob, kept)] by capacity order:
    probability descending, the earlier token first on ties."""
    g = {}
    for (layer, sample, pos), r in tokens.items():
        for e, kept in zip(r["experts"], r["kept"]):
            g.setdefault((layer, sample, e), []).append((pos, r["probs"][e], kept))
    for members in g.values():
        members.sort(key=lambda m: (-m[1], m[0]))
    return g


def steps_of(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def compare_routing(ref, run, k, equal):
    """The flips of one step: top-k flips [(token, gap)], capacity flips
    [((group, position), gap)], drops following top-k flips, groups whose
    capacity order changed, and whether the scores are bitwise equal."""
    common = [t for t in ref if t in run]
    # A flip's gap is the larger of the two runs' gaps: a near-tie in both.
    topk = [(t, max(topk_gap(ref[t]["scores"], k), topk_gap(run[t]["scores"], k)))
            for t in common if ref[t]["experts"] != run[t]["experts"]]
    gr, gu = groups({t: ref[t] for t in common}), groups({t: run[t] for t in common})
    order_changed, cap_direct, following = 0, [], 0
    for key in set(gr) | set(gu):
        a, b = gr.get(key, []), gu.get(key, [])
        if sorted(m[0] for m in a) != sorted(m[0] for m in b):
            # Members changed by a top-k flip: every changed drop follows from it.
            ka = {m[0]: m[2] for m in a}
            following += sum(1 for m in b if m[0] in ka and ka[m[0]] != m[2])
            continue
        if [m[0] for m in a] != [m[0] for m in b]:
            order_changed += 1
        kb = {m[0]: m[2] for m in b}
        pb = {m[0]: m[1] for m in b}
        flipped = [m for m in a if kb[m[0]] != m[2]]
        for m in flipped:
            gap = min((max(rel_gap(m[1], o[1]), rel_gap(pb[m[0]], pb[o[0]])) for o in flipped if o[2] != m[2]),
                      default=math.inf)
            cap_direct.append(((key, m[0]), gap))
    same_scores = all(ref[t]["probs"] == run[t]["probs"] and ref[t]["scores"] == run[t]["scores"] for t in common)
    # The largest relative difference of a score between the runs: how far
    # apart their routers are at this step.
    drift = max((rel_gap(a, b) for t in common for a, b in zip(ref[t]["scores"], run[t]["scores"])), default=0.0)
    flipped = {t for t, _ in topk} | {(key[0], key[1], pos) for (key, pos), _ in cap_direct}
    flipped |= {t for t in common if ref[t]["kept"] != run[t]["kept"]}
    return common, topk, cap_direct, following, order_changed, same_scores, drift, len(flipped)


def cmd_routing(args):
    label = args.label or os.path.basename(os.path.normpath(args.run))
    equal = set(steps_of(args.equal)) if args.equal else set()
    problems, first_flip, totals, worst_all, tokens_flipped, first_flipped = [], 0, [0, 0, 0], 0.0, 0, 0
    for step in steps_of(args.steps):
        ref, ref_dis, ref_kernels = routing_tokens(args.ref, step)
        run, run_dis, run_kernels = routing_tokens(args.run, step)
        if ref_dis or run_dis:
            problems.append(f"step {step}: replicas of a token decided differently "
                            f"({ref_dis} in the reference, {run_dis} in the run)")
        if set(ref) != set(run):
            problems.append(f"step {step}: the runs routed different tokens ({len(ref)} against {len(run)})")
        k = len(next(iter(ref.values()))["experts"])
        common, topk, cap, following, order_changed, same, drift, nflipped = compare_routing(ref, run, k, step in equal)
        gaps = [g for _, g in topk + cap]
        worst = max(gaps) if gaps else 0.0
        tokens_flipped += nflipped
        diverged = first_flip and first_flip < step
        if nflipped and not first_flip:
            first_flipped = nflipped
        totals[0] += len(topk)
        totals[1] += len(cap)
        totals[2] += following
        if (topk or cap or following) and not first_flip:
            first_flip = step
        print(f"routing step {step}, {label} against {os.path.basename(os.path.normpath(args.ref))}: "
              f"{len(common)} tokens x {k}; top-k flips {len(topk)}, capacity flips {len(cap)} "
              f"(+{following} following top-k flips), capacity order changed in {order_changed} groups; "
              f"scores {'bitwise equal' if same else f'differ by up to {drift:.2e}'}; largest flip gap {worst:.2e}"
              + (" (after the first flip)" if diverged else ""))
        for t, g in topk[:5]:
            print(f"  top-k flip: layer {t[0]} sample {t[1]} position {t[2]}: {ref[t]['experts']} -> "
                  f"{run[t]['experts']}, k-th/(k+1)-th score gap {g:.2e} (relative)")
        for (key, pos), g in cap[:5]:
            print(f"  capacity flip: layer {key[0]} sample {key[1]} expert {key[2]} position {pos}: "
                  f"gap {g:.2e} (relative) to the assignment it traded places with")
        if step in equal and (topk or cap or following or order_changed):
            problems.append(f"step {step}: routing differs (top-k, capacity order or drops) where it must be "
                            f"bitwise equal")
        if diverged:
            # The runs trained on different routings since the first flip: a
            # flip must lie within the scores' measured drift (two scores
            # each moved by up to it).
            far = [g for g in gaps if not (g < args.near_tie or g <= 2 * drift)]
            if far:
                problems.append(f"step {step}: {len(far)} flip(s) beyond twice the score drift {drift:.2e} "
                                f"(gap up to {max(far):.2e})")
        else:
            worst_all = max(worst_all, worst)
            far = [g for g in gaps if not g < args.near_tie]
            if far:
                problems.append(f"step {step}: {len(far)} flip(s) are not near-ties (score gap up to {max(far):.2e}, "
                                f"bar {args.near_tie:g})")
    print(f"  kernels: reference {ref_kernels}; run {run_kernels}")
    print(f"routing {label}: {totals[0]} top-k flips, {totals[1]} capacity flips, {totals[2]} drops following "
          f"them ({tokens_flipped} token decisions) over steps {args.steps}; first at step {first_flip or 'none'}"
          f"{f' ({first_flipped} token decisions)' if first_flip else ''}; "
          f"largest gap up to and at it {worst_all:.2e} (near-tie bar {args.near_tie:g})")
    if args.first_flip_file:
        with open(args.first_flip_file, "w") as f:
            f.write(f"{first_flip}\n")
    if args.flips_file:
        with open(args.flips_file, "w") as f:
            f.write(f"{first_flipped}\n")
    for p in problems:
        print(f"FAIL: {label}: {p}")
    return 1 if problems else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diff")
    d.add_argument("ref"), d.add_argument("run")
    d.add_argument("--step", type=int, required=True)
    d.add_argument("--kind", default="activations", choices=["activations", "routing"])
    r = sub.add_parser("routing")
    r.add_argument("ref"), r.add_argument("run")
    r.add_argument("--steps", required=True, help="steps to compare: 1-20 or 1,5,10")
    r.add_argument("--equal", default="", help="steps whose routing must be bitwise equal (same syntax)")
    r.add_argument("--near-tie", type=float, default=1e-6)
    r.add_argument("--label", default="")
    r.add_argument("--first-flip-file", default="", help="write the first step with a flip (0: none) here")
    r.add_argument("--flips-file", default="", help="write the token decisions flipped at the first flip here")
    a = p.parse_args()
    return cmd_diff(a) if a.cmd == "diff" else cmd_routing(a)


if __name__ == "__main__":
    sys.exit(main())
