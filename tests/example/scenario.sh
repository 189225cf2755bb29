#!/usr/bin/env bash
# The example through a seeded mix of faults on 8 cores, with elastic
# training: a resolver and 8 workers (2 hosts x 4 cores) on loopback; first
# an undisturbed run of examples/fashion_mnist (24 epochs) for its test
# accuracy; then a scenario file (seed 18, random cores) injected with
# `tpuctl chaos --scenario`: a kill, a preemption, a maintenance event and a
# pause, each after a training step, while the example runs with
# --elastic. A watcher polls `tpuctl health` meanwhile. The checks a user
# makes, fault by fault: the example's warning names the core that failed
# (and the notices their cores); `tpuctl health` showed the core in
# maintenance UNHEALTHY_MAINTENANCE, and shows the killed core DEAD and the
# preempted one PREEMPTED (its worker exited 4); the paused worker is the
# same process, running, READY and HEALTHY; the history's events say how it went on (two
# notices, two losses left behind: 8 -> 7 -> 6 replicas, two cores taken
# back); the example exits 0 with the undisturbed run's test accuracy within
# one point.
#
#   tests/example/scenario.sh BUILD_DIR
set -uo pipefail
unset TPUEMU_METRICS_PORT # eight workers on one machine cannot share one metrics port
bin=$(cd "$1" && pwd)/bin
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d /tmp/tpuemu-scenario.XXXXXX)
pids=()
trainer=
watcher=
. "$(dirname "${BASH_SOURCE[0]}")/../support/local_cluster.sh"
cleanup() {
    for p in "${pids[@]}" $trainer $watcher; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}" $trainer $watcher; do wait "$p" 2>/dev/null; done
    lc_cleanup
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$work"/out*.txt "$work"/plan.txt; do [ -f "$f" ] && { echo "---- $f"; cat "$f"; }; done
    local core
    for core in ${maint:-} ${paused:-}; do # what the cores taken back went through
        echo "---- $core in tpuctl health"
        grep -E " $core " "$work/health.txt" 2>/dev/null | uniq -f 1 | tail -n 20
        echo "---- $core: its worker's log"
        local hc=${core#host}
        grep -v "level=debug" "$work/worker-${hc/\//-}.log" 2>/dev/null | tail -n 15
    done
    exit 1
}
lc_start_resolver "$bin" "$work/resolver.log" --heartbeat-ms 200
declare -A pid_of
for h in 0 1; do
    for c in 0 1 2 3; do
        "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type v3 \
            2>>"$work/worker-$h-$c.log" &
        pids+=($!)
        pid_of[host$h/$c]=$!
    done
done
"$bin/tpuctl" --tpu "$tpu" init --expect 8 --timeout-ms 30000 >/dev/null ||
    fail "the cluster did not come up: $(tail -n 3 "$work"/*.log)"
cd "$work"
run() { # output file, extra flags
    local out=$1
    shift
    timeout 300 "$bin/fashion_mnist" --tpu "$tpu" --epochs 24 --checkpoint "$work/fm.ckpt" "$@" >"$out" 2>&1
}

# ---- undisturbed
run out-clean.txt || fail "the undisturbed run exited $?"
clean=$(sed -n 's/^test accuracy: //p' out-clean.txt)
[ -n "$clean" ] || fail "the undisturbed run printed no test accuracy"
rm -f "$work/fm.ckpt"

# ---- the scenario: 1,392 steps in all (24 epochs of 58 at a global batch of
# 1,024). The faults must not overlap: each must be over before the next is
# due, whatever a step takes (1 ms on a fast machine, 50 ms on a slow or
# busy one). A kill, a maintenance window and a pause hold training up until
# they are waited out; only a notice runs beside training steps. It must
# last a few steps, for the trainer to take its snapshot at the step
# boundary before the event (the steps in flight finish first): 400 ms is 8
# steps at 50 ms. And it must be over before the next fault: the faults are
# 600 steps apart, 1.5 times the 400 steps a notice lasts at 1 ms per step.
# The maintenance window and the pause are several times what they must
# outlast (the collectives' 600 ms progress timeout; --elastic-wait 10).
# TPUEMU_TEST_STEP_MS=50 in the workers' environment makes each step take
# 50 ms (tests/README.md: timing).
cat >scenario.txt <<'EOF'
seed 18
at step 30   kill         random-core
at step 100  preempt      random-core  notice=400
at step 700  maintenance  random-core  2500 notice=400
at step 1300 pause        random-core  3000
EOF
"$bin/tpuctl" --tpu "$tpu" chaos --scenario scenario.txt >plan.txt 2>&1 || fail "tpuctl chaos --scenario failed"
grep -q "^scenario scenario.txt, seed 18: 4 faults" plan.txt || fail "no plan line with the seed"
core_of() { sed -n "s/^line [0-9]*: $1 on core \([^,]*\),.*/\1/p" plan.txt; }
killed=$(core_of kill) preempted=$(core_of preempt) maint=$(core_of maintenance) paused=$(core_of pause)
for v in "$killed" "$preempted" "$maint" "$paused"; do
    [[ $v =~ ^host[01]/[0-3]$ ]] || fail "the plan does not name four cores"
done
[ "$(printf '%s\n' "$killed" "$preempted" "$maint" "$paused" | sort -u | wc -l)" -eq 4 ] ||
    fail "seed 18 picked a core twice: $killed $preempted $maint $paused"

# the health watcher: every ~0.2 s, for at most 300 s
(
    for _ in $(seq 1500); do
        "$bin/tpuctl" --tpu "$tpu" health 2>&1 | sed "s/^/$(date +%s.%N) /"
        sleep 0.2
    done
) >health.txt &
watcher=$!
run out.txt --elastic 4 --elastic-wait 10 &
trainer=$!
wait "$trainer"
rc=$?
trainer=
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
watcher=
cat out.txt
[ $rc -eq 0 ] || fail "fashion_mnist exited $rc"

# what the user saw, fault by fault
grep -qE "^tpuemu: warning: elastic training: UNAVAILABLE: .*$killed" out.txt ||
    fail "no warning naming the killed core $killed"
grep -q "a preemption notice came from core $preempted" out.txt || fail "no notice from $preempted"
grep -q "a maintenance notice came from core $maint" out.txt || fail "no notice from $maint"
grep -qE "^tpuemu: warning: elastic training: UNAVAILABLE: .*$maint" out.txt ||
    fail "no warning naming $maint when it went down for maintenance"
grep -qE "^tpuemu: warning: elastic training: UNAVAILABLE: .*$paused" out.txt ||
    fail "no warning naming the paused core $paused"
grep -qE " $maint +MAINTENANCE +UNHEALTHY_MAINTENANCE" health.txt ||
    fail "tpuctl health never showed $maint UNHEALTHY_MAINTENANCE"
health=$("$bin/tpuctl" --tpu "$tpu" health)
echo "$health"
# (grep <<<: with pipefail, `echo | grep -q` fails when grep has matched and
# gone before echo, which writes line by line, is done)
grep -qE "^$killed +DEAD" <<<"$health" || fail "tpuctl health does not list $killed DEAD"
grep -qE "^$preempted +PREEMPTED" <<<"$health" || fail "tpuctl health does not list $preempted PREEMPTED"
grep -q "^state: PREEMPTED" <<<"$health" || fail "the node's state is not PREEMPTED"
wait "${pid_of[$preempted]}"
st=$?
[ $st -eq 4 ] || fail "the preempted worker $preempted exited $st, not 4"
kill -0 "${pid_of[$paused]}" 2>/dev/null || fail "the paused worker $paused (pid ${pid_of[$paused]}) does not run"
grep -qE "^$paused +READY +HEALTHY" <<<"$health" || fail "tpuctl health does not list $paused READY, HEALTHY"

# how it went on
[ "$(grep -c "^elastic event [0-9]*: NOTICE" out.txt)" -eq 2 ] || fail "not two NOTICE events"
grep -qE "^elastic event [0-9]*: SHRUNK at step [0-9]+: 8 -> 7 replicas" out.txt || fail "no SHRUNK 8 -> 7 event"
grep -qE "^elastic event [0-9]*: SHRUNK at step [0-9]+: 7 -> 6 replicas" out.txt || fail "no SHRUNK 7 -> 6 event"
[ "$(grep -cE "^elastic event [0-9]*: RESTORED at step [0-9]+: 6 -> 6 replicas" out.txt)" -eq 2 ] ||
    fail "not two RESTORED 6 -> 6 events (the cores in maintenance and paused taken back)"
acc=$(sed -n 's/^test accuracy: //p' out.txt)
[ -n "$acc" ] || fail "no 'test accuracy:' line"
awk -v a="$acc" -v c="$clean" 'BEGIN { d = a - c; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
    fail "test accuracy $acc through the faults, $clean undisturbed: more than a point apart"
echo "1 passed, 0 failed: fashion_mnist went through a kill ($killed), a preemption ($preempted)," \
    "maintenance ($maint) and a pause ($paused) on 8 cores; test accuracy $acc ($clean undisturbed)"
