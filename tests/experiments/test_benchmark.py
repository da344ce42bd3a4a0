"""End-to-end tests of experiments/benchmark.py (subprocesses, tiny sizes)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = ["--suite=kernels,additive", "--seq_lens=16,32", "--head_dims=8", "--heads=2",
                "--batch=1", "--causal=false", "--dtypes=float32", "--modes=fwd_bwd",
                "--repeats=3", "--warmup=1", "--additive_batch=2", "--additive_dim=16",
                "--additive_seq_lens=8,16", "--additive_time_max_len=8"]
TINY_MODELS = ["--suite=models", "--models=transformer", "--model_size=tiny", "--model_batch=2",
               "--model_seq_len=4", "--model_seeds=2", "--model_steps=2", "--repeats=3"]


def _run(args, workdir, script=None):
  """Runs the driver (or `script`, which calls it) in a subprocess."""
  if script is None:
    cmd = [sys.executable, "-m", "experiments.benchmark", f"--workdir={workdir}", *args]
  else:
    cmd = [sys.executable, "-c", textwrap.dedent(script), f"--workdir={workdir}", *args]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _rows(workdir):
  with open(os.path.join(workdir, "benchmark.jsonl")) as f:
    return [json.loads(line) for line in f]


def _has_torch():
  try:
    import torch  # pylint: disable=unused-import
    return True
  except ImportError:
    return False


def test_tiny_sweep_writes_well_formed_output(tmp_path):
  """The kernels and additive suites at toy sizes."""
  impls = "scaled_dot,additive,naive,jax_xla,nnx" + (",torch" if _has_torch() else "")
  proc = _run(TINY + [f"--impls={impls}"], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = _rows(tmp_path)
  kernels = [r for r in rows if r["suite"] == "kernels"]
  assert len(kernels) == len(impls.split(",")) * 2  # impls × lengths
  for r in kernels:
    assert r["status"] == "ok", r
    # Every timed kernel was checked against the reference first.
    assert r["max_abs_err"] <= 5e-3 * 10
    assert r["time_min_s"] <= r["time_median_s"] <= r["time_max_s"]
    assert r["repeats"] == 3 and r["tflops"] > 0
    want = 4 * 1 * 2 * r["seq_len"] ** 2 * 8 * (3.5 if r["mode"] == "fwd_bwd" else 1)
    assert r["flops"] == want
    if r["impl"] != "torch":
      assert r["temp_bytes"] is not None and r["argument_bytes"] > 0
  additive = {(r["impl"], r["seq_len"]): r for r in rows if r["suite"] == "additive"}
  assert set(additive) == {(i, t) for i in ("additive_chunked", "additive_naive") for t in (8, 16)}
  assert additive[("additive_chunked", 8)]["status"] == "ok"
  assert additive[("additive_chunked", 16)]["status"] == "compiled_only"  # > time_max_len
  assert all(r["temp_bytes"] > 0 for r in additive.values())
  files = set(os.listdir(tmp_path))
  for name in ("kernels_fwd_bwd_float32_b1_h2_d8_full.png", "additive_memory.png"):
    assert name in files
    with open(tmp_path / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  table = (tmp_path / "benchmark.md").read_text()
  assert "| impl | mode |" in table and "jax_xla / scaled_dot" in table


@pytest.mark.slow  # ~10 s of XLA compilation for two training programs
def test_models_suite_tiny(tmp_path):
  proc = _run(TINY_MODELS, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| model |" in (tmp_path / "benchmark.md").read_text()
  # tokens/s = B·T·steps·seeds / median time per call.
  models = {r["impl"]: r for r in _rows(tmp_path)}
  assert set(models) == {"1 seed", "2 seeds sequential", "2 seeds vmapped"}
  for r in models.values():
    assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["model"] == "transformer"
  one, vm = models["1 seed"], models["2 seeds vmapped"]
  assert one["tokens_per_s"] == pytest.approx(2 * 4 * 2 / one["time_median_s"])
  assert vm["tokens_per_s"] == pytest.approx(2 * 4 * 2 * 2 / vm["time_median_s"])
  assert vm["speedup_vs_one_seed"] == pytest.approx(vm["tokens_per_s"] / one["tokens_per_s"])
  assert 0 < one["final_loss"] < 20 and 0 < vm["final_loss"] < 20


# Runs the driver with (1) torch hidden and (2) the library's `dot` kernel
# replaced by a deliberately wrong one (unscaled scores under the scaled_dot
# name) whose timing would be recorded if the driver did not check it.
_WRONG_KERNEL = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
from absl import app
from experiments import benchmark
from attention_jax import benchmarking as bm
import attention_jax as aj

timed = []
original_time = bm.time_interleaved
def spy(calls, **kw):
  timed.extend(calls)
  return original_time(calls, **kw)
bm.time_interleaved = spy

original_build = benchmark.build_kernel
def build(impl, case, params, library_implementation):
  if impl == "dot":  # checked against the scaled_dot reference below
    return benchmark.Kernel(lambda q, k, v: aj.attention(q, k, v, score="dot"))
  return original_build(impl, case, params, library_implementation)
benchmark.build_kernel = build
benchmark._score_of = lambda impl: "scaled_dot"

def main(argv):
  benchmark.main(argv)
  print("TIMED", sorted(timed))
app.run(main, argv=sys.argv)
"""


def test_wrong_kernel_is_refused_and_missing_torch_is_skipped(tmp_path):
  proc = _run(["--suite=kernels", "--impls=dot,scaled_dot,torch", "--seq_lens=16", "--head_dims=8",
               "--heads=2", "--batch=1", "--causal=false", "--dtypes=float32", "--modes=fwd",
               "--repeats=3", "--warmup=1"], tmp_path, script=_WRONG_KERNEL)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {r["impl"]: r for r in _rows(tmp_path)}
  assert rows["dot"]["status"] == "refused"
  assert "refusing to time" in rows["dot"]["reason"]
  assert "time_median_s" not in rows["dot"]
  assert rows["scaled_dot"]["status"] == "ok"
  assert rows["torch"]["status"] == "skipped" and "PyTorch is not installed" in rows["torch"]["reason"]
  assert "TIMED ['scaled_dot']" in proc.stdout  # only the correct kernel reached the timer


@pytest.mark.parametrize("flag,needle", [
    ("--impls=scaled_dot,bogus", "impls"),
    ("--seq_lens=128,abc", "seq_lens"),
    ("--causal=maybe", "causal"),
    ("--repeats=0", "repeats"),
])
def test_bad_flags_fail_with_one_line(tmp_path, flag, needle):
  proc = _run([flag], tmp_path / "w")
  assert proc.returncode != 0
  err = [l for l in proc.stderr.strip().splitlines() if l.strip() and "libtpu" not in l]
  assert any(needle in l for l in err), proc.stderr
  assert len(err) <= 2, proc.stderr
  assert not os.path.exists(tmp_path / "w" / "benchmark.jsonl")


def test_a_new_run_keeps_earlier_rows_and_a_killed_one_loses_nothing(tmp_path):
  """Issue 12: benchmark.jsonl only grows; every row names its run."""
  args = TINY + ["--impls=scaled_dot,naive", "--suite=kernels"]
  first = _run(args, tmp_path)
  assert first.returncode == 0, first.stderr[-3000:]
  before = _rows(tmp_path)
  md_before = open(tmp_path / "benchmark.md").read()
  assert len(before) == 4 and len({r["run"] for r in before}) == 1
  # A second run, killed by an injected error after its first measurement.
  script = """
      import sys
      from absl import app
      from experiments import benchmark
      real = benchmark.run_kernels_suite
      def dies_midway(settings, write):
        def once(row):
          write(row)
          raise OSError(28, "No space left on device", "benchmark.jsonl")
        real(settings, once)
      benchmark.run_kernels_suite = dies_midway
      app.run(benchmark.main)
      """
  crashed = _run(args, tmp_path, script=script)
  assert crashed.returncode != 0
  err = [l for l in crashed.stderr.splitlines() if l.strip() and not l.startswith(("I1", "W1"))]
  assert len(err) == 1 and "No space left on device" in err[0], crashed.stderr  # absl INFO aside
  after = _rows(tmp_path)
  assert after[:4] == before and len(after) == 5 and after[4]["run"] != before[0]["run"]
  assert open(tmp_path / "benchmark.md").read() == md_before  # not half-replaced
  # A row cut in half (a kill mid-write): the next run's rows start on a line of their own.
  with open(tmp_path / "benchmark.jsonl", "a") as f:
    f.write('{"suite": "kernels", "impl": "cut')
  third = _run(args, tmp_path)
  assert third.returncode == 0, third.stderr[-3000:]
  lines = open(tmp_path / "benchmark.jsonl").read().splitlines()
  assert lines[5] == '{"suite": "kernels", "impl": "cut'
  rows = [json.loads(line) for line in lines[:5] + lines[6:]]
  assert rows[:5] == after and len(rows) == 9 and len({r["run"] for r in rows[5:]}) == 1
