#!/usr/bin/env bash
# Training benchmark: examples/s of the Fashion-MNIST model (784 -> Dense(128,
# relu) -> Dense(10, softmax), Adam, sparse CCE, mixed_bfloat16) on a local
# emulated pod, next to the step's matmuls alone (run in-process by
# bench_train through the worker's own model.h / mxu.h) and where the rest of
# the step goes (tpu_model_last_step_stats averaged over the measured steps).
#
#   bench/train.sh BUILD_DIR [CORES_LIST] [BATCHES_LIST]
#   bench/train.sh build-bench "1 2 4 8" "32 128 512"      # the defaults
#
# For each N in CORES_LIST it starts one resolver (on a free port) and N
# workers (v3; hosts of up to 4 cores: host0 cores 0-3, host1 ...), runs
# bench_train once per per-core batch in BATCHES_LIST (each run initializes the
# system again), stops the cluster, and at the end prints one table with every
# row. Everything started here is stopped on exit.
#
# With BASE=COMMIT it also builds that commit of this repository (git archive
# into BASE_BUILD, default /tmp/tpuemu-base-<commit>, reused when it is there;
# the project's default build type; bench_train, tpu-worker and tpu-resolver) and runs every row
# with both builds, alternating ROUNDS times (default 3) so that both see the
# same machine, then prints each build's median examples/s and their ratio.
#
# Environment: MODEL=cnn (examples/fashion_mnist --model cnn's convolutional
# network instead of the MLP; default mlp), SECONDS_PER_RUN (measured seconds per configuration, default 2),
# WARMUP (warm-up steps, default 20), DATA (a Fashion-MNIST IDX directory to
# train on instead of synthetic rows), KEEP_LOGS=1 (keep the daemon logs),
# SPE (steps per execution, Keras' steps_per_execution: the steps the client
# sends each core in one request; default 1), TPU_TYPE (default v3), DETERMINISTIC=1 (run every row twice, in the default
# mode and compiled deterministic, alternating ROUNDS times, default 3, and
# print each mode's median examples/s and their ratio), SCRAPE_MS=N (give every worker a --metrics-port and
# fetch each one's /metrics every N ms while the rows run; 0, the default: off),
# PYTHON=1 (after every bench_train row, the same measurement through the Python
# package, bench/train_py.py: tpuemu.tf's Keras fit on the same cluster, data
# (DATA, default Debian's Fashion-MNIST, for both) and batch, alternating ROUNDS
# times, default 3; then each one's median examples/s and Python's overhead),
# ANCHOR=0 (skip the PyTorch DDP anchor, bench/train_ddp.py, which otherwise
# runs after the rows when Debian's python3-torch is installed),
# HOST_INPUT=0 (skip the host-side input rows: after each cluster's rows, the
# same rows again with bench_train --input hosts, each core's tpu-worker
# reading the Fashion-MNIST files of DATA, default Debian's, and making its
# own batches; run when those files are there), INPUT=hosts (every row, the
# BASE and DETERMINISTIC ones too, with bench_train --input hosts on the files of
# DATA, default Debian's: to compare builds on host-side input).
#
# After the rows, a table per row against the machine's limit: the in-process
# forward + backward + optimizer of one per-core shard x N / min(N, CPUs), per
# global batch (what N emulated cores on this machine could do with zero
# overhead), the share of it reached, the client's CPU per step (getrusage of
# bench_train over the measured steps) and the anchor's examples/s.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/train.sh BUILD_DIR [CORES_LIST] [BATCHES_LIST]}
cores_list=${2:-"1 2 4 8"}
batches_list=${3:-"32 128 512"}
secs=${SECONDS_PER_RUN:-2}
warmup=${WARMUP:-20}
model_args=()
[ "${MODEL:-mlp}" != mlp ] && model_args=(--model "$MODEL")
[ "${SPE:-1}" != 1 ] && model_args+=(--steps-per-execution "$SPE")
tpu_type=${TPU_TYPE:-v3}
bin=$build/bin
for b in bench_train tpu-worker tpu-resolver; do
    [ -x "$bin/$b" ] || { echo "no $bin/$b: build first (cmake --build $build --target bench_train tpu-worker tpu-resolver)" >&2; exit 2; }
done
bin=$(cd "$bin" && pwd)
rounds=${ROUNDS:-1}
base_bin=
if [ -n "${BASE:-}" ]; then
    rounds=${ROUNDS:-3}
    sha=$(git rev-parse --verify "$BASE^{commit}") || { echo "BASE=$BASE is not a commit of this repository" >&2; exit 2; }
    bdir=${BASE_BUILD:-/tmp/tpuemu-base-$sha}
    if [ ! -x "$bdir/build/bin/bench_train" ]; then
        echo "building $BASE ($sha) in $bdir" >&2
        rm -rf "$bdir" && mkdir -p "$bdir/src"
        git archive "$sha" | tar -x -C "$bdir/src"
        cmake -S "$bdir/src" -B "$bdir/build" >"$bdir/cmake.log" 2>&1 &&
            cmake --build "$bdir/build" -j"$(nproc)" --target bench_train tpu-worker tpu-resolver >>"$bdir/cmake.log" 2>&1 ||
            { echo "cannot build $BASE: see $bdir/cmake.log" >&2; exit 2; }
    fi
    base_bin=$bdir/build/bin
fi
det=${DETERMINISTIC:-0}
py=${PYTHON:-0}
if [ "$py" = 1 ]; then
    [ -n "$base_bin" ] || [ "$det" = 1 ] && { echo "PYTHON=1 is a comparison of its own: not with BASE or DETERMINISTIC" >&2; exit 2; }
    [ -f "$build/python/tpuemu/__init__.py" ] || { echo "no $build/python/tpuemu: build the Python package (python3-cffi, python3-numpy)" >&2; exit 2; }
    rounds=${ROUNDS:-3}
    DATA=${DATA:-/usr/share/datasets/fashion-mnist}
    pypath=$(cd "$build/python" && pwd)
fi
if [ "$det" = 1 ]; then
    [ -n "$base_bin" ] && { echo "BASE and DETERMINISTIC=1 are two comparisons: choose one" >&2; exit 2; }
    rounds=${ROUNDS:-3}
fi
data_args=()
[ -n "${DATA:-}" ] && data_args=(--data "$DATA")

logdir=$(mktemp -d /tmp/tpuemu-train-bench.XXXXXX)
rows=$logdir/rows
: >"$rows"
pids=()
stop_all() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_all
    if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs: $logdir" >&2; else rm -rf "$logdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a port below the usual ephemeral range (32768-60999), where an outgoing
# connection's local port cannot take it between the check and the bind
free_port() {
    local p=$((20000 + RANDOM % 12000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}

# start_resolver LOG [BIN]: a resolver on a free port (a few tries), its address in $tpu
start_resolver() {
    local try t pid
    for try in 1 2 3 4 5; do
        tpu=127.0.0.1:$(free_port)
        "${2:-$bin}/tpu-resolver" --listen "$tpu" 2>"$1" &
        pid=$!
        for ((t = 0; t < 50; t++)); do
            kill -0 "$pid" 2>/dev/null || break
            if (exec 3<>"/dev/tcp/${tpu%:*}/${tpu#*:}") 2>/dev/null; then
                pids+=("$pid")
                return 0
            fi
            sleep 0.1
        done
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    echo "could not start tpu-resolver: $(tail -1 "$1")" >&2
    return 1
}

t_begin=$(date +%s)
failed=0
# run_py LABEL N B: bench/train_py.py's row on the running cluster into $rows.python
run_py() {
    echo "train_py.py ($1): $2 cores, per-core batch $3 (warm-up $warmup steps, then ${secs} s)" >&2
    if ! PYTHONPATH=$pypath /usr/bin/python3 bench/train_py.py --tpu "$tpu" --cores "$2" --batch "$3" \
            --seconds "$secs" --warmup "$warmup" --data "$DATA" >>"$rows.python" 2>"$logdir/py.$1.n$2.b$3.err"; then
        echo "  FAILED (Python): $(tail -3 "$logdir/py.$1.n$2.b$3.err")" >&2
        failed=1
    fi
}
# run_rows LABEL BIN N [BENCH_ARGS...]: one cluster of N workers of BIN, a row per batch size into $rows.LABEL
run_rows() {
    local label=$1 b_bin=$2 n=$3 h c i b mports=() margs
    shift 3
    local extra=("$@")
    start_resolver "$logdir/resolver.$label.n$n.log" "$b_bin" || { failed=1; return; }
    for ((i = 0; i < n; i++)); do
        h=$((i / 4)) c=$((i % 4))
        margs=()
        if [ "${SCRAPE_MS:-0}" -gt 0 ]; then
            mports+=("$(free_port)")
            margs=(--metrics-port "${mports[-1]}")
        fi
        "$b_bin/tpu-worker" --resolver "$tpu" --host-id "host$h" --core "$c" --tpu-type "$tpu_type" \
            "${margs[@]}" 2>"$logdir/worker.$label.n$n.host$h.$c.log" &
        pids+=($!)
    done
    if [ ${#mports[@]} -gt 0 ]; then # scrape every worker every SCRAPE_MS while the rows run
        (
            end=$(( $(date +%s) + 600 ))
            while [ "$(date +%s)" -lt $end ]; do
                for mp in "${mports[@]}"; do curl -s -m 2 -o /dev/null "http://127.0.0.1:$mp/metrics" || true; done
                sleep "$(awk -v ms="$SCRAPE_MS" 'BEGIN {print ms / 1000}')"
            done
        ) &
        pids+=($!)
    fi
    for b in $batches_list; do
        # the Python row first in odd rounds: neither always meets the fresh cluster
        [ "$py" = 1 ] && [ $((r % 2)) = 1 ] && run_py "$label" "$n" "$b"
        echo "bench_train ($label): $n cores, per-core batch $b (warm-up $warmup steps, then ${secs} s)" >&2
        if ! "$b_bin/bench_train" --tpu "$tpu" --cores "$n" --batch "$b" --seconds "$secs" --warmup "$warmup" \
                "${data_args[@]}" "${model_args[@]}" "${extra[@]}" --no-header >>"$rows.$label" 2>"$logdir/bench.$label.n$n.b$b.err"; then
            echo "  FAILED: $(head -3 "$logdir/bench.$label.n$n.b$b.err")" >&2
            failed=1
        fi
        [ "$py" = 1 ] && [ $((r % 2)) = 0 ] && run_py "$label" "$n" "$b"
    done
    stop_all
}
: >"$rows.current"
[ -n "$base_bin" ] && : >"$rows.base"
[ "$det" = 1 ] && : >"$rows.deterministic"
[ "$py" = 1 ] && : >"$rows.python"
# host-side input rows (bench_train --input hosts) on the files of hdata
hdata=${DATA:-/usr/share/datasets/fashion-mnist}
hosts_rows=0
if [ "${INPUT:-client}" = hosts ]; then
    [ -f "$hdata/train-images-idx3-ubyte.gz" ] || { echo "INPUT=hosts: no $hdata/train-images-idx3-ubyte.gz" >&2; exit 2; }
    data_args=(--data "$(cd "$hdata" && pwd)" --input hosts)
elif [ "${HOST_INPUT:-1}" != 0 ] && [ -z "$base_bin" ] && [ "$det" != 1 ] && [ -f "$hdata/train-images-idx3-ubyte.gz" ]; then
    hosts_rows=1
    hdata=$(cd "$hdata" && pwd)
fi
: >"$rows.hosts"
for n in $cores_list; do
    for ((r = 0; r < rounds; r++)); do
        [ "$hosts_rows" = 1 ] && run_rows hosts "$bin" "$n" --data "$hdata" --input hosts
        run_rows current "$bin" "$n"
        [ -n "$base_bin" ] && run_rows base "$base_bin" "$n"
        [ "$det" = 1 ] && run_rows deterministic "$bin" "$n" --deterministic
    done
done
# the PyTorch DDP anchor (bench/train_ddp.py): N processes over Gloo, same
# model, batch and seconds, when Debian's python3-torch is there
anchor=0
anchor_why="not installed (apt-get install python3-torch)"
: >"$rows.ddp"
if [ "${ANCHOR:-1}" = 0 ]; then
    anchor_why="not run (ANCHOR=0)"
elif /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    anchor=1
    for n in $cores_list; do
        for b in $batches_list; do
            echo "PyTorch DDP anchor: $n processes, batch $b (warm-up $warmup steps, then ${secs} s)" >&2
            if v=$(timeout $((secs + 180)) /usr/bin/python3 bench/train_ddp.py --procs "$n" --batch "$b" \
                    --seconds "$secs" --warmup "$((warmup > 0 ? warmup : 1))" 2>"$logdir/ddp.n$n.b$b.err"); then
                echo "$n $b $(echo "$v" | awk '{ print $1 }')" >>"$rows.ddp"
            else
                echo "  FAILED (anchor): $(tail -1 "$logdir/ddp.n$n.b$b.err")" >&2
                echo "$n $b failed" >>"$rows.ddp"
            fi
        done
    done
fi
t_total=$(( $(date +%s) - t_begin ))

printf '\ntraining benchmark: Fashion-MNIST model (784 -> Dense(128, relu) -> Dense(10, softmax)), Adam, sparse CCE,\n'
printf 'mixed_bfloat16, %s workers (hosts of up to 4 cores), %s data; warm-up %s steps, then %s s per row\n' \
    "$tpu_type" "$([ -n "${DATA:-}" ] && echo "Fashion-MNIST from $DATA" || echo "synthetic 60000-row")" "$warmup" "$secs"
printf 'machine: %s cores (nproc), %s; %s\n\n' "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')" "$(uname -sr)"
[ -n "$base_bin" ] && echo "this build ($(git rev-parse --short HEAD 2>/dev/null || echo '?')):"
[ "$det" = 1 ] && echo "default mode (oneDNN's kernels, libm):"
"$bin/bench_train" --header-only
cat "$rows.current"
[ -s "$rows.hosts" ] && { echo "host-side input (bench_train --input hosts, the files of $hdata):"; cat "$rows.hosts"; }
# per row: the machine's limit (the in-process forward + backward + optimizer
# of one per-core shard x N / min(N, CPUs), per global batch) and the share of
# it reached, the client's CPU per step, and the PyTorch DDP anchor
printf '\nagainst the machine'"'"'s limit (this build; anchor: %s):\n\n' \
    "$([ "$anchor" = 1 ] && echo "PyTorch DDP over Gloo, bench/train_ddp.py, measured after the rows" || echo "$anchor_why")"
printf '| input | cores | batch/core | examples/s | step | in-process fwd + bwd + optimizer | the machine'"'"'s limit | share of the limit | client CPU/step | PyTorch DDP |\n'
printf '|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n'
awk -F'|' -v label="$([ "${INPUT:-client}" = hosts ] && echo host-side)" -v anchors="$rows.ddp" '
    BEGIN { while ((getline l < anchors) > 0) { split(l, a, " "); ddp[a[1] " " a[2]] = a[3] } }
    { for (i = 2; i <= NF; i++) gsub(/[ ,%]/, "", $i)
      k = $2 " " $3
      printf "| %s | %s | %s | %s | %.3f ms | %.3f ms | %s | **%.0f %%** | %.3f ms | %s |\n",
          (label != "" ? label : "client-fed"), $2, $3, $5, $6, $8 + $9, $20, $21, $22, (k in ddp ? ddp[k] : "-") }
' "$rows.current"
# the host-side input rows: the same table's columns
[ -s "$rows.hosts" ] && awk -F'|' -v label="host-side" -v anchors="$rows.ddp" '
    BEGIN { while ((getline l < anchors) > 0) { split(l, a, " "); ddp[a[1] " " a[2]] = a[3] } }
    { for (i = 2; i <= NF; i++) gsub(/[ ,%]/, "", $i)
      k = $2 " " $3
      printf "| %s | %s | %s | %s | %.3f ms | %.3f ms | %s | **%.0f %%** | %.3f ms | %s |\n",
          label, $2, $3, $5, $6, $8 + $9, $20, $21, $22, (k in ddp ? ddp[k] : "-") }
' "$rows.hosts"
# the gradient all-reduce's share of the step, per row of this build: the
# slowest core's (waiting for its peers included) and the shortest core's
awk -F'|' 'BEGIN { n = 0 }
    { gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $6); gsub(/ /, "", $12); gsub(/ /, "", $13) }
    $2 > 1 && $6 > 0 { if (!n++) printf "\nthe gradient all-reduce, share of the step (this build):\n"
        printf "  %s cores, batch %s: %.0f %% on the slowest core (waiting for its peers included), %.0f %% on the shortest\n",
            $2, $3, 100 * $12 / $6, 100 * $13 / $6 }' "$rows.current"
if [ "$py" = 1 ]; then
    printf '\nthe same through the Python package (bench/train_py.py: tpuemu.tf, Keras fit, a Keras callback counting steps):\n'
    printf '| cores | batch/core | global | examples/s | step ms | steps |\n|--:|--:|--:|--:|--:|--:|\n'
    cat "$rows.python"
    printf '\nexamples/s, median of %s rounds each (C and Python alternating on the same cluster):\n\n' "$rounds"
    printf '| cores | batch/core | C (bench_train) | Python (tpuemu.tf) | Python overhead |\n|--:|--:|--:|--:|--:|\n'
    awk -F'|' '
        function med(k,  n, i, j, t, a) { n = split(v[k], a, " ")
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        { gsub(/[ ,]/, "", $2); gsub(/[ ,]/, "", $3); gsub(/[ ,]/, "", $5)
          k = FILENAME ~ /python$/ ? "p" : "c"; key = $2 " " $3
          if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
          v[k SUBSEP key] = v[k SUBSEP key] " " $5 }
        END { for (i = 1; i <= nk; i++) { split(order[i], kb, " ")
                  c = med("c" SUBSEP order[i]); p = med("p" SUBSEP order[i])
                  printf "| %s | %s | %.0f | %.0f | %s |\n", kb[1], kb[2], c, p, (c > 0 ? sprintf("%.1f %%", 100 * (c - p) / c) : "-") } }
    ' "$rows.current" "$rows.python"
fi
if [ -n "$base_bin" ] || [ "$det" = 1 ]; then
    if [ "$det" = 1 ]; then
        printf '\ndeterministic mode (portable matrix unit, fixed exp/log):\n'
    else
        printf '\nBASE %s (%s):\n' "$BASE" "$sha"
    fi
    "$bin/bench_train" --header-only
    other=$rows.base
    [ "$det" = 1 ] && other=$rows.deterministic
    cat "$other"
    if [ "$det" = 1 ]; then
        printf '\nexamples/s, median of %s rounds each (the modes alternating):\n\n' "$rounds"
        printf '| cores | batch/core | default | deterministic | default / deterministic |\n|--:|--:|--:|--:|--:|\n'
    else
        printf '\nexamples/s, median of %s rounds each (the builds alternating):\n\n' "$rounds"
        printf '| cores | batch/core | this build | BASE | ratio |\n|--:|--:|--:|--:|--:|\n'
    fi
    awk -F'|' '
        function med(k,  n, i, j, t, a) { n = split(v[k], a, " ")
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        { gsub(/[ ,]/, "", $2); gsub(/[ ,]/, "", $3); gsub(/[ ,]/, "", $5)
          k = FILENAME ~ /(base|deterministic)$/ ? "b" : "c"; key = $2 " " $3
          if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
          v[k SUBSEP key] = v[k SUBSEP key] " " $5 }
        END { for (i = 1; i <= nk; i++) { split(order[i], kb, " ")
                  c = med("c" SUBSEP order[i]); b = med("b" SUBSEP order[i])
                  printf "| %s | %s | %.0f | %.0f | %s |\n", kb[1], kb[2], c, b, (b > 0 ? sprintf("%.2fx", c / b) : "-") } }
    ' "$rows.current" "$other"
fi
cat <<EOF

step ms: client wall time per step (measured steps / their time; epoch boundaries included).
matmul ms (in-proc): the step's forward + backward matmuls for one per-core shard, run by bench_train
  itself through the worker's model.h / mxu.h (the matrix unit, 1 thread) while the cluster is idle (median step);
  fwd+bwd ms (in-proc): model_forward + model_backward there (matmuls + elementwise math + loss);
  optimizer ms (in-proc): model_apply_gradients there (Adam over the 101770 parameters).
on core: tpu_model_last_step_stats averaged over the measured steps (each step's slowest core):
  compute = forward + backward, of which matmul; all-reduce of the gradients, from the core's arrival to
  its result (the first core to arrive waits there for the others); all-reduce (shortest core): the core
  that arrived last waits for no one, so this is the exchange itself; optimizer (Adam, applied at the
  start of the next step); infeed wait = the core idle, waiting for its next shard; input wait = the
  client waiting for the dataset.
  With N workers on P < N CPUs, cores whose compute runs to completion share at most P CPUs, so on
  average a core computes for at most P/N of the step and waits for the rest, most of it inside the
  all-reduce: with 4 workers on 2 CPUs the slowest core's all-reduce cannot fall under half the step.
  The optimizer's time depends on the data: Adam's moments of parameters whose gradients stay 0 decay
  into float32 denormals (and stay there: round-to-nearest keeps the smallest ones fixed), which cost
  microcode assists on x86 unless the thread flushes denormals to zero.
non-matmul %: (step - in-proc matmul) / step. Goal: <= 25 % at per-core batch 128 on 4 cores.
non-matmul % (time-shared): the same against in-proc matmul x N / min(N, $(nproc)): with more workers than
  this machine's $(nproc) cores the emulated cores time-share the CPUs, so N workers cannot finish their
  matmuls in less than that even with zero overhead.
whole run: ${t_total} s
EOF
exit $failed
