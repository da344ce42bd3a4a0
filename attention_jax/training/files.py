"""Crash-safe files: atomic writes and strict JSON.

A file written with `atomic_write` is the old one or the new one to any
reader, never half of either, after a crash, a kill or a full disk; JSON is
written strict (NaN and infinities as null) and read back with errors that
name the file. A name ending in `.gz` is read through gzip (`read_bytes`):
the committed results keep their bulky files so.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import zlib
from typing import Any, Iterable

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
