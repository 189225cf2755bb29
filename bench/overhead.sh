#!/usr/bin/env bash
# What an always-on part of the workers costs a training step: bench/train.sh
# with it off and on, run alternately ROUNDS times in the same session so that
# the machine's noise hits both alike; prints the median step time of each and
# their ratio.
#   profile: the event rings off (--trace-events 0) and on (the default);
#   metrics: no metrics port, and every worker's /metrics fetched every 1 s
#            with curl (Prometheus' default is every 15 s). Every 100 ms cost
#            14 % on a 2-core machine, where the 40 curl processes a second
#            compete with the 4 workers for the CPUs; how much of that is
#            the daemons' answering is not separated.
#
#   bench/overhead.sh profile|metrics BUILD_DIR [CORES] [BATCH] [ROUNDS]
set -euo pipefail
usage="usage: bench/overhead.sh profile|metrics BUILD_DIR [CORES] [BATCH] [ROUNDS]"
what=${1:?$usage}
build=${2:?$usage}
cores=${3:-4}
batch=${4:-128}
rounds=${5:-5}
here=$(cd "$(dirname "$0")" && pwd)
case $what in
profile) off_env=(TPUEMU_TRACE_EVENTS=0) on_env=(TPUEMU_TRACE_EVENTS=65536)
    off_name="off (--trace-events 0)" on_name="on (65536 events)" ;;
metrics) off_env=(SCRAPE_MS=0) on_env=(SCRAPE_MS=1000)
    off_name="no metrics port" on_name="scraped every 1 s" ;;
*) echo "$usage" >&2; exit 2 ;;
esac
off=()
on=()
step_ms() { # the step ms column of train.sh's one table row
    awk -F'|' '/^\| +[0-9]+ +\| +[0-9]+ +\|/ {gsub(/ /, "", $6); print $6; exit}'
}
for ((i = 0; i < rounds; i++)); do
    off+=("$(env "${off_env[@]}" "$here/train.sh" "$build" "$cores" "$batch" 2>&1 | step_ms)")
    on+=("$(env "${on_env[@]}" "$here/train.sh" "$build" "$cores" "$batch" 2>&1 | step_ms)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
moff=$(median "${off[@]}")
mon=$(median "${on[@]}")
echo "$what overhead: $cores cores, per-core batch $batch, $rounds alternating rounds of bench/train.sh"
echo
echo "| $what | step ms (median) | each round |"
echo "|---|---:|---|"
echo "| $off_name | $moff | ${off[*]} |"
echo "| $on_name | $mon | ${on[*]} |"
echo
awk -v a="$mon" -v b="$moff" 'BEGIN {printf "on / off = %.3f (%+.1f %%)\n", a / b, (a / b - 1) * 100}'
