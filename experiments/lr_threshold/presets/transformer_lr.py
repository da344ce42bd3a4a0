"""`transformer_lr`: the learning-rate x d_k grid in full, for an accelerator host.

    for ln in post pre; do
      python -m experiments.ablation --preset=transformer_lr --layer_norm=$ln \\
          --sweep=learning_rate=1e-5,3e-5,1e-4,3e-4,1e-3,3e-3,1e-2 \\
          --workdir=runs/transformer_lr/$ln
    done

The CPU grid's question (`transformer_lr_cpu`, whose rule it keeps: lr* where
the final validation loss is 20% of perplexity above a score's own best,
interpolated in log lr; the log-log slope of lr* on d_k with a bootstrap over
seeds; no extension) at the scale a GPU or TPU affords: all four scores at
every learning rate, d_k 16 to 1024 in powers of 4, seven learning rates from
1e-5 to 1e-2 (1,000x, half-decade steps), 3 seeds, post- and pre-LN, 3,000
steps; the `transformer` preset's model and recipe otherwise (d_model 128, 2
heads, 2 + 2 layers, Adam beta_2 0.98, 400 warm-up steps, label smoothing and
dropout 0.1). 2 layer norms x 7 learning rates x 4 scores x 4 d_k = 224 runs
of 3 vmapped seeds, a workdir per layer norm. The threshold analysis of one layer
norm's grid (either form below):

    python -m experiments.lr_threshold.report --preset=transformer_lr --layer_norm=pre \\
        --main=runs/transformer_lr/pre --out=runs/transformer_lr/pre/report

The same grid with the learning rates as members of one program per run (the
same numbers as separate runs, tested; 4 scores x 4 d_k = 16 runs of 21
members per layer norm; `--members` takes no `--sweep`, so a workdir per layer
norm):

    for ln in post pre; do
      python -m experiments.ablation --preset=transformer_lr --layer_norm=$ln \\
          --members=learning_rate=1e-5,3e-5,1e-4,3e-4,1e-3,3e-3,1e-2 \\
          --workdir=runs/transformer_lr_members/$ln
    done

Time: compiled, not run (results/compile_check/multi_device, 6d97c88): in the
members form, split over every device, 17.9 min on a TPU v5e-8, 8.0 min on a
v4-32 and 5.5 min on 8 H100s; as separate data-parallel runs per learning rate
30.9, 19.7 and 25.7 min. One accelerator alone has not been compiled for it.
Measured on one H200 (results/gpu_h200/2026-11-28 and 2026-11-28b, ae0ff5d
and fd33eca): the largest run, `dot` at d_k 1024 with 21 members, 26.8 ms a
step, about 219 s a run by the calibration with its evaluation-batch search:
at most about 2.0 h for the grid of 32 runs, never run. A sweep there spent
its first minutes compiling, 5 to 8 times slower than the calibration did
(the driver's one-arena allocator, since confined to the CPU; not re-timed).
On the 2-core CPU machine it is out of reach (the CPU grid, a quarter of its
runs at a third of the steps, is about 12 h of run clocks).

Expected: the CPU grid's answer at more d_k, more learning rates and longer
training, and whether pre-LN moves the thresholds.
"""

from attention_jax.sweep.presets import transformer

# The grid's learning rates (the commands above; `grids.preset_grids`).
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)

OVERRIDES = {
    **transformer.OVERRIDES,
    "arms": ("dot", "scaled_dot", "inverse_dim", "qk_norm"), "dims": (16, 64, 256, 1024),
    "additive_max_dim": 0, "baseline": "scaled_dot", "seeds": 3, "steps": 3000,
    "checkpoint_every": 500, "workers": 1,
}
