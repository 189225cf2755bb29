#!/usr/bin/env bash
# What the profiler's always-on recording costs: bench/train.sh with the
# workers' event rings off (--trace-events 0) and on (the default), run
# alternately ROUNDS times in the same session so that the machine's noise
# hits both alike; prints the median step time of each and their ratio.
#
#   bench/profile_overhead.sh BUILD_DIR [CORES] [BATCH] [ROUNDS]
set -euo pipefail
build=${1:?usage: bench/profile_overhead.sh BUILD_DIR [CORES] [BATCH] [ROUNDS]}
cores=${2:-4}
batch=${3:-128}
rounds=${4:-5}
here=$(cd "$(dirname "$0")" && pwd)
off=()
on=()
step_ms() { # the step ms column of train.sh's one table row
    awk -F'|' '/^\| +[0-9]+ +\| +[0-9]+ +\|/ {gsub(/ /, "", $6); print $6; exit}'
}
for ((i = 0; i < rounds; i++)); do
    off+=("$(TPUEMU_TRACE_EVENTS=0 "$here/train.sh" "$build" "$cores" "$batch" 2>&1 | step_ms)")
    on+=("$(TPUEMU_TRACE_EVENTS=65536 "$here/train.sh" "$build" "$cores" "$batch" 2>&1 | step_ms)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
moff=$(median "${off[@]}")
mon=$(median "${on[@]}")
echo "profiler overhead: $cores cores, per-core batch $batch, $rounds alternating rounds of bench/train.sh"
echo
echo "| recording | step ms (median) | each round |"
echo "|---|---:|---|"
echo "| off (--trace-events 0) | $moff | ${off[*]} |"
echo "| on (65536 events) | $mon | ${on[*]} |"
echo
awk -v a="$mon" -v b="$moff" 'BEGIN {printf "on / off = %.3f (%+.1f %%)\n", a / b, (a / b - 1) * 100}'
