r"""XLA's memory analysis of a compiled Transformer search, with and without the model's beam hooks.

    python -m experiments.cpu_efficiency.decode_memory --batch=32 --src_len=100 --beam=4 --form=new --run
    /usr/bin/time -v python -m experiments.cpu_efficiency.decode_memory --batch=32 --src_len=100 --beam=4 \
        --form=plain --run          # the peak RSS too

The Transformer of the d_k ablation's pilot at d_k 1024 (vocabulary 2000,
d_model 128, 4 heads, d_ff 512, 2 + 2 layers, `dot`; `--d_k`,
`--max_length` make it smaller) decodes `--batch` sentences of `--src_len`
tokens with beam search of `--beam` (1: greedy). `--form=new` is the model
as it is: its beam hooks keep one copy of the encoder memory per sentence;
`--form=plain` hides them (only `init_decode` and `decode_step` are seen), so
every leaf of the memory and the carry is repeated per beam, as before the
hooks. Prints the compiled program's temporary, argument, output and aliased
MiB and the compile time; `--run` also decodes (a source of one repeated
token never emits <eos>: the full length) and prints the seconds.
"""

import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defined only when this module is the program (the drivers' names overlap)."""
  flags.DEFINE_integer("batch", 32, "Sentences decoded at once (B).")
  flags.DEFINE_integer("src_len", 100, "Source tokens per sentence (S).")
  flags.DEFINE_integer("beam", 4, "Beam size (K); 1: greedy.")
  flags.DEFINE_enum("form", "new", ["new", "plain"], "new: the model's beam hooks; plain: "
                    "without them (memory and carry repeated per beam).")
  flags.DEFINE_bool("run", False, "Also decode once and print the seconds.")
  flags.DEFINE_integer("d_k", 1024, "Per-head query/key size.")
  flags.DEFINE_integer("max_length", 400, "The model's longest sequence (decoding length).")


class Plain:
  """A model seen only through `init_decode` and `decode_step`: no beam hooks."""

  def __init__(self, model):
    self.model = model
    self.config = model.config
    self.max_decode_length = model.max_decode_length

  def init_decode(self, *args):
    return self.model.init_decode(*args)

  def decode_step(self, *args):
    return self.model.decode_step(*args)


def measure(batch: int, src_len: int, beam: int, plain: bool, run: bool, d_k: int,
            max_length: int) -> dict:
  """Compiles the search (module docstring); its memory in MiB, compile and run seconds."""
  # pylint: disable=g-import-not-at-top
  from flax import nnx
  import jax
  import jax.numpy as jnp
  from attention_jax.measure import benchmarking
  from attention_jax import decoding
  from attention_jax import models
  # pylint: enable=g-import-not-at-top
  cfg = models.TransformerConfig(vocab_size=2000, num_layers=2, d_model=128, num_heads=4,
                                 d_ff=512, score="dot", attention_dim=d_k,
                                 max_length=max_length, dropout=0.1)
  graphdef, state = nnx.split(models.Transformer(cfg, rngs=nnx.Rngs(0)))

  def search(state, src):
    model = nnx.merge(graphdef, state)
    model = Plain(model) if plain else model
    if beam > 1:
      return decoding.beam_search(model, src, beam_size=beam)
    return decoding.greedy(model, src)

  src = jnp.ones((batch, src_len), jnp.int32) * 5
  compiled, compile_s, _ = benchmarking.timed(lambda: jax.jit(search).lower(state, src).compile())
  memory = compiled.memory_analysis()
  mib = lambda n: n / 2 ** 20
  out = {"temp_mib": mib(memory.temp_size_in_bytes), "arg_mib": mib(memory.argument_size_in_bytes),
         "out_mib": mib(memory.output_size_in_bytes), "alias_mib": mib(memory.alias_size_in_bytes),
         "compile_s": compile_s}
  if run:
    out["run_s"] = benchmarking.timed(lambda: compiled(state, src))[1]
  return out


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  for name in ("batch", "src_len", "beam", "d_k", "max_length"):
    if FLAGS[name].value < 1:
      sys.exit(f"error: `--{name}` must be >= 1, got {FLAGS[name].value}.")
  if FLAGS.src_len > FLAGS.max_length:
    sys.exit(f"error: `--src_len` {FLAGS.src_len} is longer than `--max_length` "
             f"{FLAGS.max_length}.")
  plain = FLAGS.form == "plain"
  m = measure(FLAGS.batch, FLAGS.src_len, FLAGS.beam, plain, FLAGS.run, FLAGS.d_k,
              FLAGS.max_length)
  print(f"B={FLAGS.batch} S={FLAGS.src_len} K={FLAGS.beam} plain={plain}: temp "
        f"{m['temp_mib']:.0f} MiB arg {m['arg_mib']:.0f} out {m['out_mib']:.0f} alias "
        f"{m['alias_mib']:.0f} compile {m['compile_s']:.1f}s", flush=True)
  if "run_s" in m:
    print("run", m["run_s"])


if __name__ == "__main__":
  define_flags()
  app.run(main)
