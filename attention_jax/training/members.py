"""How the members (seeds) of an ensemble share one compiled program.

The trainer stacks the members' parameters and optimiser states on a leading
axis E and runs every program over it. `over_members(fn, in_axes)` is that
program: `jax.vmap(fn, in_axes)` on accelerators, where one batched program
fills a device that one member does not; on CPU, the members one after
another inside the same program (`in_turn`). The function is the same; on CPU
vmap makes every matrix product a batched one, which XLA:CPU runs slower than
the members' own products in turn: the quick model's training step for two
seeds took 524 ms vmapped and 393 ms in turn (multiplicative a = 128; 992 and
762 ms for additive a = 1024), one core of the 2-core Xeon, jax 0.10.2
(results/cpu_efficiency).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp


def in_turn_default() -> bool:
  """Whether programs run the members in turn here: on CPU, yes."""
  return jax.default_backend() == "cpu"


def over_members(fn: Callable, in_axes: Sequence[int | None], *,
                 in_turn: bool | None = None) -> Callable:
  """`fn` applied to every member: arguments with `in_axes` 0 are stacked
  over the members (their leading axis), those with None are shared; every
  output is stacked over the members, as `jax.vmap(fn, in_axes)` returns it.

  `in_turn` None: `in_turn_default()`. In turn, the members are a Python loop
  traced into the one program, so its size (and compile time) grows with E.
  """
  in_axes = tuple(in_axes)
  if any(axis not in (0, None) for axis in in_axes):
    raise ValueError(f"`in_axes` must hold 0 or None, got {in_axes}.")
  if not any(axis == 0 for axis in in_axes):
    raise ValueError("`in_axes` must stack at least one argument over the members.")
  if not (in_turn_default() if in_turn is None else in_turn):
    return jax.vmap(fn, in_axes=in_axes)

  def in_turn_fn(*args):
    if len(args) != len(in_axes):
      raise TypeError(f"expected {len(in_axes)} arguments (in_axes), got {len(args)}.")
    stacked = [a for a, axis in zip(args, in_axes) if axis == 0]
    members = jax.tree.leaves(stacked)[0].shape[0]
    outputs = [fn(*(jax.tree.map(lambda x, i=i: x[i], a) if axis == 0 else a
                    for a, axis in zip(args, in_axes)))
               for i in range(members)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)

  return in_turn_fn
