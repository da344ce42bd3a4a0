"""Transformer encoder-decoder (Vaswani et al. 2017; docs/formulas.md §4) in Flax NNX.

    memory = Encoder(src)                      # N x [self-attn, FFN]
    logits = Decoder(tgt_in, memory)           # N x [causal self-attn, cross-attn, FFN]

Every sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))` (post-LN,
the paper) or `x + Dropout(Sublayer(LayerNorm(x)))` (pre-LN, with a final
LayerNorm after each stack). Embeddings are multiplied by `√d_model`, then
positions (sinusoidal or learned) are added; with `share_embeddings` one table
serves the source, the target and the pre-softmax projection. The score
function of every attention block is `config.score`.

Shape glossary: B batch, S source length, T target length, D d_model,
H heads, F d_ff, V vocabulary, N layers, L decode cache length.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import masks
from attention_jax.attention import MaskStructure
from attention_jax import positional
from attention_jax import layers
from attention_jax.layers import GLOROT, SCORES, MultiHeadAttention, dropout_key
from attention_jax.models import common

__all__ = ["TransformerConfig", "Transformer"]

@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of `Transformer`; validated on construction.

  `qk_init` chooses the initialisers of the query and key projections W_Q,
  W_K of every attention module (encoder self, decoder self, cross), by name
  (`layers.QK_INITS`); everything else keeps its initialiser under each:
    glorot      Glorot uniform, as every other projection (the default).
    premise     LeCun normal (variance 1/fan_in), zero biases: each q and k
                coordinate has variance ~ the mean square of the attention's
                input at any d_k, so the unscaled q·k has std ~√d_k (the
                premise of Vaswani et al.'s footnote 4). With pre-LN every
                attention input is a LayerNorm output (mean square 1 per
                vector at init): variance ~1. With post-LN the first layer's
                self attentions see the embeddings·√d_model + positions
                (mean square ~1 + 1/2 = 1.5, sinusoidal or learned), every
                later input is a LayerNorm output (~1), the cross
                attention's queries and keys too.
    zero_query  W_Q zeros (muP): every logit is 0 at step 0; W_K as premise.
  """

  vocab_size: int  # V, shared by source and target (one joint subword vocabulary)
  num_layers: int = 6  # N, decoder layers (and encoder layers unless encoder_layers is set)
  encoder_layers: int | None = None  # encoder layers; None = num_layers (the paper: N both)
  d_model: int = 512  # D, width of the residual stream and the embeddings
  num_heads: int = 8  # H; d_model must be divisible by it unless attention_dim is set
  d_ff: int = 2048  # F, inner width of the position-wise feed-forward network
  dropout: float = 0.1  # P_drop on embeddings+positions and on every sub-layer output
  attention_dropout: float = 0.0  # dropout on the attention weights (0 = none, as the paper)
  score: str = "scaled_dot"  # score of every attention block: a name in layers.SCORES
  attention_dim: int | None = None  # per-head query/key size d_k; None = d_model // num_heads
  pre_layer_norm: bool = False  # False: LayerNorm(x + Sublayer(x)) as the paper; True: pre-LN
  qk_init: str = "glorot"  # init of every W_Q, W_K: a name in layers.QK_INITS (class docstring)
  positional: str = "sinusoidal"  # 'sinusoidal' (fixed table) or 'learned'
  max_length: int = 512  # longest source / target / decoded sequence
  share_embeddings: bool = True  # one table for source, target and the output projection
  dtype: Any = jnp.float32  # compute dtype (bfloat16 for mixed precision); logits are float32
  param_dtype: Any = jnp.float32  # parameter dtype
  pad_id: int = 0  # padding token id: a sentence ends at its first (masked everywhere)
  eos_id: int = 1  # end-of-sentence token id (stops decoding)
  sos_id: int = 2  # start-of-sentence token id (first decoder input)

  def __post_init__(self):
    for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_length"):
      common.positive(getattr(self, name), name)
    for name in ("attention_dim", "encoder_layers"):
      if getattr(self, name) is not None:
        common.positive(getattr(self, name), name)
    if self.d_model % self.num_heads:
      raise ValueError(
          f"`d_model` ({self.d_model}) must be divisible by `num_heads` "
          f"({self.num_heads}): d_v = d_model / num_heads.")
    common.rate(self.dropout, "dropout")
    common.rate(self.attention_dropout, "attention_dropout")
    common.choice(self.score, "score", SCORES)
    common.choice(self.positional, "positional", ("sinusoidal", "learned"))
    common.choice(self.pre_layer_norm, "pre_layer_norm", (False, True))
    common.choice(self.qk_init, "qk_init", tuple(layers.QK_INITS))
    common.choice(self.share_embeddings, "share_embeddings", (False, True))
    common.dtype(self.dtype, "dtype")
    common.dtype(self.param_dtype, "param_dtype")
    common.special_tokens(self)

  @property
  def num_encoder_layers(self) -> int:
    return self.encoder_layers or self.num_layers

  @property
  def head_dim(self) -> int:
    """Per-head query/key size d_k."""
    return self.attention_dim or self.d_model // self.num_heads

  @classmethod
  def base(cls, vocab_size: int, **overrides) -> "TransformerConfig":
    """Transformer-base of Vaswani et al.: N=6, d_model=512, h=8, d_ff=2048,
    P_drop=0.1, shared embeddings, sinusoidal positions, post-LN."""
    return cls(vocab_size=vocab_size, **overrides)


class FeedForward(nnx.Module):
  """`FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`, `W_1 [D, F]`, `W_2 [F, D]`."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    kw = dict(kernel_init=GLOROT, dtype=config.dtype, param_dtype=config.param_dtype,
              rngs=rngs)
    self.inner = nnx.Linear(config.d_model, config.d_ff, **kw)
    self.outer = nnx.Linear(config.d_ff, config.d_model, **kw)

  def __call__(self, x):
    return layers.dense(self.outer, jax.nn.relu(layers.dense(self.inner, x)))  # [B, T, D]


class _Block(nnx.Module):
  """Residual + LayerNorm wrapping shared by the encoder and decoder layers."""

  def _init_block(self, config: TransformerConfig, num_sublayers: int, rngs: nnx.Rngs):
    self.pre_layer_norm = config.pre_layer_norm
    self.norms = nnx.List([
        nnx.LayerNorm(config.d_model, epsilon=1e-6, dtype=config.dtype,
                      param_dtype=config.param_dtype, rngs=rngs)
        for _ in range(num_sublayers)])
    self.dropout = nnx.Dropout(config.dropout)

  def _mha(self, config, rngs):
    return MultiHeadAttention(
        config.num_heads, config.d_model, qk_features=config.head_dim,
        score=config.score, dropout_rate=config.attention_dropout,
        max_length=config.max_length, qk_init=config.qk_init, dtype=config.dtype,
        param_dtype=config.param_dtype, rngs=rngs)

  def _residual(self, i, x, sublayer, deterministic, key):
    """Applies sub-layer i; `sublayer(h) -> (y, extra)`; returns `(x', extra)`."""
    drop = lambda y: self.dropout(y, deterministic=deterministic, rngs=key)
    if self.pre_layer_norm:
      y, extra = sublayer(self.norms[i](x))
      return x + drop(y), extra
    y, extra = sublayer(x)
    return self.norms[i](x + drop(y)), extra


class EncoderLayer(_Block):
  """Self attention and FFN, each wrapped with residual + LayerNorm."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self._init_block(config, 2, rngs)
    self.self_attn = self._mha(config, rngs)
    self.ffn = FeedForward(config, rngs=rngs)

  def __call__(self, x, mask, *, deterministic: bool = True, key=None):
    """x `[B, S, D]`, mask bool `[B, 1, S, S]` or a `MaskStructure` -> `[B, S, D]`."""
    k_attn, k_res1, k_res2 = common.split_key(key, 3)
    x, _ = self._residual(
        0, x, lambda h: self.self_attn(h, mask=mask, deterministic=deterministic, rngs=k_attn),
        deterministic, k_res1)
    x, _ = self._residual(1, x, lambda h: (self.ffn(h), None), deterministic, k_res2)
    return x


class DecoderLayer(_Block):
  """Causal self attention, cross attention over the encoder output, FFN."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self._init_block(config, 3, rngs)
    self.self_attn = self._mha(config, rngs)
    self.cross_attn = self._mha(config, rngs)
    self.ffn = FeedForward(config, rngs=rngs)

  def __call__(self, x, memory_kv, *, self_mask=None, cross_mask=None,
               deterministic: bool = True, key=None, score_offset=None,
               cache=None, index=None):
    """One decoder layer.

    Args:
      x: `[B, T, D]` (T = 1 when decoding with a cache).
      memory_kv: `cross_attn.project_kv(memory)`: `([B, H, S, d_k], [B, H, S, d_v])`.
      self_mask: bool `[B, 1, T, T]` or a `MaskStructure` (ignored with a
        cache: causal by `index`).
      cross_mask: bool `[B, 1, 1, S]`.
      deterministic / key: dropout switch and key.
      score_offset: `[B, H, T, S]` added to the cross-attention scores.
      cache / index: self-attention cache and the position being decoded.
      With beam search x is `[B·K, 1, D]` (K hypotheses per sentence) while
      `memory_kv` and `cross_mask` keep one copy per sentence: the K beams
      are then K queries of the cross attention.

    Returns:
      `(x [B, T, D], cross_aux {'scores', 'weights'} [B, H, T, S], new cache)`.
    """
    k_self, k_cross, k_res1, k_res2, k_res3 = common.split_key(key, 5)
    new_cache = None

    def self_attention(h):
      nonlocal new_cache
      if cache is None:
        out, _ = self.self_attn(h, mask=self_mask, deterministic=deterministic, rngs=k_self)
        return out, None
      out, new_cache, _ = self.self_attn.decode_step(h, cache, index)
      return out, None

    def cross_attention(h):
      q = self.cross_attn.project_query(h)
      beams = q.shape[0] // memory_kv[0].shape[0]
      if beams == 1:
        return self.cross_attn.attend(
            q, *memory_kv, mask=cross_mask, deterministic=deterministic,
            dropout_key=k_cross, score_offset=score_offset, return_weights=True)
      out, aux = self.cross_attn.attend(layers.beams_as_queries(q, beams), *memory_kv,
                                        mask=cross_mask, return_weights=True)  # [B, K, D]
      # back to one row per beam: [B·K, 1, D], weights [B·K, H, 1, S]
      weights = jnp.swapaxes(aux["weights"], 1, 2).reshape(-1, aux["weights"].shape[1], 1,
                                                           aux["weights"].shape[-1])
      return out.reshape(-1, 1, out.shape[-1]), {"weights": weights}

    x, _ = self._residual(0, x, self_attention, deterministic, k_res1)
    x, cross_aux = self._residual(1, x, cross_attention, deterministic, k_res2)
    x, _ = self._residual(2, x, lambda h: (self.ffn(h), None), deterministic, k_res3)
    return x, cross_aux, new_cache


# Every attention module of the Transformer by (layer list, sub-layer) attribute,
# named by its kind; `attention_masks` and the diagnostics use these names.
ATTENTION_KINDS = {("encoder_layers", "self_attn"): "encoder_self",
                   ("decoder_layers", "self_attn"): "decoder_self",
                   ("decoder_layers", "cross_attn"): "cross"}


class Transformer(nnx.Module):
  """Encoder-decoder Transformer.

  `model(src, tgt_in) -> (logits [B, T, V] float32, aux)` with the decoder's
  cross attention in `aux` (`[N, B, H, T, S]`). For decoding see
  `init_decode` / `decode_step` (used by `attention_jax.decoding`).
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    if not isinstance(config, TransformerConfig):
      raise TypeError(f"`config` must be a TransformerConfig, got {type(config).__name__}.")
    self.config = config
    d, v = config.d_model, config.vocab_size
    # std d^-1/2: the √d-scaled input embedding has unit-variance entries and
    # the tied pre-softmax projection starts with unit-scale logits.
    embed = dict(embedding_init=nnx.initializers.normal(d ** -0.5), dtype=config.dtype,
                 param_dtype=config.param_dtype, rngs=rngs)
    self.embed = nnx.Embed(v, d, **embed)  # target (and, if shared, source and output)
    if not config.share_embeddings:
      self.src_embed = nnx.Embed(v, d, **embed)
      self.output = nnx.Linear(d, v, use_bias=False, kernel_init=GLOROT,
                               dtype=config.dtype, param_dtype=config.param_dtype,
                               rngs=rngs)
    if config.positional == "learned":
      # RMS 1/√2, the RMS of the sinusoidal table.
      self.pos_table = nnx.Param(nnx.initializers.normal(0.5 ** 0.5)(
          rngs.params(), (config.max_length, d), config.param_dtype))
    self.embed_dropout = nnx.Dropout(config.dropout)
    self.encoder_layers = nnx.List(
        [EncoderLayer(config, rngs=rngs) for _ in range(config.num_encoder_layers)])
    self.decoder_layers = nnx.List(
        [DecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
    if config.pre_layer_norm:
      norm = dict(epsilon=1e-6, dtype=config.dtype, param_dtype=config.param_dtype,
                  rngs=rngs)
      self.encoder_norm = nnx.LayerNorm(d, **norm)
      self.decoder_norm = nnx.LayerNorm(d, **norm)

  # -- pieces ----------------------------------------------------------------

  def _check_length(self, length, name):
    if length > self.config.max_length:
      raise ValueError(
          f"`{name}` has length {length} > config.max_length={self.config.max_length}.")

  def _positions(self, length, offset=0):
    """`[T, D]` positional encodings for positions offset..offset+T-1."""
    if self.config.positional == "learned":
      return positional.learned(self.pos_table[...], length, offset)
    table = positional.sinusoidal(self.config.max_length, self.config.d_model)
    return jax.lax.dynamic_slice_in_dim(table, offset, length, axis=0)  # [T, D]

  def _embed(self, tokens, table, *, offset=0, deterministic=True, key=None):
    """tokens `[B, T]` -> `Dropout(E[tokens]·√D + PE)` `[B, T, D]`."""
    x = table(tokens) * jnp.asarray(math.sqrt(self.config.d_model), table.embedding.dtype)
    x = x + self._positions(tokens.shape[1], offset).astype(x.dtype)  # [B, T, D]
    x = x.astype(self.config.dtype)
    return self.embed_dropout(x, deterministic=deterministic, rngs=key)

  def logits(self, x: jax.Array) -> jax.Array:
    """Pre-softmax projection `[B, T, D]` -> float32 `[B, T, V]`."""
    if self.config.share_embeddings:
      out = layers.dense(self.embed.attend, x)
    else:
      out = layers.dense(self.output, x)
    return out.astype(jnp.float32)

  # -- training forward ------------------------------------------------------

  def encode(self, src: jax.Array, *, deterministic: bool = True, rngs=None) -> jax.Array:
    """src int `[B, S]` (pad = config.pad_id) -> memory `[B, S, D]` (compute dtype)."""
    src = common.tokens(src, "src")
    self._check_length(src.shape[1], "src")
    return self._encode(src, deterministic, None if deterministic else dropout_key(rngs))

  def _encode(self, src, deterministic, key):
    c = self.config
    keys = common.split_key(key, c.num_encoder_layers + 1)
    table = self.embed if c.share_embeddings else self.src_embed
    x = self._embed(src, table, deterministic=deterministic, key=keys[0])
    lengths = masks.lengths(src, c.pad_id)  # [B]: a sentence ends at its first pad
    mask = MaskStructure(query_lengths=lengths, key_lengths=lengths)  # [B, 1, S, S]
    for layer, k in zip(self.encoder_layers, keys[1:]):
      x = layer(x, mask, deterministic=deterministic, key=k)
    if c.pre_layer_norm:
      x = self.encoder_norm(x)
    return x  # [B, S, D]

  def __call__(self, src: jax.Array, tgt_in: jax.Array, *, deterministic: bool = True,
               rngs=None, score_offset: jax.Array | None = None):
    """Teacher-forced forward pass.

    Args:
      src: int `[B, S]`, pad = config.pad_id.
      tgt_in: int `[B, T]`, `<sos>` + gold shifted right, pad = config.pad_id.
      deterministic: False enables dropout, drawing from `rngs`.
      rngs: `nnx.Rngs` with a 'dropout' stream (or a jax key).
      score_offset: float `[N, B, H, T, S]` added to every decoder layer's raw
        cross-attention scores before the softmax: an input, not a switch
        (the trainer's diagnostics differentiate the loss with respect to
        it, as for the RNN's `score_offset`).

    Returns:
      `(logits [B, T, V] float32, aux)`; aux `scores` / `weights` float32
      `[N, B, H, T, S]` (cross attention of every decoder layer; scores raw,
      before offset and mask) and `key_valid` bool `[1, B, 1, 1, S]`.

    The self attentions' scores and weights are not returned (the fused
    kernels never form them): a view with `sow_attention`
    (`MultiHeadAttention.set_view`) makes every attention module sow its own
    under `nnx.capture` (`training.diagnostics.transformer_attention`), and
    `attention_masks` says which of their entries are real.
    """
    c = self.config
    src = common.tokens(src, "src")
    tgt_in = common.tokens(tgt_in, "tgt_in")
    common.same_batch(src, tgt_in)
    self._check_length(src.shape[1], "src")
    self._check_length(tgt_in.shape[1], "tgt_in")
    (b, s), t = src.shape, tgt_in.shape[1]
    aux_shape = (c.num_layers, b, c.num_heads, t, s)
    if score_offset is not None and tuple(jnp.shape(score_offset)) != aux_shape:
      raise ValueError(
          f"`score_offset` must have the cross-attention scores' shape {aux_shape} "
          f"[N, B, H, T, S], got {tuple(jnp.shape(score_offset))}.")
    key = None if deterministic else dropout_key(rngs)
    if not deterministic and key is None and (c.dropout > 0 or c.attention_dropout > 0):
      raise ValueError("deterministic=False needs `rngs` (an nnx.Rngs with a 'dropout' stream).")
    k_enc, k_dec = common.split_key(key, 2)
    memory = self._encode(src, deterministic, k_enc)

    keys = common.split_key(k_dec, c.num_layers + 1)
    x = self._embed(tgt_in, self.embed, deterministic=deterministic, key=keys[0])
    # A sentence ends at its first pad (`masks.prefix`), in the dense masks as in
    # the lengths of the self attentions' `MaskStructure`.
    src_valid = masks.prefix(src, c.pad_id)  # [B, S]
    # The self attentions get their masks as structure (`MaskStructure`), so
    # that on GPUs cuDNN applies them inside its fused kernel; the cross
    # attention returns its weights (alignment, diagnostics), so it always
    # takes the plain kernel, where the dense mask is what it needs.
    self_structure = MaskStructure(causal=True, key_lengths=masks.lengths(tgt_in, c.pad_id))
    cross_mask = src_valid[:, None, None, :]  # [B, 1, 1, S]
    all_scores, all_weights = [], []
    for i, (layer, k) in enumerate(zip(self.decoder_layers, keys[1:])):
      x, cross, _ = layer(
          x, layer.cross_attn.project_kv(memory), self_mask=self_structure,
          cross_mask=cross_mask, deterministic=deterministic, key=k,
          score_offset=None if score_offset is None else score_offset[i])
      all_scores.append(cross["scores"])
      all_weights.append(cross["weights"])
    if c.pre_layer_norm:
      x = self.decoder_norm(x)
    aux = {"scores": jnp.stack(all_scores),  # [N, B, H, T, S]
           "weights": jnp.stack(all_weights),  # [N, B, H, T, S]
           "key_valid": src_valid[None, :, None, None, :]}  # [1, B, 1, 1, S]
    return self.logits(x), aux

  def attention_masks(self, src: jax.Array, tgt_in: jax.Array) -> dict[str, tuple]:
    """Which entries of each kind's scores `[B, H, T, S]` (`ATTENTION_KINDS`)
    are real in `self(src, tgt_in)`: `{kind: (key_valid, query_valid)}`,
    bool masks broadcastable to them (padding, for decoder self attention
    also causality; a sentence ends at its first pad, as in the model)."""
    c = self.config
    src_valid = masks.prefix(common.tokens(src, "src"), c.pad_id)  # [B, S]
    tgt_valid = masks.prefix(common.tokens(tgt_in, "tgt_in"), c.pad_id)  # [B, T]
    causal = masks.causal(tgt_valid.shape[1])
    query_valid = tgt_valid[:, None, :, None]  # [B, 1, T, 1]
    return {
        "encoder_self": (src_valid[:, None, None, :], src_valid[:, None, :, None]),
        "decoder_self": (masks.combine(causal, tgt_valid[:, None, None, :]),  # [B, 1, T, T]
                         query_valid),
        "cross": (src_valid[:, None, None, :], query_valid)}

  # -- incremental decoding --------------------------------------------------

  @property
  def max_decode_length(self) -> int:
    """Longest output `attention_jax.decoding` may produce (the positional table)."""
    return self.config.max_length

  def init_decode(self, src: jax.Array, max_len: int):
    """Encodes `src [B, S]` and returns `(memory, carry)` for `decode_step`.

    memory: `{'kv': per layer (keys, values) [B, H, S, d], 'key_valid': [B, S]}`;
    carry: `{'cache': per layer a `layers.KVCache` [B, H, max_len, d]}`. Every
    leaf has the batch as its leading axis (beam search tiles and reorders it).
    """
    src = common.tokens(src, "src")
    self._check_length(max_len, "max_len")
    memory = self.encode(src)
    kv = tuple(layer.cross_attn.project_kv(memory) for layer in self.decoder_layers)
    caches = tuple(layer.self_attn.init_cache(src.shape[0], max_len)
                   for layer in self.decoder_layers)
    return ({"kv": kv, "key_valid": masks.prefix(src, self.config.pad_id)},
            {"cache": caches})

  def init_beams(self, memory, carry, beam_size: int):
    """`(memory, carry)` of `init_decode` made ready for `beam_size` beams
    per sentence (`attention_jax.decoding.beam_search`).

    The memory is not copied per beam: the cross-attention keys and values
    are the same for every beam of a sentence, and `decode_step` lets the K
    beams be K queries over one copy (at d_k = 1024 they are most of the
    memory a beam search holds besides the self-attention caches). The
    caches are repeated per beam and follow their parents (`reorder_beams`).
    """
    return memory, jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), carry)

  def reorder_beams(self, carry, parent: jax.Array):
    """The carry after beam search picks `parent [B, K]` (rows B·K)."""
    k = parent.shape[1]
    rows = (parent + k * jnp.arange(parent.shape[0])[:, None]).reshape(-1)  # [B·K]
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), carry)

  def decode_step(self, memory, carry, tokens: jax.Array, t):
    """One decoding step.

    Args:
      memory / carry: from `init_decode` (or the previous step), or from
        `init_beams` (K beams per sentence, batch B·K).
      tokens: int `[B]` (`[B·K]` with beams), the previous output token
        (`<sos>` at t = 0).
      t: int32 scalar, the position being predicted (may be traced).

    Returns:
      `(logits [B, V] float32, carry, weights [B, S] float32)`; weights are
      the last layer's cross attention averaged over heads.
    """
    x = self._embed(tokens[:, None], self.embed, offset=t)  # [B, 1, D]
    cross_mask = memory["key_valid"][:, None, None, :]  # [B, 1, 1, S]
    caches = []
    for layer, kv, cache in zip(self.decoder_layers, memory["kv"], carry["cache"]):
      x, cross, cache = layer(x, kv, cross_mask=cross_mask, cache=cache, index=t)
      caches.append(cache)
    if self.config.pre_layer_norm:
      x = self.decoder_norm(x)
    weights = jnp.mean(cross["weights"][:, :, 0, :], axis=1)  # [B, S]
    return self.logits(x)[:, 0], {"cache": tuple(caches)}, weights
