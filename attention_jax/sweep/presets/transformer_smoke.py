"""`transformer_smoke`: the Transformer's path end to end at toy size, for trying a score or a grid.

    .venv/bin/python -m experiments.ablation --preset=transformer_smoke --workdir=runs/tsmoke

The copy task with a one-layer Transformer (d_model 32, 2 heads, d_ff 64),
`dot` against `scaled_dot` at d_k 8, 2 seeds, 120 steps with 20
warm-up steps, the `transformer` preset's recipe otherwise (Adam beta_2 0.98,
label smoothing 0.1, post-LN); validation every 60 steps, beam 2 on 64 test
sentences. A new score is tried with `--arms=scaled_dot,NAME`, a grid with
`--sweep=learning_rate=1e-3,3e-3`.

Time: 67 s wall (87 s of CPU) on the idle 2-core CPU machine at 5288d94;
one GPU: not run.
Expected: every run trains (test BLEU > 0 and the loss falls); it is no
experiment: the tests and the docs use it.
"""

OVERRIDES = dict(
    model="transformer", arms=("dot", "scaled_dot"), dims=(8,), baseline="scaled_dot",
    seeds=2, dataset="copy", hidden_dim=32, num_heads=2, ff_dim=64, encoder_layers=1,
    decoder_layers=1, dropout=0.0, label_smoothing=0.1, adam_b2=0.98, layer_norm="post",
    batch_size=32, max_length=16, steps=120, learning_rate=3e-3, warmup_steps=20,
    beam_size=2, val_beam_size=1, eval_every=60, eval_batch_size=64, eval_examples=64,
    test_examples=64, diag_every=20, checkpoint_every=60, log_every=20, workers=1)
