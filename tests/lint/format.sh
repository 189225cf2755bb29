#!/usr/bin/env bash
# The C code's format (.clang-format) on the lines a change touches: the diff
# of the work tree against its merge base with main, formatted by Debian's
# clang-format (git clang-format). Code the change did not touch is never
# judged, so a clean clone of main always passes. Skipped, saying why, outside
# a git checkout or without a main branch to compare with.
#   tests/lint/format.sh                  against the merge base with main
#   TPUEMU_FORMAT_BASE=COMMIT tests/lint/format.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
command -v git-clang-format >/dev/null && command -v clang-format >/dev/null ||
    { echo "FAIL: no clang-format (apt-get install clang-format; scripts/lib.sh lists it)"; exit 1; }
git rev-parse --git-dir >/dev/null 2>&1 || { echo "format: not a git checkout; skipped"; exit 0; }
base=${TPUEMU_FORMAT_BASE:-}
if [ -z "$base" ]; then
    for ref in origin/main main; do
        git rev-parse -q --verify "$ref^{commit}" >/dev/null && base=$(git merge-base HEAD "$ref") && break
    done
    [ -n "$base" ] || { echo "format: no main branch to compare with; skipped"; exit 0; }
fi
out=$(git clang-format --binary "$(command -v clang-format)" --diff --extensions c,h "$base" 2>&1)
rc=$?
case $out in
"no modified files to format" | "clang-format did not modify any files" | "")
    echo "format: the C lines changed since $(git rev-parse --short "$base") follow .clang-format"
    exit 0 ;;
esac
[ $rc -eq 0 ] || [ $rc -eq 1 ] || { echo "FAIL: git clang-format failed: $out"; exit 1; }
echo "$out"
echo "FAIL: the C lines changed since $(git rev-parse --short "$base") differ from .clang-format (above);"
echo "      'git clang-format $(git rev-parse --short "$base")' reformats just those lines"
exit 1
