#!/usr/bin/env bash
# The example survives a preemption as TensorFlow's PreemptionCheckpointHandler
# does: a resolver and 4 workers (2 hosts x 2 cores) on loopback; first an
# undisturbed run of examples/fashion_mnist (4 epochs) for its test accuracy;
# then the same run with --checkpoint, and once host1/1 has finished step
# 130, in epoch 2, a preemption notice of 4 s (`tpuctl chaos --at-step 130
# --notice-ms 4000 preempt host1/1`, injected before the run: by a step, so
# that it lands in epoch 2 however fast a step is). The checks a user makes:
# the example names the notice and host1/1, saves its checkpoint and exits 42
# before the core is gone; the worker exits 4 and `tpuctl cluster` lists the
# core PREEMPTED; with the worker started again and the example started again
# with the same flags, it resumes from the checkpoint, finishes every epoch,
# exits 0, and its test accuracy is within one point of the undisturbed run's.
#
#   tests/example/preempt.sh BUILD_DIR
set -uo pipefail
unset TPUEMU_METRICS_PORT # four workers on one machine cannot share one metrics port
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-preempt.XXXXXX)
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
fail() {
    echo "FAIL: $*"
    for f in "$work"/out*.txt; do [ -f "$f" ] && { echo "---- $f"; cat "$f"; }; done
    exit 1
}
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
run() { # output file: the example with the test's flags
    timeout 300 "$bin/fashion_mnist" --tpu "$tpu" --epochs 4 --checkpoint "$work/fm.ckpt" >"$1" 2>&1
}

# ---- undisturbed
run out-clean.txt || fail "the undisturbed run exited $?"
clean=$(sed -n 's/^test accuracy: //p' out-clean.txt)
[ -n "$clean" ] || fail "the undisturbed run printed no test accuracy"
rm -f "$work/fm.ckpt"

# ---- preempted
"$bin/tpuctl" --tpu "$tpu" chaos --at-step 130 --notice-ms 4000 preempt host1/1 >/dev/null ||
    fail "tpuctl chaos --at-step 130 preempt failed"
run out1.txt &
trainer=$!
wait "$trainer"
rc=$?
trainer=
[ $rc -eq 42 ] || fail "the preempted run exited $rc, not 42"
grep -qE "^fashion_mnist: training: PREEMPTED: a preemption notice came from core host1/1 .*every replica stopped after step [0-9]+" out1.txt ||
    fail "no PREEMPTED error naming host1/1 and the step"
[ -s "$work/fm.ckpt" ] || fail "no checkpoint saved"
wait "$victim"
vrc=$?
victim=
[ $vrc -eq 4 ] || fail "the preempted worker exited $vrc, not 4"
"$bin/tpuctl" --tpu "$tpu" cluster --state PREEMPTED >cluster.txt 2>&1
grep -qE "^host1 +1 +PREEMPTED" cluster.txt || fail "tpuctl cluster does not list host1/1 PREEMPTED: $(cat cluster.txt)"

# ---- started again: the worker, then the example with the same flags
worker 1 1
victim=$!
"$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || fail "the cluster did not come back"
run out2.txt || fail "the resumed run exited $?"
grep -qE "^resuming from .*fm.ckpt: epoch 2, batch [0-9]+, step [0-9]+" out2.txt || fail "it did not resume from the checkpoint"
grep -q "^Epoch 1/4" out2.txt && fail "the resumed run started again from epoch 1"
grep -q "^Epoch 4/4" out2.txt || fail "epoch 4 never began"
acc=$(sed -n 's/^test accuracy: //p' out2.txt)
[ -n "$acc" ] || fail "no 'test accuracy:' line after the resume"
awk -v a="$acc" -v c="$clean" 'BEGIN { d = a - c; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
    fail "test accuracy $acc after the preemption is not within one point of the undisturbed run's $clean"
echo "1 passed, 0 failed: fashion_mnist saved its checkpoint on host1/1's preemption notice, exited 42, and" \
    "resumed to test accuracy $acc (undisturbed: $clean)"
