#!/usr/bin/env bash
# Makes the image deploy/Dockerfile builds on (debian:bookworm) in the local
# Docker engine when it cannot be pulled: a minimal Debian 12 made with
# debootstrap from Debian's own packages, imported as debian:bookworm. The
# packages come from the mirror this machine's apt is set up with (the first
# source of /etc/apt/sources.list, sources.list.d/*.list and *.sources that
# serves bookworm; its bookworm-security source for the image's security
# updates), through apt's proxy if it has one, so it works behind whatever
# mirror the machine uses; TPUEMU_DEBIAN_MIRROR (and
# TPUEMU_DEBIAN_SECURITY_MIRROR) set them instead.
# Does nothing when the engine already has the image; tries `docker pull`
# first. The root file system is kept as a tarball (build-docker/ in the
# repository, or $TPUEMU_BASE_CACHE) so the next run imports it without
# downloading again. Needs root (debootstrap) and the packages debootstrap
# and docker.io. With --tarball it only makes the tarball (no Docker engine
# needed) and prints its path: the systemd test boots its container from it.
#
#   deploy/make-base-image.sh                 # debian:bookworm
#   TPUEMU_BASE_IMAGE=debian:bookworm TPUEMU_BASE_CACHE=DIR deploy/make-base-image.sh
#   deploy/make-base-image.sh --tarball       # just the tarball; its path on stdout
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${TPUEMU_BASE_IMAGE:-debian:bookworm}
cache=${TPUEMU_BASE_CACHE:-$root/build-docker}
docker=${DOCKER:-docker}
tarball=$cache/debian-bookworm-minbase.tar

die() { echo "make-base-image: $*" >&2; exit 1; }

# "URI SUITE" for every enabled deb source apt reads: one-line *.list entries
# ("deb [options] URI SUITE COMPONENT...") and deb822 *.sources paragraphs
# (Types, URIs, Suites, Enabled), in apt's order. $TPUEMU_APT_DIR: another /etc/apt.
apt_sources() {
    local dir=${TPUEMU_APT_DIR:-/etc/apt} files=()
    [ -f "$dir/sources.list" ] && files+=("$dir/sources.list")
    for f in "$dir"/sources.list.d/*.list "$dir"/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ ${#files[@]} -gt 0 ] || return 0
    awk '
    function flush(   n, m, i, j, U, S) {
        if (types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no") {
            n = split(uris, U, /[ \t]+/); m = split(suites, S, /[ \t]+/)
            for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) if (U[i] != "" && S[j] != "") print U[i], S[j]
        }
        types = uris = suites = enabled = key = ""
    }
    FNR == 1 { flush() }
    FILENAME ~ /\.sources$/ {
        if ($0 ~ /^#/) next
        if ($0 ~ /^[ \t]*$/) { flush(); next }
        if ($0 ~ /^[ \t]/) { v = $0 }
        else { key = tolower(substr($0, 1, index($0, ":") - 1)); v = substr($0, index($0, ":") + 1) }
        if (key == "types") types = types " " v
        else if (key == "uris") uris = uris " " v
        else if (key == "suites") suites = suites " " v
        else if (key == "enabled") { gsub(/[ \t]/, "", v); enabled = v }
        next
    }
    {
        line = $0; sub(/#.*/, "", line); gsub(/\[[^]]*\]/, " ", line)
        n = split(line, f, /[ \t]+/); k = (f[1] == "") ? 2 : 1
        if (f[k] == "deb" && f[k + 2] != "") print f[k + 1], f[k + 2]
    }
    END { flush() }' "${files[@]}"
}

# The first URI apt takes SUITE from that debootstrap can use (http, https, file).
apt_mirror_for() {
    apt_sources | awk -v suite="$1" '$2 == suite && $1 ~ /^(https?|file):\/\// { sub(/\/+$/, "", $1); print $1; exit }'
}

mirror=${TPUEMU_DEBIAN_MIRROR:-$(apt_mirror_for bookworm)}
security=${TPUEMU_DEBIAN_SECURITY_MIRROR:-$(apt_mirror_for bookworm-security)}
# debootstrap fetches with wget, which takes the proxy from the environment
if [ -z "${http_proxy:-}" ] && command -v apt-config >/dev/null; then
    proxy=$(apt-config shell p Acquire::http::Proxy 2>/dev/null | sed -n "s/^p='\(.*\)'$/\1/p")
    [ -n "$proxy" ] && [ "$proxy" != DIRECT ] && export http_proxy=$proxy
fi

tarball_only=0
case ${1:-} in
--tarball) tarball_only=1 ;;
'') ;;
*) die "usage: deploy/make-base-image.sh [--tarball]" ;;
esac

make_tarball() {
    [ -s "$tarball" ] && return 0
    [ -n "$mirror" ] || die "none of this machine's apt sources serves Debian bookworm (apt_sources: $(apt_sources | tr '\n' ';')); set TPUEMU_DEBIAN_MIRROR to a Debian mirror's URL"
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root (run with sudo)"
    command -v debootstrap >/dev/null || die "no debootstrap; apt-get install debootstrap"
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    echo "make-base-image: debootstrap --variant=minbase bookworm from $mirror (a few minutes)" >&2
    if ! debootstrap --variant=minbase bookworm "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
        tail -20 "$work/debootstrap.log" >&2
        die "debootstrap failed (is $mirror reachable? set TPUEMU_DEBIAN_MIRROR)"
    fi
    # what an image needs to be small and to find packages: no apt lists, no caches
    rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin \
        "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/log/"*.log
    # the image's apt uses the same mirrors as this machine's
    {
        printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror"
        [ -n "$security" ] && printf 'deb %s bookworm-security main\n' "$security"
    } >"$work/root/etc/apt/sources.list"
    [ -n "$security" ] || echo "make-base-image: no bookworm-security source in this machine's apt; the image has none" >&2
    tar -C "$work/root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$work"
    trap - EXIT
}

if [ $tarball_only -eq 1 ]; then
    make_tarball
    echo "$tarball"
    exit 0
fi

command -v "$docker" >/dev/null || die "no docker client ($docker); apt-get install docker.io"
"$docker" version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    die "cannot reach the Docker engine: $("$docker" version --format '{{.Server.Version}}' 2>&1 | grep -v '^$' | tail -1)"

if "$docker" image inspect "$image" >/dev/null 2>&1; then
    echo "make-base-image: $image is already there"
    exit 0
fi
if "$docker" pull -q "$image" >/dev/null 2>&1; then
    echo "make-base-image: pulled $image"
    exit 0
fi
echo "make-base-image: cannot pull $image; making it with debootstrap"

make_tarball
echo "make-base-image: importing $tarball as $image"
"$docker" import -c 'CMD ["bash"]' - "$image" <"$tarball" >/dev/null ||
    die "docker import of $tarball failed"
"$docker" run --rm --network none "$image" true ||
    die "the imported $image does not run"
echo "make-base-image: $image is ready"
