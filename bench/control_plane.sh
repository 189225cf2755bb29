#!/usr/bin/env bash
# Control-plane benchmark: a resolver and N workers (default 64) on this machine.
# Prints a table with the time of `tpuctl cluster` and `tpuctl init`, each next to
# an anchor measured in the same run (`tpuctl version`: the same process start and
# library loading with no network call), and the resolver's CPU use while the
# workers heartbeat.
#
#   bench/control_plane.sh [BUILD_DIR] [WORKERS] [RUNS] [CPU_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-64}
runs=${3:-20}
cpu_s=${4:-30}
bin=$build/bin
[ -x "$bin/tpuctl" ] || { echo "no $bin/tpuctl: build first (scripts/demo.sh or scripts/test.sh)" >&2; exit 2; }

port=8470
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
tpu=127.0.0.1:$port
logdir=$(mktemp -d /tmp/tpuemu-bench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$logdir"
}
trap cleanup EXIT

"$bin/tpu-resolver" --listen "$tpu" 2>"$logdir/resolver.log" &
rpid=$!
pids+=($rpid)
hosts=$(( (n + 7) / 8 ))
for ((i = 0; i < n; i++)); do
    "$bin/tpu-worker" --resolver "$tpu" --host-id "host$((i / 8))" --core "$((i % 8))" \
        2>"$logdir/worker-$i.log" &
    pids+=($!)
done
export TPU_NAME=$tpu
# wait (bounded) until every worker is registered
for ((t = 0; t < 300; t++)); do
    alive=$("$bin/tpuctl" --json cluster 2>/dev/null | grep -o '"state": *"\(IDLE\|READY\)"' | wc -l || true)
    [ "$alive" -ge "$n" ] && break
    sleep 0.1
done
[ "$alive" -ge "$n" ] || { echo "only $alive of $n workers registered" >&2; exit 1; }

# median wall time in ms of a command over $runs runs
median_ms() {
    local ts=()
    for ((r = 0; r < runs; r++)); do
        local a b
        a=$(date +%s%N)
        "$@" >/dev/null
        b=$(date +%s%N)
        ts+=($(( (b - a) / 1000 )))
    done
    printf '%s\n' "${ts[@]}" | sort -n | awk '{v[NR]=$1} END {printf "%.1f", v[int((NR+1)/2)]/1000}'
}

anchor=$(median_ms "$bin/tpuctl" version)
cluster=$(median_ms "$bin/tpuctl" cluster)
init=$(median_ms "$bin/tpuctl" init --expect "$n")

ticks() { awk '{print $14 + $15}' "/proc/$rpid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks)
sleep "$cpu_s"
t1=$(ticks)
cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$cpu_s" 'BEGIN {printf "%.2f", 100 * d / hz / s}')

printf '\ncontrol plane, %d workers on %d hosts, %d runs each (median), this machine: %s cores\n\n' \
    "$n" "$hosts" "$runs" "$(nproc)"
printf '| %-34s | %10s | %16s | %8s |\n' "what" "value" "anchor" "ratio"
printf '|%s|%s|%s|%s|\n' "------------------------------------" "------------" "------------------" "----------"
printf '| %-34s | %7s ms | %13s ms | %7.2fx |\n' "tpuctl cluster" "$cluster" "$anchor" "$(awk -v a="$cluster" -v b="$anchor" 'BEGIN{print a/b}')"
printf '| %-34s | %7s ms | %13s ms | %7.2fx |\n' "tpuctl init --expect $n" "$init" "$anchor" "$(awk -v a="$init" -v b="$anchor" 'BEGIN{print a/b}')"
printf '| %-34s | %8s %% | %16s | %8s |\n' "resolver CPU, ${cpu_s} s of heartbeats" "$cpu" "(% of one core)" "-"
printf '\nanchor: `tpuctl version` (process start and library loading, no network call)\n'
printf 'goals: cluster and init < 250 ms each; resolver CPU < 2 %% of one core\n'
