#!/usr/bin/env bash
# Soak: training on 8 cores for MINUTES while the network misbehaves and
# strangers hold connections on every port, and what it cost.
#
#   bench/soak.sh BUILD_DIR [MINUTES] [SEED]         # defaults: 3 minutes, seed 1
#
# Starts a resolver and 8 workers (host0 and host1, 4 cores each: shared memory
# inside a host, TCP between them) on loopback and bench_chaos between them:
# every worker's heartbeats reach the resolver through it, and every data-plane
# connection to a worker (the client's and the other host's cores') goes
# through it (each worker listens on --data-port and advertises the proxy's
# port with --advertise-data). Then:
#   1. a clean round: examples/fashion_mnist, EPOCHS epochs, through the proxy
#      with no faults: its test accuracy and the steps it ran are the reference;
#   2. chaos for MINUTES: the proxy resets (RST), closes (FIN) or stalls (up to
#      MAX_STALL_MS) a random connection every FAULT_EVERY_MS on average, drawn
#      from SEED; strangers hold HOLD idle connections on the resolver's port
#      and on every worker's data, control and metrics ports, renewed every 3 s,
#      and never authenticate; fashion_mnist runs round after round (each from
#      scratch, --recover 100, a checkpoint every 20 steps) until the time is up.
# It prints the faults injected, the daemons lost (goal 0), each round's
# recoveries, steps lost (steps run beyond the clean round's), time and test
# accuracy next to the clean one, and every daemon's RSS after the clean round
# and at the end. Exit 0 when no daemon was lost and every round finished;
# 1 otherwise. Everything it starts is stopped on exit; every wait is bounded.
#
# Environment: EPOCHS (default 2), FAULT_EVERY_MS (default 1000), MAX_STALL_MS
# (default 2000), HOLD (default 64), ROUND_TIMEOUT_S (default 600), KEEP=1 (keep
# the work directory with every log), DATA (default
# /usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/soak.sh BUILD_DIR [MINUTES] [SEED]}
minutes=${2:-3}
seed=${3:-1}
epochs=${EPOCHS:-2}
fault_every=${FAULT_EVERY_MS:-1000}
max_stall=${MAX_STALL_MS:-2000}
hold=${HOLD:-64}
round_timeout=${ROUND_TIMEOUT_S:-600}
data=${DATA:-/usr/share/datasets/fashion-mnist}
bin=$(cd "$build/bin" 2>/dev/null && pwd) || { echo "no $build/bin: build first" >&2; exit 2; }
for b in bench_chaos fashion_mnist tpu-worker tpu-resolver tpuctl; do
    [ -x "$bin/$b" ] || { echo "no $bin/$b: build first (cmake --build $build)" >&2; exit 2; }
done
[ -f "$data/train-images-idx3-ubyte.gz" ] ||
    { echo "$data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
case $minutes in '' | *[!0-9]*) echo "MINUTES must be a whole number" >&2; exit 2 ;; esac
[ "$minutes" -ge 1 ] && [ "$minutes" -le 1440 ] || { echo "MINUTES must be 1..1440" >&2; exit 2; }

work=$(mktemp -d /tmp/tpuemu-soak.XXXXXX)
workers=() # pids, in the order of names[]
names=()
chaos=
trainer=
unset TPUEMU_METRICS_PORT TPUEMU_DATA_PORT TPUEMU_ADVERTISE_DATA
. tests/support/local_cluster.sh
cleanup() {
    for p in $trainer $chaos "${workers[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in $trainer $chaos "${workers[@]}"; do wait "$p" 2>/dev/null; done
    lc_cleanup
    if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 500
resolver_pid=${_lc_pids[-1]}
rport=${tpu#*:}
lc_claim_port proxy_rport
forwards=("--forward" "$proxy_rport=127.0.0.1:$rport")
dports=() mports=()
for h in 0 1; do
    for c in 0 1 2 3; do
        lc_claim_port d
        lc_claim_port p
        lc_claim_port m
        forwards+=("--forward" "$p=127.0.0.1:$d")
        "$bin/tpu-worker" --resolver "127.0.0.1:$proxy_rport" --host-id "host$h" --core "$c" \
            --data-port "$d" --advertise-data "127.0.0.1:$p" --metrics-port "$m" \
            2>>"$work/worker-$h-$c.log" &
        workers+=($!)
        names+=("host$h/$c")
        dports+=("$d")
        mports+=("$m")
    done
done

start_chaos() { # duration_s, extra args...
    local d=$1
    shift
    "$bin/bench_chaos" --duration-s "$d" --seed "$seed" "${forwards[@]}" "$@" \
        >"$work/chaos.out" 2>>"$work/chaos.log" &
    chaos=$!
}
stop_chaos() {
    kill -TERM "$chaos" 2>/dev/null
    wait "$chaos" 2>/dev/null
    chaos=
}
start_chaos 86400
"$bin/tpuctl" --tpu "$tpu" init --expect 8 --timeout-ms 30000 >/dev/null || {
    echo "the cluster did not come up:"
    tail -n 3 "$work"/*.log
    exit 1
}

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; } # KiB
steps() { # training steps host0/0 ran to the end (from its /metrics)
    exec 3<>"/dev/tcp/127.0.0.1/${mports[0]}" || { echo 0; return; }
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    timeout 10 cat <&3 | awk '/^tpuemu_worker_train_steps_total[{ ]/ { n = $NF } END { print n + 0 }'
    exec 3>&-
}
round() { # name, checkpoint file: runs fashion_mnist, sets r_rc r_acc r_recov r_steps r_secs
    local out="$work/$1.out" s0 t0
    s0=$(steps)
    t0=$(date +%s)
    (cd "$work" && exec timeout "$round_timeout" "$bin/fashion_mnist" --tpu "$tpu" --epochs "$epochs" \
        --checkpoint "$2" --checkpoint-every 20 --recover 100 --recover-wait 60 --logdir "$work/logs") \
        >"$out" 2>&1 &
    trainer=$!
    wait "$trainer"
    r_rc=$?
    trainer=
    r_secs=$(($(date +%s) - t0))
    r_acc=$(sed -n 's/^test accuracy: //p' "$out")
    r_recov=$(grep -c '^recovering (' "$out")
    r_steps=$(($(steps) - s0))
}

echo "clean round: $epochs epochs on 8 cores through the proxy, no faults"
round clean "$work/clean.ckpt"
[ "$r_rc" -eq 0 ] && [ -n "$r_acc" ] || {
    echo "the clean round failed (exit $r_rc):"
    tail -n 5 "$work/clean.out"
    exit 1
}
clean_acc=$r_acc clean_steps=$r_steps clean_secs=$r_secs
declare -A rss0
for i in "${!workers[@]}"; do rss0[$i]=$(rss "${workers[$i]}"); done
rss0_resolver=$(rss "$resolver_pid")

stop_chaos
holds=("--hold" "127.0.0.1:$rport=$hold")
for i in "${!workers[@]}"; do
    ctl=$("$bin/tpuctl" --tpu "$tpu" --json cluster 2>/dev/null |
        tr '{' '\n' | grep "\"host\":\"${names[$i]%/*}\"" | grep "\"core\":${names[$i]#*/}[,}]" |
        sed -n 's/.*"control_addr":"tcp:\/\/\([0-9.]*:[0-9]*\)".*/\1/p' | head -n 1)
    holds+=("--hold" "127.0.0.1:${dports[$i]}=$hold" "--hold" "127.0.0.1:${mports[$i]}=$hold")
    [ -n "$ctl" ] && holds+=("--hold" "$ctl=$hold")
done
chaos_s=$((minutes * 60))
echo "chaos for $minutes min (seed $seed): a fault every ${fault_every} ms on average, $hold idle strangers on each of $((${#holds[@]} / 2)) ports"
start_chaos $((chaos_s + round_timeout + 60)) --fault-every-ms "$fault_every" --max-stall-ms "$max_stall" \
    "${holds[@]}" --stats "$work/chaos.stats"
t_end=$(($(date +%s) + chaos_s))
rows=() failed=0 n=0
while :; do
    n=$((n + 1))
    round "chaos$n" "$work/chaos$n.ckpt"
    [ "$r_rc" -eq 0 ] && [ -n "$r_acc" ] || failed=$((failed + 1))
    rows+=("| $n | $r_rc | $r_recov | $r_steps | $((r_steps - clean_steps)) | $r_secs | ${r_acc:--} |")
    [ "$(date +%s)" -lt "$t_end" ] && [ "$n" -lt 1000 ] || break
done
stop_chaos
faults=$(cat "$work/chaos.out" 2>/dev/null)

lost=0
echo
kv() { sed -n "s/.*\\<$1=\\([0-9]*\\).*/\\1/p" <<<"$faults"; }
if [ -n "$faults" ]; then
    echo "faults injected: $(kv resets) resets, $(kv closes) closes, $(kv stalls) stalls, over $(kv connections)" \
        "forwarded connections ($(($(kv bytes) / 1048576)) MiB); strangers held $(kv held) connections" \
        "at the end, renewed $(kv renewals) times"
else
    echo "faults injected: bench_chaos reported nothing (see $work/chaos.log)"
fi
echo
echo "| daemon | alive | RSS after clean (MiB) | RSS at end (MiB) | growth |"
echo "|---|---|--:|--:|--:|"
line() { # name pid rss0
    local alive=yes r1
    kill -0 "$2" 2>/dev/null || { alive=NO; lost=$((lost + 1)); }
    r1=$(rss "$2")
    awk -v n="$1" -v a="$alive" -v r0="$3" -v r1="$r1" 'BEGIN {
        printf "| %s | %s | %.1f | %.1f | %+.1f MiB |\n", n, a, r0 / 1024, r1 / 1024, (r1 - r0) / 1024 }'
}
line resolver "$resolver_pid" "$rss0_resolver"
for i in "${!workers[@]}"; do line "worker ${names[$i]}" "${workers[$i]}" "${rss0[$i]}"; done
echo
echo "| round | exit | recoveries | steps run | steps lost | seconds | test accuracy |"
echo "|--:|--:|--:|--:|--:|--:|--:|"
echo "| clean | 0 | 0 | $clean_steps | 0 | $clean_secs | $clean_acc |"
printf '%s\n' "${rows[@]}"
echo
echo "daemons lost: $lost (goal 0); rounds failed: $failed of $n"
if [ "$failed" -gt 0 ]; then
    for ((k = 1; k <= n; k++)); do
        grep -q '^test accuracy' "$work/chaos$k.out" || { echo "round $k ended with:"; tail -n 3 "$work/chaos$k.out"; }
    done
fi
[ "$lost" -eq 0 ] && [ "$failed" -eq 0 ]
