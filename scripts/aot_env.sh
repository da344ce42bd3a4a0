#!/usr/bin/env bash
# Builds the environment of the compile check (experiments/compile_check/run.py):
# jax 0.11.2 on Python 3.12, as on the lent GPU machines, with the two
# compilers that work without their device on a CPU-only host:
#   - libtpu (the `tpu` extra of jax, from PyPI): TPU topologies;
#   - the CUDA 13 plugin and PJRT of jax: an H100 from a target description.
# Of the NVIDIA libraries only cuDNN (with the cuBLAS and NVRTC wheels it
# depends on) is installed: XLA compiles for an H100 without any of them, but
# jax.nn.dot_product_attention(implementation='cudnn') refuses to trace
# ("cuDNN not found") unless libcudnn can be loaded. WITH_CUDNN=0 leaves it
# out (~1.6 GB less; the cuDNN programs then report that error).
# Usage: scripts/aot_env.sh [PYTHON3.12] [VENV]   (default python3.12 .venv-aot)
# Idempotent: an existing environment is upgraded in place to the pins below.
set -euo pipefail
py="${1:-python3.12}"
venv="${2:-.venv-aot}"
jax_version="0.11.2"
# The Makefile passes PYTHON312 here; the error names that variable, since a
# `python3.12` that is a shim without an interpreter behind it (pyenv, asdf)
# is found on PATH and only fails when run.
version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 12) else 1)' \
    >/dev/null 2>&1; then
  if [ -n "$version" ]; then what="is Python $version"; else what="does not run"; fi
  echo "error: '$py' $what, not a working Python >= 3.12 (jax $jax_version needs it):" \
       "name one with PYTHON312=, e.g. make compile-check PYTHON312=/usr/bin/python3.12" \
       "(or bash scripts/aot_env.sh /usr/bin/python3.12)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
cudnn=()
if [ "${WITH_CUDNN:-1}" = 1 ]; then
  cudnn=("nvidia-cudnn-cu13>=9.12,<10")  # the range jax-cuda13-plugin 0.11.2 accepts
fi
"${pip[@]}" "jax[tpu]==$jax_version" "jaxlib==$jax_version" \
  "jax-cuda13-plugin==$jax_version" "jax-cuda13-pjrt==$jax_version" "${cudnn[@]}"
# The project itself (its code is imported from the checkout).
"${pip[@]}" -e .
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("jax", "jaxlib", "libtpu", "jax-cuda13-plugin", "jax-cuda13-pjrt",
             "nvidia-cudnn-cu13", "flax"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY
