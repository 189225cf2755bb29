#!/usr/bin/env bash
# The README's C example as a reader uses it: the ```c block under "The client
# library in 20 lines", built against the installed client with the README's
# own command (cc app.c $(pkg-config --cflags --libs tpuclient)) and run on a
# local cluster of 4 cores; it must print that every replica holds
# 0 + 1 + 2 + 3 = 6.
#   tests/example/readme.sh BUILD_DIR
# $CONSUMER_CFLAGS is added to the build (the sanitizer build's library needs
# the program built with the same sanitizers).
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
build=$(cd "${1:?usage: readme.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/tpuemu-readme.XXXXXX)
. "$root/tests/support/local_cluster.sh"
trap 'rm -rf "$work"' EXIT   # until the cluster's cleanup takes it over

awk '/^## The client library in 20 lines/ { s = 1 } s && /^```c$/ { c = 1; next } c && /^```$/ { exit } c' \
    "$root/README.md" >"$work/app.c"
[ -s "$work/app.c" ] || fail "README.md has no \`\`\`c block under '## The client library in 20 lines'"
lines=$(grep -c '' "$work/app.c")
[ "$lines" -le 24 ] || fail "the README's example is $lines lines, not about 20"
grep -qF 'cc app.c $(pkg-config --cflags --libs tpuclient)' "$root/README.md" ||
    fail "README.md no longer gives the one-line build this test uses"

cmake --install "$build" --prefix "$work/prefix" --component client >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; fail "cmake --install of the client"; }
libdir=$(dirname "$(find "$work/prefix" -name tpuclient.pc)")
(cd "$work" && PKG_CONFIG_PATH=$libdir cc -std=c11 -Wall -Wextra -Werror ${CONSUMER_CFLAGS:-} app.c -o app \
    $(PKG_CONFIG_PATH=$libdir pkg-config --cflags --libs tpuclient) -Wl,-rpath,"$libdir/..") 2>"$work/cc.err" ||
    { cat "$work/cc.err"; fail "the README's example does not build with the README's command"; }

start_local_cluster "$build/bin" "$work"   # removes $work on exit
out=$(cd "$work" && TPU_NAME=$tpu timeout 60 ./app 2>"$work/app.err")
rc=$?
[ $rc -eq 0 ] || { cat "$work/app.err"; fail "the README's example exited $rc"; }
[ "$out" = "4 replicas, each holds 6" ] || fail "the README's example printed '$out', not '4 replicas, each holds 6'"
echo "ok: the README's C example builds with its command and prints '$out'"
