"""One provenance schema for every row (attention_jax/measure/provenance.py):
each kind of row the code writes carries the whole record, and every row
committed under results/ records a commit, versions and a machine in some
form, but for the files named here with the reason they do not."""

import glob
import json
import os
import re
import subprocess

import pytest

from attention_jax.measure import benchmarking
from attention_jax.measure import compile_device
from attention_jax.measure import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# A copy of the tree without `.git` and without ATTENTION_JAX_COMMIT (as
# sent to a device machine) knows no commit: every other field still counts.
_COMMIT_KNOWABLE = (provenance.git_state(ROOT) != (None, None)
                    or bool(os.environ.get(provenance.COMMIT_VARIABLE)))


def _assert_schema(rec):
  found = provenance.problems(rec)
  if not _COMMIT_KNOWABLE:
    found = [p for p in found if p != "`commit` is not known"]
  assert found == [], rec
  assert set(rec) == set(provenance.FIELDS)  # every field, none other


# ---------------------------------------------------------------------------
# The rows the code writes today, built cheaply through each writer's own path.


def test_a_training_result_row_carries_the_schema(tmp_path):
  """The runner stamps each result.json row (`provenance.stamp`); the
  report's results.jsonl keeps it."""
  from attention_jax.analysis import reports  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import runner  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  cfg = config.from_preset("smoke").replace(arms=("additive",), dims=(8,), seeds=2)
  arm = config.Arm.of("additive", 8)
  run_dir = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run_dir.path)
  with open(run_dir.config, "w") as f:
    json.dump(workdir_lib.fingerprint(cfg, arm), f)
  rows = [{"arm": "additive", "dim": 8, "seed": s, "test_bleu": 10.0 + s, "val_ppl": 5.0,
           "params": 100, "steps": cfg.steps, "diagnostics": {}} for s in (0, 1)]
  with open(run_dir.result, "w") as f:
    json.dump([provenance.stamp(r) for r in rows], f)
  runner.report_only(cfg, str(tmp_path), report=reports.write)
  written = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
  assert len(written) == 2
  for row in written:
    _assert_schema(row[provenance.KEY])


def test_a_compile_check_row_carries_the_schema_with_the_compilers_versions():
  rec = compile_device.row_provenance("python -m experiments.compile_check.run --target=h100")
  _assert_schema(rec)
  assert set(provenance.DISTRIBUTIONS) | set(compile_device.DISTRIBUTIONS) <= set(rec["versions"])
  assert rec["command"] == "python -m experiments.compile_check.run --target=h100"
  # the row's own device_kind is the target's; the record's is the compiling host's
  row = {"program": "p", "case": "c", "device_kind": "NVIDIA H100 80GB HBM3",
         provenance.KEY: rec}
  assert provenance.of(row) == rec


def test_a_kernel_benchmark_row_carries_the_schema_and_the_machine(tmp_path):
  from experiments.kernels import jsonl  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "benchmark.jsonl")
  machine = benchmarking.machine_description()
  with jsonl.appending(path, machine, "2026-11-30T00:00:00Z/1") as append:
    append({"suite": "kernels", "impl": "scaled_dot", "status": "ok"})
  (row,) = jsonl.read_rows(path)
  _assert_schema(row[provenance.KEY])
  # the top-level machine fields (resumption's key) are the record's own
  assert {k: row[k] for k in jsonl.MACHINE_FIELDS} == {
      k: provenance.machine(row[provenance.KEY])[k] for k in jsonl.MACHINE_FIELDS}


def test_the_calibration_json_carries_the_schema():
  # experiments/calibration.py writes `provenance.fields()` under "provenance".
  _assert_schema(json.loads(json.dumps({"provenance": provenance.fields()}))["provenance"])


def test_init_logits_rows_carry_the_schema(tmp_path):
  from experiments.init_logits import run as init_logits  # pylint: disable=g-import-not-at-top
  committed = os.path.join(ROOT, "results", "init_logits", "premise_grid", "results.jsonl")
  rows = [{k: v for k, v in json.loads(line).items() if k != provenance.KEY}
          for line in open(committed, encoding="utf-8")]
  init_logits.write_outputs(str(tmp_path), rows)
  written = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
  assert len(written) == len(rows)
  for row in written:
    _assert_schema(row[provenance.KEY])


def test_the_threshold_reports_analysis_carries_the_schema():
  from experiments.lr_threshold import report  # pylint: disable=g-import-not-at-top
  made = report.analysed_at(ROOT)
  _assert_schema(made)
  assert (made["commit"], made["dirty"]) == provenance.git_state(ROOT) or (
      provenance.git_state(ROOT) == (None, None))


def test_cpu_efficiency_rows_carry_the_schema(tmp_path):
  from experiments.cpu_efficiency import run as cpu_run  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "rows.jsonl")
  cpu_run.append_rows(path, [{"kind": "matmul_peak", **benchmarking.machine_description()}])
  (row,) = [json.loads(line) for line in open(path)]
  _assert_schema(row[provenance.KEY])
  assert row["jax_version"] == row[provenance.KEY]["versions"]["jax"]


# ---------------------------------------------------------------------------
# The schema's own parts.


def test_extra_distributions_and_a_named_command_change_nothing_else():
  base = provenance.fields()
  more = provenance.fields(["libtpu", "no-such-distribution"], command="python -m x --a=1")
  assert more["versions"] == {**base["versions"], "libtpu": more["versions"]["libtpu"],
                              "no-such-distribution": None}
  assert more["command"] == "python -m x --a=1"
  assert {k: v for k, v in more.items() if k not in ("versions", "command")} == {
      k: v for k, v in base.items() if k not in ("versions", "command")}
  assert provenance.fields() == base  # the process's record is not changed


def test_machine_names_jaxs_device_kind_where_the_record_names_the_cpu():
  rec = provenance.record(commit="c", dirty=False, versions={"jax": "0.10.2"}, platform="cpu",
                          device_kind="AMD EPYC 7B13", command="python", device_count=1,
                          cpu="AMD EPYC 7B13", cpu_cores=2)
  assert provenance.machine(rec) == {"platform": "cpu", "device_kind": "cpu", "device_count": 1,
                                     "cpu": "AMD EPYC 7B13", "cpu_cores": 2,
                                     "jax_version": "0.10.2"}
  gpu = dict(rec, platform="gpu", device_kind="NVIDIA H200")
  assert provenance.machine(gpu)["device_kind"] == "NVIDIA H200"
  live = benchmarking.machine_description()
  assert live["device_kind"] == __import__("jax").devices()[0].device_kind


def test_problems_name_each_field_that_is_not_the_schemas():
  rec = {**provenance.fields(), "commit": "0123abcd"}
  assert provenance.problems(rec) == []
  assert provenance.problems({**rec, "cpu_cores": True}) == [
      "`cpu_cores` is True, not <class 'int'>"]
  assert provenance.problems({k: v for k, v in rec.items() if k != "date"}) == [
      "`date` is missing"]
  assert provenance.problems({**rec, "commit": "unknown"}) == ["`commit` is not known"]
  assert provenance.problems({**rec, "date": "yesterday"}) == [
      "`date` 'yesterday' is not %Y-%m-%dT%H:%M:%SZ"]


@pytest.mark.parametrize("row, want", [
    # the compile check's rows before `provenance`: a `SHA+dirty` commit; the
    # row's device_kind is the target's, its host is `host_cpu`
    ({"program": "p", "target": "h100", "device_kind": "NVIDIA H100 80GB HBM3",
      "commit": "abc123+dirty", "versions": {"jax": "0.11.2"}, "command": "python -m c",
      "date": "2026-11-25T14:06:24Z", "host_cpu": "Intel(R) Xeon(R) Processor"},
     dict(commit="abc123", dirty=True, versions={"jax": "0.11.2"}, platform=None,
          device_kind=None, cpu="Intel(R) Xeon(R) Processor", command="python -m c",
          date="2026-11-25T14:06:24Z")),
    # the first init-logits rows: versions as jax_version / flax_version
    ({"score": "dot", "commit": "9b2e", "dirty": False, "jax_version": "0.10.2",
      "flax_version": "0.12.8", "platform": "cpu (Linux)", "cpu": "Xeon", "cpu_cores": 2,
      "xla_flags": "", "command": "python -m i"},
     dict(commit="9b2e", dirty=False, versions={"jax": "0.10.2", "flax": "0.12.8"},
          platform="cpu (Linux)", device_kind=None, cpu="Xeon", cpu_cores=2, xla_flags="",
          command="python -m i")),
    # the first kernel benchmark rows: the machine only; on CPU the CPU model
    ({"suite": "kernels", "platform": "cpu", "device_kind": "cpu", "cpu": "Xeon",
      "cpu_cores": 2},
     dict(commit=None, dirty=None, versions={}, platform="cpu", device_kind="Xeon", cpu="Xeon",
          cpu_cores=2, command=None)),
    # the first training rows: nothing
    ({"arm": "additive", "dim": 8, "test_bleu": 1.0},
     dict(commit=None, dirty=None, versions={}, platform=None, device_kind=None,
          command=None)),
])
def test_of_reads_the_older_top_level_layouts(row, want):
  assert provenance.of(row) == provenance.record(**want)


def test_the_commit_label_is_the_compile_checks_word():
  assert provenance.commit_label(provenance.of({"target": "t", "commit": "abc+dirty"})) == (
      "abc+dirty")
  assert provenance.commit_label({"commit": "abc", "dirty": False}) == "abc"
  assert provenance.commit_label({"commit": "abc", "dirty": None}) == "abc"


# ---------------------------------------------------------------------------
# The committed rows.

# The committed JSON files that are no rows of results, by kind: what each is,
# and why it has no provenance of its own.
NOT_ROWS = (
    (r"(^|/)metrics(/[^/]+)?\.jsonl$",
     "a run's log of training steps; the run's result rows record its provenance"),
    (r"/runs/[^/]+/config\.json$",
     "a run's settings, compared when it resumes: provenance is kept out of them on purpose"),
    (r"/runs/[^/]+/attention\.json$", "a run's attention weights, for the figures"),
    (r"/runs/[^/]+/significance\.json$",
     "the paired test of a run against its baseline, computed from the result rows"),
    (r"/runs/[^/]+/checkpoints_sha256/\d+\.json$", "the hashes of a run's checkpoints"),
    (r"^results/gpu_h200/2026-11-28/sweep_\w+_config\.json$",
     "a copy of one run's settings, beside its log"),
)

_LR_CPU_RUNS = [f"results/lr_cpu/learning_rate={lr}/runs/{arm}_d{dim}/result.json"
                for lr in ("0.0003", "0.001", "0.003")
                for arm in ("additive", "multiplicative", "scaled_multiplicative", "qk_norm")
                for dim in (128, 1024)]
_BEFORE_ROWS_CARRIED_IT = ("trained before result rows carried provenance (d5c6a11, "
                           "2026-11-24); the folder's README names the code and machine")
_BEFORE_CALIBRATION_CARRIED_IT = ("calibrated before calibration.json carried provenance "
                                  "(77d43da); the folder's README names the commit and device")
# The committed row files that lack some of commit / versions / machine:
# path -> (what is missing, why).
KNOWN_WITHOUT = {
    **{path: ({"commit", "versions", "machine"}, _BEFORE_ROWS_CARRIED_IT) for path in [
        "results/archive/quick_cpu_fa7146e/results.jsonl",
        "results/archive/quick_cpu_lr1e-3_3000steps/results.jsonl",
        "results/archive/quick_cpu_lr3e-3_2500steps/results.jsonl",
        "results/archive/quick_cpu_lr5e-3_2000steps/results.jsonl",
        "results/archive/warmup_cpu/round2/results.jsonl",
        "results/lr_cpu/results.jsonl",
        "results/lr_cpu/learning_rate=0.0003/results.jsonl",
        "results/lr_cpu/learning_rate=0.001/results.jsonl",
        "results/lr_cpu/learning_rate=0.003/results.jsonl",
        "results/transformer_cpu/pilot/lr2e-3/results.jsonl",
        *_LR_CPU_RUNS]},
    **{path: ({"commit", "versions"},
              "measured before benchmark rows carried provenance (2026-11-22, 64a7ad0): "
              "the rows name the machine only; the README names the code")
       for path in ["results/kernels/benchmark_cpu/benchmark.jsonl",
                    "results/kernels/benchmark_cpu/models/benchmark.jsonl",
                    "results/kernels/benchmark_cpu/models_base/benchmark.jsonl"]},
    **{path: ({"commit", "versions", "machine"}, _BEFORE_CALIBRATION_CARRIED_IT) for path in [
        "results/gpu_h200/2026-11-27/calibration_default.json",
        "results/gpu_h200/2026-11-27/calibration_members12.json",
        "results/gpu_h200/2026-11-27/calibration_no_command_buffers.json",
        "results/gpu_h200/2026-11-27/calibration_no_command_buffers_first_call.json",
        "results/gpu_h200/2026-11-27b/calibration_per_step_1.json",
        "results/gpu_h200/2026-11-27b/calibration_per_step_2.json"]},
}


def _committed_json_files() -> list[str]:
  """The JSON and JSON-lines files under results/ that git tracks (every one
  there, outside a git checkout)."""
  try:
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "results"],
                         capture_output=True, check=True, timeout=60).stdout.decode()
    paths = [p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]
  except (OSError, subprocess.SubprocessError):
    paths = [os.path.relpath(p, ROOT)
             for p in glob.glob(os.path.join(ROOT, "results", "**", "*"), recursive=True)]
  return sorted(p for p in paths if p.endswith((".json", ".jsonl")))


def _not_rows(path: str) -> str | None:
  """Why the file at `path` holds no rows of results; None if it does."""
  for pattern, why in NOT_ROWS:
    if re.search(pattern, path):
      return why
  return None


def _records(path: str) -> list[dict]:
  """The provenance each row of the file records (`provenance.of`); for a
  threshold report, its analysis's and the result rows' it read."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    if path.endswith(".jsonl"):
      values = [json.loads(line) for line in f if line.strip()]
    else:
      values = json.load(f)
  if isinstance(values, dict) and "analysed_at" in values:
    return [provenance.of({provenance.KEY: {**rows, **_known(values["analysed_at"])}})
            for rows in values["provenance"]] or [provenance.of(
                {provenance.KEY: values["analysed_at"]})]
  return [provenance.of(v) for v in (values if isinstance(values, list) else [values])]


def _known(rec: dict) -> dict:
  return {k: v for k, v in rec.items() if v is not None}


def _missing(rec: dict) -> set[str]:
  """Which of commit, versions and a machine (device kind or CPU) `rec` lacks."""
  missing = set()
  if rec.get("commit") in (None, "", provenance.UNKNOWN):
    missing.add("commit")
  if not any((rec.get("versions") or {}).values()):
    missing.add("versions")
  if not (rec.get("device_kind") or rec.get("cpu")):
    missing.add("machine")
  return missing


def test_every_committed_row_records_a_commit_versions_and_a_machine():
  files = _committed_json_files()
  assert len(files) > 100
  lacking = {}
  for path in files:
    if _not_rows(path):
      continue
    records = _records(path)
    assert records, f"{path} holds no rows"
    missing = set().union(*map(_missing, records))
    if missing:
      lacking[path] = missing
  # Exactly the files named, each lacking what it is said to lack: a file
  # that gains its fields, or a new file without them, shows here.
  assert lacking == {path: missing for path, (missing, _) in KNOWN_WITHOUT.items()}


def test_the_known_exceptions_are_committed_files_with_a_reason():
  files = set(_committed_json_files())
  assert [p for p in KNOWN_WITHOUT if p not in files] == []
  assert all(why for _, why in KNOWN_WITHOUT.values())
  # every kind of file that is no row is still there (a pattern matching none is stale)
  assert [p for p, _ in NOT_ROWS if not any(re.search(p, f) for f in files)] == []
