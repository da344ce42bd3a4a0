r"""Two CPU measurements behind the quick step's second round of changes, each in a fresh process.

    python -m experiments.cpu_efficiency.cpu_micro > results/cpu_efficiency/round2/micro.log

1. The output layer with its log-softmax loss, forward and backward, alone
   ([64, 32, 128] @ [128, 2000]): `nnx.Linear` on the 3-D features against
   `layers.dense` (one 2-D product), median of `--repeats` calls after one.
2. The step of one cell of `--preset` (`--arm`:`--dim`, one seed; the quick
   preset's multiplicative a = 128 by default) on its first `--batches`
   training batches of one length (`measure.step_time.one_length_batches`:
   64 x 32 in the quick preset), `--rounds` rounds after a warm-up: the median
   step and the minor page faults per step, with glibc's allocator defaults
   and with `host_memory.keep_freed_memory`, and under two YNNPACK fusion
   settings of XLA:CPU that were tried.

Each measurement runs in a process of its own (`--child`), pinned to core 0,
so that the allocator and XLA's flags are set before JAX starts. About 3
minutes on an idle 2-core machine. Every step is timed by
`benchmarking.time_steps`.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (allocator, XLA_FLAGS) of each step measurement, in the order printed.
STEP_SETTINGS = (("default", ""), ("keep", ""),
                 ("default", "--xla_cpu_experimental_ynn_fusion_type=-dot"),
                 ("default", "--xla_cpu_experimental_xnn_graph_fusion_mode="
                             "XNN_GRAPH_FUSION_MODE_GREEDY"))


def define_flags() -> None:
  """Defined only when this module is the program (the drivers' names overlap)."""
  flags.DEFINE_enum("child", None, ["output_layer", "step"], "Run one measurement in this "
                    "process and print its JSON line (the parent starts these).")
  flags.DEFINE_enum("allocator", "default", ["default", "keep"], "With --child=step: glibc's "
                    "defaults, or host_memory.keep_freed_memory.")
  flags.DEFINE_string("preset", "quick", "The sweep preset of the timed step.")
  flags.DEFINE_string("arm", "multiplicative", "The timed step's arm.")
  flags.DEFINE_integer("dim", 128, "The timed step's attention dimension.")
  flags.DEFINE_integer("batches", 4, "Training batches of one length per round.")
  flags.DEFINE_integer("rounds", 3, "Timed rounds over the batches.")
  flags.DEFINE_integer("repeats", 10, "Timed calls of the output layer.")


def output_layer(repeats: int) -> dict:
  """Milliseconds per call of the output layer + loss, forward and backward (docstring, 1)."""
  os.sched_setaffinity(0, {0})
  # pylint: disable=g-import-not-at-top
  from flax import nnx
  import jax
  from attention_jax.measure import benchmarking
  from attention_jax import layers
  from attention_jax.training import steps
  # pylint: enable=g-import-not-at-top
  layer = nnx.Linear(128, 2000, rngs=nnx.Rngs(0))
  h = jax.random.normal(jax.random.key(1), (64, 32, 128))
  tgt = jax.random.randint(jax.random.key(2), (64, 32), 1, 2000)
  out = {}
  for name, apply in (("3-D Linear", lambda m, x: m(x)), ("layers.dense", layers.dense)):
    loss = lambda m, x, apply=apply: steps.token_loss(apply(m, x), tgt, 0, 0.1)[0]
    grad = nnx.jit(nnx.grad(loss, argnums=(0, 1)))
    times = benchmarking.time_steps(lambda _, grad=grad: grad(layer, h), repeats, warmup=1)
    out[name] = times.median_s * 1e3
  return out


def step(keep: bool, preset: str, arm: str, dim: int, batches: int, rounds: int) -> dict:
  """Median step (ms), minor page faults per step and the step's temporary
  MiB of one cell (module docstring, 2)."""
  # pylint: disable=g-import-not-at-top
  import dataclasses
  import resource
  from attention_jax.sweep import host_memory
  from attention_jax.sweep import workers
  # pylint: enable=g-import-not-at-top
  if keep:
    host_memory.keep_freed_memory()
  workers.use_one_core(0)
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  from attention_jax.measure import benchmarking
  from attention_jax.measure import step_time
  from attention_jax.sweep import config as config_lib
  from attention_jax.sweep import datasets
  from attention_jax.training import train_lib
  # pylint: enable=g-import-not-at-top
  cfg = config_lib.from_preset(preset)
  run = dataclasses.replace(cfg, seeds=1).point(config_lib.Arm.of(arm, dim))
  trainer = train_lib.EnsembleTrainer(run, datasets.load_data(cfg))
  chosen = step_time.one_length_batches(trainer, batches)
  state = [trainer.state.params, trainer.state.opt_state]
  args = lambda i: (state[0], trainer.rest, state[1], np.int32(i % batches), *chosen[i % batches])
  compiled = trainer._train_step.lower(*args(0)).compile()  # pylint: disable=protected-access

  def one_step(i):
    state[0], state[1], loss = compiled(*args(i))
    return np.asarray(loss)  # waits for the step, as the trainer does (a host copy)

  for i in range(batches):  # warm-up, each step waited for
    jax.block_until_ready(one_step(i))
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  times = benchmarking.time_steps(one_step, rounds * batches)
  faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(times.wall_s)
  return {"median_ms": times.median_s * 1e3, "faults_per_step": faults,
          "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2 ** 20}


def child(*args: str, xla_flags: str = "") -> dict:
  """The JSON line of `python -m experiments.cpu_efficiency.cpu_micro ARGS` in a fresh process."""
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=xla_flags)
  out = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency.cpu_micro", *args], cwd=ROOT,
                       env=env, check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  for name in ("dim", "batches", "rounds", "repeats"):
    if FLAGS[name].value < 1:
      sys.exit(f"error: `--{name}` must be >= 1, got {FLAGS[name].value}.")
  if FLAGS.child == "output_layer":
    print(json.dumps(output_layer(FLAGS.repeats)))
    return
  cell = [f"--preset={FLAGS.preset}", f"--arm={FLAGS.arm}", f"--dim={FLAGS.dim}",
          f"--batches={FLAGS.batches}", f"--rounds={FLAGS.rounds}"]
  if FLAGS.child == "step":
    print(json.dumps(step(FLAGS.allocator == "keep", FLAGS.preset, FLAGS.arm, FLAGS.dim,
                          FLAGS.batches, FLAGS.rounds)))
    return
  from attention_jax.measure import provenance  # pylint: disable=g-import-not-at-top
  commit, _ = provenance.git_state(ROOT)
  print(f"commit {(commit or 'unknown')[:7]}")
  print("output layer + loss, forward and backward, ms:",
        child("--child=output_layer", f"--repeats={FLAGS.repeats}"))
  for mode, xla_flags in STEP_SETTINGS:
    print(f"quick step, allocator {mode}, XLA_FLAGS={xla_flags or '(none)'}:",
          child("--child=step", f"--allocator={mode}", *cell, xla_flags=xla_flags), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
