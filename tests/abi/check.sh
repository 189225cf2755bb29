#!/usr/bin/env bash
# The ABI of libtpuclient against the stored baseline (client/abi/libtpuclient.abi),
# with libabigail's abidw and abidiff:
#   tests/abi/check.sh BUILD_DIR            compare; fails on an incompatible change
#   tests/abi/check.sh BUILD_DIR --update   write the baseline from BUILD_DIR's library
# An added function or a field taken from a struct's reserved space is compatible
# and passes (the report shows it). An incompatible change (a function removed or
# changed, a struct grown or reordered, an enum value moved) fails unless SOVERSION
# (client/CMakeLists.txt) moved with it and the baseline was written again: a new
# SOVERSION without a new baseline fails too. The library must carry debug
# information (the default RelWithDebInfo build does).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
build=${1:?usage: tests/abi/check.sh BUILD_DIR [--update]}
build=$(cd "$build" && pwd)
baseline=client/abi/libtpuclient.abi
lib=$build/client/libtpuclient.so
[ -e "$lib" ] || { echo "no $lib: build first" >&2; exit 1; }
for t in abidw abidiff; do
    command -v $t >/dev/null || { echo "$t is missing: install abigail-tools" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the public headers only; no path of this machine in the file
abidw --headers-dir client/include/tpuemu --header-file "$build/client/include/tpuemu/version.h" \
    --no-corpus-path --no-comp-dir-path --no-show-locs --drop-private-types --exported-interfaces-only "$lib" |
    sed -e "s|$build/||g" -e "s|$src/||g" >"$tmp/now.abi"

if [ "${2:-}" = --update ]; then
    cp "$tmp/now.abi" "$baseline"
    echo "wrote $baseline ($(grep -o "soname='[^']*'" "$baseline"))"
    exit 0
fi
[ -f "$baseline" ] || { echo "no baseline $baseline: write it with --update" >&2; exit 1; }
was=$(grep -o "soname='[^']*'" "$baseline" | head -1)
now=$(grep -o "soname='[^']*'" "$tmp/now.abi" | head -1)
if [ "$was" != "$now" ]; then
    echo "the library's $now is not the baseline's $was: after an incompatible change the" >&2
    echo "SOVERSION moves and so does the baseline: tests/abi/check.sh $1 --update" >&2
    exit 1
fi
rc=0
abidiff --no-show-locs "$baseline" "$tmp/now.abi" >"$tmp/report" || rc=$?
cat "$tmp/report"
if [ $((rc & 1)) -ne 0 ]; then
    echo "abidiff failed (status $rc)" >&2
    exit 1
fi
# abidiff calls only removed or changed symbols incompatible (bit 8); a struct
# that grew or moved its fields, or an enum value that moved, breaks callers too.
# A member taken from the reserved space shrinks reserved[] and moves it:
# that is the growth the space is there for.
bad=$(awk '/type of .uint64_t reserved\[/ { r = 1; next } /type of ./ { r = 0 }
           /and offset changed/ && r { next } { print }' "$tmp/report" |
    grep -E "type size changed from|offset changed from|value changed from|deleted|return type changed|parameter [0-9]+ of type .* changed" |
    grep -vE "array type size changed|'uint64_t reserved\[" || true)
if [ $((rc & 8)) -ne 0 ] || [ -n "$bad" ]; then
    [ -n "$bad" ] && printf '%s\n' "$bad" >&2
    echo "an incompatible ABI change against $baseline ($was): undo it, or move SOVERSION in" >&2
    echo "client/CMakeLists.txt and write the baseline again (tests/abi/check.sh $1 --update)" >&2
    exit 1
fi
if [ $((rc & 4)) -ne 0 ]; then
    echo "compatible ABI changes (above); the baseline may be written again to record them"
else
    echo "the ABI is the baseline's ($was)"
fi
