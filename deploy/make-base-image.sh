#!/usr/bin/env bash
# Makes the image deploy/Dockerfile builds on (debian:bookworm) in the local
# Docker engine when it cannot be pulled: a minimal Debian 12 made with
# debootstrap from Debian's own packages, imported as debian:bookworm.
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
mirror=${TPUEMU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
docker=${DOCKER:-docker}
tarball=$cache/debian-bookworm-minbase.tar

die() { echo "make-base-image: $*" >&2; exit 1; }

tarball_only=0
case ${1:-} in
--tarball) tarball_only=1 ;;
'') ;;
*) die "usage: deploy/make-base-image.sh [--tarball]" ;;
esac

make_tarball() {
    [ -s "$tarball" ] && return 0
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
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
        "$mirror" "$mirror" >"$work/root/etc/apt/sources.list"
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
