#!/usr/bin/env bash
# Several stages of scripts/gpu_run.sh in one device command, one after the
# other, each under its own hard limit, and everything they wrote packed into
# one archive: a device command returns at most 8 files, and a short lease is
# better spent on one call than on a machine start per stage.
#
# Usage: scripts/gpu_stages.sh OUTDIR SPEC...
#   SPEC   STAGE:MINUTES  (STAGE of scripts/gpu_run.sh; MINUTES its
#          STAGE_MINUTES), or STAGE:MINUTES:NAME to run one stage twice
#          (NAME names its folder); a stage's extra flags come from the
#          environment variable FLAGS_<NAME> (default NAME = STAGE), split on
#          spaces.
# GPU_RUN names the stage runner (default scripts/gpu_run.sh; the tests give a
# stand-in). GPU_COMMAND_SECONDS, where set, is the device command's own time
# limit in seconds: the stages are refused before any runs
# unless their worst case fits in it with a minute to spare, counted per stage
# as its limit, the runner's 20 s between SIGTERM and SIGKILL, and
# STAGE_SETUP_SECONDS (default 40: the wheel install and the packing took
# about 30 s on the H200, 2026-11-28) - a command cut by the device's limit
# loses the stage it was in, which is how one was lost that day.
# Writes OUTDIR/stages.tar.gz (each stage's files in a folder of its name) and
# OUTDIR/summary.txt (each stage's exit status and the end of its log), and
# prints the summary. Exit status: 0 when every stage ended 0 or 75 (stopped by
# its own time budget with everything kept), else 1.
# Example (the first GPU session's command):
#   FLAGS_additive="--suite=additive --additive_seq_lens=1024,4096 \
#     --additive_time_max_len=4096" BENCH_MINUTES=3 \
#   scripts/gpu_stages.sh "$OUT" check:1.5 bench:4.5 bench:1.5:additive calibrate:1.5
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: scripts/gpu_stages.sh OUTDIR STAGE:MINUTES[:NAME]..."
out="$1"; shift
runner="${GPU_RUN:-$repo/scripts/gpu_run.sh}"
[ -f "$runner" ] || die "no stage runner at $runner (GPU_RUN)."
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || die "OUTDIR '$out' cannot be created or written."
out="$(cd "$out" && pwd)"
# Every spec is checked before any stage runs.
limits=()
for spec in "$@"; do
  IFS=: read -r stage minutes name <<< "$spec"
  case "$stage" in check|bench|calibrate|sweep) ;;
    *) die "SPEC '$spec': STAGE must be check, bench, calibrate or sweep." ;; esac
  [[ "$minutes" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "SPEC '$spec': MINUTES must be a number."
  [[ "${name:-$stage}" =~ ^[A-Za-z0-9_]+$ ]] || die "SPEC '$spec': NAME must be letters, digits, _."
  limits+=("$minutes")
done
if [ -n "${GPU_COMMAND_SECONDS:-}" ]; then
  [[ "$GPU_COMMAND_SECONDS" =~ ^[0-9]+$ ]] || die "GPU_COMMAND_SECONDS '$GPU_COMMAND_SECONDS' must be whole seconds."
  setup="${STAGE_SETUP_SECONDS:-40}"
  [[ "$setup" =~ ^[0-9]+$ ]] || die "STAGE_SETUP_SECONDS '$setup' must be whole seconds."
  # Whole seconds, rounded up: each stage's limit + 20 s to SIGKILL + its set-up.
  need=$(awk -v s="$setup" 'BEGIN { for (i = 1; i < ARGC; i++) t += ARGV[i] * 60 + 20 + s
                                     printf "%d", (t == int(t)) ? t : int(t) + 1 }' "${limits[@]}")
  if [ "$need" -gt $(( GPU_COMMAND_SECONDS - 60 )) ]; then
    die "the stages need up to $need s (each its limit, 20 s to SIGKILL, ${setup} s of set-up) and a minute to spare, more than GPU_COMMAND_SECONDS=$GPU_COMMAND_SECONDS: shorten the stages or raise the command's timeout."
  fi
fi
stages="$(mktemp -d "${TMPDIR:-/tmp}/gpu_stages.XXXXXX")"
summary="$out/summary.txt"
: > "$summary"
worst=0
for spec in "$@"; do
  IFS=: read -r stage minutes name <<< "$spec"
  name="${name:-$stage}"
  var="FLAGS_$name"
  read -r -a extra <<< "${!var:-}"
  start=$(date +%s)
  STAGE_MINUTES="$minutes" bash "$runner" "$stage" "$stages/$name" \
    ${extra[@]+-- "${extra[@]}"} > "$stages/$name.out" 2>&1
  status=$?
  {
    echo "== $name ($stage, limit $minutes min): exit $status after $(( $(date +%s) - start )) s"
    tail -n 25 "$stages/$name.out"
  } >> "$summary"
  [ "$status" = 0 ] || [ "$status" = 75 ] || worst=1
  # Packed after every stage: a command cut by the device's own limit still
  # returns the stages that ended.
  tar -czf "$out/stages.tar.gz.tmp" -C "$stages" . && mv "$out/stages.tar.gz.tmp" "$out/stages.tar.gz"
done
rm -rf "$stages"
cat "$summary"
exit "$worst"
