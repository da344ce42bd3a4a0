"""Tokenizers with fixed special ids: SentencePiece BPE and a word-level one.

Special ids, the same for every tokenizer in the project:

    PAD_ID = 0   <pad>  batch padding; never produced by `encode`
    EOS_ID = 1   </s>   appended to every source and target sequence
    SOS_ID = 2   <s>    first decoder input (the trainer shifts targets right)
    UNK_ID = 3   <unk>  only for the word-level tokenizer; the SentencePiece
                        model has byte fallback, so any text round-trips

`encode(str) -> list[int]` returns content ids only (no specials);
`decode(ids) -> str` stops at the first EOS and skips PAD/SOS, so a padded
model output row decodes to its text. The SentencePiece model is trained on
the *train* split only (both languages, one joint vocabulary) and cached as a
`.model` file, written atomically so a killed run never leaves a torn file.
A damaged file is not always refused by SentencePiece (of 120 random
single-bit flips of a Bible model, 66 still loaded and 29 of those changed the
tokens), so its SHA-256 is recorded when it is trained and checked when it is
loaded (`load_or_train`'s `sha256`; the datasets keep it in their completion
record, `input_pipeline.load_tokenizer`).

Shape glossary: N sentences.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import sentencepiece as spm

__all__ = [
    "PAD_ID", "EOS_ID", "SOS_ID", "UNK_ID", "SPECIAL_PIECES",
    "SentencePieceTokenizer", "WordTokenizer", "train_sentencepiece", "load_or_train",
]

PAD_ID, EOS_ID, SOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "</s>", "<s>", "<unk>")
NUM_SPECIAL = len(SPECIAL_PIECES)


def _content_ids(ids) -> list[int]:
  """Ids up to the first EOS, without PAD/SOS. Accepts lists or int arrays."""
  out = []
  for i in np.asarray(ids).reshape(-1).tolist():
    if i == EOS_ID:
      break
    if i not in (PAD_ID, SOS_ID):
      out.append(int(i))
  return out


class SentencePieceTokenizer:
  """A trained SentencePiece model with the project's special ids."""

  pad_id, eos_id, sos_id, unk_id = PAD_ID, EOS_ID, SOS_ID, UNK_ID

  def __init__(self, model: str | os.PathLike | bytes):
    self.path = None if isinstance(model, bytes) else Path(model)
    proto = model if isinstance(model, bytes) else Path(model).read_bytes()
    self.sha256 = hashlib.sha256(proto).hexdigest()  # of the bytes it was loaded from
    self._sp = spm.SentencePieceProcessor(model_proto=proto)
    got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
    if got != (PAD_ID, EOS_ID, SOS_ID, UNK_ID):
      raise ValueError(
          f"SentencePiece model {self.path or '<bytes>'} has special ids "
          f"(pad, eos, sos, unk) = {got}, expected {(PAD_ID, EOS_ID, SOS_ID, UNK_ID)}; "
          "delete it so that it is retrained.")

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    return self._sp.encode(list(texts), num_threads=num_threads)

  def decode(self, ids) -> str:
    return self._sp.decode(_content_ids(ids))

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))


def train_sentencepiece(texts: Iterable[str], vocab_size: int, *,
                        num_threads: int | None = None) -> bytes:
  """Trains a joint BPE model and returns the serialized model proto.

  Raises:
    ValueError: naming `vocab_size` when the data cannot support it (too few
      distinct pieces) or it is below what the specials + bytes + characters need.
  """
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
    raise TypeError(f"`vocab_size` must be an int, got {vocab_size!r}.")
  out = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out,
        model_type="bpe", vocab_size=int(vocab_size),
        character_coverage=1.0, byte_fallback=True,
        # No NFKC and no whitespace games: decode(encode(x)) == x.
        normalization_rule_name="identity",
        pad_id=PAD_ID, eos_id=EOS_ID, bos_id=SOS_ID, unk_id=UNK_ID,
        pad_piece=SPECIAL_PIECES[0], eos_piece=SPECIAL_PIECES[1],
        bos_piece=SPECIAL_PIECES[2], unk_piece=SPECIAL_PIECES[3],
        # Sentences are passed in full; any subsampling is done (seeded) by the
        # caller, so the model depends only on the data.
        input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=num_threads or os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    bound = re.search(r"<=\s*(\d+)", str(e))
    hint = (f"at most {bound.group(1)} for this data" if bound else
            "see the SentencePiece message")
    raise ValueError(
        f"`vocab_size` (--vocab_size) = {vocab_size} does not fit the training data "
        f"({hint}). SentencePiece said: {str(e).strip()}") from None
  return out.getvalue()


def load_or_train(path: str | os.PathLike, texts_fn, vocab_size: int, *,
                  sha256: str | None = None,
                  log: Callable[[str], None] = print) -> SentencePieceTokenizer:
  """Loads the cached model at `path`, or trains it from `texts_fn()` first.

  The file is written to a temporary name and renamed, so it either exists
  complete or not at all. A file that does not load is retrained, and so is
  one whose SHA-256 is not `sha256` (the digest recorded when it was trained,
  if known), after one line naming it: damage that SentencePiece accepts
  would change the tokens silently.
  """
  path = Path(path)
  if path.is_file():
    try:
      tok = SentencePieceTokenizer(path)
    except (RuntimeError, OSError):
      tok = None  # Torn or foreign file: rebuild.
    if tok is not None and sha256 in (None, tok.sha256):
      return tok
    if tok is not None:
      log(f"warning: {path} does not match the SHA-256 recorded when it was trained "
          "(damaged); retraining it")
    path.unlink()
  proto = train_sentencepiece(texts_fn(), vocab_size)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(proto)
  os.replace(tmp, path)
  return SentencePieceTokenizer(path)


class WordTokenizer:
  """Whitespace tokenizer over a fixed symbol list (synthetic tasks).

  Symbol k gets id `NUM_SPECIAL + k`; unknown words map to UNK_ID.
  """

  pad_id, eos_id, sos_id, unk_id = PAD_ID, EOS_ID, SOS_ID, UNK_ID

  def __init__(self, symbols: Sequence[str]):
    symbols = list(symbols)
    if not symbols:
      raise ValueError("`symbols` must not be empty.")
    bad = [s for s in symbols if not s or s.split() != [s] or s in SPECIAL_PIECES]
    if bad or len(set(symbols)) != len(symbols):
      raise ValueError(
          f"`symbols` must be distinct non-empty words without spaces and not one of "
          f"{SPECIAL_PIECES}; bad: {bad or 'duplicates'}.")
    self.symbols = tuple(symbols)
    self._ids = {s: NUM_SPECIAL + k for k, s in enumerate(symbols)}

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIAL + len(self.symbols)

  def encode(self, text: str) -> list[int]:
    return [self._ids.get(w, UNK_ID) for w in text.split()]

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    del num_threads
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    words = []
    for i in _content_ids(ids):
      k = i - NUM_SPECIAL
      words.append(self.symbols[k] if 0 <= k < len(self.symbols) else SPECIAL_PIECES[UNK_ID])
    return " ".join(words)
