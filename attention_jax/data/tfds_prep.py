"""Preparing TFDS datasets so that a kill, a second process or damaged files
never leave data that is read half-written, and reading them back without
TensorFlow (`array_record` + `tfds.data_source`). Used by `bible` and `wmt`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import tensorflow_datasets as tfds

__all__ = ["ensure_prepared", "read_split", "read_source", "MARKER", "recorded_digest",
           "record_digest"]

# Written last into a prepared version folder: every file's size and SHA-256
# ("files"), and the SHA-256 of the files trained from the data that live
# outside the folder, by name ("derived": the tokenizer models).
MARKER = ".attention_jax_complete.json"


def _shards_missing(builder: tfds.core.DatasetBuilder) -> str | None:
  """What keeps the shard files the builder's info lists from being read
  (one missing, no split listed, an info that does not parse), or None. A
  builder whose info lists no split was made before the data was written
  (another process or thread prepared it meanwhile): it cannot read the
  data, so it is not complete, however complete the folder is."""
  path = Path(os.fspath(builder.data_path))
  try:
    if not builder.info.splits:
      return f"{path / 'dataset_info.json'} lists no split"
    for split_info in builder.info.splits.values():
      for shard in split_info.filepaths:
        if not Path(os.fspath(shard)).is_file():
          return f"{shard} is missing"
  except Exception as e:  # A dataset_info.json that does not parse is incomplete too.
    return f"{path / 'dataset_info.json'} does not read ({type(e).__name__})"
  return None


def _file_digests(folder: Path) -> dict[str, list]:
  """`{relative path: [size, sha256]}` of every file under `folder` but the marker."""
  out = {}
  for file in sorted(folder.rglob("*")):
    if file.is_file() and file.name != MARKER and not file.name.startswith(MARKER):
      h = hashlib.sha256()
      with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          h.update(block)
      out[file.relative_to(folder).as_posix()] = [file.stat().st_size, h.hexdigest()]
  return out


def _marker_mismatch(path: Path) -> str | None:
  """None if the completion marker lists every file with its size and
  SHA-256 and the folder still holds exactly those bytes; else the first
  file that differs and how (a shard cut in half, or a marker from before
  checksums were recorded, is rebuilt)."""
  try:
    recorded = json.loads((path / MARKER).read_text())["files"]
  except FileNotFoundError:
    return f"{path / MARKER} is missing (a preparation cut short)"
  except (OSError, ValueError, KeyError, TypeError):
    return f"{path / MARKER} does not read as the completion marker"
  if not recorded or not isinstance(recorded, dict):
    return f"{path / MARKER} records no file"
  actual = _file_digests(path)
  for name in sorted(set(recorded) | set(actual)):
    if name not in actual:
      return f"{path / name} is missing"
    if name not in recorded:
      return f"{path / name} is not one the preparation wrote"
    if recorded[name] != actual[name]:
      size, written = actual[name][0], recorded[name]
      if (isinstance(written, list) and written and isinstance(written[0], int)
          and written[0] != size):
        return f"{path / name} is {size:,} bytes where {written[0]:,} were written"
      return f"{path / name} has other bytes than when it was written (SHA-256 differs)"
  return None


def _damage(builder, marker: bool) -> str | None:
  """Why the builder's version folder is not complete (its first fault,
  naming the file), or None when it is."""
  path = Path(os.fspath(builder.data_path))
  if not builder.is_prepared():
    for name in ("dataset_info.json", "features.json"):
      if not (path / name).is_file():
        return f"{path / name} is missing"
    return f"{path} is not a folder TFDS reads as prepared"
  return _shards_missing(builder) or (_marker_mismatch(path) if marker else None)


def _complete(builder, marker: bool) -> bool:
  return _damage(builder, marker) is None


@contextlib.contextmanager
def _exclusive(lock_file: Path):
  """An advisory lock: concurrent preparations (e.g. pytest -n 2) take turns."""
  lock_file.parent.mkdir(parents=True, exist_ok=True)
  with open(lock_file, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def ensure_prepared(make_builder, *, lock_dir: str | os.PathLike, marker: bool = True,
                    before_prepare=None):
  """Returns a builder whose data is fully written, (re)building it if needed.

  TFDS writes into `incomplete.*` and renames at the end, but it *reuses* any
  existing version folder even if files are missing. Here a version folder
  counts as complete only with its `dataset_info.json`, every shard file, and
  (`marker=True`) our completion marker, written last. Anything else (a killed
  run, a deleted shard) is removed and rebuilt, never read.

  Args:
    make_builder: zero-argument callable returning a fresh builder.
    lock_dir: folder for the lock file that serialises preparations of the
      same dataset by concurrent processes (the data_dir).
    marker: require and write the completion marker (own datasets); for WMT
      (possibly prepared by plain TFDS) only info + shards are required.
    before_prepare: called just before `download_and_prepare` (e.g. a check
      that TensorFlow is installed).
  """
  builder = make_builder()
  if _complete(builder, marker):
    return builder
  with _exclusive(_lock_file(builder, lock_dir)):
    builder = make_builder()
    damage = _damage(builder, marker)
    if damage is None:  # Another process finished it meanwhile.
      return builder
    path = Path(os.fspath(builder.data_path))
    if path.exists():
      # A folder that is there but not complete: said with what is wrong
      # (a damaged corpus was once rebuilt without a word).
      print(f"the prepared data in {path} is damaged: {damage}; rebuilding it", flush=True)
      shutil.rmtree(path)
    if path.parent.is_dir():  # Leftovers of killed runs: incomplete.<rand>_<version>.
      for stale in path.parent.glob(f"incomplete.*{builder.version}"):
        shutil.rmtree(stale, ignore_errors=True)
    if before_prepare is not None:
      before_prepare()
    builder = make_builder()
    # TFDS announces "Downloading and preparing dataset Unknown size" for
    # every builder; our own datasets (`marker`) read local files and download
    # nothing, so they say what they do instead. WMT keeps TFDS's lines: it
    # does download.
    quiet = contextlib.redirect_stdout(io.StringIO()) if marker else contextlib.nullcontext()
    if marker:
      config = builder.builder_config.name if builder.builder_config else "default"
      print(f"preparing {builder.name} ({config}) from local files into {path}; nothing "
            "is downloaded", flush=True)
    with quiet:
      builder.download_and_prepare(
          file_format="array_record",
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    if marker:
      counts = {name: info.num_examples for name, info in builder.info.splits.items()}
      tmp = path / (MARKER + ".tmp")
      tmp.write_text(json.dumps({"counts": counts, "files": _file_digests(path)}))
      os.replace(tmp, path / MARKER)
  return make_builder()


def _lock_file(builder, lock_dir: str | os.PathLike) -> Path:
  config = builder.builder_config.name if builder.builder_config else "default"
  return Path(lock_dir) / f".{builder.name}-{config}.lock"


def recorded_digest(builder, name: str) -> str | None:
  """The SHA-256 that `record_digest` recorded for `name` in the completion
  marker of `builder`'s data, or None (none recorded, or no marker)."""
  try:
    record = json.loads((Path(os.fspath(builder.data_path)) / MARKER).read_text())
    digest = record["derived"][name]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return digest if isinstance(digest, str) else None


def record_digest(builder, name: str, digest: str, *, lock_dir: str | os.PathLike) -> None:
  """Records `digest` as the SHA-256 of `name` (a file trained from the data,
  such as a tokenizer model) in the completion marker of `builder`'s data,
  replaced atomically under the preparation's lock. Nothing where the data
  has no marker (prepared with `marker=False`, e.g. by plain TFDS)."""
  path = Path(os.fspath(builder.data_path))
  if recorded_digest(builder, name) == digest:
    return
  with _exclusive(_lock_file(builder, lock_dir)):
    try:
      record = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
      return
    if not isinstance(record, dict) or not isinstance(record.get("derived", {}), dict):
      return
    record["derived"] = {**record.get("derived", {}), name: digest}
    tmp = path / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path / MARKER)


def _as_str(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_split(builder: tfds.core.DatasetBuilder, split: str, keys: Sequence[str],
               chunk: int = 8192) -> dict[str, list[str]]:
  """Reads every example of `split` through `tfds.data_source`, in stored order.

  Returns:
    {key: list of str} for each feature key in `keys`.
  """
  source = tfds.data_source(
      f"{builder.name}/{builder.builder_config.name}" if builder.builder_config
      else builder.name, split=split, data_dir=os.fspath(builder.data_dir_root),
      download=False, builder_kwargs={"file_format": "array_record"})
  return read_source(source, keys, chunk)


def read_source(source, keys: Sequence[str], chunk: int = 8192) -> dict[str, list[str]]:
  out = {k: [] for k in keys}
  n = len(source)
  for start in range(0, n, chunk):
    ids = list(range(start, min(n, start + chunk)))
    try:
      examples = source.__getitems__(ids)
    except TypeError:
      # `tfds.testing.mock_data` installs a `__getitems__` with the wrong arity.
      examples = [source[i] for i in ids]
    for ex in examples:
      for k in keys:
        out[k].append(_as_str(ex[k]))
  return out
