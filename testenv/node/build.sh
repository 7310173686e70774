#!/usr/bin/env bash
# Builds the test node (testenv-node: kubelet + kube-controller-manager + kube-scheduler, and the
# pause binary for its sandbox image) once per content of testenv/node/ and prints the path of
# testenv-node. Cached in $WCM_CACHE_DIR/testenv (default ~/.cache/wasm-controller-manager), keyed
# by a hash of this script, the Go sources, go.mod, go.sum and the Go version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/testenv

if ! command -v go >/dev/null 2>&1; then
  echo "testenv/node/build.sh: the Go toolchain (go 1.26) is not on PATH; it is needed to build the test node's kubelet. Install Go 1.26 (https://go.dev/dl) or point WCM_TESTENV_NODE_BIN at a built testenv-node." >&2
  exit 127
fi
gover=$(go env GOVERSION)
case "$gover" in
  go1.2[6-9]*|go1.[3-9]*) ;;
  *) echo "testenv/node/build.sh: $gover is too old; the kubelet v1.36 needs Go 1.26 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh go.mod go.sum $(ls *.go pause/*.go | sort); echo "$gover") | sha256sum | cut -c1-16)
out="$cache/node-$key"
if [ -x "$out/testenv-node" ] && [ -x "$out/pause" ]; then echo "$out/testenv-node"; exit 0; fi

k8s_version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes v\([0-9.]*\)$/\1/p' "$here/go.mod")
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
mkdir -p "$cache"
exec 9>"$cache/.node-lock"
flock 9
if [ ! -x "$out/testenv-node" ] || [ ! -x "$out/pause" ]; then
  echo "testenv/node/build.sh: building the test node (kubelet, kube-controller-manager, kube-scheduler; $gover); the first build takes 5-10 minutes" >&2
  start=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$here" && GOTOOLCHAIN=local GOEXPERIMENT=nojsonv2 GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -trimpath -o "$out.tmp/testenv-node" \
        -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor}" . \
   && GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out.tmp/pause" ./pause)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "testenv/node/build.sh: built in $(( $(date +%s) - start ))s: $out/testenv-node" >&2
fi
echo "$out/testenv-node"
