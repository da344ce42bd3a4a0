"""The compile check (experiments/compile_check/run.py, attention_jax/analysis/compile_*.py and
hlo.py): its pure parts here; compiling for a TPU and an H100 in the AOT
environment (`.venv-aot`, scripts/aot_env.sh).

The compiling tests run the AOT environment's Python in a subprocess (this
suite's own environment has neither libtpu nor the CUDA plugin) and are
skipped where `.venv-aot` has not been built: it is ~3.8 GB (libtpu 0.7 GB,
the CUDA plugin 0.4 GB, cuDNN with cuBLAS 1.6 GB), too much to install on
every CI run. They carry the `aot` marker so that a CI job that builds it
runs them alone: `make compile-check-test`.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from attention_jax.measure import compile_device
from experiments.compile_check import tables as compile_tables
from attention_jax.measure import compile_targets
from attention_jax.measure import hlo
from experiments.compile_check import run as cc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOT_PYTHON = os.path.join(ROOT, ".venv-aot", "bin", "python")


# --- compiling one case -------------------------------------------------------


def test_a_case_that_fails_to_lower_or_compile_is_an_error_row_with_its_first_line():
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def bad_lower():
    raise ValueError("shapes (3,) and (4,) do not match\nsecond line")

  row = {"case": "x"}
  assert compile_device.compile_into(row, bad_lower) is None
  assert row["status"] == "error" and row["case"] == "x"
  assert row["error"] == "ValueError: shapes (3,) and (4,) do not match"
  assert row["compile_s"] >= 0

  row = {}
  compiled = compile_device.compile_into(
      row, lambda: jax.jit(lambda x: 2 * x).lower(jax.ShapeDtypeStruct((3,), jnp.float32)))
  assert row["status"] == "compiled" and "error" not in row and row["compile_s"] >= 0
  assert list(compiled(jnp.arange(3.0))) == [0.0, 2.0, 4.0]


# --- prediction -------------------------------------------------------------


def test_roofline_is_bound_by_compute_or_memory():
  # 1e12 FLOPs at 1e15 FLOP/s = 1 ms; 1e9 bytes at 1e12 B/s = 1 ms.
  assert compile_targets.roofline_seconds(2e12, 1e9, 1e15, 1e12) == pytest.approx(2e-3)  # compute-bound
  assert compile_targets.roofline_seconds(1e12, 3e9, 1e15, 1e12) == pytest.approx(3e-3)  # memory-bound
  assert compile_targets.roofline_seconds(0, 0, 1e15, 1e12) == 0


@pytest.mark.parametrize("args, name", [((-1, 0, 1, 1), "flops"),
                                        ((1, math.nan, 1, 1), "bytes_accessed"),
                                        ((1, 1, 0, 1), "peak_flops"),
                                        ((1, 1, 1, -5), "bandwidth")])
def test_roofline_names_a_bad_argument(args, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    compile_targets.roofline_seconds(*args)


def test_prediction_adds_kernel_and_iteration_overhead():
  target = compile_targets.TARGETS["h100"]
  cost = {"flops": 989e12 * 1e-3, "bytes accessed": 0.0, "kernels": 100, "iterations": 10}
  expected = 1e-3 + 100 * target.kernel_overhead_s + 10 * target.iteration_overhead_s
  assert compile_targets.predict_seconds(cost, target) == pytest.approx(expected)
  assert compile_targets.predict_seconds({"flops": 0.0, "bytes accessed": 3.35e12}, target) == pytest.approx(1.0)


def test_memory_total_and_verdict():
  memory = {"argument_bytes": 10, "output_bytes": 10, "temp_bytes": 5, "alias_bytes": 8}
  assert compile_targets.total_bytes(memory) == 17  # donated arguments hold the aliased outputs
  assert compile_targets.fits(memory, device_bytes=19)  # 17 <= 0.9 * 19
  assert not compile_targets.fits(memory, device_bytes=18)  # 17 > 16.2


def test_sweep_seconds_sums_steps_times_step_time():
  rows = [{"program": "gpu_sweep", "steps": 6000, "predicted_s": 0.01},
          {"program": "gpu_sweep", "steps": 6000, "predicted_s": 0.02},
          {"program": "kernels", "predicted_s": 5.0}]
  assert compile_tables.sweep_seconds(rows) == pytest.approx(180.0)
  assert compile_tables.sweep_seconds(rows[:1] + [{"program": "gpu_sweep", "status": "error"}]) is None
  assert compile_tables.sweep_seconds(rows[2:]) is None


# --- HLO text ----------------------------------------------------------------

# A module whose entry runs a 10-step loop, and a loop with no known trip count.
MODULE = textwrap.dedent("""\
    HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

    %fused_add (p: f32[8]) -> f32[8] {
      %p = f32[8]{0} parameter(0)
      ROOT %a = f32[8]{0} add(%p, %p)
    }

    %body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
      %t = (s32[], f32[8]{0}) parameter(0)
      %x = f32[8]{0} get-tuple-element(%t), index=1
      %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_add
      %i = s32[] get-tuple-element(%t), index=0
      ROOT %r = (s32[], f32[8]{0}) tuple(%i, %f)
    }

    %cond (t: (s32[], f32[8])) -> pred[] {
      %t = (s32[], f32[8]{0}) parameter(0)
      ROOT %c = pred[] constant(true)
    }

    ENTRY %main (x: f32[8]) -> f32[8] {
      %x = f32[8]{0} parameter(0)
      %e = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_add
      %t = (s32[], f32[8]{0}) tuple(%x, %e)
      %w = (s32[], f32[8]{0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
      %w2 = (s32[], f32[8]{0}) while(%w), condition=%cond, body=%body
      ROOT %out = f32[8]{0} get-tuple-element(%w2), index=1
    }
    """)


def test_parse_hlo_finds_loops_trip_counts_and_kernels():
  entry, comps = hlo.parse_hlo(MODULE)
  assert entry == "main"
  assert comps["main"].whiles == [("body", 10), ("body", None)]
  assert comps["main"].kernels == 1  # the fusion; parameter, tuple, while, gte launch nothing
  assert comps["body"].kernels == 1


def test_trip_count_from_a_counter_condition():
  # The TPU compiler's loops carry no known_trip_count: `i < 10` gives 10.
  module = MODULE.replace('ROOT %c = pred[] constant(true)',
                          '%n = s32[]{:T(128)} constant(10)\n'
                          '  %i = s32[] get-tuple-element(%t), index=0\n'
                          '  ROOT %c = pred[]{:T(512)} compare(%i, %n), direction=LT')
  _, comps = hlo.parse_hlo(module)
  assert comps["main"].whiles == [("body", 10), ("body", 10)]
  assert hlo.counter_limit(["  ROOT %c = pred[] compare(%i, %n), direction=GT"]) is None
  assert hlo.counter_limit(["  %n = s32[] constant(7)",
                           "  ROOT %c = pred[] compare(%i, %n), direction=LT"]) == 7


def test_as_entry_moves_the_entry():
  text = hlo.as_entry(MODULE, "body")
  assert "ENTRY %body (t:" in text and "\n%main (x:" in text
  assert "entry_computation_layout" not in text
  with pytest.raises(ValueError, match="`name`"):
    hlo.as_entry(MODULE, "nowhere")


def test_loop_aware_cost_multiplies_bodies_by_their_trip_counts():
  # A cost analysis that counts loop bodies once, as XLA's does: 8 FLOPs per
  # fusion; the entry = its own fusion + each loop's body once = 24.
  def analyse(text):
    entry = [l for l in text.splitlines() if l.startswith("ENTRY")][0]
    return {"flops": 8.0 if "%body" in entry else 24.0, "bytes accessed": 0.0}

  cost = hlo.loop_aware_cost(MODULE, analyse)
  assert cost["flops"] == 8 + 10 * 8 + 1 * 8  # entry fusion, 10 known steps, 1 unknown
  assert cost["kernels"] == 1 + 10 + 1
  assert cost["iterations"] == 11
  assert cost["loops"] == 2 and cost["unknown_trip_loops"] == 1


CUDNN_LINE = (
    '  %fmha = (bf16[4,16,512,128]{3,1,2,0}, u8[0]{0}) custom-call(%q, %k, %v), '
    'custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={bf16[4,512,16,128]'
    '{3,2,1,0}, bf16[4,512,16,128]{3,2,1,0}, bf16[4,512,16,128]{3,2,1,0}}, '
    'api_version=API_VERSION_STATUS_RETURNING, backend_config={"cudnn_fmha_backend_config": '
    '{"intermediate_tensor_shape": {"element_type": "BF16", "dimensions": ["4", "16", "512", '
    '"512"]}, "mask_type": "CAUSAL"}}')


def test_cudnn_attention_cost_is_the_flash_attention_count():
  cost = hlo.custom_call_cost(CUDNN_LINE)
  assert cost["known"]
  assert cost["flops"] == 4 * 4 * 16 * 512 * 512 * 128 / 2  # causal: half
  assert cost["bytes accessed"] == 4 * (4 * 16 * 512 * 128 * 2)  # q, k, v and the output
  backward = hlo.custom_call_cost(CUDNN_LINE.replace("fmhaSoftmax", "fmhaSoftmaxBackward"))
  assert backward["flops"] == 2.5 * cost["flops"]
  other = hlo.custom_call_cost(
      '  %g = f32[2,3]{1,0} custom-call(%a), custom_call_target="foo", api_version=API_VERSION_X')
  assert other == {"flops": 0.0, "bytes accessed": 24.0, "known": False}


def test_fused_attention_kernel_and_shapes_bytes():
  assert hlo.fused_attention_kernel(CUDNN_LINE) == "cudnn"
  assert hlo.fused_attention_kernel("%d = f32[2]{0} dot(%a, %b)") is None
  assert hlo.shapes_bytes("(bf16[4,512]{1,0}, pred[3], s32[])") == 4 * 512 * 2 + 3 + 4


# An entry with a transpose fusion, a copy, a fusion that transposes and adds
# (work, not a layout copy) and a bitcast (free).
COPIES_MODULE = textwrap.dedent("""\
    HloModule jit_f, entry_computation_layout={(bf16[2,3,4]{2,1,0})->bf16[2,4,3]{2,1,0}}

    %move (p: bf16[2,3,4]) -> bf16[2,4,3] {
      %p = bf16[2,3,4]{2,1,0} parameter(0)
      %b = bf16[2,3,4]{2,1,0} bitcast(%p)
      ROOT %t = bf16[2,4,3]{2,1,0} transpose(%b), dimensions={0,2,1}
    }

    %work (p: bf16[2,3,4]) -> bf16[2,4,3] {
      %p = bf16[2,3,4]{2,1,0} parameter(0)
      %t = bf16[2,4,3]{2,1,0} transpose(%p), dimensions={0,2,1}
      ROOT %a = bf16[2,4,3]{2,1,0} add(%t, %t)
    }

    ENTRY %main (x: bf16[2,3,4]) -> bf16[2,4,3] {
      %x = bf16[2,3,4]{2,1,0} parameter(0)
      %f = bf16[2,4,3]{2,1,0} fusion(%x), kind=kLoop, calls=%move
      %c = bf16[2,4,3]{1,2,0} copy(%f)
      %w = bf16[2,4,3]{2,1,0} fusion(%x), kind=kLoop, calls=%work
      %v = bf16[24]{0} bitcast(%w)
      ROOT %r = bf16[2,4,3]{2,1,0} add(%c, %w)
    }
    """)


def test_layout_copies_count_the_kernels_that_only_move_data_and_their_bytes():
  # The transpose fusion and the copy, each reading and writing 24 bf16 values.
  assert hlo.layout_copies(COPIES_MODULE) == {"kernels": 2, "bytes": 2 * 2 * 24 * 2}
  assert hlo.layout_copies(MODULE) == {"kernels": 0, "bytes": 0}


def test_h100_target_config_names_the_device():
  text = compile_targets.h100_target_config((9, 12), (13, 0))
  assert "core_count: 132" in text and "cuda_compute_capability { major: 9 minor: 0 }" in text
  assert "dnn_version_info { major: 9 minor: 12 }" in text
  assert 'device_description_str: "NVIDIA H100 80GB HBM3"' in text


# --- table and flags ----------------------------------------------------------


def test_markdown_table_shows_memory_verdict_and_errors():
  rows = [{"program": "kernels", "case": "a", "status": "compiled", "argument_bytes": 2e9,
           "output_bytes": 1e9, "temp_bytes": 90e9, "total_bytes": 93e9, "fits": False,
           "flops": 5e12, "predicted_s": 0.0125, "fused_attention": "cudnn"},
          {"program": "kernels", "case": "b", "status": "error", "error": "RuntimeError: boom"}]
  table = compile_tables.markdown_table(rows)
  lines = table.strip().splitlines()
  assert len(lines) == 4
  assert "| kernels | a | compiled | 2.00 | 1.00 | 90.00 | 93.00 | **no** | 5,000.0 | 12.50 ms |" in lines[2]
  assert lines[2].endswith("| cudnn |")
  assert "error: RuntimeError: boom" in lines[3]


def test_summary_states_the_sweep_prediction():
  rows = [{"program": "gpu_sweep", "case": "x", "status": "compiled", "steps": 6000,
           "predicted_s": 0.02, "roofline_s": 0.01, "flops": 1e12}]
  text = compile_tables.summary(rows, compile_targets.TARGETS["tpu_v5e"])
  assert "**2.0 min for 1 of 12 cells**" in text and "16.0 GB" not in text  # 16 GiB = 17.2 GB
  assert "17.2 GB" in text


def _sweep_rows(cells):
  return [{"program": "gpu_sweep", "case": c, "status": "compiled", "steps": 6000,
           "predicted_s": 0.05, "roofline_s": 0.02, "flops": 1e12} for c in cells]


def test_a_cut_runs_sweep_prediction_names_the_cells_it_covers():
  """A run cut after 5 of the 12 `gpu` cells left "24.6 min" as the sweep's
  time; the line says what it sums, and the report that it is part of a run."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cells = [arm.label for arm in config_lib.from_preset("gpu").sweep()]
  assert len(cells) == 12 and cells[0] == "additive d=128"
  target = compile_targets.TARGETS["h100"]
  rows = _sweep_rows(cells[:5])
  planned = [("gpu_sweep", c) for c in cells] + [("kernels", f"k{i}") for i in range(58)]
  text = compile_tables.summary(rows, target, planned)
  assert "**25.0 min for 5 of 12 cells**" in text  # 5 x 6000 x 0.05 s
  assert "roofline alone (no overheads) 10.0 min for 5 of 12 cells" in text
  assert "not compiled: " + ", ".join(cells[5:]) in text
  assert "Part of a run: 5 of 70 cases have a row; 65 not compiled (`gpu_sweep`, `kernels`)" in text
  # Without the plan (`--report_only`) the sweep line still names its cells.
  assert "for 5 of 12 cells" in compile_tables.summary(rows, target)
  # Whole: the sweep's time, no coverage said.
  whole = compile_tables.summary(_sweep_rows(cells), target, [("gpu_sweep", c) for c in cells])
  assert "**60.0 min**" in whole and " of 12 cells" not in whole and "Part of a run" not in whole


def test_a_cut_runs_multi_device_totals_name_the_cases_they_cover():
  planned = [("gpu_members", f"additive d={d}") for d in (128, 256, 512, 1024)]
  rows = [{"program": "gpu_members", "case": "additive d=128", "status": "compiled",
           "num_devices": 8, "predicted_total_s": 600.0, "steps": 6000, "collective_s": 0.0,
           "runs": 3}]
  (line,) = [l for l in compile_tables.mesh_totals(rows, planned).splitlines()
             if l.startswith("| `gpu` preset, members split")]
  assert line == ("| `gpu` preset, members split over devices | 8 | 10.0 min for 1 of 4 cases | "
                  "0 µs for 1 of 4 cases |")
  whole = compile_tables.mesh_totals(rows, planned[:1])
  assert "| 10.0 min |" in whole and "of 4" not in whole


@pytest.mark.parametrize("kwargs, flag", [
    (dict(target=None), "--target"), (dict(target="h200"), "--target"),
    (dict(programs="kernels,bogus"), "--programs"), (dict(programs=" , "), "--programs"),
    (dict(out=None), "--out"), (dict(kernel_seq_lens="512,x"), "--kernel_seq_lens"),
    (dict(additive_seq_lens="0"), "--additive_seq_lens")])
def test_parse_options_names_the_bad_flag(kwargs, flag):
  given = dict(target="h100", programs="kernels", out="/tmp/x", kernel_seq_lens="512",
               additive_seq_lens="256")
  given.update(kwargs)
  with pytest.raises(ValueError, match=f"`{flag}`"):
    cc.parse_options(**given)


def test_parse_options_keeps_order_without_repeats():
  options = cc.parse_options("tpu_v5e", "additive,kernels,additive", "/tmp/x", "512,1024",
                             "256")
  assert options.programs == ("additive", "kernels")
  assert options.target.platform == "tpu" and options.kernel_seq_lens == (512, 1024)


def test_resume_compiles_only_the_cases_without_a_compiled_row(tmp_path):
  import types  # pylint: disable=g-import-not-at-top
  case = lambda program, name: types.SimpleNamespace(program=program, case=name)
  rows = [{"target": "h100x8", "program": "gpu_members", "case": "d=128", "status": "compiled"},
          {"target": "h100x8", "program": "gpu_members", "case": "d=256", "status": "error"},
          {"target": "h100x8", "program": "lr_grid", "case": "d_k=16", "status": "compiled"}]
  (tmp_path / "h100x8.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  kept = cc.kept_rows(str(tmp_path), "h100x8")
  assert kept == rows and cc.kept_rows(str(tmp_path), "tpu_v5e_8") == []
  cases = [case("gpu_members", "d=128"), case("gpu_members", "d=256"), case("gpu_data", "d=128")]
  todo, left = cc.to_compile(cases, kept)
  # The compiled case is skipped, the failed one compiled again (its row
  # dropped), a new program's case compiled; another program's rows stay.
  assert [(c.program, c.case) for c in todo] == [("gpu_members", "d=256"), ("gpu_data", "d=128")]
  assert left == [rows[0], rows[2]]


def test_resume_refuses_a_jsonl_of_another_target_naming_the_flag(tmp_path):
  (tmp_path / "h100x8.jsonl").write_text(json.dumps({"target": "h100", "program": "x"}) + "\n")
  with pytest.raises(ValueError, match="`--resume`.*line 1 is not a row of h100x8"):
    cc.kept_rows(str(tmp_path), "h100x8")


def test_importing_it_defines_no_flags():
  # Other drivers define `--out`, `--additive_seq_lens`, `--report_only`;
  # importing them beside it (as the test suite does) must not clash.
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.kernels import run as benchmark  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  assert "target" not in flags.FLAGS and "kernel_seq_lens" not in flags.FLAGS


def test_cli_refuses_a_bad_flag_in_one_line_before_any_work(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.compile_check.run", "--target=h200", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == [
      "error: `--target` must be one of h100, tpu_v5e, tpu_v6e, tpu_v5p, h100x8, tpu_v5e_8, "
      "tpu_v4_32; got 'h200'."]
  assert not out.exists()


# --- compiling for the targets (the AOT environment) ---------------------------

# Compiles, for one target, a bfloat16 matmul, a 10-step scan of it, the
# library's scaled_dot score function, its causal attention under `auto`, and
# the sweep trainer's step of a tiny Transformer and a tiny RNN (two seeds
# vmapped); prints one JSON line of what it saw.
_SCRIPT = textwrap.dedent("""\
    import json, os, sys
    for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    import jax, jax.numpy as jnp
    from attention_jax.measure import compile_device, compile_targets
    from experiments.compile_check import cases as compile_cases
    import attention_jax as aj
    from attention_jax import scores
    target = compile_targets.TARGETS[sys.argv[1]]
    device = compile_device.target_device(target)
    bf16 = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)

    def scan(w, x):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=10)[0]

    programs = {
        "matmul": (lambda a, b: a @ b, (bf16(256, 512), bf16(512, 128))),
        "scan": (scan, (bf16(128, 128), bf16(64, 128))),
        "scaled_dot": (scores.scaled_dot, (bf16(2, 4, 64, 32), bf16(2, 4, 96, 32))),
        "causal_attention": (lambda q, k, v: aj.attention(q, k, v, causal=True),
                             (bf16(2, 4, 128, 64),) * 3),
    }
    out = {}
    for name, (fn, args) in programs.items():
        case = compile_cases.Case("test", name, {}, lambda fn=fn, args=args: (jax.jit(fn), args))
        out[name] = compile_device.compile_case(case, target, device)
    from attention_jax.sweep import config as config_lib
    tiny = dict(dims=(16,), vocab_size=64, hidden_dim=32, batch_size=4, max_length=15,
                dtype="bfloat16")
    models = {
        "tiny_transformer": config_lib.ExperimentConfig(
            model="transformer", arms=("scaled_dot",), seeds=1, num_heads=2, ff_dim=64,
            encoder_layers=1, decoder_layers=1, **tiny),
        "tiny_rnn": config_lib.ExperimentConfig(model="rnn", arms=("additive",), seeds=2,
                                                **tiny),
    }
    for name, cfg in models.items():
        case = compile_cases.train_step_case("test", name, cfg, cfg.sweep()[0], None)
        out[name] = compile_device.compile_case(case, target, device)
    print(json.dumps(out))
    """)


@pytest.mark.aot
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
@pytest.mark.parametrize("target", ["tpu_v5e", "h100"])
def test_compiles_for_the_target_with_memory_and_flops(target):
  proc = subprocess.run([AOT_PYTHON, "-c", _SCRIPT, target], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout.strip().splitlines()[-1])
  device_memory = compile_targets.TARGETS[target].memory_bytes
  for name, row in rows.items():
    assert row["status"] == "compiled", (name, row.get("error"))
    assert 0 < row["total_bytes"] <= device_memory, name
    assert row["flops"] > 0 and row["predicted_s"] > 0, name
  kind = rows["matmul"]["device_kind"]
  assert ("TPU v5 lite" in kind) if target == "tpu_v5e" else ("H100" in kind), kind
  matmul = rows["matmul"]
  assert matmul["argument_bytes"] == 2 * (256 * 512 + 512 * 128)
  assert matmul["output_bytes"] == 2 * 256 * 128
  # 2·M·N·K (XLA:GPU's fused GEMM is counted with its element-wise epilogue, < 1% more).
  assert 2 * 256 * 512 * 128 <= matmul["flops"] <= 1.01 * 2 * 256 * 512 * 128
  # The loop counted 10 times, not once as XLA's own analysis does.
  # (plus the counter's adds, and on the GPU the GEMM epilogue: a few %).
  step = 2 * 64 * 128 * 128
  assert 10 * step <= rows["scan"]["flops"] <= 1.05 * 10 * step
  assert rows["scan"]["loop_iterations"] == 10
  # scaled_dot: q kᵀ [2, 4, 64, 96] over d = 32, plus the 1/sqrt(d) scaling.
  assert rows["scaled_dot"]["flops"] >= 2 * 2 * 4 * 64 * 96 * 32
  # float32 [2, 4, 64, 96] from bf16 inputs (the dot-product scores are
  # accumulated and kept in float32); a TPU pads the minor axis to 128-wide tiles.
  padded = 96 if target == "h100" else 128
  assert rows["scaled_dot"]["output_bytes"] == 4 * 2 * 4 * 64 * padded
  # `auto` decides as on the device: its cuDNN probe is compiled for the
  # target, not for this host's CPU (where it would fail and keep XLA's kernel).
  want = "cudnn" if target == "h100" else None
  assert rows["causal_attention"]["fused_attention"] == want
  # The Transformer's self attentions pass their masks as structure, so its
  # training step reaches cuDNN too; the RNN's step is loops (its scans).
  assert rows["tiny_transformer"]["fused_attention"] == want
  assert rows["tiny_rnn"]["loop_iterations"] > 0
  if target == "tpu_v5e":  # the TPU's own cost model agrees where there is no loop
    assert matmul["target_flops"] == matmul["flops"]
    assert matmul["target_optimal_seconds"] > 0


# The kernel cases at T = 512, forward+backward, compiled for the H100: the
# layout copies of each, and the opcodes of each program's entry.
_LAYOUT_SCRIPT = textwrap.dedent("""\
    import collections, json, os, re
    for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from attention_jax.measure import compile_device, compile_targets, hlo
    from experiments.compile_check import cases as compile_cases
    target = compile_targets.TARGETS["h100"]
    device = compile_device.target_device(target)
    out = {}
    for case in compile_cases.kernel_cases((512,), "cuda"):
        if case.shapes["causal"] or case.shapes["mode"] != "fwd_bwd":
            continue
        row = compile_device.compile_case(case, target, device)
        out[case.shapes["impl"]] = {k: row.get(k) for k in (
            "status", "layout_copies", "layout_copy_bytes", "fused_attention", "kernels")}
    print(json.dumps(out))
    """)


@pytest.mark.aot
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
def test_the_library_on_its_layers_layout_compiles_to_jax_cudnn_program_without_copies():
  proc = subprocess.run([AOT_PYTHON, "-c", _LAYOUT_SCRIPT], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout.strip().splitlines()[-1])
  assert {r["fused_attention"] for r in rows.values()} == {"cudnn"}
  # [B, H, T, D] arguments: q, k, v and the cotangent transposed in, dq, dk, dv
  # out, each [4, 16, 512, 128] bf16 read and written once.
  tensor = 4 * 16 * 512 * 128 * 2
  assert (rows["auto"]["layout_copies"], rows["auto"]["layout_copy_bytes"]) == (7, 7 * 2 * tensor)
  # The layers' layout: no copy, the same kernels as jax.nn's own cuDNN call.
  for impl in ("auto_bthd", "jax_cudnn"):
    assert (rows[impl]["layout_copies"], rows[impl]["layout_copy_bytes"]) == (0, 0), impl
  assert rows["auto_bthd"]["kernels"] == rows["jax_cudnn"]["kernels"]
  assert rows["auto"]["kernels"] == rows["jax_cudnn"]["kernels"] + 7


def test_every_row_names_its_code_versions_command_and_host():
  from attention_jax.measure import provenance
  p = compile_device.row_provenance("python -m experiments.compile_check.run --target=h100")
  assert provenance.problems(p) == []  # the one schema every row carries
  assert p["command"] == "python -m experiments.compile_check.run --target=h100"
  assert set(compile_device.DISTRIBUTIONS) <= set(p["versions"])  # the compilers' too
  assert p["cpu"] == provenance.cpu_model(provenance.read_cpuinfo())
  assert p["cpu"]  # this Linux machine names its CPU, the host the compile times are of


def _row(program, case, **fields):
  return {"program": program, "case": case, "status": "compiled", "fits": True, **fields}


def test_program_tables_and_report_only(tmp_path):
  rows = [
      _row("gpu_sweep", "additive d=128", total_bytes=4.5e9, roofline_s=0.03, predicted_s=0.09,
           flops=989e9,
           kernels=17000, loop_iterations=480, steps=6000, predicted_total_s=540.0),
      _row("kernels", "scaled_dot auto T=4096 fwd_bwd", total_bytes=0.8e9, predicted_s=2e-3,
           predicted_tflops=962.1, fused_attention="cudnn"),
      _row("additive", "additive_chunked T=2048", shapes={"impl": "additive_chunked",
                                                           "seq_len": 2048},
           temp_bytes=2.68e9, predicted_s=2.3),
      {**_row("additive", "additive_naive T=2048", shapes={"impl": "additive_naive",
                                                          "seq_len": 2048},
              temp_bytes=550.8e9, predicted_s=1.15), "fits": False},
  ]
  sweep = compile_tables.sweep_table(rows, compile_targets.TARGETS["h100"]).splitlines()
  assert sweep[2] == ("| additive d=128 | 4.50 | yes | 989 | 1.00 ms | 30.00 ms | 90.00 ms | "
                      "17,000 | 480 | 6,000 | 9.0 min |")
  kernels = compile_tables.kernel_table(rows).splitlines()
  assert kernels[2] == "| scaled_dot auto T=4096 fwd_bwd | 0.80 | yes | 2.00 ms | 962 | yes | – |"
  additive = compile_tables.additive_table(rows).splitlines()
  assert additive[2] == "| 2048 | 2.68 | 550.80 (does not fit) | 2.30 s | 1.15 s |"
  text = compile_tables.summary(rows, compile_targets.TARGETS["h100"])
  assert ("**9.0 min for 1 of 12 cells**; the roofline alone (no overheads) 3.0 min for 1 of "
          "12 cells, the FLOPs at peak alone 6.00 s for 1 of 12 cells") in text

  (tmp_path / "h100.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert compile_tables.report_only(str(tmp_path), compile_targets.TARGETS["h100"]) == text
  assert (tmp_path / "h100.md").read_text() == text
  with pytest.raises(ValueError, match="`--out`"):
    compile_tables.report_only(str(tmp_path), compile_targets.TARGETS["tpu_v5e"])


# Compiles forward+backward of additive attention at the benchmark's shape
# (B = 32, T = 1024, a = 1024, d = 64, float32) in its three forms for one
# target; prints one JSON line: the rows, and what `auto` picks there.
_ADDITIVE_SCRIPT = textwrap.dedent("""\
    import json, os, sys
    for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    import importlib
    import jax, jax.numpy as jnp
    from attention_jax.measure import compile_device, compile_targets
    from experiments.compile_check import cases as compile_cases
    target = compile_targets.TARGETS[sys.argv[1]]
    device = compile_device.target_device(target)
    out = {c.shapes["impl"]: compile_device.compile_case(c, target, device)
           for c in compile_cases.additive_cases((1024,), ("pallas", "chunked", "naive"))}
    attention = importlib.import_module("attention_jax.attention")
    q = jax.ShapeDtypeStruct((32, 1024, 64), jnp.float32)
    params = {"w_q": jnp.zeros((64, 1024)), "w_k": jnp.zeros((64, 1024)), "v": jnp.zeros(1024)}
    with compile_device.backend_as(target.platform):
        out["auto"] = attention.select_implementation("additive", "auto", q, q, q, params=params)
    print(json.dumps(out))
    """)


@pytest.mark.aot
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
@pytest.mark.parametrize("target", ["tpu_v5e", "h100"])
def test_pallas_additive_compiles_with_bounded_memory_and_its_cost(target):
  from attention_jax import pallas_additive  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([AOT_PYTHON, "-c", _ADDITIVE_SCRIPT, target], cwd=ROOT,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout.strip().splitlines()[-1])
  assert rows.pop("auto") == "pallas"
  for name, row in rows.items():
    assert row["status"] == "compiled", (name, row.get("error"))
  pallas, chunked, naive = (rows[f"additive_{n}"] for n in ("pallas", "chunked", "naive"))
  assert pallas["fits"]
  # Nothing of size B·T²·a (128 GiB in float32), nor the chunked form's
  # B·T² scores and weights: below both other forms.
  assert pallas["temp_bytes"] < min(chunked["temp_bytes"], naive["temp_bytes"])
  if target == "h100":  # XLA:GPU stores the naive form's tanh block
    assert 100 * pallas["temp_bytes"] < naive["temp_bytes"]
  # The kernels' pl.CostEstimate is counted: on the TPU from the calls
  # themselves (by libtpu's analysis and by the loop-aware one), on the H100
  # from the program's jaxpr (Pallas's Triton backend drops it).
  # Besides the kernels, XLA's six [B·T, d] x [d, a] products (the two
  # projections and their four gradients) and a few element-wise ops.
  kernels = sum(c["flops"] for c in pallas_additive.cost_estimates(
      32, 1024, 1024, 1024, 64).values())
  expected = kernels + 6 * 2 * 32 * 1024 * 64 * 1024
  assert expected <= pallas["flops"] <= 1.001 * expected
  if target == "tpu_v5e":
    assert expected <= pallas["target_flops"] <= 1.001 * expected
    assert "tpu_custom_call" not in pallas["uncosted_custom_calls"]
  else:
    assert pallas["pallas_costed_from_jaxpr"] == 3  # forward, dq, dkv


def test_pallas_kernel_cost_and_the_three_form_table():
  line = ('  %k = f32[2,256,64]{2,1,0} custom-call(%a), custom_call_target="tpu_custom_call", '
          'backend_config={"custom_call_config":{"body":"x","cost_estimate":{"flops":"118095872",'
          '"transcendentals":"33685504","bytes_accessed":"1312768","remote_bytes_transferred":'
          '"0"},"needs_layout_passes":true}}')
  assert hlo.custom_call_cost(line) == {"flops": 118095872.0, "bytes accessed": 1312768.0,
                                       "known": True}
  rows = [_row("additive", f"additive_{impl} T=1024",
               shapes={"impl": f"additive_{impl}", "seq_len": 1024}, temp_bytes=temp,
               flops=flops, predicted_s=s)
          for impl, temp, flops, s in (("pallas", 0.54e9, 696e9, 1.07e-3),
                                       ("chunked", 1.07e9, 481e9, 0.573),
                                       ("naive", 137.84e9, 481e9, 0.288))]
  table = compile_tables.additive_table(rows).splitlines()
  assert table[0].startswith("| T | pallas temp GB | chunked temp GB | naive temp GB |")
  assert table[2] == ("| 1024 | 0.54 | 1.07 | 137.84 | 696 | 481 | 481 | 1.07 ms | "
                      "573.00 ms | 288.00 ms |")
  options = cc.parse_options("h100", "additive", "/tmp/x", "512", "1024", "pallas,naive")
  assert options.additive_impls == ("pallas", "naive")
  with pytest.raises(ValueError, match="`--additive_impls`"):
    cc.parse_options("h100", "additive", "/tmp/x", "512", "1024", "pallas,flash")


@pytest.mark.aot
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
def test_pallas_additive_compiles_for_the_h100_at_sizes_off_the_blocks():
  # Triton's block shapes must be powers of two: a = 200 (7 chunks of 32) and
  # T = 300 failed to lower on an H200 before the chunk axis was padded.
  script = textwrap.dedent("""\
      import json, os, sys
      for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
          os.environ.setdefault(key, value)
      from attention_jax.measure import compile_device, compile_targets
      from experiments.compile_check import cases as compile_cases
      target = compile_targets.TARGETS["h100"]
      device = compile_device.target_device(target)
      (case,) = compile_cases.additive_cases((300,), ("pallas",), attention_dim=200)
      print(json.dumps(compile_device.compile_case(case, target, device)))
      """)
  proc = subprocess.run([AOT_PYTHON, "-c", script], cwd=ROOT, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  row = json.loads(proc.stdout.strip().splitlines()[-1])
  assert row["status"] == "compiled", row.get("error")
  assert row["shapes"]["attention_dim"] == 200 and row["shapes"]["seq_len"] == 300


def test_cases_chooses_cases_of_the_programs_by_name_and_names_an_unknown_one():
  options = cc.parse_options("h100", "additive", "/tmp/x", "512", "512,1024", "chunked,naive",
                             cases="additive_naive T=1024, additive_chunked T=512")
  every = cc.cases_for(cc.parse_options("h100", "additive", "/tmp/x", "512", "512,1024",
                                        "chunked,naive"))
  chosen = cc.cases_for(options)
  assert len(every) == 4 and len(chosen) == 2
  assert {c.case for c in chosen} == {"additive_naive T=1024", "additive_chunked T=512"} < {c.case for c in every}
  with pytest.raises(ValueError, match="`--cases`: 'additive_naive T=2048' is not a case of additive"):
    cc.cases_for(cc.parse_options("h100", "additive", "/tmp/x", "512", "512,1024",
                                  cases="additive_naive T=2048"))
