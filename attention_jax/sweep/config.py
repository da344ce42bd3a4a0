"""Experiment configuration: one frozen dataclass and the named presets.

`ExperimentConfig` holds every knob of a training run or an ablation sweep;
the absl drivers in `experiments/` expose each field as a flag of the same
name, start from a preset, and let explicitly given flags override it.
`ExperimentConfig.point(arm)` groups the fields of one sweep point by concern
(`run_config.RunConfig`) for the trainer; its model config is the model
family's own (`models.Seq2SeqConfig`, `models.TransformerConfig`), made from
the flags in one step (`ExperimentConfig.model_config`), which also checks
them: a model setting is validated by its model config alone, and its error
names the flag.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from typing import Any

import jax.numpy as jnp

from attention_jax import models
from attention_jax import registry
from attention_jax.data import input_pipeline
from attention_jax.sweep import presets
from attention_jax.training import run_config
from attention_jax.training.run_config import Arm  # the sweep's points: here for its callers

ARMS = registry.ARMS  # every score of the registry, and the RNN decoders without attention
MODELS = ("rnn", "transformer")
DTYPES = ("float32", "bfloat16")
SCHEDULES = ("constant", "cosine")


MAX_LEARNING_RATE = 1.0
# The optimiser holds the rate in float32: below its smallest normal number a
# rate is subnormal or rounds to 0 (`--learning_rate=1e-300` trained nothing
# and wrote a BLEU).
MIN_LEARNING_RATE = float(jnp.finfo(jnp.float32).tiny)
# A memory budget above this (1 PiB) is no machine's; its byte count, made an
# integer, overflowed (1e300 GiB is an infinite float).
MAX_EVAL_MEMORY_GB = 2.0**20


FAMILIES = {"rnn": "the RNN Seq2Seq (--model=rnn)",
            "transformer": "the Transformer (--model=transformer)"}


def flag_field(default, help_text: str, family: str | None = None,
               changes_numbers: bool = True):
  """A config field with its flag help, the model family it applies to
  (None: both; a flag of the other family is refused, `check_family`), and
  whether it changes a run's numbers: one that does not (`changes_numbers=
  False`, listed by `NO_NUMBERS`) is left out of a run's identity, so a run
  resumes under another value (`workdir.RESUMABLE_FIELDS`), and cannot be a
  `--sweep` axis, whose points would be the same runs (`UNSWEEPABLE`)."""
  return dataclasses.field(default=default, metadata={
      "help": help_text, "family": family, "changes_numbers": changes_numbers})


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Every knob of a run or a sweep; each field is a flag of the same name
  (`experiments/common.py`), its help in the field's metadata."""

  # --- what to sweep ---
  arms: tuple[str, ...] = flag_field(
      ("additive", "multiplicative", "scaled_multiplicative"),
      "attention score functions (registry.SCORES; 'none_init'/'none_concat' = RNN "
      "without attention)")
  dims: tuple[int, ...] = flag_field(
      (128, 256, 512, 1024), "attention dimensionalities a (size of W_1 h and W_2 s)")
  seeds: int = flag_field(4, "runs per (arm, dim), trained together as one program")
  members: str = flag_field(
      "", "FIELD=V1,V2,...: train every seed at each value of FIELD (learning_rate) as "
      "members of the one program of each (arm, dim), e.g. "
      "--members=learning_rate=1e-4,3e-4,1e-3; the rows of a --sweep grid from one "
      "compilation per (arm, dim); replaces --FIELD")
  # Changes no number: it only drops runs from the sweep (a run it keeps is the
  # same run as without it; `Plan` jobs, tested).
  additive_max_dim: int = flag_field(
      0, "largest dimension at which an arm whose score forms a block per query-key "
      "pair runs (registry `pair_block`: additive; 0 = all of --dims): per query it "
      "evaluates a tanh of a values for every key", changes_numbers=False)
  # Changes no number of a run: it chooses what the significance tables compare,
  # and a cached test records the digest of both runs' translations, so another
  # baseline is computed afresh, never read from the cache (tested).
  baseline: str = flag_field(
      "", "arm every other arm is tested against at the same dimension ('' = additive "
      "when swept, else the first arm)", changes_numbers=False)
  # --- model ---
  model: str = flag_field("rnn", "'rnn' (Britz Seq2Seq, Luong-style decoder) or 'transformer'")
  cell: str = flag_field("gru", "RNN cell: 'gru' or 'lstm'", family="rnn")
  embed_dim: int = flag_field(512, "token embedding size", family="rnn")
  hidden_dim: int = flag_field(512, "RNN hidden size per direction (Transformer: d_model)")
  encoder_layers: int = flag_field(
      1, "RNN: bidirectional encoder layers; Transformer: N encoder layers")
  decoder_layers: int = flag_field(2, "RNN decoder layers; Transformer: N decoder layers")
  num_heads: int = flag_field(8, "Transformer heads", family="transformer")
  ff_dim: int = flag_field(2048, "Transformer d_ff", family="transformer")
  dropout: float = flag_field(0.2, "dropout on RNN cell inputs / Transformer sub-layers")
  layer_norm: str = flag_field(
      "post", "Transformer LayerNorm placement: 'post' (LayerNorm(x + Sublayer(x)), the "
      "paper) or 'pre' (x + Sublayer(LayerNorm(x)))", family="transformer")
  qk_init: str = flag_field(
      "glorot", "Transformer init of the query/key projections W_Q, W_K of every attention: "
      "'glorot' (Glorot uniform as every projection: q, k shrink as d_k grows), 'premise' "
      "(LeCun normal, variance 1/fan_in: q, k coordinates of variance ~1 at any d_k on "
      "LayerNorm outputs, the premise of Vaswani et al.'s footnote 4) or 'zero_query' "
      "(W_Q zeros, every logit 0 at step 0; W_K LeCun normal)", family="transformer")
  dtype: str = flag_field("float32", "compute dtype ('bfloat16' keeps float32 params and softmax)")
  # --- data ---
  dataset: str = flag_field("bible_en_es", "name understood by attention_jax.data.input_pipeline.load")
  # Changes no number: the same dataset, vocabulary size and length limit are
  # prepared to the same examples and tokenizer in any folder (tested).
  data_dir: str = flag_field("", "prepared-data folder ('' = the default cache folder)",
                             changes_numbers=False)
  vocab_size: int = flag_field(8000, "joint SentencePiece vocabulary (ignored by synthetic tasks)")
  max_length: int = flag_field(64, "drop training pairs longer than this many tokens")
  batch_size: int = flag_field(64, "sentences per batch (all seeds see the same batches)")
  data_seed: int = flag_field(0, "shuffling seed of the training stream, shared by all seeds")
  # --- optimisation ---
  steps: int = flag_field(20000, "training steps per run")
  learning_rate: float = flag_field(1e-3, "Adam peak learning rate")
  adam_b2: float = flag_field(0.999, "Adam beta_2 (Vaswani et al. 2017: 0.98)")
  schedule: str = flag_field(
      "constant", "'constant' (after warm-up) or 'cosine' decay to 10% at the end")
  warmup_steps: int = flag_field(0, "linear warm-up steps")
  clip_norm: float = flag_field(5.0, "global gradient-norm clipping (Britz: 5)")
  label_smoothing: float = flag_field(0.0, "label-smoothing mass")
  # --- evaluation and bookkeeping ---
  beam_size: int = flag_field(10, "beam width of the final test BLEU (1 = greedy)")
  val_beam_size: int = flag_field(0, "beam width of in-training validation BLEU (0 = beam_size)")
  length_penalty: float = flag_field(0.6, "GNMT length-penalty alpha")
  eval_every: int = flag_field(2000, "steps between validation-BLEU evaluations (best one is kept)")
  # Changes no BLEU and no translation: it only groups sentences (chosen to fit
  # the memory). The perplexity's sums over other groupings differ by float32
  # rounding (about 2e-7 relative, tested), mostly below the 6 digits logged.
  eval_batch_size: int = flag_field(
      256, "largest number of sentences per evaluation batch (perplexity and decoding); "
      "smaller where a batch would not fit in --eval_memory_gb", changes_numbers=False)
  # Changes no more than `eval_batch_size` (above) does: it only bounds it.
  eval_memory_gb: float = flag_field(
      0.0, "memory one evaluation program may use, GiB (0 = half the accelerator's own "
      "memory, on the CPU half the memory available when the run starts; shared by the "
      "--workers)", changes_numbers=False)
  eval_examples: int = flag_field(0, "validation sentences used during training (0 = all)")
  test_examples: int = flag_field(0, "test sentences for the final BLEU (0 = all)")
  diag_every: int = flag_field(200, "steps between softmax diagnostics (K)")
  checkpoint_every: int = flag_field(1000, "steps between Orbax checkpoints")
  # Bookkeeping, changing no number: progress lines, the time budget (a paused
  # run resumes from its checkpoint with an uninterrupted run's numbers) and
  # how many runs train at once.
  log_every: int = flag_field(100, "steps between progress lines", changes_numbers=False)
  max_minutes: float = flag_field(
      0.0, "stop cleanly after this long (checkpointed; re-run resumes); 0 = no limit",
      changes_numbers=False)
  workers: int = flag_field(1, "(arm, dim) pairs trained at once, one process each: on a CPU "
                            "one core each, on a host of several GPUs an equal group of its "
                            "GPUs each", changes_numbers=False)

  def __post_init__(self):
    _choices("arms", self.arms, ARMS, many=True)
    _choices("model", self.model, MODELS)
    # The flags' own spellings; every other model setting is checked by the
    # model config it makes (`model_config`, at the end).
    _choices("dtype", self.dtype, DTYPES)
    _choices("layer_norm", self.layer_norm, ("post", "pre"))
    _choices("schedule", self.schedule, SCHEDULES)
    _choices("dataset", self.dataset, input_pipeline.NAMES)
    if not self.arms:
      raise ValueError("`arms` must name at least one arm.")
    if not self.dims or any(int(d) <= 0 for d in self.dims):
      raise ValueError(f"`dims` must be positive integers, got {self.dims!r}.")
    if len(set(self.arms)) != len(self.arms) or len(set(self.dims)) != len(self.dims):
      raise ValueError(f"`arms` and `dims` must not repeat values: {self.arms!r}, {self.dims!r}.")
    for name in ("seeds", "vocab_size", "max_length", "batch_size", "eval_batch_size", "steps",
                 "beam_size", "eval_every", "diag_every", "checkpoint_every", "log_every",
                 "workers"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
    for name in ("warmup_steps", "val_beam_size", "eval_examples", "test_examples",
                 "max_minutes", "eval_memory_gb", "additive_max_dim"):
      if getattr(self, name) < 0:
        raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)!r}.")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"`label_smoothing` must be in [0, 1), got {self.label_smoothing!r}.")
    for name in ("learning_rate", "clip_norm", "length_penalty", "max_minutes",
                 "label_smoothing", "adam_b2", "eval_memory_gb"):
      if not math.isfinite(getattr(self, name)):
        raise ValueError(f"`{name}` must be a finite number, got {getattr(self, name)!r}.")
    # Adam's step is ~learning_rate per parameter whatever the gradient: above
    # MAX_LEARNING_RATE every weight moves by O(1) per step and training cannot
    # converge (lr 1e4 trained the smoke model to a loss of ~1.3e5).
    if not 0 < self.learning_rate <= MAX_LEARNING_RATE:
      raise ValueError(f"`learning_rate` must be in (0, {MAX_LEARNING_RATE}], "
                       f"got {self.learning_rate!r}.")
    if self.learning_rate < MIN_LEARNING_RATE:
      raise ValueError(f"`learning_rate` {self.learning_rate!r} is below float32's smallest "
                       f"normal number ({MIN_LEARNING_RATE:.4g}): in float32 it is 0 or "
                       "subnormal, and training would not move.")
    if self.eval_memory_gb > MAX_EVAL_MEMORY_GB:
      raise ValueError(f"`eval_memory_gb` must be at most {MAX_EVAL_MEMORY_GB:,.0f} (1 PiB), "
                       f"got {self.eval_memory_gb!r}.")
    if not 0.0 <= self.adam_b2 < 1.0:
      raise ValueError(f"`adam_b2` must be in [0, 1), got {self.adam_b2!r}.")
    if self.clip_norm <= 0:
      raise ValueError(f"`clip_norm` must be > 0, got {self.clip_norm!r}.")
    # One arm has nothing to be compared with: a preset's baseline does not
    # stand in the way of a single run (`experiments.train --arm=dot`).
    if self.baseline and len(self.arms) > 1 and self.baseline not in self.arms:
      raise ValueError(f"`baseline` {self.baseline!r} is not one of `arms` {self.arms!r}.")
    if self.warmup_steps and self.warmup_steps >= self.steps:
      raise ValueError(
          f"`warmup_steps` = {self.warmup_steps} is not below `steps` = {self.steps}: the "
          "learning rate would never reach its peak, and the run would measure warm-up "
          "only; lower --warmup_steps or raise --steps.")
    if self.model == "transformer" and set(self.arms) & set(registry.NO_ATTENTION_ARMS):
      raise ValueError(f"arms {registry.NO_ATTENTION_ARMS} exist only for `model=rnn`.")
    if self.members:
      self._take_members()
    # The model settings, checked once: by the model config of every arm and dim.
    for arm in self.arms:
      for dim in self.dims:
        self.model_config(Arm.of(arm, dim))

  def _take_members(self) -> None:
    """Checks `members` (`parse_members`; every value must make a valid run,
    as a `--sweep` grid's points must) and spells it one way, so that a run
    folder records the same members however they were written; each member
    field holds its first value, so that the config names a value it trains."""
    name, values = parse_members(self.members)
    for value in values:
      try:
        self.replace(members="", **{name: value})
      except ValueError as e:
        raise ValueError(f"`--members` {name}={value!r}: {e}") from None
    # A frozen dataclass: its own check may set a field's canonical form.
    object.__setattr__(self, "members", f"{name}=" + ",".join(map(repr, values)))
    object.__setattr__(self, name, values[0])

  def member_axes(self) -> run_config.MemberAxes:
    """The `members` as (field, values) pairs, as the trainer takes them
    (`run_config.RunConfig.member_axes`); () for a run of seeds only."""
    return (parse_members(self.members),) if self.members else ()

  def run_members(self) -> tuple[run_config.Member, ...]:
    """The members of each of the sweep's runs, in the trainer's order."""
    return run_config.members(range(self.seeds), self.member_axes())

  def sweep(self) -> tuple[Arm, ...]:
    """Every (arm, dim) point, arms outer, in the order of `arms` and `dims`
    (an arm with a per-pair block, additive, only up to `additive_max_dim`)."""
    return tuple(Arm.of(arm, dim) for arm in self.arms for dim in self.dims
                 if self.runs(arm, dim))

  def runs(self, arm: str, dim: int) -> bool:
    """Whether the sweep trains `arm` at `dim`: `additive_max_dim` caps the
    scores with a per-pair block (`registry.Score.pair_block`: additive)."""
    spec = registry.SCORES.get(arm)  # None: an arm without attention
    capped = spec is not None and spec.pair_block and self.additive_max_dim
    return not (capped and dim > self.additive_max_dim)

  def model_config(self, arm: Arm) -> run_config.ModelConfig:
    """The model config of `arm` in the family `model`, the family's own
    (`models.Seq2SeqConfig`, `models.TransformerConfig`), made from the flags
    here and nowhere else. Where a model field has another name than its flag
    (`MODEL_FIELDS`) it is set from the flag here, and the model config's own
    checks, the only ones of these settings, are reported naming the flag
    (`_flag_error`).

    The longest trained sequence, `max_length` + 1 (+ <eos>), is the length
    a `needs_length` score (qk_norm) takes its initial values from; the
    vocabulary (the flag's size until then) and the lengths the data sizes
    are set when the model is built for its data (`run_config.for_data`).
    An RNN decoder without attention keeps the model's default score and
    dimension, which it does not use."""
    shared = dict(vocab_size=self.vocab_size, encoder_layers=self.encoder_layers,
                  dropout=self.dropout, dtype=_DTYPE_OF[self.dtype],
                  param_dtype=jnp.float32)
    trained_length = self.max_length + 1
    try:
      if self.model == "rnn":
        attention = dict(decoder=arm.decoder)
        if arm.has_attention:
          attention.update(score=arm.score, attention_dim=arm.attention_dim)
          if registry.get(arm.score).needs_length:
            attention["max_source_length"] = trained_length
        return models.Seq2SeqConfig(
            embed_dim=self.embed_dim, hidden_dim=self.hidden_dim, bidirectional=True,
            decoder_layers=self.decoder_layers, cell=self.cell, **attention, **shared)
      return models.TransformerConfig(
          num_layers=self.decoder_layers, d_model=self.hidden_dim, num_heads=self.num_heads,
          d_ff=self.ff_dim, score=arm.score, attention_dim=arm.attention_dim,
          pre_layer_norm=self.layer_norm == "pre", qk_init=self.qk_init,
          max_length=trained_length, **shared)
    except ValueError as e:
      raise _flag_error(self.model, arm, e) from None

  def point(self, arm: Arm) -> run_config.RunConfig:
    """The settings of the sweep point `arm`, grouped by concern: what the
    trainer receives. The model is the family's own config (`model_config`);
    each other concern takes the flat fields of its own names."""
    take = lambda kind: kind(**{f.name: getattr(self, f.name) for f in dataclasses.fields(kind)})
    return run_config.RunConfig(
        arm=arm, model=self.model_config(arm), data=take(run_config.DataConfig),
        optimizer=take(run_config.OptimizerConfig), evaluation=take(run_config.EvalConfig),
        periods=take(run_config.Periods), seeds=self.seeds, workers=self.workers,
        member_axes=self.member_axes())

  def replace(self, **changes) -> "ExperimentConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# The flags whose model-config field has another name, by family: the one
# place they are renamed (`ExperimentConfig.model_config`); every other model
# field the flags set has its flag's name.
MODEL_FIELDS = {
    "rnn": {},
    "transformer": {"d_model": "hidden_dim", "num_layers": "decoder_layers", "d_ff": "ff_dim",
                    "pre_layer_norm": "layer_norm"},
}
_DTYPE_OF = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _flag_error(model: str, arm: Arm, error: ValueError) -> ValueError:
  """The model config's refusal `error` as one line naming the flags: each
  model field it names in backticks is written as its flag (`MODEL_FIELDS`),
  and the arm it was building is named."""
  message = str(error)
  for field, flag in MODEL_FIELDS[model].items():
    message = message.replace(f"`{field}`", f"`{flag}`")
  return ValueError(f"--model={model}, arm {arm.label}: {message}")


def check_family(model: str, given) -> None:
  """Raises a ValueError naming the first field in `given` (names set
  explicitly) that does not apply to the model family `model`."""
  for field in dataclasses.fields(ExperimentConfig):
    family = field.metadata.get("family")
    if field.name in given and family is not None and family != model:
      raise ValueError(f"`{field.name}` applies only to {FAMILIES[family]}, not to "
                       f"--model={model}; leave it out.")


# Fields that change no run's numbers, as `flag_field` marks them (each says why
# where it is defined): the one list a run's identity leaves out
# (`workdir.RESUMABLE_FIELDS`: a run resumes under any value of these) and
# `--sweep` refuses (`UNSWEEPABLE`).
NO_NUMBERS = tuple(f.name for f in dataclasses.fields(ExperimentConfig)
                   if not f.metadata["changes_numbers"])

# Fields that cannot be a `--sweep` axis: `arms` and `dims` are the sweep's
# own axes, and the rest do not change a run's numbers (each point would
# train the same runs again).
UNSWEEPABLE = ("arms", "dims") + NO_NUMBERS


def parse_axis(text: str) -> tuple[str, tuple]:
  """`'learning_rate=3e-4,1e-3'` -> `('learning_rate', (0.0003, 0.001))`, each
  value cast to the field's type; a ValueError naming the field otherwise."""
  name, sep, listed = text.partition("=")
  name = name.strip()
  fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
  if not sep or not name:
    raise ValueError(f"`--sweep` takes FIELD=V1,V2,...; got {text!r}.")
  if name not in fields:
    raise ValueError(f"`--sweep` names {name!r}, which is not a config field; fields: "
                     f"{', '.join(sorted(fields - set(UNSWEEPABLE)))}.")
  if name in UNSWEEPABLE:
    raise ValueError(f"`--sweep` cannot vary `{name}`"
                     + (f"; use --{name}." if name in ("arms", "dims") else
                        ": it does not change a run's numbers."))
  if name == "members":
    raise ValueError("`--sweep` cannot vary `members`; give --members once.")
  return name, _values("--sweep", name, listed, typing.get_type_hints(ExperimentConfig)[name])


def _values(flag: str, name: str, listed: str, kind: type) -> tuple:
  """The comma-separated `listed` values of field `name` given to `flag`, each
  a `kind`: at least one, none twice; a ValueError naming the flag otherwise."""
  values = []
  for item in (v.strip() for v in listed.split(",")):
    if not item:
      continue
    try:
      values.append(kind(item))
    except ValueError:
      raise ValueError(f"`{flag}` {name}: {item!r} is not a {kind.__name__}.") from None
    if "/" in item or "=" in item:
      raise ValueError(f"`{flag}` {name}: {item!r} cannot name a folder.")
  if not values:
    raise ValueError(f"`{flag}` {name} has no values.")
  if len(set(values)) != len(values):
    raise ValueError(f"`{flag}` {name} repeats a value: {listed!r}.")
  return tuple(values)


def parse_members(text: str) -> tuple[str, tuple[float, ...]]:
  """`'learning_rate=1e-4,3e-4'` -> `('learning_rate', (0.0001, 0.0003))`: the
  `--members` flag, whose values each member of a run takes with every seed
  (`run_config.members`). A ValueError naming the flag for a field that is
  no number, or one whose members could not share one compiled program
  (`run_config.MEMBER_FIELDS`: a shape, such as `batch_size`, or a schedule's
  boundary, is part of the program), or for no values or a value twice."""
  name, sep, listed = text.partition("=")
  name = name.strip()
  hints = typing.get_type_hints(ExperimentConfig)
  allowed = ", ".join(run_config.MEMBER_FIELDS)
  if not sep or not name:
    raise ValueError(f"`--members` takes FIELD=V1,V2,... (FIELD one of: {allowed}); "
                     f"got {text!r}.")
  if name not in hints:
    raise ValueError(f"`--members` names {name!r}, which is not a config field; member "
                     f"fields: {allowed}.")
  if hints[name] not in (int, float):
    raise ValueError(f"`--members` names `{name}`, which is not a number field; member "
                     f"fields: {allowed}.")
  if name not in run_config.MEMBER_FIELDS:
    raise ValueError(f"`--members` cannot vary `{name}`: the members of a run share one "
                     f"compiled program, and only {allowed} can differ inside it; use "
                     f"--sweep={name}=... for a grid of separate runs.")
  return name, tuple(float(v) for v in _values("--members", name, listed, hints[name]))


@dataclasses.dataclass(frozen=True)
class GridPoint:
  """One point of a `--sweep` grid: the swept values and the config they give."""
  values: dict[str, Any]
  config: ExperimentConfig

  @property
  def name(self) -> str:
    """Its folder under the workdir, e.g. 'learning_rate=0.0003,batch_size=32'."""
    return ",".join(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in self.values.items())


def grid(cfg: ExperimentConfig, axes: tuple[tuple[str, tuple], ...]) -> tuple[GridPoint, ...]:
  """Every combination of the `axes` (`parse_axis` results; the first varies
  slowest), each checked by building its config: a ValueError names the field."""
  names = [name for name, _ in axes]
  if len(set(names)) != len(names):
    raise ValueError(f"`--sweep` names a field twice: {names}.")
  if axes and cfg.members:
    raise ValueError("`--members` and `--sweep` cannot be combined (a grid point is a "
                     "workdir of its own); give the --sweep values a --workdir each.")
  check_family(cfg.model, names)
  points = []
  for combo in itertools.product(*(values for _, values in axes)):
    values = dict(zip(names, combo))
    points.append(GridPoint(values, cfg.replace(**values)))
  return tuple(points)


def _choices(name, value, allowed, many=False):
  values = value if many else (value,)
  for v in values:
    if v not in allowed:
      raise ValueError(f"`{name}` got {v!r}; allowed values: {', '.join(allowed)}.")


# Presets: field overrides on top of the dataclass defaults, one file each
# under `presets/` with its command, time and expected result.
PRESETS: dict[str, dict[str, Any]] = dict(presets.ALL)
# Preset name -> the module that holds it (its docstring: command, time, result).
PRESET_MODULES: dict[str, str] = {module.__name__.rsplit(".", 1)[-1]: module.__name__
                                  for module in presets.MODULES}


def add_presets(modules) -> None:
  """Adds each of `modules` (a study's preset files, each with `OVERRIDES`)
  as the preset named after its module. A name another module already holds
  raises ValueError naming both: a preset name means one configuration."""
  for module in modules:
    name = module.__name__.rsplit(".", 1)[-1]
    if PRESET_MODULES.get(name, module.__name__) != module.__name__:
      raise ValueError(f"preset {name!r} is defined twice: in {PRESET_MODULES[name]} "
                       f"and in {module.__name__}; rename one.")
    PRESETS[name] = module.OVERRIDES
    PRESET_MODULES[name] = module.__name__


def from_preset(name: str, **overrides) -> ExperimentConfig:
  if name not in PRESETS:
    raise ValueError(f"`preset` got {name!r}; allowed values: {', '.join(PRESETS)}.")
  return ExperimentConfig(**{**PRESETS[name], **overrides})


def members_conflict(given: dict) -> str | None:
  """One line where a field is given both plainly and in `--members` (as
  `--sweep` refuses it: the members' values would silently replace the
  flag's); None otherwise."""
  if not given.get("members"):
    return None
  name, _ = parse_members(given["members"])
  if name in given:
    return f"`{name}` is given both as --{name} and in --members; give one."
  return None
