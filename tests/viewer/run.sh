#!/usr/bin/env bash
# The profiler's files in real viewers: a resolver and 4 workers (2 hosts x 2
# cores) on loopback, examples/fashion_mnist for 1 epoch with the profiler on
# batches 10-20, then, in a network namespace of its own that has nothing but
# loopback (so the browser can reach nothing else):
#  - the trace is opened in speedscope (a trace viewer that imports Chrome
#    trace-event JSON; its release fetched with `npm pack`, from whichever
#    registry this machine's npm is set up with, and checked against the
#    sha512 integrity the npm registry publishes for it) served on 127.0.0.1
#    and loaded in headless Chromium:
#    the viewer must list every thread of the trace (3 per core, 2 of the
#    client) by name, and show no import error;
#  - the picture steps.svg is opened in headless Chromium, whose XML parser
#    must accept it as an SVG document.
# chrome://tracing cannot be used: headless Chromium refuses chrome:// pages.
#
#   tests/viewer/run.sh BUILD_DIR
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
[ $# -eq 1 ] || fail "usage: tests/viewer/run.sh BUILD_DIR"
bin=$(cd "$1" && pwd)/bin
cache=$(cd "$1" && pwd)/viewer-cache
data=${TPUEMU_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
ss_version=1.25.0
ss_sha512=cpf9HWTZf1ijLXBJrk87Ve/54tnYx6rlf0gUThvn3ook6h63hLXVOQiMf44PT+XoV503cPfvfiT5gP5vojp6Ag==
for tool in chromium python3 unshare ip npm openssl; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/lib.sh lists the packages)"
done
[ -f "$data/train-images-idx3-ubyte.gz" ] || fail "$data has no Fashion-MNIST files (apt-get install dataset-fashion-mnist)"

# speedscope, once per build tree
mkdir -p "$cache"
tgz=$cache/speedscope-$ss_version.tgz
if [ ! -f "$tgz" ]; then
    rm -rf "$cache/pack" && mkdir -p "$cache/pack"
    # npm's own configuration (registry, proxy, CA) picks where it comes from
    (cd "$cache/pack" && timeout 300 npm pack "speedscope@$ss_version" --silent --cache "$cache/npm-cache" \
        --no-audit --no-fund >pack.out 2>pack.err) ||
        fail "npm pack speedscope@$ss_version failed (is npm's registry reachable? npm config get registry): $(tail -3 "$cache/pack/pack.err")"
    [ -f "$cache/pack/speedscope-$ss_version.tgz" ] || fail "npm pack wrote no speedscope-$ss_version.tgz: $(cat "$cache/pack/pack.out")"
    mv "$cache/pack/speedscope-$ss_version.tgz" "$tgz"
    rm -rf "$cache/pack"
fi
got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
[ "$got" = "$ss_sha512" ] || { rm -f "$tgz"; fail "$tgz: sha512 $got, not the integrity sha512-$ss_sha512 published for speedscope@$ss_version"; }

work=$(mktemp -d /tmp/tpuemu-viewer.XXXXXX)
. "$(dirname "${BASH_SOURCE[0]}")/../support/local_cluster.sh"
start_local_cluster "$bin" "$work"
cd "$work"
timeout 300 "$bin/fashion_mnist" --tpu "$tpu" --epochs 1 >out.txt 2>err.txt ||
    { cat out.txt err.txt; fail "fashion_mnist failed"; }
trace=$(ls logs/train/plugins/profile/*/*.trace.json.gz 2>/dev/null | head -1)
svg=$(ls logs/train/plugins/profile/*/steps.svg 2>/dev/null | head -1)
[ -n "$trace" ] && [ -n "$svg" ] || fail "the profiler callback wrote no trace or no steps.svg under logs/train/plugins/profile/RUN/"

mkdir -p www
tar -xzf "$tgz" -C "$work" package/dist/release || fail "cannot unpack $tgz"
cp -r package/dist/release/. www/
gunzip -c "$trace" >www/trace.json || fail "cannot gunzip $trace"
cp "$svg" www/steps.svg

# In a namespace with only loopback: the web server and the browser.
cat >viewer.sh <<'INNER'
set -u
ip link set lo up
cd www
python3 -m http.server 8000 --bind 127.0.0.1 >../http.log 2>&1 &
srv=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
browse() { # url, output
    timeout 90 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-sync \
        --disable-background-networking --disable-component-update --disable-default-apps \
        --disable-domain-reliability --user-data-dir="$(mktemp -d)" --window-size=1200,800 \
        --virtual-time-budget=15000 --dump-dom "$1" >"$2" 2>>../chromium.log
}
browse "http://127.0.0.1:8000/index.html#profileURL=http://127.0.0.1:8000/trace.json" ../speedscope.html
browse "http://127.0.0.1:8000/steps.svg" ../svg.html
kill $srv
INNER
unshare --net bash viewer.sh || fail "cannot run the viewer in a network namespace of its own (unshare --net)"

# speedscope's thread list: "(1/N)" and a row per thread, by the trace's names
text=$(sed 's/<[^>]*>/\n/g' speedscope.html | sed '/^[[:space:]]*$/d')
threads=$(python3 -c '
import gzip, json, sys
ev = json.load(gzip.open(sys.argv[1]))["traceEvents"]
print(len({(e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}))' "$trace") ||
    fail "cannot count the threads of $trace"
[ "$threads" -eq $((4 * 3 + 2)) ] || fail "$trace names $threads threads, not 3 per core and 2 of the client"
grep -qi "something went wrong\|could not\|error" <<<"$text" &&
    { echo "$text" | head -40; fail "speedscope reported an error importing the trace"; }
grep -q "(1/$threads)" <<<"$text" ||
    { echo "$text" | head -40; tail -5 chromium.log; fail "speedscope does not list $threads threads of the trace"; }
for want in "host host0 (pid 1), core 0 (replica 0, v3)" "host host1 (pid 2), core 1 (replica 3, v3)" \
        "core 1 receives" "dataset" "infeed"; do
    grep -qF "$want" <<<"$text" || { echo "$text" | head -60; fail "speedscope lists no thread \"$want\""; }
done
# the picture: Chromium parsed it as SVG (a parse error becomes a <parsererror> page)
grep -q "<svg" svg.html || fail "Chromium shows no SVG for steps.svg"
grep -qi "parsererror" svg.html && fail "Chromium could not parse steps.svg: $(sed 's/<[^>]*>/ /g' svg.html | head -c 400)"
grep -q 'data-part="all-reduce"' svg.html || fail "the picture Chromium shows has no bars"
echo "2 passed, 0 failed: speedscope $ss_version lists the trace's $threads threads; Chromium shows steps.svg"
