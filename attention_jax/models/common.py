"""Config validation, input checks and dropout keys shared by the model families
(and by `decoding`, which checks the tokens it is given the same way)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_DTYPES = ("float32", "bfloat16", "float16")


def choice(value, field: str, allowed: tuple) -> None:
  if value not in allowed:
    raise ValueError(f"`{field}` must be one of {allowed}, got {value!r}.")


def positive(value, field: str) -> None:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
      or value <= 0:
    raise ValueError(f"`{field}` must be a positive int, got {value!r}.")


def rate(value, field: str) -> None:
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    raise ValueError(f"`{field}` must be a float in [0, 1), got {value!r}.")


def dtype(value, field: str) -> None:
  try:
    name = jnp.dtype(value).name
  except TypeError:
    name = None
  if name not in _DTYPES:
    raise ValueError(f"`{field}` must be one of {_DTYPES}, got {value!r}.")


def special_tokens(config: Any) -> None:
  ids = {"pad_id": config.pad_id, "eos_id": config.eos_id, "sos_id": config.sos_id}
  for name, value in ids.items():
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
        or not 0 <= value < config.vocab_size:
      raise ValueError(
          f"`{name}` must be an int in [0, vocab_size={config.vocab_size}), got {value!r}.")
  if len(set(ids.values())) != 3:
    raise ValueError(f"`pad_id`, `eos_id` and `sos_id` must differ, got {ids}.")


def split_key(key, n: int) -> list:
  """`n` dropout keys from `key`, or `n` Nones when `key` is None (no dropout)."""
  return [None] * n if key is None else list(jax.random.split(key, n))


def tokens(x, name: str) -> jax.Array:
  """An int32 `[B, T]` token array, or a ValueError / TypeError naming `name`."""
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"`{name}` must be int tokens [B, T], got shape {tuple(x.shape)}.")
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"`{name}` must be an integer array, got dtype {x.dtype}.")
  return x.astype(jnp.int32)


def same_batch(src, tgt) -> None:
  if src.shape[0] != tgt.shape[0]:
    raise ValueError(
        f"`src` {tuple(src.shape)} and `tgt_in` {tuple(tgt.shape)} must share the batch size.")


def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
  """The largest entry of `x` where `mask` (broadcastable) is True, float32;
  -inf where none is. For the max-attention-logit diagnostic."""
  return jnp.max(jnp.where(mask, x.astype(jnp.float32), -jnp.inf))
