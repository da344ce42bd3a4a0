"""`gpu`: the full 3 arms x 4 dims x 4 seeds sweep on one GPU, in pieces.

    python -m experiments.ablation --preset=gpu --workdir=runs/gpu   # re-run until done

The Bible corpus with an 8k tokenizer and a Britz-base-like RNN scaled to it
(embedding and GRU width 256, 2 decoder layers), bfloat16 compute, cosine
schedule, 6,000 steps of 128 pairs, beam 10. Each call stops cleanly after
8 minutes (`max_minutes`) so that it fits one 10-minute device command; the
next call resumes.

Time: not for the CPU machine; on one H100: not yet run (planned <= 25 min).
Expected: the quick table's pattern at every dim: multiplicative falling
behind additive as a grows, scaled within noise of additive
(docs/gpu_tpu.md).
"""

OVERRIDES = dict(
    dims=(128, 256, 512, 1024), seeds=4, dataset="bible_en_es", vocab_size=8000,
    embed_dim=256, hidden_dim=256, decoder_layers=2, dropout=0.2, batch_size=128,
    max_length=64, steps=6000, learning_rate=1e-3, warmup_steps=200,
    schedule="cosine", beam_size=10, eval_every=2000, eval_examples=500,
    diag_every=250, checkpoint_every=500, log_every=250, dtype="bfloat16",
    max_minutes=8.0)
