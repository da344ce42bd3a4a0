"""`transformer_lr_premise`: the premise grid on one accelerator, d_k 16 to 1024, fixed in full.

    python -m experiments.ablation --preset=transformer_lr_premise \\
        --members=learning_rate=1e-4,1.8e-4,3.2e-4,5.6e-4,1e-3,1.8e-3,3.2e-3,5.6e-3,1e-2,1.8e-2,3.2e-2,5.6e-2,1e-1 \\
        --workdir=runs/transformer_lr_premise
    python -m experiments.lr_threshold.report --preset=transformer_lr_premise \\
        --main=runs/transformer_lr_premise --out=runs/transformer_lr_premise/report

The question of `transformer_lr_premise_cpu` (its docstring): does lr*(d_k)
follow the 1/d_k law where the law's premise holds? Here on a GPU or TPU,
beside the CPU grid and never instead of it, one d_k further (1024) and with
a third seed. Fixed here, rule, rates and verdict bands, before its first
step, from the CPU preset unchanged wherever this one does not say otherwise.

Model and recipe: `transformer_lr_premise_cpu`'s (pre-LN, `qk_init=premise`,
the `transformer_lr_cpu` model and optimiser, 1,000 steps, validation every
250, softmax diagnostics every 100, beam-4 test BLEU on 500 verses), with:
- d_k 16, 64, 256 and 1024 (`DIMS`);
- 3 seeds;
- every learning rate at once: the quarter-decade ladder from 1e-4 to 1e-1
  (`LEARNING_RATES`, 13 rates, the CPU preset's `LADDER` from its coarse
  grid's lowest rate to its ceiling) as members of one program per (score,
  d_k): 39 members, 12 programs. No stage is adaptive: the grid is the same
  whatever its results, and a cell whose lr* lies outside the ladder is
  censored.

The rules and the verdicts: the CPU preset's loss rule (lr* the first rate
above lr_opt at which the final validation loss reaches L(lr_opt) + ln 1.2)
and attention rule (lr_att the lowest rate whose self attention saturates at
the last step), each lr as its grid interval; per score the slope of log lr
on log d_k bracketed without interpolation over d_k 16 to 1024, and judged
with the CPU preset's `BANDS` (`dot` [-1.25, -0.75], `scaled_dot`
[-0.75, -0.25], `inverse_dim` [-0.25, +0.25]): fails where the bracket
excludes the prediction, holds where it lies inside the band, otherwise
unresolved. A quarter-decade interval at d_k 16 and 1024 gives a half-width
of log(10^(1/4)) / log 64 = 0.14.

Expected, as for the CPU grid, where the premise holds: lr* falls like 1/d_k
for `dot`, like d_k^-1/2 for `scaled_dot`, and is flat for `inverse_dim`.
Result: (not yet run).

Time: predicted, not run. On one H200 the `transformer_lr` preset's largest
run (`dot`, d_k 1024, 21 members, 3,000 steps) took 26.8 ms a step
(results/gpu_h200/2026-11-28b); here 39 members for 1,000 steps, put at
40-55 ms a step: about 1 minute of steps a run, 3-4 minutes with its
compilation, validations and test decode, 35-50 minutes for the 12 runs,
which is more than one lent session: the runs resume where a call stops
(`--max_minutes`). Not for the 2-core CPU machine.
"""

from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise_cpu

DIMS = (16, 64, 256, 1024)
LEARNING_RATES = tuple(lr for lr in premise_cpu.LADDER if lr >= min(premise_cpu.COARSE_RATES))
BANDS = premise_cpu.BANDS
assert len(LEARNING_RATES) == 13 and max(LEARNING_RATES) == premise_cpu.CEILING

OVERRIDES = {
    **premise_cpu.OVERRIDES,
    "dims": DIMS, "seeds": 3, "workers": 1,
}
