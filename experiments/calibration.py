r"""Calibrates a sweep before it runs: measured step and evaluation times -> its --steps.

    python -m experiments.calibration --preset=gpu --workdir=runs/gpu_plan

A device command lasts at most 10 minutes and a machine may be given back
between two commands, so the `gpu` sweep is planned to finish in a few pieces
of whole (arm, dim) cells. This measures, for a few cells (`--cells`, default
the first arm at the largest dimension and the last arm at the smallest), with
the sweep's own trainer, seeds and dtype:

  - the choice of the evaluation batches before training (`check_memory`,
    which compiles programs whose cheap memory bound does not fit);
  - the first training step (compilation) and the median of the next
    `--calibration_steps` steps;
  - one validation (greedy BLEU on the validation sentences and the
    perplexity), first call (compiling the decoder) and second;
  - the test decode at the final beam on one batch, first and second call.

`plan` then sizes the sweep from the slowest measured cell (every cell is
taken to cost that much): each of `--pieces` pieces of `--piece_minutes`
(times `SAFETY`) holds ceil(cells / pieces) whole cells; a cell is its fixed
time (compilations, the final test decode, the final perplexity) plus steps
times (step + validations spread over the steps); steps are rounded down to
a multiple of the checkpoint interval and capped at the preset's --steps. Where that leaves fewer than
`--min_steps`, the plan drops dimensions (keeping the smallest and the
largest) until it fits, and says so. Writes `calibration.json` (the
measurements, the plan and the flags the sweep takes from it) and
`calibration.md`; the json names its commit, versions, device and command
(`provenance`, as every result row does). The sweep reads the plan itself,
nothing copied by hand:

    python -m experiments.ablation --preset=gpu --calibration=runs/gpu_plan/calibration.json \
        --workdir=runs/gpu

(`read_plan`). On a machine without a per-command limit, size the plan for the
time the whole sweep may take: `--pieces=1 --piece_minutes=MINUTES`.

`--steps_only` times only the training step of each cell (no evaluation, no
plan) and writes `calibration_steps.json` and `calibration_steps.md` instead,
so a calibration.json a sweep reads is never replaced by one without a plan:
the measured step of every sweep cell, where the compile check predicts it.
Each cell's line is printed as it ends, so a command cut by its time limit
still leaves the cells it finished in its log.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
from typing import Any, Callable

from absl import app
from absl import flags

from attention_jax.analysis import tables
from attention_jax.measure import benchmarking
from experiments import common

# The share of a piece's minutes the plan fills: a cell's time on the device is
# not known to better than this before the first sweep has run there.
SAFETY = 0.8

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined only when this module is the program, since
  other drivers that tests import beside it define `--arms`/`--dims` too."""
  flags.DEFINE_string("cells", None, "Comma-separated ARM:DIM cells to measure (default: the "
                      "first arm at the largest dimension, the last arm at the smallest).")
  flags.DEFINE_integer("calibration_steps", 20, "Timed training steps per cell after the first.")
  flags.DEFINE_integer("pieces", 3, "Sweep pieces (device commands) the plan may take.")
  flags.DEFINE_float("piece_minutes", 7.0, "Minutes of one piece (--max_minutes of the sweep).")
  flags.DEFINE_integer("min_steps", 1000, "Fewest training steps worth a sweep: below, the plan "
                       "drops dimensions.")
  flags.DEFINE_string("arms", None, "Comma-separated arms of the sweep (default from the preset).")
  flags.DEFINE_string("dims", None, "Comma-separated dimensions of the sweep (default from the "
                      "preset).")
  flags.DEFINE_bool("steps_only", False, "Time only each cell's training step (no evaluation, no "
                    "plan); writes calibration_steps.json/.md.")
  common.define_flags()


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


def parse_cells(text: str) -> tuple[tuple[str, int], ...]:
  """`"additive:1024,multiplicative:128"` -> ((arm, dim), ...); ValueError naming --cells."""
  cells = []
  for item in (part.strip() for part in text.split(",")):
    if not item:
      continue
    arm, _, dim = item.partition(":")
    if not arm or not dim.isdigit() or int(dim) < 1:
      raise ValueError(f"`--cells` items must look like ARM:DIM (e.g. additive:1024), "
                       f"got {item!r}.")
    cells.append((arm, int(dim)))
  if not cells:
    raise ValueError("`--cells` is empty.")
  return tuple(cells)


def default_cells(arms: tuple[str, ...], dims: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
  """The first arm at the largest dimension and the last arm at the smallest."""
  first, last = (arms[0], max(dims)), (arms[-1], min(dims))
  return (first,) if first == last else (first, last)


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
         test_sentences: int, min_steps: int, max_steps: int) -> dict[str, Any]:
  """The sweep's steps and dimensions from the slowest measured cell (module docstring).

  Steps never exceed `max_steps` (the preset's own length).
  Returns a dict with `steps`, `dims`, `eval_every`, `cells_per_piece`,
  `predicted_cell_s`, `fits` (False: even the two extreme dimensions leave
  fewer than `min_steps`) and `flags` (for the sweep's command line).
  """
  if not measured:
    raise ValueError("no cell was measured.")
  if pieces < 1 or piece_minutes <= 0:
    raise ValueError(f"`--pieces` must be >= 1 and `--piece_minutes` > 0, got {pieces}, "
                     f"{piece_minutes}.")
  slowest = max(measured, key=lambda t: cell_seconds(t, 1000, eval_every=eval_every,
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
    budget = SAFETY * 60.0 * piece_minutes / per_piece
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
              "fits": steps >= min_steps}
    if result["fits"]:
      break
  result["flags"] = [f"--steps={result['steps']}", f"--eval_every={result['eval_every']}",
                     "--dims=" + ",".join(str(d) for d in result["dims"])]
  return result


# The fields a sweep takes from a plan, as `--calibration` gives them to it.
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
  return {"steps": plan["steps"], "eval_every": plan["eval_every"],
          "dims": ",".join(str(d) for d in dims)}


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


def _timed(fn: Callable[[], Any]) -> float:
  return benchmarking.timed(fn)[1]


def measure_cell(cfg, arm_name: str, dim: int, data, steps: int,
                 log: Callable[[str], None] = print, steps_only: bool = False) -> CellTimes:
  """Times one cell with the sweep's trainer (`train_lib.EnsembleTrainer`).

  `steps_only`: the evaluation fields are 0 (not measured)."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top

  trainer, build_s, _ = benchmarking.timed(
      lambda: train_lib.EnsembleTrainer(cfg.point(config_lib.Arm.of(arm_name, dim)), data))
  batches = trainer.train_batches(0)

  def train_step(i: int):
    """Step i of every member on the next batch, into the trainer's state."""
    trainer.state = trainer.step(trainer.state.replace(step=i), next(batches))
    return trainer.state.loss

  # The first step (it compiles) and `steps` more, each with the next batch.
  step_times = benchmarking.time_steps(train_step, 1 + steps).wall_s
  first_step_s, step_times = step_times[0], step_times[1:]
  ev = trainer.evaluator

  def validation():
    ev.bleu(trainer.params, "validation", cfg.eval_examples, ev.val_beam_size)
    ev.perplexity(trainer.params, "validation")

  batch_search_s = 0.0
  if not steps_only:  # what the sweep does before its first step; validation and test reuse it
    _, batch_search_s, _ = benchmarking.timed(lambda: ev.check_memory(log))
  per_batch = ev.eval_batch_size(f"beam{cfg.beam_size}", "test")
  test = lambda: ev.translate(trainer.params, "test", per_batch, cfg.beam_size)
  if steps_only:
    first_validation_s = validation_s = first_test_batch_s = test_batch_s = 0.0
  else:
    first_validation_s, validation_s = _timed(validation), _timed(validation)
    first_test_batch_s, test_batch_s = _timed(test), _timed(test)
  times = CellTimes(arm=arm_name, dim=dim, build_s=build_s, first_step_s=first_step_s,
                    step_s=statistics.median(step_times), first_validation_s=first_validation_s,
                    validation_s=validation_s, first_test_batch_s=first_test_batch_s,
                    test_batch_s=test_batch_s, test_batch_sentences=per_batch,
                    batch_search_s=batch_search_s)
  log(f"[{arm_name}:{dim}] " + ", ".join(
      f"{k} {v:.4f}" for k, v in dataclasses.asdict(times).items() if k.endswith("_s")))
  return times


def markdown(measured: list[CellTimes], result: dict[str, Any], settings: str) -> str:
  """calibration.md: the measurements and the plan."""
  header = ["cell", "build s", "batch search s", "first step s", "step ms",
            "validation s (first)", "test batch s (first)"]
  rows = [[f"{t.arm}:{t.dim}", f"{t.build_s:.1f}", f"{t.batch_search_s:.1f}",
           f"{t.first_step_s:.1f}", f"{1000 * t.step_s:.1f}",
           f"{t.validation_s:.1f} ({t.first_validation_s:.1f})",
           f"{t.test_batch_s:.2f} ({t.first_test_batch_s:.1f})"] for t in measured]
  lines = [f"# Sweep calibration\n\n{settings}\n",
           tables.markdown(header, rows, align=[None] + ["r"] * 6, padded=True).rstrip("\n")]
  verdict = "fits" if result["fits"] else "does NOT fit: fewer steps than --min_steps"
  lines.append(
      f"\nPlan ({verdict}): {result['cells']} cells (dims {result['dims']}) in "
      f"{result['pieces']} pieces of {result['piece_minutes']:g} min x {result['safety']}, "
      f"{result['cells_per_piece']} cells each; slowest cell {result['slowest_cell']} predicted "
      f"{result['predicted_cell_s']:.0f} s at {result['steps']} steps (validation every "
      f"{result['eval_every']}).\n\nSweep flags: `{' '.join(result['flags'])}`\n")
  return "\n".join(lines)


def steps_markdown(measured: list[CellTimes], settings: str) -> str:
  """calibration_steps.md: each cell's first step (compiling) and median step."""
  rows = [[f"{t.arm}:{t.dim}", f"{t.build_s:.1f}", f"{t.first_step_s:.1f}",
           f"{1000 * t.step_s:.1f}"] for t in measured]
  return (f"# Training steps of the sweep's cells\n\n{settings}\n\n"
          + tables.markdown(["cell", "build s", "first step s", "step ms"], rows,
                            align=[None, "r", "r", "r"], padded=True))


def accelerator_note(backend: str) -> str | None:
  """The line said at once where JAX runs on no GPU or TPU (`backend`, as
  `jax.default_backend()` gives it), else None. The calibration goes on
  there (on the CPU it is what the tests and `scripts/gpu_run.sh`'s toy
  run), but its first cell compiles and times for minutes before it prints
  anything, and its plan is the CPU's, not a device's."""
  if backend in ("gpu", "tpu"):
    return None
  return (f"calibration: JAX sees no GPU or TPU (backend {backend}): timing this "
          f"{backend.upper()}, so the plan sizes a sweep on it, not on a device (make venv-cuda "
          "or make venv-tpu for one); the first cell takes minutes before its line.")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  from attention_jax.sweep import datasets  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import host_memory  # pylint: disable=g-import-not-at-top
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import provenance  # pylint: disable=g-import-not-at-top
  host_memory.keep_freed_memory()  # the sweep's process, measured (before JAX starts)
  # Given as text: parsed with the other fields (`common.overrides`).
  extra = {name: FLAGS[name].value for name in ("arms", "dims") if FLAGS[name].value is not None}
  cfg, _ = common.build_config(extra)
  try:
    cells = parse_cells(FLAGS.cells) if FLAGS.cells else default_cells(cfg.arms, cfg.dims)
    if FLAGS.calibration_steps < 1:
      raise ValueError(f"`--calibration_steps` must be >= 1, got {FLAGS.calibration_steps}.")
    if FLAGS.pieces < 1 or not FLAGS.piece_minutes > 0:
      raise ValueError(f"`--pieces` must be >= 1 and `--piece_minutes` > 0, got "
                       f"{FLAGS.pieces}, {FLAGS.piece_minutes}.")
  except ValueError as e:
    sys.exit(f"error: {e}")
  import jax  # pylint: disable=g-import-not-at-top
  note = accelerator_note(jax.default_backend())
  if note:
    print(note, flush=True)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  data = datasets.load_data(cfg)
  measured = [measure_cell(cfg, arm, dim, data, FLAGS.calibration_steps,
                           steps_only=FLAGS.steps_only)
              for arm, dim in cells]
  members = len(cfg.run_members())
  extra_members = f" x {cfg.members}" if cfg.members else ""
  settings = (f"preset {FLAGS.preset}, {members} members vmapped ({cfg.seeds} seeds"
              f"{extra_members}), dtype {cfg.dtype}, batch {cfg.batch_size}")
  out = {"preset": FLAGS.preset, "measured": [dataclasses.asdict(t) for t in measured]}

  def write(name: str, value: dict, settings: str, text: str) -> None:
    value = {**value, "settings": settings, "provenance": provenance.fields()}
    files.atomic_write(os.path.join(FLAGS.workdir, f"{name}.json"), json.dumps(value, indent=1))
    files.atomic_write(os.path.join(FLAGS.workdir, f"{name}.md"), text)
    print(text)

  if FLAGS.steps_only:
    settings += f"; median of {FLAGS.calibration_steps} training steps after the first"
    write("calibration_steps", out, settings, steps_markdown(measured, settings))
    return
  n_test = len(data.texts("test")[0])
  test_sentences = min(cfg.test_examples, n_test) if cfg.test_examples else n_test
  result = plan(measured, arms=cfg.arms, dims=cfg.dims, pieces=FLAGS.pieces,
                piece_minutes=FLAGS.piece_minutes, eval_every=cfg.eval_every,
                checkpoint_every=cfg.checkpoint_every, test_sentences=test_sentences,
                min_steps=FLAGS.min_steps, max_steps=cfg.steps)
  settings += f", beam {cfg.beam_size} on {test_sentences} test sentences"
  write("calibration", {**out, "plan": result}, settings, markdown(measured, result, settings))


if __name__ == "__main__":
  define_flags()
  app.run(main)
