"""`transformer_lr_cpu`: where does the unscaled dot product start to fail? Learning rate x d_k.

    bash results/lr_threshold/transformer_lr_cpu/commands.sh run

which is two grids of this preset, one workdir each:

    python -m experiments.ablation --preset=transformer_lr_cpu --workdir=W/main \\
        --sweep=learning_rate=3e-5,1e-4,3e-4,1e-3,3e-3,1e-2
    python -m experiments.ablation --preset=transformer_lr_cpu --workdir=W/controls \\
        --arms=inverse_dim,qk_norm --baseline=inverse_dim --sweep=learning_rate=1e-4,1e-3,1e-2

The `transformer` preset's model and recipe (post-LN, d_model 128, 2 heads,
d_v 64, d_ff 512, 2 + 2 layers; Adam beta_2 0.98, 400 warm-up steps then a
constant learning rate, label smoothing 0.1, dropout 0.1, batches of 64
pairs, 2 seeds) with only the peak learning rate and d_k varied: `dot` and
`scaled_dot` at d_k 16, 64, 256 and six learning rates from 3e-5 to 1e-2
(333x, half-decade steps); `inverse_dim` and `qk_norm` at three of them.
1,000 steps a run: 54 (score, d_k, lr) runs of 2 vmapped seeds fit about
12 h of run clocks on the 2-core machine at the `transformer` preset's
measured speed (0.6-1.0 s a step of two seeds on one core at d_k 16-256),
which 1,500 steps would not. Validation every 250 steps, softmax diagnostics
every 100 (the heat maps read steps 100 and 1,000), beam-4 test BLEU on 500
verses at the end.

Rule fixed before any run of this grid (2026-11-26), the same for every score:
- L(s, d, lr): the final validation loss, ln of the validation perplexity of
  the final parameters (`metrics.jsonl` at step 1,000), mean over seeds; a
  diverged run counts as failed (L = infinity).
- lr*(s, d), where s starts to fail: let lr_opt be the grid learning rate of
  s's smallest L at d; lr* is the first learning rate above lr_opt at which L,
  interpolated linearly in log lr between grid points, reaches
  L(s, d, lr_opt) + ln 1.2 (`FAILURE_MARGIN`: a validation perplexity 20%
  above s's own best at that d_k). Censored: above the grid if L never gets
  there; where lr_opt is the grid's lowest, lr* is reported with a flag (the
  failure may begin lower).
- Beside it, the absolute criterion: s fails at (d, lr) when L(s, d, lr) >
  L_best(d) + ln 1.2, L_best(d) the smallest L over every score and learning
  rate at that d_k (a table of pass/fail), and Wortsman et al.'s learning-rate
  sensitivity, the mean over the grid of min(L, ln V) minus s's best L (ln V,
  V = 2,000 pieces, stands in for the loss at step 0: uniform prediction).
- The law: least squares slope of log lr* on log d_k over the d_k where lr*
  is not censored, with a bootstrap interval over seeds (each cell's two seeds
  resampled with replacement, 2,000 times); compared with -1 (`dot`), -1/2
  (`scaled_dot`) and 0 (`inverse_dim`, `qk_norm`). Reported beside it, not
  used for lr*: the share of self-attention rows with more than 0.99 on one
  key and the largest self-attention logit, at steps 100 and 1,000.
- No extension: the grid is not lengthened whatever it shows; a longer run is
  the accelerator grid's.

Time: predicted about 12 h of run clocks, 6 h of wall with two workers on an
idle 2-core CPU machine; measured 39.3 h of run clocks on the shared 2-core
Xeon (8707eae, 2026-11-26 to 11-28; results/lr_threshold/transformer_lr_cpu); one GPU: not
run. Expected, by the mu-P argument for Adam: lr*(d_k) falls like 1/d_k for
`dot`, like d_k^-1/2 for `scaled_dot`, and is flat for `inverse_dim` and
`qk_norm`; at 2e-3 the `transformer` preset's `dot` failed at every d_k, 16
included. Result: every lr* of `dot` and `scaled_dot` in the one grid interval
(3e-3, 1e-2], so the grid brackets both slopes in [-0.43, +0.43] without
interpolation (excluding `dot`'s -1, and `scaled_dot`'s -1/2 by 0.07); the
rule's interpolated slopes, point estimates inside that bracket, are -0.26
[-0.31, -0.22] and -0.06 [-0.06, -0.05] (bootstrap over seeds only);
`inverse_dim` +0.09, bracket [-0.83, +0.83]; `qk_norm` never failing inside
the grid; `dot` 0.7-0.9 nats worse than `scaled_dot` at every d_k. The law's
premise is false in this model (Glorot W_Q, W_K: results/init_logits); the
`transformer_lr_premise_cpu` grid tests it where it holds.
"""

import math

from attention_jax.sweep.presets import transformer

FAILURE_MARGIN = math.log(1.2)  # nats of validation loss above a score's own best at that d_k
LEARNING_RATES = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
CONTROL_LEARNING_RATES = (1e-4, 1e-3, 1e-2)  # inverse_dim and qk_norm

OVERRIDES = {
    **transformer.OVERRIDES,
    "arms": ("dot", "scaled_dot"), "dims": (16, 64, 256), "additive_max_dim": 0,
    "baseline": "scaled_dot", "steps": 1000, "checkpoint_every": 250,
}
