#!/usr/bin/env bash
# Builds children-py (a test plugin in Python using contract 0.3: children, a schedule, a metric)
# with componentize-py against wit/ (wcm:reconciler@0.3.0): $WCM_PLUGIN_ARTIFACTS/examples/children_py.wasm
# (a test plugin: beside the Rust test plugins, not among the shipped ones scripts/run-local runs).
# The toolchain venv is the config-reloader's (same requirements.txt, same hash); the component is
# rebuilt only when its source, the WIT or the toolchain change.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${WCM_CACHE_DIR:=$HOME/.cache/wasm-controller-manager}"
: "${WCM_PLUGIN_ARTIFACTS:=${CARGO_TARGET_DIR:-$root/target}/wasm32-wasip2/plugin}"
mkdir -p "$WCM_CACHE_DIR" "$WCM_PLUGIN_ARTIFACTS/examples"

venv="$WCM_CACHE_DIR/componentize-py-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/componentize-py" ] || [ ! -f "$venv/.complete" ]; then
  echo "children-py: installing componentize-py into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$venv/.complete"
fi

out="$WCM_PLUGIN_ARTIFACTS/examples/children_py.wasm"
wit="$root/wit"
stamp=$(cat "$here"/app.py "$here/requirements.txt" "$wit"/*.wit "$wit"/deps/*.wit | sha256sum | cut -c1-32)
if [ -f "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
cd "$here"
"$venv/bin/componentize-py" -d "$wit" -w plugin componentize app -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
echo "$stamp" > "$out.stamp"
