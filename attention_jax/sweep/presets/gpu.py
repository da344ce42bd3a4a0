"""`gpu`: the full 3 arms x 4 dims x 4 seeds sweep on one GPU, in pieces.

    python -m experiments.calibration --preset=gpu --workdir=runs/gpu_plan
    python -m experiments.ablation --preset=gpu --workdir=runs/gpu $(plan flags)  # per piece

The Bible corpus with an 8k tokenizer and a Britz-base-like RNN scaled to it
(embedding and GRU width 256, 2 decoder layers), bfloat16 compute, cosine
schedule, batch 128, beam 10 on the whole test split; validation is greedy on
500 sentences (as in the quick preset: beam 10 at every validation would cost
more than the training it checks). Each call stops cleanly after 7 minutes
(`max_minutes`, at a checkpoint or before a final evaluation that would pass
it) so that it fits one 10-minute device command; the next call resumes.

Steps: the 6,000 below are an upper bound, not a measurement. The length the
sweep runs is fixed by a calibration call on the GPU first
(`experiments.calibration`, `scripts/gpu_run.sh calibrate`): it
times the first step (compilation), 20 steps, a validation and a beam-10 test
batch for additive at a = 1024 and scaled_multiplicative at a = 128, and
`attention_jax.sweep.plan` sizes the 12 cells to finish in 3 pieces of 7 minutes (x
0.8), 4 whole cells per piece, giving `--steps` (a multiple of 500, at most
6,000), `--eval_every` (three validations) and, if even 1,000 steps do not
fit, fewer `--dims`. `scripts/gpu_run.sh sweep` applies that plan. Once a GPU
session has measured it, the plan's values belong here, with the measurement.

Time: not for the CPU machine; on one H100: not yet run (planned as 3 device
calls of <= 8 minutes). Expected: the quick table's pattern at every dim:
multiplicative falling behind additive as a grows, scaled within noise of
additive (docs/gpu_tpu.md).
"""

OVERRIDES = dict(
    dims=(128, 256, 512, 1024), seeds=4, dataset="bible_en_es", vocab_size=8000,
    embed_dim=256, hidden_dim=256, decoder_layers=2, dropout=0.2, batch_size=128,
    max_length=64, steps=6000, learning_rate=1e-3, warmup_steps=200,
    schedule="cosine", beam_size=10, val_beam_size=1, eval_every=2000, eval_examples=500,
    diag_every=250, checkpoint_every=500, log_every=250, dtype="bfloat16",
    max_minutes=7.0)
