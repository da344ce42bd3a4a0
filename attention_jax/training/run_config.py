"""The settings of one run, grouped by concern, and the model they build.

A run is one (arm, dim) point of a sweep (`Arm`), all its seeds. The sweep's
flat config (`attention_jax.sweep.config.ExperimentConfig`, the surface of
the flags) derives the `RunConfig` of each of its points
(`ExperimentConfig.point(arm)`), and that is all the trainer receives, so
that one run needs nothing of the sweep::

    run = cfg.point(run_config.Arm.of("additive", 8))
    model_cls, model_config = run.build_model(data)
    tx = run.optimizer.make()

The model's config is its family's own (`models.Seq2SeqConfig`,
`models.TransformerConfig`), made from the flags in one step
(`ExperimentConfig.model_config`); building the model completes it with
what the data sets (`for_data`: the vocabulary, and the lengths sized by the
data).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Mapping, Sequence, Union

import jax.numpy as jnp
import numpy as np
import optax

from attention_jax import decoding
from attention_jax import models
from attention_jax import registry
from attention_jax.data import batching

SPLITS = ("train", "validation", "test")  # what the trainer reads of a dataset


@dataclasses.dataclass(frozen=True)
class Arm:
  """One point of a sweep: an arm at one attention dimension, resolved once.

  `name` is the arm as `--arms` spells it; the rest is what it means:
  `decoder` 'luong' (attention over the encoder) or an attention-free RNN
  decoder ('none_init', 'none_concat'); `score` the registry score (None
  without attention); `attention_dim` a (the RNN's W_1 s, W_2 h size) or the
  Transformer's per-head query/key size d_k.
  """
  name: str
  decoder: str
  score: str | None
  attention_dim: int

  @classmethod
  def of(cls, name: str, dim: int) -> "Arm":
    if name in registry.NO_ATTENTION_ARMS:
      return cls(name, decoder=name, score=None, attention_dim=int(dim))
    return cls(name, decoder="luong", score=registry.get(name, "arms").name,
               attention_dim=int(dim))

  @property
  def has_attention(self) -> bool:
    return self.score is not None

  @property
  def label(self) -> str:
    """How logs name it: '<arm> d=<dim>'."""
    return f"{self.name} d={self.attention_dim}"


# A run's model config is the model family's own (`models.Seq2SeqConfig`,
# `models.TransformerConfig`), made from the flags in one place
# (`sweep.config.ExperimentConfig.model_config`). What only the data knows is
# set when the model is built (`RunConfig.build_model`): the vocabulary and
# its special tokens, and the lengths sized by the data's longest sentences.
ModelConfig = Union[models.Seq2SeqConfig, models.TransformerConfig]

# How result rows and logs name a model family, by its config's type.
FAMILIES = {models.Seq2SeqConfig: "rnn", models.TransformerConfig: "transformer"}
MODELS = {models.Seq2SeqConfig: models.Seq2Seq, models.TransformerConfig: models.Transformer}


def family(model: ModelConfig) -> str:
  """'rnn' or 'transformer': the `--model` value that makes `model`."""
  return FAMILIES[type(model)]


def for_data(model: ModelConfig, data) -> tuple[type, ModelConfig]:
  """(model class, `model` completed for `data`): the tokenizer's vocabulary
  size and special tokens, and the lengths the data sizes. The Transformer's
  position table must hold every split (`transformer_positions`); an RNN
  score with one parameter per source position (`per_position`, e.g.
  `location`) is built for the widest batch of `data` (`batch_width`):
  evaluation is not length-filtered, and sized by the training limit it
  failed at the first validation. Any other length (a `needs_length`
  score's, such as qk_norm's, in the RNN) is the trained one, set from the
  flags."""
  tok = data.tokenizer
  fields = dict(vocab_size=tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                sos_id=tok.sos_id)
  if isinstance(model, models.TransformerConfig):
    fields["max_length"] = transformer_positions(data)
  elif model.has_attention and registry.get(model.score).per_position:
    fields["max_source_length"] = batch_width(data)
  return MODELS[type(model)], dataclasses.replace(model, **fields)


def transformer_positions(data) -> int:
  """Rows of the Transformer's position table for `data`: evaluation batches
  are not length-filtered, so the longest source of the splits the trainer
  reads (train, validation, test), padded to its
  batch grid (`batching.padded_length`, + <eos>), must fit, and so must the
  longest output decoding gives that source (`decoding.output_length`)."""
  longest = max(int(data.token_ids(split)[0].lengths.max(initial=0)) for split in SPLITS)
  source = int(batching.padded_length(longest + 1))
  return max(source, decoding.output_length(None, source))


def batch_width(data) -> int:
  """The widest batch any pass over `data`'s train, validation or test split
  can give: a batch's sources and targets share one padded length
  (`batching.padded_length` of the longest of either, + <eos>), and
  evaluation passes keep sentences of every length."""
  longest = max(int(ids.lengths.max(initial=0))
                for split in SPLITS for ids in data.token_ids(split))
  return int(batching.padded_length(longest + 1))


# The floor of the cosine schedule, as a fraction of the peak learning rate.
COSINE_END = 0.1

# The fields whose values may differ between the members of one run (one
# compiled program): those the optimiser can read as data (`OptimizerConfig.
# make`). A field that sets a shape or the program's structure cannot
# (`dims`, `batch_size`, `warmup_steps`: a schedule's boundary is a Python
# number); nor, for now, `adam_b2`: as data it is rounded to float32 before
# `1 - b2` is taken (1 - 0.999 is 1.3e-5 off, relatively), so its members
# would not equal separate runs to float32 rounding.
MEMBER_FIELDS = ("learning_rate",)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """`steps` of Adam (β₂ = `adam_b2`) with global-norm clipping at `clip_norm`,
  on a label-smoothed cross entropy, at a learning rate that warms up
  linearly for `warmup_steps`, then stays or decays ('cosine') to 10%."""
  steps: int
  learning_rate: float
  adam_b2: float
  schedule: str
  warmup_steps: int
  clip_norm: float
  label_smoothing: float

  def learning_rate_schedule(self, peak=None) -> optax.Schedule:
    """Linear warm-up, then constant or cosine decay to 10% at the end.

    `peak` (a traced float32 scalar: one member's learning rate, `make`)
    stands for `learning_rate`. The schedule is then the same arithmetic on
    the same float32 values, so a member's rates equal a separate run's
    bit for bit: optax's `warmup_cosine_decay_schedule` asks `peak == 0` in
    Python, which a traced peak cannot answer, so the cosine schedule is
    built from its two pieces, its floor the constant fraction it is
    (`COSINE_END`; optax's `end / peak` is that fraction to float64
    rounding, the same float32 value).
    """
    lr = self.learning_rate if peak is None else peak
    if self.schedule == "cosine":
      decay_steps = max(self.steps, self.warmup_steps + 1)
      if peak is None:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=lr, warmup_steps=self.warmup_steps,
            decay_steps=decay_steps, end_value=COSINE_END * lr)
      return optax.join_schedules(
          [optax.linear_schedule(0.0, lr, self.warmup_steps),
           optax.cosine_decay_schedule(lr, decay_steps - self.warmup_steps, alpha=COSINE_END)],
          [self.warmup_steps])
    if self.warmup_steps:
      return optax.join_schedules(
          [optax.linear_schedule(0.0, lr, self.warmup_steps),
           optax.constant_schedule(lr)], [self.warmup_steps])
    return optax.constant_schedule(lr)

  def make(self, member_fields: Sequence[str] = ()) -> optax.GradientTransformation:
    """Adam on `learning_rate_schedule`, after global-norm clipping.

    With `member_fields` (`MEMBER_FIELDS`, e.g. `("learning_rate",)`) those
    values are the optimiser's data instead of constants
    (`optax.inject_hyperparams`): its state holds them, one value per member
    once the members' states are stacked (`with_member_values`), so that
    members of several learning rates share one compiled step. Without, the
    chain is the plain one, and a run's numbers are those it always had.
    """
    if not member_fields:
      return optax.chain(optax.clip_by_global_norm(self.clip_norm),
                         optax.adam(self.learning_rate_schedule(), b2=self.adam_b2))
    unknown = [f for f in member_fields if f not in MEMBER_FIELDS]
    if unknown:
      raise ValueError(f"`member_fields` {unknown} cannot differ between members; "
                       f"they may be: {', '.join(MEMBER_FIELDS)}.")

    def chain(learning_rate):
      return optax.chain(optax.clip_by_global_norm(self.clip_norm),
                         optax.adam(self.learning_rate_schedule(peak=learning_rate),
                                    b2=self.adam_b2))

    return optax.inject_hyperparams(chain)(learning_rate=self.learning_rate)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which data, and how the training stream batches it: `batch_size`
  sentences of at most `max_length` tokens, shuffled by `data_seed` (the
  same batches for every member)."""
  dataset: str
  data_dir: str
  vocab_size: int
  max_length: int
  batch_size: int
  data_seed: int


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Validation and test decoding: beam widths, length penalty, how many
  sentences (0 = all), and the batches' size limit and memory budget."""
  beam_size: int
  val_beam_size: int  # 0: `beam_size`
  length_penalty: float
  eval_examples: int
  test_examples: int
  eval_batch_size: int
  eval_memory_gb: float  # 0: half the accelerator's (CPU: available) memory, shared by the workers

  @property
  def validation_beam(self) -> int:
    """The beam width of in-training validation."""
    return self.val_beam_size or self.beam_size


@dataclasses.dataclass(frozen=True)
class Periods:
  """Steps between the training loop's periodic actions (each also runs
  after the last step), and the sweep's time budget."""
  log_every: int
  diag_every: int
  eval_every: int
  checkpoint_every: int
  max_minutes: float  # 0: no limit


@dataclasses.dataclass(frozen=True)
class Member:
  """One member of a run: its seed and its values of the member fields
  (`MEMBER_FIELDS`; none in a run of seeds only)."""
  seed: int
  values: tuple[tuple[str, float], ...] = ()

  @property
  def keys(self) -> dict[str, Any]:
    """How its result rows and metrics-log lines name it: `{"seed": s}`,
    and its member values (`{"seed": 0, "learning_rate": 0.001}`)."""
    return {"seed": self.seed, **dict(self.values)}

  @property
  def label(self) -> str:
    """How log lines name it: 'seed 0, learning_rate=0.001'."""
    return ", ".join([f"seed {self.seed}"] + [f"{k}={v!r}" for k, v in self.values])


MemberAxes = tuple[tuple[str, tuple[float, ...]], ...]


def members(seeds: Sequence[int], axes: MemberAxes = ()) -> tuple[Member, ...]:
  """The members of a run of `seeds` at every combination of the `axes`
  (field, values) values: values outer, the first field slowest, as a
  `--sweep` grid orders its points; each seed of a combination inner."""
  names = [name for name, _ in axes]
  return tuple(Member(int(seed), tuple(zip(names, combo)))
               for combo in itertools.product(*(values for _, values in axes))
               for seed in seeds)


def with_member_values(opt_state, values: Mapping[str, Sequence[float]]):
  """The stacked optimiser state of `OptimizerConfig.make(member_fields)`
  with each member's own values (`{field: [E] values}`, in member order):
  `init` stored the config's one value for all of them."""
  hyperparams = dict(opt_state.hyperparams)
  for name, per_member in values.items():
    like = hyperparams[name]
    column = np.asarray(per_member, like.dtype)
    if column.shape != like.shape:
      raise ValueError(f"`{name}` has {column.shape} member values for an optimiser "
                       f"state of {like.shape}.")
    hyperparams[name] = jnp.asarray(column)
  return opt_state._replace(hyperparams=hyperparams)


def member_values(opt_state, fields: Sequence[str]) -> dict[str, np.ndarray]:
  """`{field: [E] values}` the stacked optimiser state holds (a checkpoint's:
  what its members were trained with)."""
  return {name: np.asarray(opt_state.hyperparams[name]) for name in fields}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything one (arm, dim) point of a sweep is trained and evaluated
  with: `seeds` members of `model` (the family's model config, with attention
  `arm`; `build_model` completes it for the data) at each combination of the
  `member_axes` values (`members`); `workers` processes share the machine's
  memory."""
  arm: Arm
  model: ModelConfig
  data: DataConfig
  optimizer: OptimizerConfig
  evaluation: EvalConfig
  periods: Periods
  seeds: int
  workers: int
  # (field, values) of each member field (`MEMBER_FIELDS`): the `--members` flag.
  member_axes: MemberAxes = ()

  @property
  def family(self) -> str:
    """'rnn' or 'transformer' (`family`)."""
    return family(self.model)

  def build_model(self, data) -> tuple[type, ModelConfig]:
    """(model class, model config) of this run on `data` (`for_data`)."""
    return for_data(self.model, data)

  def members(self, seeds: Sequence[int] | None = None) -> tuple[Member, ...]:
    """Every member: each of `seeds` (default `range(self.seeds)`) at every
    combination of the member values (`members`)."""
    return members(range(self.seeds) if seeds is None else seeds, self.member_axes)

  @property
  def member_fields(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.member_axes)

  @property
  def num_members(self) -> int:
    """E: the members trained together, `seeds` times each combination of values."""
    return len(self.members())
