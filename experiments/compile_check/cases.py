"""The programs the compile check compiles: training steps, attention kernels, the additive score.

Each `Case` builds `(jitted function, args)` when asked, the args arrays or
ShapeDtypeStructs whose values are never used: the programs are compiled for
a device that is only described (`compile_device`), never run. The training
steps are the sweep trainer's own (`EnsembleTrainer`, seeds vmapped), so the
program compiled is the one a sweep would run; the kernels and the additive
score are the kernel benchmark's headline shapes.
"""

from __future__ import annotations

import functools
import types
from typing import Sequence

import numpy as np

from attention_jax.measure.compile_device import Case


class ShapeOnlyData:
  """What `EnsembleTrainer` reads of a dataset to build its programs: the
  tokenizer's ids and size, and the longest sentence of each split."""

  def __init__(self, vocab_size: int, longest: int):
    from attention_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
    self.tokenizer = types.SimpleNamespace(
        vocab_size=vocab_size, pad_id=tokenizer.PAD_ID, eos_id=tokenizer.EOS_ID,
        sos_id=tokenizer.SOS_ID)
    self._lengths = types.SimpleNamespace(lengths=np.array([longest]))

  def token_ids(self, split: str):
    return self._lengths, self._lengths


def train_step_case(program: str, case: str, cfg, arm, steps: int | None) -> Case:
  """The sweep trainer's own compiled step (`EnsembleTrainer`, seeds vmapped,
  parameters and optimiser state donated) at the widest training batch."""

  def build():
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
    from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top
    width = int(batching.padded_length(cfg.max_length + 1))
    trainer = train_lib.EnsembleTrainer(cfg.point(arm),
                                        ShapeOnlyData(cfg.vocab_size, cfg.max_length),
                                        tuple(range(cfg.seeds)))
    ints = jax.ShapeDtypeStruct((cfg.batch_size, width), jnp.int32)
    args = (trainer.params, trainer.rest, trainer.opt_state,
            jax.ShapeDtypeStruct((), jnp.int32), ints, ints, ints)
    return trainer._train_step, args  # pylint: disable=protected-access

  from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
  width = int(batching.padded_length(cfg.max_length + 1))
  shapes = dict(model=cfg.model, arm=arm.name, dim=arm.attention_dim, seeds=cfg.seeds,
                batch=cfg.batch_size, length=width, vocab=cfg.vocab_size, dtype=cfg.dtype)
  return Case(program, case, shapes, build, steps=steps)


def gpu_sweep_cases() -> list[Case]:
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.from_preset("gpu")
  return [train_step_case("gpu_sweep", arm.label, cfg, arm, cfg.steps) for arm in cfg.sweep()]


def transformer_base_cases() -> list[Case]:
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.ExperimentConfig(
      model="transformer", arms=("scaled_dot",), dims=(64,), seeds=1, vocab_size=32000,
      hidden_dim=512, num_heads=8, ff_dim=2048, encoder_layers=6, decoder_layers=6,
      dropout=0.1, label_smoothing=0.1, adam_b2=0.98, batch_size=128, max_length=63,
      dtype="bfloat16")
  return [train_step_case("transformer_base", "scaled_dot d_k=64", cfg, cfg.sweep()[0], None)]


KERNEL_SHAPE = dict(batch=4, heads=16, head_dim=128)


def kernel_cases(seq_lens: Sequence[int], platform: str) -> list[Case]:
  """scaled_dot bf16 at `seq_lens`, causal or not, forward or forward+backward:
  the library's `attention(implementation='auto')` (the benchmark's
  `scaled_dot`), and on CUDA jax.nn's cuDNN kernel (the benchmark's
  `jax_cudnn`). The library is given the causal mask as `causal=True`, as
  the benchmark and the Transformer give it, so that `auto` can take cuDNN's
  fused kernel for it."""
  from attention_jax.measure import benchmarking as bm  # pylint: disable=g-import-not-at-top
  impls = ("auto", "auto_bthd", "jax_cudnn") if platform == "cuda" else ("auto",)
  b, h, d = KERNEL_SHAPE["batch"], KERNEL_SHAPE["heads"], KERNEL_SHAPE["head_dim"]
  cases = []
  for t in seq_lens:
    for causal in (False, True):
      for mode in ("fwd", "fwd_bwd"):
        for impl in impls:
          name = (f"{KERNEL_NAMES[impl]} T={t}"
                  f"{' causal' if causal else ''} {mode}")
          shapes = dict(impl=impl, batch=b, heads=h, seq_len=t, head_dim=d, causal=causal,
                        mode=mode, dtype="bfloat16")
          cases.append(Case("kernels", name, shapes,
                            functools.partial(_kernel_program, impl, b, h, t, d, causal, mode),
                            attention_flops=bm.attention_flops(
                                b, h, t, t, d, causal=causal, backward=mode == "fwd_bwd")))
  return cases


# The kernel cases' names: the library on its `[B, H, T, D]` arguments, the
# library as its layers call it (the data held `[B, T, H, D]`, the head axis
# swapped in as a view: `layers._split_heads`), and jax.nn's cuDNN call.
KERNEL_NAMES = {"auto": "scaled_dot auto", "auto_bthd": "scaled_dot auto, layers' layout",
                "jax_cudnn": "jax cudnn"}


def _kernel_program(impl, b, h, t, d, causal, mode):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top

  if impl == "auto":
    def kernel(q, k, v):  # [B, H, T, D]
      return aj.attention(q, k, v, score="scaled_dot", causal=causal, implementation="auto")
    shape = (b, h, t, d)
  elif impl == "auto_bthd":
    def kernel(q, k, v):  # [B, T, H, D], as the multi-head layer holds its projections
      heads = lambda x: jnp.swapaxes(x, 1, 2)
      return heads(aj.attention(heads(q), heads(k), heads(v), score="scaled_dot",
                                causal=causal, implementation="auto"))
    shape = (b, t, h, d)
  else:
    kernel = functools.partial(jax.nn.dot_product_attention, is_causal=causal,
                               implementation="cudnn")
    shape = (b, t, h, d)  # its own layout, as the benchmark times it

  if mode == "fwd":
    fn = lambda q, k, v, cot: kernel(q, k, v)
  else:
    def loss(q, k, v, cot):
      return jnp.sum(kernel(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))
    fn = jax.grad(loss, argnums=(0, 1, 2))
  arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  return jax.jit(fn), (arg, arg, arg, arg)


ADDITIVE_SHAPE = dict(batch=32, attention_dim=1024, head_dim=64)


def additive_cases(seq_lens: Sequence[int],
                   impls: Sequence[str] = ("chunked", "naive"),
                   attention_dim: int | None = None) -> list[Case]:
  """Forward+backward of additive attention at a = 1024 (or `attention_dim`):
  the library's chunked `scores.additive`, XLA's naive `scores.additive_naive`
  and the Pallas kernels (`pallas_additive`), those of `impls`."""
  a = attention_dim or ADDITIVE_SHAPE["attention_dim"]
  cases = []
  for t in seq_lens:
    for impl in (f"additive_{name}" for name in impls):
      shapes = dict(impl=impl, seq_len=t, dtype="float32", **{**ADDITIVE_SHAPE,
                                                              "attention_dim": a})
      cases.append(Case("additive", f"{impl} T={t}", shapes,
                        functools.partial(_additive_program, impl, t, a)))
  return cases


def _additive_program(impl, t, a):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top
  from attention_jax import scores  # pylint: disable=g-import-not-at-top
  score = scores.additive if impl == "additive_chunked" else scores.additive_naive
  b, d = ADDITIVE_SHAPE["batch"], ADDITIVE_SHAPE["head_dim"]

  def loss(q, k, values, w_q, w_k, v_att, cot):
    if impl == "additive_pallas":
      context = aj.attention(q, k, values, score="additive", implementation="pallas",
                             params={"w_q": w_q, "w_k": w_k, "v": v_att})
    else:
      context, _ = aj.attend(score(q, k, w_q, w_k, v_att), values)  # [B, T, d]
    return jnp.sum(context * cot)

  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  args = (f32(b, t, d), f32(b, t, d), f32(b, t, d), f32(d, a), f32(d, a), f32(a), f32(b, t, d))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5))), args

