#!/usr/bin/env bash
# A real Prometheus (Debian's) scraping a training cluster, through the
# scrape configuration a user takes from deploy/prometheus/local.yml, and the
# dashboard's PromQL queries of docs/operations/metrics.md asked of its HTTP API:
#  - promtool accepts deploy/prometheus/local.yml and compose.yml;
#  - a resolver and 4 workers (2 hosts x 2 cores) on loopback, each with its
#    metrics port; Prometheus on a loopback port with local.yml, its targets
#    mapped to those ports and its interval cut from 15 s to 1 s (nothing
#    else changed); every target must be up;
#  - while bench_train trains on the 4 cores: the step rate and the
#    all-reduced bytes per second are above 0, the cores by state are 4 READY,
#    the step time's 90th percentile is a time between 0 and 5 s;
#  - after it: each core's steps and all-reduced bytes in Prometheus are
#    exactly what that worker's /metrics says, the same on every core (each
#    core runs every step), and at least the steps bench_train measured;
#  - a worker killed with SIGKILL: the cores by state show 1 DEAD and its
#    target is down.
# Every query the test asks is one docs/operations/metrics.md shows. Fails saying why when
# Prometheus cannot start. Everything it started stops on any exit.
#
#   tests/prometheus/run.sh [BUILD_DIR]      (default: build)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
build=${1:-build}
bin=$(cd "$build/bin" 2>/dev/null && pwd) || { echo "FAIL: no $build/bin (build the tree first)"; exit 1; }
t_start=$(date +%s)
passed=0
prom_pid=
train_pid=
work=$(mktemp -d /tmp/tpuemu-prometheus.XXXXXX)
. tests/support/local_cluster.sh

say() { echo "[$(($(date +%s) - t_start))s] $*"; }
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() {
    echo "FAIL: $*"
    [ -f "$work/prometheus.log" ] && { echo "--- prometheus (last lines)"; tail -n 5 "$work/prometheus.log"; }
    exit 1
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$train_pid" ] && kill "$train_pid" 2>/dev/null
    if [ -n "$prom_pid" ]; then
        kill -TERM "$prom_pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$prom_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$prom_pid" 2>/dev/null
        wait "$prom_pid" 2>/dev/null
    fi
    lc_cleanup
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for c in prometheus promtool curl python3; do
    command -v "$c" >/dev/null || fail "no $c (apt-get install prometheus curl python3; scripts/lib.sh lists the packages)"
done
for p in tpu-resolver tpu-worker bench_train; do
    [ -x "$bin/$p" ] || fail "$bin/$p is missing (build the tree first)"
done

# ---- the configurations
for f in deploy/prometheus/local.yml deploy/prometheus/compose.yml; do
    promtool check config "$f" >"$work/promtool.txt" 2>&1 || { cat "$work/promtool.txt"; fail "promtool refuses $f"; }
done
ok "promtool check config: deploy/prometheus/local.yml and compose.yml are valid"

# ---- the cluster, every daemon with a metrics port
lc_claim_port rmp
lc_start_resolver "$bin" "$work/resolver.log" --metrics-port "$rmp"
declare -a wmp=() wpid=()
i=0
for h in 0 1; do
    for c in 0 1; do
        lc_claim_port p
        wmp+=("$p")
        "$bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --metrics-port "$p" \
            2>"$work/worker-$h-$c.log" &
        wpid+=($!)
        _lc_pids+=($!)
        i=$((i + 1))
    done
done

# ---- Prometheus with deploy/prometheus/local.yml, its ports mapped to the test's
lc_claim_port pp
python3 - deploy/prometheus/local.yml "$work/prometheus.yml" "$rmp" "${wmp[@]}" <<'PYEOF' || fail "deploy/prometheus/local.yml is not the configuration the test expects (see above)"
import sys, yaml
src, dst, rmp, *wmp = sys.argv[1:]
c = yaml.safe_load(open(src))
ports = {9470: rmp, **{9471 + i: p for i, p in enumerate(wmp)}}
jobs = {j["job_name"]: j for j in c["scrape_configs"]}
want = {"tpuemu-resolver": ["127.0.0.1:9470"], "tpuemu-worker": [f"127.0.0.1:{9471 + i}" for i in range(4)]}
for name, targets in want.items():
    got = [t for sc in jobs.get(name, {}).get("static_configs", []) for t in sc["targets"]]
    if got != targets:
        print(f"  job {name}: targets {got}, the test expects {targets}")
        sys.exit(1)
    for sc in jobs[name]["static_configs"]:
        sc["targets"] = [f"127.0.0.1:{ports[int(t.rsplit(':', 1)[1])]}" for t in sc["targets"]]
c["global"]["scrape_interval"] = "1s"
c["global"]["evaluation_interval"] = "1s"
yaml.safe_dump(c, open(dst, "w"))
PYEOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$pp" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
api=http://127.0.0.1:$pp
ready=0
for _ in $(seq 120); do # 60 s
    kill -0 "$prom_pid" 2>/dev/null || { wait "$prom_pid"; fail "Prometheus could not start (exit $?): $(grep -iE 'err|fail' "$work/prometheus.log" | tail -n 3)"; }
    curl -fsS --max-time 5 "$api/-/ready" >/dev/null 2>&1 && { ready=1; break; }
    sleep 0.5
done
[ $ready -eq 1 ] || fail "Prometheus did not become ready on 127.0.0.1:$pp within 60 s"
say "Prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') ready on 127.0.0.1:$pp"

# q QUERY: ask the HTTP API; one line per series: "label=value,... VALUE"
# (sorted labels, without the metric's name and the target's address)
q() {
    curl -fsS --max-time 10 --get --data-urlencode "query=$1" "$api/api/v1/query" 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
if r.get("status") != "success":
    sys.exit(1)
for s in r["data"]["result"]:
    m = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k not in ("__name__", "instance"))
    print(m or "-", s["value"][1])'
}
# qv QUERY: the value of a query that has one series
qv() { q "$1" | awk 'NR == 1 { print $2 }'; }
gt() { awk -v a="${1:-x}" -v b="$2" 'BEGIN { exit !(a != "x" && a != "NaN" && a + 0 > b + 0) }'; }

up=0
for _ in $(seq 120); do # 60 s
    [ "$(q 'up{job=~"tpuemu-.*"}' | awk '$2 == 1' | wc -l)" -eq 5 ] && { up=1; break; }
    sleep 0.5
done
[ $up -eq 1 ] || fail "not every target is up within 60 s: $(q 'up{job=~"tpuemu-.*"}' | tr '\n' ';')"
ok "Prometheus scrapes the resolver and the 4 workers: 5 targets up"

# ---- while training
Q_STEPS='avg(rate(tpuemu_worker_train_steps_total[1m]))'
Q_BYTES='sum(rate(tpuemu_worker_allreduce_bytes_total[1m]))'
Q_CORES='sum by (state) (tpuemu_resolver_cores)'
Q_P90='histogram_quantile(0.9, sum by (le) (rate(tpuemu_worker_step_seconds_bucket[1m])))'
for query in "$Q_STEPS" "$Q_BYTES" "$Q_CORES" "$Q_P90" 'up{job=~"tpuemu-.*"}'; do
    grep -qF -- "$query" docs/operations/metrics.md || fail "docs/operations/metrics.md does not show the query $query"
done
say "bench_train on the 4 cores for 15 s"
timeout 300 "$bin/bench_train" --tpu "$tpu" --cores 4 --batch 32 --seconds 15 --warmup 20 >"$work/train.txt" 2>&1 &
train_pid=$!
seen=0
for _ in $(seq 120); do # 60 s, while it trains
    kill -0 "$train_pid" 2>/dev/null || break
    steps=$(qv "$Q_STEPS") bytes=$(qv "$Q_BYTES") p90=$(qv "$Q_P90")
    ready=$(q "$Q_CORES" | awk '$1 == "state=READY" { print $2 }')
    if gt "$steps" 0 && gt "$bytes" 0 && [ "$ready" = 4 ] && gt "$p90" 0 && ! gt "$p90" 5; then seen=1; break; fi
    sleep 0.5
done
[ $seen -eq 1 ] || fail "while training, Prometheus did not show steps/s > 0, all-reduced bytes/s > 0, 4 READY cores and a step p90 in (0, 5] s within 60 s (last: steps/s '$steps', bytes/s '$bytes', READY '$ready', p90 '$p90')"
ok "during training: $(printf '%.1f steps/s, %.3g bytes/s all-reduced' "$steps" "$bytes"), 4 cores READY, step time p90 $(printf '%.2g' "$p90") s"
wait "$train_pid"
trc=$?
train_pid=
[ $trc -eq 0 ] || { tail -n 5 "$work/train.txt"; fail "bench_train exited $trc"; }
# the column headed "steps", wherever bench_train's table puts it
measured=$(awk -F'|' '$2 ~ /^ *cores *$/ { for (i = 2; i < NF; i++) { h = $i; gsub(/^ +| +$/, "", h); if (h == "steps") c = i } }
    c && NF > 5 && $2 ~ /^ *4 *$/ { v = $c; gsub(/ /, "", v); print v }' "$work/train.txt" | tail -1)
[[ "$measured" =~ ^[0-9]+$ ]] || { cat "$work/train.txt"; fail "no steps column in bench_train's output (read '$measured')"; }

# ---- after: Prometheus' numbers are the workers' own
direct() { # metric: "host=..,core=.. VALUE" from each worker's /metrics
    local p
    for p in "${wmp[@]}"; do
        curl -fsS --max-time 5 "http://127.0.0.1:$p/metrics" | sed -n "s/^$1{host=\"\\([^\"]*\\)\",core=\"\\([^\"]*\\)\"} \\(.*\\)$/core=\\2,host=\\1 \\3/p"
    done | sort
}
same=0
for _ in $(seq 60); do # 30 s: a scrape after the last step
    d_steps=$(direct tpuemu_worker_train_steps_total) d_bytes=$(direct tpuemu_worker_allreduce_bytes_total)
    p_steps=$(q 'tpuemu_worker_train_steps_total' | sed 's/job=tpuemu-worker//; s/,,/,/; s/,$//; s/, / /' | sort)
    p_bytes=$(q 'tpuemu_worker_allreduce_bytes_total' | sed 's/job=tpuemu-worker//; s/,,/,/; s/,$//; s/, / /' | sort)
    [ "$(wc -l <<<"$d_steps")" -eq 4 ] && [ "$d_steps" = "$p_steps" ] && [ "$d_bytes" = "$p_bytes" ] && { same=1; break; }
    sleep 0.5
done
[ $same -eq 1 ] || fail "Prometheus' steps and bytes are not the workers' own: /metrics: $(tr '\n' ';' <<<"$d_steps $d_bytes"), Prometheus: $(tr '\n' ';' <<<"$p_steps $p_bytes")"
[ "$(awk '{ print $2 }' <<<"$d_steps" | sort -u | wc -l)" -eq 1 ] || fail "the cores ran different numbers of steps: $(tr '\n' ';' <<<"$d_steps")"
[ "$(awk '{ print $2 }' <<<"$d_bytes" | sort -u | wc -l)" -eq 1 ] || fail "the cores all-reduced different byte counts: $(tr '\n' ';' <<<"$d_bytes")"
per_core=$(awk 'NR == 1 { print $2 }' <<<"$d_steps")
[ "$per_core" -ge "$measured" ] || fail "each core ran $per_core steps, fewer than the $measured bench_train measured"
ok "after training: every core's steps ($per_core, bench_train measured $measured after its warm-up) and all-reduced bytes ($(awk 'NR == 1 { print $2 }' <<<"$d_bytes")) in Prometheus equal its /metrics"

# ---- a worker killed: the cores by state follow
kill -KILL "${wpid[3]}"
wait "${wpid[3]}" 2>/dev/null
say "killed worker host1/1 (pid ${wpid[3]}) with SIGKILL"
dead=0
for _ in $(seq 120); do # 60 s: 3 missed heartbeats, then a scrape
    cores=$(q "$Q_CORES")
    [ "$(awk '$1 == "state=DEAD" { print $2 }' <<<"$cores")" = 1 ] &&
        [ "$(q 'up{job=~"tpuemu-.*"}' | awk '$2 == 0' | wc -l)" -eq 1 ] && { dead=1; break; }
    sleep 0.5
done
[ $dead -eq 1 ] || fail "after the kill Prometheus does not show 1 DEAD core and 1 target down within 60 s: $(tr '\n' ';' <<<"$cores")"
ok "a worker killed: cores by state $(tr '\n' ' ' <<<"$cores"| sed 's/state=//g'), its target down"

say "done"
echo "$passed passed, 0 failed: Prometheus on a training cluster in $(($(date +%s) - t_start)) s"
