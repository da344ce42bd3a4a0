"""`britz_wmt`: Britz et al. 2017's setup, WMT'15 en->de (internet, TensorFlow, a GPU).

    pip install -e '.[wmt]'
    python -m experiments.ablation --preset=britz_wmt --workdir=runs/wmt

Their baseline: embedding 512, a bidirectional GRU encoder 512, a 2-layer GRU
decoder 512, dropout 0.2, batch 128, lr 1e-4, clipping at 5, beam 10, 32k
joint BPE; the 340,000 steps are a budget chosen here, not a figure of the
paper.

Time: not for the CPU machine; on one GPU: not run. Expected, as the paper
reports it: additive 22.1 vs multiplicative 18.2 BLEU at dimension 1024.

Estimates, none measured (each with its basis):
- Data: about 4.5M training pairs before the length filter (Britz et al.
  report 4.5M; Hugging Face's wmt15 de-en, the same three corpora, lists
  4,522,998). Download 1.74 GB: the archives' sizes in tensorflow-datasets
  4.9.10's url_checksums (commoncrawl 918 MB, europarl-v7 658 MB,
  news-commentary-v10 125 MB, the newstest sets' dev.tgz 39 MB); preparing
  extracts them and writes the text again (about 1.4 GB, Hugging Face's
  size of the same split), so allow a few times the download on disk.
  Preparing reads the training split whole into Python strings: allow
  several GB of host memory.
- Device memory: 58.0-59.4M parameters per model (measured from
  `jax.eval_shape`, vocabulary 32k), so the training state of 4 float32
  seeds (parameters, Adam's two moments, the best copy) is 3.7-3.8 GB; the
  step's float32 logits and encoder output add at least 3.4 GB at 50 tokens
  (`memory.step_bytes`' lower bound), gradients and other activations more:
  over 7 GB, well inside an 80 GB H100.
- Time: 340,000 steps at 20-60 ms a step (4 seeds) is 1.9-5.7 h per
  (arm, dim) cell, about 1-3 days for the 12 cells on one H100, training
  steps only (the beam-10 evaluations come on top). 20 ms: the `gpu`
  preset's step measured on an H200 (17-21 ms, a smaller RNN of the same
  form, bound by kernel launches); 60 ms: about 4 TFLOP a step (the 32k-way
  output layer 2.5: 4 x 128 x 50 tokens x 512 x 32,000 x 6; the GRUs about
  1.4) at float32's 67 TFLOP/s without tensor cores.
"""

OVERRIDES = dict(
    dims=(128, 256, 512, 1024), seeds=4, dataset="wmt15_britz", vocab_size=32000,
    embed_dim=512, hidden_dim=512, encoder_layers=1, decoder_layers=2, dropout=0.2,
    batch_size=128, max_length=50, steps=340000, learning_rate=1e-4, clip_norm=5.0,
    beam_size=10, eval_every=10000, diag_every=1000, checkpoint_every=2000,
    log_every=500)
