"""Synthetic sequence tasks (copy, reverse, sort) for tests and quick checks.

A source is a random string of `min_len..max_len` symbols drawn uniformly from
`num_symbols` symbols; the target is the same string (copy), reversed
(reverse), or sorted by symbol id (sort). Texts are space-separated symbols,
so sacrebleu scores them like any other detokenised text, and the
`WordTokenizer` maps symbol k to id `4 + k` (ids 0..3 are pad/eos/sos/unk).

Validation and test sources never occur in train (re-drawn until they do not),
so a score there measures the algorithm, not memorisation. Everything is built
in memory from `seed` in a few milliseconds.
"""

from __future__ import annotations

import string

import numpy as np

from attention_jax.data.tokenizer import WordTokenizer

__all__ = ["TASKS", "symbols", "make_task"]

TASKS = ("copy", "reverse", "sort")


def symbols(num_symbols: int) -> tuple[str, ...]:
  """'a'..'z' for up to 26 symbols, else zero-padded 's000', 's001', ...

  Both orders agree with the id order, so 'sort' is also alphabetical.
  """
  if isinstance(num_symbols, bool) or not isinstance(num_symbols, (int, np.integer)) or num_symbols < 2:
    raise ValueError(f"`num_symbols` must be an int >= 2, got {num_symbols!r}.")
  if num_symbols <= 26:
    return tuple(string.ascii_lowercase[:num_symbols])
  width = len(str(num_symbols - 1))
  return tuple(f"s{k:0{width}d}" for k in range(num_symbols))


def _draw(rng: np.random.Generator, n: int, num_symbols: int, min_len: int, max_len: int):
  lengths = rng.integers(min_len, max_len + 1, size=n)  # [N]
  tokens = rng.integers(0, num_symbols, size=(n, max_len))  # [N, max_len]
  return [tuple(row[:k]) for row, k in zip(tokens.tolist(), lengths.tolist())]


def _target(task: str, seq: tuple[int, ...]) -> tuple[int, ...]:
  if task == "copy":
    return seq
  if task == "reverse":
    return seq[::-1]
  return tuple(sorted(seq))


def make_task(task: str, *, num_symbols: int = 20, min_len: int = 5, max_len: int = 15,
              num_train: int = 10_000, num_valid: int = 500, num_test: int = 500,
              seed: int = 0):
  """Builds the three splits of a synthetic task.

  Returns:
    `(splits, tokenizer)`: `splits[name] = (sources, targets)`, lists of str,
    for name in 'train', 'validation', 'test'; a `WordTokenizer`.

  Raises:
    ValueError: naming the argument: unknown `task`, bad lengths, a split size
      < 1, or a symbol space too small to draw unseen validation/test strings.
  """
  if task not in TASKS:
    raise ValueError(f"`task` must be one of {TASKS}, got {task!r}.")
  names = symbols(num_symbols)
  for arg, value in (("min_len", min_len), ("max_len", max_len)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"`{arg}` must be a positive int, got {value!r}.")
  if min_len > max_len:
    raise ValueError(f"`min_len` ({min_len}) must be <= `max_len` ({max_len}).")
  sizes = {"train": num_train, "validation": num_valid, "test": num_test}
  flags = {"train": "num_train", "validation": "num_valid", "test": "num_test"}
  for split, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"`{flags[split]}` must be a positive int (split '{split}' "
                       f"would be empty), got {size!r}.")
  rng = np.random.default_rng([seed, TASKS.index(task)])
  train = _draw(rng, num_train, num_symbols, min_len, max_len)
  seen = set(train)
  drawn = {"train": train}
  for split in ("validation", "test"):
    fresh: list[tuple[int, ...]] = []
    for _ in range(20):  # Re-draw until enough unseen strings (or give up).
      for seq in _draw(rng, 2 * sizes[split], num_symbols, min_len, max_len):
        if seq not in seen and len(fresh) < sizes[split]:
          fresh.append(seq)
          seen.add(seq)
      if len(fresh) == sizes[split]:
        break
    else:
      raise ValueError(
          f"could not draw {sizes[split]} {split} strings unseen in train: raise "
          f"`num_symbols` ({num_symbols}) or `max_len` ({max_len}), or lower "
          f"`{flags[split]}` / `num_train`.")
    drawn[split] = fresh
  splits = {}
  for split, seqs in drawn.items():
    sources = [" ".join(names[k] for k in seq) for seq in seqs]
    targets = [" ".join(names[k] for k in _target(task, seq)) for seq in seqs]
    splits[split] = (sources, targets)
  return splits, WordTokenizer(names)
