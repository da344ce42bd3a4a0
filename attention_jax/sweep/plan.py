"""A sweep's plan from measured cell times, and the plan read back by the sweep.

`experiments.calibration` measures a few cells of a sweep on the device
(`CellTimes`); `plan` sizes the sweep from the slowest of them: its steps,
its validation interval and, where even `min_steps` do not fit, fewer
dimensions. The sweep reads the plan back from calibration.json
(`read_plan`, the ablation's `--calibration`), checked before any work.
Pure arithmetic and file reading: no JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

# The share of a piece's minutes the plan fills: a cell's time on the device is
# not known to better than this before the first sweep has run there.
SAFETY = 0.8


@dataclasses.dataclass(frozen=True)
class CellTimes:
  """Seconds measured for one (arm, dim) cell of the sweep (all seeds together)."""
  arm: str
  dim: int
  build_s: float  # model and optimiser state created
  first_step_s: float  # compilation and one step
  step_s: float  # median of the timed steps
  first_validation_s: float  # greedy BLEU + perplexity, compiling
  validation_s: float  # the same again, compiled
  first_test_batch_s: float  # one batch at the final beam, compiling
  test_batch_s: float  # the same again
  test_batch_sentences: int
  # Choosing the evaluation batches before training (`check_memory`): where
  # the cheap bound of a program's memory does not fit, it compiles the
  # program, several times while it searches. Timed since a sweep's first
  # cell on a GPU logged no step in 6 minutes (results/gpu_h200/2026-11-28).
  batch_search_s: float = 0.0
  # With `--concurrent` N > 1: N copies of the cell stepping at once, each in
  # a process of its own (`shared_steps`); the median of their median steps
  # and the slowest first step (every copy compiling at once).
  concurrent: int = 1
  shared_step_s: float | None = None
  shared_first_step_s: float | None = None

  def running(self) -> "CellTimes":
    """These times as the cell runs beside `concurrent - 1` others: its
    training step (and first step) as measured under that sharing."""
    if self.concurrent <= 1 or self.shared_step_s is None:
      return self
    return dataclasses.replace(self, step_s=self.shared_step_s,
                               first_step_s=self.shared_first_step_s or self.first_step_s)


def cell_seconds(times: CellTimes, steps: int, *, eval_every: int, test_sentences: int) -> float:
  """Predicted seconds of one cell trained for `steps` and evaluated as the sweep does."""
  validations = max(1, steps // eval_every)
  test_batches = math.ceil(test_sentences / max(times.test_batch_sentences, 1))
  compile_s = ((times.first_step_s - times.step_s)
               + (times.first_validation_s - times.validation_s)
               + (times.first_test_batch_s - times.test_batch_s))
  return (times.build_s + times.batch_search_s + max(compile_s, 0.0) + steps * times.step_s
          + validations * times.validation_s
          + test_batches * times.test_batch_s + times.validation_s)  # + the final perplexity


def steps_that_fit(times: CellTimes, cell_budget_s: float, *, eval_every: int,
                   test_sentences: int, multiple: int) -> int:
  """The most steps (a multiple of `multiple`) whose cell fits in `cell_budget_s`; 0 if none."""
  fixed = cell_seconds(times, 0, eval_every=eval_every, test_sentences=test_sentences)
  per_step = times.step_s + times.validation_s / eval_every
  if per_step <= 0 or cell_budget_s <= fixed:
    return 0
  return int((cell_budget_s - fixed) / per_step) // multiple * multiple


def plan(measured: list[CellTimes], *, arms: tuple[str, ...], dims: tuple[int, ...],
         pieces: int, piece_minutes: float, eval_every: int, checkpoint_every: int,
         test_sentences: int, min_steps: int, max_steps: int,
         concurrent: int = 1) -> dict[str, Any]:
  """The sweep's steps and dimensions from the slowest measured cell (module docstring).

  Steps never exceed `max_steps` (the preset's own length). With `concurrent`
  N > 1 a piece trains its cells N at a time (`--workers=N` sharing the
  device), in ceil(cells / N) waves, each cell at its step measured beside
  N - 1 others (`CellTimes.running`); the plan's flags then include
  `--workers=N`.
  Returns a dict with `steps`, `dims`, `eval_every`, `cells_per_piece`,
  `predicted_cell_s`, `fits` (False: even the two extreme dimensions leave
  fewer than `min_steps`) and `flags` (for the sweep's command line).
  """
  if not measured:
    raise ValueError("no cell was measured.")
  if pieces < 1 or piece_minutes <= 0:
    raise ValueError(f"`--pieces` must be >= 1 and `--piece_minutes` > 0, got {pieces}, "
                     f"{piece_minutes}.")
  if concurrent < 1:
    raise ValueError(f"`--concurrent` must be >= 1, got {concurrent}.")
  running = [t.running() for t in measured]
  slowest = max(running, key=lambda t: cell_seconds(t, 1000, eval_every=eval_every,
                                                    test_sentences=test_sentences))
  dims = tuple(sorted(dims))
  candidates = [dims]
  middle = list(dims[1:-1])
  while middle:  # drop the middle dimensions, the largest first
    middle.pop()
    candidates.append((dims[0], *middle, dims[-1]))
  result = None
  for candidate in candidates:
    cells = len(arms) * len(candidate)
    per_piece = math.ceil(cells / pieces)
    budget = SAFETY * 60.0 * piece_minutes / math.ceil(per_piece / concurrent)
    steps = min(max_steps, steps_that_fit(slowest, budget, eval_every=eval_every,
                                          test_sentences=test_sentences,
                                          multiple=checkpoint_every))
    # Three validations per run (greedy, as the quick preset), at checkpoints.
    every = max(checkpoint_every, steps // 3 // checkpoint_every * checkpoint_every)
    steps = min(max_steps, steps_that_fit(slowest, budget, eval_every=every,
                                          test_sentences=test_sentences,
                                          multiple=checkpoint_every))
    result = {"steps": steps, "dims": list(candidate), "eval_every": every,
              "cells": cells, "cells_per_piece": per_piece, "pieces": pieces,
              "piece_minutes": piece_minutes, "safety": SAFETY,
              "slowest_cell": f"{slowest.arm}:{slowest.dim}",
              "predicted_cell_s": round(cell_seconds(slowest, steps, eval_every=every,
                                                     test_sentences=test_sentences), 1),
              "concurrent": concurrent, "fits": steps >= min_steps}
    if result["fits"]:
      break
  result["flags"] = [f"--steps={result['steps']}", f"--eval_every={result['eval_every']}",
                     "--dims=" + ",".join(str(d) for d in result["dims"])]
  if concurrent > 1:
    result["flags"].append(f"--workers={concurrent}")
  return result


# The fields a sweep takes from a plan, as `--calibration` gives them to it
# (and `workers`, where the plan trains several cells at a time).
PLAN_FIELDS = ("steps", "eval_every", "dims")


def _positive_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def plan_fields(written: Any, preset: str, where: str) -> dict[str, Any]:
  """The sweep's `steps`, `eval_every` and `dims` (comma-separated text, as the
  flag takes it) from the parsed calibration.json `written`, checked: a plan
  that does not fit, one measured for another preset, or a file that is no
  plan raises a ValueError naming `where` (the flag and the file)."""
  plan = written.get("plan") if isinstance(written, dict) else None
  if not isinstance(plan, dict):
    raise ValueError(f"{where} has no \"plan\": write it with "
                     "`python -m experiments.calibration`.")
  calibrated_for = written.get("preset")
  if calibrated_for is not None and calibrated_for != preset:
    raise ValueError(f"{where} was calibrated for --preset={calibrated_for}, not "
                     f"--preset={preset}.")
  if plan.get("fits") is False:
    raise ValueError(f"{where}: the plan does not fit ({plan.get('steps')} steps for dims "
                     f"{plan.get('dims')}); see its calibration.md.")
  dims = plan.get("dims")
  bad = [name for name, ok in (("steps", _positive_int(plan.get("steps"))),
                               ("eval_every", _positive_int(plan.get("eval_every"))),
                               ("dims", isinstance(dims, list) and bool(dims)
                                and all(_positive_int(d) for d in dims)))
         if not ok]
  if bad or plan.get("fits") is not True:
    what = ", ".join(bad) if bad else "fits"
    raise ValueError(f"{where}: the plan's {what}: missing or not valid (steps and "
                     "eval_every positive integers, dims a list of them, fits true).")
  fields = {"steps": plan["steps"], "eval_every": plan["eval_every"],
            "dims": ",".join(str(d) for d in dims)}
  concurrent = plan.get("concurrent", 1)
  if concurrent != 1:  # its cells planned to train that many at a time
    if not _positive_int(concurrent):
      raise ValueError(f"{where}: the plan's concurrent {concurrent!r} is not a positive "
                       "integer.")
    fields["workers"] = concurrent
  return fields


def read_plan(path: str, preset: str, flag: str = "calibration") -> dict[str, Any]:
  """`plan_fields` of the calibration.json at `path`; a file that is missing,
  unreadable or not JSON raises a ValueError naming `--flag` and `path`, so
  the driver stops with one line before any work."""
  where = f"`--{flag}` {path}"
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"{where} cannot be read: {getattr(e, 'strerror', None) or e}.") from None
  try:
    written = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where} is not JSON ({e.msg}, line {e.lineno}).") from None
  return plan_fields(written, preset, where)
