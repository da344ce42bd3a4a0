"""`quick`: Britz et al.'s attention-dimension ablation on CPU (`make ablation`).

    make ablation   # = python -m experiments.ablation --preset=quick --workdir=runs/quick

The Bible corpus (en->es, 2k-piece joint tokenizer, pairs <= 32 tokens), a GRU
encoder-decoder of width 128 with Luong attention, the three Britz arms at
a = 128 and 1024, 2 seeds as one vmapped program; Adam at lr 1e-3 after 100
warm-up steps, 3,500 steps of 64 pairs; greedy validation BLEU on 200 verses
every 250 steps, beam 4 on 500 test verses with the best parameters. Two
(arm, dim) pairs train at once, one process on one core each.

Time: 80 min on the 2-core Intel Xeon (clean run of commit 030e0f9; 138 min
at fa7146e, before the CPU-efficiency work); one GPU: not run. Expected
(results/quick_cpu, test BLEU mean over 2 seeds):

    | dim  | additive | multiplicative | scaled_multiplicative |
    | 128  | 14.47    | 14.17          | 14.42                 |
    | 1024 | 14.92    | 4.48           | 13.79                 |

multiplicative collapses at a = 1024 (p < 0.001), scaling by sqrt(a) removes it.
Why lr 1e-3 and 3,500 steps: results/HISTORY.md.
"""

OVERRIDES = dict(
    arms=("additive", "multiplicative", "scaled_multiplicative"), dims=(128, 1024),
    seeds=2, dataset="bible_en_es", vocab_size=2000, embed_dim=128, hidden_dim=128,
    decoder_layers=1, dropout=0.1, batch_size=64, max_length=32, steps=3500,
    learning_rate=1e-3, warmup_steps=100, beam_size=4, val_beam_size=1,
    eval_every=250, eval_examples=200, test_examples=500, diag_every=100,
    checkpoint_every=250, log_every=250, workers=2)
