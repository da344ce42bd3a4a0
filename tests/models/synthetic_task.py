"""A small synthetic translation task and a training loop for overfit tests.

Copy or reverse random strings of length 5-15 (`data.synthetic`, symbols with
ids >= 4; 0 pad, 1 eos, 2 sos, 3 unk), then train with the trainer's own step
(`training.steps.train_step`) and report teacher-forced token accuracy on the
training set.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attention_jax.data import synthetic
from attention_jax.data import tokenizer as tokenizer_lib
from attention_jax.training import steps


def make_task(n, vocab, *, task="reverse", min_len=5, max_len=15, seed=0):
  """`(src, tgt_in, tgt_out)` int32 `[n, max_len + 1]` (sentences end with eos):
  the `n` training pairs of `data.synthetic.make_task` over `vocab - 4` symbols."""
  splits, tok = synthetic.make_task(task, num_symbols=vocab - tokenizer_lib.NUM_SPECIAL,
                                    min_len=min_len, max_len=max_len, num_train=n,
                                    num_valid=1, num_test=1, seed=seed)

  def padded(texts):  # [n, max_len + 1]
    out = np.full((n, max_len + 1), tok.pad_id, np.int32)
    for i, ids in enumerate(tok.encode_batch(texts)):
      out[i, :len(ids) + 1] = ids + [tok.eos_id]
    return out

  src, tgt = (padded(texts) for texts in splits["train"])
  return src, steps.decoder_input(tgt, tok.sos_id, tok.pad_id), tgt


def token_accuracy(logits, tgt_out):
  valid = tgt_out != 0
  return jnp.sum((jnp.argmax(logits, -1) == tgt_out) & valid) / jnp.sum(valid)


def train_to_accuracy(model, data, *, max_steps, learning_rate, target=0.99,
                      batch_size=64, check_every=50, seed=0):
  """Trains until the training-set token accuracy reaches `target`.

  Returns `(accuracy, steps, seconds)`.
  """
  src, tgt_in, tgt_out = data
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adam(learning_rate)
  opt_state = tx.init(params)
  step = jax.jit(functools.partial(steps.train_step, graphdef, tx,
                                   pad_id=model.config.pad_id, dropout=False))
  no_dropout = jax.random.key(0)  # unused: the step is deterministic
  accuracy_of = jax.jit(lambda p: token_accuracy(
      nnx.merge(graphdef, p, rest)(src, tgt_in)[0], tgt_out))
  rng = np.random.default_rng(seed)
  start, accuracy, num_steps = time.time(), 0.0, 0
  while num_steps < max_steps:
    idx = rng.integers(0, len(src), batch_size)
    params, opt_state, _ = step(params, rest, opt_state, src[idx], tgt_in[idx], tgt_out[idx],
                                no_dropout)
    num_steps += 1
    if num_steps % check_every == 0:
      accuracy = float(accuracy_of(params))
      if accuracy >= target:
        break
  return accuracy, num_steps, time.time() - start


@functools.partial(nnx.jit, static_argnames=("deterministic",))
def forward(model, src, tgt_in, *, deterministic=True, rngs=None, score_offset=None):
  """`model(src, tgt_in, ...)` compiled once per model structure and shapes (model tests)."""
  return model(src, tgt_in, deterministic=deterministic, rngs=rngs, score_offset=score_offset)


encode = nnx.jit(lambda model, src: model.encode(src))


def assert_same_loss_and_gradients(flat, plain, min_leaves):
  """`flat` and `plain`, each `(loss, gradient tree)` of one model computed two
  ways (2-D products through `layers.dense` or the layers' own 3-D calls):
  equal to float32 rounding, over more than `min_leaves` gradient arrays, of
  which some are far from zero (gradients flow)."""
  np.testing.assert_allclose(flat[0], plain[0], rtol=1e-6)
  flat_leaves, plain_leaves = jax.tree.leaves(flat[1]), jax.tree.leaves(plain[1])
  assert len(flat_leaves) == len(plain_leaves) > min_leaves
  for a, b in zip(flat_leaves, plain_leaves):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert max(float(jnp.max(jnp.abs(g))) for g in flat_leaves) > 1e-3
