#!/usr/bin/env bash
# The example survives a core that dies: a resolver and 4 workers (2 hosts x
# 2 cores) on loopback, examples/fashion_mnist with a checkpoint every 20
# steps and --recover 2; worker host1/1 is killed (SIGKILL) once it has
# finished step 130, in epoch 2 (`tpuctl chaos --at-step 130 kill`: by a
# step, so that it lands in epoch 2 however fast a step is), and started
# again. The checks a user makes: the example reports
# UNAVAILABLE naming host1/1, waits, re-initializes the TPU system, restores
# the checkpoint, finishes every epoch, exits 0 and prints its test accuracy.
#
#   tests/example/recover.sh BUILD_DIR
set -uo pipefail
unset TPUEMU_METRICS_PORT # four workers on one machine cannot share one metrics port
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-recover.XXXXXX)
pids=()
victim=
trainer=
. "$(dirname "${BASH_SOURCE[0]}")/../support/local_cluster.sh"
cleanup() {
    for p in "${pids[@]}" $victim $trainer; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}" $victim $trainer; do wait "$p" 2>/dev/null; done
    lc_cleanup
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$work/out.txt" ] && cat "$work/out.txt"; exit 1; }
lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 200
worker() { # host core
    "$bin/tpu-worker" --resolver "$tpu" --host-id "host$1" --core "$2" --tpu-type v3 \
        2>>"$work/worker-$1-$2.log" &
}
for h in 0 1; do
    for c in 0 1; do
        worker "$h" "$c"
        if [ "$h$c" = 11 ]; then victim=$!; else pids+=($!); fi
    done
done
"$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null ||
    fail "the cluster did not come up: $(tail -n 3 "$work"/*.log)"

cd "$work"
"$bin/tpuctl" --tpu "$tpu" chaos --at-step 130 kill host1/1 >/dev/null || fail "tpuctl chaos --at-step 130 kill failed"
start=$(date +%s)
timeout 300 "$bin/fashion_mnist" --tpu "$tpu" --epochs 6 --checkpoint "$work/fm.ckpt" --checkpoint-every 20 \
    --recover 2 --recover-wait 60 >out.txt 2>&1 &
trainer=$!
for _ in $(seq 1200); do # 120 s at most for step 130
    kill -0 "$victim" 2>/dev/null || break
    kill -0 "$trainer" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$victim" 2>/dev/null && fail "host1/1 still runs: fashion_mnist never finished step 130"
wait "$victim" 2>/dev/null
killed=$(date +%s)
worker 1 1
victim=$!
wait "$trainer"
rc=$?
trainer=
end=$(date +%s)
cat out.txt
[ $rc -eq 0 ] || fail "fashion_mnist exited $rc"
grep -qE "^fashion_mnist: training: UNAVAILABLE: .*host1/1" out.txt ||
    fail "no UNAVAILABLE error naming host1/1"
grep -q "^recovering (1 of 2)" out.txt || fail "no 'recovering (1 of 2)' line"
grep -q "TPU system initialized again" out.txt || fail "the TPU system was not initialized again"
grep -qE "^  restored .*fm.ckpt: epoch [0-9]+, batch [0-9]+, step [0-9]+" out.txt || fail "no checkpoint restored"
grep -q "^recovering (2 of 2)" out.txt && fail "it had to recover twice from one kill"
grep -qE "^117/117 \[=+\]" out.txt || fail "no complete epoch (117/117 batches) after the recovery"
[ "$(grep -c '^Epoch 6/6' out.txt)" -ge 1 ] || fail "epoch 6 never began"
acc=$(sed -n 's/^test accuracy: //p' out.txt)
[ -n "$acc" ] || fail "no 'test accuracy:' line"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' || fail "test accuracy $acc is below 0.8 after 6 epochs"
echo "1 passed, 0 failed: fashion_mnist recovered from the kill of host1/1 and finished in $((end - killed)) s" \
    "more ($((end - start)) s in all), test accuracy $acc"
