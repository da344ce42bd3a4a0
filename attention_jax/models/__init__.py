"""Model families (Flax NNX) and helpers for ensembles of seeds.

Both families share one interface::

  model = Seq2Seq(Seq2SeqConfig.britz_base(8000), rngs=nnx.Rngs(0))
  model = Transformer(TransformerConfig.base(8000), rngs=nnx.Rngs(0))
  logits, aux = model(src, tgt_in, deterministic=False, rngs=nnx.Rngs(dropout=1))

Ensembles of seeds (one compiled program for N models)::

  graphdef, states = create_ensemble(Seq2Seq, config, seeds=[0, 1, 2])
  # `states` is an nnx.State whose every leaf has a leading axis of size 3.
  def forward(state, src, tgt_in):
    return nnx.merge(graphdef, state)(src, tgt_in)
  logits, aux = jax.jit(jax.vmap(forward, in_axes=(0, None, None)))(states, src, tgt_in)
  # logits [3, B, T, V]; model i equals Model(config, rngs=nnx.Rngs(seeds[i])).

Training vmaps the same way: `jax.vmap(train_step, in_axes=(0, 0, ...))` over
`(states, optimizer_states, dropout_keys)`, with `nnx.merge` inside the step.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attention_jax.models.transformer import Transformer, TransformerConfig

__all__ = ["Seq2Seq", "Seq2SeqConfig", "Transformer", "TransformerConfig",
           "create_ensemble", "count_params"]


@functools.lru_cache(maxsize=16)
def _builder(model_cls, config, backend: str):
  """`(graphdef, build)` for one model class and (frozen, hashable) config:
  the graph definition, made without computing any parameter, and the
  compiled `build(seed) -> state`. Kept per (class, config, backend) so that
  building the same model again (another trainer of the same run, a test)
  reuses the compiled initialiser instead of tracing and compiling it anew
  (about 7-16 s of the 8-17 s a build took on a loaded 2-core machine); the
  program, and so every number, is the same. `backend` is in the key because
  the model code reads `jax.default_backend()` while it is traced."""
  del backend
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))))

  @jax.jit
  def build(seed):
    return nnx.split(model_cls(config, rngs=nnx.Rngs(jax.random.key(seed))))[1]

  return graphdef, build


def create_ensemble(model_cls, config, seeds: Sequence[int]):
  """Builds one model per seed and stacks their states on a leading axis.

  Args:
    model_cls: `Seq2Seq` or `Transformer` (any `cls(config, *, rngs)`).
    config: its config.
    seeds: N int seeds; model i is initialised exactly as
      `model_cls(config, rngs=nnx.Rngs(seeds[i]))`.

  Returns:
    `(graphdef, stacked_state)`: the shared graph definition and an
    `nnx.State` of parameters with a leading ensemble axis `[N, ...]`. Apply
    with `jax.vmap(lambda st, *a: nnx.merge(graphdef, st)(*a), in_axes=(0, ...))`.
  """
  seeds = np.asarray(seeds)
  if (seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer)
      or np.any(seeds < 0) or np.any(seeds >= 2 ** 32)):
    raise ValueError(
        f"`seeds` must be a non-empty 1-D sequence of ints in [0, 2**32), got {seeds!r}.")
  try:
    hash(config)
    builder = _builder
  except TypeError:  # a config with an unhashable field: built afresh
    builder = _builder.__wrapped__
  graphdef, build = builder(model_cls, config, jax.default_backend())

  # One compiled builder called per seed, not vmapped: the orthogonal init of
  # the RNN cells runs a QR factorisation, and a *batched* QR on XLA:CPU
  # (LAPACK's ParallelBatchMap inside a while loop) can deadlock its thread
  # pool (seen here about once in 12 runs on 2 cores).
  members = [build(jnp.asarray(s, jnp.uint32)) for s in seeds.tolist()]
  return graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *members)


def count_params(model_or_state) -> int:
  """Number of parameter scalars of an `nnx.Module`, an `nnx.State` (its
  `nnx.Param` entries) or any pytree of arrays. A stacked ensemble state
  counts every member (N times the single-model count)."""
  if isinstance(model_or_state, nnx.Module):
    tree = nnx.state(model_or_state, nnx.Param)
  elif isinstance(model_or_state, nnx.State):
    tree = nnx.filter_state(model_or_state, nnx.Param)
  else:
    tree = model_or_state
  return int(sum(np.prod(np.shape(x), dtype=np.int64) for x in jax.tree.leaves(tree)))
