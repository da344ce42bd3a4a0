"""Seconds per training step of the Transformer on one CPU thread (as each
`--workers` process runs), on real batches of the quick data.

    python results/transformer_cpu/step_time.py D_MODEL HEADS D_FF LAYERS SCORE D_K SEEDS
    python results/transformer_cpu/step_time.py 128 4 512 2 scaled_dot 1024 2

Builds the trainer of the quick preset with those sizes, takes one step to
compile, then times 40 steps; prints parameters, ms/step and target tokens/s.
"""
import os
import sys
import time
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from attention_jax import models
from attention_jax.training import steps, config as C, train_lib
from attention_jax.data import input_pipeline
data = input_pipeline.load("bible_en_es", vocab_size=2000)
d_model, heads, ff, layers, score, dk, seeds = [x for x in sys.argv[1:8]]
cfg = C.from_preset("quick", model="transformer", hidden_dim=int(d_model), num_heads=int(heads),
     ff_dim=int(ff), encoder_layers=int(layers), decoder_layers=int(layers), arms=(score,), dims=(int(dk),),
     seeds=int(seeds), label_smoothing=0.1, warmup_steps=400)
arm = C.Arm.of(score, int(dk))
tr = train_lib.EnsembleTrainer(cfg, arm, data, tuple(range(int(seeds))))
it = tr._train_batches(0)
b = next(it); tr.train_step(b, 0)
t0=time.time(); tok=0
for i in range(1, 41):
  b = next(it); tr.train_step(b, i); tok += int((b.tgt != 0).sum())*int(seeds)
dt=time.time()-t0
print(f"d={d_model} h={heads} ff={ff} L={layers} {score} dk={dk} E={seeds}: params {tr.num_params:,} {dt/40*1000:.0f} ms/step {tok/dt:,.0f} tgt tok/s", flush=True)
