"""FLOPs counted from a jaxpr (attention_jax/measure/flops.py): matrix products, loops
times their trip counts, gradients, and agreement with XLA where XLA can count."""

import jax
import jax.numpy as jnp
import pytest

from attention_jax.measure import flops


def _recurrence(w, xs):
  def body(h, x):
    h = jnp.tanh(h @ w + x)
    return h, h
  return jax.lax.scan(body, jnp.zeros((xs.shape[1], w.shape[0])), xs)[1].sum()


def test_a_matrix_product_is_two_flops_per_multiply_add_and_xla_agrees():
  x, w = jnp.ones((64, 128)), jnp.ones((128, 384))
  n = flops.count(jnp.matmul, x, w)
  assert n.matmul == 2 * 64 * 128 * 384 and n.other == 0 and n.while_loops == 0
  xla = jax.jit(jnp.matmul).lower(x, w).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] == n.matmul


def test_batched_and_multi_contraction_products():
  a, b = jnp.ones((2, 3, 4, 5)), jnp.ones((2, 4, 5, 6))
  n = flops.count(lambda a, b: jnp.einsum("bikl,bklj->bij", a, b), a, b)
  assert n.matmul == 2 * (2 * 3 * 6) * (4 * 5)


def test_a_scan_counts_its_body_times_its_length_and_the_gradient_three_times():
  w, xs = jnp.ones((16, 16)), jnp.ones((10, 4, 16))
  once = 2 * 4 * 16 * 16
  assert flops.count(_recurrence, w, xs).matmul == 10 * once
  assert flops.count(_recurrence, w, xs, loops=False).matmul == once
  # backward: dh and dw per step, two products
  assert flops.count(jax.grad(_recurrence), w, xs).matmul == 3 * 10 * once
  # elementwise work is counted too, per element (add and tanh of [4, 16] per step)
  assert flops.count(_recurrence, w, xs).other >= 10 * 2 * 4 * 16


def test_loops_false_is_what_xla_reports_for_a_loop():
  w, xs = jnp.ones((16, 16)), jnp.ones((10, 4, 16))
  xla = jax.jit(_recurrence).lower(w, xs).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  once = flops.count(_recurrence, w, xs, loops=False)
  assert once.matmul <= xla["flops"] <= once.total * 1.5
  assert xla["flops"] < flops.count(_recurrence, w, xs).matmul / 5


def test_jit_and_checkpoint_bodies_are_counted_where_they_run():
  x, w = jnp.ones((8, 8)), jnp.ones((8, 8))
  f = jax.checkpoint(lambda x: jnp.sum(jnp.sin(x @ w)))
  plain = flops.count(jax.grad(lambda x: jnp.sum(jnp.sin(x @ w))), x).matmul
  remat = flops.count(jax.grad(f), x).matmul
  assert flops.count(jax.jit(lambda x: x @ w), x).matmul == 2 * 8 ** 3
  assert remat == plain + 2 * 8 ** 3  # the forward product again in the backward pass


def test_a_while_loop_is_counted_once_and_said():
  def f(x):
    return jax.lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] @ c[0], c[1] + 1),
                              (x, 0))[0]
  n = flops.count(f, jnp.ones((4, 4)))
  assert n.while_loops == 1 and n.matmul == 2 * 4 ** 3


def test_cond_takes_its_most_expensive_branch():
  def f(p, x):
    return jax.lax.cond(p, lambda x: x @ x @ x, lambda x: x, x)
  assert flops.count(f, True, jnp.ones((4, 4))).matmul == pytest.approx(2 * 2 * 4 ** 3)


def test_work_whose_result_is_unused_is_counted_and_xla_drops_it():
  def f(x, w):
    del_me = x @ w  # pylint: disable=unused-variable
    return jnp.sum(x @ x)
  x = jnp.ones((8, 8))
  assert flops.count(f, x, x).matmul == 2 * 2 * 8 ** 3
  xla = jax.jit(f).lower(x, x).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] < 1.5 * 2 * 8 ** 3  # one product and the sum
