#!/usr/bin/env bash
# Regenerates the lock files (exact versions with their sha256 hashes) from
# pyproject.toml's dependencies and its `test` extra, with uv (pinned below,
# installed into build/lock-tools, never into the project's venv):
#   requirements/cpu-py311.lock.txt        Python 3.11, Linux x86_64 (make's default here)
#   requirements/gpu-image-py312.lock.txt  Python 3.12 with the GPU image's jax
#                                          (requirements/gpu-image-py312.in)
#   requirements/{cuda,tpu}-py3{11,12}.lock.txt  with the `cuda` or `tpu` extra too, for
#                                          an NVIDIA GPU or a TPU VM of one's own
#                                          (`make venv-cuda`, `make venv-tpu`)
# A target's lock written for the first time starts from the CPU lock's versions
# (uv keeps what its output file already pins), so that an accelerator runs the
# jax, Flax and Optax the CPU tests passed with; the extra adds only its plugin
# (jax-cuda13-plugin and NVIDIA's wheels, or libtpu) at that jax's version.
# Usage: scripts/lock.sh [UV PIP COMPILE OPTIONS]   (also: make lock [LOCK_ARGS=...])
#   no options                   keep every version already locked; only what
#                                pyproject.toml newly asks for is resolved
#   --upgrade-package NAME       move NAME (and what it needs) to its newest version
#   --upgrade                    move everything to the newest versions that fit
# Hashes are of the files on PyPI (uv reads no pip.conf mirrors).
set -euo pipefail
cd "$(dirname "$0")/.."
uv_version=0.13.9
tools=build/lock-tools
python=${PYTHON_SYS:-python3}
if [ ! -x "$tools/bin/uv" ] || [ "$("$tools/bin/uv" --version | cut -d' ' -f2)" != "$uv_version" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install -q "uv==$uv_version"
fi

# The glibc the wheels may need: libtpu's wheels are manylinux_2_31 (a TPU VM's
# Ubuntu has a newer glibc), every other target's fit manylinux_2_28.
platform=x86_64-manylinux_2_28

compile() {  # PYTHON_VERSION LOCK_FILE [MORE OPTIONS]
  "$tools/bin/uv" pip compile pyproject.toml --extra test --generate-hashes --quiet \
    --python-version "$1" --python-platform "$platform" \
    --custom-compile-command "make lock" --output-file "$2" "${@:3}" || return 1
  echo "wrote $2 ($(grep -c '^[A-Za-z0-9].*==' "$2") packages)"
}

# An accelerator target's lock (TARGET = the extra), seeded from the CPU lock
# when it does not exist yet; a failed first resolution leaves no file behind.
compile_target() {  # TARGET PYTHON_VERSION [MORE OPTIONS]
  local out="requirements/$1-py${2/./}.lock.txt" seeded=0
  if [ ! -f "$out" ]; then cp requirements/cpu-py311.lock.txt "$out"; seeded=1; fi
  if ! compile "$2" "$out" --extra "$1" "${@:3}"; then
    if [ "$seeded" = 1 ]; then rm -f "$out"; fi
    echo "error: resolving the '$1' extra for Python $2 failed (above)" >&2
    exit 1
  fi
}

compile 3.11 requirements/cpu-py311.lock.txt "$@"
compile 3.12 requirements/gpu-image-py312.lock.txt \
  --constraint requirements/gpu-image-py312.in "$@"
for python_version in 3.11 3.12; do
  compile_target cuda "$python_version" "$@"
  platform=x86_64-manylinux_2_31 compile_target tpu "$python_version" "$@"
done
