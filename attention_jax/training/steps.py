"""The training step and the evaluation step: the one place they are written.

Pure module-level functions, bound to a model and an optimiser with
`functools.partial` and compiled by the caller (the ensemble trainer vmaps
them over seeds; the benchmark scans them; `model_step_time` times one)::

    step = functools.partial(steps.train_step, graphdef, tx, pad_id=config.pad_id)
    params, opt_state, loss = jax.jit(step)(params, rest, opt_state, src, tgt_in,
                                            tgt_out, dropout_key)

`ensemble_train_step` is the one compiled here: the ensemble trainer's step
over its members, which the memory check also compiles for one or two
members before any work (`memory.step_memory`), so both are the same program.

A model is any `attention_jax.models` encoder-decoder: `model(src, tgt_in,
deterministic=..., rngs=...) -> (logits [B, T, V], aux)`, split with
`nnx.split(model, nnx.Param, ...)` into `graphdef, params, rest`.

Shape glossary: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from attention_jax.training import placement as placement_lib


def token_loss(logits, targets, pad_id: int, label_smoothing: float = 0.0):
  """Mean cross entropy over non-pad target tokens.

  Computed from the log-softmax and the integer labels, never a one-hot
  `[B, T, V]` tensor: on 2 CPU cores the one-hot version spent ~30 ms of a
  ~180 ms quick-preset step building, selecting and broadcasting `[B, T, V]`
  tensors (jax.profiler trace of the quick model). With label smoothing ε the target
  distribution is (1 - ε)·onehot + ε/V (optax.smooth_labels), whose cross
  entropy is (1 - ε)·nll + ε·mean_v(-log p_v).

  Args:
    logits: `[B, T, V]` (any float dtype; computed in float32).
    targets: int `[B, T]`.

  Returns:
    `(loss, num_tokens)` float32 scalars.
  """
  logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, T, V]
  xent = -jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]  # [B, T]
  if label_smoothing:
    xent = (1.0 - label_smoothing) * xent - label_smoothing * jnp.mean(logprobs, axis=-1)
  valid = (targets != pad_id).astype(jnp.float32)
  ntok = jnp.sum(valid)
  return jnp.sum(xent * valid) / jnp.maximum(ntok, 1.0), ntok


def decoder_input(tgt: np.ndarray, sos_id: int, pad_id: int) -> np.ndarray:
  """Teacher forcing: `<sos>` + gold shifted right; `[B, T]` -> `[B, T]`."""
  shifted = np.concatenate([np.full_like(tgt[:, :1], sos_id), tgt[:, :-1]], axis=1)
  # Rows that are all padding (filler rows) stay all padding.
  return np.where((tgt != pad_id).any(axis=1, keepdims=True), shifted, pad_id)


def train_step(graphdef, tx: optax.GradientTransformation, params, rest, opt_state,
               src, tgt_in, tgt_out, dropout_key, *, pad_id: int,
               label_smoothing: float = 0.0, dropout: bool = True):
  """One optimiser step on the token cross entropy (padding excluded).

  Args:
    graphdef, tx: the model's structure and the optimiser (bind them).
    params, rest: the model's `nnx.Param`s and its other state.
    opt_state: `tx`'s state of `params`.
    src: int `[B, S]`; tgt_in: int `[B, T]` (`decoder_input`); tgt_out: int `[B, T]`.
    dropout_key: a jax key for this step's dropout.
    pad_id: the padding id of `tgt_out` (the model config's `pad_id`).
    label_smoothing: mass ε of the smoothed targets.
    dropout: False trains deterministically (a model with dropout 0 needs no key).

  Returns:
    `(params, opt_state, loss)`: the updated state and the loss before the update.
  """

  def loss_fn(p):
    model = nnx.merge(graphdef, p, rest)
    logits, _ = model(src, tgt_in, deterministic=not dropout,
                      rngs=nnx.Rngs(dropout=dropout_key))  # [B, T, V]
    with jax.named_scope("loss"):  # scopes name the ops in profiles, nothing else
      return token_loss(logits, tgt_out, pad_id, label_smoothing)

  (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  with jax.named_scope("optimizer"):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def ensemble_train_step(graphdef, tx: optax.GradientTransformation, seeds: Sequence[int],
                        placement: placement_lib.Placement, *, pad_id: int,
                        label_smoothing: float = 0.0, dropout: bool = True):
  """`train_step` of every member of an ensemble, one per seed of `seeds`
  (its dropout keyed by its seed and the step), jitted and placed as
  `placement` says: `(params, rest, opt_state, step_index, src, tgt_in,
  tgt_out) -> (params, opt_state, loss [E])`, the state donated. The
  trainer's step (`train_lib.EnsembleTrainer`), and the one the memory check
  compiles for one or two members (`memory.step_memory`)."""
  step = functools.partial(train_step, graphdef, tx, pad_id=pad_id,
                           label_smoothing=label_smoothing, dropout=dropout)
  seeds = jnp.asarray(seeds, jnp.uint32)

  def member(params, rest, opt_state, seed, step_index, src, tgt_in, tgt_out):
    key = jax.random.fold_in(jax.random.PRNGKey(seed), step_index)
    return step(params, rest, opt_state, src, tgt_in, tgt_out, key)

  # With a `members` mesh axis each device steps its own members
  # (`over_members_on`), and the outputs stay where the inputs were.
  mesh = placement.mesh
  placed = {"out_shardings": placement.stacked_sharding()} if placement.member_groups > 1 else {}

  def step_fn(params, rest, opt_state, step_index, src, tgt_in, tgt_out):
    return placement_lib.over_members_on(
        mesh, member, (0, 0, 0, 0, None, None, None, None))(
            params, rest, opt_state, seeds, step_index, src, tgt_in, tgt_out)

  return jax.jit(step_fn, donate_argnums=(0, 2), **placed)


def eval_step(graphdef, params, rest, src, tgt_in, tgt_out, *, pad_id: int):
  """Teacher-forced negative log-likelihood of one batch, no dropout, no smoothing.

  Returns:
    `(nll_sum, num_tokens)`: float32 scalars; perplexity over batches is
    `exp(Σ nll_sum / Σ num_tokens)`.
  """
  logits, _ = nnx.merge(graphdef, params, rest)(src, tgt_in, deterministic=True)
  loss, ntok = token_loss(logits, tgt_out, pad_id)
  return loss * ntok, ntok
