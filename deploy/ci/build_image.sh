#!/usr/bin/env bash
# Build deploy/Dockerfile as it is with podman, on the local base-image stand-in from base_image.sh (no Docker daemon,
# no Docker Hub). Run from anywhere; the build context is the repository root. Prints the image name on its last line
# of stdout. Needs root, podman and debootstrap (`apt-get install podman buildah runc debootstrap`).
#
# pip in the build gets this machine's CA bundle as the `pip_cert` build secret (PIP_CERT, else Debian's system
# bundle), so an intercepting proxy or private index keeps working; set IMAGE_PIP_CONF to a pip configuration file to
# pass it as the `pip_conf` secret (index-url and the like). IMAGE names the result (default
# localhost/compaction-proxy:ci).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
IMAGE="${IMAGE:-localhost/compaction-proxy:ci}"
BASE="$("$ROOT/deploy/ci/base_image.sh" | tail -n 1)"

secrets=()
cert="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
if [ -s "$cert" ]; then secrets+=(--secret "id=pip_cert,src=$cert"); fi
if [ -n "${IMAGE_PIP_CONF:-}" ]; then secrets+=(--secret "id=pip_conf,src=$IMAGE_PIP_CONF"); fi

echo "build_image.sh: building $IMAGE on $BASE" >&2
start=$(date +%s)
# runc: crun refuses cgroup setups like CI's. The open-file limit cannot be raised here: state it, not inherit it.
podman --runtime runc build --format docker --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
    --build-arg "PYTHON_IMAGE=$BASE" "${secrets[@]}" -f "$ROOT/deploy/Dockerfile" -t "$IMAGE" "$ROOT" >&2
echo "build_image.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$IMAGE"
