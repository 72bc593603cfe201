#!/usr/bin/env bash
# Builds the serving image (normserve:latest, or $IMAGE) from this checkout, with no container registry needed.
#   bash scripts/build-image.sh
# Docker where a Docker engine answers, else podman (scripts/system-deps.sh installs it). The base is
# python:3.11-slim when it can be pulled (or is there); otherwise a Debian bookworm base (the same Debian and
# Python 3.11 as python:3.11-slim) is built from Debian's packages with debootstrap, once per machine, and kept
# as normserve-base:bookworm. Prints the run time and the image's size at the end.
# Variables: IMAGE (the tag), NORMSERVE_BASE_IMAGE (a base to use as is), DEBIAN_MIRROR (debootstrap's mirror;
# the host's apt source by default).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
image=${IMAGE:-normserve:latest}
pulled_base=python:3.11-slim
debian_base=normserve-base:bookworm

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=(docker)
    build_flags=()
elif command -v podman >/dev/null 2>&1; then
    engine=(podman)
    # Where podman's defaults fail (crun on hybrid cgroups, limits that may not be raised) these settings make
    # it work; elsewhere they change nothing that matters (runc is as good, 4096 open files are plenty).
    [ -n "${CONTAINERS_CONF:-}" ] || export CONTAINERS_CONF="$PWD/deploy/podman/containers.conf"
    # --format docker keeps HEALTHCHECK (OCI images drop it); host network and certificates reach the registries.
    build_flags=(--format docker --network host -v /etc/ssl/certs:/etc/ssl/certs:ro)
else
    echo "build-image.sh: neither a Docker engine nor podman (bash scripts/system-deps.sh installs podman)" >&2
    exit 1
fi

have_image() { "${engine[@]}" image inspect "$1" >/dev/null 2>&1; }

debian_mirror() {
    # The host's own Debian source: apt's deb822 file, else sources.list.
    local uri
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    echo "${DEBIAN_MIRROR:-$uri}"
}

build_debian_base() {
    local rootfs mirror
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || {
        echo "build-image.sh: $pulled_base cannot be pulled and debootstrap is missing (scripts/system-deps.sh)" >&2
        exit 1
    }
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || { echo "build-image.sh: no Debian mirror found; set DEBIAN_MIRROR" >&2; exit 1; }
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    echo "building $debian_base with debootstrap from $mirror"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" \
        >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
    rm -f "$rootfs.log"
    # What a container never reads: the downloaded .debs, apt's lists, docs, man pages and locales (~130 MB).
    rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
        "$rootfs"/usr/share/{doc,man,info,locale,lintian,linda}/*
    find "$rootfs"/usr/lib/python3* -name __pycache__ -prune -exec rm -rf {} +
    tar -C "$rootfs" -c . | "${engine[@]}" import - "$debian_base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
}

base=${NORMSERVE_BASE_IMAGE:-}
if [ -z "$base" ]; then
    if have_image "$pulled_base" || timeout 60 "${engine[@]}" pull -q "docker.io/library/$pulled_base" >/dev/null 2>&1; then
        base=$pulled_base
    else
        have_image "$debian_base" || build_debian_base
        base=$debian_base
    fi
fi

"${engine[@]}" build "${build_flags[@]}" --build-arg "BASE=$base" -t "$image" .
size=$("${engine[@]}" image inspect --format '{{.Size}}' "$image")
echo "built $image on $base in $((SECONDS - start)) s: $((size / 1000000)) MB"
