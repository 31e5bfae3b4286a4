"""Which translation units take the precompiled LibTorch header, and which need it.

Using the header costs a translation unit 9-14 s even when the file
includes nothing of LibTorch (cmake/Helpers.cmake, hp_without_torch_pch),
and a file that includes LibTorch without it parses LibTorch itself (~27 s).
This lists both mismatches from a configured build directory's compile
commands (`ninja -t compdb`), finding each unit's headers with the
compiler's -M (the header left out): about 1.5 minutes on 2 cores.

  python3 scripts/pch_scan.py [BUILD_DIR=build]

Prints one line per mismatch and a count; exit 1 when there is any.
"""

import json
import shlex
import subprocess
import sys

DROP_WITH_VALUE = {"-include", "-o", "-MF", "-MT"}
DROP = {"-MD", "-c", "-Winvalid-pch"}


def code_flags(entry):
    """The -f, -O and -m options: a unit whose differ from the header's cannot use it."""
    return {a for a in shlex.split(entry["command"]) if a.startswith(("-f", "-O", "-m"))}


def needs_torch(entry):
    cmd = entry["command"]
    args = shlex.split(cmd[cmd.index("ccache ") + len("ccache "):] if "ccache " in cmd else cmd)
    while args and "=" in args[0]:  # a leading VAR=value of `cmake -E env`
        args.pop(0)
    kept, i = [], 0
    while i < len(args):
        if args[i] in DROP_WITH_VALUE:
            i += 2
            continue
        if args[i] not in DROP:
            kept.append(args[i])
        i += 1
    deps = subprocess.run(kept + ["-M"], capture_output=True, text=True, cwd=entry["directory"])
    if deps.returncode != 0:
        raise SystemExit(f"pch_scan: {entry['output']}: the compiler's -M failed: {deps.stderr.strip()[:300]}")
    return any(m in deps.stdout for m in ("/torch/", "/ATen/", "/c10/"))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    db = json.loads(subprocess.run(["ninja", "-C", build, "-t", "compdb"], capture_output=True, text=True,
                                   check=True).stdout)
    units = [e for e in db if e["output"].endswith(".o") and " -c " in e["command"]
             and "pch_anchor" not in e["file"]]
    anchor = [e for e in db if "pch_anchor" in e["file"]]
    pch_flags = code_flags(anchor[0]) if anchor else set()
    bad = 0
    for e in units:
        with_pch = "cmake_pch.hxx" in e["command"]
        torch = needs_torch(e)
        if with_pch and not torch and "/unity/" in e["file"]:
            print(f"note: a unity unit that includes no LibTorch takes the header: {e['file']} (its sources share it)")
        elif with_pch and not torch:
            print(f"takes the LibTorch header but includes no LibTorch: {e['file']} (hp_without_torch_pch)")
            bad += 1
        elif torch and not with_pch and code_flags(e) != pch_flags:
            print(f"note: compiled with flags of its own ({' '.join(sorted(code_flags(e) ^ pch_flags))}), so without "
                  f"the header: {e['file']}")
        elif torch and not with_pch:
            print(f"includes LibTorch without the precompiled header: {e['file']} (hp_use_torch_pch, or take it "
                  f"off hp_without_torch_pch)")
            bad += 1
    print(f"pch_scan: {len(units)} translation units, {bad} mismatched")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
