#!/usr/bin/env bash
# One stage of the GPU work, on the GPU machine, from the repository root with
# the folder made by scripts/gpu_bundle.sh beside it. Installs the bundle's
# wheels into a temporary directory on PYTHONPATH (never into the system),
# points the data cache at the bundle, runs the stage and leaves a few files
# (at most 8, no sub-folders) in OUTDIR.
#
# Usage: scripts/gpu_run.sh [--toy] STAGE OUTDIR [-- EXTRA FLAGS]
#   check   pytest -m gpu tests/gpu: cuDNN vs plain attention, bf16 training
#           steps, the vmapped ensemble            -> check.log, check.xml
#   bench   experiments.benchmark --preset=gpu      -> benchmark.jsonl,
#           benchmark.md, plots.tar.gz
#   sweep   experiments.ablation --preset=gpu in pieces of <= 8 minutes: the
#           same command again continues where the last one stopped (the
#           workdir runs/gpu stays while the machine does) -> results.jsonl,
#           table.md, ablation.png, validation.png, diagnostics.png,
#           attention_maps.tar.gz
#   Every stage also writes device.txt (GPU name, driver, jax, jaxlib, flax)
#   and run.log. EXTRA FLAGS go to the stage's Python command, e.g.
#   `-- --suite=kernels` for bench.
#   --toy   each stage at toy size, to run the whole path on a CPU machine:
#           check still collects tests/gpu (skipped without a GPU), bench runs
#           --preset=tiny, sweep a 6-step two-arm sweep on the bundled corpus.
# Environment: GPU_BUNDLE (default gpu_bundle), PYTHON (default python3).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
usage="usage: scripts/gpu_run.sh [--toy] check|bench|sweep OUTDIR [-- EXTRA FLAGS]"
die() { echo "error: $*" >&2; exit 2; }

toy=0
if [ "${1:-}" = "--toy" ]; then toy=1; shift; fi
[ $# -ge 2 ] || die "$usage"
stage="$1"; out="$2"; shift 2
if [ $# -gt 0 ]; then
  [ "$1" = "--" ] || die "unexpected argument '$1'; $usage"
  shift
fi
extra=("$@")
case "$stage" in check|bench|sweep) ;; *) die "STAGE must be check, bench or sweep, got '$stage'." ;; esac
bundle="$(realpath -m "${GPU_BUNDLE:-$repo/gpu_bundle}")"
py="${PYTHON:-python3}"
[ -f "$bundle/SHA256SUMS" ] || die "no bundle at $bundle (GPU_BUNDLE): make it with scripts/gpu_bundle.sh on a machine with the package registries."
command -v "$py" >/dev/null || die "no Python '$py' (PYTHON)."
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || die "OUTDIR '$out' cannot be created or written."
out="$(cd "$out" && pwd)"
(cd "$bundle" && sha256sum --quiet --strict -c SHA256SUMS) \
  || die "the bundle at $bundle does not match its SHA256SUMS: rebuild it with scripts/gpu_bundle.sh."

site="$(mktemp -d "${TMPDIR:-/tmp}/attention_jax_site.XXXXXX")"
trap 'rm -rf "$site"' EXIT
"$py" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$site" \
  "$bundle"/wheels/*.whl
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
export ATTENTION_JAX_CACHE="$bundle/cache"

"$py" - > "$out/device.txt" <<'EOF'
import subprocess, jax, jaxlib, flax
try:
  smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True,
                       timeout=30).stdout.strip() or "none"
except (OSError, subprocess.SubprocessError):
  smi = "none (no nvidia-smi)"
print(f"nvidia-smi: {smi}")
print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
      f"backend {jax.default_backend()}, devices {jax.devices()}")
EOF
cat "$out/device.txt"

log="$out/run.log"
# Copies the newest report files of WORKDIR to OUTDIR; plots beyond the named
# ones go into one archive (OUTDIR takes at most 8 files).
collect() {
  local workdir="$1" archive="$2"; shift 2
  local f
  for f in "$@"; do [ -f "$workdir/$f" ] && cp "$workdir/$f" "$out/"; done
  (cd "$workdir" && find . -maxdepth 1 -name '*.png' $(printf -- "! -name %s " "$@") -print0 \
     | tar --null -czf "$out/$archive" --files-from=-)
}

case "$stage" in
  check)
    "$py" -m pytest -q -p no:cacheprovider -m gpu tests/gpu --junitxml="$out/check.xml" \
      "${extra[@]}" 2>&1 | tee "$out/check.log"
    exit "${PIPESTATUS[0]}"
    ;;
  bench)
    preset=gpu; [ "$toy" = 1 ] && preset=tiny
    workdir="$repo/runs/gpu_bench"
    "$py" -m experiments.benchmark --preset="$preset" --workdir="$workdir" "${extra[@]}" \
      2>&1 | tee "$log"
    status="${PIPESTATUS[0]}"
    collect "$workdir" plots.tar.gz benchmark.jsonl benchmark.md
    exit "$status"
    ;;
  sweep)
    workdir="$repo/runs/gpu"
    flags=(--preset=gpu --max_minutes=8)
    if [ "$toy" = 1 ]; then
      workdir="$repo/runs/gpu_toy"
      flags+=(--arms=additive,multiplicative --dims=8,16 --seeds=2 --steps=6
              --embed_dim=16 --hidden_dim=16 --decoder_layers=1 --batch_size=8
              --max_length=24 --eval_every=3 --eval_examples=8 --test_examples=8
              --eval_batch_size=8 --beam_size=2 --diag_every=3 --checkpoint_every=3
              --log_every=3)
    fi
    "$py" -m experiments.ablation "${flags[@]}" --workdir="$workdir" "${extra[@]}" 2>&1 \
      | tee "$log"
    status="${PIPESTATUS[0]}"
    collect "$workdir" attention_maps.tar.gz results.jsonl table.md ablation.png \
      validation.png diagnostics.png
    exit "$status"
    ;;
esac
