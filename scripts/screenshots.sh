#!/usr/bin/env bash
# The docs' pictures of the cluster console, taken by the console's browser
# test (tests/console/run.sh) from a real training cluster: the console with
# every core READY after an epoch, and after a core was killed and another
# preempted, and tpuctl board on the training's log directory and its profile's
# trace. Writes docs/images/console.png, docs/images/console-faults.png,
# docs/images/board.png and docs/images/board-trace.png.
#
#   scripts/screenshots.sh [BUILD_DIR]     (default: build, built already)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
[ -x "$build/bin/tpu-resolver" ] || { echo "scripts/screenshots.sh: build first (cmake -S . -B $build && cmake --build $build)"; exit 1; }
tests/console/run.sh "$build" docs/images
echo "docs/images/console.png, console-faults.png, board.png and board-trace.png written"
