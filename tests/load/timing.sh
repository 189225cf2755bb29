#!/usr/bin/env bash
# The tests whose verdict mixes a wall-clock time (a notice, a pause, a
# window, a deadline) with a count of training steps, RUNS times each in
# each of three modes, one test at a time, through tests/load/run.sh:
#
#   idle   nothing beside them: the steps as fast as this machine makes them
#   hogs   HOGS CPU-bound processes beside them: the steps slower and uneven
#   slow   TPUEMU_TEST_STEP_MS=50 in the workers' environment: each training
#          step takes at least 50 ms, as on a machine ten times slower
#
# Such a test must hold from 1 ms to 50 ms per step: a machine 5 times
# faster than the 2-core one the project is tested on, and 5 times slower.
#
#   tests/load/timing.sh BUILD_DIR
#   RUNS=5 MODES="slow" TESTS="example_fashion_mnist_scenario" tests/load/timing.sh build
#
#   RUNS=N        rounds per mode (default 20)
#   MODES=...     any of: idle hogs slow (default all three, in that order)
#   TESTS=...     ctest names (default the tests listed below)
#   STEP_MS=N     the slow mode's step (default 50)
#   HOGS=N        the hogs mode's CPU hogs (default 2)
#   MAX_MINUTES=N per mode (default 240), as tests/load/run.sh
#
# Exit status: 0 when every run of every mode passed, 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -eq 1 ] || { echo "usage: tests/load/timing.sh BUILD_DIR" >&2; exit 2; }
RUNS=${RUNS:-20}
MODES=${MODES:-idle hogs slow}
STEP_MS=${STEP_MS:-50}
HOGS=${HOGS:-2}
# the example through a seeded scenario (notices beside steps), through a
# preemption notice and a kill at a step; elastic training through kills
# and a notice at steps; faults waiting for a step or a delay
TESTS=${TESTS:-example_fashion_mnist_scenario example_fashion_mnist_preempt example_fashion_mnist_recover it_elastic it_chaos}
regex="^($(echo "$TESTS" | tr -s ' ' '|'))\$"

status=0
summary=()
for mode in $MODES; do
    case "$mode" in
    idle) hogs=0 step= ;;
    hogs) hogs=$HOGS step= ;;
    slow) hogs=0 step=$STEP_MS ;;
    *) echo "unknown mode '$mode' (idle hogs slow)" >&2; exit 2 ;;
    esac
    echo "==== $mode: $RUNS rounds of $TESTS, $hogs hogs${step:+, TPUEMU_TEST_STEP_MS=$step}"
    out=$(mktemp /tmp/tpuemu-timing.XXXXXX)
    if [ -n "$step" ]; then export TPUEMU_TEST_STEP_MS=$step; else unset TPUEMU_TEST_STEP_MS; fi
    RUNS=$RUNS HOGS=$hogs JOBS=1 CTEST_ARGS="-R $regex" "$ROOT/tests/load/run.sh" "$1" | tee "$out"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=1
    # run.sh's table and its last line, each line led by the mode
    summary+=("$(sed -n '/^test  *runs/,/^load:/p' "$out" | sed "s/^/$mode  /")")
    rm -f "$out"
done
echo
echo "==== per mode (mode, test, runs, failed, median s, max s)"
printf '%s\n' "${summary[@]}"
exit $status
