"""SIGTERM or Ctrl-C before a run's first step (`interrupts.nothing_to_save`):
the trainer is being built or its programs compiled, there is nothing to
save, and the driver stops at once with one line, even inside XLA's compile,
where Python runs no signal handler."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A program of thousands of operations, whose compile takes minutes; the
# signal comes once it is compiling.
_COMPILING = textwrap.dedent("""\
    import jax, jax.numpy as jnp
    from attention_jax.training import interrupts
    interrupts.install()

    def f(x):
      for i in range(3000):
        x = jnp.sin(x) * (i + 1.0) + jnp.cos(x @ x)
      return x

    with interrupts.nothing_to_save("[toy]"):
      lowered = jax.jit(f).lower(jnp.ones((8, 8)))
      print("compiling", flush=True)
      lowered.compile()
    print("compiled", flush=True)
    """)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_compile_before_the_first_step_stops_at_once_with_one_line(signum):
  p = subprocess.Popen([sys.executable, "-c", _COMPILING], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline() == "compiling\n", p.stderr.read()
    time.sleep(1.0)  # inside XLA's compile by now
    sent = time.time()
    p.send_signal(signum)
    out, err = p.communicate(timeout=60)
  finally:
    p.kill()
  assert time.time() - sent < 10  # not at the end of the compile (minutes)
  assert p.returncode == 128 + signum, err[-3000:]
  assert out.splitlines() == [
      f"[toy] {signal.Signals(signum).name} before its first step: nothing to save, stopped at "
      "once; re-run the same command to continue"]
  assert "Traceback" not in err


@pytest.mark.slow  # end to end (7 s idle); the test above checks the compile's case
def test_sigterm_while_a_run_is_built_stops_the_driver_at_once_with_one_line(tmp_path):
  # 24 members of the smoke model in turn: their first step compiles for a
  # minute or more; the signal comes as the trainer is built.
  workdir = tmp_path / "w"
  command = [sys.executable, "-m", "experiments.train", "--preset=smoke", "--arm=additive",
             "--dim=8", "--seeds=24", "--steps=2", "--checkpoint_every=2", "--eval_every=2",
             f"--workdir={workdir}"]
  p = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  try:
    seen = []
    for line in p.stdout:
      seen.append(line)
      if "parameters" in line:
        break
    assert p.poll() is None, "".join(seen)
    sent = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=600)
  finally:
    p.kill()
  assert time.time() - sent < 15, out  # it waited for the first step: a minute or more
  assert p.returncode == 143 and "Traceback" not in err, err[-3000:]
  assert out.strip().splitlines()[-1] == (
      "[additive d=8] SIGTERM before its first step: nothing to save, stopped at once; re-run "
      "the same command to continue")
  run = workdir / "runs" / "additive_d8"
  assert not (run / "checkpoints").exists() or not os.listdir(run / "checkpoints")
