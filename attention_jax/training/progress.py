"""What a progress line says of the time left: pure estimators and their clocks.

A run's time left (`run_eta_seconds`) is its steps left at the steady step
time, plus every periodic action still due (softmax diagnostics, validation,
checkpoint) at what it cost when it compiled nothing, plus the final
evaluation (`final_estimate_seconds`). Before each of them has been timed
once the estimate is None, and the line says "not yet timed" instead of a
number: an ETA that left the evaluations out read 0.0 min where 67 s were
left, and one that counted the first validation's compilation in every
later validation (and twice over in the final test) read 2.5 min where 26 s
were left.

Compilation is measured, not guessed: JAX reports every tracing, lowering and
XLA compilation it does (`jax.monitoring`), and a `Stopwatch` subtracts what
happened inside its block from the block's wall time (`Cost.steady`).

Pauses: a step's wall time is clipped at `PAUSE_FACTOR` x the median of the
`MEDIAN_WINDOW` steady steps before it (`StepTimes`). A process stopped by
SIGSTOP (or a laptop's lid, a debugger) for minutes then adds at most that
much to the step-time estimate and to `train_seconds`; a real slow-down
moves the median within a window, and is kept. The first `MIN_SAMPLES`
steps are not clipped (there is no median to compare with yet).

A pause inside a timed action (a validation) stays in that action's cost
until later calls outvote it (each cost is the median of its calls).

The whole sweep's time left (`sweep_eta_seconds`, kept by `SweepProgress`)
adds to the run's own the reports written after it and the runs still
queued, each at the median time a finished run of the sweep took (or,
before one finished, at this run's own projected length), shared between
`workers` one queued run at a time. Measured on the smoke presets:
results/progress_eta.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import statistics
import time
from typing import Callable, Sequence

# A step taking longer than this many times the median step is taken as paused:
# far above what another process's turn on a shared core costs a step, far
# below any pause a person makes. Compilation is kept out before (a step at a
# new batch shape is no steady step at all).
PAUSE_FACTOR = 10.0
MEDIAN_WINDOW = 101
MIN_SAMPLES = 5

# The events JAX reports for each program it compiles (`jax.monitoring`),
# in this order; the last one comes once per program.
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compiled = {"seconds": 0.0, "pending": 0.0}
_programs: list[float] = []  # each compiled program's seconds (tracing, lowering, XLA)
_listening = False


def _on_event(event: str, duration: float, **_) -> None:
  if event in _COMPILE_EVENTS:
    _compiled["seconds"] += duration
    _compiled["pending"] += duration
    if event == _COMPILE_EVENTS[-1]:
      _programs.append(_compiled["pending"])
      _compiled["pending"] = 0.0


def _listen() -> None:
  global _listening
  if not _listening:
    import jax  # here, so that the estimators below import without JAX
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    _listening = True


@dataclasses.dataclass(frozen=True)
class Cost:
  """What a block of work took: `seconds` of wall time, of which
  `compile_seconds` compiling `programs` programs, the longest of them in
  `largest_program` seconds."""
  seconds: float
  compile_seconds: float = 0.0
  programs: int = 0
  largest_program: float = 0.0

  @property
  def steady(self) -> float:
    """The wall time less its compilation: what the block costs next time."""
    return max(0.0, self.seconds - self.compile_seconds)


class Stopwatch:
  """`with Stopwatch() as w: ...`, then `w.cost`: the block's `Cost`."""

  def __init__(self, clock: Callable[[], float] | None = None):
    self.clock = clock or (lambda: time.time())  # looked up at each call: a test's clock
    self.cost: Cost | None = None

  def __enter__(self) -> Stopwatch:
    _listen()
    self._start, self._seconds, self._first = self.clock(), _compiled["seconds"], len(_programs)
    return self

  def __exit__(self, *exc) -> None:
    programs = _programs[self._first:]
    self.cost = Cost(self.clock() - self._start, _compiled["seconds"] - self._seconds,
                     len(programs), max(programs, default=0.0))


class StepTimes:
  """Steady step wall times with pauses clipped out (the module's rule):
  `add` returns the seconds to count for a step, `mean` their mean, and
  `paused` the seconds clipped off so far."""

  def __init__(self):
    self.recent = collections.deque(maxlen=MEDIAN_WINDOW)
    self.count, self.total, self.paused = 0, 0.0, 0.0

  def add(self, seconds: float) -> float:
    kept = seconds
    if len(self.recent) >= MIN_SAMPLES:
      kept = min(seconds, PAUSE_FACTOR * statistics.median(self.recent))
    self.recent.append(seconds)  # unclipped: a lasting slow-down moves the median
    self.count += 1
    self.total += kept
    self.paused += seconds - kept
    return kept

  @property
  def mean(self) -> float | None:
    return self.total / self.count if self.count else None


def due_count(every: int, first: int, last_step: int) -> int:
  """How many of the steps `first..last_step` a periodic action of period
  `every` runs after (`periodic.PeriodicAction.due`: its multiples, and the
  last step)."""
  if every <= 0 or first > last_step:
    return 0
  multiples = last_step // every - (first - 1) // every
  return multiples + (last_step % every != 0)


def run_eta_seconds(step: int, last_step: int, step_seconds: float | None,
                    actions: Sequence[tuple[int, float | None]],
                    final_seconds: float | None) -> float | None:
  """Seconds until a run whose progress line is at `step` of `last_step`
  ends: its steps left at `step_seconds` each, every action of `actions`
  (`(every, seconds)`; those that run after the progress line, so at
  `step` too where due) at its seconds, and the final evaluation. None
  ("not yet timed") while any of these, still to come, has no time yet."""
  if step_seconds is None and step < last_step:
    return None
  total = (last_step - step) * (step_seconds or 0.0)
  for every, seconds in actions:
    n = due_count(every, step, last_step)
    if n:
      if seconds is None:
        return None
      total += n * seconds
  if final_seconds is None:
    return None
  return total + final_seconds


def final_estimate_seconds(decode_seconds: float, perplexity_seconds: float,
                           work_ratio: float, new_programs: int,
                           seconds_per_program: float, other_seconds: float = 0.0) -> float:
  """The final evaluation's seconds from a validation's parts: the test
  decode at `decode_seconds` (a validation's decode, compilation left out)
  times `work_ratio` (its batches x beam over the validation's), the
  validation perplexity again, `other_seconds` (the final diagnostics), and
  the programs it compiles that validation did not (the test decoder at
  another beam or shape, the heat map's decoder) at `seconds_per_program`
  each: the longest program the validation compiled (its decoder, or a
  perplexity program; a beam search compiles slower than the greedy
  decoder, and small helper programs of milliseconds would make a mean
  meaningless)."""
  return (decode_seconds * work_ratio + perplexity_seconds + other_seconds
          + new_programs * seconds_per_program)


def median_or_none(values: Sequence[float]) -> float | None:
  return statistics.median(values) if values else None


def sweep_eta_seconds(running_left: Sequence[float | None], queued: int,
                      run_seconds: float | None, workers: int = 1) -> float | None:
  """Seconds until a sweep ends: each running run's seconds left, then
  `queued` runs of `run_seconds` each, every worker taking the next queued
  run when its own ends. None while a number it needs is not yet timed."""
  if any(left is None for left in running_left) or (queued and run_seconds is None):
    return None
  free = sorted(float(left) for left in running_left)
  free += [0.0] * max(0, workers - len(free))
  heapq.heapify(free)
  for _ in range(queued):
    heapq.heappush(free, heapq.heappop(free) + run_seconds)
  return max(free, default=0.0)


class SweepProgress:
  """The runs of a sweep trained one after another in this process, for the
  whole-sweep ETA on every progress line (`eta`). The sweep calls
  `start_run` as each run starts (before its model is built, so that a
  finished run's time holds its set-up and the reports written after it);
  the run calls `end_run` after its final evaluation, `add_pause` with the
  seconds its pauses were clipped by, and `eta` on each progress line with
  its own time left."""

  def __init__(self, runs: int, clock: Callable[[], float] | None = None):
    self.runs, self.clock = runs, clock or (lambda: time.time())
    self.started = 0
    self.finished = []  # each finished run's seconds, start to next start, pauses left out
    self.after = []  # the seconds from each run's end to the next start: its reports
    self._start, self._end, self._paused = None, None, 0.0

  def start_run(self) -> None:
    now = self.clock()
    if self._start is not None:
      self.finished.append(now - self._start - self._paused)
    if self._end is not None:
      self.after.append(now - self._end)
    self.started += 1
    self._start, self._end, self._paused = now, None, 0.0

  def end_run(self) -> None:
    self._end = self.clock()

  def add_pause(self, seconds: float) -> None:
    self._paused += seconds

  def eta(self, run_left: float | None) -> float | None:
    """Seconds until the sweep ends, given its current run's `run_left`:
    that, the reports after it (as long as those after earlier runs; 0
    before one finished), and the runs still queued."""
    if run_left is None:
      return None
    elapsed = self.clock() - self._start - self._paused if self._start is not None else 0.0
    left = run_left + (median_or_none(self.after) or 0.0)
    per_run = median_or_none(self.finished)
    if per_run is None:
      per_run = elapsed + left  # this run's projected length, set-up included
    return sweep_eta_seconds([left], max(0, self.runs - self.started), per_run)


def duration(seconds: float) -> str:
  """`seconds` as a line says it: '42 s', '3.5 min', '2.3 h'."""
  if seconds < 59.5:
    return f"{seconds:.0f} s"
  if seconds < 3600:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


def clock(now: float) -> str:
  """The time of day of `now` (`time.time()`), in UTC: 'HH:MM UTC'. UTC, so
  that lines from machines in other zones (a borrowed GPU) read alike."""
  return time.strftime("%H:%M UTC", time.gmtime(now))


def by_member(members: Sequence, numbers: Sequence[str]) -> str:
  """One number per member (`run_config.Member`), already formatted, seeds
  in order: '2.883 2.994' for a run of seeds only; with member values, each
  group of seeds named by them: 'learning_rate=0.001: 2.883 2.994;
  learning_rate=0.003: 2.851 2.870' (a member run's numbers would otherwise
  not say which rate each belongs to)."""
  if not any(m.values for m in members):
    return " ".join(numbers)
  groups = {}
  for member, number in zip(members, numbers):
    name = ", ".join(f"{k}={v:g}" for k, v in member.values)
    groups.setdefault(name, []).append(number)
  return "; ".join(f"{name}: {' '.join(group)}" for name, group in groups.items())
