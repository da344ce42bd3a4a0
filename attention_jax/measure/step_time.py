"""The batches a training step is timed on: real ones, of one shape.

A timed step must be the step the sweep trains, on its own data: so the
batches come from the trainer's own training stream. The stream buckets its
batches by padded length, and every length is a compiled program of its own;
timing steps of mixed lengths would time the mix. So the steps are timed on
the first batches of one length: the longest that has enough of them near the
start of the stream (64 pairs x 32 tokens in the quick and transformer
presets). The clock itself is `attention_jax.measure.benchmarking.time_steps`.
"""

from __future__ import annotations


def one_length_batches(trainer, count: int, scan: int = 50) -> list:
  """The first `count` batches of one padded length of `trainer`'s training
  stream, teacher-forced (`(src, tgt_in, tgt_out)`, as its step takes them):
  of the longest length that has `count` among the first `scan` x `count`
  batches, else of the length that has the most there."""
  if count < 1:
    raise ValueError(f"`count` must be >= 1, got {count}.")
  stream = trainer.train_batches(0)
  by_length = {}  # padded length -> batches, from the start of the stream
  for _ in range(scan * count):
    batch = next(stream)
    by_length.setdefault(batch.src.shape[1], []).append(batch)
  full = [length for length, found in by_length.items() if len(found) >= count]
  length = max(full) if full else max(by_length, key=lambda k: len(by_length[k]))
  return [trainer.evaluator.teacher_forced(b) for b in by_length[length][:count]]
