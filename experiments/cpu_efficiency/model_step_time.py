"""Parameter counts and the time of one training step of the reference models.

    python -m experiments.cpu_efficiency.model_step_time                    # both models, CPU
    python -m experiments.cpu_efficiency.model_step_time --model=rnn --batch=32 --length=40

One step = `training.steps.train_step` (the trainer's step: forward +
backward + Adam update, with dropout), compiled with
`jax.jit` once before timing; the reported figure is the median over
`--repeats` steps (compile time excluded), each waited for with
`block_until_ready`. Models: Britz-base RNN (embedding 512, bidirectional GRU
512, 2-layer GRU decoder 512, additive attention dim 512) and
Transformer-base (N=6, d_model 512, h=8, d_ff 2048), vocabulary `--vocab`.
"""

import functools
import statistics

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attention_jax.measure import benchmarking
from attention_jax import models
from attention_jax.sweep import host_memory
from attention_jax.training import steps

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "both", ["rnn", "transformer", "both"], "Which model to time.")
flags.DEFINE_integer("batch", 32, "Sentences per batch.")
flags.DEFINE_integer("length", 40, "Source and target tokens per sentence.")
flags.DEFINE_integer("vocab", 8000, "Vocabulary size.")
flags.DEFINE_integer("repeats", 7, "Timed steps (the median is reported).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")


def build(name: str, vocab: int, dtype):
  if name == "rnn":
    return models.Seq2Seq(models.Seq2SeqConfig.britz_base(vocab, dtype=dtype),
                          rngs=nnx.Rngs(0))
  return models.Transformer(models.TransformerConfig.base(vocab, dtype=dtype),
                            rngs=nnx.Rngs(0))


def time_step(model, batch: int, length: int, vocab: int, repeats: int):
  """Returns (compile seconds, list of step seconds)."""
  config = model.config
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adam(1e-4)
  opt_state = tx.init(params)
  rng = np.random.default_rng(0)
  first = max(config.pad_id, config.eos_id, config.sos_id) + 1  # no special ids in the data
  src = rng.integers(first, vocab, (batch, length)).astype(np.int32)
  tgt = rng.integers(first, vocab, (batch, length)).astype(np.int32)
  tgt_in = steps.decoder_input(tgt, config.sos_id, config.pad_id)
  step = jax.jit(functools.partial(steps.train_step, graphdef, tx, pad_id=config.pad_id))

  key = jax.random.key(0)
  compiled, compile_s = benchmarking.timed(
      lambda: step.lower(params, rest, opt_state, src, tgt_in, tgt, key).compile())[:2]
  state = [params, opt_state]

  def one_step(i):  # the warm-up (i = 0) with `key`, then the timed steps
    params, opt_state, loss = compiled(state[0], rest, state[1], src, tgt_in, tgt,
                                       key if i == 0 else jax.random.fold_in(key, i - 1))
    state[:] = params, opt_state
    return params, loss

  times = benchmarking.time_steps(one_step, repeats, warmup=1)
  return compile_s, list(times.wall_s)


def main(argv):
  del argv
  host_memory.keep_freed_memory()  # as the trainer's drivers do, before JAX starts
  dtype = jnp.bfloat16 if FLAGS.dtype == "bfloat16" else jnp.float32
  names = ["rnn", "transformer"] if FLAGS.model == "both" else [FLAGS.model]
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()} "
        f"({jax.default_backend()}), jax {jax.__version__}, dtype {FLAGS.dtype}")
  for name in names:
    model = build(name, FLAGS.vocab, dtype)
    compile_s, times = time_step(model, FLAGS.batch, FLAGS.length, FLAGS.vocab,
                                 FLAGS.repeats)
    median = statistics.median(times)
    tokens = FLAGS.batch * FLAGS.length
    print(f"{name:>11}: params {models.count_params(model):,} | step "
          f"{median * 1e3:.0f} ms median (min {min(times) * 1e3:.0f}, max "
          f"{max(times) * 1e3:.0f}, n={len(times)}) at batch {FLAGS.batch} x "
          f"{FLAGS.length} tokens = {tokens / median:,.0f} target tokens/s | "
          f"compile {compile_s:.1f} s")


if __name__ == "__main__":
  app.run(main)
