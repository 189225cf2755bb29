#!/usr/bin/env bash
# Random fault scenarios against a training job, for MINUTES, and what they cost.
#
#   bench/faults.sh BUILD_DIR [MINUTES] [SEED]        # defaults: 3 minutes, seed 1
#
# Starts a resolver and 4 workers (host0, host1 x cores 0, 1) on loopback, with
# a supervisor that starts again any worker that exits (as systemd or compose
# would: after a kill, a preemption, a crash). Then:
#   1. a clean round: examples/fashion_mnist, EPOCHS epochs, --checkpoint: its
#      time and test accuracy are the reference;
#   2. faults for MINUTES: every FAULT_EVERY_S seconds on average (drawn from
#      SEED), tpuctl chaos injects one of kill, pause 3000, slow 25 15000,
#      preempt (notice 3000), maintenance 4000 (notice 1000) into a random core,
#      while fashion_mnist runs round after round with --checkpoint and
#      --recover 20: a round that exits 42 (preempted: its checkpoint saved) is
#      started again with the same flags, as docs/operations/deploy.md says, and goes on.
# It prints the faults by kind, the rounds finished, the recoveries and
# preemption restarts, the time lost per round against the clean one, the
# hangs (a round that did not finish within ROUND_TIMEOUT_S; goal 0), each
# round's accuracy against the clean one, and the resolver's and workers' RSS
# after the clean round and at the end. Exit 0 with no hang and every round
# finished, else 1. Everything it starts is stopped on exit; every wait is
# bounded.
#
# With ELASTIC=1 the rounds train elastically instead (--elastic 20
# --elastic-wait 15: fit goes on by itself, taking back the cores the
# supervisor starts again, or leaving them behind), and the recoveries are
# the history's RESTORED and SHRUNK events.
#
# Environment: EPOCHS (default 2), FAULT_EVERY_S (default 8), ROUND_TIMEOUT_S
# (default 300), ELASTIC=1, KEEP=1 (keep the work directory), DATA (default
# /usr/share/datasets/fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/faults.sh BUILD_DIR [MINUTES] [SEED]}
minutes=${2:-3}
seed=${3:-1}
epochs=${EPOCHS:-2}
every=${FAULT_EVERY_S:-8}
round_timeout=${ROUND_TIMEOUT_S:-300}
data=${DATA:-/usr/share/datasets/fashion-mnist}
survive=(--recover 20 --recover-wait 60)
recovered='^recovering ('
if [ "${ELASTIC:-0}" = 1 ]; then
    survive=(--elastic 20 --elastic-wait 15)
    recovered='^elastic event [0-9]*: \(RESTORED\|SHRUNK\)'
fi
bin=$(cd "$build/bin" 2>/dev/null && pwd) || { echo "no $build/bin: build first" >&2; exit 2; }
for b in fashion_mnist tpu-worker tpu-resolver tpuctl; do
    [ -x "$bin/$b" ] || { echo "no $bin/$b: build first (cmake --build $build)" >&2; exit 2; }
done
[ -f "$data/train-images-idx3-ubyte.gz" ] ||
    { echo "$data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
case $minutes in '' | *[!0-9]*) echo "MINUTES must be a whole number" >&2; exit 2 ;; esac
[ "$minutes" -ge 1 ] && [ "$minutes" -le 1440 ] || { echo "MINUTES must be 1..1440" >&2; exit 2; }

work=$(mktemp -d /tmp/tpuemu-faults.XXXXXX)
declare -A wpid=()
trainer=
unset TPUEMU_METRICS_PORT TPUEMU_DATA_PORT TPUEMU_ADVERTISE_DATA
. tests/support/local_cluster.sh
cleanup() {
    for p in $trainer "${wpid[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in $trainer "${wpid[@]}"; do wait "$p" 2>/dev/null; done
    lc_cleanup
    if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
RANDOM=$seed

lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 200
resolver_pid=${_lc_pids[-1]}
start_worker() { # host core
    "$bin/tpu-worker" --resolver "$tpu" --host-id "host$1" --core "$2" --tpu-type v3 \
        2>>"$work/worker-$1-$2.log" &
    wpid[$1/$2]=$!
}
restarts=0
supervise() { # starts again every worker that has exited
    local k
    for k in "${!wpid[@]}"; do
        if ! kill -0 "${wpid[$k]}" 2>/dev/null; then
            wait "${wpid[$k]}" 2>/dev/null
            start_worker "${k%/*}" "${k#*/}"
            restarts=$((restarts + 1))
        fi
    done
}
for h in 0 1; do for c in 0 1; do start_worker $h $c; done; done
"$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || { echo "the cluster did not come up"; exit 1; }
rss() { # pid: resident KiB
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0
}
rss_all() {
    local s="resolver $(rss "$resolver_pid") KiB, workers"
    for k in $(printf '%s\n' "${!wpid[@]}" | sort); do s+=" $k $(rss "${wpid[$k]}")"; done
    echo "$s KiB"
}

# ---- 1. clean round
cd "$work"
t0=$(date +%s.%N)
timeout "$round_timeout" "$bin/fashion_mnist" --tpu "$tpu" --epochs "$epochs" --checkpoint "$work/clean.ckpt" \
    >clean.txt 2>&1 || { echo "the clean round failed:"; tail -5 clean.txt; exit 1; }
clean_s=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
clean_acc=$(sed -n 's/^test accuracy: //p' clean.txt)
rss_clean=$(rss_all)

# ---- 2. faults
declare -A injected=()
kinds=(kill pause slow preempt maintenance)
end=$(($(date +%s) + minutes * 60))
rounds=0 hangs=0 recoveries=0 preempted=0 lost_s=0 failed=0
accs=()
next_fault=$(($(date +%s) + 1 + RANDOM % (2 * every)))
fault() {
    local kind=${kinds[$((RANDOM % ${#kinds[@]}))]} h=$((RANDOM % 2)) c=$((RANDOM % 2)) args=()
    case $kind in
    kill) args=(kill "host$h/$c") ;;
    pause) args=(pause "host$h/$c" 3000) ;;
    slow) args=(slow "host$h/$c" 25 15000) ;;
    preempt) args=(--notice-ms 3000 preempt "host$h/$c") ;;
    maintenance) args=(--notice-ms 1000 maintenance "host$h/$c" 4000) ;;
    esac
    if "$bin/tpuctl" --tpu "$tpu" --timeout-ms 5000 chaos "${args[@]}" >>chaos.txt 2>&1; then
        injected[$kind]=$((${injected[$kind]:-0} + 1))
    else
        injected[refused]=$((${injected[refused]:-0} + 1)) # a core down or a notice pending: not there to hit
    fi
}
while [ "$(date +%s)" -lt "$end" ]; do
    rounds=$((rounds + 1))
    rm -f "$work/round.ckpt"
    r0=$(date +%s.%N)
    out="round-$rounds.txt"
    : >"$out"
    deadline=$(($(date +%s) + round_timeout))
    status=
    for ((leg = 0; leg < 20; leg++)); do # a preempted round is started again, at most 20 times
        "$bin/fashion_mnist" --tpu "$tpu" --epochs "$epochs" --checkpoint "$work/round.ckpt" "${survive[@]}" \
            >>"$out" 2>&1 &
        trainer=$!
        while kill -0 "$trainer" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
            supervise
            [ "$(date +%s)" -ge "$next_fault" ] && { fault; next_fault=$(($(date +%s) + 1 + RANDOM % (2 * every))); }
            sleep 0.2
        done
        if kill -0 "$trainer" 2>/dev/null; then
            kill -TERM "$trainer"
            wait "$trainer" 2>/dev/null
            trainer=
            status=hang
            break
        fi
        wait "$trainer"
        status=$?
        trainer=
        [ "$status" = 42 ] || break
        preempted=$((preempted + 1))
        # a preempted core comes back through the supervisor; wait for it
        for _ in $(seq 300); do
            supervise
            "$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 1000 >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    r_s=$(awk -v a="$(date +%s.%N)" -v b="$r0" 'BEGIN { print a - b }')
    recoveries=$((recoveries + $(grep -c "$recovered" "$out")))
    if [ "$status" = hang ]; then
        hangs=$((hangs + 1))
        echo "round $rounds: HANG (no end within ${round_timeout} s); see $out"
    elif [ "$status" != 0 ]; then
        failed=$((failed + 1))
        echo "round $rounds: exit $status: $(grep -m1 '^fashion_mnist:' "$out" | tail -1)"
    else
        acc=$(sed -n 's/^test accuracy: //p' "$out")
        accs+=("$acc")
        lost_s=$(awk -v l="$lost_s" -v r="$r_s" -v c="$clean_s" 'BEGIN { print l + r - c }')
        printf 'round %d: %.1f s (clean %.1f s), accuracy %s (clean %s), %d recoveries, %d preemption restarts so far\n' \
            "$rounds" "$r_s" "$clean_s" "$acc" "$clean_acc" "$(grep -c "$recovered" "$out")" "$preempted"
    fi
    supervise
    "$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null 2>&1
done

finished=${#accs[@]}
echo
echo "faults for $minutes min, seed $seed, one every ~$every s, $epochs epochs a round:"
for k in "${kinds[@]}" refused; do printf '  %-12s %d\n' "$k" "${injected[$k]:-0}"; done
echo "rounds: $rounds, finished $finished, failed $failed, hangs $hangs (goal 0)"
echo "recoveries (${survive[0]}): $recoveries; preemption restarts (exit 42): $preempted; workers started again: $restarts"
[ "$finished" -gt 0 ] && printf 'time lost per finished round: %.1f s (clean round %.1f s)\n' \
    "$(awk -v l="$lost_s" -v n="$finished" 'BEGIN { print l / n }')" "$clean_s"
echo "accuracy: clean $clean_acc; rounds ${accs[*]:-none}"
echo "RSS after the clean round: $rss_clean"
echo "RSS at the end:            $(rss_all)"
[ "$hangs" = 0 ] && [ "$failed" = 0 ] && [ "$finished" = "$rounds" ]
