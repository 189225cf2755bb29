#!/usr/bin/env bash
# The test suite under load: every ctest test of a build tree, and the shell
# tests beside it, RUNS times each while HOGS CPU-bound processes run beside
# them, then a table of failures per test. A verdict that rests on timing must
# hold here, on a 2-core machine with twice its cores' worth of other work:
# this is how such a test is shown not to be flaky.
#
#   tests/load/run.sh BUILD_DIR                  ctest only (RUNS=20 rounds)
#   RUNS=5 SHELL_TESTS="multihost viewer" tests/load/run.sh build
#   RUNS=20 CTEST_ARGS="-R it_profile" tests/load/run.sh build-asan
#
#   RUNS=N          rounds (default 20); each round runs ctest once (JOBS at a
#                   time, as scripts/test.sh does) and each shell test once
#   HOGS=N          CPU-bound processes beside the tests (default 2)
#   JOBS=N          ctest -j (default 2)
#   CTEST_ARGS=...  more ctest arguments (a -R or -L filter, say)
#   SHELL_TESTS=... any of: multihost viewer deploy docker systemd prometheus
#                   (default none; they need root, and docker a few minutes a run)
#   MAX_MINUTES=N   no round starts after N minutes (default 240): the whole is
#                   bounded in time, and the hogs are killed when it ends, on
#                   any exit
#   LOAD_LOGS=DIR   where each failed run's output is kept (default: a temp dir,
#                   named at the end)
#
# Exit status: 0 when every run of every test passed, 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -eq 1 ] || { echo "usage: tests/load/run.sh BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" 2>/dev/null && pwd) || { echo "no build dir $1 (build the tree first)" >&2; exit 2; }
[ -f "$build/CTestTestfile.cmake" ] || { echo "$build has no tests (configure it with BUILD_TESTING on)" >&2; exit 2; }
RUNS=${RUNS:-20}
HOGS=${HOGS:-2}
JOBS=${JOBS:-2}
MAX_MINUTES=${MAX_MINUTES:-240}
SHELL_TESTS=${SHELL_TESTS:-}
read -r -a ctest_args <<<"${CTEST_ARGS:-}"
logs=${LOAD_LOGS:-$(mktemp -d /tmp/tpuemu-load.XXXXXX)}
mkdir -p "$logs"
case "$build" in *asan*|*sanit*)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} ;;
esac

declare -a hog_pids=()
stop_hogs() {
    local p
    for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done
    wait "${hog_pids[@]}" 2>/dev/null
    hog_pids=()
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
# Each hog spins for at most the whole run's time, so none outlives it even
# when this script is killed with SIGKILL.
for ((h = 0; h < HOGS; h++)); do
    timeout $((MAX_MINUTES * 60 + 600)) sh -c 'while :; do :; done' &
    hog_pids+=($!)
done

declare -A runs=() fails=() secs=()
order=()
tally() { # name, passed 0|1, seconds
    [ -n "${runs[$1]+x}" ] || { order+=("$1"); runs[$1]=0; fails[$1]=0; secs[$1]=""; }
    runs[$1]=$((runs[$1] + 1))
    [ "$2" -eq 1 ] || fails[$1]=$((fails[$1] + 1))
    secs[$1]="${secs[$1]} $3"
}

shell_test() { # name -> command line
    case "$1" in
    multihost) echo "env TPUEMU_BIN=$build/bin $ROOT/tests/multihost/run.sh" ;;
    viewer) echo "$ROOT/tests/viewer/run.sh $build" ;;
    deploy) echo "env TPUEMU_BIN=$build/bin $ROOT/tests/deploy/check.sh" ;;
    docker) echo "$ROOT/tests/docker/run.sh" ;;
    systemd) echo "$ROOT/tests/systemd/run.sh $build" ;;
    prometheus) echo "$ROOT/tests/prometheus/run.sh $build" ;;
    *) return 1 ;;
    esac
}
for s in $SHELL_TESTS; do
    shell_test "$s" >/dev/null || { echo "unknown shell test '$s' (multihost viewer deploy docker systemd prometheus)" >&2; exit 2; }
done

start=$(date +%s)
deadline=$((start + MAX_MINUTES * 60))
echo "load: $RUNS rounds of ctest (-j$JOBS ${ctest_args[*]}) ${SHELL_TESTS:+and $SHELL_TESTS }on $build," \
     "$HOGS CPU hogs beside them, $(nproc) cores; logs in $logs"
round=0
while ((round < RUNS)); do
    if (($(date +%s) >= deadline)); then
        echo "load: $MAX_MINUTES minutes passed; stopping after $round rounds"
        break
    fi
    round=$((round + 1))
    out=$logs/ctest-$round.log
    (cd "$build" && ctest -j"$JOBS" --output-on-failure "${ctest_args[@]}") >"$out" 2>&1
    nfail=0
    # "12/34 Test #24: it_badinput ......   Passed    6.02 sec"
    while read -r name verdict sec; do
        if [ "$verdict" = Passed ]; then tally "$name" 1 "$sec"; else tally "$name" 0 "$sec"; nfail=$((nfail + 1)); fi
    done < <(tr -d '\r' <"$out" | sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *\**([A-Za-z]+).* ([0-9.]+) sec$/\1 \2 \3/p')
    if ! grep -qE 'tests passed|No tests were found' "$out"; then
        tally ctest 0 0 # ctest itself failed: no summary line
        nfail=$((nfail + 1))
    fi
    if ((nfail == 0)); then rm -f "$out"; fi
    line="round $round/$RUNS: ctest $nfail failed"
    for s in $SHELL_TESTS; do
        sout=$logs/$s-$round.log
        t0=$(date +%s.%N)
        # shellcheck disable=SC2046
        $(shell_test "$s") >"$sout" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        sec=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
        if [ $rc -eq 0 ]; then tally "$s" 1 "$sec"; rm -f "$sout"; else tally "$s" 0 "$sec"; line="$line, $s FAILED"; fi
    done
    echo "$line ($(($(date +%s) - start)) s so far)"
done
stop_hogs

median_max() { # seconds... -> "median max"
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.1f %.1f", v[int((NR + 1) / 2)], v[NR] }'
}
echo
printf '%-34s %5s %8s %10s %8s\n' test runs failed "median s" "max s"
total_fail=0
for name in "${order[@]}"; do
    # shellcheck disable=SC2086
    read -r med max <<<"$(median_max ${secs[$name]})"
    printf '%-34s %5d %8d %10s %8s\n' "$name" "${runs[$name]}" "${fails[$name]}" "$med" "$max"
    total_fail=$((total_fail + fails[$name]))
done
echo "load: $round rounds in $(($(date +%s) - start)) s, $HOGS hogs, $total_fail failed runs"
if ((total_fail > 0)); then
    echo "the failed runs' output: $logs"
    grep -l . "$logs"/* 2>/dev/null | head -20
    exit 1
fi
rmdir "$logs" 2>/dev/null
exit 0
