#!/usr/bin/env bash
# The Transformer's learning-rate x d_k grid (preset `transformer_lr_cpu`; its
# docstring holds the rule fixed before any run). Run from the repository root:
#   bash results/lr_threshold/transformer_lr_cpu/commands.sh run       # trains (resumable: re-run it)
#   bash results/lr_threshold/transformer_lr_cpu/commands.sh collect   # rewrites the reports only
#   bash results/lr_threshold/transformer_lr_cpu/commands.sh copy      # finished runs into results/, report
# W (default runs/transformer_lr_cpu) is the workdir; PY the Python of the project.
# `copy` brings each finished run's files (those of a run folder with result.json;
# never its checkpoints) into results/lr_threshold/transformer_lr_cpu/{main,controls}, the same
# relative paths, so that a fresh clone skips those runs, then writes the threshold
# report from the committed runs. test_translations.json is kept gzip'd (.json.gz,
# which the reports read): plain, the grid's 54 took 7.6 MiB of the tree.
set -euo pipefail
W="${W:-runs/transformer_lr_cpu}"
PY="${PY:-.venv/bin/python}"
HERE=results/lr_threshold/transformer_lr_cpu
MAIN_LRS=3e-5,1e-4,3e-4,1e-3,3e-3,1e-2
CONTROL_LRS=1e-4,1e-3,1e-2
# shellcheck source=../../../scripts/copy_runs.sh
source "$(dirname "$0")/../../../scripts/copy_runs.sh"
# attention.json (test sentence 0's alignment) gzip'd too: no report of these grids reads it.
GZIP_FILES="test_translations.json attention.json"

case "${1:-}" in
  run) extra=() ;;
  collect) extra=(--report_only) ;;
  copy)
    copy_finished_runs "$W/main" "$HERE/main" main
    copy_finished_runs "$W/controls" "$HERE/controls" controls
    exec "$PY" -m experiments.lr_threshold.report --main="$HERE/main" --controls="$HERE/controls" \
        --out="$HERE" ;;
  *) echo "usage: $0 run|collect|copy" >&2; exit 2 ;;
esac
"$PY" -m experiments.ablation --preset=transformer_lr_cpu --workdir="$W/main" \
    --sweep=learning_rate=$MAIN_LRS "${extra[@]}"
"$PY" -m experiments.ablation --preset=transformer_lr_cpu --workdir="$W/controls" \
    --arms=inverse_dim,qk_norm --baseline=inverse_dim --sweep=learning_rate=$CONTROL_LRS \
    "${extra[@]}"
