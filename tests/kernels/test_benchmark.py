"""Tests of experiments/kernels/run.py end to end (subprocesses, tiny sizes) and of
its suites and settings (experiments/kernels/, in this process)."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

import attention_jax as aj
from attention_jax.measure import benchmarking as bm
from attention_jax import registry
from experiments.kernels import kernel_impls
from experiments.kernels import kernels
from experiments.kernels import settings as settings_lib
from experiments.kernels import timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = ["--preset=tiny", "--suite=kernels,additive", "--seq_lens=16,32", "--head_dims=8",
        "--heads=2", "--batch=1", "--causal=false", "--dtypes=float32", "--modes=fwd_bwd",
        "--repeats=3", "--warmup=1", "--additive_batch=2", "--additive_dim=16",
        "--additive_seq_lens=8,16", "--additive_time_max_len=8"]
TINY_MODELS = ["--preset=tiny", "--suite=models", "--models=transformer", "--model_size=tiny",
               "--model_batch=2", "--model_seq_len=4", "--model_seeds=2", "--model_steps=2",
               "--repeats=3"]


def _run(args, workdir, script=None):
  """Runs the driver (or `script`, which calls it) in a subprocess."""
  if script is None:
    cmd = [sys.executable, "-m", "experiments.kernels.run", f"--workdir={workdir}", *args]
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
  for r in rows:  # every row names the code, versions, device and command
    assert r["provenance"]["command"].startswith("python -m experiments.kernels.run")
    assert r["provenance"]["platform"] == r["platform"] and r["provenance"]["versions"]["jax"]
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


def _tiny(**fields):
  """The tiny preset with `fields` replaced: a Settings for calling a suite's `run`."""
  return dataclasses.replace(settings_lib.PRESETS["tiny"], **fields)


def test_wrong_kernel_is_refused_and_missing_torch_is_skipped(monkeypatch):
  """With torch hidden and the `dot` kernel replaced by a deliberately wrong one
  (unscaled scores checked against the scaled_dot reference), whose timing
  would be recorded if the suite did not check it first."""
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
  timed = []
  original_time = bm.time_interleaved

  def spy(calls, **kw):
    timed.extend(calls)
    return original_time(calls, **kw)

  monkeypatch.setattr(bm, "time_interleaved", spy)
  original_build = kernel_impls.build_kernel

  def build(impl, case, params, library_implementation):
    if impl == "dot":  # checked against the scaled_dot reference below
      return kernel_impls.Kernel(lambda q, k, v: aj.attention(q, k, v, score="dot"))
    return original_build(impl, case, params, library_implementation)

  monkeypatch.setattr(kernel_impls, "build_kernel", build)
  monkeypatch.setattr(kernel_impls, "score_of", lambda impl: "scaled_dot")
  written = []
  kernels.run(_tiny(suite=("kernels",), impls=("dot", "scaled_dot", "torch"), seq_lens=(16,),
                    causal=(False,), modes=("fwd",)), written.append)
  rows = {r["impl"]: r for r in written}
  assert len(written) == 3
  assert rows["dot"]["status"] == "refused"
  assert "refusing to time" in rows["dot"]["reason"]
  assert "time_median_s" not in rows["dot"]
  assert rows["scaled_dot"]["status"] == "ok"
  assert rows["torch"]["status"] == "skipped" and "PyTorch is not installed" in rows["torch"]["reason"]
  assert timed == ["scaled_dot"]  # only the correct kernel reached the timer


def test_device_timing_adds_the_profilers_time_beside_the_host_clocks(monkeypatch):
  written = []
  kernels.run(_tiny(suite=("kernels",), impls=("scaled_dot", "scaled_dot_bthd"), seq_lens=(32,),
                    causal=(False,), modes=("fwd_bwd",), device_timing=True), written.append)
  assert [r["status"] for r in written] == ["ok", "ok"]
  for r in written:
    assert r["device_time_source"] == "host XLA threads"  # this CPU has no device plane
    assert 0 < r["device_busy_median_s"] <= r["device_time_median_s"]
    assert r["device_tflops"] == pytest.approx(r["flops"] / r["device_time_median_s"] / 1e12)
    assert r["device_time_repeats"] == r["repeats"]
  def unreadable(call, repeats):
    raise ValueError("the trace has annotations of repeats [], not of all 3")

  monkeypatch.setattr(timing.device_time, "device_seconds", unreadable)
  assert timing.device_timing_fields(lambda: None, 3, 1.0) == {
      "device_time_error": "ValueError: the trace has annotations of repeats [], not of all 3"}
  written = []  # off by default: no profiler fields
  kernels.run(_tiny(suite=("kernels",), impls=("scaled_dot",), seq_lens=(32,), causal=(False,),
                    modes=("fwd",)), written.append)
  assert not any(k.startswith("device_time") for k in written[0])


def test_the_layers_layout_times_the_same_attention_as_the_library():
  written = []
  kernels.run(_tiny(suite=("kernels",), impls=("scaled_dot", "scaled_dot_bthd"), seq_lens=(16,),
                    causal=(True,), modes=("fwd",)), written.append)
  rows = {r["impl"]: r for r in written}
  # Both checked against the same float32 reference, to the same error.
  assert rows["scaled_dot_bthd"]["status"] == "ok"
  assert rows["scaled_dot_bthd"]["max_abs_err"] == pytest.approx(rows["scaled_dot"]["max_abs_err"])


def test_library_scores_come_from_the_registry():
  assert settings_lib.LIBRARY_SCORES[0] == "scaled_dot"
  assert sorted(settings_lib.LIBRARY_SCORES) == sorted(registry.FUNCTION_SCORES)
  assert set(settings_lib.LIBRARY_SCORES) <= set(settings_lib.IMPLS)
  assert settings_lib.PRESETS["tiny"].impls == settings_lib.IMPLS  # every impl in the smoke run
  for preset in ("cpu", "gpu"):
    assert set(settings_lib.LIBRARY_SCORES) <= set(settings_lib.PRESETS[preset].impls)
  assert kernel_impls.score_of("cosine") == "cosine"
  assert kernel_impls.score_of("jax_xla") == kernel_impls.score_of("naive") == "scaled_dot"


def test_library_kernels_take_the_causal_mask_by_structure_and_match_the_reference(monkeypatch):
  """The library's kernels are given `causal=True`, not a dense `[T, T]`
  mask (which would keep `auto` off cuDNN's fused kernel on a GPU), and
  compute what the naive reference computes with the dense mask."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  case = kernel_impls.Case(mode="fwd", dtype="float32", batch=1, heads=2, seq_len=16,
                           head_dim=8, causal=True)
  params = kernel_impls.score_params(case.head_dim, jnp.float32, seed=0)
  q, k, v = (jax.random.normal(key, (1, 2, 16, 8)) for key in jax.random.split(
      jax.random.PRNGKey(0), 3))
  given = []
  original = aj.attention

  def spy(*args, **kw):
    given.append(kw)
    return original(*args, **kw)

  monkeypatch.setattr(aj, "attention", spy)
  impls = (*settings_lib.LIBRARY_SCORES, "scaled_dot_plain", "scaled_dot_blockwise")
  for impl in impls:
    kernel = kernel_impls.build_kernel(impl, case, params, "auto")
    reference = kernel_impls.reference_kernel(kernel_impls.score_of(impl), params, case)
    np.testing.assert_allclose(kernel.fn(q, k, v), reference.fn(q, k, v), atol=2e-5,
                               err_msg=impl)
  assert len(given) == len(impls)
  assert all(kw["causal"] is True and kw.get("mask") is None for kw in given)


@pytest.mark.parametrize("fields,needle", [
    (dict(impls="scaled_dot,bogus"), "`--impls`: 'bogus'"),
    (dict(seq_lens="128,abc"), "`--seq_lens` must be a comma-separated list of int"),
    (dict(causal="maybe"), "`--causal` must be a comma-separated list of bool"),
    (dict(seq_lens=""), "`--seq_lens` is empty"),
    (dict(head_dims=(0,)), "`--head_dims`: every value must be >= 1"),
    (dict(repeats=0), "`--repeats` must be a positive integer"),
    (dict(model_steps=0), "`--model_steps` must be a positive integer"),
    (dict(warmup=-1), "`--warmup` must be >= 0"),
    (dict(library_implementation="fast"), "`--library_implementation` must be one of"),
    (dict(memory_limit_gb=0.0), "`--memory_limit_gb` must be > 0"),
    (dict(model_size="huge"), "`--model_size` must be one of"),
])
def test_settings_name_the_bad_flag(fields, needle):
  with pytest.raises(ValueError) as e:
    settings_lib.from_preset("tiny", **fields)
  assert needle in str(e.value)


def test_settings_from_preset_parses_lists_and_keeps_the_rest():
  s = settings_lib.from_preset("cpu", seq_lens="16, 32", causal="false,true", repeats=3)
  assert s.seq_lens == (16, 32) and s.causal == (False, True) and s.repeats == 3
  assert s.heads == settings_lib.PRESETS["cpu"].heads and s.model_steps == 5
  with pytest.raises(ValueError, match="--preset"):
    settings_lib.from_preset("huge")


# Every flag the benchmark had before its flags came from `Settings`, with its type.
_FLAG_TYPES = {
    "suite": "string", "impls": "string", "seq_lens": "string", "head_dims": "string",
    "heads": "string", "batch": "string", "causal": "string", "dtypes": "string",
    "modes": "string", "library_implementation": "string", "repeats": "int", "warmup": "int",
    "time_budget_s": "float", "max_other_load": "float", "load_retries": "int",
    "load_retry_pause_s": "float", "memory_limit_gb": "float", "peak_tflops": "float",
    "additive_batch": "int", "additive_dim": "int", "additive_seq_lens": "string",
    "additive_time_max_len": "int", "additive_max_len": "int", "model_batch": "int",
    "model_seq_len": "int", "model_seeds": "int", "model_size": "string enum",
    "models": "string", "model_vocab": "int", "model_steps": "int", "seed": "int",
    "device_timing": "bool",
}


def test_every_settings_field_is_a_flag_of_its_old_type_with_its_help():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments import common  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  common.define_field_flags(settings_lib.Settings, flag_values=values)
  fields = dataclasses.fields(settings_lib.Settings)
  assert {f.name for f in fields} == set(_FLAG_TYPES) == set(values)
  for field in fields:
    flag = values[field.name]
    assert flag.flag_type() == _FLAG_TYPES[field.name], field.name
    assert flag.default is None and field.metadata["help"] in flag.help, field.name
  assert values["time_budget_s"].help.endswith("[dataclass default: 30.0]")
  assert values["model_size"].parser.enum_values == list(settings_lib.MODEL_SIZES)
  values(["benchmark", "--seq_lens=16,32", "--causal=true", "--model_size=small"])
  given = {name: values[name].value for name in values if values[name].present}
  s = settings_lib.from_preset("tiny", **given)
  assert (s.seq_lens, s.causal, s.model_size) == ((16, 32), (True,), "small")
  assert s.heads == settings_lib.PRESETS["tiny"].heads  # a flag not given: the preset's


def test_one_parse_list_reads_every_item_type_and_names_the_flag():
  from experiments import common  # pylint: disable=g-import-not-at-top
  assert common.parse_list("dims", " 8, 16,") == ("8", "16")
  assert common.parse_list("dims", "8,16", int) == (8, 16)
  assert common.parse_list("causal", "false,True,1,no", bool) == (False, True, True, False)
  for text, cast, needle in (("8,x", int, "`--dims` must be a comma-separated list of int"),
                             ("maybe", bool, "`--dims` must be a comma-separated list of bool"),
                             (" , ", str, "`--dims` is empty")):
    with pytest.raises(ValueError, match=needle):
      common.parse_list("dims", text, cast)


def _check_refused(proc, workdir, needle):
  assert proc.returncode != 0
  err = [l for l in proc.stderr.strip().splitlines() if l.strip() and "libtpu" not in l]
  assert any(needle in l for l in err), proc.stderr
  assert len(err) <= 2, proc.stderr
  assert not os.path.exists(workdir / "benchmark.jsonl")


def test_a_flag_absl_cannot_parse_fails_the_real_process_with_one_line(tmp_path):
  # An enum flag's bad value is refused by absl's parser (its own two lines), in
  # the process itself; the flags the driver checks run through `main` below.
  _check_refused(_run(["--model_size=huge"], tmp_path / "w"), tmp_path / "w", "model_size")


_BAD_FLAGS = [
    ("--impls=scaled_dot,bogus", "impls"),
    ("--seq_lens=128,abc", "seq_lens"),
    ("--causal=maybe", "causal"),
    ("--repeats=0", "repeats"),
]


@pytest.fixture(scope="module")
def refused_in_one_process(tmp_path_factory, run_refusals):
  """The driver's `main` on each bad flag, in one process
  (tests/drivers.py): flag -> (result, its workdir)."""
  workdirs = [tmp_path_factory.mktemp("bad_flag") / "w" for _ in _BAD_FLAGS]
  results = run_refusals("experiments.kernels.run",
                         [([f"--workdir={w}", flag], ROOT)
                          for w, (flag, _) in zip(workdirs, _BAD_FLAGS)])
  return {flag: (result, w) for (flag, _), result, w in zip(_BAD_FLAGS, results, workdirs)}


@pytest.mark.parametrize("flag,needle", _BAD_FLAGS)
def test_bad_flags_fail_with_one_line(refused_in_one_process, flag, needle):
  proc, workdir = refused_in_one_process[flag]
  assert proc.returncode == 1  # the driver's own `error:` line
  _check_refused(proc, workdir, needle)


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_a_new_run_keeps_earlier_rows_and_a_killed_one_loses_nothing(tmp_path):
  """benchmark.jsonl only grows; every row names its run (measured again with
  --noresume: resuming is tests/kernels/test_benchmark_resume.py)."""
  args = TINY + ["--impls=scaled_dot,naive", "--suite=kernels", "--noresume"]
  first = _run(args, tmp_path)
  assert first.returncode == 0, first.stderr[-3000:]
  before = _rows(tmp_path)
  md_before = open(tmp_path / "benchmark.md").read()
  assert len(before) == 4 and len({r["run"] for r in before}) == 1
  # A second run, killed by an injected error after its first measurement.
  script = """
      import sys
      from absl import app
      from experiments.kernels import run as benchmark
      from experiments.kernels import kernels
      real = kernels.run
      def dies_midway(settings, write, progress=None):
        def once(row):
          write(row)
          raise OSError(28, "No space left on device", "benchmark.jsonl")
        real(settings, once, progress)
      kernels.run = dies_midway
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


def _additive_rows(monkeypatch, fail_naive_compile=False, **overrides):
  """Rows of the additive suite at toy size (in this process); with
  `fail_naive_compile`, compiling a loss named "naive" fails (as XLA:GPU's
  compilation of the naive form does at T >= 1024)."""
  from experiments.kernels import additive  # pylint: disable=import-outside-toplevel
  if fail_naive_compile:
    compile_fn = bm.compile_fn

    def failing(fn, *args):
      if getattr(fn, "__name__", "") == "naive":  # jax.grad keeps the loss's name
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
      return compile_fn(fn, *args)
    monkeypatch.setattr(bm, "compile_fn", failing)
  settings = dataclasses.replace(settings_lib.PRESETS["tiny"], additive_seq_lens=(8,),
                                 additive_time_max_len=8, repeats=3, warmup=1, **overrides)
  rows = []
  additive.run(settings, rows.append)
  return {r["impl"]: r for r in rows}


def test_additive_suite_verifies_against_the_naive_form_where_it_fits(monkeypatch):
  rows = _additive_rows(monkeypatch)
  assert {r["status"] for r in rows.values()} == {"ok"}
  assert {r["reference"] for r in rows.values()} == {"naive"}


def test_additive_suite_falls_back_to_the_chunked_reference_and_names_a_failed_compile(
    monkeypatch):
  from experiments.kernels import additive  # pylint: disable=import-outside-toplevel
  real_loss = additive._loss  # pylint: disable=protected-access

  def loss(score_fn):
    fn = real_loss(score_fn)
    if score_fn is None or score_fn is additive.SCORE_FNS["additive_naive"]:
      fn.__name__ = "naive"
    return fn
  monkeypatch.setattr(additive, "_loss", loss)
  rows = _additive_rows(monkeypatch, fail_naive_compile=True)
  assert rows["additive_chunked"]["status"] == "ok"
  assert rows["additive_chunked"]["reference"] == "additive_chunked"
  assert rows["additive_chunked"]["max_abs_err"] == 0.0
  assert rows["additive_naive"]["status"] == "skipped"
  assert "compile failed" in rows["additive_naive"]["reason"]


def test_kernel_reference_that_fails_to_compile_is_tried_at_one_batch_element_and_head(
    monkeypatch):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  case = kernel_impls.Case(mode="fwd", dtype="float32", batch=2, heads=2, seq_len=16,
                           head_dim=8, causal=False)
  params = kernel_impls.score_params(case.head_dim, jnp.float32, seed=0)
  inputs = kernel_impls.inputs(case, seed=0)  # q, k, v, cot
  compile_fn, calls = bm.compile_fn, []

  def fails_at_full_size(fn, *args):
    calls.append(args[0].shape)
    if args[0].shape[:2] == (2, 2):  # as XLA:GPU's autotuner did at T = 16384 on an H200
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
    return compile_fn(fn, *args)
  monkeypatch.setattr(bm, "compile_fn", fails_at_full_size)
  found = kernels.reference("scaled_dot", case, inputs, params, 2 ** 30)
  assert not isinstance(found, str), found
  at, at_inputs, outputs = found
  assert calls == [(2, 2, 16, 8), (1, 1, 16, 8)]
  assert (at.batch, at.heads) == (1, 1) and at_inputs[0].shape == (1, 1, 16, 8)
  assert jax.tree.leaves(outputs)[0].shape[:2] == (1, 1)
  monkeypatch.setattr(bm, "compile_fn", lambda fn, *args: (_ for _ in ()).throw(
      RuntimeError("no compiler")))
  why = kernels.reference("scaled_dot", case, inputs, params, 2 ** 30)
  assert why.startswith("reference failed: RuntimeError: no compiler")
