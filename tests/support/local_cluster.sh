# Sourced by the shell tests: a resolver and 4 workers (hosts host0, host1 x
# cores 0, 1; v3) on a free loopback port, initialized, and stopped on exit.
#
#   . tests/support/local_cluster.sh
#   start_local_cluster BIN WORKDIR     # sets tpu=127.0.0.1:PORT; logs in WORKDIR
# WORKDIR is removed on exit.

_lc_pids=()
_lc_work=
_lc_cleanup() {
    for p in "${_lc_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${_lc_pids[@]}"; do wait "$p" 2>/dev/null; done
    [ -n "$_lc_work" ] && rm -rf "$_lc_work"
}

start_local_cluster() { # bin, workdir
    local bin=$1 port
    _lc_work=$2
    trap _lc_cleanup EXIT
    port=$((20000 + RANDOM % 20000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    tpu=127.0.0.1:$port
    "$bin/tpu-resolver" --listen "$tpu" --heartbeat-ms 200 2>"$_lc_work/resolver.log" &
    _lc_pids+=($!)
    for h in 0 1; do
        for c in 0 1; do
            "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type v3 \
                2>"$_lc_work/worker-$h-$c.log" &
            _lc_pids+=($!)
        done
    done
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    "$bin/tpuctl" --tpu "$tpu" init --expect 4 --timeout-ms 20000 >/dev/null || {
        echo "FAIL: the cluster did not come up"
        tail -n 5 "$_lc_work"/*.log
        exit 1
    }
}
