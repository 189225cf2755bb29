#!/usr/bin/env bash
# The main job: install what is needed, build, start a local emulated TPU
# cluster (a resolver named demo-tpu and a v4-16 slice from tpu-slice: 8
# workers, 2 hosts x 4 devices, as Cloud TPU shapes a v4-16), initialize it
# and show its topology, and run the TensorFlow TPU walk-through against it
# (it initializes the system again, as the walk-through does): examples/fashion_mnist trains
# Dense(128, relu) -> Dense(10, softmax) on Fashion-MNIST for 10 epochs with a
# global batch of 128 x 8, mixed_bfloat16 and prefetch, profiles batches
# 10-20 and prints the test accuracy. Then the cluster's state, an all-reduce
# benchmark, and shutdown. Everything started here is stopped on exit.
#
#   scripts/demo.sh                     # port 8470, or the next free one
#   TPUEMU_DEMO_PORT=9000 scripts/demo.sh
#   TPUEMU_DEMO_EPOCHS=3 scripts/demo.sh
#   scripts/demo.sh --python            # the walk-through's TensorFlow program instead
#                                       # (examples/python/walkthrough.py, import tpuemu.tf as tf)
set -euo pipefail
python=0
case "${1:-}" in
--python) python=1 ;;
"") ;;
*) echo "usage: scripts/demo.sh [--python]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
. scripts/lib.sh

install_packages
build_tree build -DTPUEMU_WERROR=OFF

bin=build/bin
port=${TPUEMU_DEMO_PORT:-8470}
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
tpu="127.0.0.1:$port"
mport=$((port + 1000))
while (exec 3<>"/dev/tcp/127.0.0.1/$mport") 2>/dev/null; do mport=$((mport + 1)); done
logdir=$(mktemp -d /tmp/tpuemu-demo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    echo "stopped the cluster; daemon logs are in $logdir"
}
trap cleanup EXIT

if [ -t 1 ]; then b=$(printf "\033[1m"); n=$(printf "\033[0m"); else b=""; n=""; fi
step() { printf "\n%s$ %s%s\n" "$b" "$*" "$n"; "$@"; }

echo "starting tpu-resolver on $tpu (TPU name demo-tpu) and a v4-16 slice: 8 tpu-workers (hosts host0, host1; 4 devices each)"
"$bin/tpu-resolver" --listen "$tpu" --name demo-tpu --metrics-port "$mport" 2>"$logdir/resolver.log" &
pids+=($!)
"$bin/tpu-slice" --accelerator-type v4-16 --resolver "$tpu" 2>"$logdir/workers.log" &
pids+=($!)
# tpuctl init waits for the cores, not for the resolver's port: wait until it
# listens (up to 10 s; a busy machine can take a moment to start it)
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${tpu%:*}/${tpu##*:}") 2>/dev/null && break
    sleep 0.1
done

# TPU_NAME is the TPU's name, as on Cloud TPU; the client looks it up at the
# resolver ($TPUEMU_TPU_API plays the Cloud TPU API)
export TPU_NAME=demo-tpu TPUEMU_TPU_API="$tpu"
step "$bin/tpuctl" init --expect 8 --timeout-ms 10000  # waits until all 8 cores registered
# the cluster console: open the URL it prints in a browser to watch the cores train
step "$bin/tpuctl" --tpu "$tpu" console --port "$mport"
cd "$logdir"  # TensorBoard's callback writes logs/train/plugins/profile/RUN/ and logs/train/events.* here
if [ "$python" = 1 ]; then
    # the TensorFlow program as it is, but for its import line, with the package from the build tree
    PYTHONPATH="$OLDPWD/build/python" step /usr/bin/python3 "$OLDPWD/examples/python/walkthrough.py"
else
    step "$OLDPWD/$bin/fashion_mnist" --epochs "${TPUEMU_DEMO_EPOCHS:-10}"
fi
cd "$OLDPWD"
step "$bin/tpuctl" cluster
step "$bin/tpuctl" health
step "$bin/tpuctl" bench allreduce --min 4K --max 16M --iters 5 --warmup 1
step "$bin/tpuctl" shutdown
