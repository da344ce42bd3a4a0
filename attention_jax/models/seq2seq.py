"""RNN encoder-decoder (docs/formulas.md §1-2) with and without attention, in Flax NNX.

Encoder: embedding, then 1..n layers of GRU / LSTM (Flax's cells, each run
by one `lax.scan`), uni- or bidirectional, variable lengths respected (the
backward direction starts at each sentence's last real token; final states
are taken at the last real token, so trailing padding changes nothing).

Decoders (`Seq2SeqConfig.decoder`), all run teacher-forced in one `lax.scan`:

  none_init    no attention; initial state = bridge(final encoder states)   (Sutskever)
  none_concat  no attention; final encoder state concatenated to every input
  bahdanau     e = f(s_{t-1}, h); context a concatenated to the input x_t;
               logits from s_t                                              (Bahdanau)
  luong        e = f(s_t, h); s̃_t = tanh(W_c[s_t; a_t]); logits from s̃_t;
               input feeding of the raw context (Britz; zero at t = 0), of
               s̃_t (Luong §3.3) or of nothing                              (Luong / Britz)

Dropout (rate `config.dropout`) is applied to every cell's input, in the
encoder and at every decoder step (Britz et al.: "dropout on cell inputs").

Shape glossary: B batch, S source length, T target length, E embedding size,
h hidden size, De encoder output size (h or 2h), a attention dimension,
V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.recurrent import flip_sequences

from attention_jax import masks
from attention_jax import registry
from attention_jax.layers import GLOROT, SCORES, Attention, dense, dropout_key
from attention_jax.models import common

__all__ = ["Seq2SeqConfig", "Seq2Seq", "RecurrentEncoderLayer", "DECODERS", "CELLS",
           "INPUT_FEEDING"]

DECODERS = ("luong", "bahdanau", "none_init", "none_concat")
CELLS = ("gru", "lstm")
INPUT_FEEDING = ("context", "attentional", "none")

@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
  """Hyper-parameters of `Seq2Seq`; validated on construction."""

  vocab_size: int  # V, shared by source and target (separate embedding tables)
  embed_dim: int = 512  # E, source and target embedding size
  hidden_dim: int = 512  # h, every RNN cell's state size (per direction in the encoder)
  encoder_layers: int = 1  # stacked encoder RNN layers
  bidirectional: bool = True  # bidirectional encoder: outputs are [fwd; bwd], 2h wide
  decoder_layers: int = 2  # stacked decoder RNN layers
  cell: str = "gru"  # 'gru' or 'lstm' (Flax nnx.GRUCell / nnx.LSTMCell)
  decoder: str = "luong"  # 'luong' | 'bahdanau' | 'none_init' | 'none_concat' (module doc)
  score: str = "additive"  # attention score, a name in layers.SCORES (attention decoders)
  attention_dim: int = 512  # a, size of W_1 h and W_2 s (additive, [scaled_]multiplicative)
  input_feeding: str = "context"  # luong: feed 'context' (Britz), 'attentional' s̃, or 'none'
  dropout: float = 0.2  # dropout on every RNN cell's input (encoder and decoder)
  max_source_length: int | None = None  # longest source; required by score 'location'
  bridge: bool | None = None  # decoder init = tanh(Linear(final encoder states)); None =
  #   True for 'none_init', 'none_concat', 'bahdanau', False (zeros, Britz) for 'luong'
  dtype: Any = jnp.float32  # compute dtype (bfloat16 for mixed precision); logits float32
  param_dtype: Any = jnp.float32  # parameter dtype
  pad_id: int = 0  # padding token id (masked; ignored by the encoder)
  eos_id: int = 1  # end-of-sentence token id (stops decoding)
  sos_id: int = 2  # start-of-sentence token id (first decoder input)

  def __post_init__(self):
    for name in ("vocab_size", "embed_dim", "hidden_dim", "encoder_layers",
                 "decoder_layers", "attention_dim"):
      common.positive(getattr(self, name), name)
    common.choice(self.cell, "cell", CELLS)
    common.choice(self.decoder, "decoder", DECODERS)
    common.choice(self.score, "score", SCORES)
    common.choice(self.input_feeding, "input_feeding", INPUT_FEEDING)
    common.choice(self.bidirectional, "bidirectional", (False, True))
    common.choice(self.bridge, "bridge", (None, False, True))
    common.rate(self.dropout, "dropout")
    common.dtype(self.dtype, "dtype")
    common.dtype(self.param_dtype, "param_dtype")
    common.special_tokens(self)
    if self.max_source_length is not None:
      common.positive(self.max_source_length, "max_source_length")
    if self.has_attention:
      spec = registry.SCORES[self.score]
      if spec.needs_length and self.max_source_length is None:
        raise ValueError(f"score {self.score!r} needs `max_source_length` (location: the "
                         "width of W_a; qk_norm: the L of g's initial log2(L^2 - L)).")
      if spec.same_dim and self.hidden_dim != self.encoder_dim:
        raise ValueError(
            f"score {self.score!r} compares decoder and encoder states directly: it needs "
            f"hidden_dim ({self.hidden_dim}) == encoder output size ({self.encoder_dim}; "
            "2 * hidden_dim when bidirectional). Set bidirectional=False or use "
            "'multiplicative' / 'general'.")

  @property
  def encoder_dim(self) -> int:
    """De, width of the encoder outputs."""
    return self.hidden_dim * (2 if self.bidirectional else 1)

  @property
  def has_attention(self) -> bool:
    return self.decoder in ("luong", "bahdanau")

  @property
  def use_bridge(self) -> bool:
    return self.decoder != "luong" if self.bridge is None else self.bridge

  @property
  def feed_dim(self) -> int:
    """Width of what is concatenated to the decoder's token embedding."""
    if self.decoder in ("bahdanau", "none_concat"):
      return self.encoder_dim
    if self.decoder == "luong":
      return {"context": self.encoder_dim, "attentional": self.hidden_dim,
              "none": 0}[self.input_feeding]
    return 0

  @classmethod
  def britz_base(cls, vocab_size: int, **overrides) -> "Seq2SeqConfig":
    """Britz et al. 2017 baseline: embeddings 512, 1-layer bidirectional GRU
    encoder 512 per direction, 2-layer GRU decoder 512, Luong-style decoder with
    raw-context input feeding, additive attention dim 512, dropout 0.2."""
    return cls(vocab_size=vocab_size, **overrides)


def hoists_input_projections() -> bool:
  """Whether the GRU cells' input projections run outside the scans: every
  step's `x_t W_i + b_i` as one product over the whole sequence before the
  loop (and its weight gradient as one product after the backward loop),
  leaving the recurrent product `h W_h` inside.

  Why on GPUs: there a scan step's small kernels each cost a launch. Measured
  on one H200, the `gpu` step took 23.3 ms with XLA's command buffers and
  38.0 ms without, about 2 µs per launch saved (results/gpu_h200/2026-11-27).
  Compiled for an H100, hoisting takes that step from 7,773 launches to 6,333
  and its predicted time from 80.5 to 74.3 ms
  (results/compile_check/launches/hoisted).
  Why not on TPUs: compiled for a TPU v5e, the same step's counted bytes rose
  from 87.0 to 89.5 GB and its predicted time from 115.0 to 117.6 ms (same
  folder).
  Why not on CPUs: the committed CPU results were made with the per-step form,
  and the two forms agree only to float rounding; the CPU keeps its programs
  (and its numbers). The compile check answers for its target
  (`analysis/compile_device.py` makes `jax.default_backend()` say so)."""
  return jax.default_backend() == "gpu"


def scan_unroll() -> int:
  """Scan steps per loop iteration of the encoder's and decoder's scans (1:
  not unrolled); the same numbers either way.

  Why 2 on GPUs: compiled for an H100 (jax 0.11.2), the `gpu` step's loop
  bodies are otherwise cut by the scan's per-step slices, which XLA makes
  asynchronous dynamic-slice fusions where a command buffer (CUDA graph)
  stops; 2 steps per iteration leave ordinary fusions there, and each loop
  body becomes one command buffer: `additive d=1024` went from 6,333 launches
  to 573 and its predicted step from 74.3 to 39.9 ms
  (results/compile_check/launches/unrolled). Run on one H200, with hoisting,
  the step took 18.8 ms against 22.3 ms for the per-step code (16 %, less
  than the launch count predicted; results/gpu_h200/2026-11-27b).
  Why not on TPUs: compiled for a TPU v5e, the unroll lowered the counted
  bytes of `additive d=1024` (87.0 to 84.6 GB) but, over all 12 `gpu` cells
  compiled from the same code, raised the predicted training steps from 110.0
  to 111.5 min, the step rising in 9 cells (results/compile_check/launches/
  unrolled). Why not on CPUs: they keep their programs (and numbers)."""
  return 2 if jax.default_backend() == "gpu" else 1


def _gru_update(cell: nnx.GRUCell, h, x_projected):
  """`nnx.GRUCell`'s update of `h [B, h]` from its input projection already
  made, `x_projected = cell.dense_i(x) [B, 3h]`: the cell's own equations
  (gates r, z, candidate n) with its own parameters, split where the
  projection is. Returns `(new h, new h)` as the cell does."""
  xi_r, xi_z, xi_n = jnp.split(x_projected, 3, axis=-1)
  hh_r, hh_z, hh_n = jnp.split(cell.dense_h(h), 3, axis=-1)
  r = cell.gate_fn(xi_r + hh_r)
  z = cell.gate_fn(xi_z + hh_z)
  n = cell.activation_fn(xi_n + r * hh_n)
  new_h = (1.0 - z) * n + z * h
  return new_h, new_h


def _dropped(x, keep, rate: float):
  """`x` with the features `keep` is False at dropped and the rest scaled by
  1 / (1 - rate): `nnx.Dropout`'s output for a mask drawn beforehand."""
  return jax.lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _compute_dtype(layer: nnx.Linear):
  """The dtype `layer` computes in: its own, else its parameters'."""
  return layer.dtype or layer.kernel[...].dtype


def _run_cell(cell, inputs, lengths, carry):
  """Runs `cell` over `inputs [B, S, D]`; the carry stops changing after each
  sentence's `lengths [B]` steps. Returns `(final carry, outputs [B, S, h])`.
  A GRU's input projection runs before the loop on GPUs
  (`hoists_input_projections`)."""
  step = cell
  if isinstance(cell, nnx.GRUCell) and hoists_input_projections():
    inputs = cell.dense_i(inputs)  # [B, S, 3h]
    step = lambda h, x_projected: _gru_update(cell, h, x_projected)

  def body(carry, xs):
    x_t, t = xs
    new_carry, y = step(carry, x_t)
    keep = (t < lengths)[:, None]  # [B, 1]
    carry = jax.tree.map(lambda n, o: jnp.where(keep, n.astype(o.dtype), o), new_carry, carry)
    return carry, y

  steps = jnp.arange(inputs.shape[1])
  carry, outputs = jax.lax.scan(body, carry, (jnp.swapaxes(inputs, 0, 1), steps),
                                unroll=scan_unroll())
  return carry, jnp.swapaxes(outputs, 0, 1)


class RecurrentEncoderLayer(nnx.Module):
  """One encoder RNN layer, forward or bidirectional, respecting lengths.

  The backward cell reads each sentence reversed *within its length* (Flax's
  `flip_sequences`), so it starts at the last real token, and its outputs are
  flipped back to source order: `outputs [B, S, h or 2h] = [fwd; bwd]`.
  """

  def __init__(self, forward_cell: nnx.Module, backward_cell: nnx.Module | None = None):
    self.forward_cell = forward_cell
    self.backward_cell = backward_cell

  def __call__(self, inputs, lengths, zero_carry):
    """inputs `[B, S, D]`, lengths int `[B]` -> `(final carry, outputs [B, S, ·])`;
    the final carry is a `(forward, backward)` pair when bidirectional."""
    final, outputs = _run_cell(self.forward_cell, inputs, lengths, zero_carry)
    if self.backward_cell is None:
      return final, outputs
    flip = lambda x: flip_sequences(x, lengths, num_batch_dims=1, time_major=False)
    final_b, outputs_b = _run_cell(self.backward_cell, flip(inputs), lengths, zero_carry)
    return (final, final_b), jnp.concatenate([outputs, flip(outputs_b)], axis=-1)


class Seq2Seq(nnx.Module):
  """RNN encoder-decoder; `model(src, tgt_in) -> (logits [B, T, V], aux)`.

  `aux`: `scores` (raw, pre-softmax, before offset and mask) and `weights`
  (float32) `[B, T, S]` of the decoder's attention, `key_valid` bool
  `[B, 1, S]`; all three None for the decoders without attention.
  """

  def __init__(self, config: Seq2SeqConfig, *, rngs: nnx.Rngs):
    if not isinstance(config, Seq2SeqConfig):
      raise TypeError(f"`config` must be a Seq2SeqConfig, got {type(config).__name__}.")
    self.config = c = config
    kw = dict(dtype=c.dtype, param_dtype=c.param_dtype, rngs=rngs)
    cell_cls = nnx.GRUCell if c.cell == "gru" else nnx.LSTMCell
    self.src_embed = nnx.Embed(c.vocab_size, c.embed_dim, **kw)
    self.tgt_embed = nnx.Embed(c.vocab_size, c.embed_dim, **kw)

    # Encoder: Flax cells run by `lax.scan` directly (not nnx.RNN, whose
    # nnx.scan refuses modules closed over by an outer jax.jit).
    layers, in_dim = [], c.embed_dim
    for _ in range(c.encoder_layers):
      layers.append(RecurrentEncoderLayer(cell_cls(in_dim, c.hidden_dim, **kw),
                                 cell_cls(in_dim, c.hidden_dim, **kw) if c.bidirectional
                                 else None))
      in_dim = c.encoder_dim
    self.encoder = nnx.List(layers)

    # Decoder cells: layer 0 reads [embedding; feed], the others the layer below.
    dims = [c.embed_dim + c.feed_dim] + [c.hidden_dim] * (c.decoder_layers - 1)
    self.decoder_cells = nnx.List([cell_cls(d, c.hidden_dim, **kw) for d in dims])
    self.dropout = nnx.Dropout(c.dropout)

    state_parts = 2 if c.cell == "lstm" else 1
    if c.use_bridge:
      in_dim = c.encoder_layers * (2 if c.bidirectional else 1) * state_parts * c.hidden_dim
      self.bridge = nnx.Linear(in_dim, c.decoder_layers * state_parts * c.hidden_dim,
                               kernel_init=GLOROT, **kw)
    if c.has_attention:
      self.attention = Attention(
          c.hidden_dim, c.encoder_dim, score=c.score, attention_dim=c.attention_dim,
          max_source_length=c.max_source_length, **kw)
    if c.decoder == "luong":
      # s̃ = tanh(W_c [s_t; a_t]) (Britz's "attention_mix", with bias).
      self.attention_mix = nnx.Linear(c.hidden_dim + c.encoder_dim, c.hidden_dim,
                                      kernel_init=GLOROT, **kw)
    self.output = nnx.Linear(c.hidden_dim, c.vocab_size, kernel_init=GLOROT, **kw)

  # -- encoder ---------------------------------------------------------------

  def _zero_carry(self, batch):
    h = jnp.zeros((batch, self.config.hidden_dim), jnp.float32)
    return (h, h) if self.config.cell == "lstm" else h

  def encode(self, src: jax.Array, *, deterministic: bool = True, rngs=None):
    """Runs the encoder.

    Args:
      src: int `[B, S]`; padding (config.pad_id) must be trailing.
      deterministic / rngs: dropout switch and its `nnx.Rngs` (or key).

    Returns:
      dict with `states [B, S, De]` (compute dtype; values at padding
      positions are meaningless), `key_valid` bool `[B, S]` and `final`: per
      layer, the carry at each sentence's last real token (a pair
      `(forward, backward)` when bidirectional; LSTM carries are `(c, h)`).
    """
    src = common.tokens(src, "src")
    return self._encode(src, deterministic, None if deterministic else dropout_key(rngs))

  def _encode(self, src, deterministic, key):
    c = self.config
    valid = masks.padding(src, c.pad_id)  # [B, S]
    lengths = jnp.sum(valid, axis=-1).astype(jnp.int32)  # [B]
    x = self.src_embed(src)  # [B, S, E]
    finals = []
    for layer, k in zip(self.encoder, common.split_key(key, len(self.encoder))):
      x = self.dropout(x, deterministic=deterministic, rngs=k)
      final, x = layer(x, lengths, self._zero_carry(src.shape[0]))  # x [B, S, De]
      finals.append(final)
    return {"states": x.astype(c.dtype), "key_valid": valid, "final": tuple(finals)}

  def _start(self, encoded):
    """Encoder outputs -> `(memory, carry)` of the decoder."""
    c = self.config
    states, valid = encoded["states"], encoded["key_valid"]
    batch = states.shape[0]
    memory = {"states": states, "key_valid": valid}
    if c.has_attention:
      memory["prepared"] = self.attention.prepare(states)  # [B, S, ·], once per sentence
    if c.decoder == "none_concat":
      top = encoded["final"][-1]
      hidden = lambda carry: carry[1] if c.cell == "lstm" else carry
      parts = [hidden(top[0]), hidden(top[1])] if c.bidirectional else [hidden(top)]
      memory["last"] = jnp.concatenate(parts, axis=-1).astype(c.dtype)  # [B, De]
    if c.use_bridge:
      flat = jnp.concatenate(jax.tree.leaves(encoded["final"]), axis=-1)
      init = jnp.tanh(self.bridge(flat)).astype(jnp.float32)  # [B, Ld·parts·h]
      chunks = jnp.split(init, c.decoder_layers * (2 if c.cell == "lstm" else 1), axis=-1)
      if c.cell == "lstm":
        cells = tuple((chunks[2 * i], chunks[2 * i + 1]) for i in range(c.decoder_layers))
      else:
        cells = tuple(chunks)
    else:
      cells = tuple(self._zero_carry(batch) for _ in range(c.decoder_layers))
    carry = {"cells": cells}
    if c.decoder == "luong" and c.input_feeding != "none":
      carry["feed"] = jnp.zeros((batch, c.feed_dim), c.dtype)
    return memory, carry

  # -- decoder ---------------------------------------------------------------

  def _attend(self, memory, query, offset):
    """query `[B, h]` -> `(context [B, De], weights [B, S], scores [B, S])`."""
    context, weights, scores = self.attention(
        query[:, None, :], memory["prepared"], memory["states"],
        mask=memory["key_valid"][:, None, :],
        score_offset=None if offset is None else offset[:, None, :])
    return context[:, 0], weights[:, 0], scores[:, 0]

  def _step(self, memory, carry, embedded, *, deterministic=True, key=None, offset=None,
            hoisted=None):
    """One decoder step: embedded `[B, E]` -> `(features [B, h], carry, (scores, weights))`.

    `features` go through `self.output` to give the logits; scores / weights
    are `[B, S]` float32 (None without attention). `hoisted`: this step's
    `(projected [B, 3h], keep [B, F] or None)` from `_hoist_embedding`; the
    first cell then adds the rest of its input's projection to `projected`
    (the embedding's part, made before the loop) instead of projecting
    `[embedding; rest]` here.
    """
    c = self.config
    cells = carry["cells"]
    top_hidden = lambda cell: cell[1] if c.cell == "lstm" else cell
    parts = [embedded.astype(c.dtype)]
    scores = weights = None
    if c.decoder == "none_concat":
      parts.append(memory["last"])
    elif c.decoder == "bahdanau":
      context, weights, scores = self._attend(memory, top_hidden(cells[-1]), offset)
      parts.append(context)
    elif "feed" in carry:
      parts.append(carry["feed"])
    keys = common.split_key(key, len(self.decoder_cells))
    new_cells = []
    if hoisted is not None:  # the first cell's input: the embedding's part is made
      projected, keep = hoisted
      cell0 = self.decoder_cells[0]
      if len(parts) > 1:
        rest = jnp.concatenate(parts[1:], axis=-1)  # [B, F]
        if keep is not None:  # the mask the whole input's dropout would draw
          rest = _dropped(rest, keep, self.dropout.rate)
        w = cell0.dense_i.kernel[...][c.embed_dim:]  # [F, 3h]
        dt = _compute_dtype(cell0.dense_i)
        projected = projected + jnp.dot(rest.astype(dt), w.astype(dt))
      state, x = _gru_update(cell0, cells[0], projected)
      new_cells.append(state.astype(jnp.float32))
      cells, keys, layers = cells[1:], keys[1:], self.decoder_cells[1:]
    else:
      x = jnp.concatenate(parts, axis=-1)  # [B, E + feed]
      layers = self.decoder_cells
    for cell, state, k in zip(layers, cells, keys):
      x = self.dropout(x, deterministic=deterministic, rngs=k)
      state, x = cell(state, x)  # x [B, h]
      new_cells.append(jax.tree.map(lambda s: s.astype(jnp.float32), state))
    new_carry = {"cells": tuple(new_cells)}
    features = x
    if c.decoder == "luong":
      context, weights, scores = self._attend(memory, x, offset)
      attentional = jnp.tanh(self.attention_mix(
          jnp.concatenate([x.astype(c.dtype), context], axis=-1)))  # [B, h]
      features = attentional
      if c.input_feeding == "context":
        new_carry["feed"] = context.astype(c.dtype)
      elif c.input_feeding == "attentional":
        new_carry["feed"] = attentional.astype(c.dtype)
    return features, new_carry, (scores, weights)

  def _hoist_embedding(self, embedded, step_keys):
    """The first decoder cell's input projection of every step's embedding,
    made before the loop (`hoists_input_projections`): `(projected [T, B, 3h],
    keep [T, B, F] or None)`, F the width of the rest of that cell's input
    (context, feed or the encoder's last state; 0 for none).

    With dropout, each step's mask is the one `self.dropout` would draw for
    the whole input `[embedding; rest]` from that step's key (the first of
    `split_key(key_t, layers)`): its first E columns drop embedding features
    here, the others are applied to the rest inside the step.
    """
    c = self.config
    cell0 = self.decoder_cells[0]
    t, b, e = embedded.shape
    width = cell0.in_features - e  # F
    x = embedded.astype(c.dtype)
    keep = None
    if step_keys is not None and self.dropout.rate > 0:
      first = jax.vmap(lambda k: jax.random.split(k, len(self.decoder_cells))[0])(step_keys)
      keep_all = jax.vmap(lambda k: jax.random.bernoulli(
          k, 1.0 - self.dropout.rate, (b, e + width)))(first)  # [T, B, E + F]
      x = _dropped(x, keep_all[..., :e], self.dropout.rate)
      keep = keep_all[..., e:] if width else None
    dt = _compute_dtype(cell0.dense_i)
    w = cell0.dense_i.kernel[...][:e].astype(dt)  # [E, 3h]
    projected = jnp.dot(x.astype(dt), w) + cell0.dense_i.bias[...].astype(dt)
    return projected, keep

  def __call__(self, src: jax.Array, tgt_in: jax.Array, *, deterministic: bool = True,
               rngs=None, score_offset: jax.Array | None = None):
    """Teacher-forced forward pass; the decoder runs in one `lax.scan`.

    Args:
      src: int `[B, S]` (trailing padding = config.pad_id).
      tgt_in: int `[B, T]`, `<sos>` + gold shifted right.
      deterministic: False enables dropout, drawing from `rngs`.
      rngs: `nnx.Rngs` with a 'dropout' stream (or a jax key).
      score_offset: float `[B, T, S]` added to the raw attention scores before
        the softmax (attention decoders only).

    Returns:
      `(logits [B, T, V] float32, aux)`, see the class docstring.
    """
    c = self.config
    src = common.tokens(src, "src")
    tgt_in = common.tokens(tgt_in, "tgt_in")
    common.same_batch(src, tgt_in)
    (b, s), t = src.shape, tgt_in.shape[1]
    if score_offset is not None:
      if not c.has_attention:
        raise ValueError(f"`score_offset` needs an attention decoder, not {c.decoder!r}.")
      if tuple(jnp.shape(score_offset)) != (b, t, s):
        raise ValueError(
            f"`score_offset` must have the scores' shape {(b, t, s)} [B, T, S], "
            f"got {tuple(jnp.shape(score_offset))}.")
    key = None if deterministic else dropout_key(rngs)
    if not deterministic and key is None and c.dropout > 0:
      raise ValueError("deterministic=False needs `rngs` (an nnx.Rngs with a 'dropout' stream).")
    k_enc, k_dec = common.split_key(key, 2)
    with jax.named_scope("encoder"):  # scopes name the ops in profiles, nothing else
      memory, carry = self._start(self._encode(src, deterministic, k_enc))

    embedded = jnp.swapaxes(self.tgt_embed(tgt_in), 0, 1)  # [T, B, E]
    offsets = None if score_offset is None else jnp.swapaxes(
        jnp.asarray(score_offset, jnp.float32), 0, 1)  # [T, B, S]
    step_keys = None if k_dec is None else jax.random.split(k_dec, t)  # [T] keys

    hoisted = None
    if c.cell == "gru" and hoists_input_projections():
      hoisted = self._hoist_embedding(embedded, step_keys)

    def body(carry, xs):
      emb_t, offset_t, key_t, hoisted_t = xs
      features, carry, (scores, weights) = self._step(
          memory, carry, emb_t, deterministic=deterministic, key=key_t, offset=offset_t,
          hoisted=hoisted_t)
      return carry, (features, scores, weights)

    with jax.named_scope("decoder"):
      _, (features, scores, weights) = jax.lax.scan(
          body, carry, (embedded, offsets, step_keys, hoisted),
          unroll=scan_unroll())  # features [T, B, h]
    with jax.named_scope("output"):
      logits = dense(self.output, jnp.swapaxes(features, 0, 1)).astype(jnp.float32)  # [B, T, V]
    if c.has_attention:
      aux = {"scores": jnp.swapaxes(scores, 0, 1),  # [B, T, S]
             "weights": jnp.swapaxes(weights, 0, 1),  # [B, T, S]
             "key_valid": memory["key_valid"][:, None, :]}  # [B, 1, S]
    else:
      aux = {"scores": None, "weights": None, "key_valid": None}
    return logits, aux

  # -- incremental decoding --------------------------------------------------

  @property
  def max_decode_length(self) -> int | None:
    """No positional limit: decoding length is set by the caller."""
    return None

  def init_decode(self, src: jax.Array, max_len: int | None = None):
    """Encodes `src [B, S]`; returns `(memory, carry)` for `decode_step`, every
    leaf batch-leading. `max_len` is unused (the RNN needs no cache)."""
    del max_len
    return self._start(self.encode(src))

  def decode_step(self, memory, carry, tokens: jax.Array, t):
    """One decoding step.

    Args:
      memory / carry: from `init_decode` (or the previous step).
      tokens: int `[B]`, the previous output token (`<sos>` at t = 0).
      t: the step index (unused by the RNN; part of the shared protocol).

    Returns:
      `(logits [B, V] float32, carry, weights [B, S] float32 or None)`.
    """
    del t
    features, carry, (_, weights) = self._step(memory, carry, self.tgt_embed(tokens))
    return self.output(features).astype(jnp.float32), carry, weights
