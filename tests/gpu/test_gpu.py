"""GPU checks, run by `scripts/gpu_run.sh check` (`pytest -m gpu tests/gpu`).

Skipped wherever JAX sees no GPU, so the CPU suite stays green. What they
establish on an NVIDIA GPU:
- `attention(..., implementation="cudnn")` and `"auto"` equal the plain path
  (scores + float32 softmax) forward and backward: unmasked, causal and
  padding masks, including the broadcast mask shapes `[B, 1, 1, Tk]` of
  jax-ml/jax#28974, in bfloat16 and float16, head sizes 64 and 128;
- `auto` really lowers to the cuDNN fused kernel where it says it does;
- one bfloat16 training step of each model family is finite and close to the
  float32 step from the same initialisation;
- the vmapped seed ensemble equals separate runs on the GPU.

Shapes: q, k, v `[B, H, T, D]`; masks broadcastable to `[B, H, Tq, Tk]`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import masks
import attention_jax as aj
from attention_jax.data import input_pipeline
from attention_jax.sweep import config
from attention_jax.training import train_lib

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU"),
]

B, H, T = 2, 4, 256
# Half-precision outputs against the float32-softmax plain path: the two
# kernels round differently (bf16 has 8 mantissa bits: 2^-8 = 0.004 relative).
ATOL = {jnp.bfloat16: 3e-2, jnp.float16: 5e-3}


def _qkv(dtype, d, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(k, (B, H, T, d), jnp.float32).astype(dtype) for k in keys]


def _masks():
  lengths = jnp.array([T, T // 3])
  valid = jnp.arange(T)[None, :] < lengths[:, None]                # [B, Tk]
  return {
      "none": None,
      "causal": masks.causal(T),                                    # [T, T]
      "padding_b11k": valid[:, None, None, :],                      # [B, 1, 1, Tk] (#28974)
      "padding_bhqk": jnp.broadcast_to(valid[:, None, None, :], (B, H, T, T)),
  }


def _run(implementation, q, k, v, mask):
  def loss(q, k, v):
    out = aj.attention(q, k, v, score="scaled_dot", mask=mask, implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) ** 2), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@pytest.mark.parametrize("mask_name", list(_masks()))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("implementation", ["cudnn", "auto"])
def test_fused_paths_equal_plain(implementation, dtype, d, mask_name):
  q, k, v = _qkv(dtype, d)
  mask = _masks()[mask_name]
  out, grads = _run(implementation, q, k, v, mask)
  want, want_grads = _run("plain", q, k, v, mask)
  assert out.dtype == dtype
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                             atol=ATOL[dtype])
  for name, g, w in zip("qkv", grads, want_grads):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.all(np.isfinite(g)), name
    # gradients scale with the loss (a sum over B·H·T·D outputs): compare relative to their size
    np.testing.assert_allclose(g, w, atol=ATOL[dtype] * np.abs(w).max(), err_msg=name)


@pytest.mark.parametrize("structure", ["causal", "key_lengths", "both"])
@pytest.mark.parametrize("implementation", ["cudnn", "auto"])
def test_causal_and_lengths_reach_cudnn_and_equal_the_dense_mask(implementation, structure):
  q, k, v = _qkv(jnp.bfloat16, 128)
  causal = structure in ("causal", "both")
  k_len = jnp.array([T, T // 3], jnp.int32) if structure != "causal" else None
  dense = aj.attention.__globals__["structured_mask"](T, T, causal=causal, key_lengths=k_len)

  def loss(q, k, v, **kw):
    out = aj.attention(q, k, v, score="scaled_dot", **kw)
    return jnp.sum(out.astype(jnp.float32) ** 2), out

  grad = lambda **kw: jax.jit(jax.value_and_grad(
      lambda q, k, v: loss(q, k, v, **kw), argnums=(0, 1, 2), has_aux=True))
  (_, out), grads = grad(causal=causal, key_lengths=k_len, implementation=implementation)(q, k, v)
  (_, want), want_grads = grad(mask=dense, implementation="plain")(q, k, v)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                             atol=ATOL[jnp.bfloat16])
  for g, w in zip(grads, want_grads):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    np.testing.assert_allclose(g, w, atol=ATOL[jnp.bfloat16] * np.abs(w).max())
  fn = jax.jit(lambda q, k, v: aj.attention(q, k, v, causal=causal, key_lengths=k_len,
                                            implementation=implementation))
  hlo = fn.lower(q, k, v).compile().as_text().lower()
  assert "cudnn" in hlo and "fmha" in hlo  # the fused kernel, no dense bias


@pytest.mark.parametrize("d", [64, 128])
def test_auto_lowers_to_cudnn_flash_attention_without_mask(d):
  q, k, v = _qkv(jnp.bfloat16, d)
  fn = jax.jit(lambda q, k, v: aj.attention(q, k, v, implementation="auto"))
  hlo = fn.lower(q, k, v).compile().as_text()
  assert "cudnn" in hlo.lower() and "fmha" in hlo.lower()


def _one_step(model, arm, dim, dtype, seeds=(0,), steps=1, precision=None):
  cfg = config.from_preset("smoke", model=model, arms=(arm,), dims=(dim,), dtype=dtype,
                           dropout=0.0)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  with jax.default_matmul_precision(precision or "default"):
    trainer = train_lib.EnsembleTrainer(cfg.point(config.Arm.of(arm, dim)), data, seeds)
    batches, losses = trainer.train_batches(0), []
    for _ in range(steps):
      trainer.state = trainer.step(trainer.state, next(batches))
      losses.append(trainer.state.loss)
  return trainer, np.stack(losses)


@pytest.mark.parametrize("model,arm", [("rnn", "additive"), ("rnn", "multiplicative"),
                                       ("transformer", "scaled_dot")])
def test_bfloat16_training_step_is_finite_and_close_to_float32(model, arm):
  t16, l16 = _one_step(model, arm, 32, "bfloat16", steps=3)
  t32, l32 = _one_step(model, arm, 32, "float32", steps=3)
  assert np.all(np.isfinite(l16))
  for leaf in jax.tree.leaves(t16.params):
    assert leaf.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(leaf)))
  # the first loss is computed from identical parameters: only bf16 rounding differs
  np.testing.assert_allclose(l16[0], l32[0], rtol=2e-2)
  np.testing.assert_allclose(l16, l32, rtol=5e-2)


def test_vmapped_ensemble_equals_separate_runs_on_gpu():
  # "highest": float32 matmuls without TF32, so batching cannot change the rounding.
  joint, joint_losses = _one_step("rnn", "additive", 8, "float32", seeds=(0, 1), steps=3,
                                  precision="highest")
  alone, losses = _one_step("rnn", "additive", 8, "float32", seeds=(1,), steps=3,
                            precision="highest")
  np.testing.assert_allclose(joint_losses[:, 1], losses[:, 0], rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(joint.params), jax.tree.leaves(alone.params)):
    np.testing.assert_allclose(np.asarray(a)[1], np.asarray(b)[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_pallas_additive_kernels_compiled_for_the_gpu_equal_the_plain_form(masked):
  # The kernels as the GPU runs them (Triton, not interpret mode), at sizes
  # that are no multiple of the default blocks (T 300, a 200, dv 48 padded to
  # 64), with a causal mask and a sentence without keys when masked.
  from attention_jax import pallas_additive as pa  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  b, t, d, a, dv = 2, 300, 64, 200, 48
  shapes = [(b, t, d), (b, t, d), (b, t, dv), (d, a), (d, a), (a,)]
  scales = [1.0, 1.0, 1.0, d ** -0.5, d ** -0.5, a ** -0.5]
  args = [jnp.asarray(s * rng.standard_normal(shape), jnp.float32)
          for shape, s in zip(shapes, scales)]
  cot = jnp.asarray(rng.standard_normal((b, t, dv)), jnp.float32)
  kw = dict(causal=True, key_lengths=jnp.array([t, 0])) if masked else {}

  def run(implementation):
    def loss(q, k, values, w_q, w_k, v):
      out = aj.attention(q, k, values, score="additive", params=dict(w_q=w_q, w_k=w_k, v=v),
                         implementation=implementation, **kw)
      return jnp.sum(out * cot), out
    with jax.default_matmul_precision("highest"):
      (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6)),
                                                   has_aux=True))(*args)
    return out, grads

  assert pa.default_blocks("gpu") is not None
  out, grads = run("pallas")
  ref_out, ref_grads = run("plain")
  np.testing.assert_allclose(out, ref_out, atol=1e-4, rtol=1e-4)
  for name, g, w in zip(("query", "keys", "values", "w_q", "w_k", "v"), grads, ref_grads):
    scale = float(jnp.max(jnp.abs(w))) + 1e-6
    np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(w) / scale, atol=1e-4,
                               err_msg=name)
  if masked:
    assert np.all(np.asarray(out[1]) == 0)  # the sentence without keys: zero context


def test_multi_head_additive_takes_the_pallas_kernels_where_the_plain_path_would_chunk():
  # B 2, H 4, T = S = 512, d_k 64: the [B, H, T, S, d_k] tanh block (268 M
  # elements) is over the chunking threshold, so `pallas_additive.wins` takes
  # the kernels; the layer's output and gradients equal its plain path.
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from attention_jax import pallas_additive as pa  # pylint: disable=import-outside-toplevel
  from attention_jax.layers import MultiHeadAttention  # pylint: disable=import-outside-toplevel
  b, t, d, h = 2, 512, 256, 4
  assert pa.wins(b * h, t, t, d // h, "gpu")
  x = jax.random.normal(jax.random.PRNGKey(0), (b, t, d))
  graphdef, params = nnx.split(MultiHeadAttention(h, d, score="additive", rngs=nnx.Rngs(0)))

  def run(take_kernel):
    def loss(params, x):
      out, _ = nnx.merge(graphdef, params)(x, mask=masks.causal(t))
      return jnp.sum(jnp.sin(out)), out
    with jax.default_matmul_precision("highest"):
      fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
      if take_kernel:
        return fn(params, x)
      original = pa.wins
      pa.wins = lambda *a: False
      try:
        return fn(params, x)
      finally:
        pa.wins = original

  (_, out), grads = run(True)
  (_, ref_out), ref_grads = run(False)
  np.testing.assert_allclose(out, ref_out, atol=1e-4, rtol=1e-4)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    scale = float(jnp.max(jnp.abs(w))) + 1e-6
    np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(w) / scale, atol=1e-4)
