#!/usr/bin/env python3
"""same_tensors.py A.safetensors B.safetensors: exit 0 when both files hold the
same tensor names, each with the same dtype, shape and bytes (metadata may
differ); otherwise name the first difference."""
import json
import struct
import sys


def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit("names differ: only in the first %s, only in the second %s" % (sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]))
for k in sorted(a):
    if a[k] != b[k]:
        sys.exit("tensor %s differs (dtype/shape %s %s vs %s %s)" % (k, a[k][0], a[k][1], b[k][0], b[k][1]))
print("%d tensors bitwise equal" % len(a))
