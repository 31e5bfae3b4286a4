#!/usr/bin/env bash
# hp-compare on hand-made run directories (metrics.jsonl and gradient dumps
# written here, safetensors by hand: 8-byte header length, JSON header, raw
# bytes). Every failure it must catch is made once and checked for its exit
# code (1) and its message; each bar is also met just under it (exit 0).
set -uo pipefail
HP_COMPARE=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT

# expect RC PATTERNS REF RUN [ARGS...]: hp-compare exits RC and its output
# matches each line of PATTERNS (extended regexes).
expect() {
  local rc=$1 pats=$2 ref=$3 run=$4; shift 4
  local out got pat
  out=$("$HP_COMPARE" "$dir/$ref" "$dir/$run" "$@" 2>&1); got=$?
  [[ $got -eq $rc ]] || fail "$ref vs $run $*: exit $got, wanted $rc: $out"
  while IFS= read -r pat; do
    grep -qE -- "$pat" <<<"$out" || fail "$ref vs $run $*: no /$pat/ in: $out"
  done <<<"$pats"
}

python3 - "$dir" <<'PY'
import json, math, os, struct, sys
root = sys.argv[1]

def write_st(path, tensors, metadata=None):
    """tensors: [(name, flat float list, shape)]; float32."""
    header, data = {}, b""
    for name, values, shape in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)

def metrics(d, lines):
    os.makedirs(d, exist_ok=True)
    with open(d + "/metrics.jsonl", "w") as f:
        for l in lines:
            f.write(l if isinstance(l, str) else json.dumps(l))
            f.write("\n")

BASE = [{"step": 1, "loss": 2.5, "grad_norm": 1.5, "lr": 1e-3},
        {"step": 2, "loss": 2.25, "grad_norm": 1.25, "eval_loss": 2.4},
        {"step": 3, "loss": 2.0, "grad_norm": 1.0, "eval_loss": 2.1}]
W = [1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 7.0, -8.0]  # [4, 2], max |w| on rank 1's rows
LN = [0.5, -1.5, 2.5]                             # [3], whole on every rank

def placement(global_shape, offsets, shape, split_dim, group, replicas):
    return {"global_shape": global_shape, "offsets": offsets, "shape": shape, "split_dim": split_dim,
            "split_group": group, "replicas": replicas}

def one_process(d, w=W, ln=LN):
    p = {"w": placement([4, 2], [0, 0], [4, 2], -1, "", [0]), "ln": placement([3], [0], [3], -1, "", [0])}
    write_st(d + "/grads_step1/grads-rank00000.safetensors", [("w", w, [4, 2]), ("ln", ln, [3])],
             {"rank": "0", "placement": json.dumps(p)})

def tp2(d, w=W, ln0=LN, ln1=LN, w1_box=([2, 0], [2, 2]), ln_replicas=(0, 1), extra=None):
    off1, shp1 = w1_box
    rows1 = w[off1[0] * 2:(off1[0] + shp1[0]) * 2]
    for rank, wv, wbox, ln in [(0, w[:4], ([0, 0], [2, 2]), ln0), (1, rows1, w1_box, ln1)]:
        p = {"w": placement([4, 2], wbox[0], wbox[1], 0, "tp", [rank]),
             "ln": placement([3], [0], [3], -1, "", list(ln_replicas))}
        ts = [("w", wv, wbox[1]), ("ln", ln, [3])]
        if extra and rank == 0:
            p[extra] = placement([1], [0], [1], -1, "", [0])
            ts.append((extra, [1.0], [1]))
        write_st(d + "/grads_step1/grads-rank%05d.safetensors" % rank, ts,
                 {"rank": str(rank), "placement": json.dumps(p)})

def scaled(lines, step, key, factor=None, value=None):
    out = [dict(l) for l in lines]
    for l in out:
        if l["step"] == step:
            l[key] = value if value is not None else l[key] * factor
    return out

# The reference: one process. Runs: two tp ranks, with one change each.
metrics(root + "/ref", BASE); one_process(root + "/ref")
runs = {
    "same": BASE,
    "first_over": scaled(BASE, 1, "loss", 1 + 2e-5), "first_under": scaled(BASE, 1, "loss", 1 + 0.9e-5),
    "later_over": scaled(BASE, 2, "loss", 1 + 2e-4), "later_under": scaled(BASE, 2, "loss", 1 + 0.9e-4),
    "eval_over": scaled(BASE, 2, "eval_loss", 1 + 2e-5), "eval_under": scaled(BASE, 2, "eval_loss", 1 + 0.9e-5),
    "eval_later": scaled(BASE, 3, "eval_loss", 1 + 2e-5),
    "gnorm_over": scaled(BASE, 3, "grad_norm", 1 + 2e-4), "gnorm_under": scaled(BASE, 3, "grad_norm", 1 + 0.9e-4),
    "ulp": scaled(BASE, 3, "loss", value=math.nextafter(2.0, 3.0)),
    "early_bad": scaled(scaled(BASE, 1, "loss", 1.5), 1, "grad_norm", float("nan")),
    "late_bad": scaled(BASE, 3, "loss", 1.5),
    "no_eval": [{k: v for k, v in l.items() if k != "eval_loss"} for l in BASE],
}
for name, lines in runs.items():
    metrics(root + "/" + name, lines); tp2(root + "/" + name)
# NaN as the trainer writes it (null) and as Python writes it (NaN).
metrics(root + "/nan_loss", [json.dumps(BASE[0]), json.dumps(BASE[1]).replace('"loss": 2.25', '"loss": null'),
                             json.dumps(BASE[2])]); tp2(root + "/nan_loss")
metrics(root + "/nan_gnorm", [json.dumps(l) for l in scaled(BASE, 2, "grad_norm", value=float("nan"))])
tp2(root + "/nan_gnorm")
# A reference without eval losses too.
metrics(root + "/ref_no_eval", runs["no_eval"]); one_process(root + "/ref_no_eval")
# Gradients.
grads = {
    "grad_over": dict(ln0=[v * (1 + 2e-5) for v in LN], ln1=[v * (1 + 2e-5) for v in LN]),
    "grad_under": dict(ln0=[v * (1 + 0.9e-5) for v in LN], ln1=[v * (1 + 0.9e-5) for v in LN]),
    "grad_nan": dict(w=W[:5] + [float("nan")] + W[6:]),
    "grad_replicas": dict(ln1=[0.5, -1.5, 2.5000002]),
    "grad_overlap": dict(w1_box=([1, 0], [2, 2])),
    "grad_gap": dict(w1_box=([2, 0], [1, 2])),
    "grad_group": dict(ln_replicas=(0, 1, 2)),
    "grad_extra": dict(extra="c"),
}
for name, kw in grads.items():
    metrics(root + "/" + name, BASE); tp2(root + "/" + name, **kw)
PY
[[ $? -eq 0 ]] || fail "could not write the test runs"

# Equal runs pass, bitwise; the tp=2 dump is assembled, its layernorm copy checked.
expect 0 "^PASS
run: 2 files, 4 slices assembled into 2 gradients; 1 replica copies checked bitwise equal \(first: ln on ranks 0 and 1\)
compared 2 gradients of step 1, max relative error 0.000e\+00
compared 3 steps of loss
compared 3 steps of grad_norm
compared 2 steps of eval_loss" ref same --grads-step 1 --exact
# The first loss: bar 1e-5.
expect 1 "FAIL: first value over the bar: loss at step 1 \(rel. error 2.000e-05 > 1.0e-05\) -> phase: forward" ref first_over
expect 0 "^PASS" ref first_under
# A later loss: bar 1e-4, phase as given.
expect 1 "FAIL: first value over the bar: loss at step 2 \(rel. error 2.000e-04 > 1.0e-04\) -> phase: optimizer" ref later_over
expect 0 "^PASS" ref later_under
# The first eval loss: bar 1e-5.
expect 1 "FAIL: first value over the bar: eval_loss at step 2 \(rel. error 2.000e-05 > 1.0e-05\)" ref eval_over
expect 0 "^PASS" ref eval_under
# A later eval loss 2e-5 off: within the later-loss bar, over --eval-rtol 1e-5.
expect 0 "^PASS" ref eval_later
expect 1 "FAIL: first value over the bar: eval_loss at step 3 \(rel. error 2.000e-05 > 1.0e-05\)" ref eval_later --eval-rtol 1e-5
# A later gradient norm: bar 1e-4.
expect 1 "FAIL: first value over the bar: grad_norm at step 3 \(rel. error 2.000e-04 > 1.0e-04\)" ref gnorm_over
expect 0 "^PASS" ref gnorm_under
# --norm-rtol replaces the loss bars for the gradient norm only.
expect 1 "FAIL: first value over the bar: grad_norm at step 3 \(rel. error 9.000e-05 > 1.0e-05\)" ref gnorm_under --norm-rtol 1e-5
expect 0 "^PASS" ref gnorm_under --norm-rtol 1e-4
# --exact with --norm-rtol: losses bitwise, the gradient norm to its own bar.
expect 1 "FAIL: first value over the bar: grad_norm at step 3 \(rel. error 9.000e-05 > 0, bitwise\)" ref gnorm_under --exact
expect 0 "^PASS" ref gnorm_under --exact --norm-rtol 1e-4
expect 1 "FAIL: first value over the bar: loss at step 3 \(rel. error 2.220e-16 > 0, bitwise\)" ref ulp --exact --norm-rtol 1e-4
# One ulp: fails under --exact only.
expect 1 "FAIL: first value over the bar: loss at step 3 \(rel. error 2.220e-16 > 0, bitwise\)" ref ulp --exact
expect 0 "^PASS" ref ulp
# NaN, on either side.
expect 1 "FAIL: loss at step 2 is null \(NaN or infinity\) in the run" ref nan_loss
expect 1 "FAIL: loss at step 2 is null \(NaN or infinity\) in the reference" nan_loss ref
expect 1 "FAIL: grad_norm at step 2 is NaN in the run" ref nan_gnorm
# A key of the reference missing from the run; a key on neither side.
expect 1 "FAIL: eval_loss at step 2 is in the reference .* but not in the run" ref no_eval
expect 0 "eval_loss: in neither run at the compared steps, skipped" ref_no_eval no_eval
# --from-step: earlier steps are not compared, whatever they hold.
expect 1 "FAIL: grad_norm at step 1 is NaN in the run
FAIL: first value over the bar: loss at step 1" ref early_bad
expect 0 "compared 2 steps of loss
compared 2 steps of grad_norm
^PASS" ref early_bad --from-step 2 --exact
# --to-step: later steps are not compared; no step left is bad input.
expect 1 "FAIL: first value over the bar: loss at step 3" ref late_bad
expect 0 "compared 2 steps of loss
^PASS" ref late_bad --to-step 2 --exact
expect 2 "no common steps to compare \(steps 3 to 2\)" ref late_bad --from-step 3 --to-step 2
# Gradients: bar 1e-5 on max|a-b| / (max|ref| + 1e-12).
expect 1 "FAIL: first gradient over the bar: ln \(rel. error [12]\.[0-9]*e-05 > 1.0e-05\)" ref grad_over --grads-step 1
expect 0 "^PASS" ref grad_under --grads-step 1
expect 1 "FAIL: gradient w of step 1 holds NaN in the run .*, rank 1 \(grads-rank00001.safetensors\)" ref grad_nan --grads-step 1
expect 1 "FAIL: gradient w of step 1 holds NaN in the reference .*, rank 1" grad_nan ref --grads-step 1
expect 1 "FAIL: gradient ln of step 1 slice at \[0\] of shape \[3\]: the replicas on rank 0 and rank 1 differ in the run" ref grad_replicas --grads-step 1
expect 1 "FAIL: gradient w of step 1 in the run .*: the slices of rank 0 \(at \[0, 0\], shape \[2, 2\]\) and rank 1 \(at \[1, 0\], shape \[2, 2\]\) overlap" ref grad_overlap --grads-step 1
expect 1 "FAIL: gradient w of step 1 in the run .*: its slices cover 6 of the 8 elements" ref grad_gap --grads-step 1
expect 1 "written by ranks \[0, 1\] but its replicate group is \[0, 1, 2\]" ref grad_group --grads-step 1
# A gradient on one side only.
expect 1 "gradient c missing from the reference" ref grad_extra --grads-step 1
expect 1 "gradient c missing from the run" grad_extra ref --grads-step 1

# Dumps without placement metadata are whole tensors, one per file.
make_plain() {
  local d=$1; shift
  mkdir -p "$d/grads_step1"
  printf '{"step":1,"loss":2.5}\n{"step":2,"loss":2.0}\n' > "$d/metrics.jsonl"
  python3 - "$d/grads_step1/grads-rank00000.safetensors" "$@" <<'PY'
import json, struct, sys
header, data = {}, b""
for n in sys.argv[2:]:
    header[n] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    data += struct.pack("<2f", 1.0, -2.0)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}
make_plain "$dir/p_ref" a b
make_plain "$dir/p_same" a b
make_plain "$dir/p_none"
expect 0 "compared 2 gradients of step 1" p_ref p_same --grads-step 1
expect 1 "FAIL: no gradients to compare" p_none p_none --grads-step 1

# Gradients of other dtypes are read as their values (hp-compare converts
# the bytes itself): values exact in every dtype compare equal to the F32
# reference; one changed value (-2 -> -2.5 in F16) fails with its error.
make_typed() {  # make_typed DIR DTYPE [SECOND_VALUE]
  local d=$1 dtype=$2 v=${3:--2.0}
  mkdir -p "$d/grads_step1"
  printf '{"step":1,"loss":2.5}\n{"step":2,"loss":2.0}\n' > "$d/metrics.jsonl"
  python3 - "$d/grads_step1/grads-rank00000.safetensors" "$dtype" "$v" <<'PY'
import json, struct, sys
path, dtype, second = sys.argv[1], sys.argv[2], float(sys.argv[3])
vals = [1.0, second, 0.375, -96.0]
if dtype == "F64":
    raw = struct.pack("<4d", *vals)
elif dtype == "F16":
    raw = struct.pack("<4e", *vals)
elif dtype == "BF16":  # the upper half of each float's bits
    raw = b"".join(struct.pack("<f", v)[2:] for v in vals)
else:
    raw = struct.pack("<4f", *vals)
header = {"g": {"dtype": dtype, "shape": [2, 2], "data_offsets": [0, len(raw)]}}
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
}
make_typed "$dir/t_f32" F32
for t in F64 BF16 F16; do
  make_typed "$dir/t_$t" $t
  expect 0 "max relative error 0.000e\+00" t_f32 t_$t --grads-step 1
done
make_typed "$dir/t_f16_off" F16 -2.5
expect 1 "FAIL: first gradient over the bar: g \(rel. error 5.208e-03" t_f32 t_f16_off --grads-step 1
echo PASS
