"""Fault injection: concurrent starts, damaged checkpoints, deleted
logs, interrupted writes, full disks. Each test damages something the way a
careless user or an unlucky machine would and asserts nothing is lost and
nothing wrong is read."""

import gzip
import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax.sweep import config
from attention_jax.training import checkpoints
from attention_jax import files
from attention_jax.training import metrics_log
from attention_jax.training import run_folder

from attention_jax.analysis import reports
from attention_jax.sweep import runner
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.sweep import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- item 1: one driver per workdir ---------------------------------------------

def test_a_second_live_holder_is_refused_naming_the_first(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import sys, time
          from attention_jax.sweep import workdir_lock
          with workdir_lock.WorkdirLock({str(tmp_path)!r}):
            print("locked", flush=True)
            sys.stdin.readline()
          """)],
      cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdir_lock.WorkdirBusyError) as info:
      workdir_lock.WorkdirLock(str(tmp_path), log=lambda _: None).acquire()
    message = str(info.value)
    assert str(tmp_path) in message and f"PID {holder.pid}" in message and "started" in message
  finally:
    holder.communicate("\n", timeout=60)
  # Released: the next one takes it without a word about a stale lock.
  lines = []
  with workdir_lock.WorkdirLock(str(tmp_path), log=lines.append):
    pass
  assert lines == []


def test_the_lock_of_a_killed_process_is_taken_over_and_said_so(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-c", textwrap.dedent(f"""
          import os, signal
          from attention_jax.sweep import workdir_lock
          workdir_lock.WorkdirLock({str(tmp_path)!r}).acquire()
          os.kill(os.getpid(), signal.SIGKILL)
          """)], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == -9
  dead = json.load(open(tmp_path / workdir_lock.LOCK_NAME))["pid"]
  lines = []
  with workdir_lock.WorkdirLock(str(tmp_path), log=lines.append):
    assert json.load(open(tmp_path / workdir_lock.LOCK_NAME))["pid"] == os.getpid()
  assert len(lines) == 1 and f"PID {dead}" in lines[0] and "took over" in lines[0]


# End to end (two drivers, ~16-30 s on 2 cores): the refusal itself is checked in
# the default suite by test_a_second_live_holder_is_refused_naming_the_first.
@pytest.mark.slow
def test_two_ablations_on_one_workdir_the_second_refuses_at_once(tmp_path):
  workdir = str(tmp_path / "w")
  flags = ["--preset=smoke", "--arms=additive", "--dims=8", "--steps=400",
           "--checkpoint_every=400", "--eval_every=400", f"--workdir={workdir}"]
  first = subprocess.Popen([sys.executable, "-m", "experiments.ablation", *flags], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    assert "parameters" in first.stdout.readline()  # the first holds the lock and trains
    second = subprocess.run([sys.executable, "-m", "experiments.ablation", *flags], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode != 0
    err = [l for l in second.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and workdir in err[0] and f"PID {first.pid}" in err[0], second.stderr
  finally:
    first.kill()
    first.wait()


@pytest.mark.parametrize("content", ["null", "[1, 2]", '"me"', "{", "\x00\x00"])
def test_a_lock_file_holding_no_holder_is_taken_as_a_released_one(tmp_path, content):
  # Left by a hand or a crash: no PID to name, so a plain take-over.
  (tmp_path / workdir_lock.LOCK_NAME).write_text(content)
  lines = []
  with workdir_lock.WorkdirLock(str(tmp_path), log=lines.append):
    assert json.load(open(tmp_path / workdir_lock.LOCK_NAME))["pid"] == os.getpid()
  assert lines == []


# --- item 3: interrupted writes, deleted logs, file modes ------------------------

def test_atomic_write_gives_the_mode_of_a_plain_open_not_0600(tmp_path):
  old = os.umask(0o022)
  try:
    files.atomic_write(str(tmp_path / "a.md"), "x")
    files.atomic_write(str(tmp_path / "b.png"), b"\x89PNG")
    with open(tmp_path / "plain", "w"):
      pass
  finally:
    os.umask(old)
  modes = {p: os.stat(tmp_path / p).st_mode & 0o777 for p in ("a.md", "b.png", "plain")}
  assert modes == {"a.md": 0o644, "b.png": 0o644, "plain": 0o644}
  assert open(tmp_path / "b.png", "rb").read() == b"\x89PNG"


def test_leftovers_of_killed_writes_are_removed_but_checkpoints_untouched(tmp_path):
  (tmp_path / "runs" / "x" / "checkpoints").mkdir(parents=True)
  stale = [tmp_path / ".tmp-table.mdab12", tmp_path / "runs" / "x" / ".tmp-result.json9"]
  orbax_own = tmp_path / "runs" / "x" / "checkpoints" / ".tmp-keep"
  for p in stale + [orbax_own, tmp_path / "table.md"]:
    p.write_text("half")
  removed = files.remove_stale_temporaries(str(tmp_path))
  assert sorted(removed) == sorted(map(str, stale))
  assert orbax_own.exists() and (tmp_path / "table.md").exists()


def test_a_metrics_log_deleted_mid_run_is_rewritten_in_full_with_a_warning(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  lines = []
  log = metrics_log.MetricsLog(path, log=lines.append)
  log.truncate_after(0)
  for step in range(1, 7):
    log.append({"step": step})
  os.remove(path)  # a user tidying up
  log.append({"step": 7})
  assert [r["step"] for r in log.read()] == list(range(1, 8))
  with open(path, "w") as f:  # or truncating it
    f.write('{"step": 1}\n')
  log.append({"step": 8})
  assert [r["step"] for r in log.read()] == list(range(1, 9))
  assert len(lines) == 2 and all("rewrote" in line and path in line for line in lines)
  log.append({"step": 9})  # intact again: a plain append, no new warning
  assert len(lines) == 2 and len(log.read()) == 9


def _refuse(constant):
  raise ValueError(f"not JSON: {constant}")


def test_non_finite_numbers_are_written_as_null_in_every_row(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "seed": 0, "loss": NaN}\n')  # as an older version wrote it
  log = metrics_log.MetricsLog(str(path), log=lambda _: None)
  log.truncate_after(5)
  log.append({"step": 2, "seed": 0, "loss": float("nan"), "max_logit": float("inf"),
              "diagnostics": {"entropy": -float("inf"), "saturated": np.float32("nan")}})
  lines = path.read_text().splitlines()
  assert [json.loads(line, parse_constant=_refuse) for line in lines] == [
      {"step": 1, "seed": 0, "loss": None},
      {"step": 2, "seed": 0, "loss": None, "max_logit": None,
       "diagnostics": {"entropy": None, "saturated": None}}]
  rows = [{"arm": "additive", "val_ppl": float("nan"), "test_bleu": 1.5}]
  files.write_jsonl(str(tmp_path / "results.jsonl"), rows)
  (line,) = (tmp_path / "results.jsonl").read_text().splitlines()
  assert json.loads(line, parse_constant=_refuse) == {"arm": "additive", "val_ppl": None,
                                                      "test_bleu": 1.5}
  assert files.to_json({"a": [1.0, float("-inf")]}) == '{"a": [1.0, null]}'


# --- item 8: checkpoints carry checksums ------------------------------------------

def _saved(tmp_path, steps=(1, 2)):
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ckpt"))
  for step in steps:
    ckpt.save(step, {"w": jnp.full((64, 64), float(step))}, {"step": step})
  return ckpt


def _largest_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage", ["flip_bytes", "truncate_all", "truncate_largest"])
def test_a_damaged_newest_checkpoint_is_named_set_aside_and_the_previous_used(
    tmp_path, damage):
  _saved(tmp_path)
  step_dir = tmp_path / "ckpt" / "2"
  if damage == "flip_bytes":
    path = _largest_file(step_dir)
    data = bytearray(open(path, "rb").read())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    open(path, "wb").write(bytes(data))
  else:
    files = ([_largest_file(step_dir)] if damage == "truncate_largest" else
             [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs])
    for path in files:
      os.truncate(path, os.path.getsize(path) // 2)
  lines = []
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ckpt"))
  arrays, meta = ckpt.restore_latest({"w": jnp.zeros((64, 64))}, log=lines.append)
  assert meta == {"step": 1} and float(arrays["w"][0, 0]) == 1.0
  assert len(lines) == 1 and "step 2" in lines[0] and "damaged" in lines[0]
  assert os.path.isdir(tmp_path / "ckpt_damaged" / "2") and not step_dir.exists()
  ckpt.save(3, {"w": jnp.full((64, 64), 3.0)}, {"step": 3})  # training goes on
  assert ckpt.restore_latest({"w": jnp.zeros((64, 64))})[1] == {"step": 3}


def _flip_bytes(path):
  data = bytearray(open(path, "rb").read())
  mid = len(data) // 2
  data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
  open(path, "wb").write(bytes(data))


def test_a_step_without_checksums_is_never_preferred_to_a_verified_one(tmp_path):
  # Killed between Orbax's commit of step 2 and its checksum file, then damaged:
  # read as it is, the damage would be trained on.
  _saved(tmp_path)
  os.remove(tmp_path / "ckpt_sha256" / "2.json")
  _flip_bytes(_largest_file(tmp_path / "ckpt" / "2"))
  lines = []
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ckpt"))
  arrays, meta = ckpt.restore_latest({"w": jnp.zeros((64, 64))}, log=lines.append)
  assert meta == {"step": 1} and np.all(np.asarray(arrays["w"]) == 1.0)
  assert len(lines) == 1 and "step 2" in lines[0] and "no checksum file" in lines[0]
  assert "using verified step 1" in lines[0] and str(tmp_path / "ckpt") in lines[0]
  assert os.path.isdir(tmp_path / "ckpt_damaged" / "2")
  ckpt.save(2, {"w": jnp.full((64, 64), 2.0)}, {"step": 2})  # training reaches it again
  assert ckpt.restore_latest({"w": jnp.zeros((64, 64))})[1] == {"step": 2}


def test_a_step_without_checksums_is_used_only_if_no_verified_step_is_intact(tmp_path):
  _saved(tmp_path)
  os.remove(tmp_path / "ckpt_sha256" / "2.json")
  os.truncate(_largest_file(tmp_path / "ckpt" / "1"), 1)  # the verified step is damaged
  lines = []
  arrays, meta = checkpoints.Checkpointer(str(tmp_path / "ckpt")).restore_latest(
      {"w": jnp.zeros((64, 64))}, log=lines.append)
  assert meta == {"step": 2} and np.all(np.asarray(arrays["w"]) == 2.0)
  assert len(lines) == 2 and "step 1" in lines[0] and "damaged" in lines[0]
  assert lines[1].startswith("warning:") and "step 2" in lines[1] and "unverified" in lines[1]


def test_checksums_follow_orbax_retention_and_intact_restores_say_nothing(tmp_path):
  ckpt = _saved(tmp_path, steps=(1, 2, 3))
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["2", "3"]
  assert sorted(n for n in os.listdir(tmp_path / "ckpt_sha256") if n.endswith(".json")) == [
      "2.json", "3.json"]
  lines = []
  arrays, meta = ckpt.restore_latest({"w": jnp.zeros((64, 64))}, log=lines.append)
  assert meta == {"step": 3} and np.all(np.asarray(arrays["w"]) == 3.0) and lines == []


def test_every_checkpoint_damaged_starts_over_and_says_so(tmp_path):
  _saved(tmp_path)
  for step in ("1", "2"):
    path = _largest_file(tmp_path / "ckpt" / step)
    os.truncate(path, 1)
  lines = []
  assert checkpoints.Checkpointer(str(tmp_path / "ckpt")).restore_latest(
      {"w": jnp.zeros((64, 64))}, log=lines.append) is None
  assert len(lines) == 3 and "starts from step 0" in lines[-1]


def test_a_damaged_checksum_file_is_named_and_the_previous_step_used(tmp_path):
  _saved(tmp_path)
  sums = tmp_path / "ckpt_sha256" / "2.json"
  sums.write_text('{"manifest.ocdbt": ')
  lines = []
  arrays, meta = checkpoints.Checkpointer(str(tmp_path / "ckpt")).restore_latest(
      {"w": jnp.zeros((64, 64))}, log=lines.append)
  assert meta == {"step": 1} and len(lines) == 1 and "step 2" in lines[0]
  assert "checksum file" in lines[0] and "unreadable" in lines[0]


# --- damaged JSON files of a workdir ----------------------------------------------

_ARMS = ("additive", "multiplicative")


def _finished_workdir(tmp_path):
  """A workdir of two finished runs (arms `_ARMS`, dim 8, 2 seeds of 3 test
  sentences), written by hand as the sweep writes them."""
  cfg = config.from_preset("smoke", arms=_ARMS, dims=(8,))
  workdir = str(tmp_path / "w")
  refs = ["a b c d", "e f g h", "i j k l"]
  for arm in _ARMS:
    run_dir = workdir_lib.Workdir(workdir).run(config.Arm.of(arm, 8))
    os.makedirs(run_dir.path)
    workdir_lib.check_run(run_dir, workdir_lib.fingerprint(cfg, config.Arm.of(arm, 8)))
    rows = [{"arm": arm, "dim": 8, "seed": seed, "params": 1000, "steps": cfg.steps,
             "test_bleu": 10.0 + seed, "val_bleu": 9.0, "val_ppl": 3.0,
             "diverged_at_step": None, "diagnostics": {}} for seed in (0, 1)]
    files = {"result.json": rows,
             "attention.json": {"src": ["a", "</s>"], "hyp": ["a", "</s>"],
                                "weights": [[1.0, 0.0], [0.0, 1.0]]},
             "test_translations.json": {"references": refs, "hypotheses": [refs, refs]}}
    for name, value in files.items():
      with open(os.path.join(run_dir.path, name), "w") as f:
        json.dump(value, f)
  return cfg, workdir


def test_the_hand_made_finished_workdir_reports(tmp_path, capsys):
  cfg, workdir = _finished_workdir(tmp_path)
  table = runner.report_only(cfg, workdir, report=reports.write)
  assert "10.50 ± 0.71 (11.00)" in table and "+0.00 (p = 1.000)" in table
  # The significance test says what it computes, and when it is done.
  out = capsys.readouterr().out.splitlines()
  lines = [l for l in out if l.startswith("significance:")]
  name = f"significance: {_ARMS[1]}_d8 against {_ARMS[0]}_d8"
  assert len(lines) == 2 and lines[0].startswith(name + ", 3 sentences, 10,000 paired")
  assert lines[1].startswith(name + " done in ") and lines[1].endswith(" s")
  runner.report_only(cfg, workdir, report=reports.write)  # cached: computes nothing, says nothing
  assert "significance:" not in capsys.readouterr().out


@pytest.mark.parametrize("name,damage", [
    ("config.json", '{"arm": "additive", '),           # cut
    ("result.json", "\x00" * 16),                     # zeroed by a crash
    ("result.json", '{"seed": 0}'),                    # JSON, but not the rows
    ("attention.json", "[1, 2"),
    ("test_translations.json", b"\xff\xfe garbage"),         # not even text
])
def test_a_damaged_json_file_of_a_run_is_named_in_one_line(tmp_path, name, damage):
  cfg, workdir = _finished_workdir(tmp_path)
  path = os.path.join(workdir, "runs", "multiplicative_d8", name)
  with open(path, "wb") as f:
    f.write(damage if isinstance(damage, bytes) else damage.encode())
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert path in message and "damaged" in message and "\n" not in message
  if name == "config.json":  # and the driver says so in one line
    proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                           f"--arms={','.join(_ARMS)}", "--dims=8", "--report_only",
                           f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True)
    _one_line_failure(proc, path, "damaged")


def _gzip_translations(workdir: str) -> None:
  """Every run's test_translations.json replaced by its .json.gz, as the
  runs committed under results/ keep them."""
  for arm in _ARMS:
    path = os.path.join(workdir, "runs", f"{arm}_d8", "test_translations.json")
    with open(path, "rb") as f:
      data = f.read()
    with open(path + ".gz", "wb") as f:
      f.write(gzip.compress(data, mtime=0))
    os.remove(path)


def test_gzipped_translations_report_alike_and_keep_the_significance_cache(tmp_path, capsys):
  cfg, workdir = _finished_workdir(tmp_path)
  table = runner.report_only(cfg, workdir, report=reports.write)
  assert "significance:" in capsys.readouterr().out  # computed and cached
  _gzip_translations(workdir)
  # The same table, and the cache still holds: its digest is of the JSON text,
  # whichever file holds it, so nothing is computed again.
  assert runner.report_only(cfg, workdir, report=reports.write) == table
  assert "significance:" not in capsys.readouterr().out


@pytest.mark.parametrize("damage,needle", [
    (lambda data: data[: len(data) // 2], "not gzip"),                 # cut
    (lambda data: b"plain text, not gzip", "not gzip"),
    (lambda data: gzip.compress(b'{"references": 3'), "not JSON"),     # gzip of bad JSON
])
def test_damaged_gzipped_translations_are_named_in_one_line(tmp_path, damage, needle):
  cfg, workdir = _finished_workdir(tmp_path)
  _gzip_translations(workdir)
  path = os.path.join(workdir, "runs", "multiplicative_d8", "test_translations.json.gz")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(damage(data))
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert path in message and "damaged" in message and needle in message
  assert "\n" not in message


def _cut_translations(value):
  """The last test sentence gone from the references and every member's
  outputs alike: a file that is whole JSON, consistent in itself, of
  another test set than the baseline's."""
  return {"references": value["references"][:-1],
          "hypotheses": [h[:-1] for h in value["hypotheses"]]}


@pytest.mark.parametrize("name,change,needle", [
    ("result.json", lambda rows: [1, 2], "row 0 is an integer"),
    ("result.json", lambda rows: [], "holds no rows"),
    ("result.json", lambda rows: [rows[0], {**rows[1], "test_bleu": "abc"}],
     "row 1: `test_bleu` is 'abc'"),
    ("result.json", lambda rows: [{**rows[0], "seed": None}], "`seed` is None"),
    ("test_translations.json", lambda v: {**v, "hypotheses": [v["hypotheses"][0], ["x"]]},
     "member 1 has 1 hypotheses for 3 references"),
    ("test_translations.json", lambda v: {**v, "references": "abc"}, "`references`"),
    ("test_translations.json", _cut_translations, "a different number of references (3 and 2)"),
])
def test_a_run_file_of_the_wrong_shape_is_named_in_one_line(tmp_path, name, change, needle):
  # Each was a traceback, an error naming no file ("scored on different
  # references"), or (`[]`) a '–' in the table beside a significance row.
  cfg, workdir = _finished_workdir(tmp_path)
  path = os.path.join(workdir, "runs", "multiplicative_d8", name)
  with open(path) as f:
    value = change(json.load(f))
  with open(path, "w") as f:
    json.dump(value, f)
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert path in message and needle in message and "\n" not in message
  if needle.startswith("a different number"):  # both files named: either may be the cut one
    assert os.path.join(workdir, "runs", "additive_d8", name) in message
  if value == [1, 2]:  # and the driver says so in one line
    proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                           f"--arms={','.join(_ARMS)}", "--dims=8", "--report_only",
                           f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True)
    _one_line_failure(proc, path, "damaged")


def test_a_non_finite_number_in_a_result_row_is_refused_unless_the_row_diverged(tmp_path):
  # A bare NaN test BLEU (an older writer's, `json.dump`'s default) was a
  # number to the table: `nan ± nan (nan)`, exit 0.
  cfg, workdir = _finished_workdir(tmp_path)
  path = os.path.join(workdir, "runs", "multiplicative_d8", "result.json")
  rows = json.load(open(path))
  with open(path, "w") as f:
    json.dump([rows[0], {**rows[1], "test_bleu": float("nan")}], f)
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert path in message and "row 1: `test_bleu` is nan, not a finite number" in message
  assert "\n" not in message
  # In a row that records its divergence the NaN is what divergence left:
  # read as null, the member counted as diverged, never as a number.
  with open(path, "w") as f:
    json.dump([rows[0], {**rows[1], "test_bleu": float("nan"), "val_ppl": float("inf"),
                         "diverged_at_step": 5}], f)
  table = runner.report_only(cfg, workdir, report=reports.write)
  assert "nan" not in table and "inf" not in table
  assert "10.00 ± 0.00 (10.00), diverged (1 of 2 seeds)" in table
  assert run_folder.RunDir(os.path.dirname(path)).rows()[1]["test_bleu"] is None


def test_translations_kept_both_plain_and_gzipped_are_refused_where_they_differ(tmp_path):
  # The plain file won, silently: a report could compare outputs other than
  # those of the run's result.json.
  cfg, workdir = _finished_workdir(tmp_path)
  table = runner.report_only(cfg, workdir, report=reports.write)
  run = run_folder.RunDir(os.path.join(workdir, "runs", "multiplicative_d8"))
  with open(run.translations, "rb") as f:
    data = f.read()
  other = data.replace(b'"i j k l"]]', b'"i j k x"]]')
  assert other != data
  with open(run.translations_gz, "wb") as f:
    f.write(gzip.compress(other, mtime=0))
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert run.translations in message and run.translations_gz in message
  assert "differ" in message and "\n" not in message
  # The same outputs twice: nothing to choose between.
  with open(run.translations_gz, "wb") as f:
    f.write(gzip.compress(data, mtime=0))
  assert runner.report_only(cfg, workdir, report=reports.write) == table


@pytest.mark.parametrize("steps", ['"20"', "null", "true", "[20]"])
def test_a_setting_of_the_wrong_kind_in_config_json_is_named_in_one_line(tmp_path, steps):
  # Compared as it is, "20" or null was a TypeError 34 lines deep in the
  # resume rules (a string is not an integer number of steps).
  cfg, workdir = _finished_workdir(tmp_path)
  path = os.path.join(workdir, "runs", "multiplicative_d8", "config.json")
  settings = json.load(open(path))
  settings["steps"] = json.loads(steps)
  with open(path, "w") as f:
    json.dump(settings, f)
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert path in message and "damaged" in message and "`steps`" in message
  assert "\n" not in message
  # A number where the field is a float is no damage: JSON writes 1.0 as 1.0,
  # but a hand may write 1.
  settings["steps"], settings["label_smoothing"] = cfg.steps, 0
  with open(path, "w") as f:
    json.dump(settings, f)
  assert "10.50" in runner.report_only(cfg, workdir, report=reports.write)


def test_a_file_where_the_checkpoints_folder_belongs_is_refused_before_training(tmp_path):
  # Orbax reported it from a worker thread (~40 lines of traceback) after the
  # first steps were trained.
  for name in ("ckpt", "ckpt_sha256", "ckpt_damaged"):
    (tmp_path / name).write_text("not a folder")
    with pytest.raises(ValueError) as info:
      checkpoints.Checkpointer(str(tmp_path / "ckpt"))
    assert str(tmp_path / name) in str(info.value) and "\n" not in str(info.value)
    os.remove(tmp_path / name)


# End to end (a driver, ~13-18 s on 2 cores): the refusal before training is
# checked in the default suite by the test above.
@pytest.mark.slow
def test_a_file_where_the_checkpoints_folder_belongs_is_one_line_from_the_driver(tmp_path):
  workdir = tmp_path / "w"
  (workdir / "runs" / "additive_d8").mkdir(parents=True)
  blocker = workdir / "runs" / "additive_d8" / "checkpoints"
  blocker.write_text("")
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         "--arms=additive", "--dims=8", "--steps=4", "--eval_every=4",
                         f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  _one_line_failure(proc, "error:", str(blocker))
  assert "step 4" not in proc.stdout  # nothing was trained
  assert not (workdir / "runs" / "additive_d8" / "metrics.jsonl").exists()


# --- a full disk -----------------------------------------------------------------

def test_a_full_disk_mid_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path,
                                                                          monkeypatch):
  path = tmp_path / "table.md"
  files.atomic_write(str(path), "old")

  def full(fd):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError, match="No space left"):
    files.atomic_write(str(path), "new " * 1000)
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["table.md"]


# Files may grow to at most LIMIT bytes: a longer write fails in the kernel
# (EFBIG, the way ENOSPC does on a full disk), in TensorStore's C++ writer as
# anywhere else. The smoke model's first checkpoint is over it; the files
# written before that one (settings, lock, metrics, events) are far under it.
_FILE_SIZE_LIMIT = """
import resource, signal, sys
LIMIT = 1 << 16
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
"""


def test_a_refused_checkpoint_write_is_one_oserror_naming_the_step_and_nothing_on_stderr(
    tmp_path):
  # 150 arrays: the writes the refused one leaves behind end after the save
  # has raised (callbacks into a closed event loop, tasks nobody awaited),
  # which printed another 20 to 900 lines, at random, until the process ended.
  script = _FILE_SIZE_LIMIT + textwrap.dedent(f"""
      import gc, time
      import jax.numpy as jnp
      import numpy as np
      from absl import logging
      from attention_jax.training import checkpoints
      logging.set_verbosity(logging.WARNING)
      ckpt = checkpoints.Checkpointer({str(tmp_path / "ckpt")!r})
      rng = np.random.default_rng(0)  # random bytes: nothing to compress
      tree = {{f"w{{i}}": jnp.asarray(rng.standard_normal((64, 64), np.float32))
              for i in range(150)}}
      try:
        ckpt.save(1, tree, {{}})
      except OSError as e:
        print(e.errno, e.filename, e.strerror)
      time.sleep(1)  # the stray writes end
      gc.collect()  # and their tasks are collected
      """)
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
  assert proc.stdout.split(maxsplit=2) == ["27", str(tmp_path / "ckpt" / "1"),
                                           "File too large\n"]


# The disk fills while the named file is written (its fsync fails), or at the
# first checkpoint (`_FILE_SIZE_LIMIT`); the rest of the run is the real driver.
_FULL_DISK_AT = """
import os, sys
from absl import app
from attention_jax import files
from experiments import ablation
victim = sys.argv.pop(1)
if victim == "checkpoint":
  exec(FILE_SIZE_LIMIT)
real_write, real_fsync = files.atomic_write, os.fsync
def write(path, data):
  if os.path.basename(path) == victim:
    def full(fd):
      raise OSError(28, "No space left on device")
    os.fsync = full
  try:
    real_write(path, data)
  finally:
    os.fsync = real_fsync
files.atomic_write = write
app.run(ablation.main)
""".replace("FILE_SIZE_LIMIT", repr(_FILE_SIZE_LIMIT))


@pytest.mark.slow  # six smoke ablations, ~3 min on 2 cores
@pytest.mark.parametrize("victim", ["result.json", "table.md", "checkpoint"])
def test_a_full_disk_during_an_ablation_is_one_line_and_a_rerun_finishes(tmp_path, victim):
  workdir = tmp_path / "w"
  flags = ["--preset=smoke", "--arms=additive", "--dims=8", "--steps=40",
           "--eval_every=40", f"--workdir={workdir}"]
  crashed = subprocess.run([sys.executable, "-c", _FULL_DISK_AT, victim, *flags], cwd=ROOT,
                           capture_output=True, text=True)
  # One line on stderr, whichever writer failed: no Orbax tracebacks.
  _one_line_failure(crashed, f"error: {workdir}: ",
                    "File too large" if victim == "checkpoint" else "No space left on device")
  left = [os.path.join(r, f) for r, _, fs in os.walk(workdir) for f in fs]
  assert not [f for f in left if os.path.basename(f).startswith(files.TMP_PREFIX)]
  assert (workdir / "runs" / "additive_d8" / "result.json").exists() == (victim == "table.md")

  rerun = subprocess.run([sys.executable, "-m", "experiments.ablation", *flags], cwd=ROOT,
                         capture_output=True, text=True)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  rows = [json.loads(l) for l in open(workdir / "results.jsonl")]
  assert [r["seed"] for r in rows] == [0, 1] and all(r["test_bleu"] is not None for r in rows)
  metrics = [json.loads(l) for l in open(workdir / "runs" / "additive_d8" / "metrics.jsonl")]
  keys = [(m["step"], m["seed"], "val_bleu" in m) for m in metrics]
  assert len(keys) == len(set(keys))  # nothing logged twice by the resumed run


# --- stopped by the time budget: a status of its own ---------------------------------

def test_a_sweep_stopped_by_max_minutes_exits_75_not_0(tmp_path):
  # It exited 0, so a script could not tell a stopped sweep from a complete one.
  # A budget of 60 ns has always passed when the run is reached, so the sweep
  # stops before it builds a trainer. (With 6 ms it depended on the machine's
  # load whether the trainer was built, compiled and stopped at its first
  # checkpoint: 30 s idle, 90 s loaded; that stop inside a run is checked in
  # process by test_train_lib's resume and final-evaluation tests.)
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         "--arms=additive", "--dims=8", "--max_minutes=1e-9",
                         f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 75, proc.stderr[-3000:]
  assert "time budget reached; re-run the same command to continue" in proc.stdout
  assert (workdir / "runs" / "additive_d8" / "config.json").exists()  # resumable, not refused
  assert not (workdir / "runs" / "additive_d8" / "result.json").exists()


# --- item 10: bad paths and flags give one line, before any work ------------------

def _one_line_failure(proc, *needles):
  assert proc.returncode != 0
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(err) == 1 and all(n in err[0] for n in needles), proc.stderr


@pytest.mark.parametrize("driver", ["ablation", "train", "kernels.run"])
def test_a_workdir_that_is_a_file_is_named_in_one_line(tmp_path, driver):
  blocker = tmp_path / "file"
  blocker.write_text("not a folder")
  preset = "--preset=tiny" if driver == "kernels.run" else "--preset=smoke"
  for workdir in (blocker, blocker / "below"):
    proc = subprocess.run([sys.executable, "-m", f"experiments.{driver}", preset,
                           f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True)
    _one_line_failure(proc, "--workdir", str(blocker))
  assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("driver,flag", [("train", "--dim"), ("ablation", "--dims")])
def test_a_size_that_cannot_fit_in_memory_is_one_line_and_leaves_no_workdir(tmp_path, driver,
                                                                           flag):
  # Its parameters, Adam moments and best copy alone are ~2 TB: measured by
  # `jax.eval_shape`, refused before the workdir is made, not an
  # out-of-memory traceback after.
  proc = subprocess.run([sys.executable, "-m", f"experiments.{driver}", "--preset=smoke",
                         f"{flag}=1000000000", f"--workdir={tmp_path / 'w'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  _one_line_failure(proc, "error:", "d=1000000000", "--dims", "GiB of memory available")
  assert not (tmp_path / "w").exists()


def test_an_unknown_dataset_is_refused_and_leaves_no_workdir(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         "--dataset=bogus", f"--workdir={tmp_path / 'w'}"],
                        cwd=ROOT, capture_output=True, text=True)
  _one_line_failure(proc, "dataset", "bogus")
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--datasets="], "--datasets"),
    (["--datasets=bible_en_es,nope"], "'nope'"),
    (["--stats", "--batch_size=0"], "--batch_size"),
    (["--vocab_size=2"], "--vocab_size"),
])
def test_prepare_data_checks_its_flags_before_any_work(tmp_path, flags, needle):
  proc = subprocess.run([sys.executable, "-m", "experiments.prepare_data",
                         f"--data_dir={tmp_path / 'd'}", *flags],
                        cwd=ROOT, capture_output=True, text=True)
  _one_line_failure(proc, needle)
  assert not (tmp_path / "d").exists()


def test_prepare_data_names_a_data_dir_that_is_a_file(tmp_path):
  (tmp_path / "f").write_text("")
  proc = subprocess.run([sys.executable, "-m", "experiments.prepare_data",
                         f"--data_dir={tmp_path / 'f'}"], cwd=ROOT, capture_output=True,
                        text=True)
  _one_line_failure(proc, "--data_dir", str(tmp_path / "f"))


# --- the table of guarantees --------------------------------------------------------

def test_every_test_named_in_docs_reliability_exists():
  import re
  text = open(os.path.join(ROOT, "docs", "reliability.md"), encoding="utf-8").read()
  named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
  assert len(named) > 40
  missing = [f"{path}::{name}" for path, name in named
             if f"def {name}(" not in open(os.path.join(ROOT, path), encoding="utf-8").read()]
  assert missing == []
