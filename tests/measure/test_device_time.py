"""Device-side time from the profiler's trace (`measure.device_time`)."""

import dataclasses
import statistics

import pytest

from attention_jax.measure import device_time


@dataclasses.dataclass
class _Event:
  name: str
  start_ns: float
  duration_ns: float


@dataclasses.dataclass
class _Line:
  name: str
  events: list


@dataclasses.dataclass
class _Plane:
  name: str
  lines: list


def _annotations(*windows):
  return [_Event(f"{device_time.ANNOTATION}:{i}", a, b - a) for i, (a, b) in enumerate(windows)]


def test_each_repeat_spans_its_device_events_and_counts_overlaps_once():
  host = _Plane("/host:CPU", [_Line("python", _annotations((0, 1000), (2000, 3000)))])
  gpu = _Plane("/device:GPU:0", [
      _Line("Stream #1", [_Event("k1", 100, 200), _Event("k2", 400, 100),  # repeat 0
                          _Event("k3", 2100, 300), _Event("idle", 2500, 0),  # repeat 1
                          _Event("late", 5000, 10)]),  # in no repeat's window
      _Line("Stream #2", [_Event("k4", 2200, 400)])])  # overlaps k3 on another stream
  times = device_time.read_times([host, gpu], 2)
  assert times.source == "device planes"
  # Repeat 0: 100 .. 500 ns, busy 200 + 100; repeat 1: 2100 .. 2600, busy 2100 .. 2600.
  assert times.spans_s == pytest.approx((400e-9, 500e-9))
  assert times.busy_s == pytest.approx((300e-9, 500e-9))


def test_a_cpu_has_no_device_plane_and_its_xla_threads_stand_for_it():
  host = _Plane("/host:CPU", [
      _Line("python", _annotations((0, 1000)) + [_Event("PjitFunction(f)", 10, 900)]),
      _Line("tf_XLAPjRtCpuClient/1", [_Event("fusion", 300, 200)])])
  times = device_time.read_times([host], 1)
  assert times.source == "host XLA threads"
  assert times.spans_s == pytest.approx((200e-9,))  # the python thread's call is dispatch


@pytest.mark.parametrize("windows, repeats, match", [
    (((0, 10),), 2, r"annotations of repeats \[0\], not of all 2"),
    (((0, 10), (20, 30)), 2, r"repeat 1 has no event on the device planes")])
def test_a_trace_that_cannot_say_is_refused_not_read_as_zero(windows, repeats, match):
  host = _Plane("/host:CPU", [_Line("python", _annotations(*windows))])
  gpu = _Plane("/device:GPU:0", [_Line("Stream #1", [_Event("k", 2, 5)])])
  with pytest.raises(ValueError, match=match):
    device_time.read_times([host, gpu], repeats)


def test_union_of_intervals():
  assert device_time.union_seconds([(0, 10), (5, 15), (20, 30), (22, 25)]) == pytest.approx(25e-9)
  assert device_time.union_seconds([]) == 0


def test_a_bigger_program_takes_longer_on_this_cpu_and_never_longer_than_its_call():
  import time  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  f = jax.jit(lambda a: jnp.tanh(a @ a))
  medians = {}
  for n in (64, 768):
    a = jnp.ones((n, n), jnp.float32)
    call = lambda a=a: jax.block_until_ready(f(a))
    start = time.perf_counter()
    times = device_time.device_seconds(call, 5)
    whole = time.perf_counter() - start
    assert times.source == "host XLA threads" and len(times.spans_s) == 5
    assert all(0 < busy <= span * (1 + 1e-9) for busy, span in zip(times.busy_s, times.spans_s))
    assert sum(times.spans_s) < whole
    medians[n] = statistics.median(times.spans_s)
  # 768^3 against 64^3 multiply-adds: 1,728 times the work.
  assert medians[768] > 10 * medians[64]


def test_repeats_must_be_positive():
  with pytest.raises(ValueError, match="`repeats` must be >= 1, got 0"):
    device_time.device_seconds(lambda: None, 0)
