#!/usr/bin/env bash
# Creates the virtual environment and installs the package with its test extra.
# Usage: scripts/bootstrap.sh PYTHON VENV
set -euo pipefail
py="${1:-python3}"
venv="${2:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  if ! "$py" -m venv "$venv" 2>/dev/null; then
    # Debian/Ubuntu ship venv separately.
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$py" -m venv "$venv"
    else
      echo "error: '$py -m venv' failed; install it with: sudo apt-get install python3-venv" >&2
      exit 1
    fi
  fi
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[test]"
