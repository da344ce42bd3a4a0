#!/usr/bin/env bash
# Regenerates the lock files (exact versions with their sha256 hashes) from
# pyproject.toml's dependencies and its `test` extra, with uv (pinned below,
# installed into build/lock-tools, never into the project's venv):
#   requirements/cpu-py311.lock.txt        Python 3.11, Linux x86_64 (make's default here)
#   requirements/gpu-image-py312.lock.txt  Python 3.12 with the GPU image's jax
#                                          (requirements/gpu-image-py312.in)
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

compile() {  # PYTHON_VERSION LOCK_FILE [MORE OPTIONS]
  "$tools/bin/uv" pip compile pyproject.toml --extra test --generate-hashes --quiet \
    --python-version "$1" --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command "make lock" --output-file "$2" "${@:3}"
  echo "wrote $2 ($(grep -c '^[A-Za-z0-9].*==' "$2") packages)"
}

compile 3.11 requirements/cpu-py311.lock.txt "$@"
compile 3.12 requirements/gpu-image-py312.lock.txt \
  --constraint requirements/gpu-image-py312.in "$@"
