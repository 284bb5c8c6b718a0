#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for the real-upstream test tier (issue 9).
#
# The sources are the llama.cpp tree vendored in PyPI's llama-cpp-python sdist, so the build needs
# nothing but the package registries. The binary lands in a cache folder outside the checkout and is
# reused when present:
#   ${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}/llama-server-<version>/bin/llama-server
# Prints that path on its last line of stdout. About 7 minutes on 2 cores the first time.
set -euo pipefail

VERSION="0.3.36"
CACHE_ROOT="${COMPACTION_PROXY_CACHE:-$HOME/.cache/compaction-proxy}"
DEST="$CACHE_ROOT/llama-server-$VERSION"
BIN="$DEST/bin/llama-server"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi

# Toolchain: cmake, make and a C++ compiler (install with apt when missing and we can).
if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""
        if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
        $SUDO apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake g++ make >&2
    else
        echo "build_llama_server.sh: cmake and g++ are required" >&2
        exit 1
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "build_llama_server.sh: downloading llama-cpp-python==$VERSION sdist" >&2
# `--no-binary llama-cpp-python` (not `:all:`): the sdist for it, wheels for its build backend, which pip
# installs to read the metadata (`:all:` would build scikit-build-core and its own build chain from source too).
"$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2
mkdir -p "$WORK/src"
tar -xzf "$WORK"/dl/*.tar.gz -C "$WORK/src"
SRC="$(echo "$WORK"/src/*/vendor/llama.cpp)"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "build_llama_server.sh: no vendored llama.cpp in the sdist at $SRC" >&2
    exit 1
fi

echo "build_llama_server.sh: building llama-server with $JOBS jobs" >&2
start=$(date +%s)
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2
echo "build_llama_server.sh: built in $(( $(date +%s) - start ))s" >&2

# Install atomically: a half-written cache folder must never look like a finished build.
mkdir -p "$CACHE_ROOT"
STAGE="$(mktemp -d "$CACHE_ROOT/.llama-server-$VERSION.XXXXXX")"
mkdir -p "$STAGE/bin"
cp "$WORK/build/bin/llama-server" "$STAGE/bin/llama-server"
chmod 755 "$STAGE/bin/llama-server"
rm -rf "$DEST"
mv "$STAGE" "$DEST"
echo "$BIN"
