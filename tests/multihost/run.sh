#!/usr/bin/env bash
# A cluster over several machines, emulated with network namespaces: the
# "On several machines" commands of docs/operations/cluster.md, run verbatim, on three machines on
# one switch, then one machine cut off in the middle of a training run.
#
#   machine A (10.213.0.1)  tpu-resolver --listen 0.0.0.0:8470 --token-file token,
#                           and the clients (tpuctl, fashion_mnist)
#   machine B (10.213.0.2)  4 workers: tpu-worker --listen 0.0.0.0 --core 0..3 ...
#   machine C (10.213.0.3)  4 workers, the same commands
#
# Each machine is a network namespace with its own loopback and one veth to a
# bridge that lives in a fourth, "switch" namespace: the test adds nothing to the
# root namespace and talks to no address but its own machines'. The documented
# host id defaults to the hostname, which network namespaces share (B and C
# would both claim <hostname>/0..3 and the later machine's workers be refused
# with ALREADY_EXISTS), so each worker machine also gets its own UTS namespace and
# hostname (machine-b, machine-c), as separate machines have: the commands stay
# the documented ones, with no --host-id.
#
# What it checks: 8 cores on 2 hosts come up and initialize; an all-reduce
# across the machines is correct; fashion_mnist trains 2 epochs across them;
# then, with a long training run going, C's link is cut on the switch
# (`ip link set veth-c down`): the run must fail with UNAVAILABLE naming a core of
# machine-c within the documented dead-core bound (plus a margin), `tpuctl cluster`
# must show C's 4 cores DEAD, `tpuctl init --allow-partial` must initialize B's 4
# cores with C's listed missing, and an all-reduce and a training run on those 4
# must succeed. Finally C's link comes back and its workers must be READY again.
# Takes about 20 s. Needs root (ip netns, unshare).
#
#   tests/multihost/run.sh              binaries from build/bin
#   TPUEMU_BIN=build-asan/bin tests/multihost/run.sh
#   TPUEMU_KEEP_LOGS=DIR tests/multihost/run.sh   keep every log and output in DIR
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${TPUEMU_BIN:-$ROOT/build/bin}
bin=$(cd "$bin" 2>/dev/null && pwd) || { echo "FAIL: no build dir ${TPUEMU_BIN:-$ROOT/build/bin} (build first, or set TPUEMU_BIN)"; exit 1; }
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
for p in tpu-resolver tpu-worker tpuctl fashion_mnist; do
    [ -x "$bin/$p" ] || { echo "FAIL: $bin/$p is missing (build the tree first)"; exit 1; }
done
[ -f "$data/train-images-idx3-ubyte.gz" ] ||
    { echo "FAIL: $data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"; exit 1; }
for t in ip unshare timeout; do
    command -v $t >/dev/null || { echo "FAIL: '$t' not found (apt-get install iproute2 util-linux coreutils)"; exit 1; }
done

A_IP=10.213.0.1
B_IP=10.213.0.2
C_IP=10.213.0.3
TPU=grpc://$A_IP:8470
# The documented bound with the defaults (heartbeat 1 s x dead-after 3 = 3 s of
# dead-core time): the survivors blame a cut-off core after half of it plus a
# liveness probe (about 2.3 s), and fit then gives the cut-off cores' own
# answers 2 x 3 s + 1 s more before it returns: about 9.3 s. A margin on top for
# the loaded 2-core machine.
FAIL_BOUND_MS=${FAIL_BOUND_MS:-12000}

pfx=tpuemu-mh$$
SW=$pfx-sw A=$pfx-a B=$pfx-b C=$pfx-c
NSES=()
work=$(mktemp -d /tmp/tpuemu-multihost.XXXXXX)
t_start=$(date +%s%N)

now_ms() { echo $((($(date +%s%N) - t_start) / 1000000)); }
say() { printf '[%6.1f s] %s\n' "$(awk -v m="$(now_ms)" 'BEGIN{print m/1000}')" "$*"; }

cleanup() {
    local ns pids
    trap - EXIT INT TERM
    for ns in "${NSES[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && echo "$pids" | xargs -r kill -TERM 2>/dev/null
    done
    for _ in $(seq 50); do # up to 5 s for the daemons to stop cleanly
        pids=""
        for ns in "${NSES[@]}"; do pids+=$(ip netns pids "$ns" 2>/dev/null); done
        [ -z "$pids" ] && break
        sleep 0.1
    done
    for ns in "${NSES[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && echo "$pids" | xargs -r kill -KILL 2>/dev/null
    done
    wait 2>/dev/null
    for ns in "${NSES[@]}"; do ip netns del "$ns" 2>/dev/null; done
    if [ -n "${TPUEMU_KEEP_LOGS:-}" ]; then
        mkdir -p "$TPUEMU_KEEP_LOGS" && cp -r "$work"/. "$TPUEMU_KEEP_LOGS"/ && echo "logs kept in $TPUEMU_KEEP_LOGS"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

fail() {
    echo "FAIL: $*"
    local f
    for f in "$work"/*.log; do
        [ -f "$f" ] || continue
        echo "--- last lines of $(basename "$f")"
        tail -n 3 "$f" | cut -c1-300
    done
    echo "0 passed, 1 failed"
    exit 1
}

# on NS cmd...: run a command on one machine (its namespace), in the work dir.
on() {
    local ns=$1
    shift
    ip netns exec "$ns" env -C "$work" PATH="$bin:$PATH" "$@"
}

# ---- the machines and the switch
for ns in "$SW" "$A" "$B" "$C"; do
    if ! err=$(ip netns add "$ns" 2>&1); then
        fail "cannot create network namespace $ns: $err (this test needs root, CAP_SYS_ADMIN and a kernel with network namespaces)"
    fi
    NSES+=("$ns")
    ip -n "$ns" link set lo up || fail "cannot bring up lo in $ns"
done
ip -n "$SW" link add br0 type bridge || fail "cannot create a bridge in the switch namespace"
ip -n "$SW" link set br0 up
for m in a b c; do
    ns=$pfx-$m
    case $m in a) ip=$A_IP ;; b) ip=$B_IP ;; c) ip=$C_IP ;; esac
    ip -n "$SW" link add "veth-$m" type veth peer name eth0 netns "$ns" || fail "cannot create the veth pair of machine $m"
    ip -n "$SW" link set "veth-$m" master br0 up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
done
say "network: $A ($A_IP), $B ($B_IP), $C ($C_IP) on a bridge in $SW"

# ---- the documented commands
head -c 32 /dev/urandom | base64 >"$work/token" # copy this file to every machine
# machine A:
on "$A" tpu-resolver --listen 0.0.0.0:8470 --token-file token 2>"$work/resolver.log" &
# machines B, C: one worker per emulated core (each machine with its own hostname)
for m in b c; do
    on "$pfx-$m" unshare --uts bash -c '
        hostname "$1" || exit 1
        trap "kill \$(jobs -p) 2>/dev/null; wait" TERM
        for c in 0 1 2 3; do
          tpu-worker --resolver "$2":8470 --listen 0.0.0.0 --core $c --tpu-type v3 --token-file token 2>"$1-$c.log" &
        done
        wait' workers "machine-$m" "$A_IP" 2>"$work/machine-$m.log" &
done

ctl() { on "$A" timeout 60 tpuctl --tpu "$TPU" --token-file token "$@"; }
ok=0
for _ in $(seq 100); do # the cluster: up to 20 s for 8 cores to register
    n=$(ctl --timeout-ms 2000 cluster 2>/dev/null | grep -c ' READY \| IDLE ')
    [ "$n" -eq 8 ] && { ok=1; break; }
    sleep 0.2
done
[ $ok -eq 1 ] || { ctl cluster; fail "8 workers on machines B and C did not register with the resolver on A"; }

ctl init >"$work/init.txt" 2>&1 || { cat "$work/init.txt"; fail "tpuctl init failed"; }
cat "$work/init.txt"
grep -q "8 cores on 2 hosts" "$work/init.txt" || fail "init did not report 8 cores on 2 hosts"
for m in b c; do
    for c in 0 1 2 3; do
        grep -qE "^[0-9]+ +machine-$m +$c " "$work/init.txt" || fail "core machine-$m/$c is not in the topology"
    done
done
grep -q "$B_IP:" "$work/init.txt" && grep -q "$C_IP:" "$work/init.txt" ||
    fail "the workers do not advertise their machines' addresses ($B_IP, $C_IP)"
say "ok: 8 cores on hosts machine-b and machine-c, initialized from machine A"

# ---- collectives and training across the machines
ctl bench allreduce --min 4K --max 1M --iters 3 --warmup 1 >"$work/bench.txt" 2>&1 ||
    { cat "$work/bench.txt"; fail "all-reduce across the machines failed"; }
cat "$work/bench.txt"
grep -q "on 8 replicas" "$work/bench.txt" || fail "the all-reduce did not run on 8 replicas"
rows=$(grep -cE '^[0-9]+[KM]? ' "$work/bench.txt")
okrows=$(grep -cE '^[0-9]+[KM]? .* OK' "$work/bench.txt")
[ "$rows" -ge 3 ] && [ "$rows" -eq "$okrows" ] || fail "an all-reduce result across the machines is wrong ($okrows of $rows OK)"
say "ok: all-reduce across the machines correct at every size"

TPUEMU_TOKEN_FILE=token on "$A" timeout 120 fashion_mnist --tpu "$TPU" --epochs 2 --data "$data" \
    >"$work/train.txt" 2>"$work/train-err.log" || { cat "$work/train.txt"; fail "fashion_mnist on 8 cores across 2 machines failed"; }
grep -E "^Running on|^Epoch|^test accuracy" "$work/train.txt"
grep -q "with 8 replicas" "$work/train.txt" || fail "fashion_mnist did not run on 8 replicas"
acc=$(sed -n 's/^test accuracy: //p' "$work/train.txt")
[ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "test accuracy '$acc' after 2 epochs is below 0.75"
say "ok: fashion_mnist trained 2 epochs across machines B and C (test accuracy $acc)"

# ---- machine C cut off mid-training
TPUEMU_TOKEN_FILE=token on "$A" timeout 120 fashion_mnist --tpu "$TPU" --epochs 200 --data "$data" \
    >"$work/long.txt" 2>"$work/long-err.log" &
train_pid=$!
ok=0
for _ in $(seq 300); do # up to 60 s for the run to be well into its second epoch
    grep -q "^Epoch 2/200" "$work/long.txt" 2>/dev/null && grep -q "^Epoch 1/200" "$work/long.txt" && { ok=1; break; }
    kill -0 $train_pid 2>/dev/null || break
    sleep 0.2
done
[ $ok -eq 1 ] || { cat "$work/long.txt" "$work/long-err.log"; fail "the long training run did not get going"; }
sleep 0.3
kill -0 $train_pid 2>/dev/null || fail "the long training run ended before the cut"
cut_ms=$(now_ms)
ip -n "$SW" link set veth-c down || fail "cannot take machine C's port down"
say "cut machine C's link (veth-c down on the switch) during epoch $(grep -c '^Epoch' "$work/long.txt")"
rc=0
end_ms=""
for _ in $(seq 300); do # up to 30 s for the run to fail
    if ! kill -0 $train_pid 2>/dev/null; then end_ms=$(now_ms); break; fi
    sleep 0.05
done
[ -n "$end_ms" ] || fail "fashion_mnist was still running 30 s after machine C was cut off"
wait $train_pid
rc=$?
took=$((end_ms - cut_ms))
err=$(cat "$work/long-err.log")
echo "$err"
[ $rc -ne 0 ] || fail "fashion_mnist exited 0 although machine C was cut off"
[ $rc -ne 124 ] || fail "fashion_mnist hung until its timeout"
grep -q "UNAVAILABLE" <<<"$err" || fail "the failure is not UNAVAILABLE"
grep -q "machine-c/[0-3]" <<<"$err" || fail "the failure does not name a core of machine-c"
grep -q "machine-b/[0-3] never sent" <<<"$err" && fail "the failure blames a core of machine-b, which is still connected"
[ "$took" -le "$FAIL_BOUND_MS" ] || fail "the failure took $took ms after the cut (bound $FAIL_BOUND_MS ms)"
say "ok: training failed with UNAVAILABLE naming machine C's core $took ms after the cut"

ok=0
for _ in $(seq 50); do # heartbeat 1 s x dead-after 3: up to 10 s more
    ctl --timeout-ms 2000 cluster >"$work/cluster.txt" 2>&1
    [ "$(grep -cE '^machine-c +[0-3] +DEAD ' "$work/cluster.txt")" -eq 4 ] && { ok=1; break; }
    sleep 0.2
done
cat "$work/cluster.txt"
[ $ok -eq 1 ] || fail "tpuctl cluster does not show machine-c's 4 cores DEAD"
[ "$(grep -cE '^machine-b +[0-3] +(READY|IDLE) ' "$work/cluster.txt")" -eq 4 ] ||
    fail "machine-b's cores are not all alive after C was cut off"
say "ok: tpuctl cluster shows machine-c/0..3 DEAD, machine-b/0..3 alive"

# ---- the rest of the cluster recovers
ctl init --allow-partial --timeout-ms 3000 >"$work/init2.txt" 2>&1 ||
    { cat "$work/init2.txt"; fail "tpuctl init --allow-partial on the surviving cores failed"; }
cat "$work/init2.txt"
grep -q "4 cores on 1 host" "$work/init2.txt" || fail "the partial system is not B's 4 cores"
grep -qE "^[0-9]+ +machine-c " "$work/init2.txt" && fail "a core of machine-c is in the partial topology"
[ "$(grep -c '^missing: machine-c/[0-3] (dead' "$work/init2.txt")" -eq 4 ] ||
    fail "the partial topology does not list machine-c's 4 cores as missing"
ctl bench allreduce --min 4K --max 1M --iters 3 --warmup 1 >"$work/bench2.txt" 2>&1 ||
    { cat "$work/bench2.txt"; fail "all-reduce on the surviving cores failed"; }
grep -q "on 4 replicas" "$work/bench2.txt" || fail "the all-reduce after recovery did not run on 4 replicas"
rows=$(grep -cE '^[0-9]+[KM]? ' "$work/bench2.txt")
okrows=$(grep -cE '^[0-9]+[KM]? .* OK' "$work/bench2.txt")
[ "$rows" -ge 3 ] && [ "$rows" -eq "$okrows" ] || { cat "$work/bench2.txt"; fail "an all-reduce result on the surviving cores is wrong"; }
say "ok: init --allow-partial on machine-b's 4 cores, all-reduce on them correct"
TPUEMU_TOKEN_FILE=token on "$A" timeout 60 bench_train --tpu "$TPU" --cores 4 --batch 128 --seconds 1 \
    --warmup 10 --data "$data" >"$work/train4.txt" 2>"$work/train4-err.log" ||
    { cat "$work/train4.txt"; fail "training on the 4 surviving cores failed"; }
cat "$work/train4.txt"
grep -qE '^\| +4 \| +128 \| +512 \| +[1-9]' "$work/train4.txt" || fail "bench_train printed no row for 4 cores"
say "ok: training on machine-b's 4 cores"

# ---- machine C back
ip -n "$SW" link set veth-c up || fail "cannot bring machine C's port up"
ok=0
for _ in $(seq 75); do # up to 15 s for C's workers to heartbeat again
    ctl --timeout-ms 2000 cluster >"$work/cluster2.txt" 2>&1
    [ "$(grep -cE '^machine-c +[0-3] +(READY|IDLE) ' "$work/cluster2.txt")" -eq 4 ] && { ok=1; break; }
    sleep 0.2
done
[ $ok -eq 1 ] || { cat "$work/cluster2.txt"; fail "machine-c's workers did not come back after its link did"; }
ctl init >"$work/init3.txt" 2>&1 && grep -q "8 cores on 2 hosts" "$work/init3.txt" ||
    { cat "$work/init3.txt"; fail "the whole cluster did not initialize again with machine C back"; }
say "ok: machine C's link back: its 4 cores alive again and the 8-core system initialized"

say "multihost: every check passed"
echo "1 passed, 0 failed"
