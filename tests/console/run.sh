#!/usr/bin/env bash
# The cluster console in a real browser: in a network namespace of its own
# that has nothing but loopback, a resolver serving the console on its
# metrics port and 4 workers (2 hosts x 2 cores, v3, heartbeats every 200 ms),
# initialized; examples/fashion_mnist trains 1 epoch; then headless Chromium,
# driven over its DevTools protocol by tests/console/check.py (Debian's
# python3-websocket), opens http://127.0.0.1:PORT/ and checks what a user sees:
# the grid, a `tpuctl chaos kill` turning a tile DEAD within 3 s with an event
# naming the core, a `tpuctl chaos preempt` showing PREEMPTED, and the page
# going on by itself after the resolver restarts. Then `tpuctl board` on the
# training's log directory: the scalars' tables hold fit's history (as float32),
# the profile names the bottleneck of the overview the profiler wrote, in red,
# with its charts and picture; an event file with a flipped byte is named, with
# what is wrong, and its records before that byte still shown.
#
#   tests/console/run.sh BUILD_DIR [SCREENSHOT_DIR]
# With SCREENSHOT_DIR, the pages are saved there as console.png (trained, every
# core READY), console-faults.png (after the kill and the preemption) and
# board.png;
# scripts/screenshots.sh uses that for the docs.
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || fail "usage: tests/console/run.sh BUILD_DIR [SCREENSHOT_DIR]"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$(cd "$1" && pwd)/bin
shots=""
[ $# -eq 2 ] && { mkdir -p "$2" && shots=$(cd "$2" && pwd) || fail "cannot make $2"; }
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
for tool in chromium unshare ip; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/lib.sh lists the packages)"
done
/usr/bin/python3 -c "import websocket" 2>/dev/null || fail "python3-websocket is not installed (scripts/lib.sh lists it)"
[ -f "$data/train-images-idx3-ubyte.gz" ] || fail "$data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"

work=$(mktemp -d /tmp/tpuemu-console.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/inner.sh" <<'INNER'
set -u
bin=$1 work=$2 here=$3 shots=$4
ip link set lo up
. "$here/../support/local_cluster.sh"
extra=()
cleanup() {
    [ -f "$work/resolver2.pid" ] && kill -TERM "$(cat "$work/resolver2.pid")" 2>/dev/null
    lc_cleanup
}
trap cleanup EXIT
lc_claim_port mport
lc_claim_port dport
lc_claim_port bport
lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 200 --metrics-port "$mport"
echo "${_lc_pids[-1]}" >"$work/resolver.pid"
for h in 0 1; do
    for c in 0 1; do
        lc_claim_port wport
        "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type v3 --metrics-port "$wport" \
            2>"$work/worker-$h-$c.log" &
        _lc_pids+=($!)
    done
done
"$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || { tail -n 5 "$work"/*.log; exit 1; }
(cd "$work" && timeout 300 "$bin/fashion_mnist" --tpu "$tpu" --epochs 2 --history history.txt >train.out 2>train.err) ||
    { cat "$work/train.out" "$work/train.err"; echo "FAIL: fashion_mnist failed"; exit 1; }
"$bin/tpuctl" board --logdir "$work/logs" --port "$bport" >"$work/board.out" 2>&1 &
_lc_pids+=($!)
"$bin/tpuctl" --tpu "$tpu" console --port "$mport" >"$work/url" || { echo "FAIL: tpuctl console failed"; exit 1; }
[ "$(cat "$work/url")" = "http://127.0.0.1:$mport/" ] || { echo "FAIL: tpuctl console printed $(cat "$work/url")"; exit 1; }
CONSOLE_DEVTOOLS_PORT=$dport CONSOLE_BOARD_PORT=$bport \
CONSOLE_RESTART="'$bin/tpu-resolver' --listen '$tpu' --heartbeat-ms 200 --metrics-port $mport 2>>'$work/resolver2.log' & echo \$! >'$work/resolver2.pid'" \
    timeout 240 /usr/bin/python3 "$here/check.py" "$bin" "$tpu" "$mport" "$work" $shots
INNER
unshare --net bash "$work/inner.sh" "$bin" "$work" "$here" "$shots"
rc=$?
if [ $rc -ne 0 ]; then
    for f in "$work"/resolver.log "$work"/resolver2.log "$work"/chromium.log; do
        [ -f "$f" ] && { echo "--- tail of $(basename "$f")"; tail -n 8 "$f"; }
    done
    fail "the console's browser test failed (exit $rc)"
fi
