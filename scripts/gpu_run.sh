#!/usr/bin/env bash
# One stage of the GPU work, on the GPU machine, from the repository root with
# the folder made by scripts/gpu_bundle.sh beside it. Installs the bundle's
# wheels into a temporary directory on PYTHONPATH (never into the system),
# checks that the image's versions fit them, points the data cache at the
# bundle, runs the stage under a hard time limit and then, however the stage
# ended (done, failed, killed by the limit), leaves its files in OUTDIR: at
# most 8, no sub-folders (what a device command can bring back).
#
# Usage: scripts/gpu_run.sh [--toy] STAGE OUTDIR [-- EXTRA FLAGS]
#   check      pytest -m gpu tests/gpu: cuDNN vs plain attention, bf16 training
#              steps, the vmapped ensemble        -> check.log, check.xml
#   bench      experiments.kernels.run --preset=gpu_headline, resumable: cases
#              already in benchmark.jsonl (the workdir's, or GPU_STATE's when
#              the machine is fresh) are skipped, and it stops between cases
#              at BENCH_MINUTES   -> benchmark.jsonl, benchmark.md, plots.tar.gz
#   calibrate  experiments.calibration --preset=$SWEEP_PRESET: step and
#              evaluation times of two cells, and the sweep's --steps, --dims
#              and --eval_every sized for 3 pieces  -> calibration.json,
#              calibration.md (with --steps_only: calibration_steps.json/.md,
#              each cell's training step only)
#   sweep      experiments.ablation --preset=$SWEEP_PRESET, one piece of
#              SWEEP_MINUTES, with the plan of GPU_STATE/calibration.json where
#              there is one calibrated for that preset;
#              finished cells, and the newest checkpoint of each cell cut by
#              the piece's end (where the archive stays under SWEEP_STATE_MIB),
#              come back in sweep_state.tar.gz, which the next call takes from
#              GPU_STATE on a fresh machine -> results.jsonl, table.md,
#              ablation.png, plots.tar.gz, sweep_state.tar.gz
#   Every stage also writes device.txt (GPU, driver, versions) and run.log.
#   EXTRA FLAGS go to the stage's Python command.
# Exit status: the stage command's. 0 complete; 75 stopped by its own time
# budget (the bench's and sweep's --max_minutes) with everything kept: call
# the same stage again to continue; 124 or 137 cut by STAGE_MINUTES: call
# again too; 2 a bad call (nothing run); anything else failed.
#   --toy   each stage at toy size, to run the whole path on a CPU machine:
#           check still collects tests/gpu (skipped without a GPU), bench runs
#           --preset=tiny, calibrate and sweep a two-arm toy sweep.
# Environment:
#   GPU_BUNDLE     the bundle (default gpu_bundle)
#   GPU_STATE      files an earlier call returned, carried back (default
#                  runs/gpu_state): benchmark.jsonl, calibration.json,
#                  sweep_state.tar.gz
#   GPU_RUNS       where the stages' workdirs and JAX's compilation cache live
#                  (default runs/, which stays as long as the machine does)
#   STAGE_MINUTES  hard limit of the stage's command (default 8: with the wheel
#                  install, checks and collection the call stays under the
#                  device's 10 minutes); at the limit it gets SIGTERM, 20 s
#                  later SIGKILL, and its files are collected all the same
#   BENCH_MINUTES  the benchmark's --max_minutes (default 6.5)
#   SWEEP_MINUTES  the sweep piece's --max_minutes (default 7)
#   SWEEP_PRESET   the preset of the calibrate and sweep stages (default gpu;
#                  `quick` runs the CPU table's recipe unchanged on the GPU);
#                  the sweep's workdir is runs/gpu for gpu, else runs/gpu_PRESET
#   SWEEP_STATE_MIB  the largest sweep_state.tar.gz with checkpoints (default
#                  6: it is carried back in GPU_STATE, within the 8 MiB that
#                  scripts/gpu_bundle.sh keeps for it); a larger one is made
#                  without them, said in run.log, and the cells they belong to
#                  start again from step 0 on a fresh machine
#   PYTHON         the image's Python (default python3)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
usage="usage: scripts/gpu_run.sh [--toy] check|bench|calibrate|sweep OUTDIR [-- EXTRA FLAGS]"
die() { echo "error: $*" >&2; exit 2; }
is_minutes() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v m="$1" 'BEGIN{exit !(m > 0)}'; }

toy=0
if [ "${1:-}" = "--toy" ]; then toy=1; shift; fi
[ $# -ge 2 ] || die "$usage"
stage="$1"; out="$2"; shift 2
if [ $# -gt 0 ]; then
  [ "$1" = "--" ] || die "unexpected argument '$1'; $usage"
  shift
fi
extra=("$@")
case "$stage" in check|bench|calibrate|sweep) ;;
  *) die "STAGE must be check, bench, calibrate or sweep, got '$stage'." ;; esac
stage_minutes="${STAGE_MINUTES:-8}"
bench_minutes="${BENCH_MINUTES:-6.5}"
sweep_minutes="${SWEEP_MINUTES:-7}"
sweep_state_mib="${SWEEP_STATE_MIB:-6}"
sweep_preset="${SWEEP_PRESET:-gpu}"
[[ "$sweep_preset" =~ ^[a-z0-9_]+$ ]] \
  || die "SWEEP_PRESET must be a preset's name (letters, digits, _), got '$sweep_preset'."
for v in STAGE_MINUTES:"$stage_minutes" BENCH_MINUTES:"$bench_minutes" \
         SWEEP_MINUTES:"$sweep_minutes"; do
  is_minutes "${v#*:}" || die "${v%%:*} must be a number of minutes > 0, got '${v#*:}'."
done
[[ "$sweep_state_mib" =~ ^[0-9]+$ ]] \
  || die "SWEEP_STATE_MIB must be a whole number of MiB, got '$sweep_state_mib'."
bundle="$(realpath -m "${GPU_BUNDLE:-$repo/gpu_bundle}")"
state="$(realpath -m "${GPU_STATE:-$repo/runs/gpu_state}")"
runs="$(realpath -m "${GPU_RUNS:-$repo/runs}")"
py="${PYTHON:-python3}"
[ -f "$bundle/SHA256SUMS" ] || die "no bundle at $bundle (GPU_BUNDLE): make it with scripts/gpu_bundle.sh on a machine with the package registries, and name it in the device call's carry."
command -v "$py" >/dev/null || die "no Python '$py' (PYTHON)."
[ ! -e "$state" ] || [ -d "$state" ] || die "GPU_STATE $state is not a folder."
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
# No .git travels to the device: result rows take the commit recorded when the
# bundle was built (attention_jax/measure/provenance.py reads this variable).
if [ ! -e "$repo/.git" ] && [ -z "${ATTENTION_JAX_COMMIT:-}" ] && [ -f "$bundle/COMMIT" ]; then
  export ATTENTION_JAX_COMMIT="$(cat "$bundle/COMMIT")"
fi
# Compiled programs survive between calls while the machine stays (GPU_RUNS
# is kept with it): a resumed sweep piece or benchmark does not
# compile again what it compiled before.
export JAX_COMPILATION_CACHE_DIR="$runs/jax_compilation_cache"
export PYTHONUNBUFFERED=1

versions="$("$py" "$repo/scripts/gpu_versions.py" "$site" "$repo/pyproject.toml")" || exit 2
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
# float32 matmuls on a GPU are TF32 unless this says "highest" (JAX_DEFAULT_MATMUL_PRECISION)
print(f"default matmul precision: {jax.config.jax_default_matmul_precision or 'default'}")
EOF
echo "$versions" >> "$out/device.txt"
cat "$out/device.txt"

log="$out/run.log"
# Runs the stage's command under the hard limit; its output goes to the
# terminal and to run.log (or LOG). Never fails: the status is in $status.
status=0
limited() {
  set +e
  timeout --signal=TERM --kill-after=20 "$(awk -v m="$stage_minutes" 'BEGIN{print int(m*60)}')" \
    "$@" 2>&1 | tee -a "${LOG:-$log}"
  status="${PIPESTATUS[0]}"
  set -e
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    echo "stage stopped by its limit of $stage_minutes minutes (STAGE_MINUTES); files collected" \
      | tee -a "${LOG:-$log}"
  elif [ "$status" = "$stopped" ]; then
    echo "stage stopped by its --max_minutes with everything kept (exit $stopped); call it" \
      "again to continue" | tee -a "${LOG:-$log}"
  fi
}
# The drivers' status for "stopped by --max_minutes, resumable" (experiments/common.py).
stopped=75
# Copies the named report files of WORKDIR to OUTDIR (those that exist).
copy_reports() {
  local workdir="$1"; shift
  local f
  for f in "$@"; do if [ -f "$workdir/$f" ]; then cp "$workdir/$f" "$out/"; fi; done
}
# The .png files of WORKDIR other than the named ones, in one archive.
archive_plots() {
  local workdir="$1" archive="$2"; shift 2
  [ -d "$workdir" ] || return 0
  local skip=() f
  for f in "$@"; do skip+=(! -name "$f"); done
  (cd "$workdir" && find . -maxdepth 1 -name '*.png' "${skip[@]}" -print0 \
     | tar --null -czf "$out/$archive" --files-from=-)
}

# The files of a sweep workdir (run from inside it, NUL-separated) another
# machine needs: every file but locks, temporaries and checkpoints, and with
# $1 = 1, of each cell not finished (no result.json), its newest checkpoint
# step with the step's checksum file (`training/checkpoints.py`), so that the
# cell resumes there and not from step 0. A warm machine's own files are at
# least as new as these: they are unpacked without replacing any.
state_files() {
  find . -type f ! -path '*/checkpoints/*' ! -path '*/checkpoints_sha256/*' \
    ! -path '*/checkpoints_damaged/*' ! -name '.lock' ! -name '*.tmp*' -print0
  [ "$1" = 1 ] || return 0
  local run step
  for run in ./runs/*/ ./*/runs/*/; do  # a sweep's cells, and a grid's points'
    run="${run%/}"
    [ -d "$run/checkpoints" ] && [ ! -f "$run/result.json" ] || continue
    step=$(find "$run/checkpoints" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9]+' \
             -printf '%f\n' | sort -n | tail -n 1)
    [ -n "$step" ] && [ -f "$run/checkpoints_sha256/$step.json" ] || continue
    find "$run/checkpoints/$step" -type f -print0
    printf '%s\0' "$run/checkpoints_sha256/$step.json"
  done
}

# warm-up shorter than the toy's 6 steps: a run that never leaves warm-up is refused
toy_sweep=(--arms=additive,multiplicative --dims=8,16 --seeds=2 --steps=6 --embed_dim=16
           --hidden_dim=16 --decoder_layers=1 --batch_size=8 --max_length=24 --eval_every=3
           --eval_examples=8 --test_examples=8 --eval_batch_size=8 --beam_size=2
           --diag_every=3 --checkpoint_every=3 --log_every=3 --warmup_steps=2)

case "$stage" in
  check)
    LOG="$out/check.log" limited "$py" -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
      --junitxml="$out/check.xml" "${extra[@]}"
    ;;
  bench)
    preset=gpu_headline; [ "$toy" = 1 ] && preset=tiny
    workdir="$runs/gpu_bench"
    mkdir -p "$workdir"
    # A fresh machine: continue from the rows an earlier call brought back.
    if [ ! -s "$workdir/benchmark.jsonl" ] && [ -s "$state/benchmark.jsonl" ]; then
      cp "$state/benchmark.jsonl" "$workdir/benchmark.jsonl"
    fi
    flags=(--preset="$preset" --workdir="$workdir" --max_minutes="$bench_minutes")
    limited "$py" -m experiments.kernels.run "${flags[@]}" "${extra[@]}"
    # Killed or failed: the report of the rows on disk (stopped, it wrote its own).
    if [ "$status" != 0 ] && [ "$status" != "$stopped" ]; then
      timeout 60 "$py" -m experiments.kernels.run "${flags[@]}" "${extra[@]}" --report_only \
        >> "$log" 2>&1 || echo "the report of the rows so far failed too" | tee -a "$log"
    fi
    copy_reports "$workdir" benchmark.jsonl benchmark.md
    archive_plots "$workdir" plots.tar.gz
    ;;
  calibrate)
    workdir="$runs/gpu_calibration"
    flags=(--preset="$sweep_preset" --workdir="$workdir" --pieces=3 --piece_minutes="$sweep_minutes")
    if [ "$toy" = 1 ]; then
      # The toy's plan only exercises the path: a shared 2-core CPU compiles
      # for minutes, so the toy sizes itself against an hour (capped at --steps=6).
      flags+=("${toy_sweep[@]}" --calibration_steps=3 --min_steps=3 --piece_minutes=60)
    fi
    limited "$py" -m experiments.calibration "${flags[@]}" "${extra[@]}"
    copy_reports "$workdir" calibration.json calibration.md calibration_steps.json calibration_steps.md
    ;;
  sweep)
    workdir="$runs/gpu"
    [ "$sweep_preset" = gpu ] || workdir="$runs/gpu_$sweep_preset"
    flags=(--preset="$sweep_preset" --max_minutes="$sweep_minutes")
    if [ "$toy" = 1 ]; then
      workdir="$runs/gpu_toy"
      flags+=("${toy_sweep[@]}")
    fi
    if [ -f "$state/calibration.json" ]; then
      plan="$("$py" - "$state/calibration.json" "$sweep_preset" <<'EOF'
import json, sys
written = json.load(open(sys.argv[1]))
if written.get("preset", "gpu") != sys.argv[2]:  # another preset's plan: not this sweep's
  sys.exit(0)
plan = written["plan"]
if not plan["fits"]:
  sys.exit(f"error: the calibration says the sweep does not fit ({plan['steps']} steps "
           f"for dims {plan['dims']}); see calibration.md")
print(" ".join(plan["flags"]))
EOF
)" || exit 2
      if [ -n "$plan" ]; then
        read -r -a plan_flags <<< "$plan"
        flags+=("${plan_flags[@]}")
        echo "plan from $state/calibration.json: ${plan_flags[*]}" | tee -a "$log"
      else
        echo "$state/calibration.json is another preset's plan: --preset=$sweep_preset" \
          "runs as the preset says" | tee -a "$log"
      fi
    fi
    mkdir -p "$workdir"
    # A fresh machine: the cells an earlier call finished (never replacing files here).
    if [ -f "$state/sweep_state.tar.gz" ]; then
      tar -xzf "$state/sweep_state.tar.gz" -C "$workdir" --skip-old-files
    fi
    limited "$py" -m experiments.ablation "${flags[@]}" --workdir="$workdir" "${extra[@]}"
    copy_reports "$workdir" results.jsonl table.md ablation.png
    archive_plots "$workdir" plots.tar.gz ablation.png
    # Enough to skip the finished cells, to resume a cut one where it
    # stopped and to remake every report on another machine.
    state_archive() {
      (cd "$workdir" && state_files "$1" | tar --null -czf "$out/sweep_state.tar.gz" \
         --files-from=-)
    }
    state_archive 1
    size=$(stat -c %s "$out/sweep_state.tar.gz")
    if [ "$size" -gt $(( sweep_state_mib * 1024 * 1024 )) ]; then
      state_archive 0
      echo "sweep_state.tar.gz with the checkpoints of the unfinished cells would be" \
        "$(( size / 1024 / 1024 )) MiB, over SWEEP_STATE_MIB=$sweep_state_mib: made without" \
        "them; on a fresh machine those cells start again from step 0" | tee -a "$log"
    fi
    ;;
esac
ls -l "$out" | tee -a "$log"
exit "$status"
