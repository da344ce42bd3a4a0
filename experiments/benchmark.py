r"""Attention kernels, additive-score memory and model training throughput, measured honestly.

    python -m experiments.benchmark --preset=cpu --workdir=runs/bench_cpu
    python -m experiments.benchmark --preset=gpu --workdir=runs/bench_gpu
    python -m experiments.benchmark --preset=tiny --workdir=/tmp/bench        # seconds
    python -m experiments.benchmark --suite=kernels --impls=scaled_dot,jax_xla,torch \
        --seq_lens=512 --batch=8 --heads=8 --head_dims=64 --modes=fwd_bwd --workdir=/tmp/b

Suites (--suite, comma-separated):
  kernels   attention forward / forward+backward for every --impls entry over
            the sweep --seq_lens × --head_dims × --heads × --batch × --causal ×
            --dtypes × --modes.
  additive  forward+backward of additive attention, chunked score
            (`scores.additive`) vs the naive `[B, Tq, Tk, a]` one
            (`scores.additive_naive`): temp memory and time at --additive_batch,
            --additive_dim, --additive_seq_lens.
  models    training tokens/s of the RNN Seq2Seq (Britz base) and the
            Transformer (base), and N vmapped seeds vs N sequential runs.

Every kernel is checked against a naive float32 einsum reference before it is
timed; one that disagrees is recorded as `refused` and never timed. Programs
are compiled before the clock starts (a program whose compiled memory exceeds
--memory_limit_gb is `skipped`), every call ends in `block_until_ready`,
warm-up calls are discarded, and the median and spread of the repeats are
reported. Writes into --workdir: `benchmark.jsonl` (one row per measurement, appended
as measured; earlier runs' rows are kept, each row names its `run`),
`benchmark.md` (tables), and log-log plots `kernels_*.png` (time and memory vs
sequence length per implementation) and `additive_memory.png`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from attention_jax import benchmarking as bm
from attention_jax import masks
from attention_jax import scores as scores_lib
from attention_jax.training import checkpoints
from attention_jax.training import reporting
from attention_jax.training import workdir_lock
from experiments import common

FLAGS = flags.FLAGS

SUITES = ("kernels", "additive", "models")
LIBRARY_SCORES = ("scaled_dot", "dot", "general", "cosine", "additive")
IMPLS = LIBRARY_SCORES + ("scaled_dot_plain", "scaled_dot_blockwise", "naive", "jax_xla",
                          "jax_cudnn", "nnx", "torch")
MODES = ("fwd", "fwd_bwd")
DTYPES = ("float32", "bfloat16", "float16")

PRESETS: dict[str, dict[str, Any]] = {
    # Every suite and implementation at toy sizes: a smoke run of seconds.
    "tiny": dict(suite="kernels,additive", impls=",".join(IMPLS), seq_lens="16,32",
                 head_dims="8", heads="2", batch="1", causal="false,true", dtypes="float32",
                 modes="fwd,fwd_bwd", repeats=3, warmup=1, additive_batch=2,
                 additive_dim=16, additive_seq_lens="8,16", additive_time_max_len=16,
                 additive_max_len=32,
                 model_batch=4, model_seq_len=8, model_seeds=2, model_size="tiny"),
    # The README's CPU table: the target shape and a modest sweep.
    "cpu": dict(suite="kernels,additive", impls=("scaled_dot,dot,general,cosine,additive,"
                                                  "scaled_dot_plain,naive,jax_xla,nnx,torch"),
                seq_lens="128,256,512,1024", head_dims="64", heads="8", batch="8",
                causal="false", dtypes="float32", modes="fwd,fwd_bwd", repeats=7, warmup=2,
                additive_batch=32, additive_dim=1024, additive_seq_lens="16,32,64,128,256,512",
                additive_time_max_len=128, additive_max_len=256,
                model_batch=64, model_seq_len=32, model_seeds=4, model_size="small"),
    # Accelerators: long sequences, both head sizes, both dtypes, causal or not.
    "gpu": dict(suite="kernels,additive,models",
                impls="scaled_dot,dot,general,cosine,additive,naive,jax_xla,jax_cudnn,nnx",
                seq_lens="128,256,512,1024,2048,4096,8192,16384", head_dims="64,128",
                heads="8,16", batch="4", causal="false,true", dtypes="bfloat16,float32",
                modes="fwd,fwd_bwd", repeats=20, warmup=3, additive_batch=32,
                additive_dim=1024, additive_seq_lens="32,64,128,256,512,1024",
                additive_time_max_len=1024, additive_max_len=1024,
                model_batch=128, model_seq_len=64, model_seeds=4, model_size="base"),
}

flags.DEFINE_string("workdir", None, "Output folder for benchmark.jsonl, benchmark.md and plots.")
flags.DEFINE_enum("preset", "cpu", list(PRESETS), "Starting values; explicit flags override them.")
flags.DEFINE_string("suite", None, f"Comma-separated suites from {SUITES}.")
flags.DEFINE_string("impls", None, f"Kernel-suite implementations from {IMPLS}: the library's "
                    "attention per score (`implementation=--library_implementation`), "
                    "scaled_dot_plain / scaled_dot_blockwise (the library's two CPU paths), "
                    "naive (float32 einsum reference), jax.nn.dot_product_attention "
                    "(jax_xla, jax_cudnn: GPU, half precision), flax.nnx.dot_product_attention "
                    "(nnx) and PyTorch's scaled_dot_product_attention on CPU (torch).")
flags.DEFINE_string("seq_lens", None, "Comma-separated sequence lengths T (Tq = Tk).")
flags.DEFINE_string("head_dims", None, "Comma-separated head sizes D.")
flags.DEFINE_string("heads", None, "Comma-separated head counts H.")
flags.DEFINE_string("batch", None, "Comma-separated batch sizes B.")
flags.DEFINE_string("causal", None, "Comma-separated booleans (false,true).")
flags.DEFINE_string("dtypes", None, f"Comma-separated input dtypes from {DTYPES}.")
flags.DEFINE_string("modes", None, f"Comma-separated from {MODES}.")
flags.DEFINE_string("library_implementation", "auto",
                    "`implementation` argument of the library's attention for the per-score impls.")
flags.DEFINE_integer("repeats", None, "Timed calls per measurement (at most; see --time_budget_s).")
flags.DEFINE_integer("warmup", None, "Discarded calls before timing.")
flags.DEFINE_float("time_budget_s", 30.0, "Fewer repeats (but at least 3) when one round of "
                   "calls (every implementation once) takes longer than this budget divided "
                   "by --repeats.")
flags.DEFINE_float("max_other_load", None, "Retry a case's timing when other processes kept "
                   "more than this many cores busy during it (CPU contention on shared "
                   "machines; Linux only). The row records the load of the attempt kept.")
flags.DEFINE_integer("load_retries", 4, "Retries per case under --max_other_load.")
flags.DEFINE_float("load_retry_pause_s", 15.0, "Pause before such a retry.")
flags.DEFINE_float("memory_limit_gb", None, "Skip a program whose compiled memory exceeds this; "
                   "default: 90% of the accelerator's memory, or half the available RAM on CPU.")
flags.DEFINE_float("peak_tflops", None, "Dense peak TFLOP/s for %-of-peak where the built-in "
                   "table has no entry (e.g. CPUs).")
flags.DEFINE_integer("additive_batch", None, "Additive suite: batch B.")
flags.DEFINE_integer("additive_dim", None, "Additive suite: attention size a (dq = dk = dv = 64).")
flags.DEFINE_string("additive_seq_lens", None, "Additive suite: lengths T for the memory curve.")
flags.DEFINE_integer("additive_time_max_len", None, "Additive suite: time (not only compile) "
                     "the programs up to this length.")
flags.DEFINE_integer("additive_max_len", None, "Kernel suite: longest T for the `additive` impl "
                     "(its [B, H, T, T, D] tanh work grows fastest).")
flags.DEFINE_integer("model_batch", None, "Models suite: sentences per batch.")
flags.DEFINE_integer("model_seq_len", None, "Models suite: source and target length.")
flags.DEFINE_integer("model_seeds", None, "Models suite: N for vmapped vs sequential seeds.")
flags.DEFINE_enum("model_size", None, ["tiny", "small", "base"],
                  "Models suite: base = Britz-base RNN / Transformer-base; small and tiny "
                  "shrink widths and vocabulary for CPUs and tests.")
flags.DEFINE_string("models", "rnn_seq2seq,transformer", "Models suite: which models, from "
                    f"{('rnn_seq2seq', 'transformer')}.")
flags.DEFINE_integer("model_vocab", None, "Models suite: vocabulary size (default by size).")
flags.DEFINE_integer("model_steps", 5, "Models suite: training steps per timed call (one "
                     "compiled `lax.scan`).")
flags.DEFINE_integer("seed", 0, "PRNG seed of the random inputs.")


# --- flags ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
  suites: tuple[str, ...]
  impls: tuple[str, ...]
  seq_lens: tuple[int, ...]
  head_dims: tuple[int, ...]
  heads: tuple[int, ...]
  batch: tuple[int, ...]
  causal: tuple[bool, ...]
  dtypes: tuple[str, ...]
  modes: tuple[str, ...]
  repeats: int
  warmup: int
  additive_batch: int
  additive_dim: int
  additive_seq_lens: tuple[int, ...]
  additive_time_max_len: int
  additive_max_len: int
  model_batch: int
  model_seq_len: int
  model_seeds: int
  model_size: str
  models: tuple[str, ...]


def _fail(message: str):
  sys.exit(f"error: {message}")


def _list(name, value, cast=str, allowed=None, minimum=None):
  items = []
  for raw in str(value).split(","):
    raw = raw.strip()
    if not raw:
      continue
    try:
      item = cast(raw)
    except ValueError:
      _fail(f"`--{name}` must be a comma-separated list of {cast.__name__}, got {value!r}.")
    if allowed is not None and item not in allowed:
      _fail(f"`--{name}`: {item!r} is not one of {allowed}.")
    if minimum is not None and item < minimum:
      _fail(f"`--{name}`: every value must be >= {minimum}, got {item}.")
    items.append(item)
  if not items:
    _fail(f"`--{name}` is empty.")
  return tuple(items)


def _bool(raw: str) -> bool:
  if raw.lower() in ("true", "1", "yes"):
    return True
  if raw.lower() in ("false", "0", "no"):
    return False
  raise ValueError(raw)


_bool.__name__ = "bool"


def settings_from_flags() -> Settings:
  """Preset values overridden by explicit flags; exits with one line on a bad value."""
  if not FLAGS.workdir:
    _fail("`--workdir` is required.")
  preset = dict(PRESETS[FLAGS.preset])
  pick = lambda name: getattr(FLAGS, name) if getattr(FLAGS, name) is not None else preset.get(name)
  for name in ("repeats", "additive_batch", "additive_dim", "additive_time_max_len",
               "additive_max_len",
               "model_batch", "model_seq_len", "model_seeds", "model_steps"):
    if pick(name) is None or int(pick(name)) < 1:
      _fail(f"`--{name}` must be a positive integer, got {pick(name)!r}.")
  if int(pick("warmup")) < 0:
    _fail(f"`--warmup` must be >= 0, got {pick('warmup')}.")
  if FLAGS.library_implementation not in ("auto", "plain", "xla", "cudnn", "blockwise"):
    _fail("`--library_implementation` must be one of auto, plain, xla, cudnn, blockwise; "
          f"got {FLAGS.library_implementation!r}.")
  if FLAGS.memory_limit_gb is not None and FLAGS.memory_limit_gb <= 0:
    _fail(f"`--memory_limit_gb` must be > 0, got {FLAGS.memory_limit_gb}.")
  return Settings(
      suites=_list("suite", pick("suite"), allowed=SUITES),
      impls=_list("impls", pick("impls"), allowed=IMPLS),
      seq_lens=_list("seq_lens", pick("seq_lens"), int, minimum=1),
      head_dims=_list("head_dims", pick("head_dims"), int, minimum=1),
      heads=_list("heads", pick("heads"), int, minimum=1),
      batch=_list("batch", pick("batch"), int, minimum=1),
      causal=_list("causal", pick("causal"), _bool),
      dtypes=_list("dtypes", pick("dtypes"), allowed=DTYPES),
      modes=_list("modes", pick("modes"), allowed=MODES),
      repeats=int(pick("repeats")), warmup=int(pick("warmup")),
      additive_batch=int(pick("additive_batch")), additive_dim=int(pick("additive_dim")),
      additive_seq_lens=_list("additive_seq_lens", pick("additive_seq_lens"), int, minimum=1),
      additive_time_max_len=int(pick("additive_time_max_len")),
      additive_max_len=int(pick("additive_max_len")),
      model_batch=int(pick("model_batch")), model_seq_len=int(pick("model_seq_len")),
      model_seeds=int(pick("model_seeds")), model_size=pick("model_size") or "small",
      models=_list("models", FLAGS.models, allowed=("rnn_seq2seq", "transformer")))


# --- the kernels suite ---------------------------------------------------------------


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


def _score_params(head_dim: int, dtype, seed: int):
  keys = jax.random.split(jax.random.PRNGKey(seed + 101), 4)
  scale = 1 / math.sqrt(head_dim)
  return {"w": (jax.random.normal(keys[0], (head_dim, head_dim)) * scale).astype(dtype),
          "w_q": (jax.random.normal(keys[1], (head_dim, head_dim)) * scale).astype(dtype),
          "w_k": (jax.random.normal(keys[2], (head_dim, head_dim)) * scale).astype(dtype),
          "v": (jax.random.normal(keys[3], (head_dim,)) * scale).astype(dtype),
          "beta": jnp.asarray(4.0, dtype)}


def _score_of(impl: str) -> str:
  if impl in LIBRARY_SCORES:
    return impl
  return "scaled_dot"


def build_kernel(impl: str, case: Case, params, library_implementation: str) -> Kernel:
  """The function timed for `impl` at `case`; raises Skip when it does not apply."""
  platform = jax.devices()[0].platform
  mask = masks.causal(case.seq_len) if case.causal else None
  if impl in LIBRARY_SCORES or impl in ("scaled_dot_plain", "scaled_dot_blockwise"):
    score = _score_of(impl)
    implementation = {"scaled_dot_plain": "plain",
                      "scaled_dot_blockwise": "blockwise"}.get(impl, library_implementation)
    if implementation in ("xla", "cudnn") and score not in ("dot", "scaled_dot"):
      raise Skip(f"implementation={implementation!r} supports dot-product scores only")
    return Kernel(lambda q, k, v: aj.attention(q, k, v, score=score, params=params, mask=mask,
                                               implementation=implementation))
  if impl == "naive":
    return Kernel(lambda q, k, v: bm.naive_attention(q, k, v, mask).astype(v.dtype))
  if impl in ("jax_xla", "jax_cudnn"):
    if impl == "jax_cudnn":
      if platform != "gpu":
        raise Skip("cuDNN needs an NVIDIA GPU")
      if case.dtype == "float32":
        raise Skip("cuDNN flash attention takes float16/bfloat16 only")
    implementation = impl.split("_")[1]
    return Kernel(functools.partial(jax.nn.dot_product_attention, is_causal=case.causal,
                                    implementation=implementation), layout="bthd")
  if impl == "nnx":
    from flax import nnx  # pylint: disable=g-import-not-at-top
    nnx_mask = None if mask is None else mask[None, None]
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


def _to_layout(x, layout):
  return jnp.swapaxes(x, 1, 2) if layout == "bthd" else x


def _program(kernel: Kernel, mode: str):
  """A function of (q, k, v, cotangent) in the kernel's layout: the context (fwd)
  or the gradients of `sum(context · cotangent)` w.r.t. q, k, v (fwd_bwd)."""
  if mode == "fwd":
    return lambda q, k, v, cot: kernel.fn(q, k, v)

  def loss(q, k, v, cot):
    return jnp.sum(kernel.fn(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))

  return jax.grad(loss, argnums=(0, 1, 2))


def _inputs(case: Case, seed: int):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (case.batch, case.heads, case.seq_len, case.head_dim)
  return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in keys)


def _torch_runner(case: Case, q, k, v, cot):
  """(run() -> outputs as numpy in [B, H, T, D] layout, sync) for PyTorch SDPA."""
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
      out = sdpa(*leaves, is_causal=case.causal)
      (out.float() * tcot.float()).sum().backward()
      return tuple(t.grad for t in leaves)
  as_numpy = lambda outs: tuple(o.detach().float().numpy() for o in outs)
  return run, as_numpy


def memory_limit_bytes() -> int:
  if FLAGS.memory_limit_gb is not None:
    return int(FLAGS.memory_limit_gb * 2 ** 30)
  device = jax.devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    pass
  if stats and stats.get("bytes_limit"):
    return int(0.9 * stats["bytes_limit"])
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemAvailable"):
          return int(line.split()[1]) * 1024 // 2
  except OSError:
    pass
  return 8 * 2 ** 30


def _compiled_bytes(memory: dict) -> int:
  return sum(memory.get(k) or 0 for k in ("temp_bytes", "argument_bytes", "output_bytes"))


def _repeats_for(first_call_s: float, repeats: int, budget_s: float) -> int:
  """At least 3 timed calls for a median; fewer than `repeats` when a call is slow."""
  if first_call_s <= 0:
    return repeats
  return max(3, min(repeats, int(budget_s / first_call_s)))


def prepare_kernel(impl: str, kernel: Kernel, case: Case, inputs, reference,
                   limit_bytes: int) -> tuple[dict[str, Any], Callable[[], Any] | None, float]:
  """Compiles `kernel` and checks it against `reference`.

  Returns `(fields, call, first_call_s)`: `call()` runs one blocking call, and
  is None when the kernel must not be timed (fields then carry status and
  reason: 'refused' for a kernel that disagrees with the reference, 'skipped'
  for one that does not compile or does not fit). `reference=None` means the
  kernel was verified beforehand on a smaller case (`verify_kernel`).
  """
  q, k, v, cot = inputs
  rtol = bm.default_tolerance(case.dtype)
  fields: dict[str, Any] = {}
  if kernel.torch:
    run, as_numpy = _torch_runner(case, q, k, v, cot)
    start = time.perf_counter()
    outputs = as_numpy(run())
    first = time.perf_counter() - start
    fields.update(temp_bytes=None, argument_bytes=None, output_bytes=None, peak_bytes=None)
    call = run
  else:
    args = tuple(_to_layout(x, kernel.layout) for x in (q, k, v, cot))
    try:
      compiled, fields["compile_s"] = bm.compile_fn(_program(kernel, case.mode), *args)
    except Exception as e:  # pylint: disable=broad-except
      return ({"status": "skipped", "reason": f"does not compile: {type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:300]}"}, None, 0.0)
    fields.update(bm.memory_stats(compiled))
    if _compiled_bytes(fields) > limit_bytes:
      return ({**fields, "status": "skipped",
               "reason": f"compiled memory {_compiled_bytes(fields) / 2 ** 30:.2f} GiB exceeds "
                         f"the limit {limit_bytes / 2 ** 30:.2f} GiB"}, None, 0.0)
    start = time.perf_counter()
    outputs = jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - start
    if kernel.layout == "bthd":
      outputs = jax.tree.map(lambda x: jnp.swapaxes(x, 1, 2), outputs)
    call = functools.partial(compiled, *args)
  if reference is not None:
    try:
      fields["max_abs_err"] = bm.verify_close(outputs, reference, rtol=rtol, name=impl)
    except bm.KernelMismatchError as e:
      return {**fields, "status": "refused", "reason": str(e)}, None, first
  return fields, call, first


def verify_kernel(impl: str, kernel: Kernel, case: Case, inputs, reference) -> float:
  """Max error of `kernel` against `reference` at `case`; raises KernelMismatchError."""
  q, k, v, cot = inputs
  rtol = bm.default_tolerance(case.dtype)
  if kernel.torch:
    run, as_numpy = _torch_runner(case, q, k, v, cot)
    outputs = as_numpy(run())
  else:
    args = tuple(_to_layout(x, kernel.layout) for x in (q, k, v, cot))
    outputs = jax.jit(_program(kernel, case.mode))(*args)
    if kernel.layout == "bthd":
      outputs = jax.tree.map(lambda x: jnp.swapaxes(x, 1, 2), outputs)
  return bm.verify_close(outputs, reference, rtol=rtol, name=impl)


def timed_with_retries(calls, *, warmup: int, repeats: int):
  """`time_interleaved`, repeated while other processes load the CPUs.

  Returns `(timings, other_load, attempts)`: the attempt during which other
  processes kept the fewest cores busy (`bm.other_cpu_load`). With
  --max_other_load set, an attempt above it is retried after a pause, at
  most --load_retries times; the load of the attempt kept is recorded either way.
  """
  best = None
  attempts = 0
  for attempts in range(1, FLAGS.load_retries + 2):
    before = bm.cpu_snapshot()
    timings = bm.time_interleaved(calls, warmup=warmup if attempts == 1 else 1,
                                  repeats=repeats)
    load = bm.other_cpu_load(before, bm.cpu_snapshot())
    if best is None or (load is not None and (best[1] is None or load < best[1])):
      best = (timings, load)
    if FLAGS.max_other_load is None or load is None or load <= FLAGS.max_other_load:
      break
    if attempts <= FLAGS.load_retries:
      logging.info("other processes kept %.2f cores busy; retrying in %.0f s", load,
                   FLAGS.load_retry_pause_s)
      time.sleep(FLAGS.load_retry_pause_s)
  return best[0], best[1], attempts


def kernel_cases(settings: Settings):
  for mode, dtype, d, h, b, causal, t in itertools.product(
      settings.modes, settings.dtypes, settings.head_dims, settings.heads, settings.batch,
      settings.causal, sorted(settings.seq_lens)):
    yield Case(mode=mode, dtype=dtype, batch=b, heads=h, seq_len=t, head_dim=d, causal=causal)


def run_kernels_suite(settings: Settings, write: Callable[[dict], None]) -> None:
  """Per case: compile and verify every implementation, then time them interleaved.

  Interleaving (one call of each implementation per round, the order rotating)
  spreads any load from other processes over all of them alike, so their
  ratios stay fair on a shared machine.
  """
  limit = memory_limit_bytes()
  device_kind = jax.devices()[0].device_kind
  for case in kernel_cases(settings):
    peak = FLAGS.peak_tflops or bm.dense_peak_tflops(device_kind, case.dtype)
    base = {"suite": "kernels", **dataclasses.asdict(case), "flops": case.flops}
    inputs = _inputs(case, FLAGS.seed)
    params = _score_params(case.head_dim, case.dtype, FLAGS.seed)
    references = {}  # score -> (case, inputs, reference outputs) or a skip reason

    def reference_for(score):
      """The float32 reference at `case` or, when it does not fit in memory, at
      one batch element and one head (the kernel is then verified there)."""
      if score in references:
        return references[score]
      small = dataclasses.replace(case, batch=1, heads=1)
      for at, at_inputs in ((case, inputs), (small, tuple(x[:1, :1] for x in inputs))):
        ref = _program(Kernel(functools.partial(
            _naive_score_attention, score=score, params=params,
            mask=masks.causal(at.seq_len) if at.causal else None)), at.mode)
        try:
          compiled, _ = bm.compile_fn(ref, *at_inputs)
          if _compiled_bytes(bm.memory_stats(compiled)) <= limit:
            references[score] = (at, at_inputs, jax.tree.map(np.asarray, compiled(*at_inputs)))
            return references[score]
        except Exception as e:  # pylint: disable=broad-except
          references[score] = f"reference failed: {type(e).__name__}: {str(e)[:200]}"
          return references[score]
      references[score] = "the naive reference does not fit in memory even at B = H = 1"
      return references[score]

    ready = {}  # impl -> (fields, call, first call seconds)
    for impl in settings.impls:
      row = {**base, "impl": impl}
      if impl == "additive" and case.seq_len > settings.additive_max_len:
        write({**row, "status": "skipped",
               "reason": f"T > --additive_max_len={settings.additive_max_len}"})
        continue
      try:
        kernel = build_kernel(impl, case, params, FLAGS.library_implementation)
      except Skip as e:
        write({**row, "status": "skipped", "reason": str(e)})
        continue
      reference = reference_for(_score_of(impl))
      if isinstance(reference, str):
        write({**row, "status": "skipped", "reason": reference + "; unverified kernels are "
                                                                  "not timed"})
        continue
      at, at_inputs, expected = reference
      extra = {}
      if at != case:  # verify on one batch element and head, then time the full case
        try:
          extra = {"max_abs_err": verify_kernel(
              impl, build_kernel(impl, at, params, FLAGS.library_implementation), at,
              at_inputs, expected), "verified_at": "B=1, H=1"}
        except bm.KernelMismatchError as e:
          write({**row, "status": "refused", "reason": f"at B = H = 1: {e}"})
          continue
        except Exception as e:  # pylint: disable=broad-except
          write({**row, "status": "skipped", "reason": f"verification at B = H = 1 failed: "
                                                       f"{type(e).__name__}: {str(e)[:200]}"})
          continue
        expected = None
      fields, call, first = prepare_kernel(impl, kernel, case, inputs, expected, limit)
      if call is None:
        write({**row, **fields})
        continue
      ready[impl] = ({**row, **fields, **extra}, call, first)
    if not ready:
      continue
    repeats = _repeats_for(sum(first for _, _, first in ready.values()), settings.repeats,
                           FLAGS.time_budget_s)
    timings, other_load, attempts = timed_with_retries(
        {impl: call for impl, (_, call, _) in ready.items()}, warmup=settings.warmup,
        repeats=repeats)
    device_peak = bm.peak_device_memory()
    for impl, (row, _, _) in ready.items():
      timing = timings[impl]
      tflops = case.flops / timing.median_s / 1e12
      write({**row, "status": "ok", **_timing_fields(timing), "tflops": tflops,
             "pct_peak": None if not peak else 100 * tflops / peak,
             "peak_device_bytes": None if row.get("impl") == "torch" else device_peak,
             "other_load_cores": other_load, "attempts": attempts})


def _naive_score_attention(q, k, v, *, score, params, mask):
  return bm.naive_attention(q, k, v, mask, score=score, params=params)


# --- the additive suite --------------------------------------------------------------


def run_additive_suite(settings: Settings, write: Callable[[dict], None]) -> None:
  """Chunked vs naive additive attention, forward+backward: temp memory and time."""
  limit = memory_limit_bytes()
  b, a, d = settings.additive_batch, settings.additive_dim, 64
  keys = jax.random.split(jax.random.PRNGKey(FLAGS.seed + 7), 8)
  w_q = jax.random.normal(keys[0], (d, a)) / math.sqrt(d)
  w_k = jax.random.normal(keys[1], (d, a)) / math.sqrt(d)
  v_att = jax.random.normal(keys[2], (a,)) / math.sqrt(a)
  score_fns = {"additive_chunked": scores_lib.additive, "additive_naive": scores_lib.additive_naive}
  for t in sorted(settings.additive_seq_lens):
    q = jax.random.normal(keys[3], (b, t, d))
    k = jax.random.normal(keys[4], (b, t, d))
    values = jax.random.normal(keys[5], (b, t, d))
    cot = jax.random.normal(keys[6], (b, t, d))
    args = (q, k, values, w_q, w_k, v_att, cot)
    timed = t <= settings.additive_time_max_len
    reference = None
    if timed:
      reference = jax.jit(jax.grad(_additive_loss(None), argnums=(0, 1, 2, 3, 4, 5)))(*args)
      reference = jax.tree.map(np.asarray, reference)
    ready = {}  # impl -> (row, call, first call seconds); timed interleaved below
    for impl, score_fn in score_fns.items():
      row = {"suite": "additive", "impl": impl, "mode": "fwd_bwd", "dtype": "float32",
             "batch": b, "seq_len": t, "attention_dim": a, "head_dim": d}
      program = jax.grad(_additive_loss(score_fn), argnums=(0, 1, 2, 3, 4, 5))
      compiled, compile_s = bm.compile_fn(program, *args)
      memory = bm.memory_stats(compiled)
      row.update(memory, compile_s=compile_s)
      if not timed or _compiled_bytes(memory) > limit:
        why = (f"T > --additive_time_max_len={settings.additive_time_max_len}" if not timed
               else f"compiled memory {_compiled_bytes(memory) / 2 ** 30:.1f} GiB exceeds the limit")
        write({**row, "status": "compiled_only", "reason": why})
        continue
      start = time.perf_counter()
      grads = jax.block_until_ready(compiled(*args))
      first = time.perf_counter() - start
      try:
        row["max_abs_err"] = bm.verify_close(jax.tree.map(np.asarray, grads), reference,
                                             rtol=bm.default_tolerance("float32"), name=impl)
      except bm.KernelMismatchError as e:
        write({**row, "status": "refused", "reason": str(e)})
        continue
      del grads
      ready[impl] = (row, functools.partial(compiled, *args), first)
    if not ready:
      continue
    timings, other_load, attempts = timed_with_retries(
        {impl: call for impl, (_, call, _) in ready.items()}, warmup=min(settings.warmup, 1),
        repeats=_repeats_for(sum(f for _, _, f in ready.values()), settings.repeats,
                             FLAGS.time_budget_s))
    for impl, (row, _, _) in ready.items():
      write({**row, "status": "ok", **_timing_fields(timings[impl]),
             "other_load_cores": other_load, "attempts": attempts})


def _additive_loss(score_fn):
  """sum(attention context · cot) with `score_fn` scores, or the naive reference (None)."""

  def loss(q, k, values, w_q, w_k, v_att, cot):
    if score_fn is None:
      context = bm.naive_attention(q, k, values, score="additive",
                                   params={"w_q": w_q, "w_k": w_k, "v": v_att})
    else:
      context, _ = aj.attend(score_fn(q, k, w_q, w_k, v_att), values)
    return jnp.sum(context * cot)

  return loss


# --- the models suite ----------------------------------------------------------------

MODEL_SIZES = {
    # vocab, Seq2Seq kwargs, Transformer kwargs
    "tiny": (64, dict(embed_dim=16, hidden_dim=16, attention_dim=16),
             dict(num_layers=1, d_model=32, num_heads=2, d_ff=64)),
    "small": (4000, dict(embed_dim=128, hidden_dim=128, attention_dim=128),
              dict(num_layers=2, d_model=128, num_heads=4, d_ff=512)),
    "base": (32000, {}, {}),  # Britz-base / Transformer-base as in the papers
}


def _model_configs(size: str, vocab: int | None, seq_len: int):
  from attention_jax import models  # pylint: disable=g-import-not-at-top
  default_vocab, rnn_kw, tf_kw = MODEL_SIZES[size]
  vocab = vocab or default_vocab
  rnn = dataclasses.replace(models.Seq2SeqConfig.britz_base(vocab), **rnn_kw)
  transformer = dataclasses.replace(models.TransformerConfig.base(vocab),
                                    max_length=max(seq_len, 8), **tf_kw)
  return vocab, {"rnn_seq2seq": (models.Seq2Seq, rnn),
                 "transformer": (models.Transformer, transformer)}


def _train_step_fn(graphdef, optimizer):
  """One Adam step on the token cross-entropy (pad id 0 ignored), on a model state."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  def loss_fn(params, rest, src, tgt_in, tgt_out, dropout_key):
    model = nnx.merge(graphdef, params, rest)
    logits, _ = model(src, tgt_in, deterministic=False, rngs=nnx.Rngs(dropout=dropout_key))
    weights = (tgt_out != 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tgt_out)
    return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)

  def step(params, rest, opt_state, src, tgt_in, tgt_out, dropout_key):
    loss, grads = jax.value_and_grad(loss_fn)(params, rest, src, tgt_in, tgt_out, dropout_key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def run_models_suite(settings: Settings, write: Callable[[dict], None]) -> None:
  """Training tokens/s of each model; N seeds vmapped in one program vs N sequential runs."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from attention_jax import models  # pylint: disable=g-import-not-at-top

  b, t, n = settings.model_batch, settings.model_seq_len, settings.model_seeds
  vocab, configs = _model_configs(settings.model_size, FLAGS.model_vocab, t)
  rng = np.random.default_rng(FLAGS.seed)
  src = jnp.asarray(rng.integers(3, vocab, (b, t)), jnp.int32)
  tgt = jnp.asarray(rng.integers(3, vocab, (b, t + 1)), jnp.int32)
  tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
  steps = FLAGS.model_steps
  tokens = b * t * steps  # target tokens per timed call and model
  optimizer = optax.adam(1e-4)
  repeats = max(3, settings.repeats // 2)
  for name in settings.models:
    cls, config = configs[name]
    # N models with stacked parameters; member 0 is the single model (the
    # contract of create_ensemble: member i equals cls(config, rngs=Rngs(seed i))).
    ensemble_def, states = models.create_ensemble(cls, config, list(range(n)))
    _, params_n, rest_n = nnx.split(nnx.merge(ensemble_def, states), nnx.Param, ...)
    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))),
                               nnx.Param, ...)
    params1, rest1 = (jax.tree.map(lambda x: x[0], t) for t in (params_n, rest_n))
    step = _train_step_fn(graphdef, optimizer)

    def train(params, rest, opt_state, key, step=step):
      """`steps` Adam steps in one program; returns the final state and the losses."""
      def body(carry, i):
        params, opt_state = carry
        params, opt_state, loss = step(params, rest, opt_state, src, tgt_in, tgt_out,
                                       jax.random.fold_in(key, i))
        return (params, opt_state), loss
      (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), jnp.arange(steps))
      return params, opt_state, losses

    base = {"suite": "models", "model": name, "size": settings.model_size, "batch": b,
            "seq_len": t, "vocab": vocab, "params": models.count_params(params1),
            "steps_per_call": steps}
    # Compile the three contenders, check that they train (finite losses), then
    # time them interleaved so that load from other processes hits all alike.
    args1 = (params1, rest1, optimizer.init(params1), jax.random.PRNGKey(0))
    compiled1, compile1 = bm.compile_fn(train, *args1)
    losses1 = np.asarray(compiled1(*args1)[2])
    # N sequential runs of the one-seed program (what N separate jobs would do).
    seeds_args = [(jax.tree.map(lambda x, i=i: x[i], params_n),
                   jax.tree.map(lambda x, i=i: x[i], rest_n)) for i in range(n)]
    seeds_args = [(p, r, optimizer.init(p), jax.random.PRNGKey(i))
                  for i, (p, r) in enumerate(seeds_args)]
    # N seeds vmapped: one program trains N models.
    args_n = (params_n, rest_n, jax.vmap(optimizer.init)(params_n),
              jax.random.split(jax.random.PRNGKey(1), n))
    calls = {"1 seed": functools.partial(compiled1, *args1),
             f"{n} seeds sequential": lambda: [compiled1(*a) for a in seeds_args]}
    try:
      compiled_n, compile_n = bm.compile_fn(jax.vmap(train), *args_n)
      losses_n = np.asarray(compiled_n(*args_n)[2])  # [N, steps]
      calls[f"{n} seeds vmapped"] = functools.partial(compiled_n, *args_n)
    except Exception as e:  # pylint: disable=broad-except
      write({**base, "impl": f"{n} seeds vmapped", "seeds": n, "status": "skipped",
             "reason": f"{type(e).__name__}: {str(e)[:300]}"})
    timings, other_load, attempts = timed_with_retries(calls, warmup=1, repeats=repeats)
    base.update(other_load_cores=other_load, attempts=attempts)
    tps1 = tokens / timings["1 seed"].median_s
    write({**base, "impl": "1 seed", "seeds": 1, **_timing_fields(timings["1 seed"]),
           "compile_s": compile1, "tokens_per_s": tps1, "final_loss": float(losses1[-1]),
           "status": "ok" if np.all(np.isfinite(losses1)) else "refused",
           **bm.memory_stats(compiled1)})
    seq = timings[f"{n} seeds sequential"]
    tps_seq = tokens * n / seq.median_s
    write({**base, "impl": f"{n} seeds sequential", "seeds": n, **_timing_fields(seq),
           "tokens_per_s": tps_seq, "speedup_vs_one_seed": tps_seq / tps1, "status": "ok"})
    if f"{n} seeds vmapped" in timings:
      vm = timings[f"{n} seeds vmapped"]
      tps_n = tokens * n / vm.median_s
      write({**base, "impl": f"{n} seeds vmapped", "seeds": n, **_timing_fields(vm),
             "compile_s": compile_n, "tokens_per_s": tps_n,
             "final_loss": float(losses_n[:, -1].mean()), "speedup_vs_one_seed": tps_n / tps1,
             "speedup_vs_sequential": tps_n / tps_seq,
             "status": "ok" if np.all(np.isfinite(losses_n)) else "refused",
             **bm.memory_stats(compiled_n)})


def _timing_fields(timing: bm.Timing) -> dict[str, Any]:
  return {"time_median_s": timing.median_s, "time_min_s": timing.min_s,
          "time_max_s": timing.max_s, "time_iqr_s": timing.iqr_s, "repeats": timing.repeats}


# --- outputs -------------------------------------------------------------------------


def _fmt_time(s):
  if s is None:
    return "—"
  if s < 1e-3:
    return f"{s * 1e6:.0f} µs"
  return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def _fmt_bytes(n):
  return "—" if n is None else f"{n / 2 ** 20:.1f} MiB"


def markdown_tables(rows: list[dict], machine: dict) -> str:
  """`benchmark.md`: the machine, then one table per suite."""
  lines = [f"Command: `python -m experiments.benchmark {' '.join(sys.argv[1:])}`", "",
           f"Machine: {machine['cpu']} ({machine['cpu_cores']} cores), JAX "
           f"{machine['jax_version']} on {machine['platform']} ({machine['device_kind']})."]
  loads = [r["loadavg_1m"] for r in rows if r.get("loadavg_1m") is not None]
  if loads:
    lines.append(f"1-minute load average during the run: {min(loads):.1f}-{max(loads):.1f} "
                 f"(this benchmark alone accounts for up to its thread count; more means "
                 f"other processes shared the machine).")
  other = [r["other_load_cores"] for r in rows if r.get("other_load_cores") is not None]
  if other:
    lines.append(f"Cores kept busy by other processes while timing: {min(other):.2f}-"
                 f"{max(other):.2f} (column 'other load'; rows with high values are "
                 f"slowed by contention).")
  lines.append("")
  kernels = [r for r in rows if r["suite"] == "kernels"]
  if kernels:
    lines += ["| impl | mode | dtype | B | H | T | D | causal | median | spread (IQR) | TFLOP/s "
              "| % peak | temp memory | other load | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in kernels:
      pct = "—" if r.get("pct_peak") is None else f"{r['pct_peak']:.1f}"
      tf = "—" if r.get("tflops") is None else f"{r['tflops']:.3f}"
      status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:60]}"
      other = "—" if r.get("other_load_cores") is None else f"{r['other_load_cores']:.2f}"
      lines.append(f"| {r['impl']} | {r['mode']} | {r['dtype']} | {r['batch']} | {r['heads']} | "
                   f"{r['seq_len']} | {r['head_dim']} | {r['causal']} | "
                   f"{_fmt_time(r.get('time_median_s'))} | {_fmt_time(r.get('time_iqr_s'))} | "
                   f"{tf} | {pct} | {_fmt_bytes(r.get('temp_bytes'))} | {other} | {status} |")
    lines += [""] + _ratio_lines(kernels) + [""]
  additive = [r for r in rows if r["suite"] == "additive"]
  if additive:
    lines += ["| additive | B | T | a | median | temp memory | temp / (B·T²) | status |",
              "|---|---|---|---|---|---|---|---|"]
    for r in additive:
      per = r.get("temp_bytes")
      per = "—" if per is None else f"{per / (r['batch'] * r['seq_len'] ** 2):.0f} B"
      lines.append(f"| {r['impl']} | {r['batch']} | {r['seq_len']} | {r['attention_dim']} | "
                   f"{_fmt_time(r.get('time_median_s'))} | {_fmt_bytes(r.get('temp_bytes'))} | "
                   f"{per} | {r['status']} |")
    lines += [""] + _additive_lines(additive) + [""]
  model_rows = [r for r in rows if r["suite"] == "models"]
  if model_rows:
    lines += ["| model | size | params (one) | B | T | run | training tokens/s | × one seed "
              "| median per call | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    one = {r["model"]: r.get("tokens_per_s") for r in model_rows if r.get("seeds") == 1}
    for r in model_rows:
      tps = r.get("tokens_per_s")
      ratio = "—" if not tps or not one.get(r["model"]) else f"{tps / one[r['model']]:.2f}"
      lines.append(f"| {r['model']} | {r['size']} | {r.get('params', 0):,} | {r['batch']} | "
                   f"{r['seq_len']} | {r['impl']} | {'—' if tps is None else f'{tps:,.0f}'} | "
                   f"{ratio} | {_fmt_time(r.get('time_median_s'))} | {r['status']} |")
  return "\n".join(lines) + "\n"


def _ratio_lines(kernels):
  """Time ratios of the library's scaled_dot to jax_xla and torch, per matching case."""
  out = []
  key = lambda r: (r["mode"], r["dtype"], r["batch"], r["heads"], r["seq_len"], r["head_dim"],
                   r["causal"])
  by_case = {}
  for r in kernels:
    if r["status"] == "ok":
      by_case.setdefault(key(r), {})[r["impl"]] = r["time_median_s"]
  for case, times in sorted(by_case.items()):
    if "scaled_dot" not in times:
      continue
    parts = [f"{other} / scaled_dot = {times[other] / times['scaled_dot']:.2f}"
             for other in ("jax_xla", "torch", "scaled_dot_plain", "naive") if other in times]
    if parts:
      out.append(f"- {case[0]} {case[1]} B={case[2]} H={case[3]} T={case[4]} D={case[5]} "
                 f"causal={case[6]}: " + ", ".join(parts) + " (time ratios; > 1: library faster)")
  return out


def _additive_lines(additive):
  out = []
  by_t = {}
  for r in additive:
    by_t.setdefault(r["seq_len"], {})[r["impl"]] = r
  for t, pair in sorted(by_t.items()):
    c, n = pair.get("additive_chunked"), pair.get("additive_naive")
    if not c or not n or not c.get("temp_bytes") or not n.get("temp_bytes"):
      continue
    text = f"- T={t}: chunked temp memory = {c['temp_bytes'] / n['temp_bytes']:.3f} × naive"
    if c.get("time_median_s") and n.get("time_median_s"):
      text += f", time = {c['time_median_s'] / n['time_median_s']:.2f} × naive"
    out.append(text)
  return out


def plot(rows: list[dict], workdir: str) -> list[str]:
  """Log-log plots; returns the file names written."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  written = []
  kernels = [r for r in rows if r["suite"] == "kernels" and r["status"] == "ok"]
  groups = {}
  for r in kernels:
    groups.setdefault((r["mode"], r["dtype"], r["head_dim"], r["causal"], r["batch"], r["heads"]),
                      []).append(r)
  for (mode, dtype, d, causal, b, h), group in sorted(groups.items()):
    lens = sorted({r["seq_len"] for r in group})
    if len(lens) < 2:
      continue
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl in sorted({r["impl"] for r in group}):
      pts = sorted((r["seq_len"], r) for r in group if r["impl"] == impl)
      xs = [p[0] for p in pts]
      med = np.array([p[1]["time_median_s"] for p in pts]) * 1e3
      lo = med - np.array([p[1]["time_min_s"] for p in pts]) * 1e3
      hi = np.array([p[1]["time_max_s"] for p in pts]) * 1e3 - med
      ax_t.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=impl)
      mem = [(x, p["temp_bytes"]) for x, p in pts if p.get("temp_bytes")]
      if mem:
        ax_m.plot([m[0] for m in mem], [m[1] / 2 ** 20 for m in mem], marker="o", label=impl)
    for ax, ylabel in ((ax_t, "time per call [ms] (median, min–max)"),
                       (ax_m, "compiled temp memory [MiB]")):
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("sequence length T")
      ax.set_ylabel(ylabel)
      ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"attention {mode}, {dtype}, B={b} H={h} D={d}, "
                 f"{'causal' if causal else 'non-causal'}")
    fig.tight_layout()
    name = f"kernels_{mode}_{dtype}_b{b}_h{h}_d{d}_{'causal' if causal else 'full'}.png"
    reporting.save_figure(fig, os.path.join(workdir, name))
    written.append(name)
  additive = [r for r in rows if r["suite"] == "additive" and r.get("temp_bytes")]
  if len({r["seq_len"] for r in additive}) >= 2:
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for impl in sorted({r["impl"] for r in additive}):
      pts = sorted((r["seq_len"], r["temp_bytes"]) for r in additive if r["impl"] == impl)
      ax.plot([p[0] for p in pts], [p[1] / 2 ** 20 for p in pts], marker="o", label=impl)
    t0 = min(r["seq_len"] for r in additive)
    c0 = [r for r in additive if r["impl"] == "additive_chunked" and r["seq_len"] == t0]
    if c0:
      ts = np.array(sorted({r["seq_len"] for r in additive}))
      ax.plot(ts, c0[0]["temp_bytes"] / 2 ** 20 * (ts / t0) ** 2, "k:", label="∝ T² (Tq·Tk)")
    r0 = additive[0]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (Tq = Tk)")
    ax.set_ylabel("compiled temp memory, fwd+bwd [MiB]")
    ax.set_title(f"additive attention, B={r0['batch']}, a={r0['attention_dim']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    reporting.save_figure(fig, os.path.join(workdir, "additive_memory.png"))
    written.append("additive_memory.png")
  return written


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}")
  settings = settings_from_flags()
  try:
    common.check_output_dir("workdir", FLAGS.workdir)
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with workdir_lock.WorkdirLock(FLAGS.workdir, log=print):
      _measure(settings)
  except ValueError as e:
    _fail(str(e))
  except OSError as e:  # a full disk: the rows measured so far are on disk
    _fail(f"{FLAGS.workdir}: {e.strerror or e} ({e.filename or 'while writing'})")


def _end_last_line(path: str) -> None:
  """Ends a row cut by a kill or a full disk with a newline, so that the rows
  appended next start on their own line (readers skip the cut one)."""
  with open(path, "ab+") as f:
    if f.seek(0, os.SEEK_END) and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
      f.write(b"\n")


def _measure(settings: Settings) -> None:
  """Runs the suites; appends each row to benchmark.jsonl as it is measured.

  benchmark.jsonl only grows: each row carries the `run` it belongs to (start
  time and PID), so a killed or crashed run loses nothing measured, before or
  by it. benchmark.md and the plots show this run's rows and are replaced
  atomically at the end.
  """
  machine = bm.machine_description()
  logging.info("machine: %s", machine)
  path = os.path.join(FLAGS.workdir, "benchmark.jsonl")
  run_id = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}/{os.getpid()}"
  rows: list[dict] = []
  _end_last_line(path)
  with open(path, "a", encoding="utf-8") as f:

    def write(row):
      row = {**row, **{k: machine[k] for k in ("platform", "device_kind", "cpu", "cpu_cores")},
             # Other processes' load shows here (this process adds up to its
             # own thread count while it measures).
             "loadavg_1m": os.getloadavg()[0], "run": run_id}
      rows.append(row)
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())
      shown = row.get("time_median_s")
      print(f"[{row['suite']}] {row['impl']:>22} "
            + " ".join(f"{k}={row[k]}" for k in ("mode", "dtype", "batch", "heads", "seq_len",
                                                 "head_dim", "causal", "model") if k in row)
            + f"  {row['status']}" + (f"  {_fmt_time(shown)}" if shown else "")
            + (f"  ({row['reason'][:120]})" if row.get("reason") and row["status"] != "ok" else ""),
            flush=True)

    for suite in settings.suites:
      {"kernels": run_kernels_suite, "additive": run_additive_suite,
       "models": run_models_suite}[suite](settings, write)
  checkpoints.atomic_write(os.path.join(FLAGS.workdir, "benchmark.md"),
                           markdown_tables(rows, machine))
  for name in plot(rows, FLAGS.workdir):
    print(f"wrote {os.path.join(FLAGS.workdir, name)}")
  print(f"appended {len(rows)} rows (run {run_id}) to {path}; wrote benchmark.md")


if __name__ == "__main__":
  app.run(main)
