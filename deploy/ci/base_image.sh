#!/usr/bin/env bash
# Make a local stand-in for the Dockerfile's base image (`python:3.11-slim`, which is Debian bookworm's) for builds
# that cannot reach Docker Hub: Debian bookworm from Debian's archive by `debootstrap`, with Python 3.11, venv, pip,
# CA certificates and `python` resolving to python3, imported into podman's local storage.
#
# The root file system is cached outside the checkout, like llama-server's build (tests/real_upstream):
#   ${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}/python-base-<suite>-<revision>/rootfs.tar
# and the import is skipped when podman already has the image. Prints the image name on its last line of stdout,
# for `--build-arg PYTHON_IMAGE=...`. Needs root (debootstrap and podman), and debootstrap and podman installed.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), COMPACTION_PROXY_CACHE.
set -euo pipefail

SUITE="bookworm"
# Bump when the package list below changes, so a cached root file system is not reused for a different base.
REVISION="1"
PACKAGES="python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE="localhost/compaction-proxy-python-base:$SUITE-$REVISION"
CACHE_ROOT="${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}"
DEST="$CACHE_ROOT/python-base-$SUITE-$REVISION"
TARBALL="$DEST/rootfs.tar"

if [ ! -f "$TARBALL" ]; then
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/python-base.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
    echo "base_image.sh: debootstrap $SUITE from $MIRROR" >&2
    start=$(date +%s)
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$WORK/rootfs" "$MIRROR" >&2
    # What python:3.11-slim does not carry either: apt's package lists and cached .debs.
    rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/archives/*.deb
    echo "base_image.sh: root file system made in $(( $(date +%s) - start ))s" >&2
    # Install atomically: a half-written cache folder must never look like a finished one.
    mkdir -p "$CACHE_ROOT"
    STAGE="$(mktemp -d "$CACHE_ROOT/.python-base-$SUITE-$REVISION.XXXXXX")"
    tar --numeric-owner -C "$WORK/rootfs" -cf "$STAGE/rootfs.tar" .
    rm -rf "$DEST"
    mv "$STAGE" "$DEST"
fi

if ! podman image exists "$IMAGE"; then
    echo "base_image.sh: importing $TARBALL as $IMAGE" >&2
    podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$TARBALL" "$IMAGE" >&2
fi
echo "$IMAGE"
