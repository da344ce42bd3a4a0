"""`transformer_lr_premise_cpu`: the 1/d_k law for lr* under its own premise.

    bash results/lr_threshold/transformer_lr_premise_cpu/commands.sh run

which trains, in W (default runs/transformer_lr_premise_cpu), the coarse grid

    python -m experiments.ablation --preset=transformer_lr_premise_cpu \
        --workdir=W/coarse --sweep=learning_rate=1e-4,3.2e-4,1e-3,3.2e-3,1e-2,3.2e-2

then, round by round, the runs the rule below asks for (`commands.sh plan`
prints them: `python -m experiments.lr_threshold.report
--preset=transformer_lr_premise_cpu --main=W --plan`), each (score, d_k)
in its own workdir W/extra/<score>_d<dim>, and last the Glorot grid's
refinement (W/glorot_fine). The report: `python -m
experiments.lr_threshold.report --preset=transformer_lr_premise_cpu --main=W
--out=OUT`.

The `transformer_lr_cpu` grid tested the predicted law for the threshold
learning rate lr*(d_k) where its premise is false: with the models' Glorot
initialisation (fan_out = H d_k) the unscaled logits do not grow with d_k
(results/init_logits). This grid decides it where the premise holds, and is
fixed here, rule, rates and verdict bands, before its first step.

Model and recipe: the `transformer_lr_cpu` preset's (d_model 128, 2 heads,
d_v 64, d_ff 512, 2 + 2 layers; Adam beta_2 0.98, 400 warm-up steps then a
constant learning rate, label smoothing 0.1, dropout 0.1, batches of 64
pairs, 2 seeds trained as one program, 1,000 steps, validation every 250,
softmax diagnostics every 100, beam-4 test BLEU on 500 verses), with two
changes, the same for every score:
- pre-LN (`layer_norm=pre`): every attention's input is a LayerNorm output,
  unit mean square per position at step 0;
- `qk_init=premise`: W_Q and W_K of every attention drawn with variance
  1 / d_model (LeCun normal), so that each query and key coordinate has
  variance about 1 whatever d_k, and the unscaled q.k grows like sqrt(d_k):
  the premise of Vaswani et al.'s footnote 4. Measured on this model before
  the first run (results/init_logits/premise_grid): the unscaled logit std's
  exponent in d_k (`python -m experiments.init_logits.run --layer_norm=pre
  --qk_init=premise ...`, its README).
Scores: `dot` (predicted slope of log lr* on log d_k: -1), `scaled_dot`
(-1/2) and `inverse_dim` (0), at d_k 16, 64, 256.

Learning rates: the quarter-decade ladder 10^(k/4) (`LADDER`: 1e-5, 1.8e-5,
3.2e-5, 5.6e-5, 1e-4, ..., 1e-1), in stages; each stage's runs are fixed by
the results of the stages before it, by this rule alone (`plan_next` in
experiments.lr_threshold.threshold applies it; commands.sh runs what
it names):
1. Coarse: every (score, d_k) at the half-decade rates `COARSE_RATES`
   (1e-4 ... 3.2e-2), 2 seeds (54 runs).
2. Extend, per (score, d_k), a half-decade at a time: down while lr_opt is
   the lowest rate of its curve (not below `FLOOR`, 1e-5); up while L never
   reaches the target (not above `CEILING`, 1e-1).
3. Refine, per (score, d_k): where the grid interval holding lr* (the loss
   rule below) or lr_att (the attention rule below) is wider than one
   quarter-decade step of the ladder, run the ladder rate at its middle
   (geometric); repeat with the new curve until every such interval is one
   ladder step wide, or the ladder has no rate inside it.
Runs of stages 2 and 3 train one (score, d_k) at a time, in a workdir of
their own (commands.sh), with the same settings as the coarse runs.

The loss rule, as `transformer_lr_cpu`'s (its docstring): L(s, d, lr) the
final validation loss, mean over seeds (a diverged seed: infinite); lr_opt
the rate of the smallest L of the curve; lr* the first rate above it at
which L reaches L(lr_opt) + ln 1.2. Reported: lr*'s grid interval (the last
rate below the target, the first at or above it; no interpolation) and,
beside it, the log-lr interpolation as a point estimate.

The attention rule, beside it: lr_att(s, d) is the lowest rate at which the
self attention saturates at the last step: in some self-attention layer
(encoder or decoder) more than `SATURATED_SHARE` (half) of the query rows
put more than 0.99 on one key (`diagnostics.SATURATION`), mean over seeds;
a diverged seed counts as saturated. Its grid interval is (the rate below
it, lr_att]; "below the grid" where the lowest rate already saturates,
"above" where none does. It is not extended (a grid cannot go below a
saturation present at step 0).

The law and the verdicts: for each score and each rule, the slope of log lr
on log d_k is bracketed without interpolation by every choice of each lr
inside its grid interval (the least-squares slopes' range,
`threshold.slope_bracket`; censored cells take no part). Per score:
- fails under its premise: the bracket excludes the predicted slope;
- holds under its premise: the bracket lies inside the band `BANDS`
  (`dot` [-1.25, -0.75], `scaled_dot` [-0.75, -0.25], `inverse_dim`
  [-0.25, +0.25]: the prediction +- 1/4), so containing the prediction with
  a half-width of at most 1/4;
- otherwise unresolved, with the half-width about the interpolated slope
  that would decide. "Fails" is read first: a bracket inside the band that
  still excludes the prediction fails.
The loss rule's verdict is the grid's; the attention rule's is reported
beside it. A quarter-decade interval at d_k 16 and 256 gives a half-width of
log(10^(1/4)) / log 16 = 0.21.

Comparing with the Glorot grid (`transformer_lr_cpu`, post-LN): the two
grids differ in initialisation and in LayerNorm placement; no sentence that
compares them can tell the two changes apart. The Glorot grid gains, for
the same resolution where its lr* lie, `dot` and `scaled_dot` at
`GLOROT_FINE_RATES` (1.8e-3, 5.6e-3, 1.8e-2; its 3e-3 stands for the
ladder's 3.2e-3), post-LN, its own preset unchanged; nothing else of that
grid is extended. Its verdicts then use the same bands.

Expected, by the mu-P argument for Adam, where the premise holds: lr* falls
like 1/d_k for `dot`, like d_k^-1/2 for `scaled_dot`, and is flat for
`inverse_dim`. Result (65 runs at 33a8fac, the report at b5fa0d5;
results/lr_threshold/transformer_lr_premise_cpu/README.md), the loss rule's
slope brackets: `dot` [+0.42, +0.83], fails under its premise (its lr* rises
with d_k, from an optimum 0.22-0.92 nats worse than `scaled_dot`'s);
`scaled_dot` [-0.42, +0.00], fails under its premise; `inverse_dim`
[-0.21, +0.21], holds under its premise.
The Glorot refinement (18 runs at 33a8fac; the report of its 72 runs in
results/lr_threshold/transformer_lr_cpu/refined/), with the same bands: `dot`
[-0.21, +0.21], fails; `scaled_dot` [-0.43, +0.00], fails. The two grids
differ in initialisation and LayerNorm placement together, so no difference
between them is put down to either.

Time: predicted before the first run: 54 coarse runs, 9-27 of stages 2-3,
18 Glorot runs, at 700-1,080 s of training clock a run of two seeds on one
core (transformer_lr_cpu's runs with the 2-core Xeon to itself, d_k 16 to
256): about 20-25 h of run clocks, 10-13 h of wall with two workers on an
idle 2-core machine. Measured (2-core AMD EPYC, shared with other work):
65 runs of this grid, 17.5 h of run clocks, 12.5 h of wall with stops;
the Glorot refinement, 3.3 h of run clocks for its 18 runs, 2.3 h of wall
with one stop.
"""

import math

from experiments.lr_threshold.presets import transformer_lr_cpu

ARMS = ("dot", "scaled_dot", "inverse_dim")
DIMS = (16, 64, 256)
# The quarter-decade ladder, rounded to two significant digits (as the rates
# are written on the command line and in the run folders' names).
LADDER = tuple(float(f"{10 ** (k / 4):.2g}") for k in range(-20, -3))  # 1e-5 ... 1e-1
COARSE_RATES = (1e-4, 3.2e-4, 1e-3, 3.2e-3, 1e-2, 3.2e-2)
FLOOR, CEILING = 1e-5, 1e-1
SATURATED_SHARE = 0.5  # of a self-attention layer's query rows, > 0.99 on one key
BANDS = {"dot": (-1.25, -0.75), "scaled_dot": (-0.75, -0.25), "inverse_dim": (-0.25, 0.25)}
GLOROT_FINE_RATES = (1.8e-3, 5.6e-3, 1.8e-2)
FAILURE_MARGIN = transformer_lr_cpu.FAILURE_MARGIN
assert set(COARSE_RATES) <= set(LADDER) and set(GLOROT_FINE_RATES) <= set(LADDER)
assert math.isclose(min(LADDER), FLOOR) and math.isclose(max(LADDER), CEILING)

OVERRIDES = {
    **transformer_lr_cpu.OVERRIDES,
    "arms": ARMS, "dims": DIMS, "baseline": "scaled_dot",
    "layer_norm": "pre", "qk_init": "premise",
}
