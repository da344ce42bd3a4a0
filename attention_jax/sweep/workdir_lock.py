"""Who may write a workdir, and a run: advisory locks with the holder's identity.

Two drivers on one workdir would both train every pair, write each metrics
line twice and delete each other's checkpoints (seen when probing two starts). `WorkdirLock`
takes an exclusive `flock` on `<workdir>/.lock` for as long as the driver
runs. The kernel drops a `flock` when its process dies, however it dies, so
a lock left by a killed driver is free to take; the file still names that
process, and taking it over says so. A second live process is refused with
one line naming the workdir and the holder (PID, host, start time).

Drivers that share a sweep (`--shard`, `sweep.shards`) take the same file
`shared`: any number of them at once, none beside a plain driver. Each run
they train is held by its own lock (`<run folder>/.lock`, exclusive, the
holder named), so no two of them train one run; a busy run is skipped
(`RunBusyError`). Their reports are written one driver at a time under
`REPORT_LOCK_NAME`, waited for (`wait`), held only while writing.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket

LOCK_NAME = ".lock"
REPORT_LOCK_NAME = ".report.lock"


class WorkdirBusyError(ValueError):
  """Another live process holds the workdir."""


class RunBusyError(WorkdirBusyError):
  """Another live driver is training the run."""


class WorkdirLock:
  """Context manager: `with WorkdirLock(workdir, log=print): ...`.

  `shared`: one of the drivers sharing the folder (no identity written:
  they are many). `wait`: block until the lock is free (for the reports,
  held for seconds) instead of refusing. `name`: the lock file's name.
  `what`: how the refusal names the folder ('workdir', 'run')."""

  def __init__(self, workdir: str, log=print, *, shared: bool = False, wait: bool = False,
               name: str = LOCK_NAME, what: str = "workdir"):
    self.workdir = workdir
    self.path = os.path.join(workdir, name)
    self.log = log
    self.shared, self.wait, self.what = shared, wait, what
    self._fd = None

  def acquire(self) -> "WorkdirLock":
    os.makedirs(self.workdir, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
    try:
      fcntl.flock(fd, mode if self.wait else mode | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _describe(_read(fd))
      os.close(fd)
      if self.what == "run":
        raise RunBusyError(f"run {self.workdir} is being trained by {holder}") from None
      if self.shared:
        raise WorkdirBusyError(
            f"workdir {self.workdir} is in use by {holder}, a driver of the whole sweep; "
            "shards (--shard) share a workdir only with other shards.") from None
      if holder == _describe({}):
        holder = "other processes (drivers of its shards, --shard, name none)"
      raise WorkdirBusyError(
          f"workdir {self.workdir} is in use by {holder}; wait for it to finish "
          "or use another --workdir.") from None
    if self.shared or self.wait:
      self._fd = fd
      return self
    previous = _read(fd)
    if previous.get("pid") is not None:
      self.log(f"workdir {self.workdir}: took over the lock left by {_describe(previous)}, "
               "which is no longer running")
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is None:
      return
    if not (self.shared or self.wait):
      os.ftruncate(self._fd, 0)  # an empty file = released cleanly
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read(fd: int) -> dict:
  """What the lock file says of its last holder; {} if it is empty or says
  nothing usable (not JSON, or JSON of another kind than an object: `null`
  or a list left by a hand or a crash), so that taking over or refusing
  still gives its one line."""
  try:
    data = os.pread(fd, 4096, 0)
    info = json.loads(data) if data.strip() else {}
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}


def _describe(info: dict) -> str:
  if not info:
    return "another process"
  return (f"PID {info.get('pid')} on {info.get('host')} "
          f"(started {info.get('started')})")
