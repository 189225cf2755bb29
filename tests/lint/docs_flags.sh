#!/usr/bin/env bash
# Every flag the documentation names exists: each `--flag` in a code block or
# code span of README.md, docs/, SECURITY.md, tests/README.md and
# bench/README.md must be one the program's --help lists. On a command line of
# one of the project's programs (tpuctl, with its global flags and the
# command's own; tpu-resolver, tpu-worker, tpu-slice, fashion_mnist,
# fashion_mnist_ctl, transformer, bench_train, bench_scale, bench_mxu, bench_conv) it is checked against
# that program's --help; after another program (docker, cmake, kubectl, ...)
# it is that program's business and skipped; on its own (`--core`) it must be a
# flag of one of the project's programs. Fails naming the file, line and flag.
#   tests/lint/docs_flags.sh SOURCE_DIR BUILD_DIR
set -u
src=$(cd "${1:?usage: docs_flags.sh SOURCE_DIR BUILD_DIR}" && pwd)
bin=$(cd "${2:?usage: docs_flags.sh SOURCE_DIR BUILD_DIR}/bin" && pwd) || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# ---- the flags each program's --help lists, one "PROGRAM FLAG" a line
flags_of() { # key, command...: the "  --flag" lines of its --help (and of a usage line)
    local key=$1
    shift
    env -i ASAN_OPTIONS=detect_leaks=0 "$@" --help 2>&1 |
        grep -oE -- '(^  |\[| )--[a-z][a-z0-9_-]*' | grep -oE -- '--[a-z][a-z0-9_-]*' |
        sort -u | sed "s|^|$key |"
}
{
    for p in tpu-resolver tpu-worker tpu-slice fashion_mnist fashion_mnist_ctl transformer bench_train bench_scale; do
        [ -x "$bin/$p" ] || { echo "FAIL: $bin/$p is not built" >&2; exit 1; }
        flags_of "$p" "$bin/$p"
    done
    flags_of tpuctl "$bin/tpuctl"
    for c in $(env -i "$bin/tpuctl" --help | sed -n '/^commands:/,/^$/s/^  \([a-z_]*\) .*/\1/p'); do
        if [ "$c" = bench ]; then
            flags_of "tpuctl:$c" "$bin/tpuctl" bench allreduce
        else
            flags_of "tpuctl:$c" "$bin/tpuctl" "$c"
        fi
    done
    # bench_mxu and bench_conv have no --help: their flags, from their sources' argument loops
    grep -oE '"--[a-z][a-z0-9_-]*"' "$src/bench/mxu.c" | tr -d '"' | sort -u | sed 's|^|bench_mxu |'
    grep -oE '"--[a-z][a-z0-9_-]*"' "$src/bench/conv.c" | tr -d '"' | sort -u | sed 's|^|bench_conv |'
} >"$tmp/flags" || exit 1
[ "$(grep -c '^tpuctl:' "$tmp/flags")" -gt 10 ] || { echo "FAIL: tpuctl's commands list too few flags"; exit 1; }
cut -d' ' -f2 "$tmp/flags" | sort -u >"$tmp/any"

# ---- every flag the docs name, as "FILE:LINE PROGRAM COMMAND FLAG" (PROGRAM - on its own, ~ another program's)
docs=(README.md SECURITY.md tests/README.md bench/README.md)
while IFS= read -r f; do docs+=("${f#"$src"/}"); done < <(find "$src/docs" -name '*.md' | sort)
(cd "$src" && awk '
function ours(w) { return w ~ /^(tpuctl|tpu-resolver|tpu-worker|tpu-slice|fashion_mnist|fashion_mnist_ctl|bench_train|bench_scale|bench_mxu|bench_conv)$/ }
function other(w) { return w ~ /^(docker|docker-compose|kubectl|cmake|ctest|systemctl|systemd-analyze|journalctl|pkg-config|npm|node|apt-get|curl|perf|strace|git|ip|install|head|base64|capture_tpu_profile|promtool|prometheus|chromium|python3|mpirun|iperf3|valgrind|make|cc|gcc|clang|man|ss|lsof|jq|tar|debootstrap)$/ }
function scan(text,   n, i, t, w, fl, prev) {
    prog = "-"; cmd = ""; prev = ""
    n = split(text, tok, /[ \t]+/)
    for (i = 1; i <= n; i++) {
        t = tok[i]
        if (t ~ /^(\||\|\||;|&&|&|\$\(|\(|do|then|else)$/) { prog = "-"; cmd = ""; prev = t; continue }
        if (t ~ /^#/) { prev = t; continue }   # a comment speaks of the command before it
        w = t
        gsub(/^[\["\x27(`$]+|[\]"\x27),`:;]+$/, "", w)
        sub(/^.*\//, "", w)
        if (ours(w) && prev !~ /^(statefulset|deployment|service|enable|disable|start|stop|restart|status|-u)$/) {
            prog = w; cmd = ""; prev = t; continue
        }
        if (prog == "tpuctl" && cmd == "" && w ~ /^[a-z_]+$/ && t !~ /^--/) { cmd = w; prev = t; continue }
        if (other(w) || w ~ /\.sh$/) { prog = "~"; prev = t; continue }
        while (match(t, /--[a-z][a-z0-9_-]*/)) {
            fl = substr(t, RSTART, RLENGTH)
            print FILENAME ":" FNR, prog, (cmd == "" ? "-" : cmd), fl
            t = substr(t, RSTART + RLENGTH)
        }
        if (t ~ /;$/) { prog = "-"; cmd = "" }
        prev = tok[i]
    }
}
/^```/ { fence = !fence; next }
fence { scan($0); next }
{
    n = split($0, part, "`")
    for (k = 2; k <= n; k += 2) scan(part[k])
}
' "${docs[@]}") >"$tmp/named"

# flags of other programs that the docs name in prose, on their own: docker-compose's, docker's
printf '%s\n' --exit-code-from --ulimit >>"$tmp/any"

checked=0
while read -r where prog cmd flag; do
    case $prog in
    "~") continue ;;
    -) grep -qxF -- "$flag" "$tmp/any" || { echo "FAIL: $where: $flag is a flag of none of the programs"; fails=$((fails + 1)); } ;;
    tpuctl) # before the command: a global flag; after it: the command's own
        if [ "$cmd" = - ]; then
            grep -qxF -- "tpuctl $flag" "$tmp/flags"
        else
            grep -qxF -- "tpuctl:$cmd $flag" "$tmp/flags"
        fi || {
            label="tpuctl${cmd/#-/}" && [ "$cmd" != - ] && label="tpuctl $cmd"
            echo "FAIL: $where: '$label $flag': $label --help has no $flag"
            fails=$((fails + 1))
        } ;;
    *) grep -qxF -- "$prog $flag" "$tmp/flags" || { echo "FAIL: $where: '$prog $flag': $prog --help has no $flag"; fails=$((fails + 1)); } ;;
    esac
    checked=$((checked + 1))
done <"$tmp/named"
echo "checked $checked flags named in ${#docs[@]} files against the programs' --help: $fails unknown"
[ "$checked" -gt 100 ] || { echo "FAIL: too few flags found in the docs ($checked): is the scan broken?"; exit 1; }
exit $((fails > 0))
