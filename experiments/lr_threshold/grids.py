"""The threshold study's grids as records: reading a learning-rate x d_k grid.

`read_grid` reads a `--sweep=learning_rate=...` workdir (or the workdir of
one `--members=learning_rate=...` run per score and d_k) into a `Grid`: a
`Record` per (score, d_k, lr, seed) of every cell whose outcome is known
(its last validation, or its divergence), and the planned cells still
missing. `preset_grids` gives each grid of a preset with its planned rates,
`union` and `merge` join grids, `read_premise` reads the adaptive grid of
`transformer_lr_premise_cpu` (its coarse grid and the rule's extra rates).
Every file is checked as it is read: a bad value is one line naming the file
and the line. The numbers (lr*, the law, the verdicts) are `threshold`'s.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from typing import Mapping, NamedTuple, Sequence

from attention_jax.analysis import tables
from attention_jax.measure import provenance as provenance_lib
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.training import run_folder
from attention_jax.training.metrics_log import MetricsLog
import experiments
from experiments.lr_threshold.presets import transformer_lr
from experiments.lr_threshold.presets import transformer_lr_cpu
from experiments.lr_threshold.presets import transformer_lr_premise
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise

AXIS = "learning_rate"
EARLY_STEP = 100  # the heat maps' first moment (the preset: steps 100 and 1,000)
SELF_KINDS = ("encoder_self", "decoder_self")
DIAGNOSTIC_STATS = ("max_logit", "saturated")  # both summarised by the largest over layers
MOMENTS = ("step100", "last")
# Provenance fields kept in the outputs: the command is left out, since it
# names the machine's folders (results/lr_threshold/transformer_lr_cpu/commands.sh holds it).
PROVENANCE_FIELDS = ("commit", "dirty", "versions", "platform", "device_kind", "xla_flags")


class Cell(NamedTuple):
  score: str
  dim: int
  lr: float


@dataclasses.dataclass(frozen=True)
class Record:
  """One seed of one cell: its final validation loss (inf: diverged), test
  BLEU (None until the run finished, or diverged), the self-attention
  diagnostics (`diagnostic_key`) and the provenance of its result row."""
  score: str
  dim: int
  lr: float
  seed: int
  loss: float
  diverged: bool
  test_bleu: float | None
  diagnostics: Mapping[str, float | None]
  provenance: Mapping | None = None
  train_seconds: float | None = None  # its run's training clock (every seed's row: one run)

  @property
  def cell(self) -> Cell:
    return Cell(self.score, self.dim, self.lr)


@dataclasses.dataclass(frozen=True)
class Grid:
  """What one or more grids hold: the known records, the planned cells that
  are missing, and the plan (each score's d_k and learning rates)."""
  records: tuple[Record, ...]
  missing: tuple[Cell, ...]
  learning_rates: Mapping[str, tuple[float, ...]]  # score -> its planned learning rates
  dims: Mapping[str, tuple[int, ...]]  # score -> its planned d_k
  vocab_size: int
  steps: int
  # (score, d_k) -> its planned learning rates, where they differ from the
  # score's (an adaptive grid: `plan_next`); `learning_rates` is then their union.
  cell_rates: Mapping[tuple[str, int], tuple[float, ...]] | None = None

  @property
  def scores(self) -> tuple[str, ...]:
    return tuple(self.learning_rates)

  def planned(self, score: str, dim: int) -> tuple[float, ...]:
    """The learning rates planned for (score, d_k), ascending."""
    if self.cell_rates and (score, dim) in self.cell_rates:
      return tuple(sorted(self.cell_rates[(score, dim)]))
    return tuple(self.learning_rates[score])


def diagnostic_key(stat: str, kind: str, moment: str) -> str:
  """`max_logit_encoder_self_step100`; kind `self` is the largest of the self kinds."""
  return f"{stat}_{kind}_{moment}"


def self_diagnostics(step_row: Mapping, moment: str) -> dict[str, float | None]:
  """The self-attention diagnostics of one diagnostics dict (a metrics-log
  row or a result row's `diagnostics`): per stat and self kind the largest
  over its layers, and over both kinds (`self`); None where not logged or
  not finite."""
  out = {}
  for stat in DIAGNOSTIC_STATS:
    values = []
    for kind in SELF_KINDS:
      value = tables.kind_value(step_row, stat, kind)
      out[diagnostic_key(stat, kind, moment)] = value
      if value is not None:
        values.append(value)
    out[diagnostic_key(stat, "self", moment)] = max(values) if values else None
  return out


def seed_record(cell: Cell, seed: int, log: Sequence[Mapping], result_row: Mapping | None,
                steps: int) -> Record | None:
  """The record of `seed` from its run's metrics-log rows `log` (every seed's)
  and its result row (None: not finished); None while its outcome is not
  known (no validation at `steps`, and not diverged)."""
  mine = [r for r in log if r.get("seed") == seed]
  validation = {r["step"]: r["val_ppl"] for r in mine if "val_ppl" in r}
  # A perplexity that is no finite number (null; a NaN of rows not read by
  # `MetricsLog`) is that of a diverged member, never a loss of NaN.
  diverged = (bool(result_row and result_row.get("diverged_at_step"))
              or any(v is None or not math.isfinite(v) for v in validation.values()))
  if not diverged and steps not in validation:
    return None
  loss = math.inf if diverged else math.log(validation[steps])
  steps_rows = {r["step"]: r for r in mine if "loss" in r}  # the diagnostics rows
  last = steps_rows.get(steps) or (result_row or {}).get("diagnostics") or {}
  diagnostics = {**self_diagnostics(steps_rows.get(EARLY_STEP, {}), "step100"),
                 **self_diagnostics(last, "last")}
  bleu = None if diverged or not result_row else result_row.get("test_bleu")
  prov = provenance_lib.of(result_row) if result_row else None
  return Record(cell.score, cell.dim, cell.lr, seed, loss, diverged, bleu, diagnostics,
                {k: prov.get(k) for k in PROVENANCE_FIELDS} if prov else None,
                (result_row or {}).get("train_seconds"))


def _checked(run: run_folder.RunDir, cfg: config_lib.ExperimentConfig,
             arm: config_lib.Arm) -> None:
  """Refuses a run folder made with other settings than the plan's (one
  ValueError line naming it): its numbers would not be this grid's."""
  if not os.path.exists(run.config):
    return  # not started: nothing to check
  other_steps = workdir_lib.check_run(
      run, workdir_lib.fingerprint(cfg, arm), write=False,
      advice="it is not a run of this grid: read it with the settings it was trained with "
             "(--preset, --layer_norm) or point --main / --controls at this grid's workdirs")
  if other_steps is not None:
    raise ValueError(f"{run.config} records a run of {other_steps} steps, not the grid's "
                     f"{cfg.steps}; it is not a run of this grid.")


def union(grids: Sequence[Grid]) -> Grid:
  """One grid of several workdirs that may share scores and d_k (an
  adaptive grid's stages, or a grid and its refinement at more learning
  rates): each (score, d_k) plans the union of the rates the grids plan for
  it. They must share the vocabulary and the number of steps, and no cell
  may be known in two of them (a ValueError names it)."""
  first = grids[0]
  for g in grids[1:]:
    if (g.vocab_size, g.steps) != (first.vocab_size, first.steps):
      raise ValueError(f"grids of {first.vocab_size} and {g.vocab_size} pieces, "
                       f"{first.steps} and {g.steps} steps cannot be analysed together.")
  seen, records = set(), []
  for g in grids:
    for r in g.records:
      if (r.cell, r.seed) in seen:
        raise ValueError(f"{r.score} at d_k {r.dim}, learning rate {r.lr:g}, seed {r.seed} "
                         "is in two of the grids read together.")
      seen.add((r.cell, r.seed))
      records.append(r)
  rates: dict[tuple[str, int], set[float]] = {}
  for g in grids:
    for score in g.scores:
      for dim in g.dims[score]:
        rates.setdefault((score, dim), set()).update(g.planned(score, dim))
  known = {r.cell for r in records}
  missing = tuple(dict.fromkeys(c for g in grids for c in g.missing if c not in known))
  scores = tuple(dict.fromkeys(s for g in grids for s in g.scores))
  return Grid(tuple(records), missing,
              {s: tuple(sorted({lr for (t, _), v in rates.items() if t == s for lr in v}))
               for s in scores},
              {s: tuple(sorted({d for (t, d) in rates if t == s})) for s in scores},
              first.vocab_size, first.steps,
              {cell: tuple(sorted(v)) for cell, v in rates.items()})


def members_config(cfg: config_lib.ExperimentConfig,
                   learning_rates: Sequence[float]) -> config_lib.ExperimentConfig:
  """The config of the grid of `cfg` over `learning_rates` trained as members
  (`--members=learning_rate=...`, in that order): one run per score and d_k."""
  return cfg.replace(members=f"{AXIS}=" + ",".join(map(repr, learning_rates)))


MEMBERS, SWEEP = "members", "sweep"  # the two layouts of a grid's workdir (`layout`)


def layout(path: str, cfg: config_lib.ExperimentConfig,
           learning_rates: Sequence[float]) -> str | None:
  """How the workdir `path` holds the grid of `cfg` over `learning_rates`,
  told by which of the plan's run folders exist: MEMBERS (its runs in
  `runs/`, `Workdir.run`, one per score and d_k) or SWEEP (a point folder
  per learning rate, `Workdir.point`); None where it holds neither. A
  `runs/` folder alone says nothing: a scratch folder of that name beside a
  `--sweep` grid made every cell read as missing. Run folders of both
  layouts are a ValueError of one line naming one of each."""
  workdir = workdir_lib.Workdir(path)
  members = [workdir.run(arm).path for arm in cfg.sweep()]
  points = [workdir.point(p).run(arm).path for p in config_lib.grid(cfg, ((AXIS, tuple(
      learning_rates)),)) for arm in p.config.sweep()]
  member_run = next(filter(os.path.isdir, members), None)
  point_run = next(filter(os.path.isdir, points), None)
  if member_run and point_run:
    raise ValueError(f"{path} holds the grid twice: as members runs ({member_run}) and as "
                     f"a --sweep grid ({point_run}); move one of them out.")
  return MEMBERS if member_run else SWEEP if point_run else None


def is_members_workdir(path: str, cfg: config_lib.ExperimentConfig,
                       learning_rates: Sequence[float]) -> bool:
  """Whether `path` holds the grid as members runs rather than as a
  `--sweep` grid (`layout`)."""
  return layout(path, cfg, learning_rates) == MEMBERS


def _cell_runs(path: str, cfg: config_lib.ExperimentConfig, learning_rates: Sequence[float]):
  """(cell, the rows of its run's metrics log and result that are the
  cell's) of every planned cell, the run's settings checked
  (`_checked`); read from a `--sweep` grid or from members runs, whose rows
  and log lines name their learning rate."""
  workdir = workdir_lib.Workdir(path)
  if is_members_workdir(path, cfg, learning_rates):
    members = members_config(cfg, learning_rates)
    for arm in members.sweep():
      run = workdir.run(arm)
      _checked(run, members, arm)
      log = MetricsLog(run.metrics, write=False).read()
      rows = run.rows() if run.finished else []
      for lr in learning_rates:
        mine = lambda r, lr=lr: r.get(AXIS) == lr
        yield (Cell(arm.name, arm.attention_dim, float(lr)), [r for r in log if mine(r)],
               [r for r in rows if mine(r)])
    return
  for point in config_lib.grid(cfg, ((AXIS, tuple(learning_rates)),)):
    for arm in point.config.sweep():
      run = workdir.point(point).run(arm)
      _checked(run, point.config, arm)
      yield (Cell(arm.name, arm.attention_dim, float(point.values[AXIS])),
             MetricsLog(run.metrics, write=False).read(),
             run.rows() if run.finished else [])


def read_grid(path: str, cfg: config_lib.ExperimentConfig,
              learning_rates: Sequence[float]) -> Grid:
  """The grid of `cfg` over `learning_rates` in the workdir `path`: a
  `--sweep` grid (its layout: `workdir_lib.Workdir.point`, `Workdir.run`) or
  the grid as members runs (`layout`): the records of every
  known cell and the cells still missing. A run folder of other settings is
  a ValueError naming its config.json; a workdir holding both layouts, one
  naming a run folder of each (`layout`)."""
  records, missing = [], []
  seeds = tuple(range(cfg.seeds))
  for cell, log, result_rows in _cell_runs(path, cfg, learning_rates):
    rows = {r["seed"]: r for r in result_rows}
    found = [seed_record(cell, s, log, rows.get(s), cfg.steps) for s in seeds]
    if all(r is not None for r in found):
      records.extend(found)
    else:
      missing.append(cell)
  lrs = tuple(sorted(float(x) for x in learning_rates))
  return Grid(tuple(records), tuple(missing), {a: lrs for a in cfg.arms},
              {a: tuple(sorted(cfg.dims)) for a in cfg.arms}, cfg.vocab_size, cfg.steps)


def merge(grids: Sequence[Grid]) -> Grid:
  """One grid of several (the main arms and the controls), which must share
  the vocabulary and the number of steps (`union`), and no score."""
  seen: set[str] = set()
  for g in grids:
    if seen & set(g.scores):
      raise ValueError(f"scores {sorted(seen & set(g.scores))} are in two grids.")
    seen |= set(g.scores)
  return union(grids)


# The presets whose grids this analysis reads (`preset_grids`).
PRESETS = ("transformer_lr_cpu", "transformer_lr", "transformer_lr_premise_cpu",
           "transformer_lr_premise")


def preset_grids(preset: str = "transformer_lr_cpu", layer_norm: str | None = None
                 ) -> dict[str, tuple[config_lib.ExperimentConfig, tuple[float, ...]]]:
  """A preset's grids: name -> (config, learning rates). `transformer_lr_cpu`:
  its two grids as results/lr_threshold/transformer_lr_cpu/commands.sh runs them (`main`,
  `controls`); `transformer_lr`: one grid of every score (`main`), that of
  `layer_norm` (default the preset's), a workdir per layer norm as its
  docstring's commands run it; `transformer_lr_premise_cpu`: its coarse
  rates (the rest is read by `read_premise`); `transformer_lr_premise`: its
  whole ladder, one workdir. A ValueError names a preset or layer norm
  this does not know."""
  if preset not in PRESETS:
    raise ValueError(f"--preset: {preset!r} has no learning-rate grid to analyse; "
                     f"one of {', '.join(PRESETS)}.")
  experiments.add_study_presets()  # `from_preset` names this study's presets
  cfg = config_lib.from_preset(preset)
  if layer_norm:
    try:
      cfg = cfg.replace(layer_norm=layer_norm)  # the config checks the value
    except ValueError as e:
      raise ValueError(f"--layer_norm: {e}") from None
  if preset == "transformer_lr":
    return {"main": (cfg, transformer_lr.LEARNING_RATES)}
  if preset == "transformer_lr_premise_cpu":
    return {"main": (cfg, premise.COARSE_RATES)}
  if preset == "transformer_lr_premise":
    return {"main": (cfg, transformer_lr_premise.LEARNING_RATES)}
  return {"main": (cfg, transformer_lr_cpu.LEARNING_RATES),
          "controls": (cfg.replace(arms=("inverse_dim", "qk_norm"), baseline="inverse_dim"),
                       transformer_lr_cpu.CONTROL_LEARNING_RATES)}


def preset_bands(preset: str) -> dict[str, tuple[float, float]] | None:
  """The verdict bands `preset` pre-registered (its module's `BANDS`), or
  None where it registered none (`transformer_lr_cpu`, `transformer_lr`)."""
  experiments.add_study_presets()
  return getattr(importlib.import_module(config_lib.PRESET_MODULES[preset]), "BANDS", None)


# --- the adaptive grid of `transformer_lr_premise_cpu` ------------------------------
COARSE, EXTRA = "coarse", "extra"  # its workdir's two parts (results/.../commands.sh)


def extra_name(score: str, dim: int) -> str:
  """The workdir, under EXTRA, of the runs stages 2 and 3 add to (score, d_k)."""
  return f"{score}_d{dim}"


def point_rates(path: str) -> tuple[float, ...]:
  """The learning rates of a `--sweep=learning_rate=...` workdir's point folders."""
  prefix = f"{AXIS}="
  rates = []
  for name in sorted(os.listdir(path)) if os.path.isdir(path) else ():
    if name.startswith(prefix) and os.path.isdir(os.path.join(path, name)):
      try:
        rates.append(float(name[len(prefix):]))
      except ValueError:
        raise ValueError(f"{os.path.join(path, name)}: not a learning rate's folder.") from None
  return tuple(sorted(rates))


def read_premise(path: str, cfg: config_lib.ExperimentConfig) -> Grid:
  """The adaptive grid of `transformer_lr_premise_cpu` in the workdir `path`:
  its coarse `--sweep` grid (COARSE) and, per (score, d_k), the workdir of
  the rates stages 2 and 3 added (EXTRA/<score>_d<dim>), read as one grid
  whose cells plan their own rates (`union`). A folder under EXTRA that
  names no (score, d_k) of the plan is a ValueError naming it."""
  grids = [read_grid(os.path.join(path, COARSE), cfg, premise.COARSE_RATES)]
  extra = os.path.join(path, EXTRA)
  names = {extra_name(a, d): (a, d) for a in cfg.arms for d in cfg.dims}
  for name in sorted(os.listdir(extra)) if os.path.isdir(extra) else ():
    if name not in names:
      raise ValueError(f"{os.path.join(extra, name)}: no (score, d_k) of the plan is called "
                       f"{name!r}; expected one of {', '.join(sorted(names))}.")
    rates = point_rates(os.path.join(extra, name))
    if rates:
      score, dim = names[name]
      grids.append(read_grid(os.path.join(extra, name),
                             cfg.replace(arms=(score,), dims=(dim,)), rates))
  return union(grids)
