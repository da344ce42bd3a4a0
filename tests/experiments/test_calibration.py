"""The gpu sweep's plan from measured times (experiments/calibration.py)
the final evaluation's time estimate a sweep piece stops before, and the plan
read back from calibration.json by the sweep's --calibration."""

import json
import os
import subprocess
import sys

import pytest

from attention_jax.training import evaluation
from attention_jax.sweep import plan as plan_lib
from experiments import calibration as cal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _times(step_s=0.02, compile_s=10.0, validation_s=2.0, test_batch_s=0.5, arm="additive",
           dim=1024):
  return plan_lib.CellTimes(arm=arm, dim=dim, build_s=2.0, first_step_s=compile_s + step_s,
                       step_s=step_s, first_validation_s=10.0 + validation_s,
                       validation_s=validation_s, first_test_batch_s=5.0 + test_batch_s,
                       test_batch_s=test_batch_s, test_batch_sentences=128)


def _plan(measured, **kw):
  args = dict(arms=("additive", "multiplicative", "scaled_multiplicative"),
              dims=(128, 256, 512, 1024), pieces=3, piece_minutes=7.0, eval_every=2000,
              checkpoint_every=500, test_sentences=1958, min_steps=1000, max_steps=6000)
  return plan_lib.plan(measured, **{**args, **kw})


def test_cell_seconds_adds_fixed_costs_steps_and_validations():
  t = _times(step_s=0.05, compile_s=30.0, validation_s=4.0, test_batch_s=2.0)
  fixed = 2.0 + 30.0 + 10.0 + 5.0 + 16 * 2.0 + 4.0  # build, compiles, test (16 batches), ppl
  assert plan_lib.cell_seconds(t, 0, eval_every=1000, test_sentences=1958) == pytest.approx(
      fixed + 4.0)
  assert plan_lib.cell_seconds(t, 3000, eval_every=1000, test_sentences=1958) == pytest.approx(
      fixed + 3000 * 0.05 + 3 * 4.0)


def test_plan_fits_whole_cells_into_the_pieces_from_the_slowest_cell():
  fast, slow = _times(step_s=0.01, arm="multiplicative", dim=128), _times(step_s=0.02)
  plan = _plan([fast, slow])
  assert plan["fits"] and plan["slowest_cell"] == "additive:1024"
  assert plan["cells"] == 12 and plan["cells_per_piece"] == 4
  assert plan["steps"] % 500 == 0 and 1000 <= plan["steps"] <= 6000
  # the slowest cell, four times, fills at most the safe share of a piece ...
  budget = plan_lib.SAFETY * 7 * 60
  assert 4 * plan["predicted_cell_s"] <= budget
  # ... and 500 steps more would not fit
  over = plan_lib.cell_seconds(slow, plan["steps"] + 500, eval_every=plan["eval_every"],
                          test_sentences=1958)
  assert 4 * over > budget
  assert plan["flags"] == [f"--steps={plan['steps']}", f"--eval_every={plan['eval_every']}",
                           "--dims=128,256,512,1024"]


def test_plan_is_capped_by_the_presets_steps_and_drops_dims_when_slow():
  quick = _times(step_s=0.001, compile_s=1.0, validation_s=0.5, test_batch_s=0.1)
  assert _plan([quick])["steps"] == 6000
  slow = _times(step_s=0.06)  # 12 cells would leave < 1,000 steps: 9 do not
  plan = _plan([slow])
  assert plan["fits"] and plan["dims"] == [128, 256, 1024] and plan["cells"] == 9
  hopeless = _times(step_s=5.0)
  plan = _plan([hopeless])
  assert not plan["fits"] and plan["dims"] == [128, 1024]


def _shared(times, copies, shared_step_s, shared_first_step_s=None):
  return plan_lib.CellTimes(**{**times.__dict__, "concurrent": copies,
                               "shared_step_s": shared_step_s,
                               "shared_first_step_s": shared_first_step_s})


def test_a_concurrent_plan_trains_its_cells_in_waves_at_the_shared_step():
  alone = _times(step_s=0.02)
  # Twelve cells in one piece of 10 minutes: one at a time, the plan keeps
  # two dimensions of four; twelve at once, each step 5 times slower, all four
  # and more steps.
  one = _plan([alone], pieces=1, piece_minutes=10.0, dims=(128, 256, 512, 1024))
  shared = _shared(alone, 12, 0.1, 12.0)
  twelve = _plan([shared], pieces=1, piece_minutes=10.0, concurrent=12)
  assert twelve["cells_per_piece"] == 12 and twelve["concurrent"] == 12
  budget = plan_lib.SAFETY * 10 * 60  # one wave: each cell has the whole piece
  assert twelve["predicted_cell_s"] <= budget
  assert plan_lib.cell_seconds(shared.running(), twelve["steps"] + 500,
                               eval_every=twelve["eval_every"], test_sentences=1958) > budget
  assert one["dims"] == [128, 1024] and twelve["dims"] == [128, 256, 512, 1024]
  assert one["steps"] < twelve["steps"] < 6000 and twelve["fits"]
  assert twelve["flags"][-1] == "--workers=12" and not any("workers" in f for f in one["flags"])
  # The shared step, not the step alone, and every copy's compile at once.
  assert shared.running().step_s == 0.1 and shared.running().first_step_s == 12.0
  assert alone.running() is alone
  with pytest.raises(ValueError, match="`--concurrent` must be >= 1, got 0"):
    _plan([alone], concurrent=0)


def test_a_concurrent_plan_is_read_back_with_its_workers(tmp_path):
  plan = _plan([_shared(_times(step_s=0.02), 4, 0.03)], pieces=1, piece_minutes=10.0,
               concurrent=4)
  path = _write(tmp_path, json.dumps({"preset": "gpu", "plan": plan}))
  assert plan_lib.read_plan(path, "gpu")["workers"] == 4
  bad = _write(tmp_path, json.dumps({"preset": "gpu", "plan": {**plan, "concurrent": "4"}}),
               name="bad.json")
  with pytest.raises(ValueError, match="the plan's concurrent '4' is not a positive integer"):
    plan_lib.read_plan(bad, "gpu")


def test_the_tables_show_the_shared_step_and_its_gain():
  measured = [_shared(_times(step_s=0.020), 4, 0.040, 3.5)]
  text = cal.steps_markdown(measured, "s")
  row = [l for l in text.splitlines() if l.startswith("| additive:1024")][0]
  assert [c.strip() for c in row.split("|")[-3:-1]] == ["40.0 (3.5)", "2.00x"]
  assert "step ms, 4 at once (first step s)" in text
  assert "at once" not in cal.steps_markdown([_times()], "s")
  plan = _plan(measured, pieces=1, piece_minutes=10.0, concurrent=4)
  assert ", 4 cells at a time." in cal.markdown(measured, plan, "s")


@pytest.mark.slow
def test_copies_of_a_cell_step_at_once_in_processes_of_their_own():
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.from_preset("smoke", dims=(8,), seeds=1, steps=4)
  first, step = cal.shared_steps(cfg, cfg.arms[0], 8, 3, 2)
  assert first > step > 0
  with pytest.raises(ValueError, match=r"`--concurrent` = 2: 2 of the copies of nope:8 failed"):
    cal.shared_steps(cfg, "nope", 8, 3, 2)


@pytest.mark.parametrize("text,needle", [("additive", "ARM:DIM"), ("additive:x", "ARM:DIM"),
                                         (",", "empty"), ("dot:0", "ARM:DIM")])
def test_bad_cells_name_the_flag(text, needle):
  with pytest.raises(ValueError, match="--cells") as e:
    cal.parse_cells(text)
  assert needle in str(e.value)


def test_default_cells_are_the_extremes():
  assert cal.default_cells(("additive", "multiplicative", "scaled_multiplicative"),
                           (256, 128, 1024)) == (("additive", 1024),
                                                 ("scaled_multiplicative", 128))


def test_final_evaluation_estimate_scales_the_slowest_validation():
  # 500 greedy validation sentences in 10 s -> 1958 test sentences at beam 10
  assert evaluation.final_evaluation_seconds(10.0, 500, 1, 1958, 10) == pytest.approx(
      10.0 * 1958 * 10 / 500)
  assert evaluation.final_evaluation_seconds(10.0, 500, 1, 100, 1) == 10.0  # never below one
  assert evaluation.final_evaluation_seconds(0.0, 500, 1, 1958, 10) == 0.0  # nothing timed


# --- the plan read back by the sweep (`--calibration`) -------------------------------

def _write(tmp_path, content, name="calibration.json"):
  path = tmp_path / name
  path.write_text(content if isinstance(content, str) else json.dumps(content))
  return str(path)


def test_a_plan_as_calibration_writes_it_is_read_back_as_the_sweeps_fields(tmp_path):
  plan = _plan([_times(step_s=0.06)])  # 12 cells leave < 1,000 steps: dims dropped
  path = _write(tmp_path, {"preset": "gpu", "measured": [], "plan": plan})
  fields = plan_lib.read_plan(path, "gpu")
  assert fields == {"steps": plan["steps"], "eval_every": plan["eval_every"],
                    "dims": ",".join(str(d) for d in plan["dims"])}
  assert fields["dims"] == "128,256,1024" and tuple(fields) == plan_lib.PLAN_FIELDS
  # The flags calibration.md shows are the same values.
  assert plan["flags"] == [f"--{k}={v}" for k, v in fields.items()]


def test_a_file_without_its_preset_is_read_for_any(tmp_path):
  # Files written before the preset was recorded carry only the plan.
  path = _write(tmp_path, {"plan": {"fits": True, "steps": 1500, "eval_every": 500,
                                    "dims": [128, 1024]}})
  assert plan_lib.read_plan(path, "quick") == {"steps": 1500, "eval_every": 500,
                                               "dims": "128,1024"}


@pytest.mark.parametrize("content,needle", [
    ("{not json", "is not JSON"),
    ([1, 2], 'has no "plan"'),
    ({"measured": []}, 'has no "plan"'),
    ({"preset": "quick", "plan": {"fits": True, "steps": 1500, "eval_every": 500,
                                  "dims": [128]}}, "calibrated for --preset=quick, not --preset=gpu"),
    ({"plan": {"fits": False, "steps": 0, "eval_every": 500, "dims": [128, 1024]}},
     "does not fit (0 steps"),
    ({"plan": {"fits": True, "steps": 0, "eval_every": 500, "dims": [128]}}, "plan's steps:"),
    ({"plan": {"fits": True, "steps": 1500, "eval_every": "500", "dims": [128]}},
     "plan's eval_every:"),
    ({"plan": {"fits": True, "steps": 1500, "eval_every": 500, "dims": []}}, "plan's dims:"),
    ({"plan": {"fits": True, "steps": True, "eval_every": 500, "dims": [128, -1]}},
     "plan's steps, dims:"),
    ({"plan": {"steps": 1500, "eval_every": 500, "dims": [128]}}, "plan's fits:"),
])
def test_a_bad_calibration_file_is_one_error_naming_the_flag_and_the_file(tmp_path, content,
                                                                          needle):
  path = _write(tmp_path, content)
  with pytest.raises(ValueError) as e:
    plan_lib.read_plan(path, "gpu")
  message = str(e.value)
  assert message.startswith(f"`--calibration` {path}") and needle in message
  assert "\n" not in message


def test_a_missing_or_unreadable_calibration_file_is_named(tmp_path):
  with pytest.raises(ValueError, match=r"`--calibration` .*nope.json cannot be read: No such"):
    plan_lib.read_plan(str(tmp_path / "nope.json"), "gpu")
  with pytest.raises(ValueError, match=r"cannot be read: Is a directory"):
    plan_lib.read_plan(str(tmp_path), "gpu")
  binary = tmp_path / "binary.json"
  binary.write_bytes(b"\xff\xfe{")
  with pytest.raises(ValueError, match="binary.json cannot be read"):
    plan_lib.read_plan(str(binary), "gpu")


def _settings(stdout):
  """--show_config's lines as field -> (value, where it came from)."""
  out = {}
  for line in stdout.splitlines():
    if line.startswith("--"):
      setting, _, source = line.partition("  # ")
      name, _, value = setting[2:].partition("=")
      out[name] = (value, source)
  return out


@pytest.fixture(scope="module")
def sweeps_of_a_plan(tmp_path_factory, run_refusals):
  """The sweep's `main` on a calibration's plan (with no flag, with flags given
  over it) and on a plan that does not fit, in one process
  (tests/drivers.py). Returns (results, the two files, the
  workdir of the refusal)."""
  folder = tmp_path_factory.mktemp("plans")
  fits = _write(folder, {"preset": "gpu", "plan": {
      "fits": True, "steps": 1500, "eval_every": 500, "dims": [128, 1024]}})
  unfit = _write(folder, {"preset": "gpu", "plan": {
      "fits": False, "steps": 0, "eval_every": 500, "dims": [128, 1024]}}, name="unfit.json")
  workdir = folder / "w"
  results = run_refusals("experiments.ablation", [
      (["--preset=gpu", f"--calibration={fits}", "--show_config"], ROOT),
      (["--preset=gpu", f"--calibration={fits}", "--steps=700", "--dims=256",
        "--show_config"], ROOT),
      (["--preset=gpu", f"--calibration={unfit}", f"--workdir={workdir}"], ROOT)])
  return results, fits, unfit, workdir


def test_the_sweep_takes_the_calibrations_plan_and_a_flag_given_wins(sweeps_of_a_plan):
  (proc, given, _), _, _, _ = sweeps_of_a_plan
  assert proc.returncode == 0, proc.stderr
  settings = _settings(proc.stdout)
  assert settings["steps"][0] == "1500" and settings["eval_every"][0] == "500"
  assert settings["dims"][0] == "128,1024"
  assert settings["seeds"] == ("4", "preset")  # the rest stays the preset's
  settings = _settings(given.stdout)
  assert (settings["steps"][0], settings["eval_every"][0], settings["dims"][0]) == (
      "700", "500", "256")


def test_a_bad_calibration_stops_the_sweep_with_one_line_before_any_work(sweeps_of_a_plan):
  # That the process shows a refusal of `main` as this one line is checked on the
  # same driver by tests/experiments/test_grid.py (a real process).
  (_, _, proc), _, path, workdir = sweeps_of_a_plan
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr
  assert err[0] == (f"error: `--calibration` {path}: the plan does not fit (0 steps for dims "
                    "[128, 1024]); see its calibration.md.")
  assert not workdir.exists()


def test_steps_markdown_gives_each_cells_step_in_milliseconds():
  text = cal.steps_markdown([_times(step_s=0.0176, arm="additive", dim=128),
                             _times(step_s=0.0211, arm="multiplicative", dim=256)], "s")
  rows = [l for l in text.splitlines() if l.startswith("| additive") or
          l.startswith("| multiplicative")]
  assert [r.split("|")[1].strip() for r in rows] == ["additive:128", "multiplicative:256"]
  assert [r.split("|")[-2].strip() for r in rows] == ["17.6", "21.1"]


@pytest.mark.slow
def test_steps_only_times_the_training_step_and_leaves_any_plan_alone(tmp_path):
  import subprocess
  import sys
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "calibration.json").write_text("{}")  # a sweep's plan stays as it was
  toy = ["--arms=additive,multiplicative", "--dims=8,16", "--seeds=2", "--steps=6",
         "--embed_dim=16", "--hidden_dim=16", "--decoder_layers=1", "--batch_size=8",
         "--max_length=24", "--eval_examples=8", "--test_examples=8", "--warmup_steps=2"]
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.calibration", "--preset=gpu",
       f"--workdir={workdir}", "--steps_only", "--calibration_steps=2",
       "--cells=additive:8,multiplicative:16", *toy],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  written = json.loads((workdir / "calibration_steps.json").read_text())
  assert [(m["arm"], m["dim"]) for m in written["measured"]] == [("additive", 8),
                                                                 ("multiplicative", 16)]
  for m in written["measured"]:
    assert m["step_s"] > 0 and m["first_step_s"] >= m["step_s"]
    assert m["validation_s"] == m["test_batch_s"] == m["batch_search_s"] == 0.0  # not measured
  assert "plan" not in written and written["provenance"]["commit"]
  assert (workdir / "calibration.json").read_text() == "{}"
  assert "| additive:8 |" in (workdir / "calibration_steps.md").read_text()


def test_the_evaluation_batch_search_is_part_of_a_cells_time():
  t = _times()
  searched = plan_lib.CellTimes(**{**t.__dict__, "batch_search_s": 90.0})
  for steps in (0, 3000):
    assert plan_lib.cell_seconds(searched, steps, eval_every=1000, test_sentences=1958) == (
        pytest.approx(plan_lib.cell_seconds(t, steps, eval_every=1000, test_sentences=1958)
                      + 90.0))


@pytest.mark.slow
def test_a_full_calibration_times_the_evaluation_batch_search(tmp_path):
  import subprocess
  import sys
  toy = ["--arms=additive", "--dims=8", "--seeds=1", "--steps=6", "--embed_dim=16",
         "--hidden_dim=16", "--decoder_layers=1", "--batch_size=8", "--max_length=24",
         "--eval_examples=8", "--test_examples=8", "--warmup_steps=2", "--eval_every=3",
         "--checkpoint_every=3", "--min_steps=3"]
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.calibration", "--preset=gpu",
       f"--workdir={tmp_path}", "--calibration_steps=2", "--cells=additive:8", *toy],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  (m,) = json.loads((tmp_path / "calibration.json").read_text())["measured"]
  assert m["batch_search_s"] > 0 and m["validation_s"] > 0 and m["test_batch_s"] > 0
  assert "| batch search s |" in (tmp_path / "calibration.md").read_text()


# --- no accelerator: said at once ---------------------------------------------


def test_the_note_names_the_backend_where_jax_sees_no_gpu_or_tpu():
  note = cal.accelerator_note("cpu")
  assert note.startswith("calibration: JAX sees no GPU or TPU (backend cpu)")
  assert "make venv-cuda" in note and "\n" not in note
  assert cal.accelerator_note("gpu") is None and cal.accelerator_note("tpu") is None


# The calibration's `main` with the data loading replaced by a stop: what it
# printed before loading the data is what a user sees at once (a real first
# cell compiles and times for minutes before its line).
_STOP_AT_DATA = """
import sys
from absl import app
from attention_jax.sweep import datasets
def stop(cfg):
  print("LOADING DATA", flush=True)
  sys.exit(3)
datasets.load_data = stop
from experiments import calibration
calibration.define_flags()
sys.argv = ["calibration"] + sys.argv[1:]
app.run(calibration.main)
"""


def test_without_an_accelerator_the_calibration_says_so_before_any_work(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, "-c", _STOP_AT_DATA, "--preset=gpu",
       f"--workdir={tmp_path / 'w'}"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 3, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[-1] == "LOADING DATA"
  assert [l for l in lines[:-1] if "JAX sees no GPU or TPU (backend cpu)" in l], proc.stdout
