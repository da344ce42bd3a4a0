r"""The two measurements behind round 2's changes, each in fresh processes on one core.

    python results/cpu_efficiency/round2/micro.py > results/cpu_efficiency/round2/micro.log

1. The output layer with its log-softmax loss, forward and backward, alone
   ([64, 32, 128] @ [128, 2000]): `nnx.Linear` on the 3-D features against
   `layers.dense` (one 2-D product), median of 10 calls.
2. The quick step (multiplicative a = 128, one seed, the first 4 training
   batches of length 32, 3 rounds after a warm-up): median step and minor page
   faults per step, with glibc's allocator defaults and with
   `host_memory.keep_freed_memory`, and under two YNNPACK fusion settings of
   XLA:CPU that were tried.
About 3 minutes on an idle 2-core machine.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

OUTPUT_LAYER = r"""
import json, os, time, statistics
os.sched_setaffinity(0, {0})
import jax, jax.numpy as jnp
from flax import nnx
from attention_jax import layers
from attention_jax.training import steps
layer = nnx.Linear(128, 2000, rngs=nnx.Rngs(0))
h = jax.random.normal(jax.random.key(1), (64, 32, 128))
tgt = jax.random.randint(jax.random.key(2), (64, 32), 1, 2000)
out = {}
for name, apply in (("3-D Linear", lambda m, x: m(x)), ("layers.dense", layers.dense)):
  loss = lambda m, x: steps.token_loss(apply(m, x), tgt, 0, 0.1)[0]
  grad = nnx.jit(nnx.grad(loss, argnums=(0, 1)))
  jax.block_until_ready(grad(layer, h))
  times = []
  for _ in range(10):
    start = time.perf_counter()
    jax.block_until_ready(grad(layer, h))
    times.append(time.perf_counter() - start)
  out[name] = statistics.median(times) * 1e3
print(json.dumps(out))
"""

STEP = r"""
import json, os, resource, statistics, sys, time
keep = sys.argv[1] == "keep"
from attention_jax.training import host_memory, workers
if keep:
  host_memory.keep_freed_memory()
workers.use_one_core(0)
import dataclasses
import numpy as np
from attention_jax.training import config as config_lib, datasets, train_lib
cfg = config_lib.from_preset("quick")
data = datasets.load_data(cfg)
run = dataclasses.replace(cfg, seeds=1).point(config_lib.Arm.of("multiplicative", 128))
trainer = train_lib.EnsembleTrainer(run, data)
stream = trainer._train_batches(0)
batches = []
while len(batches) < 4:
  b = next(stream)
  if b.src.shape[1] == 32:
    batches.append(trainer.evaluator.teacher_forced(b))
params, opt = trainer.state.params, trainer.state.opt_state
step = trainer._train_step.lower(params, trainer.rest, opt, np.int32(0), *batches[0]).compile()
for i, b in enumerate(batches):
  params, opt, loss = step(params, trainer.rest, opt, np.int32(i), *b)
np.asarray(loss)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
times = []
for _ in range(3):
  for i, b in enumerate(batches):
    start = time.perf_counter()
    params, opt, loss = step(params, trainer.rest, opt, np.int32(i), *b)
    np.asarray(loss)
    times.append(time.perf_counter() - start)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(times)
temp = step.memory_analysis().temp_size_in_bytes / 2**20
print(json.dumps({"median_ms": statistics.median(times) * 1e3, "faults_per_step": faults,
                  "temp_mib": temp}))
"""


def child(code: str, *args: str, xla_flags: str = "") -> dict:
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=xla_flags)
  out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, check=True,
                       capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
  print(f"commit {commit}")
  print("output layer + loss, forward and backward, ms:", child(OUTPUT_LAYER))
  for mode, flags in (("default", ""), ("keep", ""),
                      ("default", "--xla_cpu_experimental_ynn_fusion_type=-dot"),
                      ("default", "--xla_cpu_experimental_xnn_graph_fusion_mode="
                                  "XNN_GRAPH_FUSION_MODE_GREEDY")):
    print(f"quick step, allocator {mode}, XLA_FLAGS={flags or '(none)'}:",
          child(STEP, mode, xla_flags=flags), flush=True)


if __name__ == "__main__":
  main()
