#!/usr/bin/env bash
# The walk-through's example end to end: a resolver and 4 workers (2 hosts x 2
# cores) on loopback, examples/fashion_mnist for 5 epochs on the Fashion-MNIST
# files of Debian's dataset-fashion-mnist, and the checks a user makes: it
# exits 0, prints the progress of every epoch, writes the profile of batches
# 10-20, and reaches a test accuracy of at least 0.85.
#
#   tests/example/run.sh BUILD_DIR
set -uo pipefail
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-example.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
tpu=127.0.0.1:$port
"$bin/tpu-resolver" --listen "$tpu" --heartbeat-ms 200 2>"$work/resolver.log" &
pids+=($!)
for h in 0 1; do
    for c in 0 1; do
        "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type v3 \
            2>"$work/worker-$h-$c.log" &
        pids+=($!)
    done
done
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
"$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || {
    echo "FAIL: the cluster did not come up"; tail -n 5 "$work"/*.log; exit 1; }
cd "$work"
timeout 600 "$bin/fashion_mnist" --tpu "$tpu" --epochs 5 >out.txt 2>err.txt
rc=$?
cat out.txt err.txt
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "fashion_mnist exited $rc"
grep -q "^Epoch 5/5" out.txt || fail "no progress line for epoch 5"
grep -qE "^117/117 \[=+\]" out.txt || fail "an epoch did not end with 117/117 batches (60000 / 512, drop_remainder)"
ls logs/plugins/profile/*/steps.json >/dev/null 2>&1 || fail "no profile under logs/plugins/profile/"
ls logs/plugins/profile/*/*.trace.json.gz >/dev/null 2>&1 || fail "no trace file under logs/plugins/profile/RUN/"
grep -q "^Bottleneck: " out.txt || fail "the profiler printed no bottleneck"
acc=$(sed -n 's/^test accuracy: //p' out.txt)
[ -n "$acc" ] || fail "no 'test accuracy:' line"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || fail "test accuracy $acc is below 0.85 after 5 epochs"
echo "1 passed, 0 failed: fashion_mnist reached test accuracy $acc in 5 epochs on 4 cores"
