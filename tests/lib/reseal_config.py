#!/usr/bin/env python3
"""reseal_config.py STEP_DIR: after a test edits STEP_DIR/config.yaml on purpose
(to make a checkpoint as an older version wrote it), record the file's new
xxh64 in manifest.json (config_hash) and the manifest's new xxh64 in
manifest.json.xxh64, as the checkpoint writer does. XXH64 (seed 0) written
here from the published algorithm (xxhash's spec); Debian has no Python
binding for it installed by default."""
import json
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, lane):
    return (rotl((acc + lane * P2) & M, 31) * P1) & M


def merge(acc, v):
    return ((acc ^ rnd(0, v)) * P1 + P4) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed & M, (seed - P1) & M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = rnd(v[k], int.from_bytes(data[i + 8 * k:i + 8 * k + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for k in range(4):
            h = merge(h, v[k])
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, int.from_bytes(data[i:i + 8], "little")), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (int.from_bytes(data[i:i + 4], "little") * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M), 11) * P1) & M
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M
    h = ((h ^ (h >> 29)) * P3) & M
    return h ^ (h >> 32)


def main(step_dir):
    manifest_path = step_dir + "/manifest.json"
    manifest = json.load(open(manifest_path))
    config = open(step_dir + "/" + manifest.get("config_file", "config.yaml"), "rb").read()
    manifest["config_hash"] = "%016x" % xxh64(config)
    text = json.dumps(manifest, indent=2)
    with open(manifest_path, "w") as f:
        f.write(text)
    with open(manifest_path + ".xxh64", "w") as f:
        f.write("%016x  manifest.json\n" % xxh64(open(manifest_path, "rb").read()))


if __name__ == "__main__":
    main(sys.argv[1])
