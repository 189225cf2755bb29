#!/bin/sh
# Installs the client from a configured build tree into a temporary prefix and
# builds app.c against it twice: with pkg-config and with find_package(tpuemu).
# usage: tests/consumer/run.sh BUILD_DIR   (exit 0 when both build and run)
# $CONSUMER_CFLAGS is added to both builds (the sanitizer build's library needs
# the program built with the same sanitizers).
set -eu
build=${1:?usage: run.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --build "$build" --target tpuclient tpuctl >/dev/null
cmake --install "$build" --prefix "$tmp/prefix" --component client >/dev/null
libdir=$(dirname "$(find "$tmp/prefix" -name tpuclient.pc)")
cflags=${CONSUMER_CFLAGS:-}
PKG_CONFIG_PATH=$libdir cc -Wall -Werror $cflags "$here/app.c" -o "$tmp/app-pc" \
    $(PKG_CONFIG_PATH=$libdir pkg-config --cflags --libs tpuclient) -Wl,-rpath,"$libdir/.."
"$tmp/app-pc" 127.0.0.1:1 >/dev/null 2>"$tmp/err" && exit 1  # nothing listens on port 1
grep -q '^UNAVAILABLE: nothing is listening at 127.0.0.1:1' "$tmp/err"
cmake -S "$here" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$cflags" \
    -DCMAKE_EXE_LINKER_FLAGS="$cflags" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer" 127.0.0.1:1 >/dev/null 2>"$tmp/err" && exit 1
grep -q '^UNAVAILABLE: nothing is listening at 127.0.0.1:1' "$tmp/err"
echo "consumer: pkg-config and find_package(tpuemu) builds work"
