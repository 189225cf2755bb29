#!/usr/bin/env bash
# The walk-through's example with its input on the hosts: a resolver and 4
# workers (2 hosts x 2 cores) on loopback, examples/fashion_mnist for 5 epochs
# twice, once client-fed (--input memory: the client reads the files and sends
# every core its rows) and once with --input hosts (each core's tpu-worker
# reads the Fashion-MNIST files itself and runs its own shard's pipeline). The
# checks a user makes: both exit 0 with 117 steps an epoch, both reach a test
# accuracy of at least 0.865, and the host-side run's is within 0.01 of the
# client-fed run's (the shuffles differ: one pipeline over 60000 rows, or
# four over their 15000 each; the seeds tried give 0.876-0.880 either way).
#
#   tests/example/hostinput.sh BUILD_DIR
set -uo pipefail
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-example.XXXXXX)
. "$(dirname "${BASH_SOURCE[0]}")/../support/local_cluster.sh"
start_local_cluster "$bin" "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
declare -A acc
for input in memory hosts; do
    timeout 600 "$bin/fashion_mnist" --tpu "$tpu" --epochs 5 --input $input --logdir "logs-$input" \
        >"out-$input.txt" 2>"err-$input.txt"
    rc=$?
    cat "out-$input.txt" "err-$input.txt"
    [ $rc -eq 0 ] || fail "fashion_mnist --input $input exited $rc"
    grep -qE "^117/117 \[=+\]" "out-$input.txt" || fail "--input $input: an epoch did not end with 117/117 batches"
    acc[$input]=$(sed -n 's/^test accuracy: //p' "out-$input.txt")
    [ -n "${acc[$input]}" ] || fail "--input $input: no 'test accuracy:' line"
    awk -v a="${acc[$input]}" 'BEGIN { exit !(a >= 0.865) }' ||
        fail "--input $input: test accuracy ${acc[$input]} is below 0.865 after 5 epochs"
done
grep -q "no training rows through the client" out-hosts.txt || fail "--input hosts did not say where its pipelines run"
awk -v a="${acc[memory]}" -v b="${acc[hosts]}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
    fail "test accuracy ${acc[hosts]} with host-side input, ${acc[memory]} client-fed: more than 0.01 apart"
echo "1 passed, 0 failed: test accuracy ${acc[hosts]} with host-side input, ${acc[memory]} client-fed (5 epochs, 4 cores)"
