#!/usr/bin/env bash
# Builds the test registry (testenv-registry: CNCF distribution v3 in process, and a push
# subcommand) once per content of testenv/registry/ and prints the path of the binary. Cached in
# $WCM_CACHE_DIR/testenv (default ~/.cache/wasm-controller-manager), keyed by a hash of this
# script, the Go sources, go.mod, go.sum and the Go version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/testenv

if ! command -v go >/dev/null 2>&1; then
  echo "testenv/registry/build.sh: the Go toolchain (go 1.26) is not on PATH; it is needed to build the test registry. Install Go 1.26 (https://go.dev/dl) or point WCM_TESTENV_REGISTRY_BIN at a built testenv-registry." >&2
  exit 127
fi
gover=$(go env GOVERSION)
case "$gover" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "testenv/registry/build.sh: $gover is too old; go.mod needs Go 1.26 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh go.mod go.sum $(ls *.go | sort); echo "$gover") | sha256sum | cut -c1-16)
out="$cache/registry-$key"
if [ -x "$out/testenv-registry" ]; then echo "$out/testenv-registry"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.registry-lock"
flock 9
if [ ! -x "$out/testenv-registry" ]; then
  echo "testenv/registry/build.sh: building the test registry (distribution v3; $gover); the first build takes about a minute" >&2
  start=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$here" && GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -trimpath -ldflags="-s -w" -o "$out.tmp/testenv-registry" .)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "testenv/registry/build.sh: built in $(( $(date +%s) - start ))s: $out/testenv-registry" >&2
fi
echo "$out/testenv-registry"
