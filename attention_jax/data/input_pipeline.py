"""The single entry point to every dataset: `load(name, ...)`.

    data = load('bible_en_es')
    src_texts, ref_texts = data.texts('test')      # raw detokenised text
    for batch in data.batches('train', 64, seed=0, repeat=True):
      batch.src, batch.tgt                         # int32 [B, L], EOS-terminated, 0-padded
      batch.index                                  # int64 [B], -1 = filler row

Names:
  bible_en_es, bible_es_en   KJV <-> RV1909 verses (offline; docs/formulas.md §5)
  copy, reverse, sort        synthetic tasks (in memory)
  wmt15_britz, wmt14, wmt_t2t  WMT en->de through TFDS (needs the `wmt` extra
                             to prepare)

Special ids (all tokenizers): pad = 0, eos = 1, sos = 2, unk = 3. The trainer
builds the decoder input as `<sos> + tgt[:, :-1]`. Hypotheses decoded with
`tokenizer.decode` and the references from `texts(split)` go to sacrebleu
unchanged (`TranslationData.bleu`).

Shape glossary: B batch size, L padded length (one per batch, shared by src
and tgt, from `batching.bucket_boundaries`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from attention_jax.data import batching, synthetic, tokenizer as tokenizer_lib
from attention_jax.data.batching import Batch
from attention_jax.data.paths import default_data_dir

__all__ = ["NAMES", "DEFAULT_VOCAB_SIZE", "DEFAULT_MAX_LENGTH", "Batch",
           "TranslationData", "load", "default_data_dir", "tokenizer_path", "load_tokenizer",
           "corpus_bleu"]

NAMES = ("bible_en_es", "bible_es_en", "copy", "reverse", "sort",
         "wmt15_britz", "wmt14", "wmt_t2t")
DEFAULT_VOCAB_SIZE = {"bible": 8_000, "wmt": 32_000}
# Training-time length limit (tokens incl. EOS). The longest Bible verse is
# 118 tokens with the 8k model, so nothing is dropped there.
DEFAULT_MAX_LENGTH = 128
# SentencePiece is trained on at most this many train pairs (both sides), a
# seeded sample for WMT; the Bible's ~28k pairs are used in full.
MAX_TOKENIZER_PAIRS = 1_000_000


TextPair = tuple[list[str], list[str]]


class TranslationData:
  """A dataset of (source, target) texts with a tokenizer and batching.

  Splits are read lazily; token ids are computed once per split and kept.
  """

  def __init__(self, name: str, split_loaders: dict[str, Callable[[], TextPair]],
               tokenizer, *, max_length: int, source_lang: str, target_lang: str,
               key_loaders: dict[str, Callable[[], list[str]]] | None = None,
               sizes: dict[str, int] | None = None):
    self.name = name
    self.tokenizer = tokenizer
    self.max_length = max_length
    self.source_lang = source_lang
    self.target_lang = target_lang
    self._loaders = dict(split_loaders)
    self._key_loaders = dict(key_loaders or {})
    self._sizes = dict(sizes or {})  # known split sizes: no read needed to count
    self._texts: dict[str, TextPair] = {}
    self._ids: dict[str, tuple[batching.Sequences, batching.Sequences]] = {}

  def __repr__(self):
    return (f"TranslationData({self.name!r}, {self.source_lang}->{self.target_lang}, "
            f"splits={self.splits}, vocab_size={self.tokenizer.vocab_size})")

  @property
  def splits(self) -> tuple[str, ...]:
    return tuple(self._loaders)

  def _check_split(self, split: str) -> None:
    if split not in self._loaders:
      raise ValueError(f"unknown split {split!r} for {self.name}; allowed: "
                       f"{', '.join(self.splits)}.")

  def texts(self, split: str) -> TextPair:
    """(sources, references): lists of raw str; `Batch.index` indexes them."""
    self._check_split(split)
    if split not in self._texts:
      sources, targets = self._loaders[split]()
      if not sources:
        raise ValueError(f"split {split!r} of {self.name} is empty.")
      self._texts[split] = (list(sources), list(targets))
    return self._texts[split]

  def keys(self, split: str) -> list[str] | None:
    """Per-example ids aligned with `texts(split)` (Bible: 'Genesis 1:1'), or None."""
    self._check_split(split)
    loader = self._key_loaders.get(split)
    return None if loader is None else list(loader())

  def num_examples(self, split: str) -> int:
    self._check_split(split)
    if split in self._sizes and split not in self._texts:
      return self._sizes[split]
    return len(self.texts(split)[0])

  def token_ids(self, split: str) -> tuple[batching.Sequences, batching.Sequences]:
    """Source and target ids (no specials) of every example of `split`."""
    if split not in self._ids:
      sources, targets = self.texts(split)
      self._ids[split] = (batching.Sequences(self.tokenizer.encode_batch(sources)),
                          batching.Sequences(self.tokenizer.encode_batch(targets)))
    return self._ids[split]

  def batches(self, split: str, batch_size: int, *, seed: int = 0, shuffle: bool = True,
              repeat: bool = False, max_length: int | None = None,
              limit: int | None = None) -> Iterator[Batch]:
    """Fixed-shape `Batch`es of `split` (see `batching.iterate_batches`).

    `max_length=None` means `self.max_length` when training (`shuffle` or
    `repeat`), and no limit for an ordered single pass (`shuffle=False,
    repeat=False`), which then covers every example exactly once.
    `limit` restricts the pass to the first `limit` examples of `texts(split)`.
    """
    src, tgt = self.token_ids(split)
    if max_length is None and (shuffle or repeat):
      max_length = self.max_length
    return batching.iterate_batches(
        src, tgt, batch_size, seed=seed, shuffle=shuffle, repeat=repeat,
        max_length=max_length, limit=limit, name=f"split {split!r} of {self.name}")

  def padding_fraction(self, split: str, batch_size: int, *, max_length: int | None = None,
                       shuffle: bool = True, seed: int = 0) -> float:
    """Measured pad share of src + tgt (filler rows included) over one epoch of
    `split` as training sees it (shuffled buckets, `max_length` filter);
    `shuffle=False` measures an evaluation pass instead (no length filter)."""
    if max_length is None and shuffle:
      max_length = self.max_length
    return batching.padding_fraction(self.batches(
        split, batch_size, seed=seed, shuffle=shuffle, repeat=False, max_length=max_length))

  def bleu(self, split: str, hypotheses: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults) of detokenised `hypotheses` vs `texts(split)`."""
    references = self.texts(split)[1]
    if len(hypotheses) != len(references):
      raise ValueError(f"`hypotheses` has {len(hypotheses)} lines, split {split!r} has "
                       f"{len(references)} references.")
    return corpus_bleu(hypotheses, references)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Corpus BLEU of detokenised text with sacrebleu's defaults (13a tokenisation,
  one reference per sentence): every BLEU attention_jax reports."""
  import sacrebleu  # pylint: disable=g-import-not-at-top
  return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


def tokenizer_path(data_dir: str | os.PathLike, dataset: str, key: str,
                   vocab_size: int) -> Path:
  """Where the joint BPE model of a prepared dataset is cached."""
  return Path(data_dir) / dataset / "tokenizers" / f"{key}-bpe{vocab_size}.model"


def load_tokenizer(builder, path: Path, texts_fn, vocab_size: int, *,
                   lock_dir: str | os.PathLike, log: Callable[[str], None] = print):
  """The tokenizer at `path`, trained from `texts_fn()` if missing, checked
  against the SHA-256 recorded in the completion marker of `builder`'s data
  (`tfds_prep.recorded_digest`): a model that does not match is named in one
  line and retrained (`tokenizer.load_or_train`). The digest of what is
  loaded is recorded there; a model of a preparation made before digests
  were recorded is taken as it loads, once, and checked from then on."""
  from attention_jax.data import tfds_prep  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.load_or_train(path, texts_fn, vocab_size,
                                    sha256=tfds_prep.recorded_digest(builder, path.name),
                                    log=log)
  tfds_prep.record_digest(builder, path.name, tok.sha256, lock_dir=lock_dir)
  return tok


def _train_texts_for_tokenizer(sources: list[str], targets: list[str], seed: int = 0):
  n = len(sources)
  if n > MAX_TOKENIZER_PAIRS:
    # Seeded subsample so the model is reproducible (WMT: ~4.5M pairs).
    keep = np.sort(np.random.default_rng(seed).choice(n, MAX_TOKENIZER_PAIRS, replace=False))
    sources = [sources[i] for i in keep]
    targets = [targets[i] for i in keep]
  return list(sources) + list(targets)


def _load_bible(name, data_dir, vocab_size, max_length, sword_path=None):
  # TFDS is imported here, not at module import: synthetic tasks stay light.
  from attention_jax.data import bible, tfds_prep  # pylint: disable=g-import-not-at-top
  source, target = ("en", "es") if name == "bible_en_es" else ("es", "en")
  builder = bible.prepare(f"{source}-{target}", data_dir=data_dir, sword_path=sword_path)
  cache: dict[str, dict[str, list[str]]] = {}

  def columns(split):
    if split not in cache:
      cache[split] = tfds_prep.read_split(builder, split, ("en", "es", "ref"))
    return cache[split]

  # One joint model for both directions: the train split is the same.
  tok = load_tokenizer(
      builder, tokenizer_path(data_dir, builder.name, str(builder.version), vocab_size),
      lambda: _train_texts_for_tokenizer(columns("train")["en"], columns("train")["es"]),
      vocab_size, lock_dir=data_dir)
  splits = ("train", "validation", "test")
  return TranslationData(
      name, {s: (lambda s=s: (columns(s)[source], columns(s)[target])) for s in splits},
      tok, max_length=max_length, source_lang=source, target_lang=target,
      key_loaders={s: (lambda s=s: columns(s)["ref"]) for s in splits},
      sizes={s: builder.info.splits[s].num_examples for s in splits})


def _load_wmt(name, data_dir, vocab_size, max_length):
  from attention_jax.data import wmt  # pylint: disable=g-import-not-at-top
  builder = wmt.prepare(name, data_dir)
  cache: dict[str, TextPair] = {}

  def read(split):
    if split not in cache:
      cache[split] = wmt.read_split(builder, split)
    return cache[split]

  config = builder.builder_config.name if builder.builder_config else "default"
  tok = load_tokenizer(
      builder, tokenizer_path(data_dir, builder.name, f"{config}-{builder.version}",
                              vocab_size),
      lambda: _train_texts_for_tokenizer(*read("train")), vocab_size, lock_dir=data_dir)
  loaders = {s: (lambda s=s: read(s)) for s in wmt.SPLITS[name]}
  return TranslationData(name, loaders, tok, max_length=max_length,
                         source_lang=wmt.SOURCE, target_lang=wmt.TARGET)


def _load_synthetic(name, vocab_size, max_length, seed, kwargs):
  kwargs = dict(kwargs)
  if vocab_size is not None:
    num_symbols = vocab_size - tokenizer_lib.NUM_SPECIAL
    if kwargs.get("num_symbols", num_symbols) != num_symbols:
      raise ValueError(
          f"`vocab_size`={vocab_size} implies num_symbols={num_symbols} (4 special ids), "
          f"but `num_symbols`={kwargs['num_symbols']} was given.")
    kwargs["num_symbols"] = num_symbols
  kwargs.setdefault("seed", seed)
  splits, tok = synthetic.make_task(name, **kwargs)
  if max_length is None:
    max_length = batching.max_grid_length(kwargs.get("max_len", 15) + 1)
  loaders = {s: (lambda s=s: splits[s]) for s in splits}
  return TranslationData(name, loaders, tok, max_length=max_length,
                         source_lang="sym", target_lang="sym")


_TASK_KWARGS = {
    "bible": ("sword_path",),
    "wmt": (),
    "synthetic": ("num_symbols", "min_len", "max_len", "num_train", "num_valid",
                  "num_test", "seed"),
}


def load(name: str, *, data_dir: str | os.PathLike | None = None,
         vocab_size: int | None = None, max_length: int | None = None, seed: int = 0,
         **task_kwargs) -> TranslationData:
  """Loads (preparing on first use) one dataset.

  Args:
    name: one of `NAMES`.
    data_dir: prepared data and tokenizers; default `<cache root>/data`
      (`$ATTENTION_JAX_CACHE`, else `$XDG_CACHE_HOME/attention_jax`, else
      `~/.cache/attention_jax`). Never inside the repository.
    vocab_size: SentencePiece vocabulary (default 8,000 Bible, 32,000 WMT);
      for synthetic tasks the full vocabulary including the 4 specials.
    max_length: training length limit in tokens incl. EOS (default 128; for
      synthetic tasks the grid length covering `max_len + 1`).
    seed: data seed of the synthetic tasks (real splits never move).
    **task_kwargs: Bible: `sword_path`. Synthetic: `num_symbols`, `min_len`,
      `max_len`, `num_train`, `num_valid`, `num_test`, `seed`.

  Raises:
    ValueError: unknown `name` (lists the allowed names), bad arguments.
    TypeError: a keyword the dataset does not take.
  """
  if name not in NAMES:
    raise ValueError(f"unknown dataset name {name!r}; allowed: {', '.join(NAMES)}.")
  family = ("bible" if name.startswith("bible") else
            "wmt" if name.startswith("wmt") else "synthetic")
  unknown = sorted(set(task_kwargs) - set(_TASK_KWARGS[family]))
  if unknown:
    raise TypeError(f"load({name!r}) got unexpected keyword(s) {unknown}; accepted: "
                    f"{list(_TASK_KWARGS[family]) or 'none'}.")
  if max_length is not None and (isinstance(max_length, bool) or max_length < 1):
    raise ValueError(f"`max_length` must be a positive int, got {max_length!r}.")
  if vocab_size is not None and (isinstance(vocab_size, bool)
                                 or not isinstance(vocab_size, (int, np.integer))
                                 or vocab_size < 5):
    raise ValueError(f"`vocab_size` must be an int >= 5, got {vocab_size!r}.")
  if family == "synthetic":
    return _load_synthetic(name, vocab_size, max_length, seed, task_kwargs)
  data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
  vocab_size = vocab_size or DEFAULT_VOCAB_SIZE[family]
  max_length = max_length or DEFAULT_MAX_LENGTH
  if family == "bible":
    return _load_bible(name, data_dir, vocab_size, max_length, **task_kwargs)
  return _load_wmt(name, data_dir, vocab_size, max_length)
