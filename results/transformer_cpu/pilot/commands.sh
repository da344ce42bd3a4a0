#!/usr/bin/env bash
# The pilot that sized the `transformer` preset (code of commit 2511fb6, 2-core
# Intel Xeon, no GPU; both runs at once, one single-threaded process each).
# One seed of scaled_dot at d_k 32 (4 heads), Adam beta_2 0.999 (the field did
# not exist yet), at two learning rates. lr 1e-3 was stopped at step ~1,750
# once lr 2e-3 was ahead at every evaluation; lr 2e-3 ran its 3,000 steps.
set -euo pipefail
for lr in 1e-3 2e-3; do
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
  python -m experiments.train --preset=quick --model=transformer --arm=scaled_dot --dim=32 \
    --hidden_dim=128 --num_heads=4 --ff_dim=512 --encoder_layers=2 --decoder_layers=2 \
    --dropout=0.1 --label_smoothing=0.1 --learning_rate=$lr --warmup_steps=400 --steps=3000 \
    --eval_every=250 --seeds=1 --workers=1 --workdir=runs/pilot_lr$lr > runs/pilot_lr$lr.log 2>&1 &
done
wait
