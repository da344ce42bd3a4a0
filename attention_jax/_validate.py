"""Trace-time argument checks shared by the pure functions.

Every check runs on static shapes and dtypes, so a bad call fails with a
`ValueError` / `TypeError` naming the argument before XLA sees it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def rank_at_least(x, name: str, rank: int) -> None:
  if jnp.ndim(x) < rank:
    raise ValueError(
        f"`{name}` must have rank >= {rank}, got shape {tuple(jnp.shape(x))}.")


def same_size(a: int, b: int, name_a: str, name_b: str, shape_a, shape_b) -> None:
  if a != b:
    raise ValueError(
        f"`{name_a}` and `{name_b}` disagree on a size: {a} vs {b} "
        f"(shapes {tuple(shape_a)} and {tuple(shape_b)}).")


def broadcast_shapes(named_shapes: dict[str, tuple]) -> tuple:
  """Broadcasts shapes, raising a ValueError that names every argument."""
  try:
    return tuple(np.broadcast_shapes(*named_shapes.values()))
  except ValueError:
    seen = ", ".join(f"`{k}` {tuple(v)}" for k, v in named_shapes.items())
    raise ValueError(f"shapes do not broadcast: {seen}.") from None


def boolean(x, name: str) -> None:
  if jnp.result_type(x) != jnp.bool_:
    raise TypeError(
        f"`{name}` must be a boolean array (True = may attend), got dtype "
        f"{jnp.result_type(x)} with shape {tuple(jnp.shape(x))}.")


def mask_within(mask, scores_shape) -> jnp.ndarray | None:
  """`mask` as an array, checked: boolean, and broadcasting to `scores_shape`
  without enlarging it (None stays None)."""
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  boolean(mask, "mask")
  joint = broadcast_shapes({"mask": mask.shape, "scores": tuple(scores_shape)})
  if joint != tuple(scores_shape):
    raise ValueError(f"`mask` {tuple(mask.shape)} must broadcast to the scores shape "
                     f"{tuple(scores_shape)} without enlarging it.")
  return mask


def integer(x, name: str) -> None:
  if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
    raise TypeError(
        f"`{name}` must be an integer array, got dtype {jnp.result_type(x)}.")


def as_float(x, name: str):
  """`x` as an array; integer and bool arrays are promoted to float32.

  Attention is real-valued: integer inputs would truncate the `1/√d` scale and
  the softmax weights to 0, so every public function computes on
  float32 copies of integer arguments instead. Float dtypes are kept.
  """
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    raise TypeError(f"`{name}` must be real, got dtype {x.dtype}.")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  return x


def nonempty_axis(x, name: str, axis: int, what: str) -> None:
  if jnp.shape(x)[axis] == 0:
    raise ValueError(f"`{name}` has an empty {what} axis: shape {tuple(jnp.shape(x))}.")


def positive_int(x, name: str) -> int:
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"`{name}` must be a Python int, got {x!r} ({type(x).__name__}).")
  if x <= 0:
    raise ValueError(f"`{name}` must be > 0, got {x}.")
  return int(x)
