"""Where a score starts to fail: the rule of the `transformer_lr_cpu` preset, applied
(to its grids, or to a layer norm's grid of `transformer_lr`, which keeps the rule).

The rule was fixed in the preset's docstring
(`experiments/lr_threshold/presets/transformer_lr_cpu.py`) before any run of
the grid; it is applied here as it is written there, and not restated. The
grids come read as records (`grids.read_grid`: a `Grid` of a `Record` per
(score, d_k, lr, seed) of every cell whose outcome is known); the pieces
here are small pure functions of their numbers:

  mean_losses        L(s, d, lr): the mean over seeds (inf where a seed diverged)
  threshold          lr_opt and lr* of one (s, d) curve, with the censoring flags
  absolute_failures  the pass/fail table against L_best(d) + FAILURE_MARGIN
  sensitivity        Wortsman et al.'s learning-rate sensitivity
  slope, bootstrap_slope   the law: log lr* on log d_k, and its interval
  intervals_of       each lr* (or lr_att) as its grid interval
                     (`Threshold.bracket`), which `brackets` turns into the
                     range of slopes they allow and its verdict on the
                     prediction (holds / fails / not resolved)
  shared_rates, on_rates   the learning rates every score ran, and the grid
                     cut to them
  analyse            all of it for one or more grids (`Analysis`, `as_json`)

What the rule leaves to its implementation, decided here:
- A seed is diverged (L = inf) when its result row says so, or when any of
  its validation rows has a null perplexity: the trainer marks a member
  diverged for good and validates it as NaN from then on, so its outcome is
  known before the run reaches its last step. A bare NaN that an older
  writer left there reads as null (`MetricsLog.read`), never as a loss of
  NaN; a logged value that is no perplexity (a string, 0) is refused in
  one line naming the file and the line.
- A cell is known when every seed of it is (its last validation, or its
  divergence); a cell any seed of which is not yet known is missing. The
  analysis runs on what is known and lists the missing cells.
- Interpolating towards a diverged grid point: the interpolated L is
  infinite everywhere past the last finite point, so the crossing is that
  point itself: lr* is the last learning rate that did not reach the target,
  flagged `into_divergence` (a bound, not a crossing).
- The rule's "Censored" covers both flags it names: lr* above the grid (L
  never reaches the target) and lr_opt at the grid's lowest learning rate
  (the failure may begin lower). Neither enters the fit; both are reported.
  A curve of which some planned learning rate is missing is provisional: its
  lr* is reported, not fitted.
- The bootstrap draws each cell's seeds with replacement, recomputes every
  L, lr_opt and lr* and fits over the d_k uncensored in that draw; draws
  with fewer than two such d_k give no slope and are counted. With two seeds
  a cell has only three distinct means (seed 0 twice, seed 1 twice, both),
  so the interval is coarse: it shows how far the two seeds' disagreement
  moves the slope, not a sampling distribution. It covers the seeds only:
  the grid's resolution is the bracket's.
- A claim is no stronger than the grid: lr* is known only to lie in its
  grid interval (the last rate below the target, the first at or above
  it), and the slope only to lie in the range those intervals allow
  (`slope_bracket`). The interpolated slope is a point estimate inside it.
  The verdict on a predicted slope reads the bracket alone: it fails where
  the bracket excludes the prediction, holds only where the bracket lies
  inside a band registered with the grid before its first run, and is
  otherwise "not resolved by this grid".

Beside the rule, not part of it (added after the controls had started, and
the same for every score): where the scores ran different learning rates
(the controls three of the main grid's six), the whole analysis is repeated
on the rates every score ran (`Analysis.shared`). The rule's own numbers
come from each score's full grid; a sensitivity is a mean over the rates a
curve has, and lr* is only as fine as its grid, so only the repeat compares
the four scores on equal terms.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from experiments.lr_threshold.brackets import (UNRESOLVED, deciding_half_width, slope_bracket,
                                               verdict, wide_intervals)
from experiments.lr_threshold.grids import Cell, Grid, Record
from experiments.lr_threshold.presets import transformer_lr_cpu
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise

FAILURE_MARGIN = transformer_lr_cpu.FAILURE_MARGIN
BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0
INTERVAL = (2.5, 97.5)  # percentiles: a 95% interval
# The attention rule (the `transformer_lr_premise_cpu` preset's docstring):
# a cell saturates when, at the last step, some self-attention layer has more
# than this share of its query rows over 0.99 on one key (mean over seeds).
SATURATED_SHARE = premise.SATURATED_SHARE
SATURATION_KEY = "saturated_self_last"
# The slope the mu-P argument for Adam predicts per score (the preset's docstring).
REFERENCE_SLOPES = {"dot": -1.0, "scaled_dot": -0.5, "inverse_dim": 0.0, "qk_norm": 0.0}


# --- numbers ------------------------------------------------------------------


def shared_rates(grid: Grid) -> tuple[float, ...]:
  """The learning rates that every score of `grid` planned, ascending."""
  sets = [set(v) for v in grid.learning_rates.values()]
  return tuple(sorted(set.intersection(*sets))) if sets else ()


def on_rates(grid: Grid, rates: Sequence[float]) -> Grid:
  """`grid` cut to the learning rates `rates`, for every score: its records,
  missing cells and plan at those rates only."""
  keep = tuple(sorted(rates))
  return Grid(tuple(r for r in grid.records if r.lr in keep),
              tuple(c for c in grid.missing if c.lr in keep),
              {s: keep for s in grid.scores}, dict(grid.dims), grid.vocab_size, grid.steps)


def records_by_cell(records: Iterable[Record]) -> dict[Cell, list[Record]]:
  """Each cell's records, in seed order."""
  by_cell: dict[Cell, list[Record]] = collections.defaultdict(list)
  for r in sorted(records, key=lambda r: (r.cell, r.seed)):
    by_cell[r.cell].append(r)
  return dict(by_cell)


def seed_losses(records: Iterable[Record]) -> dict[Cell, np.ndarray]:
  """Each cell's final validation losses, in seed order (inf: diverged)."""
  by_cell = collections.defaultdict(list)
  for r in sorted(records, key=lambda r: (r.cell, r.seed)):
    by_cell[r.cell].append(r.loss)
  return {c: np.asarray(v, np.float64) for c, v in by_cell.items()}


def mean_losses(records: Iterable[Record]) -> dict[Cell, float]:
  """L(s, d, lr): the mean over seeds; infinite where any seed diverged."""
  return {c: float(np.mean(v)) for c, v in seed_losses(records).items()}


@dataclasses.dataclass(frozen=True)
class Threshold:
  """lr_opt and lr* of one (score, d_k) curve and how far to trust lr*."""
  lr_opt: float | None
  loss_opt: float | None
  lr_star: float | None
  above: bool = False  # L never reaches the target: lr* beyond the grid's largest lr
  lowest: bool = False  # lr_opt is the grid's lowest lr: the failure may begin lower
  into_divergence: bool = False  # the point past the crossing diverged (module docstring)
  nowhere: bool = False  # no finite L at any learning rate: no lr_opt
  complete: bool = True  # every planned learning rate of the curve is known
  # The grid interval that holds lr* without interpolation: (the last
  # learning rate below the target, the first at or above it); None above
  # as (the largest learning rate, None) when the target is never reached.
  bracket: tuple[float, float | None] | None = None

  @property
  def censored(self) -> bool:
    return self.above or self.lowest or self.nowhere

  @property
  def fitted(self) -> bool:
    """Whether this lr* enters the law's fit."""
    return self.lr_star is not None and self.complete and not self.censored


def threshold(curve: Sequence[tuple[float, float]], planned: Sequence[float],
              margin: float = FAILURE_MARGIN) -> Threshold:
  """lr_opt (the learning rate of the smallest finite L; the lower on a tie)
  and lr*: the first learning rate above it at which L, interpolated
  linearly in log lr between the points of `curve` ((lr, L) pairs), reaches
  L(lr_opt) + `margin`. `planned` (the grid's learning rates) says whether
  lr_opt is the lowest and whether the curve is complete."""
  points = sorted(curve)
  complete = set(planned) <= {lr for lr, _ in points}
  finite = [p for p in points if math.isfinite(p[1])]
  if not finite:
    return Threshold(None, None, None, nowhere=True, complete=complete)
  lr_opt, loss_opt = min(finite, key=lambda p: (p[1], p[0]))
  common = dict(lr_opt=lr_opt, loss_opt=loss_opt, lowest=lr_opt <= min(planned),
                complete=complete)
  target = loss_opt + margin
  low_lr, low_loss = lr_opt, loss_opt  # below the target: margin > 0
  for lr, loss in points:
    if lr <= lr_opt:
      continue
    if loss >= target:
      if math.isinf(loss):
        return Threshold(lr_star=low_lr, into_divergence=True, bracket=(low_lr, lr), **common)
      t = (target - low_loss) / (loss - low_loss)
      x = math.log(low_lr) + t * (math.log(lr) - math.log(low_lr))
      return Threshold(lr_star=math.exp(x), bracket=(low_lr, lr), **common)
    low_lr, low_loss = lr, loss
  return Threshold(lr_star=None, above=True, bracket=(low_lr, None), **common)


def curve_of(losses: Mapping[Cell, float], score: str, dim: int) -> list[tuple[float, float]]:
  """(lr, L) of every known cell of (score, dim), by learning rate."""
  return sorted((c.lr, v) for c, v in losses.items() if c.score == score and c.dim == dim)


def absolute_failures(losses: Mapping[Cell, float], margin: float = FAILURE_MARGIN
                      ) -> tuple[dict[Cell, bool], dict[int, float]]:
  """(whether each cell fails, L_best per d_k): a cell fails when its L is
  above L_best(d) + `margin`, L_best(d) the smallest L of every score and
  learning rate at its d_k; a diverged cell always fails."""
  best = {}
  for c, v in losses.items():
    best[c.dim] = min(best.get(c.dim, math.inf), v)
  fails = {c: not math.isfinite(v) or v > best[c.dim] + margin for c, v in losses.items()}
  return fails, best


def sensitivity(losses: Sequence[float], ln_vocab: float) -> float | None:
  """Wortsman et al.'s learning-rate sensitivity of one curve: the mean over
  its learning rates of min(L, ln V) minus its smallest L (ln V, the
  uniform prediction's loss, stands in for the loss at step 0, so that a
  diverged point counts as no learning rather than infinity); None if no L
  is finite, or for a single learning rate (a spread over one point is 0 by
  construction, which would read as perfect stability)."""
  if len(losses) < 2:
    return None
  best = min(losses)
  if not math.isfinite(best):
    return None
  return float(np.mean([min(v, ln_vocab) for v in losses])) - best


def slope(points: Sequence[tuple[float, float]]) -> float | None:
  """The least-squares slope of log lr* on log d_k over (d_k, lr*) `points`;
  None with fewer than two distinct d_k."""
  if len({d for d, _ in points}) < 2:
    return None
  x = np.log([d for d, _ in points])
  y = np.log([lr for _, lr in points])
  x = x - x.mean()
  return float(np.sum(x * (y - y.mean())) / np.sum(x * x))


def fit_points(thresholds: Mapping[int, Threshold]) -> list[tuple[int, float]]:
  """(d_k, lr*) of every d_k whose lr* enters the fit (`Threshold.fitted`)."""
  return [(d, t.lr_star) for d, t in sorted(thresholds.items()) if t.fitted]


def loss_interval(t: Threshold) -> tuple[float, float] | None:
  """The grid interval of lr* as the slope bracket takes it: open above
  (high inf) where lr* is above the grid; open below (low 0) where lr_opt
  is the grid's lowest, since the failure may begin lower; None where the
  curve is incomplete or has no finite L."""
  if not t.complete or t.bracket is None:
    return None
  low, high = t.bracket
  return (0.0 if t.lowest else low, math.inf if high is None else high)


def attention_interval(t: AttentionThreshold) -> tuple[float, float] | None:
  """The grid interval of lr_att as the slope bracket takes it (open below
  or above where censored); None where the curve is incomplete."""
  if not t.complete:
    return None
  low, high = t.bracket
  return (0.0 if low is None else low, math.inf if high is None else high)


def intervals_of(thresholds: Mapping[int, Threshold | AttentionThreshold]
                 ) -> list[tuple[int, float, float]]:
  """(d_k, low, high) of every d_k whose interval is known, by d_k."""
  out = []
  for d, t in sorted(thresholds.items()):
    interval = (attention_interval(t) if isinstance(t, AttentionThreshold)
                else loss_interval(t))
    if interval is not None:
      out.append((d, *interval))
  return out


@dataclasses.dataclass(frozen=True)
class Bootstrap:
  low: float | None
  high: float | None
  replicates: int
  with_slope: int  # replicates with at least two uncensored d_k


def bootstrap_slope(losses: Mapping[tuple[int, float], np.ndarray],
                    planned: Sequence[float] | Mapping[int, Sequence[float]],
                    margin: float = FAILURE_MARGIN, replicates: int = BOOTSTRAP_REPLICATES,
                    seed: int = BOOTSTRAP_SEED) -> Bootstrap:
  """The percentile interval (`INTERVAL`) of the slope of one score over
  `replicates` draws, each cell's seed losses (`losses[(d_k, lr)]`) drawn
  with replacement from a generator seeded with `seed`. `planned`: the
  learning rates of every d_k, or a mapping d_k -> its own. Only d_k whose
  curve has every planned learning rate take part, as in the point estimate."""
  rng = np.random.default_rng(seed)
  dims = sorted({d for d, _ in losses})
  rates = {d: tuple(sorted(planned[d] if isinstance(planned, Mapping) else planned))
           for d in dims if not isinstance(planned, Mapping) or d in planned}
  dims = [d for d in rates if all((d, lr) in losses for lr in rates[d])]
  means = {}
  for d in dims:
    for lr in rates[d]:
      values = losses[(d, lr)]
      draws = rng.integers(0, values.size, size=(replicates, values.size))
      means[(d, lr)] = values[draws].mean(axis=1)
  slopes = []
  for b in range(replicates):
    per_dim = {d: threshold([(lr, means[(d, lr)][b]) for lr in rates[d]], rates[d], margin)
               for d in dims}
    s = slope(fit_points(per_dim))
    if s is not None:
      slopes.append(s)
  if not slopes:
    return Bootstrap(None, None, replicates, 0)
  low, high = np.percentile(slopes, INTERVAL)
  return Bootstrap(float(low), float(high), replicates, len(slopes))


@dataclasses.dataclass(frozen=True)
class AttentionThreshold:
  """lr_att of one (score, d_k) curve: the lowest learning rate whose cell
  saturates (`cell_saturates`), and its grid interval (the rate below it,
  lr_att]; `below`: the lowest rate saturates already, `above`: none does."""
  lr_att: float | None
  bracket: tuple[float | None, float | None]
  below: bool = False
  above: bool = False
  complete: bool = True  # every planned rate's saturation is known

  @property
  def fitted(self) -> bool:
    return self.complete and not (self.below or self.above)


def cell_saturates(records: Sequence[Record], share: float = SATURATED_SHARE) -> bool | None:
  """Whether a cell's self attention saturates at the last step by the
  attention rule: the mean over its seeds of the largest saturated share
  over self-attention layers above `share`, a diverged seed counting as
  saturated (share 1); None where a seed that did not diverge logged none."""
  values = []
  for r in records:
    value = 1.0 if r.diverged else r.diagnostics.get(SATURATION_KEY)
    if value is None:
      return None
    values.append(value)
  return bool(values) and float(np.mean(values)) > share


def attention_threshold(points: Sequence[tuple[float, bool | None]],
                        planned: Sequence[float]) -> AttentionThreshold:
  """lr_att from (lr, saturates) `points` of one curve (None: not known)."""
  known = sorted((lr, v) for lr, v in points if v is not None)
  complete = set(planned) <= {lr for lr, _ in known}
  below = None
  for lr, saturates in known:
    if saturates:
      return AttentionThreshold(lr, (below, lr), below=below is None, complete=complete)
    below = lr
  return AttentionThreshold(None, (below, None), above=True, complete=complete)


@dataclasses.dataclass(frozen=True)
class Law:
  """The slope of one score: its model-free bracket (`slope_bracket`), the
  interpolated point estimate and its bootstrap interval (over seeds only:
  it leaves the grid's resolution out), what they were fitted on, and the
  verdict on the prediction (`verdict`)."""
  score: str
  slope: float | None
  dims: tuple[int, ...]  # the d_k fitted
  interval: Bootstrap
  reference: float | None
  bracket: tuple[float, float] | None = None
  band: tuple[float, float] | None = None  # pre-registered; None: no verdict can be `holds`
  verdict: str | None = None
  deciding_half_width: float | None = None  # where unresolved (`deciding_half_width`)
  # The cells that keep the bracket wide (`wide_intervals`): (d_k, low, high).
  wide: tuple[tuple[int, float, float], ...] = ()

  @property
  def half_width(self) -> float | None:
    return None if self.bracket is None else (self.bracket[1] - self.bracket[0]) / 2


@dataclasses.dataclass(frozen=True)
class Analysis:
  grid: Grid
  losses: dict[Cell, float]
  thresholds: dict[tuple[str, int], Threshold]
  fails: dict[Cell, bool]
  best: dict[int, float]
  sensitivity: dict[tuple[str, int], float | None]
  laws: dict[str, Law]
  diagnostics: dict[Cell, dict[str, float | None]]  # means over seeds that logged them
  test_bleu: dict[Cell, float | None]  # mean over seeds not diverged
  # The same analysis on the learning rates every score ran, where the scores'
  # plans differ and share at least two rates (the module's docstring); else None.
  shared: Analysis | None = None
  # The attention rule beside the loss rule: lr_att per (score, d_k), and its
  # law per score (a bracket and a verdict; no interpolation, so no point).
  attention: dict[tuple[str, int], AttentionThreshold] = dataclasses.field(default_factory=dict)
  attention_laws: dict[str, Law] = dataclasses.field(default_factory=dict)


def _mean_known(values: Iterable[float | None]) -> float | None:
  known = [v for v in values if v is not None]
  return float(np.mean(known)) if known else None


def analyse(grid: Grid, margin: float = FAILURE_MARGIN,
            replicates: int = BOOTSTRAP_REPLICATES,
            bands: Mapping[str, tuple[float, float]] | None = None) -> Analysis:
  """Every number of the rule for `grid` (partial or complete); `bands`: the
  verdict bands of the slopes pre-registered with the grid, per score (None:
  the grid registered none, and no verdict is `holds`)."""
  losses = mean_losses(grid.records)
  per_seed = seed_losses(grid.records)
  ln_vocab = math.log(grid.vocab_size)
  thresholds, sens, laws = {}, {}, {}
  for score in grid.scores:
    planned = {dim: grid.planned(score, dim) for dim in grid.dims[score]}
    for dim in grid.dims[score]:
      curve = curve_of(losses, score, dim)
      if curve:
        thresholds[(score, dim)] = threshold(curve, planned[dim], margin)
        sens[(score, dim)] = sensitivity([v for _, v in curve], ln_vocab)
    own = {d: t for (s, d), t in thresholds.items() if s == score}
    points = fit_points(own)
    mine = {(c.dim, c.lr): v for c, v in per_seed.items() if c.score == score}
    point, reference = slope(points), REFERENCE_SLOPES.get(score)
    intervals, band = intervals_of(own), (bands or {}).get(score)
    bracket = slope_bracket(intervals)
    said = verdict(bracket, reference, band)
    laws[score] = Law(score, point, tuple(d for d, _ in points),
                      bootstrap_slope(mine, planned, margin, replicates), reference,
                      bracket, band, said,
                      deciding_half_width(point, reference, band) if said == UNRESOLVED
                      else None, wide_intervals(intervals))
  fails, best = absolute_failures(losses, margin)
  by_cell = records_by_cell(grid.records)
  attention, attention_laws = {}, {}
  for score in grid.scores:
    own = {}
    for dim in grid.dims[score]:
      rates = grid.planned(score, dim)
      points = [(lr, cell_saturates(by_cell[Cell(score, dim, lr)])) for lr in rates
                if Cell(score, dim, lr) in by_cell]
      if points:
        own[dim] = attention[(score, dim)] = attention_threshold(points, rates)
    intervals = intervals_of(own)
    reference, band = REFERENCE_SLOPES.get(score), (bands or {}).get(score)
    bracket = slope_bracket(intervals)
    said = verdict(bracket, reference, band)
    attention_laws[score] = Law(score, None, tuple(d for d, *_ in intervals),
                                Bootstrap(None, None, 0, 0), reference, bracket, band, said,
                                wide=wide_intervals(intervals))
  diagnostics = {c: {k: _mean_known(r.diagnostics.get(k) for r in rs)
                     for k in rs[0].diagnostics} for c, rs in by_cell.items()}
  bleu = {c: _mean_known(r.test_bleu for r in rs) for c, rs in by_cell.items()}
  rates = shared_rates(grid)
  shared = None
  if len(rates) >= 2 and any(len(v) > len(rates) for v in grid.learning_rates.values()):
    shared = analyse(on_rates(grid, rates), margin, replicates, bands)
  return Analysis(grid, losses, thresholds, fails, best, sens, laws, diagnostics, bleu,
                  shared, attention, attention_laws)
