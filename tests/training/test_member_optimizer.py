"""Members with their own learning rate (`run_config.OptimizerConfig.make`
with member fields): the learning rate is data in the stacked optimiser
state, and each member's updates are those of optax's Adam at its rate."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attention_jax.training import run_config

LEARNING_RATES = (1e-3, 3e-4, 0.05)
SCHEDULES = [("constant", 0), ("constant", 3), ("cosine", 0), ("cosine", 3)]


def _optimizer(schedule="constant", warmup=0, **kw):
  return run_config.OptimizerConfig(**{
      "steps": 10, "learning_rate": 1e-3, "adam_b2": 0.99, "schedule": schedule,
      "warmup_steps": warmup, "clip_norm": 1.0, "label_smoothing": 0.0, **kw})


def _gradient(params, k):
  # Large enough that clipping acts (clip_norm 1), different at every step.
  return jax.tree.map(lambda w: 3.0 * jnp.sin(w * (k + 1)), params)


@pytest.mark.parametrize("schedule,warmup", SCHEDULES)
def test_each_members_updates_are_adam_at_its_own_learning_rate(schedule, warmup):
  opt = _optimizer(schedule, warmup)
  start = {"w": jax.random.normal(jax.random.key(0), (len(LEARNING_RATES), 4, 3)),
           "b": jax.random.normal(jax.random.key(1), (len(LEARNING_RATES), 3))}
  tx = opt.make(("learning_rate",))
  state = run_config.with_member_values(jax.vmap(tx.init)(start),
                                        {"learning_rate": LEARNING_RATES})
  update = jax.jit(jax.vmap(tx.update))
  params = start
  for k in range(8):  # past the warm-up, into the cosine decay
    updates, state = update(_gradient(params, k), state, params)
    params = optax.apply_updates(params, updates)
  for e, lr in enumerate(LEARNING_RATES):
    # The separate run at `lr`: optax's own chain, with the rate as a constant.
    alone = optax.chain(optax.clip_by_global_norm(1.0),
                        optax.adam(dataclasses.replace(opt, learning_rate=lr)
                                   .learning_rate_schedule(), b2=0.99))
    mine = jax.tree.map(lambda x, e=e: x[e], start)
    alone_state = alone.init(mine)
    step = jax.jit(alone.update)
    for k in range(8):
      updates, alone_state = step(_gradient(mine, k), alone_state, mine)
      mine = optax.apply_updates(mine, updates)
    for key in mine:  # float32 rounding: one program over members against one alone
      np.testing.assert_allclose(params[key][e], mine[key], rtol=1e-6, atol=1e-7)
  # The members really moved apart, by their rates.
  assert not np.allclose(params["w"][0], params["w"][1], atol=1e-5)
  held = run_config.member_values(state, ("learning_rate",))["learning_rate"]
  np.testing.assert_array_equal(held, np.asarray(LEARNING_RATES, np.float32))


@pytest.mark.parametrize("schedule,warmup", SCHEDULES)
def test_a_schedule_of_a_traced_peak_is_the_schedule_of_that_constant(schedule, warmup):
  # Bit for bit: every value a member's optimiser sees is the separate run's.
  for lr in LEARNING_RATES:
    opt = _optimizer(schedule, warmup, learning_rate=lr)
    constant = jax.jit(lambda count, opt=opt: jnp.float32(opt.learning_rate_schedule()(count)))
    traced = jax.jit(lambda count, peak, opt=opt: opt.learning_rate_schedule(peak)(count))
    for count in range(12):
      assert (np.float32(constant(count)) ==
              np.float32(traced(count, jnp.float32(lr)))), (lr, count)


def test_without_member_fields_the_optimiser_is_the_plain_chain():
  # Runs without --members keep their optimiser state (and checkpoints) as they were.
  opt = _optimizer("cosine", 3)
  params = {"w": jnp.ones((4, 3))}
  plain = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adam(opt.learning_rate_schedule(), b2=0.99))
  assert (jax.tree.structure(opt.make().init(params))
          == jax.tree.structure(plain.init(params)))
  assert "hyperparams" not in str(jax.tree.structure(opt.make().init(params)))


def test_a_field_that_cannot_differ_between_members_is_refused():
  with pytest.raises(ValueError, match="`member_fields` \\['warmup_steps'\\]"):
    _optimizer().make(("warmup_steps",))
  tx = _optimizer().make(("learning_rate",))
  state = jax.vmap(tx.init)({"w": jnp.ones((2, 3))})
  with pytest.raises(ValueError, match="`learning_rate` has \\(3,\\) member values"):
    run_config.with_member_values(state, {"learning_rate": (1e-3, 2e-3, 3e-3)})


def test_members_are_every_seed_at_every_value_values_outer():
  axes = (("learning_rate", (1e-3, 3e-3)),)
  members = run_config.members((0, 1), axes)
  assert [m.keys for m in members] == [
      {"seed": 0, "learning_rate": 1e-3}, {"seed": 1, "learning_rate": 1e-3},
      {"seed": 0, "learning_rate": 3e-3}, {"seed": 1, "learning_rate": 3e-3}]
  assert members[3].label == "seed 1, learning_rate=0.003"
  assert [m.keys for m in run_config.members((0, 1))] == [{"seed": 0}, {"seed": 1}]
