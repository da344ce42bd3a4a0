"""Stopping a run cleanly on SIGTERM or Ctrl-C (SIGINT).

Without a handler, SIGTERM ends the process at once and SIGINT raises
KeyboardInterrupt wherever the program is: either way the steps since the
last checkpoint (up to `checkpoint_every`) are lost, and Ctrl-C prints a
traceback. `install` makes the first such signal a *request*: the training
loop checks `requested()` after each step, saves a checkpoint, says so in one
line and raises `Interrupted`; the driver exits with 128 + the signal's number
(143 for SIGTERM, 130 for SIGINT, what a shell reports for a process the
signal ended). A second signal of the same kind ends the process at once,
the system's default way, for a user who does not want to wait for the step.

With `--workers`, the training runs in child processes: they ignore SIGINT
(a terminal sends Ctrl-C to the whole process group; the driver decides) and
watch an event the driver sets when it is asked to stop (`share`, `watch`),
so every worker saves its run and the driver exits once they have.
"""

from __future__ import annotations

import os
import signal
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: dict[str, Any] = {"signum": None, "event": None}


class Interrupted(Exception):
  """A stop was requested by `signum` (and the run's checkpoint is saved)."""

  def __init__(self, signum: int):
    super().__init__(signum)  # the argument pickles: workers send it to the driver
    self.signum = int(signum)

  @property
  def exit_code(self) -> int:
    return 128 + self.signum

  def __str__(self) -> str:
    return f"stopped by {signal.Signals(self.signum).name}"


def _handle(signum: int, frame) -> None:
  del frame
  if _received["signum"] is not None:  # asked twice: stop now, the default way
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return
  _received["signum"] = signum
  if _received["event"] is not None:
    _received["event"].set()


def install() -> None:
  """Makes SIGTERM and SIGINT requests to stop (module docstring); call it
  from the main thread of the driver."""
  _received["signum"] = None
  for signum in SIGNALS:
    signal.signal(signum, _handle)


def share(event) -> None:
  """In the driver: also set `event` (a `multiprocessing` Event given to
  the workers) when a stop is requested."""
  _received["event"] = event
  if _received["signum"] is not None:
    event.set()


def watch(event) -> None:
  """In a worker process: a stop requested of the driver (which sets
  `event`) counts here; Ctrl-C is left to the driver."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _received["event"] = event


def requested() -> int | None:
  """The signal that asked this process (or, in a worker, the driver) to
  stop, or None."""
  if _received["signum"] is not None:
    return _received["signum"]
  event = _received["event"]
  if event is not None and event.is_set():
    return int(signal.SIGTERM)
  return None


def check() -> None:
  """Raises `Interrupted` if a stop was requested."""
  signum = requested()
  if signum is not None:
    raise Interrupted(signum)
