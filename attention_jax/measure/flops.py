"""FLOPs of a JAX function counted from its jaxpr, loops multiplied by their trip counts.

XLA's `compiled.cost_analysis()["flops"]` counts the body of a while loop
once, whatever its trip count, so for the RNN (whose encoder and decoder are
`lax.scan`s over the sentence) it reports about half of the work a step does.
`count(fn, *args)` walks the traced program instead:

- `dot_general`: 2 · (output elements) · (contracted elements), the usual
  multiply-add count of a matrix product (`matmul`);
- an elementwise or reduction primitive: one FLOP per output element, or per
  input element for reductions (`other`; a rough figure, reported apart);
- `scan`: its body times `length`; `cond`: its most expensive branch; a
  `while` loop (no static trip count): its body once, and `while_loops`
  says how many were met, so the caller knows the count is a lower bound;
- any other primitive holding a jaxpr (`jit`, `custom_jvp_call`,
  `custom_vjp_call`, `checkpoint`, ...): that jaxpr, once.

A function differentiated with `jax.grad` is counted as traced, so the
backward pass and the recomputation of `jax.checkpoint`-ed parts are in it.
So is work whose result nothing uses: the traced program is not pruned, while
XLA drops it. The Transformer's attention with dropout on its weights is
such a case (its undropped weighted sum is computed and replaced), so its
count is one forward weighted sum above what runs; the presets train without
that dropout, and there the count equals the hand count of what runs
(tests/cpu_efficiency/test_cpu_efficiency.py).
Counting `fn` with `loops=False` counts every loop body once, the way XLA's
`cost_analysis` does, which makes the two comparable.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
from jax.extend import core as jex_core

__all__ = ["Flops", "count", "count_jaxpr"]

# Primitives that move or reinterpret data and compute nothing.
_FREE = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "concatenate", "pad",
    "convert_element_type", "bitcast_convert_type", "iota", "copy", "copy_p", "select_n",
    "rev", "stop_gradient", "device_put", "sharding_constraint", "split",
    "random_bits", "random_seed", "random_wrap", "random_unwrap", "threefry2x32",
    "pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "scan", "while", "cond",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "argmax", "argmin", "sort",
})
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                         "cumsum", "cummax", "cumlogsumexp", "cumprod", "cummin"})


@dataclasses.dataclass(frozen=True)
class Flops:
  """Counted floating-point operations of one call."""
  matmul: float  # dot_general multiply-adds, 2 per pair
  other: float  # elementwise and reductions, 1 per element
  while_loops: int  # while loops met (counted once each: the total is a lower bound)

  @property
  def total(self) -> float:
    return self.matmul + self.other

  def __add__(self, other: "Flops") -> "Flops":
    return Flops(self.matmul + other.matmul, self.other + other.other,
                 self.while_loops + other.while_loops)

  def scaled(self, factor: float) -> "Flops":
    return Flops(self.matmul * factor, self.other * factor, self.while_loops)


_ZERO = Flops(0.0, 0.0, 0)


def _size(aval) -> int:
  return math.prod(getattr(aval, "shape", ()))


def _dot_flops(eqn) -> float:
  lhs = eqn.invars[0].aval
  (lhs_contract, _), _ = eqn.params["dimension_numbers"]
  contracted = math.prod(lhs.shape[d] for d in lhs_contract)
  return 2.0 * _size(eqn.outvars[0].aval) * contracted


def _sub_jaxprs(params: dict[str, Any]):
  """The jaxprs held in an equation's parameters (closed or open, in tuples too)."""
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jex_core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jex_core.Jaxpr):
        yield item


def count_jaxpr(jaxpr, *, loops: bool = True) -> Flops:
  """FLOPs of an open `Jaxpr` (see the module docstring); `loops=False`
  counts every scan body once."""
  total = _ZERO
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += Flops(_dot_flops(eqn), 0.0, 0)
    elif name == "scan":
      body = count_jaxpr(eqn.params["jaxpr"].jaxpr, loops=loops)
      total += body.scaled(eqn.params["length"] if loops else 1)
    elif name == "cond":
      branches = [count_jaxpr(b.jaxpr, loops=loops) for b in eqn.params["branches"]]
      total += max(branches, key=lambda f: f.total)
    elif name == "while":
      for sub in _sub_jaxprs(eqn.params):
        total += count_jaxpr(sub, loops=loops)
      total += Flops(0.0, 0.0, 1)
    else:
      subs = list(_sub_jaxprs(eqn.params))
      if subs:
        for sub in subs:
          total += count_jaxpr(sub, loops=loops)
      elif name in _REDUCTIONS:
        total += Flops(0.0, float(sum(_size(v.aval) for v in eqn.invars)), 0)
      elif name not in _FREE:
        total += Flops(0.0, float(sum(_size(v.aval) for v in eqn.outvars)), 0)
  return total


def count(fn: Callable, *args, loops: bool = True, **kwargs) -> Flops:
  """FLOPs of one call `fn(*args, **kwargs)`, traced (nothing is computed)."""
  closed = jax.make_jaxpr(fn)(*args, **kwargs)
  return count_jaxpr(closed.jaxpr, loops=loops)
