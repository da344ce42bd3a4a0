"""The attention implementations the kernel suite times, and their inputs.

`build_kernel(impl, case, ...)` returns the function timed for one `--impls`
entry at one sweep point (`Case`); `program(kernel, mode)` turns it into the
forward or forward+backward program that is compiled and timed. PyTorch's
SDPA is not a JAX function: `torch_runner` gives its call instead.

Glossary: B batch, H heads, T sequence length (Tq = Tk), D head size;
`bhtd` / `bthd` the axis order of q, k, v and the context.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from attention_jax.measure import benchmarking as bm
from attention_jax import masks
from attention_jax import registry
from experiments.kernels.settings import LIBRARY_SCORES

# The library's two CPU code paths of scaled_dot, timed as impls of their own.
_LIBRARY_PATHS = {"scaled_dot_plain": "plain", "scaled_dot_blockwise": "blockwise"}
# scaled_dot on the layout the library's layers hold (`build_kernel`).
LAYERS_LAYOUT = "scaled_dot_bthd"


@dataclasses.dataclass(frozen=True)
class Case:
  """One point of the kernel sweep."""
  mode: str
  dtype: str
  batch: int
  heads: int
  seq_len: int
  head_dim: int
  causal: bool

  @property
  def flops(self) -> float:
    return bm.attention_flops(self.batch, self.heads, self.seq_len, self.seq_len,
                              self.head_dim, causal=self.causal,
                              backward=self.mode == "fwd_bwd")

  @property
  def mask(self):
    """`[T, T]` causal mask, or None."""
    return masks.causal(self.seq_len) if self.causal else None


class Skip(Exception):
  """An implementation does not apply to a case (recorded with its reason)."""


@dataclasses.dataclass
class Kernel:
  """A JAX attention function on `[B, H, T, D]` inputs, or a torch runner.

  `fn(q, k, v) -> context [B, H, T, D]`; `layout='bthd'` kernels take and
  return `[B, T, H, D]` (their native layout, so transposes are not timed).
  """
  fn: Callable | None = None
  layout: str = "bhtd"
  torch: bool = False


def score_params(head_dim: int, dtype, seed: int) -> dict[str, Any]:
  """Weights of every parametrised score (general w, additive w_q, w_k, v; cosine beta)."""
  keys = jax.random.split(jax.random.PRNGKey(seed + 101), 4)
  scale = 1 / math.sqrt(head_dim)
  normal = lambda key, shape: (jax.random.normal(key, shape) * scale).astype(dtype)
  return {"w": normal(keys[0], (head_dim, head_dim)),  # [D, D]
          "w_q": normal(keys[1], (head_dim, head_dim)),  # [D, a = D]
          "w_k": normal(keys[2], (head_dim, head_dim)),  # [D, a = D]
          "v": normal(keys[3], (head_dim,)),  # [a]
          "beta": jnp.asarray(4.0, dtype)}


def score_of(impl: str) -> str:
  """The score `impl` computes (its reference's)."""
  return impl if impl in LIBRARY_SCORES else "scaled_dot"


def build_kernel(impl: str, case: Case, params, library_implementation: str) -> Kernel:
  """The function timed for `impl` at `case`; raises Skip when it does not apply."""
  platform = jax.devices()[0].platform
  if impl == LAYERS_LAYOUT:
    # The library as its multi-head layer calls it: the projections held
    # [B, T, H, D] and the head axis swapped in as a view (`layers._split_heads`).
    # Compiled for an H100 this is jax.nn's own cuDNN program, where the
    # [B, H, T, D] arguments of `scaled_dot` cost seven transposes forward and
    # backward (results/compile_check/layout).
    heads = lambda x: jnp.swapaxes(x, 1, 2)
    return Kernel(lambda q, k, v: heads(aj.attention(
        heads(q), heads(k), heads(v), score="scaled_dot", causal=case.causal,
        implementation=library_implementation)), layout="bthd")
  if impl in LIBRARY_SCORES or impl in _LIBRARY_PATHS:
    score = score_of(impl)
    implementation = _LIBRARY_PATHS.get(impl, library_implementation)
    if implementation in ("xla", "cudnn") and not registry.get(score).fusable:
      raise Skip(f"implementation={implementation!r} supports the scores the fused kernels "
                 "compute only")
    # The causal mask goes by its structure, as the library's callers pass it:
    # cuDNN applies it inside its fused kernel (a dense mask would keep `auto`
    # on XLA's unfused one); the other paths build the same [T, T] mask.
    return Kernel(lambda q, k, v: aj.attention(q, k, v, score=score, params=params,
                                               causal=case.causal,
                                               implementation=implementation))
  mask = case.mask  # built here, so that the programs capture it as a constant
  if impl == "naive":
    return Kernel(lambda q, k, v: bm.naive_attention(q, k, v, mask).astype(v.dtype))
  if impl in ("jax_xla", "jax_cudnn"):
    if impl == "jax_cudnn":
      if platform != "gpu":
        raise Skip("cuDNN needs an NVIDIA GPU")
      if case.dtype == "float32":
        raise Skip("cuDNN flash attention takes float16/bfloat16 only")
    return Kernel(functools.partial(jax.nn.dot_product_attention, is_causal=case.causal,
                                    implementation=impl.split("_")[1]), layout="bthd")
  if impl == "nnx":
    from flax import nnx  # pylint: disable=g-import-not-at-top
    nnx_mask = None if mask is None else mask[None, None]  # [1, 1, T, T]
    return Kernel(lambda q, k, v: nnx.dot_product_attention(q, k, v, mask=nnx_mask),
                  layout="bthd")
  if impl == "torch":
    try:
      import torch  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise Skip("PyTorch is not installed (pip install -e '.[bench]' for the CPU wheel)") from None
    if platform != "cpu":
      raise Skip("the PyTorch comparison runs on CPU only")
    return Kernel(torch=True)
  raise ValueError(f"unknown implementation {impl!r}")


def reference_kernel(score: str, params, case: Case) -> Kernel:
  """The naive float32 einsum attention with `score`: what every kernel is checked against."""
  return Kernel(functools.partial(bm.naive_attention, mask=case.mask, score=score,
                                  params=params))


def to_layout(x, layout: str):
  """`[B, H, T, D]` -> the kernel's layout (`bthd`: `[B, T, H, D]`), and back."""
  return jnp.swapaxes(x, 1, 2) if layout == "bthd" else x


def program(kernel: Kernel, mode: str) -> Callable:
  """A function of (q, k, v, cotangent) in the kernel's layout: the context (fwd)
  or the gradients of `sum(context · cotangent)` w.r.t. q, k, v (fwd_bwd)."""
  if mode == "fwd":
    return lambda q, k, v, cot: kernel.fn(q, k, v)

  def loss(q, k, v, cot):
    return jnp.sum(kernel.fn(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))

  return jax.grad(loss, argnums=(0, 1, 2))


def inputs(case: Case, seed: int):
  """`(q, k, v, cotangent)`, each `[B, H, T, D]` standard normal in the case's dtype."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (case.batch, case.heads, case.seq_len, case.head_dim)
  return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in keys)


def torch_runner(case: Case, q, k, v, cot):
  """`(run, as_numpy)` for PyTorch SDPA on CPU: `run()` computes the outputs
  (context, or the gradients of q, k, v), `as_numpy` turns them into float32
  numpy arrays in the `[B, H, T, D]` layout."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(bm.machine_description()["cpu_cores"])
  tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16}[case.dtype]
  to_t = lambda x: torch.from_numpy(np.array(x, np.float32)).to(tdtype)  # a writable copy
  tq, tk, tv, tcot = (to_t(x) for x in (q, k, v, cot))
  sdpa = torch.nn.functional.scaled_dot_product_attention
  if case.mode == "fwd":
    def run():
      with torch.no_grad():
        return (sdpa(tq, tk, tv, is_causal=case.causal),)
  else:
    leaves = [t.clone().requires_grad_(True) for t in (tq, tk, tv)]

    def run():
      for t in leaves:
        t.grad = None
      out = sdpa(*leaves, is_causal=case.causal)  # [B, H, T, D]
      (out.float() * tcot.float()).sum().backward()
      return tuple(t.grad for t in leaves)
  as_numpy = lambda outs: tuple(o.detach().float().numpy() for o in outs)
  return run, as_numpy
