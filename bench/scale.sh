#!/usr/bin/env bash
# Pod-scale benchmark: a resolver and N workers on this machine (loopback, 8
# cores per host id, --trace-events 1024), for each N in a list.
#
#   bench/scale.sh [BUILD_DIR] [N_LIST]          # default: build "64 256 1024"
#
# For each N it starts the cluster and measures, in this order:
#   registered   seconds from the last worker's start until all N are alive
#                (tpuctl --json cluster, polled every 0.2 s; at most 120 s)
#   RSS/worker   the workers' mean VmRSS once registered (MB = 10^6 bytes)
#   init         `tpuctl init --expect N`: the first after the start, and the
#                median of the INITS - 1 after it (INITS default 4)
#   cluster      `tpuctl cluster`, median of 5 runs
#   idle CPU     the resolver's CPU time, and all the workers' together, over
#                IDLE_S seconds (default 10; at least three heartbeats) of the
#                idle, initialized cluster, as % of one core (schedstat: to the
#                ns, where /proc/PID/stat's ticks miss a worker's 0.1 ms beats)
#   all-reduce   4 KiB f32 sum over all N replicas (bench_scale: median of 5,
#                every element of every replica checked)
#   train        STEPS (default 20) steps of the Fashion-MNIST model with a
#                per-core batch of 8: ms per step, and whether every replica's
#                weights are bitwise identical to replica 0's afterwards
#   stop         seconds from SIGTERM to every process gone
# and prints one markdown table. Everything started here is stopped on exit.
# Every daemon runs on its default timing: with many more workers than CPUs
# the resolver stretches the heartbeat (and with it the dead-core time, from
# which the collectives' and clients' timeouts derive) by the machine's cores
# per CPU. DEAD_AFTER=K gives the resolver --dead-after K instead of its
# default.
# Needs about 8 MB of memory per worker and an open-file hard limit of at
# least 2 x N + 512 for the resolver (it raises its soft limit itself).
#
# MACHINES=K spreads each N over K emulated machines, as tests/multihost does:
# K + 1 network namespaces on a bridge (in a switch namespace of its own),
# machine 0 (10.214.0.1) runs the resolver, tpuctl and bench_scale, machines
# 1..K (10.214.0.2, ...) run N / K workers each (`--listen 0.0.0.0`, host ids
# mK-hJ of 8 cores), so every resolver link, heartbeat, reset and data-plane
# connection between machines crosses a veth and the bridge. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
n_list=${2:-"64 256 1024"}
inits=${INITS:-4}
idle_s=${IDLE_S:-10}
steps=${STEPS:-20}
bin=$build/bin
for b in tpuctl tpu-worker tpu-resolver bench_scale; do
    [ -x "$bin/$b" ] || { echo "no $bin/$b: build first (cmake --build $build)" >&2; exit 2; }
done
bin=$(cd "$bin" && pwd)
machines=${MACHINES:-0}
[[ "$machines" =~ ^[0-9]+$ ]] && [ "$machines" -le 200 ] ||
    { echo "MACHINES=$machines: give a number of machines from 1 to 200 (0 or unset: one machine, loopback)" >&2; exit 2; }
pfx=tpuemu-scale$$
nses=()

logdir=$(mktemp -d /tmp/tpuemu-scale.XXXXXX)
pids=()
stop_all() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    local ns
    stop_all
    for ns in "${nses[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs: $logdir" >&2; else rm -rf "$logdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    local p=$((20000 + RANDOM % 12000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}
ms_now() { echo $(( $(date +%s%N) / 1000000 )); }
# prefix M: sets ON to the command prefix that runs on machine M (its
# namespace; with MACHINES unset, nothing: here). Daemons started in the
# background use it directly, so that $! is the daemon itself.
prefix() { ON=(); [ "$machines" -eq 0 ] || ON=(ip netns exec "$pfx-$1"); }
# on M cmd...: run a command on machine M
on() { prefix "$1"; shift; "${ON[@]}" "$@"; }
machine_ip() { echo "10.214.$(( ($1 + 1) / 256 )).$(( ($1 + 1) % 256 ))"; }
if [ "$machines" -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "MACHINES=$machines needs root (ip netns)" >&2; exit 2; }
    for ((m = 0; m <= machines; m++)); do
        ip netns add "$pfx-$m" || { echo "cannot create network namespace $pfx-$m" >&2; exit 1; }
        nses+=("$pfx-$m")
        ip -n "$pfx-$m" link set lo up
    done
    ip netns add "$pfx-sw" || exit 1
    nses+=("$pfx-sw")
    ip -n "$pfx-sw" link add br0 type bridge
    ip -n "$pfx-sw" link set br0 up
    for ((m = 0; m <= machines; m++)); do
        ip -n "$pfx-sw" link add "veth$m" type veth peer name eth0 netns "$pfx-$m"
        ip -n "$pfx-sw" link set "veth$m" master br0 up
        ip -n "$pfx-$m" addr add "$(machine_ip "$m")/16" dev eth0
        ip -n "$pfx-$m" link set eth0 up
    done
    # daemons listening beyond loopback need the cluster token; every process here reads it
    head -c 32 /dev/urandom | base64 >"$logdir/token"
    export TPUEMU_TOKEN_FILE=$logdir/token
    echo "scale: $machines machines and the resolver's on a bridge (10.214.0.1 ...)" >&2
fi
# median of the numbers on stdin
median() { sort -n | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}'; }
alive_count() {
    on 0 "$bin/tpuctl" --tpu "$tpu" --json --timeout-ms 5000 cluster 2>/dev/null |
        grep -o '"state": *"\(IDLE\|READY\)"' | wc -l || true
}
# CPU time of processes (every thread), in microseconds
cpu_us() { local p; for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done |
    awk '{s += $1} END {printf "%d", s / 1000}'; }

rows=()
for n in $n_list; do
    echo "scale: $n workers" >&2
    if [ "$machines" -gt 0 ]; then
        [ $((n % machines)) -eq 0 ] || { echo "N=$n is not a multiple of MACHINES=$machines" >&2; exit 2; }
        tpu=$(machine_ip 0):8470
    else
        tpu=127.0.0.1:$(free_port)
    fi
    max=$(( n > 1024 ? n : 1024 ))
    dead_args=()
    [ -z "${DEAD_AFTER:-}" ] || dead_args=(--dead-after "$DEAD_AFTER")
    prefix 0
    "${ON[@]}" "$bin/tpu-resolver" --listen "$tpu" --max-cores "$max" "${dead_args[@]}" 2>"$logdir/resolver.$n.log" &
    rpid=$!
    pids+=("$rpid")
    for ((t = 0; t < 50; t++)); do
        on 0 bash -c 'exec 3<>"/dev/tcp/${1%:*}/${1#*:}"' _ "$tpu" 2>/dev/null && break
        sleep 0.1
    done
    wpids=()
    for ((i = 0; i < n; i++)); do
        if [ "$machines" -gt 0 ]; then
            m=$(( i / (n / machines) + 1 ))
            prefix "$m"
            "${ON[@]}" "$bin/tpu-worker" --resolver "$tpu" --listen 0.0.0.0 \
                --host-id "m$m-h$(( (i % (n / machines)) / 8 ))" --core "$((i % 8))" \
                --trace-events 1024 2>"$logdir/worker.$n.$i.log" &
        else
            "$bin/tpu-worker" --resolver "$tpu" --host-id "host$((i / 8))" --core "$((i % 8))" \
                --trace-events 1024 2>"$logdir/worker.$n.$i.log" &
        fi
        pids+=($!)
        wpids+=($!)
    done
    t0=$(ms_now)
    alive=0
    for ((t = 0; t < 600; t++)); do
        alive=$(alive_count)
        [ "$alive" -ge "$n" ] && break
        sleep 0.2
    done
    t_reg=$(( $(ms_now) - t0 ))
    if [ "$alive" -lt "$n" ]; then
        echo "  only $alive of $n registered after 120 s" >&2
        rows+=("| $n | only $alive registered | | | | | | | | | | | |")
        stop_all
        continue
    fi
    rss=$(for p in "${wpids[@]}"; do awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null; done |
        awk '{s += $1; k++} END {if (k) printf "%.1f", s * 1024 / k / 1e6; else print "-"}')

    init_ok=1
    times=$(for ((k = 0; k < inits; k++)); do
        a=$(ms_now)
        if on 0 "$bin/tpuctl" --tpu "$tpu" --timeout-ms 60000 init --expect "$n" --timeout-ms 30000 \
                >"$logdir/init.$n.$k.txt" 2>&1; then
            echo $(( $(ms_now) - a ))
        else
            echo "  init failed: $(tail -1 "$logdir/init.$n.$k.txt")" >&2
        fi
    done)
    # the first initialize after the start touches memory no process has yet
    # (each worker's peer table, the resolver's links): shown on its own
    first_ms=$(echo "$times" | head -1)
    init_ms=$(echo "$times" | tail -n +2 | median)
    [ -n "$first_ms" ] || first_ms="-"
    [ "$first_ms" = "-" ] && init_ok=0
    cluster_ms=$(for ((k = 0; k < 5; k++)); do
        a=$(ms_now)
        on 0 "$bin/tpuctl" --tpu "$tpu" --timeout-ms 30000 cluster >/dev/null 2>&1 && echo $(( $(ms_now) - a ))
    done | median)

    hb_ms=$(on 0 "$bin/tpuctl" --tpu "$tpu" --timeout-ms 30000 cluster 2>/dev/null |
        sed -n 's/.*heartbeat \([0-9]*\) ms.*/\1/p' | head -1)
    win=$(( ${hb_ms:-1000} * 3 / 1000 > idle_s ? ${hb_ms:-1000} * 3 / 1000 : idle_s ))
    c0=$(cpu_us "$rpid")
    w0=$(cpu_us "${wpids[@]}")
    sleep "$win"
    c1=$(cpu_us "$rpid")
    w1=$(cpu_us "${wpids[@]}")
    cpu=$(awk -v a="$c0" -v b="$c1" -v s="$win" 'BEGIN {printf "%.1f", (b - a) / 1e6 / s * 100}')
    wcpu=$(awk -v a="$w0" -v b="$w1" -v s="$win" 'BEGIN {printf "%.1f", (b - a) / 1e6 / s * 100}')

    ar="-" ar_ok="-" step="-" same="-"
    if [ $init_ok = 1 ]; then
        if on 0 "$bin/bench_scale" --tpu "$tpu" --cores "$n" --steps "$steps" --batch 8 \
                >"$logdir/bench.$n.txt" 2>"$logdir/bench.$n.err"; then :; else
            echo "  bench_scale: $(tail -2 "$logdir/bench.$n.err")" >&2
        fi
        ar=$(awk -F= '$1 == "allreduce_ms" {print $2}' "$logdir/bench.$n.txt")
        ar_ok=$(awk -F= '$1 == "allreduce_ok" {print ($2 == 1) ? "yes" : "NO"}' "$logdir/bench.$n.txt")
        step=$(awk -F= '$1 == "step_ms" {print $2}' "$logdir/bench.$n.txt")
        same=$(awk -F= '$1 == "replicas_identical" {print ($2 == 1) ? "yes" : "NO"}' "$logdir/bench.$n.txt")
    fi
    gone=0
    for p in "${wpids[@]}" "$rpid"; do kill -0 "$p" 2>/dev/null || gone=$((gone + 1)); done
    a=$(ms_now)
    stop_all
    t_stop=$(( $(ms_now) - a ))
    grep -l "AddressSanitizer\|Segmentation\|level=error" "$logdir"/resolver.$n.log >/dev/null 2>&1 &&
        echo "  the resolver logged errors: $logdir/resolver.$n.log" >&2
    rows+=("$(printf '| %d | %.1f | %s | %s | %s | %s s | %s | %s | %s %s | %s | %s | %.1f | %d |' "$n" \
        "$(awk -v m="$t_reg" 'BEGIN {print m / 1000}')" "$rss" "$first_ms / $init_ms" "$cluster_ms" \
        "$(awk -v m="${hb_ms:-0}" 'BEGIN {print m / 1000}')" "$cpu" "$wcpu" \
        "${ar:--}" "${ar_ok:+($ar_ok)}" "${step:--}" "${same:--}" \
        "$(awk -v m="$t_stop" 'BEGIN {print m / 1000}')" "$gone")")
done

echo
echo "| N | all registered (s) | RSS per worker (MB) | tpuctl init (ms): first / median of the rest | tpuctl cluster (ms) | heartbeat | resolver CPU idle (%) | all workers' CPU idle (%) | 4 KiB all-reduce (ms, correct) | train step (ms, batch 8/core) | replicas identical | stop (s) | processes died |"
echo "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|"
printf '%s\n' "${rows[@]}"
