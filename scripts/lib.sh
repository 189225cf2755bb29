# Shared by scripts/demo.sh and scripts/test.sh: package installation and builds.

# Exactly the Debian 12 packages tpuemu builds and runs with (and its ctest suite needs);
# libjs-chart.js draws tpuctl board's charts.
TPUEMU_PACKAGES="build-essential cmake pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler
libnanomsg-dev libcriterion-dev libsodium-dev clang valgrind libdnnl-dev zlib1g-dev
dataset-fashion-mnist python3-dev python3-cffi python3-numpy libjs-chart.js"
# What only the tests need beyond that: the viewer test's browser, web server
# and checksum (npm fetches its viewer); the console test's DevTools client
# (python3-websocket); network namespaces (viewer,
# multihost); the docker test's engine, compose and base-image maker; the deploy checks' systemd,
# YAML parser, strace, and Node.js and npm for the Kubernetes schema validator;
# systemd-nspawn for the systemd test's container; Prometheus (and promtool)
# for the metrics test; man-db for the manual pages' test; clang-format for the
# format check of changed lines; abigail-tools (abidw, abidiff) for the ABI
# check of libtpuclient.
TPUEMU_TEST_PACKAGES="chromium python3 python3-websocket curl openssl iproute2 util-linux docker.io docker-compose debootstrap
systemd python3-yaml strace nodejs npm systemd-container prometheus python3-pytest man-db clang-format abigail-tools"

install_packages() { # extra packages...
    local missing=()
    for p in $TPUEMU_PACKAGES "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" && continue
        # a Node.js package that bundles npm (not Debian's) conflicts with Debian's npm
        [ "$p" = npm ] && command -v npm >/dev/null && continue
        missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# build_tree DIR [cmake args...]: configure and build the whole tree into DIR.
build_tree() {
    local dir=$1
    shift
    cmake -S . -B "$dir" "$@" >/dev/null
    echo "building in $dir/ ($*)"
    if ! cmake --build "$dir" -j"$(nproc)" >"$dir/build.log" 2>&1; then
        grep -E 'error|warning' "$dir/build.log" | head -40
        echo "build failed; the whole log is $dir/build.log" >&2
        return 1
    fi
}
