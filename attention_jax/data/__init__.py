"""Data: the offline KJV<->RV1909 corpus, WMT via TFDS, synthetic tasks.

Start with `input_pipeline.load(name, ...)`; the modules behind it:

  sword           zText reader + OSIS cleaning (no libsword)
  bible           TFDS builder `bible_translate` (en-es / es-en), array_record
  wmt             WMT en->de builders (TensorFlow needed to prepare: `wmt` extra)
  tokenizer       SentencePiece BPE / word tokenizers; pad=0, eos=1, sos=2, unk=3
  batching        length-bucketed fixed-shape NumPy batches
  synthetic       copy / reverse / sort tasks

Submodules are imported on use, so `import attention_jax.data` stays light.
"""

from attention_jax.data.tokenizer import EOS_ID, PAD_ID, SOS_ID, UNK_ID

__all__ = ["PAD_ID", "EOS_ID", "SOS_ID", "UNK_ID"]
