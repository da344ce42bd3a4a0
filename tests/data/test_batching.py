"""Length-bucketed batches: fixed shapes, exact coverage, seeded shuffling, padding."""

import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from attention_jax.data import batching


def _random_pairs(n, seed=0, max_len=40):
  rng = np.random.default_rng(seed)
  src = [list(rng.integers(4, 50, size=rng.integers(1, max_len))) for _ in range(n)]
  tgt = [list(rng.integers(4, 50, size=rng.integers(1, max_len))) for _ in range(n)]
  return src, tgt


def _seqs(src, tgt):
  return batching.Sequences(src), batching.Sequences(tgt)


def test_grid():
  assert batching.bucket_boundaries(128) == (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
  n = np.arange(1, 2000)
  padded = batching.padded_length(n)
  assert np.all(padded >= n)
  assert np.all(padded % 8 == 0)
  assert np.all(padded[n <= 64] - n[n <= 64] < 8)
  assert np.all((padded - n)[n > 64] / padded[n > 64] < 0.2)
  assert len(batching.bucket_boundaries(1000)) <= 28


@given(n=st.integers(1, 120), batch_size=st.integers(1, 33), seed=st.integers(0, 5))
def test_eval_pass_covers_every_example_once(n, batch_size, seed):
  src, tgt = _random_pairs(n, seed)
  s, t = _seqs(src, tgt)
  seen = []
  grid = set(batching.bucket_boundaries(64))
  batches = list(batching.iterate_batches(s, t, batch_size, shuffle=False))
  # One partial batch at most, and it comes last (the first batch is full).
  assert all(b.num_real == batch_size for b in batches[:-1])
  for b in batches:
    assert b.src.shape == b.tgt.shape == (batch_size, b.src.shape[1])
    assert b.src.dtype == b.tgt.dtype == np.int32 and b.index.dtype == np.int64
    assert b.src.shape[1] in grid
    for row, i in enumerate(b.index):
      if i < 0:  # filler: all pad
        assert not b.src[row].any() and not b.tgt[row].any()
        continue
      seen.append(int(i))
      k, m = len(src[i]), len(tgt[i])
      np.testing.assert_array_equal(b.src[row, :k], src[i])
      np.testing.assert_array_equal(b.tgt[row, :m], tgt[i])
      assert b.src[row, k] == 1 and b.tgt[row, m] == 1  # EOS
      assert not b.src[row, k + 1:].any() and not b.tgt[row, m + 1:].any()
    assert b.num_real >= 1
  assert sorted(seen) == list(range(n))


def test_lengths_properties():
  s, t = _seqs(*_random_pairs(50))
  b = next(batching.iterate_batches(s, t, 8, shuffle=False))
  real = b.index >= 0
  np.testing.assert_array_equal(b.src_lengths[real], s.lengths[b.index[real]] + 1)
  np.testing.assert_array_equal(b.tgt_lengths[real], t.lengths[b.index[real]] + 1)


def _orders(seed, epochs=1, repeat=False):
  s, t = _seqs(*_random_pairs(100))
  it = batching.iterate_batches(s, t, 16, seed=seed, shuffle=True, repeat=repeat)
  n_batches = sum(1 for _ in batching.iterate_batches(s, t, 16, shuffle=False))
  return [b.index.tolist() for b in itertools.islice(it, n_batches * epochs)], n_batches


def test_shuffle_is_seeded():
  a, _ = _orders(0)
  assert a == _orders(0)[0]
  assert a != _orders(1)[0]
  # A shuffled epoch still holds every example once, with one partial batch at most.
  assert sorted(i for batch in a for i in batch if i >= 0) == list(range(100))
  assert sum(min(batch) < 0 for batch in a) <= 1


def test_repeat_reshuffles_each_epoch_deterministically():
  two, n = _orders(3, epochs=2, repeat=True)
  first, second = two[:n], two[n:]
  assert first != second
  for epoch in (first, second):
    assert sorted(i for b in epoch for i in b if i >= 0) == list(range(100))
  assert two == _orders(3, epochs=2, repeat=True)[0]
  assert first == _orders(3)[0]  # epoch 0 of the endless stream == one epoch


def test_max_length_and_limit():
  src, tgt = _random_pairs(200, max_len=60)
  s, t = _seqs(src, tgt)
  kept = {i for b in batching.iterate_batches(s, t, 32, shuffle=False, max_length=24)
          for i in b.index if i >= 0}
  assert kept == {i for i in range(200) if max(len(src[i]), len(tgt[i])) + 1 <= 24}
  for b in batching.iterate_batches(s, t, 32, shuffle=False, max_length=24):
    assert b.src.shape[1] <= 24
  limited = [i for b in batching.iterate_batches(s, t, 32, shuffle=False, limit=10)
             for i in b.index if i >= 0]
  assert sorted(limited) == list(range(10))


def test_padding_fraction_counts_pad_tokens():
  s, t = _seqs(*_random_pairs(77))
  batches = list(batching.iterate_batches(s, t, 8, shuffle=False))
  real = int(s.lengths.sum() + t.lengths.sum()) + 2 * 77  # + EOS
  total = sum(b.src.size + b.tgt.size for b in batches)
  assert batching.padding_fraction(batches) == pytest.approx(1 - real / total)


def test_errors():
  s, t = _seqs(*_random_pairs(5))
  with pytest.raises(ValueError, match="batch_size"):
    next(batching.iterate_batches(s, t, 0))
  with pytest.raises(ValueError, match="max_length"):
    next(batching.iterate_batches(s, t, 2, max_length=1))
  with pytest.raises(ValueError, match="empty"):
    next(batching.iterate_batches(batching.Sequences([]), batching.Sequences([]), 2,
                                  name="split 'test'"))
