"""A small synthetic translation task and a training loop for overfit tests.

Copy or reverse random token strings of length 5-15 (ids >= 3; 0 pad,
1 eos, 2 sos), then train with Adam and report teacher-forced token accuracy
on the training set.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def make_task(n, vocab, *, task="reverse", min_len=5, max_len=15, seed=0):
  """`(src, tgt_in, tgt_out)` int32 `[n, max_len + 1]` (sentences end with eos)."""
  rng = np.random.default_rng(seed)
  width = max_len + 1
  src = np.zeros((n, width), np.int32)
  tgt = np.zeros((n, width), np.int32)
  for i in range(n):
    length = rng.integers(min_len, max_len + 1)
    x = rng.integers(3, vocab, size=length)
    src[i, :length], src[i, length] = x, 1
    tgt[i, :length], tgt[i, length] = (x[::-1] if task == "reverse" else x), 1
  tgt_in = np.concatenate([np.full((n, 1), 2, np.int32), tgt[:, :-1]], axis=1)
  tgt_in = np.where(np.arange(width)[None] < (tgt != 0).sum(1, keepdims=True), tgt_in, 0)
  return src, tgt_in.astype(np.int32), tgt


def token_accuracy(logits, tgt_out):
  valid = tgt_out != 0
  return jnp.sum((jnp.argmax(logits, -1) == tgt_out) & valid) / jnp.sum(valid)


def train_to_accuracy(model, data, *, max_steps, learning_rate, target=0.99,
                      batch_size=64, check_every=50, seed=0):
  """Trains until the training-set token accuracy reaches `target`.

  Returns `(accuracy, steps, seconds)`.
  """
  src, tgt_in, tgt_out = data
  graphdef, params = nnx.split(model)
  tx = optax.adam(learning_rate)
  opt_state = tx.init(params)

  def loss_fn(p, s, ti, to):
    logits, _ = nnx.merge(graphdef, p)(s, ti)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, to)
    valid = to != 0
    return jnp.sum(xent * valid) / jnp.sum(valid)

  @jax.jit
  def step(p, o, s, ti, to):
    grads = jax.grad(loss_fn)(p, s, ti, to)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o

  accuracy_of = jax.jit(lambda p: token_accuracy(nnx.merge(graphdef, p)(src, tgt_in)[0], tgt_out))
  rng = np.random.default_rng(seed)
  start, accuracy, steps = time.time(), 0.0, 0
  while steps < max_steps:
    idx = rng.integers(0, len(src), batch_size)
    params, opt_state = step(params, opt_state, src[idx], tgt_in[idx], tgt_out[idx])
    steps += 1
    if steps % check_every == 0:
      accuracy = float(accuracy_of(params))
      if accuracy >= target:
        break
  return accuracy, steps, time.time() - start


@functools.partial(nnx.jit, static_argnames=("deterministic",))
def forward(model, src, tgt_in, *, deterministic=True, rngs=None, score_offset=None):
  """`model(src, tgt_in, ...)` compiled once per model structure and shapes (model tests)."""
  return model(src, tgt_in, deterministic=deterministic, rngs=rngs, score_offset=score_offset)


encode = nnx.jit(lambda model, src: model.encode(src))
