"""`smoke`: the copy task at toy size, every Britz arm at dims 8 and 32, 2 seeds.

    python -m experiments.ablation --preset=smoke --workdir=/tmp/smoke

Time: 293 s wall (432 s of CPU) on the idle 2-core CPU machine at ebf08f4,
with 5288d94 beside it at 262 s (`farm-bench`, one pair; 5288d94 had measured
188 s on a faster day); on one GPU: not run. Expected: every run learns to copy (test BLEU > 0); the
tests use it (`tests/experiments/test_ablation.py`), it is no experiment.
"""

OVERRIDES = dict(
    arms=("additive", "multiplicative", "scaled_multiplicative"), dims=(8, 32),
    seeds=2, dataset="copy", embed_dim=32, hidden_dim=32, decoder_layers=1,
    eval_batch_size=64, dropout=0.0, batch_size=32, max_length=20, steps=120,
    learning_rate=3e-3,
    beam_size=2, eval_every=60, eval_examples=64, test_examples=64, diag_every=20,
    checkpoint_every=40, log_every=20)
