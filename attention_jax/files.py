"""Crash-safe files: atomic writes and strict JSON.

A file written with `atomic_write` is the old one or the new one to any
reader, never half of either, after a crash, a kill or a full disk; JSON is
written strict (NaN and infinities as null) and read back with errors that
name the file. A name ending in `.gz` is read through gzip (`read_bytes`):
the committed results keep their bulky files so. `Staging` puts several
files in place together (a report's text, numbers and figures).
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import shutil
import tempfile
import zlib
from typing import Any, Callable, Iterable, Sequence

import numpy as np


TMP_PREFIX = ".tmp-"


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write(path: str, data: str | bytes) -> None:
  """Replaces `path` with `data` so that readers see the old or the new file, never half.

  The file gets the mode a plain `open(path, "w")` would give (0666 less the
  umask), not mkstemp's 0600, so a shared results folder stays readable. A
  kill between mkstemp and the rename leaves a `.tmp-<name>*` file, which
  `remove_stale_temporaries` clears at the next start.
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX + os.path.basename(path))
  try:
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w",
                   **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError) and e.filename in (tmp, None):
      # The file the caller asked for, not the temporary it never heard of.
      e.filename, e.filename2 = path, None
    raise


def finite(value: Any) -> Any:
  """`value` with every NaN and ±inf (in dicts, lists and tuples too) made
  None: JSON has no such numbers, Python's `json` writes them as bare `NaN`
  and `Infinity`, and strict parsers (jq, JavaScript, pandas' engine) reject
  the whole line."""
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite(v) for v in value]
  return value


def to_json(value: Any, **kwargs) -> str:
  """`json.dumps` of `finite(value)`: strict JSON, non-finite numbers as null."""
  return json.dumps(finite(value), allow_nan=False, **kwargs)


def read_bytes(path: str, remedy: str = "") -> bytes:
  """The bytes of the file `path`, which must exist; of a `.gz` file, the
  bytes it holds compressed, and a file that is not whole gzip a ValueError
  of one line naming it (and `remedy`, if given)."""
  with open(path, "rb") as f:
    data = f.read()
  if not path.endswith(".gz"):
    return data
  try:
    return gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:  # not gzip, cut, or a bad checksum
    raise ValueError(f"{path} is damaged (not gzip: {e})"
                     + (f"; {remedy}" if remedy else "") + ".") from None


def read_json(path: str, kind: type | None = None, remedy: str = "") -> Any:
  """The JSON value in the file `path` (`read_bytes`: gzip'd if it ends in
  `.gz`), which must exist.

  A file that does not parse (or, with `kind`, holds another type of value)
  raises a ValueError of one line naming it, and `remedy` (what to do about
  it) if given, in place of a JSON error that names no file.
  """
  data = read_bytes(path, remedy)
  try:
    value = json.loads(data)
  except ValueError as e:  # JSONDecodeError, or bytes that are not text
    why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not text"
    raise ValueError(f"{path} is damaged (not JSON: {why})"
                     + (f"; {remedy}" if remedy else "") + ".") from None
  if kind is not None and not isinstance(value, kind):
    raise ValueError(f"{path} is damaged (a JSON {type(value).__name__}, not a "
                     f"{kind.__name__})" + (f"; {remedy}" if remedy else "") + ".")
  return value


def remove_stale_temporaries(folder: str) -> list[str]:
  """Deletes `atomic_write` leftovers (`.tmp-*` files) directly under `folder`
  and its run folders; call it only while holding the workdir lock. Returns
  the removed paths."""
  removed = []
  for root, dirs, files in os.walk(folder):
    dirs[:] = [d for d in dirs if d != "checkpoints"]  # Orbax cleans its own
    for name in files:
      if name.startswith(TMP_PREFIX):
        path = os.path.join(root, name)
        try:
          os.remove(path)
          removed.append(path)
        except FileNotFoundError:
          pass
  return removed


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
  """One strict JSON line per row (NaN and ±inf as null, `to_json`)."""
  atomic_write(path, "".join(to_json(r, sort_keys=True) + "\n" for r in rows))


# A folder of files written apart and put in place together (`Staging`).
STAGING_PREFIX = ".staging-"
# In a staging folder: the names to put in place, written once every file
# is; its presence means the new set is whole and the renames may be finished.
COMMITTED = ".committed"


def _alive(pid: int) -> bool:
  """Whether a process `pid` runs on this machine (another user's counts)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _writer_pid(name: str) -> int | None:
  """The PID in a staging folder's name (`.staging-<pid>-<random>`)."""
  try:
    return int(name[len(STAGING_PREFIX):].split("-", 1)[0])
  except ValueError:
    return None


def _fsync_folder(folder: str) -> None:
  """Makes the renames into `folder` durable (a crash keeps them)."""
  fd = os.open(folder, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def finish_staged(folder: str, log: Callable[[str], None] = print) -> None:
  """Clears what a killed `Staging` left in `folder`, one line each: a
  staging folder whose set was committed has its remaining files put in
  place (they are newer than those there); one that was not is removed
  (the old files stay). Staging folders of live processes are left alone:
  another writer is at work there."""
  for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    pid = _writer_pid(name) if name.startswith(STAGING_PREFIX) else None
    if pid is None or not os.path.isdir(path) or (pid != os.getpid() and _alive(pid)):
      continue
    marker = os.path.join(path, COMMITTED)
    if not os.path.exists(marker):
      shutil.rmtree(path)
      log(f"removed {path}, the files of a write that was killed before they were all "
          "written; the old ones are kept")
      continue
    names = read_json(marker, list, f"delete {path}")
    left = [n for n in names if os.path.exists(os.path.join(path, n))]
    for n in left:
      os.replace(os.path.join(path, n), os.path.join(folder, n))
    _fsync_folder(folder)
    shutil.rmtree(path)
    log(f"finished putting in place the {len(left)} of {len(names)} files a killed write "
        f"had left in {path}")


class Staging:
  """Several files of `folder` replaced together: they are written into a
  staging folder inside it (`path`, same file system: the renames are
  atomic) and renamed into place by `commit` only once every one is
  written, so that a failure, a full disk or a kill while they are written
  leaves the old set whole (the staging folder is removed, or by the next
  `Staging` of the folder if the process was killed).

  The renames themselves take microseconds; a kill among them (SIGKILL, a
  crash: a driver that takes SIGTERM as a request, `interrupts`, is not
  stopped there) leaves a committed staging folder, and the next `Staging`
  of the folder puts its remaining files in place before anything else
  (`finish_staged`), so the set in place is the new one, whole.

      with Staging(out) as stage:
        atomic_write(os.path.join(stage.path, "report.md"), text)
        ...
        stage.commit(["report.md", ...])

  An OSError about a file of the staging folder names the file it was to
  replace, never the staging folder; `moved` counts the files in place
  (0 unless the renames failed among themselves).
  """

  def __init__(self, folder: str, log: Callable[[str], None] = print):
    self.folder = folder
    self.log = log
    self.path = ""
    self.moved = 0
    self._committed = False

  def __enter__(self) -> Staging:
    os.makedirs(self.folder, exist_ok=True)
    finish_staged(self.folder, self.log)
    self.path = tempfile.mkdtemp(dir=self.folder, prefix=f"{STAGING_PREFIX}{os.getpid()}-")
    return self

  def _move(self, name: str) -> None:
    os.replace(os.path.join(self.path, name), os.path.join(self.folder, name))
    self.moved += 1

  def commit(self, names: Sequence[str]) -> None:
    """Puts the staged files `names` in place of those of the folder. A
    folder where one of them goes is refused before any is moved."""
    for name in names:
      if os.path.basename(name) != name or not os.path.isfile(os.path.join(self.path, name)):
        raise ValueError(f"{name!r} is not a file written into {self.path}.")
      target = os.path.join(self.folder, name)
      if os.path.lexists(target) and not os.path.isfile(target):
        raise IsADirectoryError(errno.EISDIR, "not a file: the new one cannot replace it", target)
    atomic_write(os.path.join(self.path, COMMITTED), to_json(list(names)))
    self._committed = True
    for name in names:
      self._move(name)
    _fsync_folder(self.folder)
    shutil.rmtree(self.path)

  def __exit__(self, kind, error, traceback) -> bool:
    if self.path and os.path.isdir(self.path) and not self._committed:
      shutil.rmtree(self.path, ignore_errors=True)
    if isinstance(error, OSError):
      for attribute in ("filename", "filename2"):
        value = getattr(error, attribute)
        if isinstance(value, str) and self.path and value.startswith(self.path + os.sep):
          setattr(error, attribute, os.path.join(self.folder, os.path.relpath(value, self.path)))
    return False
