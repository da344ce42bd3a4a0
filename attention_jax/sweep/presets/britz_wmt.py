"""`britz_wmt`: Britz et al. 2017's setup, WMT'15 en->de (internet, TensorFlow, a GPU).

    pip install -e '.[wmt]'
    python -m experiments.ablation --preset=britz_wmt --workdir=runs/wmt

Their baseline: embedding 512, a bidirectional GRU encoder 512, a 2-layer GRU
decoder 512, dropout 0.2, batch 128, lr 1e-4, clipping at 5, beam 10, 32k
joint BPE; the 340,000 steps are a budget chosen here, not a figure of the
paper.

Time: not for the CPU machine; on one GPU: not run. Expected, as the paper
reports it: additive 22.1 vs multiplicative 18.2 BLEU at dimension 1024.
"""

OVERRIDES = dict(
    dims=(128, 256, 512, 1024), seeds=4, dataset="wmt15_britz", vocab_size=32000,
    embed_dim=512, hidden_dim=512, encoder_layers=1, decoder_layers=2, dropout=0.2,
    batch_size=128, max_length=50, steps=340000, learning_rate=1e-4, clip_norm=5.0,
    beam_size=10, eval_every=10000, diag_every=1000, checkpoint_every=2000,
    log_every=500)
