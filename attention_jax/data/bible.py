"""KJV <-> Reina-Valera 1909 verse pairs as a TFDS dataset (SPEC.md §5).

`BibleTranslate` is a `tfds.core.GeneratorBasedBuilder` with two configs,
`en-es` and `es-en` (same examples, swapped `supervised_keys`). Each example is
`{'en': str, 'es': str, 'ref': 'Genesis 1:1'}`. It is prepared in the
`array_record` format and read back with `tfds.data_source`, so neither step
needs TensorFlow.

Pipeline: `sword.read_parallel` (31,084 non-empty aligned pairs) ->
`filter_pairs` (drop empty sides, > 150 words, word-length ratio > 3) ->
`split_pairs` (stable SHA-256 hash of the verse reference; about 1,000
validation and 2,000 test verses; dev/test pairs whose English or Spanish text
also occurs in train are removed).

Final counts with the Debian modules (engKJV2006eb 2022-12-21,
spaRV1909eb 2022-12-23): see `EXPECTED_COUNTS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import tensorflow_datasets as tfds

from attention_jax.data import sword

__all__ = [
    "BibleTranslate", "BibleConfig", "MAX_WORDS", "MAX_RATIO", "PAIR_RANGE",
    "SPLIT_RANGES", "EXPECTED_COUNTS", "filter_pairs", "split_of", "split_pairs",
    "load_split_pairs", "prepare", "read_split", "ensure_prepared",
]

MAX_WORDS = 150  # per side
MAX_RATIO = 3.0  # longer / shorter side, in words
# 31,084 aligned pairs minus the 10 whose length ratio exceeds 3 = 31,074.
# The range leaves room for a future packaging of the same public-domain texts.
PAIR_RANGE = (30_500, 31_500)
# Hash buckets out of 10,000: [0, 322) validation, [322, 966) test, rest train,
# i.e. 3.22% and 6.44% of ~31k verses = ~1,000 and ~2,000 before overlap removal.
_BUCKETS = 10_000
_VALID_BUCKETS = 322
_TEST_BUCKETS = 644
_SALT = "attention_jax/bible/v1:"
SPLIT_RANGES = {"train": (27_000, 29_000), "validation": (850, 1_100), "test": (1_700, 2_200)}
# Measured with the Debian modules (tests/data/test_bible.py checks them).
EXPECTED_COUNTS = {"train": 28_049, "validation": 1_031, "test": 1_958}

_MARKER = ".attention_jax_complete.json"


def filter_pairs(pairs: Iterable[sword.VersePair], *, max_words: int = MAX_WORDS,
                 max_ratio: float = MAX_RATIO) -> list[sword.VersePair]:
  """Drops pairs with an empty side, a side over `max_words` words, or a
  word-length ratio (longer / shorter) above `max_ratio`."""
  kept = []
  for p in pairs:
    n_en, n_es = len(p.en.split()), len(p.es.split())
    if min(n_en, n_es) == 0 or max(n_en, n_es) > max_words:
      continue
    if max(n_en, n_es) > max_ratio * min(n_en, n_es):
      continue
    kept.append(p)
  return kept


def split_of(ref: str) -> str:
  """'train', 'validation' or 'test' for a verse reference, from SHA-256.

  Depends on nothing but the reference string (not on Python's per-process
  `hash` seed, the machine, or the other verses), so splits never move.
  """
  digest = hashlib.sha256((_SALT + ref).encode("utf-8")).digest()
  bucket = int.from_bytes(digest[:8], "little") % _BUCKETS
  if bucket < _VALID_BUCKETS:
    return "validation"
  if bucket < _VALID_BUCKETS + _TEST_BUCKETS:
    return "test"
  return "train"


def split_pairs(pairs: Sequence[sword.VersePair]) -> dict[str, list[sword.VersePair]]:
  """Hash split, then removes dev/test pairs whose en or es text is in train."""
  splits = {"train": [], "validation": [], "test": []}
  for p in pairs:
    splits[split_of(p.ref)].append(p)
  train_en = {p.en for p in splits["train"]}
  train_es = {p.es for p in splits["train"]}
  for name in ("validation", "test"):
    splits[name] = [p for p in splits[name] if p.en not in train_en and p.es not in train_es]
  return splits


def load_split_pairs(sword_path: str | os.PathLike | None = None,
                     ) -> dict[str, list[sword.VersePair]]:
  """Reads the modules, filters, checks the counts and splits.

  Raises:
    SwordModuleError: modules missing or corrupt, or a count outside
      `PAIR_RANGE` / `SPLIT_RANGES` (names the module folder).
  """
  root = sword.find_sword_root(sword_path)
  pairs = filter_pairs(sword.read_parallel(root))
  where = f"the SWORD modules under {root}"
  if not PAIR_RANGE[0] <= len(pairs) <= PAIR_RANGE[1]:
    raise sword.SwordModuleError(
        f"{where} gave {len(pairs)} verse pairs after filtering, expected "
        f"{PAIR_RANGE[0]}..{PAIR_RANGE[1]} (SPEC.md §5). The module files may be "
        f"corrupt or a different edition. {sword.INSTALL_HINT}")
  splits = split_pairs(pairs)
  for name, (lo, hi) in SPLIT_RANGES.items():
    if not lo <= len(splits[name]) <= hi:
      raise sword.SwordModuleError(
          f"split '{name}' of {where} has {len(splits[name])} pairs, expected {lo}..{hi}.")
  return splits


class BibleConfig(tfds.core.BuilderConfig):
  """A translation direction over the same verse pairs."""

  def __init__(self, *, source: str, target: str, **kwargs):
    super().__init__(name=f"{source}-{target}",
                     description=f"KJV/RV1909 verses, {source} -> {target}.", **kwargs)
    self.source = source
    self.target = target


class BibleTranslate(tfds.core.GeneratorBasedBuilder):
  """English (KJV, engKJV2006eb) <-> Spanish (RV1909, spaRV1909eb) verse pairs."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release: SHA-256 verse splits, overlap removal."}
  BUILDER_CONFIGS = [BibleConfig(source="en", target="es"),
                     BibleConfig(source="es", target="en")]
  # No checksums/metadata files live next to this module. (TFDS's lookup of
  # them needs the `importlib_resources` backport, absent on Python >= 3.9.)
  code_path = None

  def __init__(self, *, sword_path: str | os.PathLike | None = None, **kwargs):
    self._sword_path = sword_path
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    cfg = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self,
        description=("Aligned Bible verses from the public-domain SWORD modules "
                     "engKJV2006eb (King James Version) and spaRV1909eb (Reina-Valera "
                     "1909), OSIS markup removed."),
        features=tfds.features.FeaturesDict({
            "en": tfds.features.Text(), "es": tfds.features.Text(),
            "ref": tfds.features.Text()}),
        supervised_keys=(cfg.source, cfg.target),
        homepage="https://www.crosswire.org/sword/",
        # Keep canonical (Genesis -> Revelation) order on disk; batches shuffle.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    splits = load_split_pairs(self._sword_path)
    return {name: self._generate_examples(pairs) for name, pairs in splits.items()}

  def _generate_examples(self, pairs):
    for p in pairs:
      yield p.ref, {"en": p.en, "es": p.es, "ref": p.ref}


# --- preparation that survives being killed -----------------------------------

def _shards_present(builder: tfds.core.DatasetBuilder) -> bool:
  try:
    for split_info in builder.info.splits.values():
      for path in split_info.filepaths:
        if not Path(os.fspath(path)).is_file():
          return False
  except Exception:  # A dataset_info.json that does not parse is incomplete too.
    return False
  return True


def _file_digests(folder: Path) -> dict[str, list]:
  """`{relative path: [size, sha256]}` of every file under `folder` but the marker."""
  out = {}
  for file in sorted(folder.rglob("*")):
    if file.is_file() and file.name != _MARKER and not file.name.startswith(_MARKER):
      h = hashlib.sha256()
      with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          h.update(block)
      out[file.relative_to(folder).as_posix()] = [file.stat().st_size, h.hexdigest()]
  return out


def _marker_matches(path: Path) -> bool:
  """True if the completion marker lists every file with its size and SHA-256
  and the folder still holds exactly those bytes (a shard cut in half, or a
  marker from before checksums were recorded, is False: rebuilt)."""
  try:
    recorded = json.loads((path / _MARKER).read_text())["files"]
  except (OSError, ValueError, KeyError, TypeError):
    return False
  return bool(recorded) and _file_digests(path) == recorded


def _complete(builder, marker: bool) -> bool:
  path = Path(os.fspath(builder.data_path))
  return (builder.is_prepared() and _shards_present(builder)
          and (not marker or _marker_matches(path)))


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
  config = builder.builder_config.name if builder.builder_config else "default"
  with _exclusive(Path(lock_dir) / f".{builder.name}-{config}.lock"):
    builder = make_builder()
    if _complete(builder, marker):  # Another process finished it meanwhile.
      return builder
    path = Path(os.fspath(builder.data_path))
    if path.exists():
      shutil.rmtree(path)
    if path.parent.is_dir():  # Leftovers of killed runs: incomplete.<rand>_<version>.
      for stale in path.parent.glob(f"incomplete.*{builder.version}"):
        shutil.rmtree(stale, ignore_errors=True)
    if before_prepare is not None:
      before_prepare()
    builder = make_builder()
    builder.download_and_prepare(
        file_format="array_record",
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    if marker:
      counts = {name: info.num_examples for name, info in builder.info.splits.items()}
      tmp = path / (_MARKER + ".tmp")
      tmp.write_text(json.dumps({"counts": counts, "files": _file_digests(path)}))
      os.replace(tmp, path / _MARKER)
  return make_builder()


def default_data_dir() -> Path:
  """`<cache root>/data` (same as `input_pipeline.default_data_dir`)."""
  return sword.cache_root() / "data"


def prepare(config: str = "en-es", *, data_dir: str | os.PathLike | None = None,
            sword_path: str | os.PathLike | None = None) -> tfds.core.DatasetBuilder:
  """Prepares (once) and returns the builder of one config."""
  if config not in ("en-es", "es-en"):
    raise ValueError(f"`config` must be 'en-es' or 'es-en', got {config!r}.")
  data_dir = os.fspath(data_dir or default_data_dir())
  tfds.disable_progress_bar()
  return ensure_prepared(lambda: BibleTranslate(
      config=config, data_dir=data_dir, sword_path=sword_path, file_format="array_record"),
      lock_dir=data_dir)


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
