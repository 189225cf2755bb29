# Sourced by the shell tests: daemons on free loopback ports, stopped on exit.
#
#   . tests/support/local_cluster.sh
#   start_local_cluster BIN WORKDIR [HEARTBEAT_MS]
#                                    # a resolver and 4 workers (hosts host0, host1 x
#                                    # cores 0, 1; v3), initialized; tpu=127.0.0.1:PORT;
#                                    # logs in WORKDIR, which is removed on exit;
#                                    # heartbeats every HEARTBEAT_MS (default 200)
#   lc_start_resolver BIN LOG ARGS.. # just a resolver; tpu=127.0.0.1:PORT; its pid
#                                    # joins those lc_cleanup stops
# A test with a trap of its own calls lc_cleanup from it.

_lc_pids=()
_lc_work=
lc_cleanup() {
    for p in "${_lc_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${_lc_pids[@]}"; do wait "$p" 2>/dev/null; done
    _lc_pids=()
    [ -n "$_lc_work" ] && rm -rf "$_lc_work"
}

# lc_claim_port VAR sets VAR to a port below the ephemeral range (32768-60999),
# so that no outgoing connection of a test running beside this one takes it
# between the check and the bind; claimed, like the C tests' ports, by a lock
# on a file named after it, which this shell holds until it exits (so call it
# in this shell, not in $(...)).
lc_claim_port() {
    local _lcp _lcdir=/tmp/tpuemu-test-ports-$(id -u) _lcfd _lctry # names no caller uses
    mkdir -p "$_lcdir"
    for ((_lctry = 0; _lctry < 1000; _lctry++)); do
        _lcp=$((20000 + RANDOM % 12000))
        exec {_lcfd}>>"$_lcdir/$_lcp" || continue
        if flock -n "$_lcfd" && ! (exec 3<>"/dev/tcp/127.0.0.1/$_lcp") 2>/dev/null; then
            printf -v "$1" %s "$_lcp"
            return 0
        fi
        exec {_lcfd}>&-
    done
    echo "FAIL: no free loopback port in 20000-31999" >&2
    exit 1
}

lc_start_resolver() { # bin, log, extra args...
    local bin=$1 log=$2 try t pid port
    shift 2
    for try in 1 2 3 4 5; do # a program outside the tests may still take the port first
        lc_claim_port port
        tpu=127.0.0.1:$port
        "$bin/tpu-resolver" --listen "$tpu" "$@" 2>>"$log" &
        pid=$!
        for ((t = 0; t < 100; t++)); do
            kill -0 "$pid" 2>/dev/null || break
            if (exec 3<>"/dev/tcp/127.0.0.1/${tpu#*:}") 2>/dev/null; then
                _lc_pids+=("$pid")
                return 0
            fi
            sleep 0.05
        done
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    echo "FAIL: tpu-resolver did not start: $(tail -n 2 "$log")"
    exit 1
}

start_local_cluster() { # bin, workdir, [heartbeat ms]
    local bin=$1
    _lc_work=$2
    trap lc_cleanup EXIT
    lc_start_resolver "$bin" "$_lc_work/resolver.log" --heartbeat-ms "${3:-200}"
    for h in 0 1; do
        for c in 0 1; do
            "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type v3 \
                2>"$_lc_work/worker-$h-$c.log" &
            _lc_pids+=($!)
        done
    done
    "$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || {
        echo "FAIL: the cluster did not come up"
        tail -n 5 "$_lc_work"/*.log
        exit 1
    }
}
