"""The footnote at initialisation: attention logits at step 0, before training.

    python -m experiments.init_logits.run --out=results/init_logits

Without `--out` it writes to `runs/init_logits` (a scratch folder, ignored by
git), never into the committed results. A bad flag or an `--out` that cannot
be a folder is one `error:` line, before any measurement.

Vaswani et al. 2017 (§3.2.1, footnote 4): if the components of q and k are
independent random variables with mean 0 and variance 1, then
q·k = Σ_i q_i k_i has mean 0 and variance d_k, so for large d_k the dot
products grow large and push the softmax into regions of tiny gradients;
hence the scores are divided by √d_k. This command checks the premise and the
consequence on the models of this repository, as they are built, on real
training batches, without a single training step.

Models (built by the sweep point's model config, `cfg.point(arm).build_model`,
and initialised as the trainer does, `Model(config, rngs=nnx.Rngs(--seed))`):
  transformer  d_model 128, 2 heads, d_ff 512, 2 encoder + 2 decoder layers
               (flags), post-LN, per-head query/key size d_k = the swept dim;
               every attention module: encoder self, decoder self (causal),
               cross, every layer.
  rnn          the quick preset's Seq2Seq: embeddings 128, one bidirectional
               GRU encoder layer 128, one GRU decoder layer 128, Luong decoder;
               attention dimension a = the swept dim; its cross attention.
Scores (arms): Transformer `dot` (unscaled), `scaled_dot`, `inverse_dim`,
`qk_norm`, `additive`; RNN `multiplicative` (unscaled),
`scaled_multiplicative`, `inverse_dim`, `qk_norm`, `additive`.

Initialisations:
  default  the model exactly as built: every projection Glorot/Xavier uniform
           (`layers.GLOROT`, variance 2 / (fan_in + fan_out), so with
           fan_out = H·d_k the query and key components shrink as d_k grows),
           zero biases.
  premise  the footnote's premise made true at step 0: in every attention
           module the query and key projection kernels are replaced by
           standard-normal draws and their biases by zeros, then each kernel
           is divided by the root mean square of its outputs on the first
           batch (valid positions, all components). That is LeCun normal
           (variance 1 / fan_in) scaled by 1 / √v_in, v_in the input's mean
           square, measured instead of assumed. The q and k components then
           have mean 0 over the draw and mean square 1; their variance over
           positions is lower, as the inputs share a common direction (e.g.
           the constant components of the positional encodings); both are
           reported. Rescaling one layer changes the inputs of the layers
           above it (and, in the RNN, the decoder states through input
           feeding), so the measure-and-divide step is repeated
           `--premise_passes` times. Nothing else changes: embeddings, value
           and output projections, FFNs, the additive score's own W_q, W_k,
           v and QKNorm's g keep their defaults.

Per (model, init, score, d_k, kind, layer), averaged over `--batches` training
batches (the trainer's first ones, `--data_seed`), with the padding masks of
source and target and the causal mask of decoder self attention, over the
query rows with at least two valid keys (a single key leaves the softmax no
choice: the first row of causal self attention):
  logit_std      std of the raw logits across the valid keys of a query row,
                 averaged over valid rows (`diagnostics.softmax_stats`)
  max_logit      largest raw logit at a valid (query, key) pair (max over
                 batches); max_abs_logit the largest |logit|
  saturated      share of valid rows whose largest weight > `diagnostics.SATURATION`
  entropy        mean row entropy / log(#valid keys)
  q_var, k_var   variance of each query / key component over valid positions,
                 averaged over components (the Transformer's over all heads);
                 q_mean_square, k_mean_square the same without centring
Logits are the model's own: the Transformer's are captured from its forward
pass (`nnx.capture` of `MultiHeadAttention.scores`), the RNN's from its
attention layer's `scores` on the decoder states of a teacher-forced pass.

The probes and the statistics are `experiments.init_logits.probes`;
the fits, the table and the figure `experiments.init_logits.tables`.

Outputs in `--out`: `results.jsonl` (one row per measurement, with its
provenance under `provenance`: `measure.provenance`), `table.md` (log-log
slopes of logit std and max |logit| against d_k with 95% intervals,
`scaling.loglog_slope`), `logit_std.png`. The wall and CPU time and the
configurations skipped are printed; what the numbers say is written by hand
in results/init_logits/README.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags
from flax import nnx
import jax
import numpy as np

from attention_jax import registry
from experiments.init_logits import probes
from experiments.init_logits import tables
from attention_jax.data import input_pipeline
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import datasets
from attention_jax.measure import provenance
from attention_jax.training import steps
from experiments import common

MODELS, INITS = tables.MODELS, tables.INITS

DEFAULT_SCORES = {
    "transformer": ("dot", "scaled_dot", "inverse_dim", "qk_norm", "additive"),
    "rnn": ("multiplicative", "scaled_multiplicative", "inverse_dim", "qk_norm", "additive"),
}
DEFAULT_DIMS = (8, 16, 32, 64, 128, 256, 512, 1024)
# The additive score's tanh block and its neighbours (sum, tanh, product)
# live at once: bytes per element of the estimate.
_ADDITIVE_BYTES_PER_ELEMENT = 3 * 4
# `scores.additive` (the Transformer's) never holds more than this many
# elements of the block per head (it chunks the queries).
_CHUNKED_ADDITIVE_ELEMENTS = 2 ** 22


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything one run measures; the flags of the same names fill it."""

  dims: tuple[int, ...] = DEFAULT_DIMS
  batches: int = 4
  models: tuple[str, ...] = MODELS
  inits: tuple[str, ...] = INITS
  transformer_scores: tuple[str, ...] = DEFAULT_SCORES["transformer"]
  rnn_scores: tuple[str, ...] = DEFAULT_SCORES["rnn"]
  d_model: int = 128
  num_heads: int = 2  # the `transformer` preset's
  d_ff: int = 512
  encoder_layers: int = 2
  decoder_layers: int = 2
  dataset: str = "bible_en_es"
  vocab_size: int = 2000
  max_length: int = 32
  batch_size: int = 64
  data_seed: int = 0
  seed: int = 0
  premise_passes: int = 2
  max_block_gb: float = 4.0
  # The Transformer as a grid trains it: its LayerNorm placement and the
  # initialisation of W_Q, W_K (`--qk_init`, the trainer's own); init `default`
  # is then that model as built.
  layer_norm: str = "post"
  qk_init: str = "glorot"

  def __post_init__(self):
    for name in ("batches", "d_model", "num_heads", "d_ff", "encoder_layers",
                 "decoder_layers", "vocab_size", "max_length", "batch_size",
                 "premise_passes"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
    if not self.dims or any(int(d) <= 0 for d in self.dims):
      raise ValueError(f"`dims` must be positive integers, got {self.dims!r}.")
    if len(set(self.dims)) != len(self.dims):
      raise ValueError(f"`dims` must not repeat a value, got {self.dims!r}.")
    if not self.max_block_gb > 0:
      raise ValueError(f"`max_block_gb` must be > 0, got {self.max_block_gb!r}.")
    if self.d_model % self.num_heads:
      raise ValueError(f"`d_model` ({self.d_model}) must be divisible by `num_heads` "
                       f"({self.num_heads}).")
    if self.dataset not in input_pipeline.NAMES:
      raise ValueError(f"`dataset` got {self.dataset!r}; allowed values: "
                       f"{', '.join(input_pipeline.NAMES)}.")
    for name, allowed in (("models", MODELS), ("inits", INITS)):
      values = getattr(self, name)
      if not values or any(v not in allowed for v in values):
        raise ValueError(f"`{name}` must name some of {allowed}, got {values!r}.")
    for score in self.transformer_scores:  # every MultiHeadAttention projects q and k
      registry.get(score, "transformer_scores")
    for score in self.rnn_scores:
      if not registry.get(score, "rnn_scores").projected:
        raise ValueError(
            f"`rnn_scores` got {score!r}, which has no query/key projection to measure; "
            f"use one of {[s for s in registry.SCORES if registry.SCORES[s].projected]}.")

  def scores(self, model: str) -> tuple[str, ...]:
    return getattr(self, f"{model}_scores")


# ----------------------------------------------------------------------------
# Models and batches.


def experiment_config(settings: Settings, model: str) -> config_lib.ExperimentConfig:
  """The quick preset's data settings with this run's model sizes: what
  the model config (`cfg.point(arm).model`) needs to build the model the
  trainer would build."""
  common = dict(dataset=settings.dataset, vocab_size=settings.vocab_size,
                max_length=settings.max_length, batch_size=settings.batch_size,
                data_seed=settings.data_seed, arms=settings.scores(model),
                dims=settings.dims, model=model)
  if model == "transformer":
    common.update(hidden_dim=settings.d_model, num_heads=settings.num_heads,
                  ff_dim=settings.d_ff, encoder_layers=settings.encoder_layers,
                  decoder_layers=settings.decoder_layers, layer_norm=settings.layer_norm,
                  qk_init=settings.qk_init)
  return config_lib.from_preset("quick", **common)


def build_model(settings: Settings, model: str, score: str, dim: int, data) -> nnx.Module:
  """The model as the trainer initialises it (one seed, `settings.seed`)."""
  cfg = experiment_config(settings, model)
  arm = config_lib.Arm.of(score, dim)
  model_cls, model_config = cfg.point(arm).build_model(data)
  return model_cls(model_config, rngs=nnx.Rngs(settings.seed))


def first_batches(data, settings: Settings) -> list[tuple[np.ndarray, np.ndarray]]:
  """The trainer's first `settings.batches` training batches as
  `(src [B, L], tgt_in [B, L])` (teacher-forced decoder input), all padded to
  the longest batch's length L so one compiled program serves them all
  (padding is masked everywhere: the valid positions' numbers do not change)."""
  tok = data.tokenizer
  stream = data.batches("train", settings.batch_size, seed=settings.data_seed,
                        shuffle=True, repeat=True, max_length=settings.max_length)
  pairs = []
  for _ in range(settings.batches):
    batch = next(stream)
    tgt = np.asarray(batch.tgt, np.int32)
    pairs.append((np.asarray(batch.src, np.int32),
                  steps.decoder_input(tgt, tok.sos_id, tok.pad_id)))
  length = max(max(src.shape[1], tgt_in.shape[1]) for src, tgt_in in pairs)
  pad = lambda x: np.pad(x, ((0, 0), (0, length - x.shape[1])), constant_values=tok.pad_id)
  return [(pad(src), pad(tgt_in)) for src, tgt_in in pairs]




def additive_block_bytes(settings: Settings, model: str, dim: int, length: int) -> int:
  """Estimated bytes of the additive score's tanh block at once: the RNN
  scores all T steps' queries at once (`[B, T, S, a]`); the Transformer's
  `scores.additive` chunks its queries (at most 2**22 elements per head)."""
  elements = settings.batch_size * length * length * dim
  if model == "transformer":
    elements = settings.num_heads * min(elements, _CHUNKED_ADDITIVE_ELEMENTS)
  return elements * _ADDITIVE_BYTES_PER_ELEMENT


# ----------------------------------------------------------------------------
# The run.


def measure(settings: Settings, data, *, log: Callable[[str], None] = print
            ) -> tuple[list[dict[str, Any]], list[str]]:
  """Every (model, init, score, d_k) of `settings` on the first batches of `data`.

  Returns:
    `(rows, skipped)`: one row per (model, init, score, dim, kind, layer) with
    `batches` (how many were averaged) and the statistics of `probes.site_stats`;
    `skipped` says which configurations were left out and why.
  """
  batches = first_batches(data, settings)
  length = batches[0][0].shape[1]
  rows, skipped = [], []
  for model_name in settings.models:
    for score in settings.scores(model_name):
      for dim in settings.dims:
        if registry.get(score).pair_block:  # a block per (query, key) pair: additive
          need = additive_block_bytes(settings, model_name, dim, length)
          if need > settings.max_block_gb * 2 ** 30:
            skipped.append(f"{model_name} {score} d={dim}: its tanh block needs about "
                           f"{need / 2 ** 30:.1f} GB > --max_block_gb={settings.max_block_gb}")
            log("skipped " + skipped[-1])
            continue
        model = build_model(settings, model_name, score, dim, data)
        for init in INITS:  # default first: the premise then changes the model in place
          if init not in settings.inits:
            continue
          start = time.perf_counter()
          if init == "premise":
            probes.apply_premise(model_name, model, *batches[0],
                          jax.random.key(settings.seed + 1), settings.premise_passes)
          per_batch = [probes.batch_stats(model_name, model, src, tgt_in)
                       for src, tgt_in in batches]
          for i, (kind, layer, _) in enumerate(probes.attention_modules(model)):
            stats = probes.combine_batches([b[i] for b in per_batch])
            rows.append(dict(model=model_name, init=init, score=score, dim=int(dim),
                             kind=kind, layer=layer, batches=len(per_batch), **stats))
          mean_std = np.mean([r["logit_std"] for r in rows[-len(per_batch[0]):]])
          log(f"{model_name} {init} {score} d={dim}: mean logit std {mean_std:.4g} "
              f"({time.perf_counter() - start:.1f} s)")
  return rows, skipped


def write_outputs(out_dir: str, rows: list[dict]) -> None:
  """`results.jsonl` (each row stamped with this process's provenance),
  `table.md` and `logit_std.png` in `out_dir`."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.jsonl"), "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(provenance.stamp(row)) + "\n")
  with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
    f.write(tables.table_markdown(rows))
  tables.plot(rows, os.path.join(out_dir, "logit_std.png"))


# ----------------------------------------------------------------------------
# Command line.

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined only when this module is the program, since
  drivers that tests import beside it define `--dims`, `--models`, `--out` too."""
  defaults = Settings()
  flags.DEFINE_string("out", None, f"Output folder (created; default {SCRATCH_OUT}, a scratch "
                      "folder: the committed results/init_logits is written only when named).")
  flags.DEFINE_list("dims", [str(dim) for dim in defaults.dims],
                    "Per-head query/key sizes d_k (RNN: attention dimension a).")
  flags.DEFINE_integer("batches", defaults.batches, "Training batches averaged per configuration.")
  flags.DEFINE_list("models", list(defaults.models), "Models to measure: transformer, rnn.")
  flags.DEFINE_list("inits", list(defaults.inits), "Initialisations: default, premise.")
  flags.DEFINE_list("transformer_scores", list(defaults.transformer_scores), "Transformer scores.")
  flags.DEFINE_list("rnn_scores", list(defaults.rnn_scores), "RNN scores.")
  flags.DEFINE_integer("d_model", defaults.d_model, "Transformer d_model.")
  flags.DEFINE_integer("num_heads", defaults.num_heads, "Transformer heads.")
  flags.DEFINE_integer("d_ff", defaults.d_ff, "Transformer feed-forward width.")
  flags.DEFINE_integer("encoder_layers", defaults.encoder_layers, "Transformer encoder layers.")
  flags.DEFINE_integer("decoder_layers", defaults.decoder_layers, "Transformer decoder layers.")
  flags.DEFINE_string("dataset", defaults.dataset, "Dataset name (input_pipeline.load).")
  flags.DEFINE_integer("vocab_size", defaults.vocab_size, "SentencePiece vocabulary.")
  flags.DEFINE_integer("max_length", defaults.max_length, "Longest training pair (tokens).")
  flags.DEFINE_integer("batch_size", defaults.batch_size, "Sentences per batch.")
  flags.DEFINE_integer("data_seed", defaults.data_seed, "Shuffling seed of the training stream.")
  flags.DEFINE_integer("seed", defaults.seed, "Model initialisation seedefaults.")
  flags.DEFINE_string("layer_norm", defaults.layer_norm, "Transformer LayerNorm placement: "
                      "post or pre (the trainer's --layer_norm).")
  flags.DEFINE_string("qk_init", defaults.qk_init, "Transformer W_Q, W_K initialisation as "
                      "built (the trainer's --qk_init): glorot, premise or zero_query; init "
                      "'default' measures that model.")
  flags.DEFINE_integer("premise_passes", defaults.premise_passes,
                       "Measure-and-rescale passes of the premise initialisation.")
  flags.DEFINE_float("max_block_gb", defaults.max_block_gb,
                     "Skip additive configurations whose tanh block would exceed this.")


# Where a run without `--out` writes: a toy run with a flag or two must not
# replace the committed results/init_logits (it did, by default).
SCRATCH_OUT = os.path.join("runs", "init_logits")


def _dims(values: list[str]) -> tuple[int, ...]:
  try:
    return tuple(int(d) for d in values)
  except ValueError:
    raise ValueError(f"`dims` must be a comma-separated list of integers, got "
                     f"{','.join(values)!r}.") from None


def settings_from_flags() -> Settings:
  """The flags as `Settings`; a ValueError names the bad flag."""
  return Settings(
      dims=_dims(FLAGS.dims), batches=FLAGS.batches,
      models=tuple(FLAGS.models), inits=tuple(FLAGS.inits),
      transformer_scores=tuple(FLAGS.transformer_scores), rnn_scores=tuple(FLAGS.rnn_scores),
      d_model=FLAGS.d_model, num_heads=FLAGS.num_heads, d_ff=FLAGS.d_ff,
      encoder_layers=FLAGS.encoder_layers, decoder_layers=FLAGS.decoder_layers,
      dataset=FLAGS.dataset, vocab_size=FLAGS.vocab_size, max_length=FLAGS.max_length,
      batch_size=FLAGS.batch_size, data_seed=FLAGS.data_seed, seed=FLAGS.seed,
      premise_passes=FLAGS.premise_passes, max_block_gb=FLAGS.max_block_gb,
      layer_norm=FLAGS.layer_norm, qk_init=FLAGS.qk_init)


def load_data(settings: Settings):
  return datasets.load(settings.dataset, max_length=settings.max_length,
                       vocab_size=settings.vocab_size)


def checked_out(out: str | None) -> str:
  """The output folder: `out`, or `SCRATCH_OUT` when none is given; a
  ValueError naming `--out` unless it is (or can become) a writable folder,
  checked before minutes of measuring that a file there would throw away."""
  out = out or SCRATCH_OUT
  common.check_output_dir("out", out)
  return out


def main(argv):
  # One `error:` line for a bad flag, not absl's usage of every flag.
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  try:
    settings = settings_from_flags()
    for model in settings.models:  # everything the sweep's config refuses, too
      experiment_config(settings, model)
    out = checked_out(FLAGS.out)
  except ValueError as err:
    sys.exit(f"error: {err}")
  if not FLAGS.out:
    print(f"no --out given: writing to {out} (the committed results/init_logits is "
          "written only when --out names it)")
  wall, cpu = time.perf_counter(), time.process_time()
  rows, skipped = measure(settings, load_data(settings))
  write_outputs(out, rows)
  print(f"skipped: {'; '.join(skipped) if skipped else 'none'}")
  print(f"wall time {(time.perf_counter() - wall) / 60:.1f} min, CPU time "
        f"{(time.process_time() - cpu) / 60:.1f} min, from loading the data to writing "
        f"the files; load average {os.getloadavg()[0]:.2f}")
  print(f"wrote {out}/results.jsonl ({len(rows)} rows), table.md, logit_std.png")


if __name__ == "__main__":
  define_flags()
  app.run(main)
