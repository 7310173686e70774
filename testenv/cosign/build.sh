#!/usr/bin/env bash
# Builds the real cosign CLI (github.com/sigstore/cosign/v2, from Go modules) once per content of
# testenv/cosign/ and prints the path of the binary. The tests sign Plugin artifacts with it, as an
# operator would. Cached in $WCM_CACHE_DIR/testenv (default ~/.cache/wasm-controller-manager),
# keyed by a hash of this script, go.mod, go.sum, tools.go and the Go version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/testenv

if ! command -v go >/dev/null 2>&1; then
  echo "testenv/cosign/build.sh: the Go toolchain (go 1.26) is not on PATH; it is needed to build cosign for the tests. Install Go 1.26 (https://go.dev/dl) or point WCM_TESTENV_COSIGN_BIN at a cosign v2 binary." >&2
  exit 127
fi
gover=$(go env GOVERSION)
case "$gover" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "testenv/cosign/build.sh: $gover is too old; go.mod needs Go 1.26 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh go.mod go.sum tools.go; echo "$gover") | sha256sum | cut -c1-16)
out="$cache/cosign-$key"
if [ -x "$out/cosign" ]; then echo "$out/cosign"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.cosign-lock"
flock 9
if [ ! -x "$out/cosign" ]; then
  echo "testenv/cosign/build.sh: building cosign (sigstore/cosign v2; $gover); the first build takes several minutes" >&2
  start=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$here" && GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -trimpath -ldflags="-s -w" -o "$out.tmp/cosign" github.com/sigstore/cosign/v2/cmd/cosign)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "testenv/cosign/build.sh: built in $(( $(date +%s) - start ))s: $out/cosign" >&2
fi
echo "$out/cosign"
