#!/usr/bin/env bash
# The repository cites nothing outside itself: no file names a path a
# fresh clone does not have (the design folder beside the checkout, the
# machine's work directory),
# and the project's own documents are cited as docs/PARITY.md,
# docs/moe.md, docs/toolchain.md, docs/architecture.md and docs/style.md,
# never by a bare or outside name (ARCHITECTURE.md, STYLE.md).
# Checks every file git knows (tracked, or new and not ignored); without git,
# every file under the source tree except build directories.
# Usage: no_outside_paths.sh SOURCE_DIR. Exit 1 naming file:line per citation.
set -uo pipefail
SRC=${1:?usage: no_outside_paths.sh SOURCE_DIR}
cd "$SRC" || exit 2
self=tests/ut/repo/no_outside_paths.sh

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard)
else
  mapfile -t files < <(find . -type f -not -path './.git/*' -not -path './build*' -not -path '*/build/*' \
                         | sed 's|^\./||')
fi
((${#files[@]})) || { echo "FAIL: no files found under $SRC"; exit 1; }

# rule|Perl regex; each match is reported with the rule.
rules=(
  'a path outside the repository (the shared folder beside the checkout)|\.\./shared'
  'the outside design folder|shared[/]design'
  'an absolute path of the machine the project was written on|[/]work[/]'
  'a bare PARITY.md: cite docs/PARITY.md|(?<!docs/)(?<![\w.-])PARITY\.md'
  'MOE.md: cite docs/moe.md|MOE\.md'
  'LIBTORCH-NOTES: cite docs/toolchain.md|LIBTORCH-NOTES'
  'ARCHITECTURE.md, or architecture.md without docs/: cite docs/architecture.md|(?<![\w.-])(?<!docs/)(?i:architecture)\.md|(?<=docs/)(?!architecture\.md)(?i:architecture)\.md'
  'STYLE.md, or style.md without docs/: cite docs/style.md|(?<![\w.-])(?<!docs/)(?i:style)\.md|(?<=docs/)(?!style\.md)(?i:style)\.md'
)

mapfile -t files < <(for f in "${files[@]}"; do [[ $f != "$self" && -f $f ]] && echo "$f"; done)
found=0
for r in "${rules[@]}"; do
  what=${r%%|*} re=${r#*|}
  # file:line:text for every match (-I: binary files are skipped).
  while IFS= read -r hit; do
    f=${hit%%:*} rest=${hit#*:}
    echo "$f:${rest%%:*}: $what: ${rest#*:}"
    found=$((found + 1))
  done < <(grep -InHP -- "$re" "${files[@]}")
done
if ((found)); then
  echo "FAIL: $found citation(s) of paths outside the repository (fix each line above)"
  exit 1
fi
echo "PASS: ${#files[@]} files cite nothing outside the repository"
