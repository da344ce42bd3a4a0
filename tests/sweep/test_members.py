"""`--members`: parsing, the config it makes, and what it refuses before any work."""

import os
import subprocess
import sys

import pytest

from attention_jax.data import input_pipeline
from attention_jax.sweep import config
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.training import memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_members_are_parsed_spelled_one_way_and_reach_the_run():
  assert config.parse_members("learning_rate=1e-4, 3e-4") == ("learning_rate", (1e-4, 3e-4))
  cfg = config.from_preset("smoke", seeds=2, members="learning_rate = 3e-4,1e-3")
  # However it was written, a run folder records one text (`workdir.fingerprint`).
  assert cfg.members == "learning_rate=0.0003,0.001"
  assert cfg == config.from_preset("smoke", seeds=2, members="learning_rate=0.0003,1e-3")
  assert cfg.learning_rate == 3e-4  # the config names a rate it trains: the first
  run = cfg.point(config.Arm.of("additive", 8))
  assert run.member_axes == (("learning_rate", (3e-4, 1e-3)),)
  assert run.num_members == 4 and [m.keys for m in run.members()][1:3] == [
      {"seed": 1, "learning_rate": 3e-4}, {"seed": 0, "learning_rate": 1e-3}]
  assert workdir_lib.fingerprint(cfg, run.arm)["members"] == "learning_rate=0.0003,0.001"
  plain = config.from_preset("smoke")
  assert plain.member_axes() == () and plain.point(run.arm).num_members == plain.seeds


@pytest.mark.parametrize("text,needle", [
    ("learning_rate=", "learning_rate has no values"),
    ("learning_rate", "takes FIELD=V1,V2"),
    ("learning_rate=1e-3,0.001", "repeats a value"),
    ("learning_rate=1e-3,abc", "'abc' is not a float"),
    ("bogus=1,2", "'bogus', which is not a config field"),
    ("cell=gru,lstm", "`cell`, which is not a number field"),
    ("batch_size=16,32", "cannot vary `batch_size`"),
    ("hidden_dim=16,32", "cannot vary `hidden_dim`"),
    ("warmup_steps=0,10", "cannot vary `warmup_steps`"),
    ("learning_rate=1e-3,2", "learning_rate=2.0: `learning_rate` must be in"),
])
def test_bad_members_name_the_flag(text, needle):
  with pytest.raises(ValueError, match="`--members`") as info:
    config.from_preset("smoke", members=text)
  assert needle in str(info.value)


def test_members_and_sweep_are_not_combined():
  cfg = config.from_preset("smoke", members="learning_rate=1e-3,3e-3")
  with pytest.raises(ValueError, match="`--members` and `--sweep` cannot be combined"):
    config.grid(cfg, (config.parse_axis("dropout=0.0,0.1"),))
  with pytest.raises(ValueError, match="`--sweep` cannot vary `members`"):
    config.parse_axis("members=a,b")


def test_a_run_folder_refuses_another_member_list_naming_the_flag(tmp_path):
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,),
                           members="learning_rate=1e-3,3e-3")
  arm = config.Arm.of("additive", 8)
  run = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run.path)
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None  # resumed
  for other in ("learning_rate=1e-3,3e-3,1e-2", "learning_rate=3e-3,1e-3", ""):
    with pytest.raises(ValueError) as info:
      workdir_lib.check_run(run, workdir_lib.fingerprint(cfg.replace(members=other), arm))
    message = str(info.value)
    assert "\n" not in message and "--members='learning_rate=0.001,0.003'" in message
    assert "members cannot change" in message and run.path in message
  # Extending to more steps is what it always was.
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(
      cfg.replace(steps=2 * cfg.steps), arm), write=False) == cfg.steps


def test_the_memory_check_counts_every_member():
  data = input_pipeline.load("copy", max_length=20)
  arm = config.Arm.of("additive", 8)
  cfg = config.from_preset("smoke", seeds=2)
  members = cfg.replace(members="learning_rate=1e-3,3e-3,1e-2")
  count, state = memory.state_bytes(cfg.point(arm), data)
  assert memory.state_bytes(members.point(arm), data) == (count, 3 * state)
  assert memory.step_bytes(members.point(arm), data) == 3 * memory.step_bytes(
      cfg.point(arm), data)
  with pytest.raises(ValueError, match="6 members \\(2 seed\\(s\\) x 3 values\\)"):
    memory.check_memory(members.point(arm), data, available=state)


@pytest.mark.parametrize("flag,needle", [
    ("--members=batch_size=16,32", "`--members` cannot vary `batch_size`"),
    ("--members=learning_rate=", "`--members` learning_rate has no values"),
])
def test_a_bad_members_flag_is_one_line_before_any_work(tmp_path, flag, needle):
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         f"--workdir={tmp_path / 'w'}", flag], cwd=ROOT,
                        capture_output=True, text=True)
  assert proc.returncode != 0
  err = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert len(err) == 1 and needle in err[0], proc.stderr
  assert not os.path.exists(tmp_path / "w")
