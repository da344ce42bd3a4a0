"""KJV <-> Reina-Valera 1909 verse pairs as a TFDS dataset (docs/formulas.md §5).

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

import hashlib
import os
from typing import Iterable, Sequence

import tensorflow_datasets as tfds

from attention_jax.data import paths
from attention_jax.data import sword
from attention_jax.data import tfds_prep

__all__ = [
    "BibleTranslate", "BibleConfig", "MAX_WORDS", "MAX_RATIO", "PAIR_RANGE",
    "SPLIT_RANGES", "EXPECTED_COUNTS", "filter_pairs", "split_of", "split_pairs",
    "load_split_pairs", "prepare",
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
        f"{PAIR_RANGE[0]}..{PAIR_RANGE[1]} (docs/formulas.md §5). The module files may be "
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


def prepare(config: str = "en-es", *, data_dir: str | os.PathLike | None = None,
            sword_path: str | os.PathLike | None = None) -> tfds.core.DatasetBuilder:
  """Prepares (once) and returns the builder of one config."""
  if config not in ("en-es", "es-en"):
    raise ValueError(f"`config` must be 'en-es' or 'es-en', got {config!r}.")
  data_dir = os.fspath(data_dir or paths.default_data_dir())
  tfds.disable_progress_bar()
  return tfds_prep.ensure_prepared(lambda: BibleTranslate(
      config=config, data_dir=data_dir, sword_path=sword_path, file_format="array_record"),
      lock_dir=data_dir)
