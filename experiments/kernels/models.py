"""The models suite: training tokens/s, and N seeds vmapped vs N sequential runs.

Each model of `settings.models` trains with the project's one training step
(`attention_jax.training.steps.train_step`), `model_steps` steps scanned into
one compiled program per timed call. Three contenders are timed interleaved:
one seed, N seeds one after the other (what N separate jobs would do), and N
seeds vmapped into one program (`models.create_ensemble`).

Glossary: B batch (sentences), T source and target length, V vocabulary,
N seeds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.measure import benchmarking as bm
from experiments.kernels import resume
from experiments.kernels import timing
from experiments.kernels.settings import Settings

SIZES = {
    # vocab, Seq2Seq fields, Transformer fields
    "tiny": (64, dict(embed_dim=16, hidden_dim=16, attention_dim=16),
             dict(num_layers=1, d_model=32, num_heads=2, d_ff=64)),
    "small": (4000, dict(embed_dim=128, hidden_dim=128, attention_dim=128),
              dict(num_layers=2, d_model=128, num_heads=4, d_ff=512)),
    "base": (32000, {}, {}),  # Britz-base / Transformer-base as in the papers
}


def model_configs(size: str, vocab: int | None, seq_len: int):
  """`(vocab, {name: (model class, config)})` of every model at `size`."""
  from attention_jax import models  # pylint: disable=g-import-not-at-top
  default_vocab, rnn_fields, transformer_fields = SIZES[size]
  vocab = vocab or default_vocab
  rnn = dataclasses.replace(models.Seq2SeqConfig.britz_base(vocab), **rnn_fields)
  transformer = dataclasses.replace(models.TransformerConfig.base(vocab),
                                    max_length=max(seq_len, 8), **transformer_fields)
  return vocab, {"rnn_seq2seq": (models.Seq2Seq, rnn),
                 "transformer": (models.Transformer, transformer)}


def scanned_training(step: Callable, steps: int, batch) -> Callable:
  """`train(params, rest, opt_state, key) -> (params, opt_state, losses [steps])`:
  `steps` calls of `step` on the same `batch = (src, tgt_in, tgt_out)`, one program."""

  def train(params, rest, opt_state, key):
    def body(carry, i):
      params, opt_state = carry
      params, opt_state, loss = step(params, rest, opt_state, *batch,
                                     jax.random.fold_in(key, i))
      return (params, opt_state), loss

    (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), jnp.arange(steps))
    return params, opt_state, losses

  return train


def _status(losses) -> str:
  return "ok" if np.all(np.isfinite(losses)) else "refused"


def run(settings: Settings, write: Callable[[dict], None],
        progress: resume.Progress | None = None) -> None:
  """Training tokens/s of each model; N seeds vmapped in one program vs N sequential runs.

  A model is measured unless `progress.pending` has all three of its rows
  (the three are timed together, so a model with any missing is measured
  again and only the missing rows are kept)."""
  progress = progress or resume.Progress((), {})
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from attention_jax import models  # pylint: disable=g-import-not-at-top
  from attention_jax.training import steps as steps_lib  # pylint: disable=g-import-not-at-top

  b, t, n = settings.model_batch, settings.model_seq_len, settings.model_seeds
  vocab, configs = model_configs(settings.model_size, settings.model_vocab, t)
  rng = np.random.default_rng(settings.seed)
  src = jnp.asarray(rng.integers(3, vocab, (b, t)), jnp.int32)  # [B, T]
  tgt = jnp.asarray(rng.integers(3, vocab, (b, t + 1)), jnp.int32)  # [B, T + 1]
  batch = (src, tgt[:, :-1], tgt[:, 1:])  # src, tgt_in, tgt_out
  steps = settings.model_steps
  tokens = b * t * steps  # target tokens per timed call and model
  optimizer = optax.adam(1e-4)
  repeats = max(3, settings.repeats // 2)
  for name in settings.models:
    case = {"suite": "models", "model": name, "size": settings.model_size, "batch": b,
            "seq_len": t}
    if not progress.pending(case, ("1 seed", f"{n} seeds sequential", f"{n} seeds vmapped")):
      continue
    cls, config = configs[name]
    # N models with stacked parameters; member 0 is the single model (the
    # contract of create_ensemble: member i equals cls(config, rngs=Rngs(seed i))).
    ensemble_def, states = models.create_ensemble(cls, config, list(range(n)))
    _, params_n, rest_n = nnx.split(nnx.merge(ensemble_def, states), nnx.Param, ...)
    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))),
                               nnx.Param, ...)
    params1, rest1 = (jax.tree.map(lambda x: x[0], s) for s in (params_n, rest_n))
    step = functools.partial(steps_lib.train_step, graphdef, optimizer, pad_id=config.pad_id)
    train = scanned_training(step, steps, batch)

    base = {"suite": "models", "model": name, "size": settings.model_size, "batch": b,
            "seq_len": t, "vocab": vocab, "params": models.count_params(params1),
            "steps_per_call": steps}
    # Compile the three contenders, check that they train (finite losses), then
    # time them interleaved so that load from other processes hits all alike.
    args1 = (params1, rest1, optimizer.init(params1), jax.random.PRNGKey(0))
    # Progress lines: the rows are written only once all three are timed, so a
    # run cut by a device command's limit shows here how far it got.
    logging.info("[models] %s %s: compiling the one-seed program", name, settings.model_size)
    compiled1, compile1 = bm.compile_fn(train, *args1)
    losses1 = np.asarray(compiled1(*args1)[2])  # [steps]
    logging.info("[models] %s: one seed compiled in %.1f s and ran", name, compile1)
    # N sequential runs of the one-seed program (what N separate jobs would do).
    member = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
    seeds_args = [(member(params_n, i), member(rest_n, i)) for i in range(n)]
    seeds_args = [(p, r, optimizer.init(p), jax.random.PRNGKey(i))
                  for i, (p, r) in enumerate(seeds_args)]
    # N seeds vmapped: one program trains N models.
    args_n = (params_n, rest_n, jax.vmap(optimizer.init)(params_n),
              jax.random.split(jax.random.PRNGKey(1), n))
    calls = {"1 seed": functools.partial(compiled1, *args1),
             f"{n} seeds sequential": lambda: [compiled1(*a) for a in seeds_args]}
    try:
      compiled_n, compile_n = bm.compile_fn(jax.vmap(train), *args_n)
      losses_n = np.asarray(compiled_n(*args_n)[2])  # [N, steps]
      logging.info("[models] %s: %d seeds vmapped compiled in %.1f s and ran", name, n,
                   compile_n)
      calls[f"{n} seeds vmapped"] = functools.partial(compiled_n, *args_n)
    except Exception as e:  # pylint: disable=broad-except
      write({**base, "impl": f"{n} seeds vmapped", "seeds": n, "status": "skipped",
             "reason": f"{type(e).__name__}: {str(e)[:300]}"})
    logging.info("[models] %s: timing %s, %d repeats each", name, ", ".join(calls), repeats)
    timings, other_load, attempts = timing.timed_with_retries(calls, settings, warmup=1,
                                                              repeats=repeats)
    base.update(other_load_cores=other_load, attempts=attempts)
    tps1 = tokens / timings["1 seed"].median_s
    write({**base, "impl": "1 seed", "seeds": 1, **timing.timing_fields(timings["1 seed"]),
           "compile_s": compile1, "tokens_per_s": tps1, "final_loss": float(losses1[-1]),
           "status": _status(losses1), **bm.memory_stats(compiled1)})
    seq = timings[f"{n} seeds sequential"]
    tps_seq = tokens * n / seq.median_s
    write({**base, "impl": f"{n} seeds sequential", "seeds": n, **timing.timing_fields(seq),
           "tokens_per_s": tps_seq, "speedup_vs_one_seed": tps_seq / tps1, "status": "ok"})
    if f"{n} seeds vmapped" in timings:
      vm = timings[f"{n} seeds vmapped"]
      tps_n = tokens * n / vm.median_s
      write({**base, "impl": f"{n} seeds vmapped", "seeds": n, **timing.timing_fields(vm),
             "compile_s": compile_n, "tokens_per_s": tps_n,
             "final_loss": float(losses_n[:, -1].mean()), "speedup_vs_one_seed": tps_n / tps1,
             "speedup_vs_sequential": tps_n / tps_seq, "status": _status(losses_n),
             **bm.memory_stats(compiled_n)})
