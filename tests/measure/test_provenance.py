"""Provenance of result rows (attention_jax/measure/provenance.py): the pure
parts, the process's record, and rows written before rows carried one."""

import glob
import json
import os
import subprocess

import jax
import pytest

from attention_jax.analysis import reports
from attention_jax.analysis import tables
from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.sweep import workdir as workdir_lib
from attention_jax import files
from attention_jax.measure import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = {"commit", "dirty", "versions", "platform", "device_kind", "device_count", "cpu",
          "cpu_cores", "command", "xla_flags", "date"}

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
"""
AMD = "processor : 0\nmodel name : AMD EPYC 7B13\n"


def test_record_has_every_field_and_unknown_commit():
  rec = provenance.record(commit=None, dirty=None, versions={"jax": "0.10.2"}, platform="cpu",
                          device_kind="AMD EPYC 7B13", command="python -m x --a=1")
  assert set(rec) == FIELDS
  assert rec["commit"] == "unknown" and rec["dirty"] is None
  assert rec["versions"] == {"jax": "0.10.2"}


@pytest.mark.parametrize("text,want", [(INTEL, "Intel(R) Xeon(R) Processor"),
                                       (AMD, "AMD EPYC 7B13"), ("", None),
                                       ("processor : 0\nmodel name :\n", None)])
def test_cpu_model_is_the_first_model_name(text, want):
  assert provenance.cpu_model(text) == want  # what provenance records on CPU


def test_device_name_is_the_cpu_model_on_cpu_only():
  assert provenance.device_name("cpu", "cpu", "AMD EPYC 7B13") == "AMD EPYC 7B13"
  assert provenance.device_name("cpu", "cpu", None) == "cpu"
  assert provenance.device_name("gpu", "NVIDIA H100 80GB HBM3", "AMD EPYC") == (
      "NVIDIA H100 80GB HBM3")


def test_command_line():
  argv = ["/x/experiments/ablation.py", "--preset=quick", "--workdir=runs/a b"]
  assert provenance.command_line(argv, "experiments.ablation") == (
      "python -m experiments.ablation --preset=quick '--workdir=runs/a b'")
  assert provenance.command_line(["/v/pytest/__main__.py", "-q"], "pytest.__main__") == (
      "python -m pytest -q")
  assert provenance.command_line(["-c", "--flag"], None) == "python -c ... --flag"
  assert provenance.command_line(["run.py", "x"], None) == "python run.py x"
  assert provenance.command_line([], None) == "python"


@pytest.mark.parametrize("text,want", [("abc123", ("abc123", None)),
                                       ("abc123-dirty", ("abc123", True)),
                                       (" ", (None, None)), ("", (None, None))])
def test_parse_commit_of_the_environment_variable(text, want):
  assert provenance.parse_commit(text) == want


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                  *args], check=True, capture_output=True)


def test_git_state_commit_and_dirty_flag(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "a.py").write_text("x = 1\n")
  _git(repo, "add", "a.py")
  _git(repo, "commit", "-q", "-m", "one")
  head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert provenance.git_state(str(repo)) == (head, False)
  (repo / "new.txt").write_text("untracked files do not count\n")
  assert provenance.git_state(str(repo)) == (head, False)
  (repo / "a.py").write_text("x = 2\n")
  assert provenance.git_state(str(repo)) == (head, True)
  (repo / "sub").mkdir()  # a folder inside a checkout is not the checkout's code
  assert provenance.git_state(str(repo / "sub")) == (None, None)
  assert provenance.git_state(str(tmp_path)) == (None, None)  # no checkout at all


def test_outside_a_checkout_the_commit_is_unknown_or_the_environments(tmp_path, monkeypatch):
  monkeypatch.setattr(provenance, "_source_root", lambda: str(tmp_path))
  monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
  rec = provenance.collect()
  assert (rec["commit"], rec["dirty"]) == ("unknown", None)
  monkeypatch.setenv(provenance.COMMIT_VARIABLE, "0123abcd-dirty")
  rec = provenance.collect()
  assert (rec["commit"], rec["dirty"]) == ("0123abcd", True)


def test_the_environments_commit_wins_over_the_checkouts(tmp_path, monkeypatch):
  # A tree copied to a device machine may carry a `.git` of an older commit.
  monkeypatch.setattr(provenance, "git_state", lambda root: ("feedface", True))
  monkeypatch.setenv(provenance.COMMIT_VARIABLE, "0123abcd")
  assert provenance.collect()["commit"] == "0123abcd"
  monkeypatch.delenv(provenance.COMMIT_VARIABLE)
  rec = provenance.collect()
  assert (rec["commit"], rec["dirty"]) == ("feedface", True)


def test_collect_records_the_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  assert provenance.collect()["xla_flags"] == "--xla_cpu_multi_thread_eigen=false"
  monkeypatch.delenv("XLA_FLAGS")
  assert provenance.collect()["xla_flags"] == ""


def test_fields_of_this_process_gathered_once():
  rec = provenance.fields()
  assert set(rec) == FIELDS
  assert set(rec["versions"]) == {"python", *provenance.DISTRIBUTIONS}
  assert rec["versions"]["jax"] == jax.__version__
  assert rec["platform"] == jax.default_backend()
  if rec["platform"] != "cpu":
    assert rec["device_kind"] == jax.devices()[0].device_kind
  assert rec["command"].startswith("python")
  if os.path.isdir(os.path.join(ROOT, ".git")) or os.path.isfile(os.path.join(ROOT, ".git")):
    assert len(rec["commit"]) == 40 and isinstance(rec["dirty"], bool)
  rec["versions"]["jax"] = "changed"  # a copy: the next row is not affected
  assert provenance.fields()["versions"]["jax"] == jax.__version__
  assert provenance._cached.cache_info().misses <= 1  # pylint: disable=protected-access
  row = provenance.stamp({"arm": "additive"})
  assert row["arm"] == "additive" and provenance.of(row) == provenance.fields()


def _committed(pattern):
  rows = []
  for path in glob.glob(os.path.join(ROOT, "results", "**", pattern), recursive=True):
    with open(path, encoding="utf-8") as f:
      rows += [json.loads(line) for line in f if line.strip()]
  return rows


def test_rows_written_before_provenance_still_load_and_report(tmp_path):
  old = [r for r in _committed("results.jsonl") if "arm" in r and "test_bleu" in r]
  assert old, "no committed ablation rows found under results/"
  assert {provenance.of(r)["commit"] for r in old if provenance.KEY not in r} <= {"unknown"}
  new = provenance.stamp({**old[0], "seed": 99})
  rows = old + [new]
  arms = sorted({r["arm"] for r in rows})
  dims = sorted({r["dim"] for r in rows})
  assert "| dim |" in tables.britz_table(rows, arms, dims)
  files.write_jsonl(str(tmp_path / "results.jsonl"), rows)
  back = [json.loads(l) for l in open(tmp_path / "results.jsonl")]
  assert provenance.of(back[-1]) == provenance.fields()
  assert sum(provenance.KEY in r for r in back) == 1 + sum(provenance.KEY in r for r in old)


def test_benchmark_rows_before_provenance_still_report():
  from experiments.kernels import report  # pylint: disable=g-import-not-at-top
  rows = _committed("benchmark.jsonl")
  assert rows, "no committed benchmark rows found under results/"
  rows = rows + [provenance.stamp(rows[0])]
  machine = {"cpu": "c", "cpu_cores": 2, "jax_version": "v", "platform": "cpu",
             "device_kind": "cpu"}
  assert report.markdown_tables(rows, machine, "--preset=tiny").startswith("Command:")


def test_an_old_workdir_reports_and_provenance_is_not_a_setting(tmp_path):
  """A finished run whose result.json has no provenance is a finished run:
  its folder's settings still match, and the reports hold its rows."""
  cfg = config.from_preset("smoke").replace(arms=("additive",), dims=(8,), seeds=2)
  arm = config.Arm.of("additive", 8)
  fp = workdir_lib.fingerprint(cfg, arm)
  assert provenance.KEY not in fp
  run_dir = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run_dir.path)
  with open(run_dir.config, "w") as f:
    json.dump(fp, f)
  old_rows = [{"arm": "additive", "dim": 8, "seed": s, "test_bleu": 10.0 + s, "val_ppl": 5.0,
               "params": 100, "steps": cfg.steps, "diagnostics": {}} for s in (0, 1)]
  with open(run_dir.result, "w") as f:
    json.dump(old_rows, f)
  assert workdir_lib.check_run(run_dir, fp, write=False) is None
  table = runner.report_only(cfg, str(tmp_path), report=reports.write)
  assert "10.50" in table
  rows = [json.loads(l) for l in open(tmp_path / "results.jsonl")]
  assert [r["seed"] for r in rows] == [0, 1]
  assert all(provenance.of(r)["commit"] == "unknown" for r in rows)
