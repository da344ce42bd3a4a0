#!/usr/bin/env bash
# The Transformer's learning-rate x d_k grid (preset `transformer_lr_cpu`; its
# docstring holds the rule fixed before any run). Run from the repository root:
#   bash results/transformer_lr_cpu/commands.sh run       # trains (resumable: re-run it)
#   bash results/transformer_lr_cpu/commands.sh collect   # rewrites the reports only
# W (default runs/transformer_lr_cpu) is the workdir; PY the Python of the project.
set -euo pipefail
W="${W:-runs/transformer_lr_cpu}"
PY="${PY:-.venv/bin/python}"
MAIN_LRS=3e-5,1e-4,3e-4,1e-3,3e-3,1e-2
CONTROL_LRS=1e-4,1e-3,1e-2
case "${1:-}" in
  run) extra=() ;;
  collect) extra=(--report_only) ;;
  *) echo "usage: $0 run|collect" >&2; exit 2 ;;
esac
"$PY" -m experiments.ablation --preset=transformer_lr_cpu --workdir="$W/main" \
    --sweep=learning_rate=$MAIN_LRS "${extra[@]}"
"$PY" -m experiments.ablation --preset=transformer_lr_cpu --workdir="$W/controls" \
    --arms=inverse_dim,qk_norm --baseline=inverse_dim --sweep=learning_rate=$CONTROL_LRS \
    "${extra[@]}"
