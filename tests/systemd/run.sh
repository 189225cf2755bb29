#!/usr/bin/env bash
# The systemd units of deploy/systemd under a real, running systemd: a Debian 12
# container booted with systemd-nspawn (its own systemd as PID 1, the host's
# network shared, every daemon on loopback), set up exactly as docs/operations/systemd.md's
# "systemd" section tells a user, then checked for what a user relies on:
#  - `cmake --install` of the build into the container's /usr/local, docs/operations/systemd.md's
#    install commands run inside it (token, units, env files; the env files
#    edited for a one-machine cluster on loopback), `systemctl daemon-reload`,
#    `systemctl enable --now tpu-resolver` and `tpu-worker@{0..3}`;
#  - all five units active and enabled, the four workers registered with the
#    resolver as the container's hostname (the default host id), cores 0-3;
#  - the token reached the daemons as a credential: each runs with
#    --token-file /run/credentials/UNIT/token, that file holds
#    /etc/tpuemu/token, which only root may read, and the resolver took the
#    workers' signed registrations;
#  - the hardening in effect on the running processes: a dynamic user (not
#    root, one uid for every daemon, its name resolved as tpuemu), no new
#    privileges, no capabilities, a seccomp filter, / read-only;
#  - an all-reduce over the four cores (shared memory between them: the one
#    dynamic user lets the links accept each other) and a short training
#    (fashion_mnist, 1 epoch) run with the installed tpuctl and fashion_mnist;
#  - a worker killed with SIGKILL is restarted by systemd (NRestarts, a new
#    MainPID) and registers again (the resolver's log, tpuctl cluster);
#  - `systemctl stop tpu-worker@3` stops it cleanly (inactive, not failed) and
#    it leaves the cluster (the resolver logs "core left" and no longer lists it);
#  - `journalctl -u tpu-worker@1` shows that worker's log.
# Everything it started (the container, its systemd and daemons, the temp dir)
# goes away on any exit.
#
# The container's root comes from the tarball deploy/make-base-image.sh keeps
# (a debootstrap minbase of Debian 12) with systemd and the daemons' runtime
# libraries added by apt-get inside it; that root is kept as a tarball of its
# own beside it (build-docker/ or $TPUEMU_BASE_CACHE) for the next run.
# Needs root, systemd-nspawn (systemd-container) and nsenter (util-linux).
# About 15 s once both tarballs are there; making them took 49 s (the base,
# debootstrap) and 11 s (systemd and the libraries) more in a fresh clone.
#
#   tests/systemd/run.sh [BUILD_DIR]          (default: build)
#   TPUEMU_SYSTEMD_KEEP=1 tests/systemd/run.sh   keep the temp dir (logs)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
build=${1:-build}
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
cache=${TPUEMU_BASE_CACHE:-$ROOT/build-docker}
# what the container gets beyond the minbase: systemd, its NSS module (the
# dynamic user's name) and the daemons' and clients' shared libraries
PACKAGES="systemd libnss-systemd libuv1 libprotobuf-c1 libsodium23 libdnnl2 zlib1g"
t_start=$(date +%s)
work=
nspawn_pid=
cpid=
passed=0

say() { echo "[$(($(date +%s) - t_start))s] $*"; }
fail() {
    echo "FAIL: $*"
    if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null; then
        echo "--- systemctl status (container)"
        sx systemctl --no-pager --lines=5 status tpu-resolver 'tpu-worker@*' 2>&1 | head -60
    fi
    exit 1
}
ok() { echo "ok: $*"; passed=$((passed + 1)); }

# sx CMD...: run CMD inside the container (all its namespaces)
sx() { nsenter -t "$cpid" -a "$@"; }

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
        # SIGTERM to systemd-nspawn powers the container off (its systemd
        # stops every unit); then it exits
        kill -TERM "$nspawn_pid" 2>/dev/null
        for _ in $(seq 300); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$nspawn_pid" 2>/dev/null; then
            echo "the container did not power off within 30 s; killing it"
            kill -KILL "$nspawn_pid" 2>/dev/null
            [ -n "$cpid" ] && kill -KILL "$cpid" 2>/dev/null
        fi
        wait "$nspawn_pid" 2>/dev/null
    fi
    if [ -n "$work" ]; then
        grep -o " $work[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
        if [ "${TPUEMU_SYSTEMD_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf --one-file-system "$work"; fi
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- what it needs
[ "$(id -u)" -eq 0 ] || fail "this test boots a container with systemd-nspawn, which needs root"
for c in systemd-nspawn nsenter cmake; do
    command -v "$c" >/dev/null || fail "no $c (apt-get install systemd-container util-linux cmake; scripts/lib.sh lists the packages)"
done
for p in tpu-resolver tpu-worker tpuctl fashion_mnist; do
    [ -x "$build/bin/$p" ] || fail "$build/bin/$p is missing (build the tree first)"
done
[ -f "$data/train-images-idx3-ubyte.gz" ] || fail "$data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"

# ---- the container's root: the base tarball plus systemd and the libraries
base=$(deploy/make-base-image.sh --tarball) || fail "cannot make the base root (deploy/make-base-image.sh --tarball)"
sum=$(echo "$PACKAGES" | md5sum | cut -c1-8)
sdtar=$cache/debian-bookworm-systemd-$sum.tar
if [ ! -s "$sdtar" ] || [ "$base" -nt "$sdtar" ]; then
    say "making $sdtar: $(basename "$base") + apt-get install $PACKAGES"
    mk=$(mktemp -d "$cache/sdroot.XXXXXX") || fail "cannot make a temp dir in $cache"
    mkdir "$mk/root" && tar -C "$mk/root" -xf "$base" || { rm -rf "$mk"; fail "cannot unpack $base"; }
    if ! timeout 900 systemd-nspawn --register=no --keep-unit -q -D "$mk/root" --resolv-conf=copy-host --pipe \
        sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES" \
        </dev/null >"$mk/apt.log" 2>&1; then
        tail -n 15 "$mk/apt.log"
        rm -rf "$mk"
        fail "apt-get install in the container's root failed (is Debian's mirror reachable?)"
    fi
    rm -rf "$mk/root/var/lib/apt/lists/"* "$mk/root/var/cache/apt/"*.bin "$mk/root/var/cache/apt/archives/"*.deb
    tar -C "$mk/root" --numeric-owner -cf "$sdtar.tmp" . || { rm -rf "$mk" "$sdtar.tmp"; fail "cannot write $sdtar"; }
    mv "$sdtar.tmp" "$sdtar"
    rm -rf "$mk"
fi

work=$(mktemp -d /tmp/tpuemu-systemd.XXXXXX) || fail "cannot make a temp dir"
root=$work/root
mkdir "$root" && tar -C "$root" -xf "$sdtar" || fail "cannot unpack $sdtar"
host=tpuemu-sd-$$ # the container's hostname: the workers' default host id
echo "$host" >"$root/etc/hostname"
# docs/operations/systemd.md's first step on each machine: the daemons, library and clients under /usr/local
DESTDIR=$root cmake --install "$build" --prefix /usr/local >"$work/install.log" 2>&1 ||
    { tail -5 "$work/install.log"; fail "DESTDIR=$root cmake --install $build failed"; }

# ---- boot
say "booting the container (systemd-nspawn -b, the host's network)"
systemd-nspawn --register=no --keep-unit -q -D "$root" -b --machine="$host" \
    --bind-ro="$ROOT:/src" --bind-ro="$data:/usr/share/datasets/fashion-mnist" \
    </dev/null >"$work/console.log" 2>&1 &
nspawn_pid=$!
for _ in $(seq 300); do # 30 s
    kill -0 "$nspawn_pid" 2>/dev/null || break
    cpid=$(ps -o pid= --ppid "$nspawn_pid" | head -1 | tr -d ' ')
    [ -n "$cpid" ] && [ "$(cat /proc/"$cpid"/comm 2>/dev/null)" = systemd ] && break
    cpid=
    sleep 0.1
done
if [ -z "$cpid" ]; then
    tail -n 20 "$work/console.log"
    fail "systemd-nspawn did not start the container's systemd within 30 s (see its output above)"
fi
state=
for _ in $(seq 240); do # 120 s: its manager socket appears, then "starting" ends
    state=$(timeout 10 nsenter -t "$cpid" -a systemctl is-system-running 2>&1)
    case $state in running | degraded | maintenance | stopping | offline) break ;; esac
    kill -0 "$nspawn_pid" 2>/dev/null || { tail -n 20 "$work/console.log"; fail "the container stopped while booting"; }
    sleep 0.5
done
if [ "$state" != running ]; then
    sx systemctl --failed --no-legend 2>&1 | head
    fail "the container's systemd is '$state' after booting, not 'running'"
fi
ok "a real systemd is running in the container: $(sx systemctl --version | head -1) as PID 1 of $host"

# ---- install as docs/operations/systemd.md says (run inside the container, in the repository)
port=$((20000 + RANDOM % 12000)) # the host's network: a free loopback port below the ephemeral range
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
say "installing the units as docs/operations/systemd.md says; the resolver on 127.0.0.1:$port"
cat >"$root/root/setup.sh" <<EOF
set -eu
cd /src
head -c 32 /dev/urandom | base64 > /root/token
install -d /etc/tpuemu && install -m 600 /root/token /etc/tpuemu/token
install -m 644 deploy/systemd/*.service /etc/systemd/system/
install -m 644 deploy/systemd/resolver.env deploy/systemd/worker.env /etc/tpuemu/
# edit: one machine, every daemon on loopback
sed -i 's/^TPUEMU_LISTEN=.*/TPUEMU_LISTEN=127.0.0.1:$port/' /etc/tpuemu/resolver.env
sed -i 's/^TPUEMU_RESOLVER=.*/TPUEMU_RESOLVER=127.0.0.1:$port/; s/^TPUEMU_WORKER_LISTEN=.*/TPUEMU_WORKER_LISTEN=127.0.0.1/' /etc/tpuemu/worker.env
grep -qx 'TPUEMU_LISTEN=127.0.0.1:$port' /etc/tpuemu/resolver.env
grep -qx 'TPUEMU_RESOLVER=127.0.0.1:$port' /etc/tpuemu/worker.env
grep -qx 'TPUEMU_WORKER_LISTEN=127.0.0.1' /etc/tpuemu/worker.env
systemctl daemon-reload
systemctl enable --now tpu-resolver
systemctl enable --now tpu-worker@{0..3}
EOF
sx bash /root/setup.sh >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; fail "the install commands of docs/operations/systemd.md failed in the container"; }
units=(tpu-resolver tpu-worker@0 tpu-worker@1 tpu-worker@2 tpu-worker@3)
active=0
for _ in $(seq 60); do # 30 s
    [ "$(sx systemctl is-active "${units[@]}" | grep -cx active)" -eq 5 ] && { active=1; break; }
    sleep 0.5
done
[ $active -eq 1 ] || fail "not all five units are active within 30 s: $(sx systemctl is-active "${units[@]}" | tr '\n' ' ')"
[ "$(sx systemctl is-enabled "${units[@]}" | grep -cx enabled)" -eq 5 ] ||
    fail "not all five units are enabled: $(sx systemctl is-enabled "${units[@]}" | tr '\n' ' ')"
ok "systemctl enable --now: tpu-resolver and tpu-worker@0..3 active and enabled"

# tpuctl as installed, in the container, with the token of /root (as root)
tpuctl() { sx /usr/local/bin/tpuctl --tpu "127.0.0.1:$port" --token-file /root/token "$@"; }
registered=0
for _ in $(seq 120); do # 60 s
    tpuctl cluster >"$work/cluster0.txt" 2>&1 &&
        [ "$(grep -cE "^$host +[0-3] +IDLE " "$work/cluster0.txt")" -eq 4 ] && { registered=1; break; }
    sleep 0.5
done
[ $registered -eq 1 ] || fail "the resolver does not list 4 idle cores of host $host within 60 s: $(cat "$work/cluster0.txt")"
ok "the four workers registered as $host/0..3 (the hostname as host id)"

# ---- the credential
mainpid() { sx systemctl show -p MainPID --value "$1"; }
tok_mode=$(sx stat -c '%a %U' /etc/tpuemu/token)
[ "$tok_mode" = "600 root" ] || fail "/etc/tpuemu/token is '$tok_mode', not 600 root as docs/operations/systemd.md installs it"
for u in tpu-resolver.service tpu-worker@0.service tpu-worker@3.service; do
    pid=$(mainpid "$u")
    args=$(sx cat "/proc/$pid/cmdline" | tr '\0' ' ')
    [[ $args == *"--token-file /run/credentials/$u/token"* ]] ||
        fail "$u runs '$args', not with --token-file /run/credentials/$u/token"
    sx cmp -s "/run/credentials/$u/token" /etc/tpuemu/token ||
        fail "$u: /run/credentials/$u/token is not /etc/tpuemu/token"
done
ok "the token reaches each daemon as its credential /run/credentials/UNIT/token (/etc/tpuemu/token is 600 root)"

# ---- the hardening, on the running processes
declare -A uid_of=()
for u in "${units[@]}"; do
    pid=$(mainpid "$u")
    st=$(sx cat "/proc/$pid/status") || fail "cannot read /proc/$pid/status of $u"
    uid=$(awk '/^Uid:/ { print $2 }' <<<"$st")
    [ "$(awk '/^Uid:/ { print $2, $3, $4, $5 }' <<<"$st")" = "$uid $uid $uid $uid" ] || fail "$u: uids $(grep ^Uid: <<<"$st")"
    [ "$uid" -ge 61184 ] && [ "$uid" -le 65519 ] || fail "$u runs as uid $uid, not a dynamic user (61184-65519)"
    grep -qE '^NoNewPrivs:[[:space:]]+1$' <<<"$st" || fail "$u: no NoNewPrivs ($(grep ^NoNewPrivs <<<"$st"))"
    grep -qE '^Seccomp:[[:space:]]+2$' <<<"$st" || fail "$u: no seccomp filter ($(grep ^Seccomp: <<<"$st"))"
    grep -qE '^CapEff:[[:space:]]+0+$' <<<"$st" || fail "$u: capabilities $(grep ^CapEff <<<"$st")"
    grep -qE '^CapBnd:[[:space:]]+0+$' <<<"$st" || fail "$u: bounding set $(grep ^CapBnd <<<"$st")"
    rootopts=$(sx awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | tail -1)
    [[ ,$rootopts, == *,ro,* ]] || fail "$u: / is mounted '$rootopts' for it, not read-only (ProtectSystem=strict)"
    uid_of[$u]=$uid
done
for u in tpu-worker@1 tpu-worker@2 tpu-worker@3 tpu-resolver; do
    [ "${uid_of[$u]}" = "${uid_of[tpu-worker@0]}" ] ||
        fail "$u runs as uid ${uid_of[$u]}, tpu-worker@0 as ${uid_of[tpu-worker@0]}: one user tpuemu for every daemon wanted"
done
name=$(sx getent passwd "${uid_of[tpu-worker@0]}" | cut -d: -f1)
[ "$name" = tpuemu ] || fail "uid ${uid_of[tpu-worker@0]} is '$name', not the dynamic user tpuemu"
ok "hardening in effect: dynamic user tpuemu (uid ${uid_of[tpu-worker@0]}, one for the 5 daemons), NoNewPrivs, no capabilities, seccomp, / read-only"

# ---- an all-reduce and a training run through them
tpuctl bench allreduce --init --min 4K --max 1M --iters 2 --warmup 1 >"$work/bench.txt" 2>&1 ||
    { cat "$work/bench.txt"; fail "tpuctl bench allreduce on the four cores failed"; }
rows=$(grep -cE '^[0-9]+[KM]? ' "$work/bench.txt")
[ "$rows" -ge 3 ] && [ "$(grep -E '^[0-9]+[KM]? ' "$work/bench.txt" | grep -vc ' OK ')" -eq 0 ] ||
    { cat "$work/bench.txt"; fail "the all-reduce's results are not all OK"; }
grep -qE '^# all-reduce on 4 replicas' "$work/bench.txt" || { cat "$work/bench.txt"; fail "the all-reduce did not run on 4 replicas"; }
grep -q '/shm ' "$work/bench.txt" || { cat "$work/bench.txt"; fail "the cores did not use shared memory between them (one dynamic user for all)"; }
ok "an all-reduce on the 4 cores: $rows sizes, every result OK, over shared memory"
say "fashion_mnist --epochs 1 in the container"
sx env TPU_NAME="grpc://127.0.0.1:$port" TPUEMU_TOKEN_FILE=/root/token \
    timeout 300 /usr/local/bin/fashion_mnist --epochs 1 --logdir /tmp/logs >"$work/train.txt" 2>&1 ||
    { tail -n 20 "$work/train.txt"; fail "fashion_mnist on the four cores failed"; }
acc=$(sed -n 's/^test accuracy: //p' "$work/train.txt")
grep -q "with 4 replicas" "$work/train.txt" || { head -5 "$work/train.txt"; fail "fashion_mnist did not run on 4 replicas"; }
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.7) }' || fail "test accuracy '$acc' after 1 epoch is below 0.7"
ok "fashion_mnist trained 1 epoch on the 4 cores: test accuracy $acc"

# ---- SIGKILL: systemd restarts the worker and it registers again
u=tpu-worker@2.service
old=$(mainpid $u)
nr=$(sx systemctl show -p NRestarts --value $u)
sx bash -c "kill -KILL $old" || fail "cannot kill $u's process $old"
say "killed $u (pid $old) with SIGKILL"
back=0
for _ in $(seq 120); do # 60 s
    new=$(mainpid $u)
    [ "$(sx systemctl is-active $u)" = active ] && [ "${new:-0}" -gt 0 ] && [ "$new" != "$old" ] &&
        tpuctl cluster 2>/dev/null | grep -qE "^$host +2 +[A-Z]+ .* $new +tcp://" && { back=1; break; }
    sleep 0.5
done
[ $back -eq 1 ] || fail "$u was not restarted and registered again within 60 s (MainPID $(mainpid $u), $(sx systemctl is-active $u)): $(tpuctl cluster 2>&1)"
[ "$(sx systemctl show -p NRestarts --value $u)" -eq $((nr + 1)) ] || fail "$u: NRestarts $(sx systemctl show -p NRestarts --value $u), not $((nr + 1))"
sx journalctl -u tpu-resolver --no-pager -o cat >"$work/resolver.log"
grep -qE "msg=\"core re-registered\" host=\"?$host\"? core=2 old_pid=$old new_pid=$new" "$work/resolver.log" ||
    { tail -n 5 "$work/resolver.log"; fail "the resolver's journal does not show core 2 registering again (old_pid=$old new_pid=$new)"; }
ok "SIGKILL of $u: systemd restarted it (pid $old -> $new, NRestarts $((nr + 1))) and it registered again"

# ---- systemctl stop: the worker leaves the cluster
u=tpu-worker@3.service
pid=$(mainpid $u)
sx systemctl stop $u || fail "systemctl stop $u failed"
st=$(sx systemctl is-active $u)
[ "$st" = inactive ] || fail "$u is '$st' after systemctl stop, not inactive"
[ "$(sx systemctl show -p Result --value $u)" = success ] || fail "$u: Result=$(sx systemctl show -p Result --value $u) after stop"
gone=0
for _ in $(seq 60); do # 30 s
    tpuctl cluster >"$work/cluster1.txt" 2>&1 && ! grep -qE "^$host +3 " "$work/cluster1.txt" &&
        [ "$(grep -cE "^$host +[0-2] " "$work/cluster1.txt")" -eq 3 ] && { gone=1; break; }
    sleep 0.5
done
[ $gone -eq 1 ] || fail "after systemctl stop $u the resolver still lists core 3, or not cores 0-2: $(cat "$work/cluster1.txt")"
sx journalctl -u tpu-resolver --no-pager -o cat >"$work/resolver.log"
grep -qE "msg=\"core left\" host=\"?$host\"? core=3 pid=$pid" "$work/resolver.log" ||
    { tail -n 5 "$work/resolver.log"; fail "the resolver's journal does not show core 3 leaving"; }
ok "systemctl stop $u: inactive (Result=success), the core left the cluster (3 cores listed)"

# ---- the journal
pid1=$(mainpid tpu-worker@1.service)
sx journalctl -u tpu-worker@1 --no-pager -o cat >"$work/worker1.log"
grep -E 'daemon=worker' "$work/worker1.log" >"$work/worker1.lines"
grep -qE "^ts=[^ ]+ level=info daemon=worker pid=$pid1 msg=\"registered" "$work/worker1.lines" ||
    { head -5 "$work/worker1.log"; fail "journalctl -u tpu-worker@1 does not show worker 1 (pid $pid1) registering"; }
[ "$(grep -vc " pid=$pid1 " "$work/worker1.lines")" -eq 0 ] ||
    fail "journalctl -u tpu-worker@1 shows lines of another process: $(grep -v -m1 " pid=$pid1 " "$work/worker1.lines")"
grep -q "Started tpu-worker@1.service" "$work/worker1.log" || fail "journalctl -u tpu-worker@1 does not show systemd starting it"
ok "journalctl -u tpu-worker@1: its $(wc -l <"$work/worker1.lines") log lines (pid $pid1), e.g. $(grep -m1 'msg="registered' "$work/worker1.lines" | cut -d' ' -f2- | cut -c1-100)"

say "done"
echo "$passed passed, 0 failed: the units under systemd $(sx systemctl --version | head -1 | awk '{print $2}') in $(($(date +%s) - t_start)) s"
