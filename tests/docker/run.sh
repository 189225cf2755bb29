#!/usr/bin/env bash
# The compose test cluster end to end, on a Docker engine of its own:
#  - starts dockerd (vfs storage, no iptables, no default bridge) with its data
#    and sockets in a temp dir, and fails, saying why, when it cannot;
#  - makes the base image when it cannot be pulled (deploy/make-base-image.sh),
#    builds the image and brings up deploy/docker-compose.yml under a project
#    name of its own: a resolver and 8 workers (2 hosts x 4 cores);
#  - waits until every container is healthy, runs the trainer (Fashion-MNIST,
#    a checkpoint every 20 steps, --recover), kills worker host1-core2's
#    process from outside in its third epoch (docker kill would count as a
#    manual stop, which the restart policy leaves stopped), and checks: the
#    trainer reports UNAVAILABLE naming host1/2 in time, the container is
#    restarted and registers again (resolver log, tpuctl cluster), and the
#    trainer re-initializes, restores the checkpoint and finishes (exit 0,
#    test accuracy);
#  - runs the compose file's prometheus service (profile monitoring, Debian's
#    Prometheus with deploy/prometheus/compose.yml) beside them, and asks its
#    HTTP API on a loopback port after the training: all 9 targets up, the
#    cores by state 8 READY, every worker's steps above 0;
#  - preempts a whole host: `tpuctl chaos --at-step 130 --notice-ms 15000
#    preempt host1`, then the trainer as `up -d` runs it (restart:
#    on-failure), and checks: `tpuctl health` shows the notice on host1's 4
#    cores; the trainer names it, saves its checkpoint and exits 42; each of
#    host1's workers exits 4 and Docker starts it again (restart count, die
#    events, the resolver's log); the trainer, started again by its restart
#    policy, waits for the notice to pass and for the 8 cores, resumes from
#    its checkpoint in epoch 3 and exits 0 with the first run's test
#    accuracy (within 2 points, at least 0.8); `tpuctl health` and `cluster`
#    show 8 cores READY, HEALTHY;
#  - takes everything down (compose down -v, the engine, the temp dir) on
#    every exit, also on failure.
#
#   tests/docker/run.sh          from the repository root, as root
#   TPUEMU_DOCKER_KEEP=1 tests/docker/run.sh   keep the temp dir (logs)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
t_start=$(date +%s)
DOCKER=${DOCKER:-$([ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker)}
export DOCKER
project=tpuemu-test-$$
victim=host1-core2
victim_core=host1/2
epochs=8
work=
dockerd_pid=
trainer_pid=
events_pid=
trainer_log=

say() { echo "[$(($(date +%s) - t_start))s] $*"; }
fail() {
    echo "FAIL: $*"
    if [ -n "$work" ] && [ -f "${trainer_log:-$work/trainer.log}" ]; then
        echo "--- trainer"; tail -n 40 "${trainer_log:-$work/trainer.log}"
    fi
    exit 1
}
dk() { "$DOCKER" "$@"; }
compose() { docker-compose -p "$project" -f deploy/docker-compose.yml "$@"; }

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$trainer_pid" ] && kill "$trainer_pid" 2>/dev/null
    [ -n "$events_pid" ] && kill "$events_pid" 2>/dev/null
    if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
        if [ $rc -ne 0 ]; then
            echo "--- resolver log (last lines)"
            dk logs --tail 15 "${project}_resolver_1" 2>&1
        fi
        timeout 120 docker-compose -p "$project" -f deploy/docker-compose.yml --profile monitoring down -v --remove-orphans -t 5 \
            >"$work/down.log" 2>&1 || { echo "compose down failed:"; tail -5 "$work/down.log"; }
        kill -TERM "$dockerd_pid" 2>/dev/null
        for _ in $(seq 300); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$dockerd_pid" 2>/dev/null
        wait "$dockerd_pid" 2>/dev/null
    fi
    if [ -n "$work" ]; then
        # the engine unmounts what it mounted; anything left must not be deleted through
        grep -o " $work[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
        if [ "${TPUEMU_DOCKER_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the engine ----
[ "$(id -u)" -eq 0 ] || fail "this test starts its own Docker engine, which needs root"
for c in dockerd docker-compose "$DOCKER" curl python3; do
    command -v "$c" >/dev/null || fail "no $c: apt-get install docker.io docker-compose debootstrap curl python3"
done
work=$(mktemp -d /tmp/tpuemu-docker.XXXXXX) || fail "cannot make a temp dir"
chmod 755 "$work"
export DOCKER_HOST=unix://$work/docker.sock
avail=$(df -Pk "$work" | awk 'NR == 2 { print int($4 / 1048576) }')
[ "${avail:-0}" -ge 8 ] || fail "$work has ${avail} GiB free; the vfs storage of this test takes up to 6, so it asks for 8"
say "starting dockerd (data in $work)"
dockerd --storage-driver vfs --iptables=false --bridge=none \
    --data-root "$work/data" --exec-root "$work/exec" --pidfile "$work/dockerd.pid" \
    -H "$DOCKER_HOST" >"$work/dockerd.log" 2>&1 &
dockerd_pid=$!
up=0
for _ in $(seq 600); do # 60 s
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
        wait "$dockerd_pid"
        fail "the Docker engine could not start (dockerd exited $?): $(grep -E 'level=(error|fatal)|failed' "$work/dockerd.log" | tail -3)"
    fi
    dk info >/dev/null 2>&1 && { up=1; break; }
    sleep 0.1
done
[ $up -eq 1 ] || fail "the Docker engine did not answer within 60 s: $(tail -3 "$work/dockerd.log")"

# ---- image and cluster ----
say "base image"
deploy/make-base-image.sh || fail "cannot make the base image"
(umask 022; head -c 32 /dev/urandom | base64 >"$work/token")
export TPUEMU_TOKEN_HOST_FILE=$work/token TPUEMU_IMAGE=tpuemu:test
say "building the image"
compose build >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "docker-compose build failed"; }
say "building the prometheus service's image"
compose --profile monitoring build prometheus >>"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; fail "docker-compose build of the prometheus service failed"; }
dk image prune -f >/dev/null # the build stage: vfs keeps a full copy of every layer
say "starting the resolver and 8 workers"
workers=()
for h in 0 1; do for c in 0 1 2 3; do workers+=("host$h-core$c"); done; done
timeout 300 docker-compose -p "$project" -f deploy/docker-compose.yml up -d "${workers[@]}" >"$work/up.log" 2>&1 ||
    { tail -20 "$work/up.log"; fail "docker-compose up failed"; }
cname() { echo "${project}_$1_1"; }
health() { dk inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$(cname "$1")" 2>/dev/null; }
healthy=0
for _ in $(seq 120); do # 60 s
    n=0
    for s in resolver "${workers[@]}"; do [ "$(health "$s")" = healthy ] && n=$((n + 1)); done
    [ $n -eq 9 ] && { healthy=1; break; }
    sleep 0.5
done
[ $healthy -eq 1 ] || {
    for s in resolver "${workers[@]}"; do echo "$s: $(health "$s")"; done
    dk logs --tail 5 "$(cname host0-core0)" 2>&1
    fail "the cluster was not healthy within 60 s ($n of 9 containers)"
}
say "all 9 containers healthy"
for s in resolver host0-core0; do # the image's unprivileged user, the uid deploy/k8s asks for
    uid=$(dk exec "$(cname $s)" id -u 2>&1)
    [ "$uid" = 10001 ] || fail "$s runs as uid $uid, not the image's user tpuemu (10001)"
done
# Prometheus, published on a free loopback port of this machine
prom_port=$((20000 + RANDOM % 12000))
while (exec 3<>"/dev/tcp/127.0.0.1/$prom_port") 2>/dev/null; do prom_port=$((prom_port + 1)); done
export TPUEMU_PROMETHEUS_PORT=$prom_port
timeout 120 docker-compose -p "$project" -f deploy/docker-compose.yml --profile monitoring up -d prometheus \
    >>"$work/up.log" 2>&1 || { tail -20 "$work/up.log"; fail "docker-compose --profile monitoring up prometheus failed"; }
say "prometheus service started, on 127.0.0.1:$prom_port"
tpuctl_in() { dk exec "$(cname resolver)" tpuctl --tpu 127.0.0.1:8470 "$@"; }
tpuctl_in cluster >"$work/cluster0.txt" 2>&1 || fail "tpuctl cluster in the resolver's container: $(cat "$work/cluster0.txt")"
[ "$(grep -cE '^host[01] +[0-3] +IDLE ' "$work/cluster0.txt")" -eq 8 ] ||
    fail "the resolver does not list 8 idle cores: $(cat "$work/cluster0.txt")"

# ---- training, a worker killed, recovery ----
export FASHION_MNIST_ARGS="--epochs $epochs --checkpoint /var/lib/tpuemu/data/fm.ckpt --checkpoint-every 20 --recover 2 --recover-wait 120"
say "trainer: fashion_mnist $FASHION_MNIST_ARGS"
timeout 600 docker-compose -p "$project" -f deploy/docker-compose.yml run --rm -T trainer >"$work/trainer.log" 2>&1 &
trainer_pid=$!
for _ in $(seq 1800); do # 180 s
    grep -q "^Epoch 3/$epochs" "$work/trainer.log" && break
    kill -0 "$trainer_pid" 2>/dev/null || break
    sleep 0.1
done
grep -q "^Epoch 3/$epochs" "$work/trainer.log" || fail "the trainer never began epoch 3"
restarts=$(dk inspect -f '{{.RestartCount}}' "$(cname $victim)")
pid=$(dk inspect -f '{{.State.Pid}}' "$(cname $victim)")
[ "${pid:-0}" -gt 1 ] || fail "no process for $(cname $victim)"
kill -KILL "$pid" || fail "cannot kill $victim's worker (pid $pid)"
t_kill=$(date +%s%N)
say "killed $victim's worker (host pid $pid) in epoch 3"

reported=0
for _ in $(seq 300); do # 30 s
    grep -qE "^fashion_mnist: training: UNAVAILABLE: .*$victim_core" "$work/trainer.log" && { reported=1; break; }
    kill -0 "$trainer_pid" 2>/dev/null || break
    sleep 0.1
done
t_report=$(date +%s%N)
[ $reported -eq 1 ] || fail "the trainer did not report UNAVAILABLE naming $victim_core within 30 s of the kill"
report_ms=$(((t_report - t_kill) / 1000000))
say "the trainer reported it after ${report_ms} ms: $(grep -m1 '^fashion_mnist: training: UNAVAILABLE' "$work/trainer.log")"
[ $report_ms -le 10000 ] || fail "UNAVAILABLE came ${report_ms} ms after the kill (at most 10 s: heartbeat 1 s x 3 and slack)"

back=0
for _ in $(seq 120); do # 60 s
    [ "$(dk inspect -f '{{.RestartCount}}' "$(cname $victim)")" -gt "$restarts" ] &&
        [ "$(health $victim)" = healthy ] && { back=1; break; }
    sleep 0.5
done
[ $back -eq 1 ] || fail "$victim was not restarted and healthy within 60 s ($(health $victim))"
say "$victim restarted by its restart policy and healthy again"
dk logs "$(cname resolver)" 2>&1 | grep -E 'msg="core (re-)?registered" host="?host1"? core=2' >"$work/registered.txt"
[ "$(wc -l <"$work/registered.txt")" -ge 2 ] ||
    fail "the resolver's log does not show $victim_core registering again: $(cat "$work/registered.txt")"

wait "$trainer_pid"
trc=$?
trainer_pid=
say "trainer exited $trc"
grep -vE '^[0-9]+/[0-9]+ \[' "$work/trainer.log" | grep -vE '^(host|all cores|core )' | sed 's/^/    /' | tail -n 25
[ $trc -eq 0 ] || fail "the trainer exited $trc"
grep -q "^recovering (1 of 2)" "$work/trainer.log" || fail "no 'recovering (1 of 2)' line"
grep -q "^recovering (2 of 2)" "$work/trainer.log" && fail "the trainer had to recover twice from one kill"
grep -q "TPU system initialized again: .* 8 replicas" "$work/trainer.log" || fail "the TPU system was not initialized again on 8 cores"
grep -qE "^  restored /var/lib/tpuemu/data/fm.ckpt: epoch [0-9]+, batch [0-9]+, step [0-9]+" "$work/trainer.log" ||
    fail "the trainer restored no checkpoint"
grep -q "^Epoch $epochs/$epochs" "$work/trainer.log" || fail "the last epoch never began"
acc=$(sed -n 's/^test accuracy: //p' "$work/trainer.log")
[ -n "$acc" ] || fail "no 'test accuracy:' line"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' || fail "test accuracy $acc is below 0.8 after $epochs epochs"
tpuctl_in cluster >"$work/cluster1.txt" 2>&1 || fail "tpuctl cluster after training: $(cat "$work/cluster1.txt")"
[ "$(grep -cE '^host[01] +[0-3] +READY ' "$work/cluster1.txt")" -eq 8 ] ||
    fail "after training the resolver does not list 8 ready cores: $(cat "$work/cluster1.txt")"

# what the prometheus service scraped (every 15 s: give it a few rounds)
promq() { # query: "labels VALUE" lines
    curl -fsS --max-time 10 --get --data-urlencode "query=$1" "http://127.0.0.1:$prom_port/api/v1/query" 2>/dev/null |
        python3 -c '
import json, sys
for s in json.load(sys.stdin)["data"]["result"]:
    print(",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k not in ("__name__", "instance")) or "-", s["value"][1])'
}
scraped=0
for _ in $(seq 90); do # 90 s
    up=$(promq 'up{job=~"tpuemu-.*"}' | awk '$2 == 1' | wc -l)
    ready=$(promq 'sum by (state) (tpuemu_resolver_cores)' | awk '$1 == "state=READY" { print $2 }')
    stepped=$(promq 'tpuemu_worker_train_steps_total > 0' | wc -l)
    [ "$up" -eq 9 ] && [ "$ready" = 8 ] && [ "$stepped" -eq 8 ] && { scraped=1; break; }
    sleep 1
done
[ $scraped -eq 1 ] || fail "the prometheus service does not show 9 targets up ($up), 8 READY cores ($ready) and 8 workers' steps ($stepped) within 90 s"
say "prometheus service: 9 targets up, 8 cores READY, steps on all 8 workers"

# ---- a whole host preempted: the trainer as `up` runs it (restart: on-failure)
# The preemption is scheduled on host1's 4 cores for the trainer's step
# $preempt_step (epoch 3: 58 steps an epoch on 8 replicas), so it lands in
# the middle of the run however fast this machine trains. Every wait below
# is bounded and generous; the checks are on states (exit codes, restart
# counts, log lines, health), never on how long something took.
host1=(host1-core0 host1-core1 host1-core2 host1-core3)
preempt_step=130
notice_ms=15000
acc_kill=$acc
restarts_of() { dk inspect -f '{{.RestartCount}}' "$(cname "$1")"; }
declare -A restarts0
for s in "${host1[@]}"; do restarts0[$s]=$(restarts_of "$s"); done
# The die events, streamed from now on into a file: the engine keeps only its last 256
# events for `docker events --since`, and the healthchecks' exec events of 10
# containers push the early ones out within minutes on a slow machine.
t_events=$(date +%s)
dk events --since "$t_events" --filter event=die \
    --format '{{.Actor.Attributes.name}} {{.Actor.Attributes.exitCode}}' >"$work/die-events.txt" 2>&1 &
events_pid=$!
tpuctl_in chaos --at-step $preempt_step --notice-ms $notice_ms preempt host1 >"$work/chaos.txt" 2>&1 ||
    fail "tpuctl chaos --at-step $preempt_step --notice-ms $notice_ms preempt host1: $(cat "$work/chaos.txt")"
[ "$(grep -cE "^scheduled preempt on core host1/[0-3] \(after step $preempt_step\)" "$work/chaos.txt")" -eq 4 ] ||
    fail "tpuctl chaos did not schedule the preemption on host1's 4 cores: $(cat "$work/chaos.txt")"
say "preemption of host1 scheduled for step $preempt_step, notice $notice_ms ms"
export FASHION_MNIST_ARGS="--epochs $epochs --checkpoint /var/lib/tpuemu/data/fm-preempt.ckpt --checkpoint-every 20 --recover 2 --recover-wait 120"
say "trainer (up -d, restart: on-failure): fashion_mnist $FASHION_MNIST_ARGS"
timeout 120 docker-compose -p "$project" -f deploy/docker-compose.yml up -d --no-deps trainer >>"$work/up.log" 2>&1 ||
    { tail -20 "$work/up.log"; fail "docker-compose up -d trainer failed"; }
trainer_log=$work/trainer-preempt.log
tlog() { dk logs "$(cname trainer)" >"$trainer_log" 2>&1; }
tstate() { dk inspect -f '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' "$(cname trainer)" 2>/dev/null; }

# the notice, as a user sees it: tpuctl health on host1's cores
noticed=0
for _ in $(seq 360); do # 180 s for the trainer to reach the step
    tpuctl_in health --host host1 >"$work/health-notice.txt" 2>&1
    [ "$(grep -cE '^h(ost)?1/[0-3] .*preemption notice: terminated in' "$work/health-notice.txt")" -eq 4 ] && { noticed=1; break; }
    [ "$(restarts_of host1-core0)" -gt "${restarts0[host1-core0]}" ] && break # the notice is over already
    sleep 0.5
done
[ $noticed -eq 1 ] ||
    fail "tpuctl health did not show the preemption notice on host1's 4 cores during the notice: $(cat "$work/health-notice.txt")"
say "tpuctl health: $(grep -m1 'preemption notice' "$work/health-notice.txt" | sed 's/  */ /g')"

# the trainer stops on the notice, saves its checkpoint, exits 42
stopped=0
for _ in $(seq 240); do # 120 s
    tlog
    grep -q "^preempted: exiting with status 42" "$trainer_log" && { stopped=1; break; }
    sleep 0.5
done
[ $stopped -eq 1 ] || fail "the trainer did not stop on the notice (no 'preempted: exiting with status 42')"
grep -qE "^fashion_mnist: training: PREEMPTED: a preemption notice came from core host1/[0-3] .*every replica stopped after step [0-9]+" "$trainer_log" ||
    fail "no PREEMPTED error naming a core of host1 and the step"
say "trainer: $(grep -m1 -oE 'PREEMPTED: a preemption notice came from core host1/[0-3] .*every replica stopped after step [0-9]+' "$trainer_log")"

# host1's workers exit 4 at the end of the notice; Docker starts them again
back=0
for _ in $(seq 360); do # 180 s
    n=0
    for s in "${host1[@]}"; do
        [ "$(restarts_of "$s")" -gt "${restarts0[$s]}" ] && [ "$(health "$s")" = healthy ] && n=$((n + 1))
    done
    [ $n -eq 4 ] && { back=1; break; }
    sleep 0.5
done
[ $back -eq 1 ] || {
    for s in "${host1[@]}"; do echo "$s: restarts $(restarts_of "$s") (before ${restarts0[$s]}), $(health "$s")"; done
    fail "host1's 4 containers were not restarted and healthy within 180 s"
}
for s in "${host1[@]}"; do
    grep -qx "$(cname "$s") 4" "$work/die-events.txt" ||
        fail "$s's worker did not exit with status 4: $(grep "$(cname "$s")" "$work/die-events.txt")"
    # into a file first: under pipefail, grep -q quitting at its match would make docker logs' SIGPIPE a failure
    dk logs "$(cname "$s")" >"$work/log-$s.txt" 2>&1
    grep -q 'preempted: this core terminates now' "$work/log-$s.txt" || fail "$s's log does not say it was preempted"
done
say "host1's 4 workers exited 4, restarted by Docker (restart counts $(for s in "${host1[@]}"; do printf '%s ' "$(restarts_of "$s")"; done | sed 's/ $//'))"
dk logs "$(cname resolver)" 2>&1 | grep -E 'msg="core (re-)?registered" host="?host1"?' >"$work/registered-host1.txt"
for c in 0 1 2 3; do
    [ "$(grep -cE "core=$c( |\$)" "$work/registered-host1.txt")" -ge 2 ] ||
        fail "the resolver's log does not show host1/$c registering again: $(grep -E "core=$c( |\$)" "$work/registered-host1.txt")"
done

# the trainer, started again by its restart policy, waits for the 8 cores,
# resumes from its checkpoint and finishes
done_ok=0
for _ in $(seq 600); do # 600 s
    st=$(tstate)
    [ "${st% *}" = "exited 0" ] && { done_ok=1; break; }
    sleep 1
done
tlog
st=$(tstate)
say "trainer: state, exit code, restarts: $st"
grep -vE '^[0-9]+/[0-9]+ \[' "$trainer_log" | grep -vE '^(host|all cores|core )' | sed 's/^/    /' | tail -n 25
[ $done_ok -eq 1 ] || fail "the trainer did not finish with exit 0 within 600 s ($st)"
trestarts=${st##* }
[ "$trestarts" -ge 1 ] || fail "the trainer's container was never restarted (restart count $trestarts)"
sleep 1 # the stream writes an event after the state it reports
sed -n "s/^$(cname trainer) //p" "$work/die-events.txt" >"$work/trainer-exits.txt"
grep -qx 42 "$work/trainer-exits.txt" || fail "the trainer never exited 42: exits $(tr '\n' ' ' <"$work/trainer-exits.txt")"
[ "$(tail -n 1 "$work/trainer-exits.txt")" = 0 ] || fail "the trainer's last exit is not 0: exits $(tr '\n' ' ' <"$work/trainer-exits.txt")"
grep -q "^trainer: a core has a preemption or maintenance notice; waiting until it has passed" "$trainer_log" ||
    fail "the restarted trainer did not wait for the notice to pass (Docker starts it again 0.1 s after its exit 42)"
grep -qE "^resuming from /var/lib/tpuemu/data/fm-preempt.ckpt: epoch 3, batch [0-9]+, step [0-9]+" "$trainer_log" ||
    fail "the restarted trainer did not resume from its checkpoint in epoch 3"
[ "$(grep -c "^Epoch 1/$epochs" "$trainer_log")" -eq 1 ] || fail "a restarted trainer began again from epoch 1"
[ "$(grep -cE "^Running on .* with 8 replicas" "$trainer_log")" -eq "$(grep -c "^Running on " "$trainer_log")" ] ||
    fail "a run of the trainer did not have all 8 cores: $(grep -E '^Running on' "$trainer_log" | sort | uniq -c)"
grep -q "^Epoch $epochs/$epochs" "$trainer_log" || fail "the last epoch never began after the preemption"
acc=$(sed -n 's/^test accuracy: //p' "$trainer_log")
[ -n "$acc" ] || fail "no 'test accuracy:' line after the preemption"
awk -v a="$acc" -v k="$acc_kill" 'BEGIN { d = a - k; if (d < 0) d = -d; exit !(a >= 0.8 && d <= 0.02) }' ||
    fail "test accuracy $acc after the preemption: below 0.8, or more than 2 points from the first run's $acc_kill"
say "trainer: exits $(tr '\n' ' ' <"$work/trainer-exits.txt" | sed 's/ $//'), resumed from its checkpoint, test accuracy $acc (first run: $acc_kill)"

# and the cluster is whole again, as tpuctl shows it
tpuctl_in health >"$work/health1.txt" 2>&1 || fail "tpuctl health after the preemption exited $?: $(cat "$work/health1.txt")"
[ "$(grep -cE '^h(ost)?[01]/[0-3] +READY +HEALTHY' "$work/health1.txt")" -eq 8 ] ||
    fail "tpuctl health does not show 8 cores READY and HEALTHY: $(cat "$work/health1.txt")"
tpuctl_in cluster >"$work/cluster2.txt" 2>&1 || fail "tpuctl cluster after the preemption: $(cat "$work/cluster2.txt")"
[ "$(grep -cE '^host[01] +[0-3] +READY ' "$work/cluster2.txt")" -eq 8 ] ||
    fail "after the preemption the resolver does not list 8 ready cores: $(cat "$work/cluster2.txt")"
say "tpuctl health and cluster: 8 cores READY and HEALTHY"

say "done"
echo "1 passed, 0 failed: the compose cluster trained Fashion-MNIST to $acc_kill through the kill of $victim_core" \
    "(UNAVAILABLE after ${report_ms} ms, recovered from the checkpoint), its Prometheus scraped it, and trained" \
    "to $acc through the preemption of host1 (4 workers exited 4 and were restarted, the trainer exited 42 and" \
    "resumed from its checkpoint), in $(($(date +%s) - t_start)) s"
