"""Shared pytest set-up: a modest hypothesis profile for the 2-core CI budget.

Every hypothesis example with a new shape compiles new XLA programs, so the
default profile keeps example counts small and turns the per-example deadline
off (first-call compilation times are noisy). `HYPOTHESIS_PROFILE=thorough`
runs more examples locally.
"""

import os

# XLA:CPU spends most of a test's time compiling (small models, a few steps):
# with LLVM at -O0 those programs compile in about 40% less CPU time (the
# decoding tests: 180 s -> 102 s of CPU), the same HLO programs in slower
# machine code, whose results can differ from -O2's only in float rounding
# (no fast-math either way; -O2 may fuse a multiply-add). Set before any
# backend starts, so the test processes and the drivers they launch (which
# inherit the environment) use it; a level already in XLA_FLAGS wins.
#
# Not used: a JAX persistent compilation cache shared by the run's processes
# (the xdist workers and the drivers the tests start). Backend compiling is
# about half of the test time, but nearly every program is compiled once per
# run already: on the idle 2-core Xeon (2026-11-28, c042495, the README's test
# command, 2 runs each in turn) the suite took 314 s with an empty shared
# cache against 310 s without it.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()


def xla_flags_with(extra: str) -> str:
  """This process's XLA_FLAGS (the level above included) plus `extra`: for a
  driver a test starts with flags of its own, to be compared with one that
  inherits them. Replacing them instead drops the level, and another level
  alone moves the last digits (a loss of 2.9656892 against 2.9656894)."""
  return f"{os.environ.get('XLA_FLAGS', '')} {extra}".strip()

import pytest
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

import experiments  # noqa: E402

experiments.add_study_presets()  # the studies' presets, as every driver has them
# The drivers' refused-command fixture, for the tests of every study's folder.
from tests.drivers import run_refusals  # noqa: E402,F401  pylint: disable=unused-import


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


_SLOW_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tests.txt")


def _listed_slow_tests() -> set[str]:
  """Node ids in tests/slow_tests.txt (its header says how they were chosen)."""
  with open(_SLOW_LIST, encoding="utf-8") as f:
    return {line.rstrip("\n").split("\t", 1)[1] for line in f
            if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config, items):
  listed = _listed_slow_tests()
  for item in items:
    if item.nodeid in listed:
      item.add_marker(pytest.mark.slow)
  if any("::" in arg for arg in config.args):
    return  # only some tests of a file collected: nothing to check against
  collected = {item.nodeid for item in items}
  files = {nodeid.split("::", 1)[0] for nodeid in collected}
  stale = sorted(n for n in listed if n.split("::", 1)[0] in files and n not in collected)
  if stale:
    raise pytest.UsageError(
        f"tests/slow_tests.txt names {len(stale)} test(s) that no longer exist, "
        f"e.g. {stale[0]!r}: rename or remove the entry")
