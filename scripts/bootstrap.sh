#!/usr/bin/env bash
# Creates the virtual environment and installs the pinned stack: every
# dependency of the package and of its test extra at the exact version (and
# sha256 hash) of the lock file for the venv's Python, then the package itself
# (editable, no dependencies).
# Usage: scripts/bootstrap.sh PYTHON VENV [LOCK] [TARGET]
#   LOCK    a lock file; empty: the one the venv was built from before (so that
#           `make` repairing an accelerator's venv reinstalls its lock, not the
#           CPU one), else the TARGET's for the venv's Python; "none": no lock,
#           the newest versions pyproject.toml allows.
#   TARGET  cpu (default: 3.11 requirements/cpu-py311.lock.txt, 3.12
#           requirements/gpu-image-py312.lock.txt), cuda or tpu (an NVIDIA GPU or a
#           TPU VM of one's own: requirements/{cuda,tpu}-py3{11,12}.lock.txt, which
#           add jax's CUDA 13 plugin or libtpu; `make venv-cuda`, `make venv-tpu`).
#           A TARGET given picks its lock whatever the venv held before.
# The lock installed (path and sha256) is recorded in VENV/attention_jax-lock.txt;
# scripts/check_venv.py checks the venv still holds it (versions and files), and
# what it finds broken is installed again here (the Makefile runs this script
# whenever that check fails, so `make` repairs a damaged venv).
set -euo pipefail
py="${1:-python3}"
venv="${2:-.venv}"
lock="${3:-}"
target="${4:-}"
case "$target" in ""|cpu|cuda|tpu) ;;
  *) echo "error: TARGET must be cpu, cuda or tpu, got '$target'" >&2; exit 1 ;;
esac
# A misspelt Python (python3.99) made the venv step fail, which was taken for
# Debian's missing python3-venv: apt-get changed the system, then the venv
# step failed again. The interpreter is checked first, and apt-get runs only
# for one whose venv module is what is missing.
if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c 'import sys' >/dev/null 2>&1; then
  echo "error: no Python '$py' (PYTHON_SYS): name an installed one, e.g." \
       "make PYTHON_SYS=python3.11" >&2
  exit 1
fi
# The lock is chosen before the venv is made, from the Python the venv has
# or will have: a Python without a lock (a TPU VM's 3.10) used to leave an
# empty venv behind, which the next `make` took for a built one.
vpy="$venv/bin/python"
marker="$venv/attention_jax-lock.txt"
if [ -z "$lock" ] && [ -z "$target" ] && [ -f "$marker" ]; then
  previous=$(cut -d' ' -f1 "$marker")
  if [ -f "$previous" ]; then lock="$previous"; fi
fi
# The venv's own Python where it exists (it keeps the one it was made with).
if [ -x "$vpy" ]; then source_py="$vpy"; remake=", after make clean-venv ($venv was made with it)"
else source_py="$py"; remake=""; fi
version=$("$source_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$target" in cuda|tpu) make_target="make venv-$target" ;; *) make_target=make ;; esac
case "$version" in
  [0-2].*|3.[0-9]|3.10)
    # pyproject.toml's requires-python: no install, locked or not, can work,
    # so LOCK=none is not offered. A Cloud TPU VM's image ships 3.10.
    echo "error: Python $version (of '$source_py') is older than the 3.11 this project needs:" \
         "install python3.11 or python3.12 (uv python install 3.12; pyenv install 3.12; or on" \
         "Ubuntu, as on a TPU VM, the deadsnakes PPA's python3.12 and python3.12-venv) and name" \
         "it: $make_target PYTHON_SYS=python3.12$remake" >&2
    exit 1 ;;
esac
if [ -z "$lock" ]; then
  case "${target:-cpu}:$version" in
    cpu:3.11) lock=requirements/cpu-py311.lock.txt ;;
    cpu:3.12) lock=requirements/gpu-image-py312.lock.txt ;;
    cuda:3.11|cuda:3.12|tpu:3.11|tpu:3.12) lock="requirements/$target-py${version/./}.lock.txt" ;;
    *)
      echo "error: no lock file for Python $version (of '$source_py'): use Python 3.11 or 3.12" \
           "($make_target PYTHON_SYS=python3.11), or install unpinned with" \
           "'$make_target LOCK=none'" >&2
      exit 1 ;;
  esac
fi
if [ "$lock" != none ] && [ ! -f "$lock" ]; then
  echo "error: lock file '$lock' (LOCK) does not exist; 'make lock' writes the lock files" >&2
  exit 1
fi
if [ ! -x "$vpy" ]; then
  if ! "$py" -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    if "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      # The module is there: another cause, which its own message names.
      "$py" -m venv "$venv" || { echo "error: '$py -m venv $venv' failed (above)" >&2; exit 1; }
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      # Debian/Ubuntu ship venv separately.
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$py" -m venv "$venv"
    else
      echo "error: '$py -m venv' failed; install it with: sudo apt-get install python3-venv" >&2
      exit 1
    fi
  fi
fi
rm -f "$marker"
if [ "$lock" = none ]; then
  "$vpy" -m pip install -q --upgrade pip
  extras=test; case "$target" in cuda|tpu) extras="test,$target" ;; esac
  "$vpy" -m pip install -q -e ".[$extras]"
  exit 0
fi
"$vpy" -m pip install -q --require-hashes -r "$lock"
"$vpy" -m pip install -q --no-deps -e .
printf '%s %s\n' "$lock" "$(sha256sum "$lock" | cut -d' ' -f1)" > "$marker"
# pip takes a distribution whose files were deleted (site-packages/optax
# removed by hand) for installed while its metadata is there: those that
# scripts/check_venv.py finds broken (it names them) are installed again.
broken="$venv/broken-requirements.txt"
if ! "$vpy" scripts/check_venv.py --requirements "$broken"; then
  echo "reinstalling the distributions named above from $lock" >&2
  "$vpy" -m pip install -q --require-hashes --no-deps --force-reinstall -r "$broken"
  if ! "$vpy" scripts/check_venv.py; then
    rm -f "$marker" "$broken"
    echo "error: $venv is still broken after a reinstall (above); 'make clean-venv' and" \
         "'make' build it anew" >&2
    exit 1
  fi
fi
rm -f "$broken"
