#!/usr/bin/env bash
# The manual pages as a user gets them: `cmake --install` of the build into a
# temporary prefix, then `man tpuctl` (and tpu-resolver, tpu-worker, tpu-slice)
# through that prefix's MANPATH. Checks that man finds each page where the
# install put it, that groff formats it without a warning, that it has its
# NAME, SYNOPSIS, OPTIONS and EXIT STATUS, and that every flag the program's
# --help lists (tpuctl: the global flags and every command's) is in its page.
#   tests/man/check.sh BUILD_DIR
set -u
build=$(cd "${1:?usage: check.sh BUILD_DIR}" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
command -v man >/dev/null || { echo "FAIL: man is not installed (Debian's man-db)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; echo "FAIL: cmake --install into $tmp/prefix"; exit 1; }
export MANPATH="$tmp/prefix/share/man" MANWIDTH=100 LC_ALL=C.UTF-8
bin="$tmp/prefix/bin"

# the flags a --help text lists: its lines "  --flag ..."
help_flags() { env -i "$@" --help 2>/dev/null | sed -n 's/^  \(--[a-z0-9_-]*\).*/\1/p' | sort -u; }

check_page() { # program section
    local prog=$1 sec=$2 where page
    where=$(man -w "$sec" "$prog" 2>/dev/null)
    [ "$where" = "$MANPATH/man$sec/$prog.$sec" ] ||
        { fail "man -w $sec $prog gives '$where', not the installed $MANPATH/man$sec/$prog.$sec"; return; }
    page=$(man "$sec" "$prog" 2>"$tmp/$prog.err")
    [ $? -eq 0 ] || { fail "man $sec $prog failed: $(cat "$tmp/$prog.err")"; return; }
    man --warnings=all "$sec" "$prog" 2>"$tmp/$prog.warn" >/dev/null
    [ -s "$tmp/$prog.warn" ] && fail "groff warns about $prog($sec): $(head -3 "$tmp/$prog.warn")"
    for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" "SEE ALSO"; do
        grep -q "^$s" <<<"$page" || fail "$prog($sec) has no $s section"
    done
    echo "$page" >"$tmp/$prog.txt"
    ok "man $sec $prog: $(grep -c '' "$tmp/$prog.txt") lines, from $where"
}

check_flags() { # page-program program [args...]: every --help flag of the command is in the page
    local page=$1 missing=() f
    shift
    for f in $(help_flags "$@"); do
        grep -qF -- "$f" "$tmp/$page.txt" || missing+=("$f")
    done
    [ ${#missing[@]} -eq 0 ] && ok "every flag of '${*##*/} --help' is in $page's page" ||
        fail "$page's page lacks flags of '$*' --help: ${missing[*]}"
}

check_page tpuctl 1
check_page tpu-resolver 8
check_page tpu-worker 8
check_page tpu-slice 8
check_flags tpu-resolver "$bin/tpu-resolver"
check_flags tpu-worker "$bin/tpu-worker"
check_flags tpu-slice "$bin/tpu-slice"
check_flags tpuctl "$bin/tpuctl"
cmds=$(env -i "$bin/tpuctl" --help | sed -n '/^commands:/,/^$/s/^  \([a-z_]*\) .*/\1/p')
[ -n "$cmds" ] || fail "tpuctl --help lists no commands"
for c in $cmds; do
    grep -q "^ *$c" "$tmp/tpuctl.txt" || fail "tpuctl's page does not list the command $c"
    if [ "$c" = bench ]; then
        check_flags tpuctl "$bin/tpuctl" bench allreduce
    else
        check_flags tpuctl "$bin/tpuctl" "$c"
    fi
done
[ $fails -eq 0 ] && echo "manual pages: all checks passed" || echo "manual pages: $fails checks failed"
exit $((fails > 0))
