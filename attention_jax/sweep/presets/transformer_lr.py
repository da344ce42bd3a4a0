"""`transformer_lr`: the learning-rate x d_k grid in full, for one accelerator.

    python -m experiments.ablation --preset=transformer_lr --workdir=runs/transformer_lr \\
        --sweep=layer_norm=post,pre --sweep=learning_rate=1e-5,3e-5,1e-4,3e-4,1e-3,3e-3,1e-2

The CPU grid's question (`transformer_lr_cpu`, whose rule it keeps: lr* where
the final validation loss is 20% of perplexity above a score's own best,
interpolated in log lr; the log-log slope of lr* on d_k with a bootstrap over
seeds; no extension) at the scale a GPU or TPU affords: all four scores at
every learning rate, d_k 16 to 1024 in powers of 4, seven learning rates from
1e-5 to 1e-2 (1,000x, half-decade steps), 3 seeds, post- and pre-LN, 3,000
steps; the `transformer` preset's model and recipe otherwise (d_model 128, 2
heads, 2 + 2 layers, Adam beta_2 0.98, 400 warm-up steps, label smoothing and
dropout 0.1). 2 layer norms x 7 learning rates x 4 scores x 4 d_k = 224 runs
of 3 vmapped seeds. The threshold analysis (`experiments.threshold_report`) reads
the CPU preset's two grids today; this grid's plan (four scores at every rate,
two layer norms) is still to be passed to it.

Time: not yet predicted for an accelerator (the compile check has not been
run on this preset); on the 2-core CPU machine it is out of reach (the CPU
grid, a quarter of its runs at a third of the steps, is about 12 h of run
clocks). Expected: the CPU grid's answer at more d_k, more learning rates and
longer training, and whether pre-LN moves the thresholds.
"""

from attention_jax.sweep.presets import transformer

OVERRIDES = {
    **transformer.OVERRIDES,
    "arms": ("dot", "scaled_dot", "inverse_dim", "qk_norm"), "dims": (16, 64, 256, 1024),
    "additive_max_dim": 0, "baseline": "scaled_dot", "seeds": 3, "steps": 3000,
    "checkpoint_every": 500, "workers": 1,
}
