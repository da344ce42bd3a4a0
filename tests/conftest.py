"""Shared pytest set-up: a modest hypothesis profile for the 2-core CI budget.

Every hypothesis example with a new shape compiles new XLA programs, so the
default profile keeps example counts small and turns the per-example deadline
off (first-call compilation times are noisy). `HYPOTHESIS_PROFILE=thorough`
runs more examples locally.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=15, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "thorough", max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import jax
import numpy as np
import pytest


@pytest.fixture
def raises_at_trace():
  """Asserts that `fn(*args)` fails while being *traced*, with a named message.

  The arguments are replaced by `jax.ShapeDtypeStruct`s and the call goes
  through `jax.eval_shape`, which traces but never compiles or runs: an error
  seen here cannot be an XLA runtime error. Every fragment (argument names,
  shapes) must appear in the message.
  """

  def check(fn, args, exc_type, *fragments):
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    with pytest.raises(exc_type) as info:
      jax.eval_shape(fn, *specs)
    message = str(info.value)
    for fragment in fragments:
      assert fragment in message, f"{fragment!r} not in {message!r}"
    return message

  return check
