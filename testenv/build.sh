#!/usr/bin/env bash
# Builds the testenv binary (etcd + kube-apiserver) once per content of testenv/ and prints its path.
# The binary is cached in $WCM_CACHE_DIR/testenv (default ~/.cache/wasm-controller-manager), keyed by a
# hash of this script, the Go sources, go.mod, go.sum and the Go version, so the ~5-9 minute first build is paid once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/testenv

if ! command -v go >/dev/null 2>&1; then
  echo "testenv/build.sh: the Go toolchain (go 1.26) is not on PATH; it is needed to build kube-apiserver and etcd for the test cluster. Install Go 1.26 (https://go.dev/dl) or point WCM_TESTENV_BIN at a built testenv binary." >&2
  exit 127
fi
gover=$(go env GOVERSION)
case "$gover" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "testenv/build.sh: $gover is too old; kube-apiserver v1.36 needs Go 1.26 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh go.mod go.sum $(ls *.go | sort); echo "$gover") | sha256sum | cut -c1-16)
bin="$cache/testenv-$key"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

# The apiserver reports this version (/version), as a released build would.
k8s_version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes v\([0-9.]*\)$/\1/p' "$here/go.mod")
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
mkdir -p "$cache"
# One build at a time per machine: parallel test binaries wait for the first build instead of repeating it.
exec 9>"$cache/.lock"
flock 9
if [ ! -x "$bin" ]; then
  echo "testenv/build.sh: building kube-apiserver + etcd ($gover); the first build takes 5-9 minutes" >&2
  start=$(date +%s)
  # nojsonv2: keep encoding/json v1 semantics (Go 1.27's default json v2 breaks kube-openapi).
  (cd "$here" && GOTOOLCHAIN=local GOEXPERIMENT=nojsonv2 GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -trimpath -o "$bin.tmp" \
        -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor}" .)
  mv "$bin.tmp" "$bin"
  echo "testenv/build.sh: built in $(( $(date +%s) - start ))s: $bin" >&2
fi
echo "$bin"
