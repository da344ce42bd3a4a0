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

`--concurrent=N` also times each cell's training step with N copies of it
training at once, each in a process of its own, as N `--workers` sharing one
GPU do (`workers.gpu_share`); the plan then trains N cells at a time at that
step and adds `--workers=N` to the sweep's flags. The arithmetic of the plan,
and its reading back by the sweep, are `attention_jax.sweep.plan`.

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
import os
import statistics
import sys
from typing import Any, Callable

from absl import app
from absl import flags

from attention_jax.analysis import tables
from attention_jax.measure import benchmarking
from attention_jax.sweep import plan as plan_lib
from experiments import common

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
  flags.DEFINE_integer("concurrent", 1, "Also time each cell's training step with this many "
                       "copies of it training at once, each in its own process, as that many "
                       "--workers sharing one device do; the plan then trains that many cells "
                       "at a time at the step so measured.")
  common.define_flags()


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


def _timed(fn: Callable[[], Any]) -> float:
  return benchmarking.timed(fn)[1]


def _cell_trainer(cfg, arm_name: str, dim: int, data):
  """(the sweep's trainer of the cell (`train_lib.EnsembleTrainer`), the
  seconds it took to build, `train_step(i)`: step i of every member on the
  next batch, into the trainer's state, returning the loss)."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top
  trainer, build_s, _ = benchmarking.timed(
      lambda: train_lib.EnsembleTrainer(cfg.point(config_lib.Arm.of(arm_name, dim)), data))
  batches = trainer.train_batches(0)

  def train_step(i: int):
    trainer.state = trainer.step(trainer.state.replace(step=i), next(batches))
    return trainer.state.loss

  return trainer, build_s, train_step


def measure_cell(cfg, arm_name: str, dim: int, data, steps: int,
                 log: Callable[[str], None] = print,
                 steps_only: bool = False) -> plan_lib.CellTimes:
  """Times one cell with the sweep's trainer (`train_lib.EnsembleTrainer`).

  `steps_only`: the evaluation fields are 0 (not measured)."""
  trainer, build_s, train_step = _cell_trainer(cfg, arm_name, dim, data)
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
  times = plan_lib.CellTimes(
      arm=arm_name, dim=dim, build_s=build_s, first_step_s=first_step_s,
      step_s=statistics.median(step_times), first_validation_s=first_validation_s,
      validation_s=validation_s, first_test_batch_s=first_test_batch_s,
      test_batch_s=test_batch_s, test_batch_sentences=per_batch, batch_search_s=batch_search_s)
  log(f"[{arm_name}:{dim}] " + ", ".join(
      f"{k} {v:.4f}" for k, v in dataclasses.asdict(times).items()
      if k.endswith("_s") and v is not None))
  return times


def _step_copy(cfg, arm_name: str, dim: int, steps: int, barrier, conn) -> None:
  """One of `shared_steps`' processes: builds the cell's trainer and compiles
  its step, waits for the others at `barrier`, then times `steps` steps;
  sends (first step s, median step s), or ('error', one line)."""
  try:
    from attention_jax.sweep import datasets  # pylint: disable=g-import-not-at-top
    from attention_jax.sweep import host_memory  # pylint: disable=g-import-not-at-top
    host_memory.keep_freed_memory()  # as a sweep's worker does, before JAX starts
    _, _, train_step = _cell_trainer(cfg, arm_name, dim, datasets.load_data(cfg))
    first = benchmarking.time_steps(train_step, 1).wall_s[0]
    barrier.wait(timeout=SHARED_WAIT_S)
    times = benchmarking.time_steps(lambda i: train_step(i + 1), steps).wall_s
    conn.send((first, statistics.median(times)))
  except Exception as e:  # pylint: disable=broad-except
    barrier.abort()  # the others stop waiting for this copy
    conn.send(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))


# How long a copy waits for the others to compile before the timed steps.
SHARED_WAIT_S = 900.0


def shared_steps(cfg, arm_name: str, dim: int, steps: int, copies: int) -> tuple[float, float]:
  """(slowest first step, median of the copies' median steps) of `copies`
  copies of the cell training at once, each in a process of its own started
  afresh (as `--workers` are: spawned, their own JAX), all timing their steps
  together once every copy has compiled. A ValueError naming `--concurrent`
  where a copy failed."""
  import multiprocessing  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")
  barrier = ctx.Barrier(copies)
  pipes, processes = [], []
  for _ in range(copies):
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_step_copy, args=(cfg, arm_name, dim, steps, barrier, child))
    process.start()
    child.close()
    pipes.append(parent)
    processes.append(process)
  answers = []
  for parent, process in zip(pipes, processes):
    try:
      answers.append(parent.recv())
    except EOFError:
      answers.append(("error", f"its process ended with status {process.exitcode}"))
  for process in processes:
    process.join(timeout=60)
  failed = [a[1] for a in answers if a[0] == "error"]
  if failed:
    raise ValueError(f"`--concurrent` = {copies}: {len(failed)} of the copies of "
                     f"{arm_name}:{dim} failed: {failed[0]}")
  return max(a[0] for a in answers), statistics.median(a[1] for a in answers)


def markdown(measured: list[plan_lib.CellTimes], result: dict[str, Any], settings: str) -> str:
  """calibration.md: the measurements and the plan."""
  header = ["cell", "build s", "batch search s", "first step s", "step ms",
            "validation s (first)", "test batch s (first)"] + _shared_header(measured)
  rows = [[f"{t.arm}:{t.dim}", f"{t.build_s:.1f}", f"{t.batch_search_s:.1f}",
           f"{t.first_step_s:.1f}", f"{1000 * t.step_s:.1f}",
           f"{t.validation_s:.1f} ({t.first_validation_s:.1f})",
           f"{t.test_batch_s:.2f} ({t.first_test_batch_s:.1f})"] + _shared_cells(t)
          for t in measured]
  lines = [f"# Sweep calibration\n\n{settings}\n",
           tables.markdown(header, rows, align=[None] + ["r"] * (len(header) - 1),
                           padded=True).rstrip("\n")]
  verdict = "fits" if result["fits"] else "does NOT fit: fewer steps than --min_steps"
  lines.append(
      f"\nPlan ({verdict}): {result['cells']} cells (dims {result['dims']}) in "
      f"{result['pieces']} pieces of {result['piece_minutes']:g} min x {result['safety']}, "
      f"{result['cells_per_piece']} cells each; slowest cell {result['slowest_cell']} predicted "
      f"{result['predicted_cell_s']:.0f} s at {result['steps']} steps (validation every "
      f"{result['eval_every']})"
      + (f", {result['concurrent']} cells at a time" if result.get("concurrent", 1) > 1 else "")
      + f".\n\nSweep flags: `{' '.join(result['flags'])}`\n")
  return "\n".join(lines)


def _shared_header(measured: list[plan_lib.CellTimes]) -> list[str]:
  """The columns of the step under sharing, where any cell was so measured."""
  copies = max(t.concurrent for t in measured)
  if copies <= 1:
    return []
  return [f"step ms, {copies} at once (first step s)", f"steps/s, {copies} at once vs one"]


def _shared_cells(t: plan_lib.CellTimes) -> list[str]:
  """A cell's step under sharing and the steps per second of all copies
  against one alone (copies x alone / shared), or nothing where it was not
  measured."""
  if t.concurrent <= 1 or t.shared_step_s is None:
    return []
  return [f"{1000 * t.shared_step_s:.1f} ({t.shared_first_step_s:.1f})",
          f"{t.concurrent * t.step_s / t.shared_step_s:.2f}x"]


def steps_markdown(measured: list[plan_lib.CellTimes], settings: str) -> str:
  """calibration_steps.md: each cell's first step (compiling) and median step."""
  rows = [[f"{t.arm}:{t.dim}", f"{t.build_s:.1f}", f"{t.first_step_s:.1f}",
           f"{1000 * t.step_s:.1f}"] + _shared_cells(t) for t in measured]
  header = ["cell", "build s", "first step s", "step ms"] + _shared_header(measured)
  return (f"# Training steps of the sweep's cells\n\n{settings}\n\n"
          + tables.markdown(header, rows, align=[None] + ["r"] * (len(header) - 1),
                            padded=True))


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
    if FLAGS.concurrent < 1:
      raise ValueError(f"`--concurrent` must be >= 1, got {FLAGS.concurrent}.")
  except ValueError as e:
    sys.exit(f"error: {e}")
  if FLAGS.concurrent > 1:  # the copies share the device with this process, as workers do
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  import jax  # pylint: disable=g-import-not-at-top
  note = accelerator_note(jax.default_backend())
  if note:
    print(note, flush=True)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  data = datasets.load_data(cfg)
  measured = []
  for arm, dim in cells:
    times = measure_cell(cfg, arm, dim, data, FLAGS.calibration_steps,
                         steps_only=FLAGS.steps_only)
    if FLAGS.concurrent > 1:
      try:
        first, step = shared_steps(cfg, arm, dim, FLAGS.calibration_steps, FLAGS.concurrent)
      except ValueError as e:
        sys.exit(f"error: {e}")
      times = dataclasses.replace(times, concurrent=FLAGS.concurrent, shared_step_s=step,
                                  shared_first_step_s=first)
      print(f"[{arm}:{dim}] {FLAGS.concurrent} copies at once: step {1000 * step:.1f} ms "
            f"(alone {1000 * times.step_s:.1f}), first step {first:.1f} s", flush=True)
    measured.append(times)
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
  result = plan_lib.plan(measured, arms=cfg.arms, dims=cfg.dims, pieces=FLAGS.pieces,
                piece_minutes=FLAGS.piece_minutes, eval_every=cfg.eval_every,
                checkpoint_every=cfg.checkpoint_every, test_sentences=test_sentences,
                min_steps=FLAGS.min_steps, max_steps=cfg.steps, concurrent=FLAGS.concurrent)
  settings += f", beam {cfg.beam_size} on {test_sentences} test sentences"
  write("calibration", {**out, "plan": result}, settings, markdown(measured, result, settings))


if __name__ == "__main__":
  define_flags()
  app.run(main)
