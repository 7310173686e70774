#!/usr/bin/env bash
# Builds the config-reloader (Python) into a component with componentize-py, against the same WIT
# world as the Rust plugins: $WCM_PLUGIN_ARTIFACTS/config_reloader.wasm. The toolchain is installed
# from PyPI into a venv under $WCM_CACHE_DIR (once per requirements.txt); the component is rebuilt
# only when its sources, the WIT or the toolchain change. `build.sh test` runs the native tests of
# its logic with that venv's pytest instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${WCM_CACHE_DIR:=$HOME/.cache/wasm-controller-manager}"
: "${WCM_PLUGIN_ARTIFACTS:=${CARGO_TARGET_DIR:-$root/target}/wasm32-wasip2/plugin}"
mkdir -p "$WCM_CACHE_DIR" "$WCM_PLUGIN_ARTIFACTS"

venv="$WCM_CACHE_DIR/componentize-py-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/componentize-py" ] || [ ! -f "$venv/.complete" ]; then
  echo "config-reloader: installing componentize-py into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$venv/.complete"
fi

if [ "${1:-}" = test ]; then
  cd "$here"
  exec "$venv/bin/python" -m pytest -q -p no:cacheprovider .
fi

out="$WCM_PLUGIN_ARTIFACTS/config_reloader.wasm"
# The lock is held to the end: two builds never write the same output at once.
# Built against wcm:reconciler@0.1.0 (frozen in host/wit-0.1.0), which the host keeps serving: its
# end-to-end test is also the proof that a 0.1 plugin works beside 0.2 ones.
wit="$root/host/wit-0.1.0"
stamp=$(cat "$here"/app.py "$here"/reloader.py "$here/requirements.txt" "$wit"/*.wit "$wit"/deps/*.wit | sha256sum | cut -c1-32)
if [ -f "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
cd "$here"
"$venv/bin/componentize-py" -d "$wit" -w plugin componentize app -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
echo "$stamp" > "$out.stamp"
