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

Before a run's first step (`nothing_to_save`: the trainer is built, its
programs traced and compiled) there is nothing to save, and a request would
wait for a step that may be many minutes away: a compile of thousands of
members ran 12 minutes and kept the process after SIGTERM. There the first
signal ends the process at once with one line. Python runs a signal's
handler in the main thread only between two bytecodes, never during XLA's
compile (C++, which releases the GIL), so `install` also has the signal
written to a pipe (`signal.set_wakeup_fd`) that a thread of its own reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)

# "unsaved": what `nothing_to_save` names (a run's label) while it holds.
_received: dict[str, Any] = {"signum": None, "event": None, "unsaved": None}
_stopping = threading.Lock()  # the handler and the pipe's reader may both stop
_wakeup: dict[str, Any] = {"thread": None}


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


def _stop_now(signum: int) -> None:
  """Ends the process with one line and 128 + `signum`, the status a shell
  reports for a process the signal ended (`os._exit`: the main thread may be
  inside a compile that nothing else would end)."""
  with _stopping:
    what = _received["unsaved"]
    line = (f"{what} {signal.Signals(signum).name} before its first step: nothing to save, "
            "stopped at once; re-run the same command to continue\n")
    try:
      sys.stdout.flush()  # the lines printed before it come first
    except (OSError, RuntimeError, ValueError):  # a closed or reentered stream
      pass
    try:
      os.write(sys.stdout.fileno(), line.encode(errors="replace"))
    except (OSError, ValueError):
      pass
    os._exit(128 + signum)


def _read_wakeups(fd: int) -> None:
  """The thread that reads the signals `signal.set_wakeup_fd` writes to `fd`
  (one byte each, as they come, whatever the main thread is doing)."""
  while True:
    try:
      received = os.read(fd, 64)
    except OSError:
      return
    if not received:
      return
    for signum in received:
      if signum in SIGNALS and _received["unsaved"] is not None:
        _stop_now(signum)


def _start_wakeups() -> None:
  """Has every signal handled by Python also written to a pipe that a
  daemon thread reads (`_read_wakeups`); once per process, from the main
  thread."""
  if _wakeup["thread"] is not None:
    return
  read, write = os.pipe()
  os.set_blocking(write, False)  # set_wakeup_fd's end must not block
  signal.set_wakeup_fd(write, warn_on_full_buffer=False)
  _wakeup["thread"] = threading.Thread(target=_read_wakeups, args=(read,), daemon=True,
                                       name="interrupts-wakeup")
  _wakeup["thread"].start()


def _handle(signum: int, frame) -> None:
  del frame
  if _received["unsaved"] is not None:
    _stop_now(signum)
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
  _start_wakeups()


@contextlib.contextmanager
def nothing_to_save(what: str) -> Iterator[None]:
  """Within it, until `something_to_save` is called (after a run's first
  step), a stop request ends the process at once with one line naming
  `what` (module docstring): a run being built or compiled has nothing to
  save, and its checkpoints so far stay as they are. Only where `install`
  was called (the drivers, not their `--workers`, which the driver stops);
  a request already made ends it on entry."""
  if _wakeup["thread"] is None:
    yield
    return
  _received["unsaved"] = what
  try:
    if _received["signum"] is not None:
      _stop_now(_received["signum"])
    yield
  finally:
    _received["unsaved"] = None


def something_to_save() -> None:
  """Ends `nothing_to_save`: from here a stop request waits for the step
  under way and saves its checkpoint."""
  _received["unsaved"] = None


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
