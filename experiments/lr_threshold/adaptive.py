"""The adaptive rule of the `transformer_lr_premise_cpu` grid (its preset's
docstring, stages 2 and 3), as a function of the analysis so far: which
learning rates each (score, d_k) curve asks for next (`plan_next`), on the
preset's quarter-decade ladder, and the planned ones not yet finished
(`unfinished`). `report --plan` prints both and commands.sh trains them.
"""

from __future__ import annotations

import math
from typing import Sequence

from experiments.lr_threshold.grids import Cell
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise
from experiments.lr_threshold.threshold import Analysis


def ladder_index(lr: float, ladder: Sequence[float] = premise.LADDER) -> int:
  """The place of `lr` on the ladder; a ValueError for a rate not on it."""
  for i, rung in enumerate(ladder):
    if math.isclose(lr, rung, rel_tol=1e-6):
      return i
  raise ValueError(f"learning rate {lr:g} is not on the ladder ({', '.join(map(str, ladder))}).")


def plan_next(a: Analysis, ladder: Sequence[float] = premise.LADDER
              ) -> dict[tuple[str, int], tuple[float, ...]]:
  """The rates the adaptive rule asks for next (the preset's docstring,
  stages 2 and 3), per (score, d_k), none of them planned yet. A curve with
  a planned rate not yet known asks for nothing: its runs are under way.
  Stage 2 first: a half-decade below where lr_opt is the curve's lowest
  rate (or no L is finite), above where L never reaches the target, within
  the ladder. Else stage 3: the ladder's middle rate of each grid interval
  of lr* and of lr_att wider than one step."""
  out = {}
  g = a.grid
  for score in g.scores:
    for dim in g.dims[score]:
      planned = g.planned(score, dim)
      t, att = a.thresholds.get((score, dim)), a.attention.get((score, dim))
      if t is None or not t.complete or any(Cell(score, dim, lr) in g.missing for lr in planned):
        continue
      places = [ladder_index(lr, ladder) for lr in planned]
      new = set()
      if (t.lowest or t.nowhere) and min(places) > 0:
        new.add(ladder[max(min(places) - 2, 0)])
      if t.above and max(places) < len(ladder) - 1:
        new.add(ladder[min(max(places) + 2, len(ladder) - 1)])
      if not new:
        for low, high in (t.bracket or (None, None), att.bracket if att else (None, None)):
          if low is None or high is None:
            continue
          i, j = ladder_index(low, ladder), ladder_index(high, ladder)
          if j - i > 1:
            new.add(ladder[(i + j) // 2])
      new -= set(planned)
      if new:
        out[(score, dim)] = tuple(sorted(new))
  return out


def unfinished(a: Analysis) -> dict[tuple[str, int], tuple[float, ...]]:
  """The planned rates of each (score, d_k) whose runs have no result yet:
  runs under way in another process, or runs a kill, a crash or a restart of
  the machine interrupted. `plan_next` asks such a curve for nothing new; a
  re-run of the same sweep resumes them from their checkpoints (and a run
  still under way keeps a second process out by its workdir's lock)."""
  out: dict[tuple[str, int], list[float]] = {}
  for cell in a.grid.missing:
    out.setdefault((cell.score, cell.dim), []).append(cell.lr)
  return {key: tuple(sorted(rates)) for key, rates in out.items()}
