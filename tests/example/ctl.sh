#!/usr/bin/env bash
# The custom-training-loop example end to end: a resolver and 4 workers (2
# hosts x 2 cores) on loopback, examples/fashion_mnist_ctl for 5 epochs of
# 117 steps (global batch 512: the whole of 60000 rows, drop_remainder) with
# experimental_distribute_dataset, then 1 epoch of 40 steps with
# distribute_datasets_from_function, on Debian's dataset-fashion-mnist files.
# The checks a user makes: it exits 0, prints each epoch's line with the steps
# it ran, and reaches the test accuracy example_fashion_mnist holds fit to
# after 5 epochs, 0.85 (it reaches 0.87); the shorter second run is held to
# 0.75 (it reaches 0.79).
#
#   tests/example/ctl.sh BUILD_DIR
set -uo pipefail
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-example-ctl.XXXXXX)
. "$(dirname "${BASH_SOURCE[0]}")/../support/local_cluster.sh"
# heartbeats every second, as a real cluster's resolver has them: every step
# waits for its infeed here (no step runs ahead, as in fit), and with 200 ms
# heartbeats a core starved of CPU on a loaded machine was taken for a dead
# one mid-all-reduce (1 run in 3 beside two CPU hogs)
start_local_cluster "$bin" "$work" 1000
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
accuracy_at_least() { # out file, threshold, what
    local acc
    acc=$(sed -n 's/^test accuracy: //p' "$1")
    [ -n "$acc" ] || fail "$3: no 'test accuracy:' line"
    awk -v a="$acc" -v t="$2" 'BEGIN { exit !(a >= t) }' || fail "$3: test accuracy $acc is below $2"
    echo "$3: test accuracy $acc"
}

timeout 400 "$bin/fashion_mnist_ctl" --tpu "$tpu" --epochs 5 --steps 117 >out.txt 2>err.txt
rc=$?
cat out.txt err.txt
[ $rc -eq 0 ] || fail "fashion_mnist_ctl exited $rc"
grep -q "^Epoch 5, Steps: 117, Loss: " out.txt || fail "no line for epoch 5 with its 117 steps"
accuracy_at_least out.txt 0.85 "experimental_distribute_dataset, 5 x 117 steps"

timeout 400 "$bin/fashion_mnist_ctl" --tpu "$tpu" --epochs 1 --steps 40 --from-function >out2.txt 2>err2.txt
rc=$?
cat out2.txt err2.txt
[ $rc -eq 0 ] || fail "fashion_mnist_ctl --from-function exited $rc"
grep -q "^Epoch 1, Steps: 40, Loss: " out2.txt || fail "--from-function: no line for epoch 1 with its 40 steps"
accuracy_at_least out2.txt 0.75 "distribute_datasets_from_function, 40 steps"
echo "2 passed, 0 failed"
