"""XLA's memory analysis of a compiled Transformer search at d_k 1024 (4 heads,
d_model 128, 2 + 2 layers, vocabulary 2000), with and without the model's
beam hooks (`plain`: every leaf of the memory and carry repeated per beam).

    python results/transformer_cpu/decode_memory.py B S K new|plain [run]

B sentences of S source tokens, beam K (1 = greedy); `run` also decodes
(a source of one repeated token never emits <eos>: the full length) and
prints the seconds; run it under `/usr/bin/time -v` for the peak RSS.
"""
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx
from attention_jax import models, decoding
B, S, K, plain = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "plain"
cfg = models.TransformerConfig(vocab_size=2000, num_layers=2, d_model=128, num_heads=4, d_ff=512, score="dot", attention_dim=1024, max_length=400, dropout=0.1)
m = models.Transformer(cfg, rngs=nnx.Rngs(0))
class Plain:
  def __init__(self, m): self.m = m; self.config = m.config; self.max_decode_length = m.max_decode_length
  def init_decode(self, *a): return self.m.init_decode(*a)
  def decode_step(self, *a): return self.m.decode_step(*a)
g, st = nnx.split(m)
def f(st, src):
  mm = nnx.merge(g, st)
  mm = Plain(mm) if plain else mm
  return decoding.beam_search(mm, src, beam_size=K) if K > 1 else decoding.greedy(mm, src)
src = jnp.ones((B, S), jnp.int32) * 5
t=time.time(); c = jax.jit(f).lower(st, src).compile(); ct=time.time()-t
ma = c.memory_analysis()
print(f"B={B} S={S} K={K} plain={plain}: temp {ma.temp_size_in_bytes/2**20:.0f} MiB arg {ma.argument_size_in_bytes/2**20:.0f} out {ma.output_size_in_bytes/2**20:.0f} alias {ma.alias_size_in_bytes/2**20:.0f} compile {ct:.1f}s", flush=True)
if len(sys.argv) > 5:
  t=time.time(); jax.block_until_ready(c(st, src)); print("run", time.time()-t)
