r"""Attention kernels, additive-score memory and model training throughput, measured honestly.

    python -m experiments.kernels.run --preset=cpu --workdir=runs/bench_cpu
    python -m experiments.kernels.run --preset=gpu --workdir=runs/bench_gpu
    python -m experiments.kernels.run --preset=tiny --workdir=/tmp/bench        # seconds
    python -m experiments.kernels.run --suite=kernels --impls=scaled_dot,jax_xla,torch \
        --seq_lens=512 --batch=8 --heads=8 --head_dims=64 --modes=fwd_bwd --workdir=/tmp/b

Suites (--suite, comma-separated):
  kernels   attention forward / forward+backward for every --impls entry over
            the sweep --seq_lens × --head_dims × --heads × --batch × --causal ×
            --dtypes × --modes.
  additive  forward+backward of additive attention, chunked score
            (`scores.additive`) vs the naive `[B, Tq, Tk, a]` one
            (`scores.additive_naive`): temp memory and time at --additive_batch,
            --additive_dim, --additive_seq_lens.
  models    training tokens/s of the RNN Seq2Seq (Britz base) and the
            Transformer (base), and N vmapped seeds vs N sequential runs.

Resumable: a case whose rows are in benchmark.jsonl already (same shapes,
dtype, implementation and device) is not measured again, so the same command
continues a run that was killed or stopped (`--noresume` measures everything
again). `--max_minutes` stops cleanly before the first case that would start
after it, with exit status 75 (`common.EXIT_STOPPED`: not complete, nothing
lost, the same command continues); `--report_only` rewrites benchmark.md and the plots from the rows
on disk (e.g. after a kill) and measures nothing.

Every kernel is checked against a naive float32 einsum reference before it is
timed; one that disagrees is recorded as `refused` and never timed. Programs
are compiled before the clock starts (a program whose compiled memory exceeds
--memory_limit_gb is `skipped`), every call ends in `block_until_ready`,
warm-up calls are discarded, and the median and spread of the repeats are
reported. Writes into --workdir: `benchmark.jsonl` (one row per measurement, appended
as measured; earlier runs' rows are kept, each row names its `run`),
`benchmark.md` (tables), and log-log plots `kernels_*.png` (time and memory vs
sequence length per implementation) and `additive_memory.png`.

This file is the command line only: flags -> `Settings` (preset + flags given)
-> the suites of `experiments/kernels/`, which get everything from it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging

from attention_jax.measure import benchmarking as bm
from attention_jax.sweep import workdir_lock
from attention_jax import files
from experiments import common
from experiments.kernels import additive
from experiments.kernels import jsonl
from experiments.kernels import kernels
from experiments.kernels import models
from experiments.kernels import report
from experiments.kernels import resume
from experiments.kernels import settings as settings_lib

FLAGS = flags.FLAGS

SUITES = {"kernels": kernels, "additive": additive, "models": models}

flags.DEFINE_string("workdir", None, "Output folder for benchmark.jsonl, benchmark.md and plots.")
flags.DEFINE_enum("preset", "cpu", list(settings_lib.PRESETS),
                  "Starting values; explicit flags override them.")
# A flag per `Settings` field (--suite, --impls, --seq_lens, ...), its help in the field.
common.define_field_flags(settings_lib.Settings)
flags.DEFINE_float("max_minutes", None, "Stop before the first case that would start after "
                   "this many minutes (the rows so far are on disk; the same command continues).")
flags.DEFINE_bool("resume", True, "Skip the cases benchmark.jsonl holds already for this "
                  "device (--noresume measures them again, as new rows).")
flags.DEFINE_bool("report_only", False, "Rewrite benchmark.md and the plots from the rows "
                  "on disk for these settings; measure nothing.")


def _fail(message: str):
  sys.exit(f"error: {message}")


def settings_from_flags() -> settings_lib.Settings:
  """The preset with the flags given on the command line; a ValueError names a bad flag."""
  return settings_lib.from_preset(FLAGS.preset, **common.overrides(settings_lib.Settings))


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}")
  if not FLAGS.workdir:
    _fail("`--workdir` is required.")
  if FLAGS.max_minutes is not None and not FLAGS.max_minutes > 0:
    _fail(f"`--max_minutes` must be > 0, got {FLAGS.max_minutes}.")
  try:
    settings = settings_from_flags()
  except ValueError as e:
    _fail(str(e))
  try:
    common.check_output_dir("workdir", FLAGS.workdir)
    if FLAGS.report_only:
      check_report_only(FLAGS.workdir)
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with workdir_lock.WorkdirLock(FLAGS.workdir, log=print):
      stopped = measure(settings, FLAGS.workdir, command=" ".join(sys.argv[1:]),
                        max_minutes=FLAGS.max_minutes, resume_rows=FLAGS.resume,
                        report_only=FLAGS.report_only)
  except ValueError as e:
    _fail(str(e))
  except OSError as e:  # a full disk: the rows measured so far are on disk
    _fail(f"{FLAGS.workdir}: {e.strerror or e} ({e.filename or 'while writing'})")
  if stopped:  # not complete, but nothing lost: a script calls the same command again
    sys.exit(common.EXIT_STOPPED)


def check_report_only(workdir: str) -> None:
  """A ValueError naming the file unless `workdir` holds a benchmark.jsonl
  to report: `--report_only` on an empty folder wrote an empty report and
  said every case 'was there already'."""
  path = os.path.join(workdir, "benchmark.jsonl")
  if not os.path.exists(path):
    raise ValueError(f"`--report_only`: {path} does not exist, so there is nothing to report; "
                     "drop --report_only to measure.")


def measure(settings: settings_lib.Settings, workdir: str, command: str, *,
            max_minutes: float | None = None, resume_rows: bool = True,
            report_only: bool = False) -> bool:
  """Runs the suites; appends each row to benchmark.jsonl as it is measured.

  benchmark.jsonl only grows: each row carries the `run` it belongs to (start
  time and PID), so a killed or crashed run loses nothing measured, before or
  by it. With `resume_rows`, measurements already there for this device are
  skipped (`resume.Progress`); `max_minutes` stops before the next case once
  passed. benchmark.md and the plots show every row of these settings (old
  and new) and are replaced atomically at the end. Returns whether
  `max_minutes` stopped it before every case was measured (the driver then
  exits with `common.EXIT_STOPPED`); measurements still missing otherwise
  (a case that failed) are counted in its last line.
  """
  machine = bm.machine_description()
  logging.info("machine: %s", machine)
  path = os.path.join(workdir, "benchmark.jsonl")
  run_id = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}/{os.getpid()}"
  earlier = jsonl.read_rows(path) if (resume_rows or report_only) else []
  progress = resume.Progress(earlier, machine, max_minutes=max_minutes,
                             report_only=report_only)
  new_rows = 0
  stopped = False
  # `--report_only` leaves benchmark.jsonl as it is (not even a cut line ended).
  appending = contextlib.nullcontext(None) if report_only else jsonl.appending(
      path, machine, run_id)
  with appending as append:

    def write(row: dict) -> None:
      nonlocal new_rows
      if not progress.has({**row, **progress.machine}):  # a model row measured again
        progress.add(append(row))
        new_rows += 1

    try:
      for suite in settings.suite:
        SUITES[suite].run(settings, write, progress)
    except resume.OutOfTime:
      stopped = True
  rows = progress.rows_asked()
  if report_only and not rows:
    raise ValueError(f"`--report_only`: {path} holds no rows of these settings measured on "
                     f"this device ({machine['platform']}, {machine['device_kind']}); nothing "
                     "to report.")
  files.atomic_write(os.path.join(workdir, "benchmark.md"),
                           report.markdown_tables(rows, machine, command))
  for name in report.plot(rows, workdir):
    print(f"wrote {os.path.join(workdir, name)}")
  missing = progress.missing_count()
  if report_only:
    print(f"wrote benchmark.md from {len(rows)} rows of {path}"
          + (f"; {missing} measurements of these settings are not there" if missing else ""))
    return False
  print(f"appended {new_rows} rows (run {run_id}) to {path}; {progress.skipped_cases} cases "
        f"were there already; wrote benchmark.md ({len(rows)} rows)")
  if stopped:
    print(f"stopped by --max_minutes={max_minutes:g} before a case still to measure "
          f"(exit status {common.EXIT_STOPPED}); the same command continues")
  elif missing:
    print(f"{missing} measurements missing")
  return stopped


if __name__ == "__main__":
  app.run(main)
