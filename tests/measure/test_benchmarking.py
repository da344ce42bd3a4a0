"""Tests for attention_jax/measure/benchmarking.py: FLOP counting, timing, memory, reference, refusal."""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax.measure import benchmarking as bm
from attention_jax import masks, registry, scores


def test_flops_match_hand_computed_values():
  # 4·B·H·Tq·Tk·D = 4·2·3·5·7·11.
  assert bm.attention_flops(2, 3, 5, 7, 11) == 9240
  assert bm.attention_flops(2, 3, 5, 7, 11, causal=True) == 4620
  assert bm.attention_flops(2, 3, 5, 7, 11, backward=True) == 32340  # × 3.5
  assert bm.attention_flops(2, 3, 5, 7, 11, causal=True, backward=True) == 16170
  # The CPU target shape: B = H = 8, T = 512, D = 64 -> 2^32 forward FLOPs.
  assert bm.attention_flops(8, 8, 512, 512, 64) == 2 ** 32
  assert bm.attention_flops(8, 8, 512, 512, 64, backward=True) == 3.5 * 2 ** 32


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_flops_reject_non_positive_ints(bad):
  with pytest.raises((ValueError, TypeError), match="`heads`"):
    bm.attention_flops(1, bad, 4, 4, 4)


def test_peak_table():
  assert bm.dense_peak_tflops("NVIDIA H100 80GB HBM3", jnp.bfloat16) == 989.0
  assert bm.dense_peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
  assert bm.dense_peak_tflops("NVIDIA H200", "float16") == 989.0
  assert bm.dense_peak_tflops("NVIDIA A100-SXM4-80GB", "bfloat16") == 312.0
  assert bm.dense_peak_tflops("TPU v4", "bfloat16") == 275.0
  assert bm.dense_peak_tflops("cpu", "float32") is None
  assert bm.dense_peak_tflops("TPU v4", "float32") is None


def test_timing_statistics():
  t = bm.Timing.from_times([0.5, 0.1, 0.3, 0.2, 0.4])
  assert (t.median_s, t.min_s, t.max_s, t.repeats) == (0.3, 0.1, 0.5, 5)
  assert t.iqr_s == pytest.approx(0.2)  # 0.4 - 0.2
  assert t.times_s == (0.1, 0.2, 0.3, 0.4, 0.5)
  with pytest.raises(ValueError, match="`times`"):
    bm.Timing.from_times([])


def test_time_interleaved_waits_for_the_device():
  # An asynchronous dispatch returns before the result exists; block_until_ready
  # makes the measured time cover the work: a bigger matmul must take longer.
  small, big = jnp.ones((64, 64)), jnp.ones((768, 768))
  f = jax.jit(lambda x: x @ x @ x @ x)
  small_c, big_c = f.lower(small).compile(), f.lower(big).compile()
  timings = bm.time_interleaved({"small": lambda: small_c(small), "big": lambda: big_c(big)},
                                warmup=1, repeats=5)
  assert timings["big"].median_s > 5 * timings["small"].median_s


def test_time_interleaved_alternates_and_rotates():
  order = []
  calls = {name: (lambda name=name: order.append(name) or jnp.zeros(1)) for name in "abc"}
  timings = bm.time_interleaved(calls, warmup=1, repeats=3)
  assert order[:3] == ["a", "b", "c"]  # one warm-up call each
  assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # rounds, rotated
  assert {n: t.repeats for n, t in timings.items()} == {"a": 3, "b": 3, "c": 3}
  slow = bm.time_interleaved({"slow": lambda: time.sleep(0.003), "fast": lambda: None},
                             warmup=0, repeats=3)
  # median, not max, for the no-op: one preemption on a loaded 2-core machine
  # can stretch a single call past 3 ms.
  assert slow["slow"].min_s >= 0.003 > slow["fast"].median_s
  with pytest.raises(ValueError, match="`calls`"):
    bm.time_interleaved({}, repeats=2)


def test_time_steps_keeps_the_steps_after_the_warmup_each_waited_for():
  calls = []

  def step(i):
    calls.append(i)
    if i == 1:  # a warm-up step: ran and waited for, not kept
      time.sleep(0.3)
    if i == 3:
      time.sleep(0.01)
    return jnp.zeros(1)

  times = bm.time_steps(step, 3, warmup=2)
  assert calls == [0, 1, 2, 3, 4]  # the caller's index: warm-up first, one call each
  assert len(times.wall_s) == len(times.cpu_s) == 3
  assert times.wall_s[1] >= 0.01 and max(times.wall_s) < 0.3  # steps 2, 3, 4 only
  assert times.total_s == pytest.approx(sum(times.wall_s))
  assert times.median_s == sorted(times.wall_s)[1]
  # sleeping is wall time, not this process's CPU time
  assert times.cpu_s[1] < times.wall_s[1]
  # the result is waited for: a big matmul's step takes longer than a small one's
  f = jax.jit(lambda x: x @ x @ x @ x)
  small, big = jnp.ones((64, 64)), jnp.ones((768, 768))
  small_c, big_c = f.lower(small).compile(), f.lower(big).compile()
  assert (bm.time_steps(lambda _: big_c(big), 5, warmup=1).median_s
          > 5 * bm.time_steps(lambda _: small_c(small), 5, warmup=1).median_s)
  with pytest.raises(ValueError, match="`steps`"):
    bm.time_steps(step, 0)
  with pytest.raises(ValueError, match="`warmup`"):
    bm.time_steps(step, 1, warmup=-1)


def test_other_cpu_load_excludes_this_process():
  before = bm.cpu_snapshot()
  end = time.perf_counter() + 0.3
  while time.perf_counter() < end:  # keep this process (one core) busy
    pass
  load = bm.other_cpu_load(before, bm.cpu_snapshot())
  assert load is not None and load >= 0
  # On a shared machine (pytest -n 2 runs another worker beside this one) the
  # loop may get much less than a core, so only the physical bound holds for
  # real snapshots (+0.1 for clock-tick granularity); the exclusion of this
  # process's own time is checked exactly on the synthetic snapshots below.
  assert load <= bm.machine_description()["cpu_cores"] + 0.1
  # 2 s wall, 4 busy core-seconds on the machine, 2 of them this process's: 1 core.
  assert bm.other_cpu_load(bm.CpuSnapshot(5.0, 10.0, 1.0),
                           bm.CpuSnapshot(7.0, 14.0, 3.0)) == pytest.approx(1.0)
  assert bm.other_cpu_load(bm.CpuSnapshot(5.0, 10.0, 1.0),
                           bm.CpuSnapshot(7.0, 12.0, 3.0)) == 0.0  # only this process
  blank = bm.CpuSnapshot(0.0, None, 0.0)
  assert bm.other_cpu_load(blank, bm.cpu_snapshot()) is None


def test_compile_fn_and_memory_stats():
  x = jnp.ones((32, 16), jnp.float32)
  compiled, seconds = bm.compile_fn(lambda x: jnp.exp(x) @ x.T, x)
  assert seconds > 0
  np.testing.assert_allclose(compiled(x), jnp.exp(x) @ x.T, rtol=1e-6)
  mem = bm.memory_stats(compiled)
  assert mem["argument_bytes"] == 32 * 16 * 4
  assert mem["output_bytes"] == 32 * 32 * 4
  assert isinstance(mem["temp_bytes"], int) and mem["temp_bytes"] >= 0
  # CPUs keep no allocator statistics.
  assert bm.peak_device_memory() is None


def test_memory_analysis_sees_the_naive_additive_tensor():
  # The [B, Tq, Tk, a] tanh block of the naive additive score dominates its temps.
  b, t, a = 2, 32, 64
  args = (jnp.ones((b, t, 8)), jnp.ones((b, t, 8)), jnp.ones((8, a)), jnp.ones((8, a)),
          jnp.ones(a))
  loss = lambda fn: jax.grad(lambda *p: jnp.sum(fn(*p)), argnums=(0, 1))
  naive, _ = bm.compile_fn(loss(scores.additive_naive), *args)
  assert bm.memory_stats(naive)["temp_bytes"] >= b * t * t * a * 4


def _random_qkv(rng, shape):
  return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3))


def test_naive_attention_matches_numpy_and_zeroes_empty_rows():
  rng = np.random.default_rng(0)
  q, k, v = _random_qkv(rng, (2, 5, 4))
  mask = rng.random((2, 5, 5)) < 0.6
  mask[1, 3] = False
  s = np.einsum("bqd,bkd->bqk", q, k) / 2.0  # 1/√4
  s = np.where(mask, s, -np.inf)
  w = np.exp(s - np.max(np.where(mask, s, -1e30), -1, keepdims=True))
  w = np.where(mask, w, 0)
  w = w / np.maximum(w.sum(-1, keepdims=True), 1e-30)
  want = np.einsum("bqk,bkd->bqd", w, v)
  got = bm.naive_attention(q, k, v, jnp.asarray(mask))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got[1, 3]) == 0)


@pytest.mark.parametrize("score", registry.FUNCTION_SCORES)
def test_naive_scores_agree_with_the_library(score):
  rng = np.random.default_rng(1)
  q, k, _ = _random_qkv(rng, (2, 6, 8))
  params = {"w": jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
            "w_q": jnp.asarray(rng.standard_normal((8, 5)), jnp.float32),
            "w_k": jnp.asarray(rng.standard_normal((8, 5)), jnp.float32),
            "v": jnp.asarray(rng.standard_normal(5), jnp.float32), "beta": 3.0}
  np.testing.assert_allclose(bm.naive_scores(score, q, k, params),
                             aj.compute_scores(score, q, k, params), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="`score`"):
    bm.naive_scores("location", q, k)


def test_verify_close_accepts_correct_and_refuses_wrong_kernels():
  rng = np.random.default_rng(2)
  q, k, v = _random_qkv(rng, (2, 3, 16, 8))
  mask = masks.causal(16)
  reference = bm.naive_attention(q, k, v, mask)
  good = aj.attention(q, k, v, mask=mask)
  assert bm.verify_close(good, reference, rtol=bm.default_tolerance("float32")) < 1e-4
  # Deliberately wrong kernels: no 1/√d, no mask, keys and values swapped.
  wrong = {"unscaled": aj.attention(q, k, v, score="dot", mask=mask),
           "unmasked": aj.attention(q, k, v),
           "swapped": aj.attention(q, v, k, mask=mask),
           "nan": good.at[0, 0, 0, 0].set(jnp.nan)}
  for name, out in wrong.items():
    with pytest.raises(bm.KernelMismatchError, match="refusing to time"):
      bm.verify_close(out, reference, rtol=bm.default_tolerance("float32"), name=name)
  with pytest.raises(bm.KernelMismatchError, match="shape"):
    bm.verify_close(good[..., :4], reference, rtol=1e-3)
  with pytest.raises(ValueError, match="structure"):
    bm.verify_close((good, good), (reference,), rtol=1e-3)


def test_tolerances_by_dtype():
  assert bm.default_tolerance(jnp.float32) < bm.default_tolerance(jnp.bfloat16)
  # bfloat16 rounding of O(1) values passes its own tolerance, not float32's.
  x = jnp.linspace(-3, 3, 101)
  rounded = x.astype(jnp.bfloat16).astype(jnp.float32)
  bm.verify_close(rounded, x, rtol=bm.default_tolerance("bfloat16"))
  with pytest.raises(bm.KernelMismatchError):
    bm.verify_close(rounded, x, rtol=1e-4)


def test_machine_description():
  info = bm.machine_description()
  assert info["platform"] == jax.devices()[0].platform
  assert info["cpu_cores"] >= 1 and isinstance(info["cpu"], str) and info["cpu"]
  assert info["jax_version"] == jax.__version__
  assert math.isfinite(info["device_count"])
