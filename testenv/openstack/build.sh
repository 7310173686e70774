#!/usr/bin/env bash
# Prepares the OpenStack test servers (Keystone + Neutron from PyPI) once per content of this
# directory and prints the path of the prepared directory: a Python venv (bin/python) holding the
# pinned packages of requirements.lock, and template/, the start state that every
# `openstack.py serve` copies (SQLite databases with Neutron's schema and Keystone's users,
# projects and catalog, Fernet keys). Cached in $WCM_CACHE_DIR/openstack (default
# ~/.cache/wasm-controller-manager), keyed by a hash of this script, the lock file, the launcher
# and the Python version, so the ~2 minute install is paid once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}/openstack

if ! command -v python3 >/dev/null 2>&1; then
  echo "testenv/openstack/build.sh: python3 is not on PATH; it is needed to run Keystone and Neutron for the tests. Install Python 3.11 (apt-get install python3 python3-venv) or point WCM_OPENSTACK_DIR at a directory this script prepared." >&2
  exit 127
fi
pyver=$(python3 --version 2>&1)
case "$pyver" in
  "Python 3.1"[1-9]*) ;;
  *) echo "testenv/openstack/build.sh: $pyver is not supported; Neutron 29 and Keystone 30 need Python 3.11 or newer" >&2; exit 1 ;;
esac

key=$( (cd "$here" && cat build.sh requirements.lock $(ls *.py | sort); echo "$pyver") | sha256sum | cut -c1-16)
dir="$cache/venv-$key"
if [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi

mkdir -p "$cache"
# One build at a time per machine: parallel test binaries wait for the first build instead of repeating it.
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  start=$(date +%s)
  rm -rf "$dir"
  echo "testenv/openstack/build.sh: installing Neutron + Keystone ($pyver) into $dir; the first install takes 1-3 minutes" >&2
  if ! python3 -m venv "$dir" >&2; then
    echo "testenv/openstack/build.sh: 'python3 -m venv' failed; on Debian/Ubuntu install python3-venv" >&2
    rm -rf "$dir"
    exit 1
  fi
  # The lock pins every package, so dependency resolution is skipped (--no-deps).
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$here/requirements.lock" >&2
  "$dir/bin/pip" check >&2
  installed=$(date +%s)
  echo "testenv/openstack/build.sh: installed in $((installed - start))s; building the template state" >&2
  "$dir/bin/python" "$here/openstack.py" template --dir "$dir/template.tmp"
  mv "$dir/template.tmp" "$dir/template"
  touch "$dir/.complete"
  echo "testenv/openstack/build.sh: template built in $(( $(date +%s) - installed ))s; ready in $(( $(date +%s) - start ))s: $dir" >&2
fi
echo "$dir"
