"""Greedy and beam-search decoding for `Seq2Seq` and `Transformer`.

Both are plain functions of the model built on `lax.while_loop`, so they run
inside any `jax.jit` / `jax.vmap` (e.g. over an ensemble of `nnx.merge`d
models); `jit_greedy` / `jit_beam_search` are `nnx.jit` conveniences. Each
compiles once per (batch, source length) shape.

The model protocol they use (implemented by both families):

  memory, carry = model.init_decode(src, max_len)
  logits, carry, weights = model.decode_step(memory, carry, tokens, t)
  # logits [B, V] float32, weights [B, S] (cross attention) or None;
  # every leaf of memory / carry is batch-leading.
  model.config.{pad_id, eos_id, sos_id}; model.max_decode_length (None = no cap)

and, optionally, for beam search (without them every leaf of memory and
carry is repeated per beam, and the carry's rows are gathered from the
chosen parents every step):

  memory, carry = model.init_beams(memory, carry, beam_size)  # rows B·K where needed
  carry = model.reorder_beams(carry, parent)                  # parent int [B, K]

The Transformer implements both, to keep one copy of the encoder memory per
sentence (`Transformer.init_beams`).

Output convention: int32 ids `[B, L]` where L = the static length limit;
`<pad>` and `<sos>` are never produced (their logits are masked, and beam
scores are log-probabilities renormalised over the other tokens);
a hypothesis stops at `<eos>`, and **`<eos>` itself is not written**: it and
every position after it hold pad (0). The per-sentence limit is
`min(floor(max_len_a * src_len + max_len_b), L)` tokens *including* the
`<eos>`, with src_len the number of non-pad source tokens and
`L = min(ceil(max_len_a * S + max_len_b), max_len, model cap)`. A hypothesis
that reaches its limit without `<eos>` is returned as it is (truncated).
With `return_attention=True` the cross-attention weights `[B, L, S]` of the
returned tokens come too (zero rows where the tokens are pad; the Transformer
averages the heads of its last layer).

Beam search follows the fairseq rule, which makes beam width 1 *exactly*
greedy: of the 2K best candidates, those ending in `<eos>` *among the top K*
become finished hypotheses, the best K others stay alive; a sentence is done
when it has K finished hypotheses or reaches its length limit (alive
hypotheses are then finished as they are). Finished hypotheses are ranked by
`log P(Y|X) / lp(Y)`, GNMT length penalty `lp(Y) = ((5 + |Y|) / 6)^α`, |Y|
counting the `<eos>`.

Shape glossary: B batch, K beam width, S source length, L output length,
V vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import masks
from attention_jax.models import common

__all__ = ["greedy", "beam_search", "jit_greedy", "jit_beam_search", "output_length"]

_NEG = -1.0e9  # score of an empty / impossible hypothesis (finite: no inf - inf)


def output_length(model, src_len: int, *, max_len=None, max_len_a=1.5,
                  max_len_b=10) -> int:
  """Static output length L for a source of padded length `src_len`."""
  if max_len_a < 0 or max_len_b < 0 or (max_len_a == 0 and max_len_b == 0):
    raise ValueError(
        f"`max_len_a` and `max_len_b` must be >= 0 and not both 0, got "
        f"{max_len_a}, {max_len_b}.")
  length = int(math.ceil(max_len_a * src_len + max_len_b))
  for cap in (max_len, getattr(model, "max_decode_length", None)):
    if cap is not None:
      length = min(length, int(cap))
  if length <= 0:
    raise ValueError(f"the output length limit must be > 0, got {length} (`max_len`={max_len}).")
  return length


def _limits(src, pad_id, a, b, length):
  """Per-sentence token limit `[B]` int32 (including the `<eos>`)."""
  src_len = jnp.sum(masks.padding(src, pad_id), axis=-1).astype(jnp.float32)  # [B]
  limit = jnp.floor(a * src_len + b).astype(jnp.int32)
  return jnp.clip(limit, 1, length)


def _allowed_logits(logits, cfg):
  """`<pad>` and `<sos>` can never be outputs: their logits are masked out."""
  banned = (jnp.arange(logits.shape[-1]) == cfg.pad_id) | (jnp.arange(logits.shape[-1]) == cfg.sos_id)
  return jnp.where(banned, -jnp.inf, logits.astype(jnp.float32))  # [..., V]


def _check_attention(model, return_attention):
  if return_attention and not getattr(model.config, "has_attention", True):
    raise ValueError("return_attention=True needs a model with attention; this "
                     "decoder has none.")


def greedy(model, src: jax.Array, *, max_len: int | None = None,
           max_len_a: float = 1.5, max_len_b: float = 10,
           return_attention: bool = False):
  """Greedy decoding (argmax at every step).

  Args:
    model: a `Seq2Seq` or `Transformer` (see the module docstring's protocol).
    src: int `[B, S]`, padding = model.config.pad_id.
    max_len: optional static cap on the output length.
    max_len_a / max_len_b: per-sentence limit `a * src_len + b`.
    return_attention: also return the cross-attention weights.

  Returns:
    int32 ids `[B, L]`, or `(ids, weights [B, L, S] float32)`.
  """
  src = common.tokens(src, "src")
  cfg = model.config
  batch, src_len = src.shape
  length = output_length(model, src_len, max_len=max_len, max_len_a=max_len_a,
                         max_len_b=max_len_b)
  limit = _limits(src, cfg.pad_id, max_len_a, max_len_b, length)  # [B]
  memory, carry = model.init_decode(src, length)
  _check_attention(model, return_attention)

  def cond(state):
    t, done = state[0], state[3]
    return (t < length) & ~jnp.all(done)

  def body(state):
    t, carry, prev, done, out, attn = state
    logits, carry, weights = model.decode_step(memory, carry, prev, t)
    token = jnp.argmax(_allowed_logits(logits, cfg), axis=-1).astype(jnp.int32)  # [B]
    write = ~done & (token != cfg.eos_id)  # eos and finished rows -> pad
    out = out.at[:, t].set(jnp.where(write, token, cfg.pad_id))
    if return_attention:
      attn = attn.at[:, t].set(jnp.where(write[:, None], weights, 0.0))
    done = done | (token == cfg.eos_id) | (t + 1 >= limit)
    return t + 1, carry, token, done, out, attn

  out = jnp.full((batch, length), cfg.pad_id, jnp.int32)
  attn = jnp.zeros((batch, length, src_len) if return_attention else (), jnp.float32)
  init = (jnp.zeros((), jnp.int32), carry, jnp.full((batch,), cfg.sos_id, jnp.int32),
          jnp.zeros((batch,), bool), out, attn)
  _, _, _, _, out, attn = jax.lax.while_loop(cond, body, init)
  return (out, attn) if return_attention else out


def _top_k(x, k):
  """Exact `lax.top_k` over the last axis, in two small stages.

  XLA:CPU lowers `top_k` inside a loop body to a full sort of the row (about
  100 ms per beam step at B = 64, K·V = 8000). The k largest entries all lie
  in the k blocks with the largest block maxima, so: split the row into
  blocks of ~sqrt(n / k), keep the k best blocks, and take the top k of
  those; both sorts are small. Returns `(values, indices)` like `top_k`.
  """
  n = x.shape[-1]
  block = int(math.sqrt(n / k))
  if block < 2 or n <= 4 * k:
    return jax.lax.top_k(x, k)
  m = -(-n // block)
  padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, m * block - n)],
                   constant_values=-jnp.inf)
  blocks = padded.reshape(x.shape[:-1] + (m, block))  # [..., m, block]
  kb = min(k, m)
  _, best_blocks = jax.lax.top_k(jnp.max(blocks, axis=-1), kb)  # [..., kb]
  # In index order, so that ties resolve to the lower index as in `top_k`
  # (beam width 1 must pick exactly greedy's argmax).
  best_blocks = jnp.sort(best_blocks, axis=-1)
  cand = jnp.take_along_axis(blocks, best_blocks[..., None], axis=-2)  # [..., kb, block]
  values, j = jax.lax.top_k(cand.reshape(x.shape[:-1] + (kb * block,)), k)
  index = jnp.take_along_axis(best_blocks, j // block, axis=-1) * block + j % block
  return values, index


def _length_penalty(length, alpha):
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _tile(tree, k):  # leaves [B, ...] -> [B·K, ...], each sentence repeated K times
  return jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), tree)


def _gather(x, index):
  """x `[B, K, ...]`, index `[B, K']` -> `[B, K', ...]` (beams `index` of each sentence)."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _gather_flat(tree, index, k):
  """leaves `[B·K, ...]` (model memory / carry), index `[B, K]` -> `[B·K, ...]`."""
  def gather(x):
    y = _gather(x.reshape((-1, k) + x.shape[1:]), index)
    return y.reshape((-1,) + x.shape[1:])
  return jax.tree.map(gather, tree)


def beam_search(model, src: jax.Array, *, beam_size: int = 4,
                length_penalty: float = 0.6, max_len: int | None = None,
                max_len_a: float = 1.5, max_len_b: float = 10,
                return_attention: bool = False):
  """Batched beam search with the GNMT length penalty.

  Args:
    model: a `Seq2Seq` or `Transformer`.
    src: int `[B, S]`.
    beam_size: K.
    length_penalty: α of `((5 + |Y|) / 6)^α` (0 = plain log-probability).
    max_len / max_len_a / max_len_b: length limits as in `greedy`.
    return_attention: also return the chosen hypotheses' cross attention.

  Returns:
    int32 ids `[B, L]` of the best finished hypothesis, or
    `(ids, weights [B, L, S] float32)`.
  """
  src = common.tokens(src, "src")
  if not isinstance(beam_size, int) or beam_size <= 0:
    raise ValueError(f"`beam_size` must be a positive int, got {beam_size!r}.")
  if length_penalty < 0:
    raise ValueError(f"`length_penalty` (GNMT alpha) must be >= 0, got {length_penalty}.")
  cfg = model.config
  k = beam_size
  batch, src_len = src.shape
  length = output_length(model, src_len, max_len=max_len, max_len_a=max_len_a,
                         max_len_b=max_len_b)
  limit = _limits(src, cfg.pad_id, max_len_a, max_len_b, length)  # [B]
  memory, carry = model.init_decode(src, length)
  if hasattr(model, "init_beams"):
    memory, carry = model.init_beams(memory, carry, k)
    reorder = model.reorder_beams
  else:
    memory, carry = _tile(memory, k), _tile(carry, k)
    reorder = lambda carry, parent: _gather_flat(carry, parent, k)
  vocab = cfg.vocab_size
  _check_attention(model, return_attention)
  att_shape = (batch, k, length, src_len) if return_attention else (batch, k, 0, 0)

  def cond(state):
    return (state["t"] < length) & ~jnp.all(state["done"])

  def body(state):
    t = state["t"]
    logits, carry, weights = model.decode_step(
        memory, state["carry"], state["tokens"].reshape(-1), t)
    logp = jax.nn.log_softmax(_allowed_logits(logits, cfg)).reshape(batch, k, vocab)
    logp = jnp.maximum(logp, _NEG)  # banned tokens: -inf -> a finite "impossible"
    cand = (state["alive_logp"][:, :, None] + logp).reshape(batch, k * vocab)
    top_logp, top_idx = _top_k(cand, 2 * k)  # [B, 2K]
    top_beam, top_token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
    top_eos = top_token == cfg.eos_id
    step_len = jnp.full((batch, 1), t + 1)
    active = ~state["done"][:, None]  # [B, 1]
    possible = top_logp > _NEG / 2

    alive_seq = state["alive_seq"]
    alive_att = state["alive_att"]
    if return_attention:  # this step's attention row, for every parent beam
      w = weights.reshape(batch, k, src_len)

    # 1) <eos> candidates among the top K: new finished hypotheses.
    new_fin = top_eos[:, :k] & active & possible[:, :k]
    new_fin_score = jnp.where(new_fin, top_logp[:, :k] / _length_penalty(step_len, length_penalty), _NEG)
    new_fin_seq = _gather(alive_seq, top_beam[:, :k])  # eos not written
    new_fin_att = _gather(alive_att, top_beam[:, :k])

    # 2) the best K non-<eos> candidates stay alive.
    alive_rank = jnp.where(top_eos, _NEG * 2, top_logp)
    _, pick = jax.lax.top_k(alive_rank, k)  # [B, K] positions in the 2K list
    alive_logp = jnp.take_along_axis(top_logp, pick, axis=1)
    alive_logp = jnp.where(jnp.take_along_axis(top_eos, pick, axis=1), _NEG, alive_logp)
    parent = jnp.take_along_axis(top_beam, pick, axis=1)  # [B, K]
    token = jnp.take_along_axis(top_token, pick, axis=1)  # [B, K]
    alive_seq = _gather(alive_seq, parent).at[:, :, t].set(token)
    if return_attention:
      alive_att = _gather(alive_att, parent)
      alive_att = alive_att.at[:, :, t].set(_gather(w, parent))
    carry = reorder(carry, parent)

    # 3) at the length limit the alive hypotheses finish as they are.
    at_limit = (t + 1 >= limit)[:, None] & active  # [B, 1]
    forced_score = jnp.where(at_limit & (alive_logp > _NEG / 2),
                             alive_logp / _length_penalty(step_len, length_penalty), _NEG)

    # Keep the best K of (old finished, new <eos> finished, forced).
    pool_score = jnp.concatenate([state["fin_score"], new_fin_score, forced_score], axis=1)
    pool_seq = jnp.concatenate([state["fin_seq"], new_fin_seq, alive_seq], axis=1)
    pool_att = jnp.concatenate([state["fin_att"], new_fin_att, alive_att], axis=1)
    fin_score, best = jax.lax.top_k(pool_score, k)  # [B, K]
    fin_seq = _gather(pool_seq, best)
    fin_att = _gather(pool_att, best)

    num_finished = jnp.sum(fin_score > _NEG / 2, axis=1)  # [B]
    done = state["done"] | (num_finished >= k) | at_limit[:, 0]
    return {"t": t + 1, "carry": carry, "tokens": token, "done": done,
            "alive_logp": alive_logp, "alive_seq": alive_seq, "alive_att": alive_att,
            "fin_score": fin_score, "fin_seq": fin_seq, "fin_att": fin_att}

  seq0 = jnp.full((batch, k, length), cfg.pad_id, jnp.int32)
  # Only beam 0 starts alive, so the K initial beams do not duplicate.
  logp0 = jnp.tile(jnp.array([0.0] + [_NEG] * (k - 1), jnp.float32), (batch, 1))
  init = {"t": jnp.zeros((), jnp.int32), "carry": carry,
          "tokens": jnp.full((batch, k), cfg.sos_id, jnp.int32),
          "done": jnp.zeros((batch,), bool), "alive_logp": logp0,
          "alive_seq": seq0, "alive_att": jnp.zeros(att_shape, jnp.float32),
          "fin_score": jnp.full((batch, k), _NEG, jnp.float32), "fin_seq": seq0,
          "fin_att": jnp.zeros(att_shape, jnp.float32)}
  final = jax.lax.while_loop(cond, body, init)
  best = jnp.argmax(final["fin_score"], axis=1)[:, None]  # [B, 1]
  out = _gather(final["fin_seq"], best)[:, 0]  # [B, L]
  if return_attention:
    return out, _gather(final["fin_att"], best)[:, 0]  # [B, L, S]
  return out


jit_greedy = nnx.jit(greedy, static_argnames=("max_len", "max_len_a", "max_len_b",
                                              "return_attention"))
jit_greedy.__doc__ = "`greedy` under `nnx.jit` (the model is an ordinary argument)."
jit_beam_search = nnx.jit(beam_search, static_argnames=(
    "beam_size", "length_penalty", "max_len", "max_len_a", "max_len_b", "return_attention"))
jit_beam_search.__doc__ = "`beam_search` under `nnx.jit` (the model is an ordinary argument)."
