#!/usr/bin/env bash
# All-reduce benchmark: ours against the OpenMPI and Gloo anchors, back to back
# in one run, on this machine.
#
#   bench/allreduce.sh [BUILD_DIR]
#
# For each n in $NS (default "2 4 8") it starts a resolver and n workers twice:
#   tcp: every worker on its own host id with --transport tcp (TCP loopback);
#   shm: all workers on one host id (shared memory between them);
# runs `tpuctl --json bench allreduce` on each (f32 sum, sizes $MIN..$MAX per
# replica, default 4K..64M), then, if ../shared/anchors/collectives exists, copies
# it to a temp dir, builds and runs its OpenMPI (tcp, vader) and Gloo ring
# programs for the same n, and prints per-n tables: our busbw and 4 KiB time
# next to the best anchor of each kind (TCP; shared memory = vader) and the ratio.
# Without ../shared (or without mpirun/Gloo) it runs ours alone and says so.
#
# Every size is timed as the anchors time theirs: at least WARMUP_MS (200) ms of
# warm-up and MIN_MS (700) ms of back-to-back iterations, and compared by the
# per-iteration median (p50), the anchors' figure; the means are shown too.
#
# ROUNDS=R (default 1) repeats the whole comparison R times, ours and then the
# anchors each round, and prints each cell's median over the rounds with the
# spread of its ratio: on a shared machine one round's ratio moves by 20 % and more.
#
# Environment: NS, MIN, MAX, ITERS (at least this many timed iterations per
# size, default 20), WARMUP (default 3), MIN_MS, WARMUP_MS, ROUNDS, ALGO (auto), TRANSPORTS ("tcp shm"), ANCHORS (auto|none),
# ANCHOR_CONFIGS (default "mpi_tcp mpi_tcp_recdbl mpi_tcp_rabenseifner mpi_vader
# gloo_ring"), OUT (directory for raw results; default a temp dir, kept).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
bin=$build/bin
[ -x "$bin/tpuctl" ] && [ -x "$bin/tpu-worker" ] && [ -x "$bin/tpu-resolver" ] ||
    { echo "no $bin/tpuctl, tpu-worker or tpu-resolver: build first (cmake --build $build)" >&2; exit 2; }
bin=$(cd "$bin" && pwd)

NS=${NS:-"2 4 8"}
MIN=${MIN:-4K}
MAX=${MAX:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
MIN_MS=${MIN_MS:-700}       # the anchors' timing policy: >= 700 ms of ops, >= 200 ms warm-up per size
WARMUP_MS=${WARMUP_MS:-200}
ROUNDS=${ROUNDS:-1}
ALGO=${ALGO:-auto}
TRANSPORTS=${TRANSPORTS:-"tcp shm"}
ANCHORS=${ANCHORS:-auto}
ANCHOR_CONFIGS=${ANCHOR_CONFIGS:-"mpi_tcp mpi_tcp_recdbl mpi_tcp_rabenseifner mpi_vader gloo_ring"}
OUT=${OUT:-$(mktemp -d /tmp/tpuemu-allreduce.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

pids=()
stop_all() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
anchors_dir=""
trap 'stop_all; [ -z "$anchors_dir" ] || rm -rf "$anchors_dir"' EXIT

free_port() {
    local p=$((20000 + RANDOM % 12000)) # below the ephemeral ports
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}

# ours TRANSPORT N: one cluster, one sweep, JSON in $OUT/ours.TRANSPORT.nN.json
ours() {
    local t=$1 n=$2 port tpu logs="$OUT/logs.$1.n$2" i
    port=$(free_port)
    tpu=127.0.0.1:$port
    mkdir -p "$logs"
    "$bin/tpu-resolver" --listen "$tpu" 2>"$logs/resolver.log" &
    pids+=($!)
    for ((i = 0; i < n; i++)); do
        if [ "$t" = tcp ]; then
            "$bin/tpu-worker" --resolver "$tpu" --host-id "h$i" --core 0 --transport tcp \
                2>"$logs/worker-$i.log" &
        else
            "$bin/tpu-worker" --resolver "$tpu" --host-id h0 --core "$i" 2>"$logs/worker-$i.log" &
        fi
        pids+=($!)
    done
    echo "ours: $t, n=$n ($MIN..$MAX, $ITERS iterations, algo $ALGO)" >&2
    # the resolver may not listen yet on a loaded machine: a refused init is retried
    for ((i = 0; i < 50; i++)); do
        "$bin/tpuctl" --tpu "$tpu" init --expect "$n" --timeout-ms 20000 >/dev/null 2>"$OUT/ours.$t.n$n.err" && break
        sleep 0.2
    done
    if [ "$i" -ge 50 ] ||
       ! "$bin/tpuctl" --tpu "$tpu" --json bench allreduce --init --min "$MIN" --max "$MAX" --iters "$ITERS" \
            --warmup "$WARMUP" --min-ms "$MIN_MS" --warmup-ms "$WARMUP_MS" --algo "$ALGO" >"$OUT/ours.$t.n$n.json" 2>"$OUT/ours.$t.n$n.err"; then
        echo "  FAILED: $(cat "$OUT/ours.$t.n$n.err" 2>/dev/null | head -3) (logs in $logs)" >&2
        rm -f "$OUT/ours.$t.n$n.json"
    fi
    stop_all
}

# ---- the anchors: checked and copied once, run once per round ----
shared="$root/../shared/anchors/collectives"
why_no_anchors=""
if [ "$ANCHORS" = none ]; then
    why_no_anchors="ANCHORS=none"
elif [ ! -d "$shared" ]; then
    why_no_anchors="../shared/anchors/collectives is absent"
elif ! command -v mpirun >/dev/null || [ ! -e /usr/include/gloo/config.h ] || ! command -v jq >/dev/null; then
    why_no_anchors="OpenMPI, Gloo or jq is not installed (apt-get install -y openmpi-bin libopenmpi-dev libgloo-dev iperf3 jq)"
fi
if [ -z "$why_no_anchors" ]; then
    anchors_dir=$(mktemp -d /tmp/tpuemu-anchors.XXXXXX)
    cp -r "$shared/." "$anchors_dir/"
    rm -rf "$anchors_dir/results"
fi

# Each round: ours for every n and transport, then the anchors right after, so
# that both see the same spell of this machine; ROUNDS > 1 takes the medians.
whole_out=$OUT
for ((round = 1; round <= ROUNDS; round++)); do
    OUT=$whole_out
    [ "$ROUNDS" -gt 1 ] && OUT=$whole_out/r$round && mkdir -p "$OUT" && echo "round $round of $ROUNDS" >&2
    for n in $NS; do
        for t in $TRANSPORTS; do
            ours "$t" "$n"
        done
    done
    if [ -n "$anchors_dir" ] && [ -z "$why_no_anchors" ]; then
        echo "anchors: $ANCHOR_CONFIGS for n = $NS (in $anchors_dir)" >&2
        if ! (cd "$anchors_dir" && ONLY="$ANCHOR_CONFIGS" NS="$NS" RUNS=1 DO_LIMITS=0 QUIET_MAX_WAIT=5 \
                OUT=results/r$round ./run.sh >"$OUT/anchors.log" 2>&1); then
            why_no_anchors="the anchors' run.sh failed (see $OUT/anchors.log)"
        fi
        mkdir -p "$OUT/anchors"
        cp "$anchors_dir"/results/r$round/run1/*.csv "$OUT/anchors/" 2>/dev/null || true
    fi
done
OUT=$whole_out
[ -n "$anchors_dir" ] && rm -rf "$anchors_dir" && anchors_dir=""
[ -n "$why_no_anchors" ] && echo "anchors not run: $why_no_anchors; showing ours alone" >&2

python3 "$root/bench/allreduce_report.py" "$OUT" "$NS" "$why_no_anchors"
echo "raw results: $OUT"
