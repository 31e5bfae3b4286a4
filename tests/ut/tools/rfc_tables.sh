#!/usr/bin/env bash
# The option reference pages are the ones the code declares, and the RFCs
# are design documents of a readable size:
#  - docs/options/*.md is exactly what scripts/options_docs.sh writes from
#    `hp-train --options-markdown`;
#  - every RFC of a feature with options links its page;
#  - every RFC (and the template) has at most 700 lines of at most 100
#    characters.
set -uo pipefail
HP_TRAIN=$1
DOCS=$2  # docs/rfc
ROOT=$(cd "$DOCS/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
bash "$ROOT/scripts/options_docs.sh" "$HP_TRAIN" "$ROOT/docs/options" --check || fail "option pages out of date"
links() {  # RFC PAGE
  grep -qF "../options/$2.md" "$DOCS/$1" || fail "$1 does not link its option page docs/options/$2.md"
}
links 0001-config-and-plugins.md core
links 0003-recompute.md recompute
links 0004-tensor-parallel.md tensor_parallel
links 0005-pipeline-parallel.md pipeline_parallel
links 0006-zero.md zero
links 0007-flight-recorder.md core
links 0008-expert-parallel.md expert_parallel
links 0009-sharded-checkpoint.md sharded_checkpoint
links 0012-context-parallel.md context_parallel
links 0013-per-module-degrees.md tensor_parallel
python3 - "$DOCS" <<'PY' || fail "an RFC is longer than 700 lines or has lines over 100 characters"
import pathlib, sys
bad = False
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.md")):
    lines = p.read_text(encoding="utf-8").splitlines()
    if len(lines) > 700:
        print(f"{p.name}: {len(lines)} lines (at most 700)"); bad = True
    for n, l in enumerate(lines, 1):
        if len(l) > 100:
            print(f"{p.name}:{n}: {len(l)} characters (at most 100)"); bad = True; break
sys.exit(1 if bad else 0)
PY
echo "PASS: option pages match the code; RFCs link them; every RFC within 700 lines of 100 characters"
