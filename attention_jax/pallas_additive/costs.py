"""What the Pallas additive kernels cost, counted apart: FLOPs, special-function
results (tanh, exp) and bytes per kernel (`cost_estimates`, which the kernels
hand to `pl.CostEstimate`), a GPU's time floor from them (`roofline`), and the
tanh values a traced program's kernels compute (`tanh_evaluations`). Pure.
"""

from __future__ import annotations

import dataclasses
import math

from attention_jax.pallas_additive.tiling import BACKWARDS, default_blocks

@dataclasses.dataclass(frozen=True)
class GpuRates:
  """Per-second peaks of one GPU for `roofline`: `fp32_flops` (FP32 FMA
  pipes, an FMA counted as 2; the kernels' float32 dots run there too: they
  ask for full precision, which Triton lowers to IEEE FMAs, not tensor
  cores), `sfu_ops` (special-function results: tanh, exp, reciprocal) and
  HBM `bandwidth` in bytes."""
  name: str
  fp32_flops: float
  sfu_ops: float
  bandwidth: float


# H100 SXM5 and H200 SXM: the same GH100 chip, 132 SMs, boost clock 1.98 GHz.
# FP32: 67 TFLOP/s (NVIDIA's H100 and H200 data sheets; 132 · 128 lanes · 2 ·
# 1.98 GHz). SFU: 16 results per clock per SM (CUDA C++ Programming Guide,
# throughput of native arithmetic instructions, compute capability 9.0: 32-bit
# reciprocal, reciprocal square root, base-2 exponential and logarithm, sine,
# cosine; tanh.approx is not in that table and is assumed to share the rate),
# 16 · 132 · 1.98e9 = 4.18e12 per second. FlashAttention-3 (Shah et al.
# 2024, section 3) gives 3.9 TFLOPS of special functions for the H100 SXM5,
# the same count at 1.83 GHz, the clock NVIDIA's 989 TFLOP/s dense bf16
# figure implies; the higher clock is taken so that the floor stays a lower
# bound. HBM: 3.35 TB/s (H100 SXM5), 4.8 TB/s (H200; data sheets).
_SFU_PER_CLOCK_PER_SM, _SMS, _BOOST_HZ = 16, 132, 1.98e9
H100_SXM = GpuRates("H100 SXM", fp32_flops=67e12,
                    sfu_ops=_SFU_PER_CLOCK_PER_SM * _SMS * _BOOST_HZ, bandwidth=3.35e12)
H200_SXM = GpuRates("H200 SXM", fp32_flops=67e12,
                    sfu_ops=_SFU_PER_CLOCK_PER_SM * _SMS * _BOOST_HZ, bandwidth=4.8e12)


def cost_estimates(n: int, tq: int, tk: int, a: int, dv: int, itemsize: int = 4,
                   mask_bytes: int = 0, backward: str = "split") -> dict[str, dict[str, int]]:
  """`{kernel: {flops, transcendentals, bytes_accessed}}` of the kernels at
  these (padded) sizes, for `pl.CostEstimate`: `forward`, then `dq` and `dkv`
  (`backward="split"`) or `backward` (`"fused"`).

  Per (query, key, feature): the forward adds, takes tanh, multiplies by v
  and sums (3 FLOPs, 1 tanh); each backward kernel recomputes that and then
  forms `ds · (1 - h²)` and sums it (4 more), `dkv` also `ds · h` summed
  (2 more); the fused one recomputes the score (3), adds again before its
  second tanh, forms `ds · (1 - h²)` (4) and sums it both ways (2), and
  `ds · h` summed (2): 11. Per (query, key): the softmax (~5) and one exp,
  and `2·dv` per matmul with the values (one in the forward and `dq`, two in
  `dkv` and the fused kernel). Bytes: every operand and result once (the
  kernels keep one head's keys or queries in fast memory while they loop over
  them; the fused kernel's atomic additions are counted as one write of the
  queries' gradient, though they go to L2 once per key block).
  """
  if backward not in BACKWARDS:
    raise ValueError(f"`backward` must be one of {BACKWARDS}, got {backward!r}.")
  pairs = n * tq * tk
  proj = n * (tq + tk) * a * itemsize
  vals = n * tk * dv * itemsize
  rows_out = n * tq * dv * itemsize
  stats = n * tq * 4
  costs = {"forward": dict(flops=pairs * (3 * a + 2 * dv + 5), transcendentals=pairs * (a + 1),
                           bytes_accessed=proj + vals + rows_out + stats + mask_bytes)}
  dkv_bytes = (proj + vals + rows_out + 2 * stats + n * tk * (a + dv) * 4 + mask_bytes)
  if backward == "fused":
    costs["backward"] = dict(flops=pairs * (11 * a + 4 * dv + 5),
                             transcendentals=pairs * (2 * a + 1),
                             bytes_accessed=dkv_bytes + n * tq * a * 4)
    return costs
  costs["dq"] = dict(flops=pairs * (7 * a + 2 * dv + 5), transcendentals=pairs * (2 * a + 1),
                     bytes_accessed=proj + vals + rows_out + 2 * stats + n * tq * a * 4
                     + mask_bytes)
  costs["dkv"] = dict(flops=pairs * (9 * a + 4 * dv + 5), transcendentals=pairs * (2 * a + 1),
                      bytes_accessed=dkv_bytes)
  return costs


def roofline(n: int, tq: int, tk: int, a: int, dv: int, *, backward: str = "fused",
             passes: str = "fwd_bwd", rates: GpuRates = H200_SXM, itemsize: int = 4,
             sfu_per_tanh: int = 1, rows: int | None = None) -> dict:
  """The kernels' time floor on a GPU at these (padded) sizes, counting the
  special-function work apart from the FLOPs and bytes:
  `max(flops / rates.fp32_flops, sfu_ops / rates.sfu_ops, bytes / rates.bandwidth)`.

  `passes`: "fwd" (the forward kernel) or "fwd_bwd" (forward and backward).
  `backward`: "fused" (3 tanh evaluations per (query, key, feature) over
  forward and backward) or "split" (5). `sfu_per_tanh`: special-function
  results one tanh takes; 1 for tanh.approx.f32 (MUFU.TANH); libdevice's
  accurate tanhf may take more (an exp2 and a reciprocal: 2) besides FMAs on
  the FP32 pipe, which is not verified here, so 1 keeps the floor a lower
  bound. Exps (one per (query, key) and kernel) are special functions too.
  FLOPs and bytes are `cost_estimates`'. Atomic additions (fused: one per
  query, feature and block of `rows` keys, default the GPU's) are counted
  (`atomic_adds`) but not timed: no published rate for them is used.

  Returns `{tanh, sfu_ops, flops, bytes, flops_s, sfu_s, bytes_s, floor_s,
  bound, atomic_adds}` (`bound`: which term is the floor).
  """
  if passes not in ("fwd", "fwd_bwd"):
    raise ValueError(f"`passes` must be 'fwd' or 'fwd_bwd', got {passes!r}.")
  costs = cost_estimates(n, tq, tk, a, dv, itemsize, backward=backward)
  kernels = ["forward"] if passes == "fwd" else list(costs)
  pairs = n * tq * tk
  tanh_per_element = {"forward": 1, "backward": 2, "dq": 2, "dkv": 2}
  tanh = sum(tanh_per_element[k] for k in kernels) * pairs * a
  exps = sum(costs[k]["transcendentals"] for k in kernels) - tanh
  flops = sum(costs[k]["flops"] for k in kernels)
  nbytes = sum(costs[k]["bytes_accessed"] for k in kernels)
  sfu_ops = sfu_per_tanh * tanh + exps
  terms = {"flops": flops / rates.fp32_flops, "sfu": sfu_ops / rates.sfu_ops,
           "bytes": nbytes / rates.bandwidth}
  bound = max(terms, key=terms.get)
  rows = default_blocks("gpu").rows if rows is None else rows
  atomic_adds = (n * -(-tk // rows) * tq * a
                 if backward == "fused" and passes == "fwd_bwd" else 0)
  return dict(tanh=tanh, sfu_ops=sfu_ops, flops=flops, bytes=nbytes, flops_s=terms["flops"],
              sfu_s=terms["sfu"], bytes_s=terms["bytes"], floor_s=terms[bound], bound=bound,
              atomic_adds=atomic_adds)


def tanh_evaluations(jaxpr) -> dict[str, int]:
  """`{kernel name: tanh values computed}` over the Pallas calls of a traced
  program (`jax.make_jaxpr(f)(...)`, e.g. of a `jax.grad`), each call's
  count summed over its whole grid.

  How it counts: in each `pallas_call`'s kernel jaxpr, every `tanh`
  primitive, or inline assembly running `tanh.approx` (the approximate GPU
  form), adds the elements of its result, times the trip counts of the
  `scan`s (the kernels' `fori_loop`s with static bounds) around it; a `cond`
  adds its costliest branch; the kernel's total is multiplied by the number
  of programs in its grid. This is what runs, tanh by tanh, since each
  program evaluates its whole body. A tanh inside a `while` loop (unknown
  trip count) raises. Dividing by `N·Tq·Tk·a` (padded) gives evaluations per
  (query, key, feature).
  """
  def is_tanh(eqn) -> bool:
    name = eqn.primitive.name
    # The inline-assembly primitive is "elementwise_inline_asm_p" in jax 0.10.
    return name == "tanh" or (name.startswith("elementwise_inline_asm")
                              and "tanh" in str(eqn.params.get("asm", "")))

  def body(inner) -> int:
    total = 0
    for eqn in inner.eqns:
      name = eqn.primitive.name
      if is_tanh(eqn):
        total += math.prod(eqn.outvars[0].aval.shape)
      elif name == "scan":
        total += eqn.params["length"] * body(eqn.params["jaxpr"].jaxpr)
      elif name == "cond":
        total += max(body(b.jaxpr) for b in eqn.params["branches"])
      elif name == "while":
        if any(body(sub) for sub in _sub_jaxprs(eqn.params)):
          raise ValueError("a tanh inside a while loop: its trip count is unknown.")
      else:
        total += sum(body(sub) for sub in _sub_jaxprs(eqn.params))
    return total

  counts: dict[str, int] = {}

  def walk(inner):
    for eqn in inner.eqns:
      if eqn.primitive.name == "pallas_call":
        name = str(eqn.params.get("name") or "pallas_call")
        programs = math.prod(eqn.params["grid_mapping"].grid)
        counts[name] = counts.get(name, 0) + programs * body(eqn.params["jaxpr"])
        continue
      for sub in _sub_jaxprs(eqn.params):
        walk(sub)

  walk(getattr(jaxpr, "jaxpr", jaxpr))
  return counts


def _sub_jaxprs(params):
  """The jaxprs held in an equation's parameters (a ClosedJaxpr's inner one)."""
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      inner = getattr(item, "jaxpr", item)
      if hasattr(inner, "eqns"):
        yield inner
