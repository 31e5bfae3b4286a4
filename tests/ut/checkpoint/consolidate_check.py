#!/usr/bin/env python3
"""hp-ckpt's --consolidate output read back with the standard library only.

The safetensors format is 8 bytes of little-endian header length, a JSON
header ({"name": {"dtype", "shape", "data_offsets"}}), then raw little-endian
bytes. This script writes full weights that way, imports them with
`hp-ckpt import`, marks two tensors as tensor-parallel in the manifest,
re-shards with `hp-ckpt convert --tp 2`, consolidates with `--consolidate`,
and checks every value of the consolidated file against what it wrote.

usage: consolidate_check.py HP_CKPT
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4)}


def bf16_bits(x):
    """The bfloat16 pattern of float x (truncated: exact for the values used)."""
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def tensors():
    w = [i * 0.5 - 3.0 for i in range(8 * 4)]
    emb = [i * 7 - 20 for i in range(3 * 4)]
    b = [1.0 / (i + 1) for i in range(6)]
    h = [bf16_bits(float(i) - 2.5) for i in range(2 * 6)]
    return {
        "blocks.0.attn.w": ("F32", [8, 4], struct.pack("<32f", *w)),
        "embed.weight": ("I64", [3, 4], struct.pack("<12q", *emb)),
        "blocks.0.attn.b": ("F64", [6], struct.pack("<6d", *b)),
        "head.weight": ("BF16", [2, 6], struct.pack("<12H", *h)),
    }


def write_safetensors(path, named):
    header, data, offset = {}, b"", 0
    for name, (dtype, shape, raw) in named.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out, end = {}, 0
    for name, e in header.items():
        begin, stop = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], blob[8 + n + begin:8 + n + stop])
        end = max(end, stop)
    check(8 + n + end == len(blob), f"{path}: the file does not end with its last tensor")
    return out


def values(dtype, raw):
    if dtype == "BF16":
        return list(struct.unpack(f"<{len(raw) // 2}H", raw))
    code, size = FORMATS[dtype]
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def check(ok, what):
    if not ok:
        print(f"consolidate_check: FAILED: {what}")
        sys.exit(1)


def run(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"hp-ckpt {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main():
    tool = sys.argv[1]
    expected = tensors()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "full.safetensors")
        write_safetensors(src, expected)
        run(tool, "import", src, "--to", os.path.join(tmp, "imported"))
        manifest_path = os.path.join(tmp, "imported", "step_00000000", "manifest.json")
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["tensors"]["blocks.0.attn.w"]["placements"] = [{"dim": "tp", "placement": "S(0)"}]
        manifest["tensors"]["head.weight"]["placements"] = [{"dim": "tp", "placement": "S(1)"}]
        # Edited by hand, so written as a manifest from before manifests had
        # a checksum (no checksum_file, no manifest.json.xxh64): such a
        # checkpoint still converts.
        manifest.pop("checksum_file", None)
        os.remove(manifest_path + ".xxh64")
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)

        run(tool, "convert", os.path.join(tmp, "imported"), "--to", os.path.join(tmp, "tp2"), "--tp", "2")
        with open(os.path.join(tmp, "tp2", "step_00000000", "manifest.json")) as f:
            sharded = json.load(f)
        files = {s["file"] for s in sharded["tensors"]["blocks.0.attn.w"]["shards"]}
        check(len(files) == 2, f"the tp=2 checkpoint keeps blocks.0.attn.w in {sorted(files)}, not 2 files")
        run(tool, "verify", os.path.join(tmp, "tp2"))

        out = os.path.join(tmp, "consolidated")
        run(tool, "convert", os.path.join(tmp, "tp2"), "--to", out, "--consolidate")
        got = read_safetensors(os.path.join(out, "model.safetensors"))
        check(sorted(got) == sorted(expected), f"tensors {sorted(got)}, expected {sorted(expected)}")
        for name, (dtype, shape, raw) in expected.items():
            g_dtype, g_shape, g_raw = got[name]
            check((g_dtype, g_shape) == (dtype, shape), f"{name}: {g_dtype} {g_shape}, expected {dtype} {shape}")
            check(values(g_dtype, g_raw) == values(dtype, raw), f"{name}: values differ")
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        check(config["step"] == 0 and config["state_step"] == 0, f"config.json: {config}")
        check(config["layout"] == {"dp": 1, "edp": 1, "ep": 1, "pp": 1, "tp": 2}, f"config.json layout: {config['layout']}")
    print(f"consolidate_check: OK, {len(expected)} tensors match")


if __name__ == "__main__":
    main()
