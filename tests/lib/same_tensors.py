#!/usr/bin/env python3
"""same_tensors.py A.safetensors B.safetensors: exit 0 when both files hold the
same tensor names, each with the same dtype, shape and bytes (metadata may
differ); otherwise name the first difference.

same_tensors.py --split HF_DIR OUT_DIR: OUT_DIR gets HF_DIR's config.json and
its model.safetensors split over two files with a model.safetensors.index.json
(the layout of a sharded Hugging Face checkpoint)."""
import json
import os
import shutil
import struct
import sys


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def write(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


if sys.argv[1] == "--split":
    src, out = sys.argv[2], sys.argv[3]
    os.makedirs(out)
    shutil.copy(os.path.join(src, "config.json"), out)
    t = read(os.path.join(src, "model.safetensors"))
    names = sorted(t)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in halves.items():
        write(os.path.join(out, file), {n: t[n] for n in part})
        weight_map.update({n: file for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
    sys.exit(0)

a, b = read(sys.argv[1]), read(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit("names differ: only in the first %s, only in the second %s" % (sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]))
for k in sorted(a):
    if a[k] != b[k]:
        sys.exit("tensor %s differs (dtype/shape %s %s vs %s %s)" % (k, a[k][0], a[k][1], b[k][0], b[k][1]))
print("%d tensors bitwise equal" % len(a))
