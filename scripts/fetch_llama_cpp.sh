#!/usr/bin/env bash
# Install step: fetch the llama.cpp source tree from PyPI (the llama-cpp-python sdist vendors it) and unpack it
# under $DAEDALUS_CACHE_DIR/src/. Idempotent; prints the source tree path. The CMake build is product code
# (daedalus.engines.llama_cpp.build), run by the tests' session fixture, `make demo` or `daedalus engine build`.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${DAEDALUS_CACHE_DIR:-$ROOT/.cache}"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
DEST="$CACHE/src/llama-cpp-python-$VERSION"
TREE="$DEST/vendor/llama.cpp"
if [[ -f "$TREE/CMakeLists.txt" ]]; then
  echo "$TREE"
  exit 0
fi
mkdir -p "$CACHE/src"
TMP="$(mktemp -d "$CACHE/src/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
"$PIP" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TMP" >&2
tar -xzf "$TMP/llama_cpp_python-$VERSION.tar.gz" -C "$TMP"
# Rename into place only when complete, so an interrupted fetch never leaves a half tree behind.
rm -rf "$DEST"
mv "$TMP/llama_cpp_python-$VERSION" "$DEST"
echo "$TREE"
