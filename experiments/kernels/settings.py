"""Every knob of the benchmark in one frozen `Settings`, and the presets.

A preset is a complete `Settings`; a command line starts from one and
replaces the fields it names (`experiments/kernels/run.py`). Each field is
the flag of its name, made from the field's type and help metadata
(`common.define_field_flags`, as the ablation's from `ExperimentConfig`), so
an invalid value raises a ValueError that names the flag (`--seq_lens`, ...),
whether it came from a flag or from code.

Glossary (kernel suite): B batch, H heads, T sequence length (Tq = Tk),
D head size; (additive suite) a attention size.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from attention_jax import registry
from experiments import common

SUITES = ("kernels", "additive", "models")
# The library's attention, one implementation per pure score function;
# scaled_dot first, as the tables compare the others to it, then the rest in
# the registry's order.
LIBRARY_SCORES = tuple(dict.fromkeys(("scaled_dot",) + registry.FUNCTION_SCORES))
IMPLS = LIBRARY_SCORES + ("scaled_dot_bthd", "scaled_dot_plain", "scaled_dot_blockwise",
                          "naive", "jax_xla", "jax_cudnn", "nnx", "torch")
MODES = ("fwd", "fwd_bwd")
DTYPES = ("float32", "bfloat16", "float16")
LIBRARY_IMPLEMENTATIONS = ("auto", "plain", "xla", "cudnn", "blockwise")
MODEL_NAMES = ("rnn_seq2seq", "transformer")
MODEL_SIZES = ("tiny", "small", "base")


def _setting(help_text: str, default: Any = dataclasses.MISSING,
             choices: tuple | None = None):
  """A `Settings` field with the help of its flag (`common.define_field_flags`),
  `choices` making the flag an enum; no default: every preset sets it."""
  metadata = {"help": help_text, **({"choices": choices} if choices else {})}
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """What to measure and how. Fields without a default are set by every preset;
  each field is a flag of the same name, its help in the field's metadata."""
  # Which suites run, in this order.
  suite: tuple[str, ...] = _setting(f"Comma-separated suites from {SUITES}.")
  # Kernel suite: the implementations and the sweep (every combination).
  impls: tuple[str, ...] = _setting(
      f"Kernel-suite implementations from {IMPLS}: the library's attention per score "
      "(`implementation=--library_implementation`), scaled_dot_bthd (scaled_dot on "
      "[B, T, H, D] data, the head axis swapped in as the layers do), scaled_dot_plain / "
      "scaled_dot_blockwise (the library's two CPU paths), naive (float32 einsum "
      "reference), jax.nn.dot_product_attention (jax_xla, jax_cudnn: GPU, half "
      "precision), flax.nnx.dot_product_attention (nnx) and PyTorch's "
      "scaled_dot_product_attention on CPU (torch).")
  seq_lens: tuple[int, ...] = _setting("Comma-separated sequence lengths T (Tq = Tk).")
  head_dims: tuple[int, ...] = _setting("Comma-separated head sizes D.")
  heads: tuple[int, ...] = _setting("Comma-separated head counts H.")
  batch: tuple[int, ...] = _setting("Comma-separated batch sizes B.")
  causal: tuple[bool, ...] = _setting("Comma-separated booleans (false,true).")
  dtypes: tuple[str, ...] = _setting(f"Comma-separated input dtypes from {DTYPES}.")
  modes: tuple[str, ...] = _setting(f"Comma-separated from {MODES}.")
  library_implementation: str = _setting(
      "`implementation` argument of the library's attention for the per-score impls, one "
      f"of {LIBRARY_IMPLEMENTATIONS}.", "auto")
  additive_max_len: int = _setting("Kernel suite: longest T for a score with a block per "
                                   "query-key pair (registry `pair_block`: `additive`, whose "
                                   "[B, H, T, T, D] tanh work grows fastest).")
  peak_tflops: float | None = _setting(
      "Dense peak TFLOP/s for %-of-peak where the built-in table has no entry (e.g. CPUs).",
      None)
  # Timing (every suite).
  repeats: int = _setting("Timed calls per measurement (at most; see --time_budget_s).")
  warmup: int = _setting("Discarded calls before timing.")
  time_budget_s: float = _setting(
      "Fewer repeats (but at least 3) when one round of calls (every implementation once) "
      "takes longer than this budget divided by --repeats.", 30.0)
  max_other_load: float | None = _setting(
      "Retry a case's timing when other processes kept more than this many cores busy "
      "during it (CPU contention on shared machines; Linux only). The row records the "
      "load of the attempt kept.", None)
  device_timing: bool = _setting(
      "Kernel suite: also time each JAX program from the profiler's trace "
      "(`measure.device_time`: per call, the device's first event to its last), beside the "
      "host clock, which counts dispatch too.", False)
  load_retries: int = _setting("Retries per case under --max_other_load.", 4)
  load_retry_pause_s: float = _setting("Pause before such a retry.", 15.0)
  memory_limit_gb: float | None = _setting(
      "Skip a program whose compiled memory exceeds this; default: 90% of the "
      "accelerator's memory, or half the available RAM on CPU.", None)
  seed: int = _setting("PRNG seed of the random inputs.", 0)
  # Additive suite: B, a, the lengths T compiled, and up to which T they are timed.
  additive_batch: int = _setting("Additive suite: batch B.")
  additive_dim: int = _setting("Additive suite: attention size a (dq = dk = dv = 64).")
  additive_seq_lens: tuple[int, ...] = _setting(
      "Additive suite: lengths T for the memory curve.")
  additive_time_max_len: int = _setting(
      "Additive suite: time (not only compile) the programs up to this length.")
  # Models suite.
  models: tuple[str, ...] = _setting(f"Models suite: which models, from {MODEL_NAMES}.",
                                     MODEL_NAMES)
  model_size: str = _setting(
      "Models suite: base = Britz-base RNN / Transformer-base; small and tiny shrink widths "
      "and vocabulary for CPUs and tests.", choices=MODEL_SIZES)
  model_batch: int = _setting("Models suite: sentences per batch.")
  model_seq_len: int = _setting("Models suite: source and target length.")
  model_seeds: int = _setting("Models suite: N for vmapped vs sequential seeds.")
  model_vocab: int | None = _setting(
      "Models suite: vocabulary size (default, or 0: the size's default).", None)
  model_steps: int = _setting(
      "Models suite: training steps per timed call (one compiled `lax.scan`).", 5)

  def __post_init__(self):
    for name, (allowed, minimum) in _LISTS.items():
      _check_items(name, getattr(self, name), _ITEM_TYPES[name], allowed, minimum)
    for name in ("repeats", "additive_batch", "additive_dim", "additive_time_max_len",
                 "additive_max_len", "model_batch", "model_seq_len", "model_seeds",
                 "model_steps"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`--{name}` must be a positive integer, got {value!r}.")
    if not isinstance(self.warmup, int) or self.warmup < 0:
      raise ValueError(f"`--warmup` must be >= 0, got {self.warmup!r}.")
    _check_choice("library_implementation", self.library_implementation,
                  LIBRARY_IMPLEMENTATIONS)
    _check_choice("model_size", self.model_size, MODEL_SIZES)
    if self.memory_limit_gb is not None and not self.memory_limit_gb > 0:
      raise ValueError(f"`--memory_limit_gb` must be > 0, got {self.memory_limit_gb}.")


def _check_choice(name: str, value: Any, allowed: tuple) -> None:
  if value not in allowed:
    raise ValueError(f"`--{name}` must be one of {', '.join(allowed)}; got {value!r}.")


def _check_items(name: str, items: Any, cast: Callable, allowed, minimum) -> None:
  if not isinstance(items, tuple):
    raise ValueError(f"`--{name}` must be a tuple, got {items!r}.")
  if not items:
    raise ValueError(f"`--{name}` is empty.")
  for item in items:
    if type(item) is not cast:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"`--{name}`: {item!r} is not a {cast.__name__}.")
    if allowed is not None and item not in allowed:
      raise ValueError(f"`--{name}`: {item!r} is not one of {allowed}.")
    if minimum is not None and item < minimum:
      raise ValueError(f"`--{name}`: every value must be >= {minimum}, got {item}.")


# The tuple fields: allowed values, minimum (the item type is the annotation's).
_LISTS: dict[str, tuple[tuple | None, int | None]] = {
    "suite": (SUITES, None), "impls": (IMPLS, None), "seq_lens": (None, 1),
    "head_dims": (None, 1), "heads": (None, 1), "batch": (None, 1), "causal": (None, None),
    "dtypes": (DTYPES, None), "modes": (MODES, None), "additive_seq_lens": (None, 1),
    "models": (MODEL_NAMES, None),
}
_ITEM_TYPES = {name: common.item_type(Settings, name) for name in _LISTS}


def from_preset(preset: str, **overrides) -> Settings:
  """Preset `preset` with `overrides` (field -> value; strings for tuple fields are parsed)."""
  if preset not in PRESETS:
    raise ValueError(f"`--preset` must be one of {', '.join(PRESETS)}; got {preset!r}.")
  unknown = set(overrides) - {f.name for f in dataclasses.fields(Settings)}
  if unknown:
    raise ValueError(f"unknown settings {sorted(unknown)}.")
  return dataclasses.replace(PRESETS[preset], **common.parse_fields(Settings, overrides))


PRESETS: dict[str, Settings] = {
    # Every suite's code and every implementation at toy sizes: a smoke run of seconds.
    "tiny": Settings(suite=("kernels", "additive"), impls=IMPLS, seq_lens=(16, 32),
                     head_dims=(8,), heads=(2,), batch=(1,), causal=(False, True),
                     dtypes=("float32",), modes=MODES, repeats=3, warmup=1,
                     additive_batch=2, additive_dim=16, additive_seq_lens=(8, 16),
                     additive_time_max_len=16, additive_max_len=32, model_batch=4,
                     model_seq_len=8, model_seeds=2, model_size="tiny"),
    # The README's CPU table: the target shape B = H = 8, T = 512, D = 64 and a modest sweep.
    "cpu": Settings(suite=("kernels", "additive"),
                    impls=LIBRARY_SCORES + ("scaled_dot_plain", "naive", "jax_xla", "nnx",
                                            "torch"),
                    seq_lens=(128, 256, 512, 1024), head_dims=(64,), heads=(8,), batch=(8,),
                    causal=(False,), dtypes=("float32",), modes=MODES, repeats=7, warmup=2,
                    additive_batch=32, additive_dim=1024,
                    additive_seq_lens=(16, 32, 64, 128, 256, 512), additive_time_max_len=128,
                    additive_max_len=256, model_batch=64, model_seq_len=32, model_seeds=4,
                    model_size="small"),
    # Accelerators: long sequences, both head sizes, both dtypes, causal or not.
    "gpu": Settings(suite=SUITES,
                    impls=LIBRARY_SCORES + ("scaled_dot_bthd", "naive", "jax_xla", "jax_cudnn",
                                            "nnx"),
                    seq_lens=(128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                    head_dims=(64, 128), heads=(8, 16), batch=(4,), causal=(False, True),
                    dtypes=("bfloat16", "float32"), modes=MODES, repeats=20, warmup=3,
                    additive_batch=32, additive_dim=1024,
                    additive_seq_lens=(32, 64, 128, 256, 512, 1024),
                    additive_time_max_len=1024, additive_max_len=1024, model_batch=128,
                    model_seq_len=64, model_seeds=4, model_size="base"),
    # The first GPU session's three targets in one device command (<= 7 minutes,
    # `gpu` above is 256 cases x 9 implementations, ~30): scaled_dot bf16 D = 128
    # forward+backward through the library (`auto`: cuDNN) on its [B, H, T, D]
    # arguments and on the layers' [B, T, H, D] (`scaled_dot_bthd`, added after
    # the first session), jax.nn's XLA and cuDNN kernels at T = 1k, 4k, 16k,
    # causal or not (6 cases, 24 programs plus the float32 references), then
    # Britz-base and Transformer-base
    # tokens/s with 4 seeds vmapped vs one (6 programs). Not yet timed on a GPU:
    # the 7 minutes assume <= 5 s per attention program (compile, check, 20
    # repeats within `time_budget_s`) and <= 60 s per model program (compile and
    # timing), i.e. ~2 + ~5 minutes; run it with --max_minutes so that a
    # slower machine stops between cases and the next call continues.
    "gpu_headline": Settings(suite=("kernels", "models"),
                             impls=("scaled_dot", "scaled_dot_bthd", "jax_xla", "jax_cudnn"),
                             seq_lens=(1024, 4096, 16384), head_dims=(128,), heads=(16,),
                             batch=(4,), causal=(False, True), dtypes=("bfloat16",),
                             modes=("fwd_bwd",), repeats=20, warmup=3, time_budget_s=10.0,
                             additive_batch=32, additive_dim=1024, additive_seq_lens=(256,),
                             additive_time_max_len=256, additive_max_len=1024,
                             model_batch=128, model_seq_len=64, model_seeds=4,
                             model_size="base"),
}
