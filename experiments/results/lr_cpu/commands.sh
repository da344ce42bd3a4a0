#!/usr/bin/env bash
# The learning-rate experiment of issue 13, as run on the 2-core CPU machine.
#
# Every point is the quick preset (experiments/README: RNN, embedding/hidden
# 128, vocab 2000, 2500 steps, 100 warm-up steps, constant lr after warm-up,
# 2 vmapped seeds, test BLEU with beam 4 on 500 test verses) with only the
# learning rate changed, the same for every arm. The grid layout is the one
# `python -m experiments.ablation --sweep=learning_rate=3e-4,1e-3,3e-3` uses:
# W/learning_rate=<value>/ is an ordinary ablation workdir per grid point, so
# pieces run one at a time here (two pairs at once, one per core) are picked
# up, skipped as finished, by the grid command that writes the pivoted table:
#
#   python -m experiments.ablation --preset=quick --workdir=W \
#     --arms=additive,multiplicative,scaled_multiplicative,qk_norm --dims=128,1024 \
#     --sweep=learning_rate=3e-4,1e-3,3e-3
#
# Each piece below is `piece LR ARMS DIMS`; the order is the order they ran.
set -euo pipefail
W=${W:-runs/lr_cpu}
PY=${PY:-.venv/bin/python}
piece() {
  local lr=$1 arms=$2 dims=$3
  "$PY" -m experiments.ablation --preset=quick --arms="$arms" --dims="$dims" \
    --learning_rate="$lr" --workdir="$W/learning_rate=$lr"
}
# session of 2026-11-23 (code of commit d85915b):
piece 0.0003 additive,multiplicative 1024
piece 0.003 multiplicative,qk_norm 1024  # multiplicative: also a re-run of quick_cpu's cell
