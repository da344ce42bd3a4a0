"""The RNN's fast form is the same function as its plain per-step form.

`Seq2Seq` does the input products of the encoder cells and the decoder's
embedding product for every step at once, before the scans, and advances both
encoder directions in one scan step (models/seq2seq.py). `plain_loss` here is
the model written step by step with Flax's own cells (`cell(carry, x)` on the
concatenated input, `nnx.Dropout` on it): the form the model had before those
changes. Loss and gradients must agree to float32 rounding, with dropout on
(the same masks) and off, for every decoder kind and both cells.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx.nn.recurrent import flip_sequences

from attention_jax import masks
from attention_jax import models
from attention_jax.training import steps


def _run(cell, inputs, lengths, carry):
  outputs = []
  for t in range(inputs.shape[1]):
    new, y = cell(carry, inputs[:, t])
    keep = (t < lengths)[:, None]
    carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, carry)
    outputs.append(y)
  return carry, jnp.stack(outputs, axis=1)


def plain_logits(model, src, tgt_in, key):
  """The teacher-forced logits, one Flax cell call per step (key None: no dropout)."""
  c = model.config
  k_enc, k_dec = (None, None) if key is None else jax.random.split(key, 2)
  valid = masks.padding(src, c.pad_id)
  lengths = jnp.sum(valid, axis=-1).astype(jnp.int32)
  x = model.src_embed(src)
  zero = model._zero_carry(src.shape[0])  # pylint: disable=protected-access
  enc_keys = [None] * len(model.encoder) if k_enc is None else list(
      jax.random.split(k_enc, len(model.encoder)))
  finals = []
  for layer, k in zip(model.encoder, enc_keys):
    x = model.dropout(x, deterministic=k is None, rngs=k)
    final, out = _run(layer.forward_cell, x, lengths, zero)
    if layer.backward_cell is not None:
      flip = lambda v: flip_sequences(v, lengths, num_batch_dims=1, time_major=False)
      final_b, out_b = _run(layer.backward_cell, flip(x), lengths, zero)
      final, out = (final, final_b), jnp.concatenate([out, flip(out_b)], axis=-1)
    finals.append(final)
    x = out
  memory, carry = model._start(  # pylint: disable=protected-access
      {"states": x.astype(c.dtype), "key_valid": valid, "final": tuple(finals)})
  step_keys = None if k_dec is None else jax.random.split(k_dec, tgt_in.shape[1])
  top = lambda cell: cell[1] if c.cell == "lstm" else cell
  features = []
  for t in range(tgt_in.shape[1]):
    parts = [model.tgt_embed(tgt_in[:, t]).astype(c.dtype)]
    if c.decoder == "none_concat":
      parts.append(memory["last"])
    elif c.decoder == "bahdanau":
      parts.append(model._attend(memory, top(carry["cells"][-1]), None)[0])  # pylint: disable=protected-access
    elif "feed" in carry:
      parts.append(carry["feed"])
    h = jnp.concatenate(parts, axis=-1)
    keys = ([None] * c.decoder_layers if step_keys is None
            else list(jax.random.split(step_keys[t], c.decoder_layers)))
    cells = []
    for cell, state, k in zip(model.decoder_cells, carry["cells"], keys):
      h = model.dropout(h, deterministic=k is None, rngs=k)
      state, h = cell(state, h)
      cells.append(state)
    new = {"cells": tuple(cells)}
    out = h
    if c.decoder == "luong":
      context = model._attend(memory, h, None)[0]  # pylint: disable=protected-access
      out = jnp.tanh(model.attention_mix(jnp.concatenate([h, context], axis=-1)))
      if c.input_feeding == "context":
        new["feed"] = context
      elif c.input_feeding == "attentional":
        new["feed"] = out
    carry = new
    features.append(out)
  return model.output(jnp.stack(features, axis=1)).astype(jnp.float32)


CONFIGS = [
    dict(score="additive"),
    dict(score="multiplicative", cell="lstm", decoder_layers=2),
    dict(score="scaled_multiplicative", decoder="bahdanau", encoder_layers=2),
    dict(score="additive", input_feeding="attentional"),
    dict(score="general", input_feeding="none", decoder_layers=3, bidirectional=False),
    dict(decoder="none_concat", cell="lstm"),
    dict(decoder="none_init"),
]


def _batch():
  rng = np.random.default_rng(0)
  src = rng.integers(3, 50, (4, 7)).astype(np.int32)
  src[1, 4:] = 0
  src[2, 2:] = 0
  tgt = rng.integers(3, 50, (4, 9)).astype(np.int32)
  tgt[0, 5:] = 0
  return src, steps.decoder_input(tgt, 2, 0), tgt


# Two cases in the default suite (GRU + Luong as the quick preset, LSTM + two
# decoder layers), with dropout; every other one is `slow` (each compiles an
# unrolled reference).
CASES = [pytest.param(kw, dropout, id="-".join(map(str, kw.values())) + f"-dropout{dropout}",
                      marks=() if dropout and i < 2 else pytest.mark.slow)
         for i, kw in enumerate(CONFIGS) for dropout in (False, True)]


@pytest.mark.parametrize("kw, dropout", CASES)
def test_fast_form_equals_the_plain_per_step_form(kw, dropout):
  config = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12,
                                attention_dim=20, dropout=0.3, **kw)
  if config.score == "general" and config.bidirectional:
    pytest.skip("general needs equal sizes")
  graphdef, params, rest = nnx.split(models.Seq2Seq(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
  src, tgt_in, tgt = _batch()
  key = jax.random.PRNGKey(7) if dropout else None

  def fast(p):
    logits, _ = nnx.merge(graphdef, p, rest)(src, tgt_in, deterministic=not dropout,
                                             rngs=nnx.Rngs(dropout=key) if dropout else None)
    return steps.token_loss(logits, tgt, 0)[0]

  def plain(p):
    model = nnx.merge(graphdef, p, rest)
    drop_key = None if key is None else nnx.Rngs(dropout=key).dropout()
    return steps.token_loss(plain_logits(model, src, tgt_in, drop_key), tgt, 0)[0]

  loss, grads = jax.jit(jax.value_and_grad(fast))(params)
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(plain))(params)
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ref_grads))
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * scale)


def test_dropout_changes_the_loss_so_the_masks_above_are_real():
  config = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12,
                                attention_dim=20, dropout=0.3)
  model = models.Seq2Seq(config, rngs=nnx.Rngs(0))
  src, tgt_in, tgt = _batch()
  off = steps.token_loss(model(src, tgt_in)[0], tgt, 0)[0]
  on = steps.token_loss(model(src, tgt_in, deterministic=False,
                              rngs=nnx.Rngs(dropout=jax.random.PRNGKey(7)))[0], tgt, 0)[0]
  assert abs(float(on) - float(off)) > 1e-3
