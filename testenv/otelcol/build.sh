#!/usr/bin/env bash
# Builds the test OpenTelemetry Collector (testenv-otelcol: the upstream collector modules with the
# OTLP receiver and the contrib file exporter) once per content of testenv/otelcol/ and prints the
# path of the binary. Cached in $WCM_CACHE_DIR/testenv (default ~/.cache/wasm-controller-manager),
# keyed by a hash of this script, main.go, go.mod, go.sum and the Go version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/testenv

if ! command -v go >/dev/null 2>&1; then
  echo "testenv/otelcol/build.sh: the Go toolchain (go 1.26) is not on PATH; it is needed to build the test OpenTelemetry Collector. Install Go 1.26 (https://go.dev/dl) or point WCM_TESTENV_OTELCOL_BIN at a built testenv-otelcol." >&2
  exit 127
fi
gover=$(go env GOVERSION)
case "$gover" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "testenv/otelcol/build.sh: $gover is too old; go.mod needs Go 1.26 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh go.mod go.sum $(ls *.go | sort); echo "$gover") | sha256sum | cut -c1-16)
out="$cache/otelcol-$key"
if [ -x "$out/testenv-otelcol" ]; then echo "$out/testenv-otelcol"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.otelcol-lock"
flock 9
if [ ! -x "$out/testenv-otelcol" ]; then
  echo "testenv/otelcol/build.sh: building the test OpenTelemetry Collector (collector v0.161.0, OTLP receiver, file exporter; $gover); the first build takes about a minute" >&2
  start=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$here" && GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -trimpath -ldflags="-s -w" -o "$out.tmp/testenv-otelcol" .)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "testenv/otelcol/build.sh: built in $(( $(date +%s) - start ))s: $out/testenv-otelcol" >&2
fi
echo "$out/testenv-otelcol"
