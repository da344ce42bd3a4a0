"""Boolean attention masks. Convention: **True = may attend** (as in JAX/Flax).

Shape glossary: B batch, H heads, T / Tq / Tk lengths.
"""

from __future__ import annotations

import jax.numpy as jnp

from attention_jax import _validate

__all__ = ["causal", "padding", "cross", "combine"]


def causal(length: int) -> jnp.ndarray:
  """`[length, length]` bool: query i may attend key j iff j <= i."""
  length = _validate.positive_int(length, "length")
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))  # [T, T]


def padding(tokens, pad_id: int = 0) -> jnp.ndarray:
  """`[..., T]` bool: True at real tokens, False at `pad_id`."""
  tokens = jnp.asarray(tokens)
  _validate.integer(tokens, "tokens")
  _validate.rank_at_least(tokens, "tokens", 1)
  return tokens != pad_id  # [..., T]


def lengths(tokens, pad_id: int = 0) -> jnp.ndarray:
  """`[...]` int32: how many tokens of each row of `tokens [..., T]` come before
  its first `pad_id`, i.e. its length when padded at the end. Models that pass
  lengths (`attention.MaskStructure`) take a row to end there; `prefix(...)`
  is that as a mask, so that their dense masks say the same for any input."""
  return jnp.sum(prefix(tokens, pad_id), axis=-1, dtype=jnp.int32)  # [...]


def prefix(tokens, pad_id: int = 0) -> jnp.ndarray:
  """`[..., T]` bool: True before the first `pad_id` of each row (`padding`
  for rows padded at the end; a pad inside a row also hides what follows it)."""
  return jnp.cumprod(padding(tokens, pad_id), axis=-1).astype(jnp.bool_)  # [..., T]


def cross(query_valid, key_valid) -> jnp.ndarray:
  """Pairwise mask `[..., 1, Tq, Tk]` from validity vectors.

  Args:
    query_valid: bool `[..., Tq]`.
    key_valid: bool `[..., Tk]`; leading axes broadcast with `query_valid`.

  Returns:
    bool `[..., 1, Tq, Tk]`; the singleton axis broadcasts over heads.
  """
  query_valid, key_valid = jnp.asarray(query_valid), jnp.asarray(key_valid)
  for name, x in (("query_valid", query_valid), ("key_valid", key_valid)):
    _validate.boolean(x, name)
    _validate.rank_at_least(x, name, 1)
  _validate.broadcast_shapes({"query_valid (leading axes)": query_valid.shape[:-1],
                              "key_valid (leading axes)": key_valid.shape[:-1]})
  pair = query_valid[..., :, None] & key_valid[..., None, :]  # [..., Tq, Tk]
  return pair[..., None, :, :]  # [..., 1, Tq, Tk]


def combine(*masks):
  """Logical AND of boolean masks with broadcasting; `None` entries are ignored.

  Returns None when every argument is None.
  """
  present = [(i, jnp.asarray(m)) for i, m in enumerate(masks) if m is not None]
  if not present:
    return None
  for i, m in present:
    _validate.boolean(m, f"masks[{i}]")
  _validate.broadcast_shapes({f"masks[{i}]": m.shape for i, m in present})
  out = present[0][1]
  for _, m in present[1:]:
    out = jnp.logical_and(out, m)
  return out
