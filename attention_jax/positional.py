"""Positional encodings (docs/formulas.md §4).

`sinusoidal` is the fixed table of Vaswani et al.; `learned` looks positions up
in a trainable table that the caller owns (Flax modules hold it as a Param).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import _validate

__all__ = ["sinusoidal", "learned"]


def sinusoidal(length: int, dim: int, max_timescale: float = 10000.0) -> jax.Array:
  """Interleaved sinusoidal table `[length, dim]`, float32.

  `PE[pos, 2i] = sin(pos / 10000^(2i/dim))`, `PE[pos, 2i+1] = cos(same angle)`.
  An odd `dim` ends with a sine column. Built in NumPy from static ints, so it
  is a compile-time constant under `jit`.
  """
  length = _validate.positive_int(length, "length")
  dim = _validate.positive_int(dim, "dim")
  if not (isinstance(max_timescale, (int, float, np.integer, np.floating))
          and np.isfinite(max_timescale) and max_timescale > 0):
    raise ValueError(f"`max_timescale` must be a finite number > 0, got {max_timescale!r}.")
  pos = np.arange(length, dtype=np.float64)[:, None]  # [T, 1]
  pair = np.arange(dim) // 2  # [D] frequency index i of each feature
  angle = pos / np.power(max_timescale, 2.0 * pair / dim)  # [T, D]
  table = np.where(np.arange(dim) % 2 == 0, np.sin(angle), np.cos(angle))
  return jnp.asarray(table, dtype=jnp.float32)  # [T, D]


def learned(table: jax.Array, length: int, offset=0) -> jax.Array:
  """Rows `offset .. offset+length-1` of a learned table `[max_len, dim]`.

  `offset` may be traced (decoding step); `length` is static.
  """
  table = jnp.asarray(table)
  length = _validate.positive_int(length, "length")
  if table.ndim != 2:
    raise ValueError(f"`table` must be [max_len, dim], got shape {tuple(table.shape)}.")
  if length > table.shape[0]:
    raise ValueError(
        f"`length` {length} exceeds the table's max_len {table.shape[0]}.")
  # A concrete offset is checked; `dynamic_slice` would silently clamp it.
  if isinstance(offset, (int, np.integer)) and not 0 <= offset <= table.shape[0] - length:
    raise ValueError(
        f"`offset` {offset} with `length` {length} reads past the table's rows "
        f"0..{table.shape[0] - 1}.")
  return jax.lax.dynamic_slice_in_dim(table, offset, length, axis=0)  # [T, D]
