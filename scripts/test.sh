#!/usr/bin/env bash
# The test command: installs the build dependencies (Debian/Ubuntu), checks
# the format of the C lines a change touches, builds with -Werror, runs every
# test, the profiler's files in real viewers, the cluster console in a real
# browser, the cluster over network
# namespaces, the checks of deploy/, the units under a real
# systemd in a container and a real Prometheus scraping a training cluster,
# again every test under
# ASan+UBSan, then fuzzes each decoder for a short while, then brings the
# docker-compose test cluster up on a Docker engine of its own and kills one
# of its workers mid-training. Exit status non-zero if anything failed.
#
#   scripts/test.sh            everything
#   FUZZ_SECONDS=60 scripts/test.sh
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
JOBS=${JOBS:-2}
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
. scripts/lib.sh  # TPUEMU_PACKAGES, install_packages

declare -a SUMMARY=()
FAILED=0
step() { # name, command...
    local name=$1 start end rc
    shift
    echo "==> $name"
    start=$(date +%s)
    "$@"
    rc=$?
    end=$(date +%s)
    if [ $rc -eq 0 ]; then
        SUMMARY+=("ok    $name ($((end - start)) s)")
    else
        SUMMARY+=("FAIL  $name ($((end - start)) s, exit $rc)")
        FAILED=1
    fi
    return $rc
}

build() { # dir, cmake args...
    local dir=$1
    shift
    cmake -S . -B "$dir" "$@" && cmake --build "$dir" -j"$JOBS"
}

run_ctest() {
    (cd "$1" && ctest --output-on-failure -j"$JOBS")
}

fuzz_all() {
    local dir=build-fuzz/bin f rc=0 work
    work=$(mktemp -d)
    for f in wire_open frame addr bytes http peertab ckpt scenario; do
        mkdir -p "$work/$f"
        echo "--- fuzz_$f for ${FUZZ_SECONDS} s"
        if ! "$dir/fuzz_$f" -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 \
                -artifact_prefix="$work/$f-" "$work/$f" "tests/fuzz/corpus/$f" >"$work/$f.log" 2>&1; then
            echo "fuzz_$f FAILED:"; tail -40 "$work/$f.log"
            mkdir -p build-fuzz/crashes && cp "$work/$f"-* build-fuzz/crashes/ 2>/dev/null
            rc=1
        else
            tail -1 "$work/$f.log"
        fi
    done
    rm -rf "$work"
    return $rc
}

step "install packages" install_packages $TPUEMU_TEST_PACKAGES || { echo "cannot install the build dependencies"; exit 1; }
step "format of the changed C lines" tests/lint/format.sh
if step "build (-Werror)" build build -DTPUEMU_WERROR=ON; then
    step "ctest" run_ctest build
    step "ABI of libtpuclient against client/abi" tests/abi/check.sh build
    step "profile in real viewers" tests/viewer/run.sh build
    step "cluster console in a real browser" tests/console/run.sh build
    step "multihost" tests/multihost/run.sh
fi
step "deploy" tests/deploy/check.sh
step "systemd" tests/systemd/run.sh build
step "prometheus" tests/prometheus/run.sh build
if step "build ASan+UBSan" build build-asan -DTPUEMU_SANITIZE=ON -DTPUEMU_WERROR=ON; then
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        step "ctest ASan+UBSan" run_ctest build-asan
fi
fuzz_build() {
    CC=clang cmake -S . -B build-fuzz -DTPUEMU_FUZZ=ON -DBUILD_TESTING=ON &&
        cmake --build build-fuzz -j"$JOBS" --target fuzz_wire_open fuzz_frame fuzz_addr fuzz_bytes fuzz_http fuzz_peertab \
            fuzz_ckpt fuzz_scenario
}
if step "build fuzzers (clang)" fuzz_build; then
    step "fuzz (${FUZZ_SECONDS} s each)" fuzz_all
fi
step docker tests/docker/run.sh

echo
echo "==== summary"
printf '%s\n' "${SUMMARY[@]}"
[ $FAILED -eq 0 ] && echo "all passed" || echo "SOME STEPS FAILED"
exit $FAILED
