"""Length-bucketed, fixed-shape NumPy batches for translation pairs.

Every batch has the same number of rows B, and one padded length L shared by
source and target, taken from a small fixed grid (`bucket_boundaries`):
multiples of 8 up to 64, of 16 up to 128, of 32 up to 256, and so on (grid
padding is under 8 tokens up to 64 and under 20% of a row beyond). The JIT'd train step therefore compiles once
per grid length, not once per batch. A bucket's leftover examples move up to
the next longer bucket; the one partial batch left per epoch is topped up with
filler rows (all pad, `index == -1`) rather than shrunk.

Sequences get EOS appended here; the token ids themselves never contain
specials. Shuffling is a pure function of `(seed, epoch)`.

Shape glossary: B batch size (rows), L padded length, N examples.
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from attention_jax.data.tokenizer import EOS_ID, PAD_ID

__all__ = ["Batch", "Sequences", "padded_length", "bucket_boundaries",
           "iterate_batches", "padding_fraction", "max_grid_length"]


class Batch(NamedTuple):
  """One batch. Rows with `index == -1` are fillers (all pad)."""
  src: np.ndarray  # int32 [B, L] source ids + EOS, 0-padded
  tgt: np.ndarray  # int32 [B, L] target ids + EOS, 0-padded
  index: np.ndarray  # int64 [B] row in `texts(split)`; -1 for fillers

  @property
  def src_lengths(self) -> np.ndarray:  # int32 [B], EOS included
    return (self.src != PAD_ID).sum(axis=1).astype(np.int32)

  @property
  def tgt_lengths(self) -> np.ndarray:  # int32 [B], EOS included
    return (self.tgt != PAD_ID).sum(axis=1).astype(np.int32)

  @property
  def num_real(self) -> int:
    return int((self.index >= 0).sum())


class Sequences:
  """N variable-length id sequences stored as one flat int32 array + offsets."""

  def __init__(self, ids: Sequence[Sequence[int]]):
    self.lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))  # [N]
    self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)  # [N + 1]
    np.cumsum(self.lengths, out=self.offsets[1:])
    self.flat = np.fromiter((t for x in ids for t in x), dtype=np.int32,
                            count=int(self.offsets[-1]))  # [sum of lengths]
    if self.flat.size and (self.flat.min() < 0):
      raise ValueError("token ids must be non-negative.")

  def __len__(self) -> int:
    return len(self.lengths)

  def __getitem__(self, i: int) -> np.ndarray:
    return self.flat[self.offsets[i]:self.offsets[i + 1]]


def padded_length(n) -> np.ndarray:
  """Grid length for sequences of `n` tokens (EOS included): the next multiple
  of 8 up to 64, then of `2**(ceil(log2 n) - 3)` (16 up to 128, 32 up to 256...)."""
  n = np.maximum(np.asarray(n, dtype=np.int64), 1)
  # Exponent clamped at 6 (step 8) so small n never reach a negative power.
  exponent = np.maximum(np.ceil(np.log2(n)).astype(np.int64), 6)
  step = np.where(n <= 64, 8, 2 ** (exponent - 3))
  return (-(-n // step) * step).astype(np.int64)


def bucket_boundaries(max_length: int) -> tuple[int, ...]:
  """Every padded length a batch can have when lengths are <= `max_length`."""
  if max_length < 1:
    raise ValueError(f"`max_length` must be >= 1, got {max_length}.")
  return tuple(int(v) for v in np.unique(padded_length(np.arange(1, max_length + 1))))


def _epoch_plan(lengths: np.ndarray, keep: np.ndarray, batch_size: int,
                rng: np.random.Generator | None) -> list[tuple[int, np.ndarray]]:
  """(L, example ids) for every batch of one epoch.

  Shuffled epochs: buckets are filled shortest first; the remainder of a
  bucket that does not fill a whole batch moves up into the next longer
  bucket (it fits there, with more padding), so an epoch has at most one
  partial batch instead of one per bucket: far fewer all-pad filler rows.
  """
  if rng is None:
    # An ordered pass: sort by length (ties by index) and cut; each batch is as
    # short as its longest member allows. The one partial batch (filler rows)
    # takes the shortest examples, so fillers are cheap, and comes last, so the
    # first batch is a full one.
    order = keep[np.argsort(lengths[keep], kind="stable")]
    cuts = list(range(len(order) % batch_size or batch_size, len(order), batch_size))
    chunks = np.split(order, cuts)
    if len(chunks[0]) < batch_size:
      chunks = chunks[1:] + chunks[:1]
    return [(int(padded_length(lengths[chunk].max())), chunk) for chunk in chunks]
  bucket = padded_length(lengths[keep])  # [N_keep]
  plan = []
  carry = keep[:0]
  for length in np.unique(bucket):
    members = keep[bucket == length]
    members = np.concatenate([carry, rng.permutation(members)])
    full = len(members) // batch_size * batch_size
    for start in range(0, full, batch_size):
      plan.append((int(length), members[start:start + batch_size]))
    carry = members[full:]
  if len(carry):  # The one partial batch, as short as its longest member allows.
    plan.append((int(padded_length(lengths[carry].max())), carry))
  return [plan[i] for i in rng.permutation(len(plan))]


def iterate_batches(src: Sequences, tgt: Sequences, batch_size: int, *, seed: int = 0,
                    shuffle: bool = True, repeat: bool = False,
                    max_length: int | None = None, limit: int | None = None,
                    name: str = "split") -> Iterator[Batch]:
  """Yields `Batch`es over the pairs `(src[i], tgt[i])`.

  Args:
    src, tgt: token ids without specials, same N.
    batch_size: rows per batch, B (fixed; last batches padded with fillers).
    seed: shuffling seed; epoch e uses `default_rng([seed, e])`.
    shuffle: shuffle examples within buckets and the batch order.
    repeat: False = one epoch; True = endless epochs, each reshuffled.
    max_length: drop pairs whose source or target, EOS included, is longer.
      None keeps every pair (an evaluation pass covers each index exactly once).
    limit: only the pairs with index < `limit` (e.g. a quick evaluation on the
      first examples); None = all.
    name: used in error messages (e.g. the split name).
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}.")
  if len(src) != len(tgt):
    raise ValueError(f"`src` and `tgt` hold {len(src)} and {len(tgt)} sequences.")
  if len(src) == 0:
    raise ValueError(f"{name} is empty: no pairs to batch.")
  lengths = np.maximum(src.lengths, tgt.lengths) + 1  # [N] EOS included
  keep = np.arange(len(src))
  if limit is not None:
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
      raise ValueError(f"`limit` must be a positive int or None, got {limit!r}.")
    keep = keep[:limit]
  if max_length is not None:
    if max_length < 1:
      raise ValueError(f"`max_length` must be >= 1, got {max_length}.")
    keep = keep[lengths <= max_length]
    if keep.size == 0:
      raise ValueError(
          f"`max_length`={max_length} drops every pair of {name} (shortest needs "
          f"{int(lengths.min())} tokens with EOS).")
  epoch = 0
  while True:
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    for length, members in _epoch_plan(lengths, keep, batch_size, rng):
      src_arr = np.zeros((batch_size, length), np.int32)  # [B, L]
      tgt_arr = np.zeros((batch_size, length), np.int32)  # [B, L]
      index = np.full((batch_size,), -1, np.int64)  # [B]
      for row, i in enumerate(members):
        s, t = src[i], tgt[i]
        src_arr[row, :len(s)] = s
        src_arr[row, len(s)] = EOS_ID
        tgt_arr[row, :len(t)] = t
        tgt_arr[row, len(t)] = EOS_ID
        index[row] = i
      yield Batch(src_arr, tgt_arr, index)
    if not repeat:
      return
    epoch += 1


def padding_fraction(batches: Iterable[Batch]) -> float:
  """Pad tokens / all tokens over src and tgt of `batches` (fillers included)."""
  pad = total = 0
  for b in batches:
    pad += int((b.src == PAD_ID).sum() + (b.tgt == PAD_ID).sum())
    total += b.src.size + b.tgt.size
  if total == 0:
    raise ValueError("`batches` is empty.")
  return pad / total


def max_grid_length(max_length: int) -> int:
  return bucket_boundaries(max_length)[-1]

