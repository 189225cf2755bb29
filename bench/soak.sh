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
#      and never authenticate; every EVENT_EVERY_S seconds on average (drawn
#      from SEED) one of: a worker killed (SIGKILL), paused 3 s, preempted (3 s
#      notice) or down for maintenance 4 s (1 s notice), a link between two
#      cores delayed (50 ms a chunk), lossy (5 %) or cut (partition) for a few
#      seconds, or the resolver killed (at most every RESOLVER_EVERY_S); a
#      supervisor starts again every daemon that exits, on its ports, as
#      systemd or compose would (host0/0, whose /metrics count the steps, and
#      host1/0 are never killed, preempted or taken down for maintenance, so
#      that one worker of each host lives the whole soak); fashion_mnist runs round after round (each from
#      scratch, --recover 100, a checkpoint every 20 steps, started once the
#      cluster is whole, and again when preempted (exit 42, with its
#      checkpoint) or failed UNAVAILABLE before training began, as a
#      deployment restarts a job: counted as recoveries) until the time is up.
# Every SAMPLE_S seconds it samples each daemon's RSS, open fds, threads and
# shared-memory mappings (from /proc). It prints the faults injected, the
# daemons lost (an exit no fault caused, or a daemon not running at the end;
# goal 0), each round's recoveries, steps lost (steps run beyond the clean
# round's), time and test accuracy next to the clean one, and for each daemon's
# longest life, minute by minute after its warm-up (the clean round and
# WARMUP_S seconds of chaos, or WARMUP_S after a restart), its highest RSS and
# its commonest fd, thread and mapping counts: first and last minute and the
# least-squares slope per hour. Exit 0 when no daemon was lost, every round
# finished and no slope less twice its standard error is beyond its bound
# (RSS: RSS_LIMIT_MIB_H MiB an hour; the counts: a fitted rise of more than
# COUNT_SLACK from the first minute to the last); 1 otherwise. Everything it starts is stopped on exit; every wait
# is bounded.
#
# Environment: EPOCHS (default 2), FAULT_EVERY_MS (default 1000), MAX_STALL_MS
# (default 2000), HOLD (default 64), EVENT_EVERY_S (default 20; 0: none),
# RESOLVER_EVERY_S (default 600), SAMPLE_S (default 5), WARMUP_S (default 120),
# RSS_LIMIT_MIB_H (default 1), COUNT_SLACK (default 2), ROUND_TIMEOUT_S (default
# 600), KEEP=1 (keep the work directory with every log and the samples), DATA
# (default /usr/share/datasets/fashion-mnist, Debian package
# dataset-fashion-mnist).
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
event_every=${EVENT_EVERY_S:-20}
resolver_every=${RESOLVER_EVERY_S:-600}
sample_s=${SAMPLE_S:-5}
warmup_s=${WARMUP_S:-120}
rss_limit=${RSS_LIMIT_MIB_H:-1}
count_slack=${COUNT_SLACK:-2}
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
sampler_pid=
driver_pid=
unset TPUEMU_METRICS_PORT TPUEMU_DATA_PORT TPUEMU_ADVERTISE_DATA
. tests/support/local_cluster.sh
cleanup() {
    local daemons=()
    [ -f "$work/pids" ] && daemons=($(awk '{ print $2 }' "$work/pids"))
    for p in $driver_pid $trainer $chaos $sampler_pid "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in $driver_pid $trainer $chaos $sampler_pid; do wait "$p" 2>/dev/null; done
    for p in "${daemons[@]}"; do # not this shell's jobs: waited for by polling
        for ((k = 0; k < 50; k++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    lc_cleanup
    if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 500
resolver_pid=${_lc_pids[-1]}
disown "$resolver_pid" # as start_daemon's
rport=${tpu#*:}
lc_claim_port proxy_rport
forwards=("--forward" "$proxy_rport=127.0.0.1:$rport")
dports=() mports=()
declare -A wd=() wp=() wm=() # a worker's data, advertised and metrics ports, by name
start_daemon() { # name: the resolver or hostH/C, started (again) on its ports
    local n=$1
    if [ "$n" = resolver ]; then
        "$bin/tpu-resolver" --listen "$tpu" --heartbeat-ms 500 2>>"$work/resolver.log" &
    else
        "$bin/tpu-worker" --resolver "127.0.0.1:$proxy_rport" --host-id "${n%/*}" --core "${n#*/}" \
            --data-port "${wd[$n]}" --advertise-data "127.0.0.1:${wp[$n]}" --metrics-port "${wm[$n]}" \
            2>>"$work/worker-${n//\//-}.log" &
    fi
    daemon_pid=$!
    disown "$daemon_pid" # its death by a fault is the supervisor's to see, not a job to report
}
for h in 0 1; do
    for c in 0 1 2 3; do
        lc_claim_port d
        lc_claim_port p
        lc_claim_port m
        forwards+=("--forward" "$p=127.0.0.1:$d")
        wd[host$h/$c]=$d wp[host$h/$c]=$p wm[host$h/$c]=$m
        start_daemon "host$h/$c"
        workers+=($daemon_pid)
        names+=("host$h/$c")
        dports+=("$d")
        mports+=("$m")
    done
done

# every daemon's process, fds, threads and shared-memory mappings, sampled
# every SAMPLE_S seconds into $work/samples (t name pid fds threads shm rss_kib
# anon_kib file_kib);
# $work/pids lists "name pid" lines, the newest of a name its current process
: >"$work/pids"
: >"$work/samples"
note_pid() { echo "$1 $2" >>"$work/pids"; }
note_pid resolver "$resolver_pid"
for i in "${!workers[@]}"; do note_pid "${names[$i]}" "${workers[$i]}"; done
sampler() {
    local t n p r f th s
    while :; do
        t=$(date +%s)
        while read -r n p; do
            [ -r "/proc/$p/status" ] || continue
            r=$(awk '/^(VmRSS|RssAnon|RssFile):/ { printf "%s ", $2 }' "/proc/$p/status" 2>/dev/null)
            f=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
            th=$(ls "/proc/$p/task" 2>/dev/null | wc -l)
            s=$(awk '/memfd:tpuemu/ { print $5 }' "/proc/$p/maps" 2>/dev/null | sort -u | wc -l)
            [ -n "$r" ] && echo "$t $n $p $f $th $s $r"
        done < <(awk '{ p[$1] = $2 } END { for (n in p) print n, p[n] }' "$work/pids") >>"$work/samples"
        sleep "$sample_s"
    done
}
sampler &
sampler_pid=$!

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

steps() { # training steps host0/0 ran to the end (from its /metrics)
    exec 3<>"/dev/tcp/127.0.0.1/${mports[0]}" || { echo 0; return; }
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    timeout 10 cat <&3 | awk '/^tpuemu_worker_train_steps_total[{ ]/ { n = $NF } END { print n + 0 }'
    exec 3>&-
}
whole() { # waits (at most 90 s) for the resolver and 8 live cores, as a deployment
    # starts a job once its cluster is up; the supervisor brings back what a fault took
    local k
    for ((k = 0; k < 90; k++)); do
        "$bin/tpuctl" --tpu "$tpu" --timeout-ms 2000 init --expect 8 --timeout-ms 1000 >/dev/null 2>&1 && return 0
        sleep 1
    done
    return 1
}
round() { # name, checkpoint file: runs fashion_mnist, sets r_rc r_acc r_recov r_steps r_secs
    local out="$work/$1.out" s0 t0 leg
    : >"$out"
    whole
    s0=$(steps)
    t0=$(date +%s)
    r_restarts=0
    for ((leg = 0; leg < 20; leg++)); do
        (cd "$work" && exec timeout "$round_timeout" "$bin/fashion_mnist" --tpu "$tpu" --epochs "$epochs" \
            --checkpoint "$2" --checkpoint-every 20 --recover 100 --recover-wait 60 --logdir "$work/logs") \
            >"$out.leg" 2>&1 &
        trainer=$!
        wait "$trainer"
        r_rc=$?
        trainer=
        cat "$out.leg" >>"$out"
        # started again, as a deployment restarts a job (docs/operations/deploy.md): preempted
        # (exit 42, its checkpoint saved), or a fault before training began, up to loading the
        # checkpoint it resumes from (--recover covers training)
        [ "$r_rc" = 42 ] || { [ "$r_rc" = 1 ] &&
            grep -q '^fashion_mnist: \(resolving the TPU\|connecting to the cluster\|initializing the TPU system\|compiling the model\|loading the checkpoint to resume from\): UNAVAILABLE' "$out.leg"; } ||
            break
        r_restarts=$((r_restarts + 1))
        whole
    done
    r_secs=$(($(date +%s) - t0))
    r_acc=$(sed -n 's/^test accuracy: //p' "$out")
    r_recov=$(($(grep -c '^recovering (' "$out") + r_restarts))
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
t_chaos=$(date +%s)
t_end=$((t_chaos + chaos_s))

# the supervisor and the daemon faults: a subshell; $work/events gets a line
# per fault ("fault KIND TARGET ok|refused") and per exit ("restart NAME" when
# a fault caused it, "lost NAME" otherwise)
alive() { # pid: running (not a zombie)
    local st
    st=$(cut -d ' ' -f 3 "/proc/$1/stat" 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ]
}
driver() {
    local now next kind a b t args n p last_resolver=0
    local -A expect=() # name -> until when an exit of it is a fault's
    local kinds=(kill pause preempt maintenance link-delay link-loss partition resolver)
    RANDOM=$seed
    next=$(($(date +%s) + 1 + RANDOM % (2 * event_every + 1)))
    while :; do
        now=$(date +%s)
        while read -r n p; do
            alive "$p" && continue
            if [ "${expect[$n]:-0}" -ge "$now" ]; then echo "restart $n"; else echo "lost $n"; fi >>"$work/events"
            expect[$n]=$((now + 30)) # a start that fails is tried again
            start_daemon "$n"
            note_pid "$n" "$daemon_pid"
        done < <(awk '{ p[$1] = $2 } END { for (n in p) print n, p[n] }' "$work/pids")
        if [ "$event_every" -gt 0 ] && [ "$now" -ge "$next" ] && [ ! -e "$work/calm" ]; then
            kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
            # the resolver at most every RESOLVER_EVERY_S: it lives long enough for its slope
            if [ "$kind" = resolver ]; then
                [ "$now" -ge $((last_resolver + resolver_every)) ] && last_resolver=$now || kind=kill
            fi
            a=${names[$((1 + RANDOM % 7))]}                                 # never host0/0
            # nor host1/0 (one worker a host lives the whole soak: its slope is of an hour)
            case $kind in kill | preempt | maintenance) [ "$a" = host1/0 ] && a=${names[$((5 + RANDOM % 3))]} ;; esac
            b=${names[$((RANDOM % 8))]}
            [ "$b" = "$a" ] && b=${names[0]}
            t=$a
            case $kind in
            kill) args=(kill "$a") ;;
            pause) args=(pause "$a" 3000) ;;
            preempt) args=(--notice-ms 3000 preempt "$a") ;;
            maintenance) args=(--notice-ms 1000 maintenance "$a" 4000) ;;
            link-delay) args=(link-delay "$a" "$b" 50 5000) t="$a-$b" ;;
            link-loss) args=(link-loss "$a" "$b" 5 5000) t="$a-$b" ;;
            partition) args=(partition "$a" "$b" 2000) t="$a-$b" ;;
            resolver) args=(kill resolver) t=resolver ;;
            esac
            case $kind in kill | preempt | resolver) expect[$t]=$((now + 60)) ;; esac
            if "$bin/tpuctl" --tpu "$tpu" --timeout-ms 5000 chaos "${args[@]}" >>"$work/driver.log" 2>&1; then
                echo "fault $kind $t ok"
            else
                echo "fault $kind $t refused" # a core down or a notice pending: not there to hit
            fi >>"$work/events"
            next=$((now + 1 + RANDOM % (2 * event_every + 1)))
        fi
        sleep 1
    done
}
: >"$work/events"
driver &
driver_pid=$!
rows=() failed=0 n=0
while :; do
    n=$((n + 1))
    round "chaos$n" "$work/chaos$n.ckpt"
    [ "$r_rc" -eq 0 ] && [ -n "$r_acc" ] || failed=$((failed + 1))
    rows+=("| $n | $r_rc | $r_recov | $r_steps | $((r_steps - clean_steps)) | $r_secs | ${r_acc:--} |")
    # the time is the bound; the count only bounds a loop whose rounds fail at once
    [ "$(date +%s)" -lt "$t_end" ] && [ "$n" -lt "$chaos_s" ] || break
done
# no more faults; the supervisor brings back what the last ones took (bounded)
t_stop=$(date +%s) # the slopes are of the soak, not of the quiet after it
touch "$work/calm"
whole
kill -TERM "$driver_pid" 2>/dev/null
wait "$driver_pid" 2>/dev/null
driver_pid=
kill -TERM "$sampler_pid" 2>/dev/null
wait "$sampler_pid" 2>/dev/null
sampler_pid=
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
ev() { grep -c "^$1" "$work/events"; }
echo "daemon faults: $(ev 'fault kill .* ok') kills, $(ev 'fault pause .* ok') pauses, $(ev 'fault preempt .* ok')" \
    "preemptions, $(ev 'fault maintenance .* ok') maintenance events, $(ev 'fault link-delay .* ok') link delays," \
    "$(ev 'fault link-loss .* ok') lossy links, $(ev 'fault partition .* ok') partitions, $(ev 'fault resolver .* ok')" \
    "resolver kills ($(ev 'fault .* refused') refused: the target down or busy); daemons started again: $(ev restart)"
lost=$(ev lost)
[ "$lost" -gt 0 ] && echo "exits no fault caused: $(grep '^lost' "$work/events" | cut -d ' ' -f 2 | tr '\n' ' ')"
while read -r dn dp; do
    alive "$dp" || { echo "not running at the end: $dn"; lost=$((lost + 1)); }
done < <(awk '{ p[$1] = $2 } END { for (n in p) print n, p[n] }' "$work/pids")
echo
echo "after warm-up (the clean round and ${warmup_s} s of chaos, or ${warmup_s} s after a restart), per daemon's"
echo "longest life, minute by minute of the soak (its highest RSS, anonymous and file-backed, its commonest"
echo "fd, thread and shared-memory mapping counts): first -> last minute and the least-squares slope per hour (RSS: ± twice its standard"
echo "error). A daemon grows when the slope less twice its error is beyond the bound: RSS ${rss_limit} MiB/h,"
echo "the counts a rise of ${count_slack} from the first minute to the last; a life of under 5 minutes after its"
echo "warm-up is too short to judge"
echo
echo "| daemon | lives | minutes | RSS (MiB) | anon + file (MiB) | RSS slope (MiB/h) | fds | fds/h | threads | threads/h | shm maps | maps/h | |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
slopes=$(awk -v t0="$t_chaos" -v t1="$t_stop" -v warm="$warmup_s" -v lim="$rss_limit" -v slack="$count_slack" '
    # per life (name pid) and whole minute after its warm-up: the highest RSS
    # (what the daemon held at its busiest; its heap is trimmed every 30 s),
    # with its anonymous and file-backed parts, and the commonest count of each kind
    { k = $2 " " $3; t = $1 - t0
      if (!(k in first)) { first[k] = t; lives[$2]++ }
      w = (first[k] > 0 ? first[k] : 0) + warm
      if (t < w || $1 >= t1 - (t1 - t0 - w) % 60) next # whole minutes only
      m = int((t - w) / 60)
      if (!((k, m) in hi) || $7 > hi[k, m]) { hi[k, m] = $7; an[k, m] = $8; fi[k, m] = $9 }
      for (i = 4; i <= 6; i++) if (++seen[k, m, i, $i] > top[k, m, i]) { top[k, m, i] = seen[k, m, i, $i]; mode[k, m, i] = $i }
      if (!(k in nm) || m + 1 > nm[k]) nm[k] = m + 1 }
    END {
      for (k in nm) { split(k, a, " "); d = a[1]
        if (nm[k] >= 5 && (!(d in best) || nm[k] > nm[best[d]])) best[d] = k }
      for (d in lives) {
        k = best[d]; bad = ""
        if (k == "") { printf "| %s | %d | - | - | - | - | - | - | - | - | - | - | too short |\n", d, lives[d]; continue }
        n = nm[k]; st = stt = 0
        for (m = 0; m < n; m++) { st += m; stt += m * m }
        sxx = stt - st * st / n
        for (i = 4; i <= 7; i++) { sy = sty = 0
          for (m = 0; m < n; m++) { y[m] = i == 7 ? hi[k, m] / 1024 : mode[k, m, i]; sy += y[m]; sty += m * y[m] }
          b = (sty - st * sy / n) / sxx; ssr = 0
          for (m = 0; m < n; m++) { r = y[m] - (sy / n + b * (m - st / n)); ssr += r * r }
          sl[i] = b * 60; se[i] = (n > 2 ? sqrt(ssr / (n - 2) / sxx) : 0) * 60 } # per minute -> per hour
        span = (n - 1) / 60                               # hours from the first minute to the last
        # beyond the bound beyond doubt: the slope less twice its standard error
        if (sl[7] - 2 * se[7] > lim) bad = bad " RSS"
        if ((sl[4] - 2 * se[4]) * span > slack) bad = bad " fds"
        if ((sl[5] - 2 * se[5]) * span > slack) bad = bad " threads"
        if ((sl[6] - 2 * se[6]) * span > slack) bad = bad " shm"
        printf "| %s | %d | %d | %.1f -> %.1f | %.1f + %.1f -> %.1f + %.1f | %+.2f ± %.2f | %d -> %d | %+.1f | %d -> %d | %+.1f | %d -> %d | %+.1f | %s |\n",
            d, lives[d], n, hi[k, 0] / 1024, hi[k, n - 1] / 1024, an[k, 0] / 1024, fi[k, 0] / 1024,
            an[k, n - 1] / 1024, fi[k, n - 1] / 1024, sl[7], 2 * se[7], mode[k, 0, 4], mode[k, n - 1, 4],
            sl[4], mode[k, 0, 5], mode[k, n - 1, 5], sl[5], mode[k, 0, 6], mode[k, n - 1, 6], sl[6],
            bad == "" ? "flat" : "GROWS:" bad }
    }' "$work/samples" | sort)
echo "$slopes"
growing=$(grep -c GROWS <<<"$slopes")
echo
echo "| round | exit | recoveries | steps run | steps lost | seconds | test accuracy |"
echo "|--:|--:|--:|--:|--:|--:|--:|"
echo "| clean | 0 | 0 | $clean_steps | 0 | $clean_secs | $clean_acc |"
printf '%s\n' "${rows[@]}"
echo
echo "daemons lost: $lost (goal 0); rounds failed: $failed of $n; daemons growing: $growing (goal 0)"
if [ "$failed" -gt 0 ]; then
    for ((k = 1; k <= n; k++)); do
        grep -q '^test accuracy' "$work/chaos$k.out" || { echo "round $k ended with:"; tail -n 3 "$work/chaos$k.out"; }
    done
fi
[ "$lost" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$growing" -eq 0 ]
