"""Sizes refused before any work (`training/memory.py`): a training batch
that cannot fit, an evaluation budget over the memory, and the memory's
share per process counted by the runs that train at once."""

import os
import subprocess
import sys

import pytest

from attention_jax.analysis import reports
from attention_jax.data import batching
from attention_jax.data import input_pipeline
from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.training import memory
from attention_jax.training import train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _point(arm="additive", **changes):
  cfg = config.from_preset("smoke", arms=(arm,), dims=(8,), **changes)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  return cfg.point(config.Arm.of(arm, 8)), data


def test_a_training_batch_is_counted_by_its_logits_and_encoder_output_at_its_narrowest():
  run, data = _point(seeds=2, batch_size=32)
  sources, targets = data.token_ids("train")
  shortest = min(max(s, t) for s, t in zip(sources.lengths, targets.lengths))
  width = int(batching.padded_length(int(shortest) + 1))
  # The logits (a vocabulary per target position) and the bidirectional
  # encoder's output (2 x 32 per source position), float32, for 2 members.
  assert memory.step_bytes(run, data) == (
      4 * 2 * 32 * width * (data.tokenizer.vocab_size + 2 * 32))
  transformer, _ = _point("scaled_dot", seeds=2, batch_size=32, model="transformer",
                          hidden_dim=16, num_heads=2)  # d_model 16
  assert memory.step_bytes(transformer, data) == (
      4 * 2 * 32 * width * (data.tokenizer.vocab_size + 16))
  # Linear in the batch: ten million sentences are terabytes, counted, not allocated.
  huge, _ = _point(seeds=2, batch_size=10_000_000)
  assert memory.step_bytes(huge, data) == memory.step_bytes(run, data) * 312_500


def test_a_batch_too_large_names_batch_size_and_a_small_share_names_workers():
  run, data = _point(batch_size=10_000_000)
  with pytest.raises(ValueError) as info:  # ~56 GB at least
    memory.check_memory(run, data, available=2**34)
  assert "--batch_size" in str(info.value) and "--dims" not in str(info.value)
  assert "10,000,000 sentences" in str(info.value) and "\n" not in str(info.value)
  # One process alone fits; a hundred thousand of them do not.
  run, data = _point(workers=100_000)
  need = memory.state_bytes(run, data)[1] + memory.step_bytes(run, data)
  with pytest.raises(ValueError) as info:
    memory.check_memory(run, data, available=2 * need)
  message = str(info.value)
  assert "lower --workers" in message and "shared by 100000 --workers" in message
  assert "--dims" not in message and "0.0 GiB" not in message  # MiB below a GiB


def test_an_evaluation_budget_over_the_memory_is_refused():
  run, data = _point(eval_memory_gb=64.0)
  memory.check_memory(run, data, available=64 * 2**30)
  with pytest.raises(ValueError, match=r"--eval_memory_gb=64 is over the 63\.0 GiB"):
    memory.check_memory(run, data, available=63 * 2**30)
  with pytest.raises(ValueError, match="eval_memory_gb"):
    config.from_preset("smoke", eval_memory_gb=1e300)  # its bytes overflowed an integer


def test_a_worker_with_memory_of_its_own_is_checked_against_all_of_it(monkeypatch):
  # The step counted by its lower bound alone: the sharing is what is tested.
  monkeypatch.setattr(memory, "step_memory",
                      lambda run, data, budget: memory.step_bytes(run, data))
  run, data = _point(workers=8)
  need = memory.state_bytes(run, data)[1] + memory.step_bytes(run, data)
  with pytest.raises(ValueError, match="shared by 8 --workers"):
    memory.check_memory(run, data, available=2 * need)
  memory.check_memory(run, data, available=2 * need, shared=False)  # a chip or GPU each
  with pytest.raises(ValueError) as info:
    memory.check_memory(run, data, available=need // 2, shared=False)
  assert "shared by" not in str(info.value) and "lower --workers" not in str(info.value)


def test_runs_on_groups_of_devices_are_checked_against_a_groups_memory(tmp_path, monkeypatch):
  seen = []

  def check(run, data, available=None, shared=True):
    seen.append((available, shared))
    raise ValueError("refused")

  monkeypatch.setattr(memory, "check_memory", check)
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), workers=2)
  with pytest.raises(ValueError, match="refused"):
    runner.run(cfg, str(tmp_path / "w"), report=reports.write,
               worker_environments=[{}, {}], group_memory=16 * 2**30)
  assert seen == [(16 * 2**30, False)]
  assert not (tmp_path / "w").exists()


def test_the_memory_is_shared_by_the_runs_that_train_at_once_not_by_the_flag(tmp_path,
                                                                             monkeypatch):
  seen = []

  def check(run, data, available=None, shared=True):
    assert available is None and shared  # the workers share this host's memory
    seen.append(run.workers)
    raise ValueError("refused")

  monkeypatch.setattr(memory, "check_memory", check)
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8,),
                           workers=100_000)
  for axes, runs in (((), 2), ((("learning_rate", (1e-3, 3e-3)),), 4)):
    seen.clear()
    with pytest.raises(ValueError, match="refused"):
      runner.run(cfg, str(tmp_path / "w"), axes=axes, report=reports.write)
    assert seen == [runs]
  seen.clear()
  with pytest.raises(ValueError, match="refused"):
    runner.run(cfg.replace(workers=3), str(tmp_path / "w"),
               axes=(("learning_rate", (1e-3, 3e-3)),), report=reports.write)
  assert seen == [3]
  assert not (tmp_path / "w").exists()


# A billion sentences need 5.6 TB at least, over any machine's memory.
@pytest.mark.parametrize("flag,needle", [("--batch_size=1000000000", "--batch_size"),
                                         ("--eval_memory_gb=1e300", "eval_memory_gb"),
                                         ("--eval_memory_gb=1000000", "--eval_memory_gb")])
def test_a_size_the_memory_check_let_through_is_one_line_and_no_workdir(tmp_path, flag,
                                                                        needle):
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         "--arms=additive", "--dims=8", flag, f"--workdir={tmp_path / 'w'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode != 0 and len(err) == 1, proc.stderr[-3000:]
  assert err[0].startswith("error:") and needle in err[0]
  assert not (tmp_path / "w").exists()


class _FakeDevice:
  def __init__(self, platform, stats):
    self.platform, self._stats = platform, stats

  def memory_stats(self):
    return self._stats


def test_the_evaluation_budget_is_half_the_accelerators_memory_not_the_hosts(monkeypatch):
  monkeypatch.setattr(memory, "available_memory", lambda: 128 * 2**30)
  monkeypatch.setattr(memory.jax, "devices",
                      lambda: [_FakeDevice("gpu", {"bytes_limit": 24 * 2**30})])
  # A 24 GiB GPU on a 128 GiB host: half the GPU, shared by the workers.
  assert memory.evaluation_budget(0.0, workers=1) == 12 * 2**30
  assert memory.evaluation_budget(0.0, workers=4) == 3 * 2**30
  assert memory.training_memory() == 24 * 2**30
  assert memory.evaluation_budget(3.0, workers=4) == 3 * 2**30  # the flag wins
  # The CPU, or an accelerator that reports no limit: the host's, shared by the workers.
  for device in (_FakeDevice("cpu", None), _FakeDevice("gpu", {})):
    monkeypatch.setattr(memory.jax, "devices", lambda device=device: [device])
    assert memory.evaluation_budget(0.0, workers=4) == 16 * 2**30
    assert memory.training_memory() == 128 * 2**30


def test_the_benchmarks_memory_limit_reads_the_same_memory_as_the_trainer(monkeypatch):
  from experiments.kernels import timing
  monkeypatch.setattr(memory, "available_memory", lambda: 128 * 2**30)
  monkeypatch.setattr(memory.jax, "devices",
                      lambda: [_FakeDevice("gpu", {"bytes_limit": 80 * 2**30})])
  assert timing.memory_limit_bytes(None) == int(0.9 * 80 * 2**30)
  assert timing.memory_limit_bytes(2.0) == 2 * 2**30
  monkeypatch.setattr(memory.jax, "devices", lambda: [_FakeDevice("cpu", None)])
  assert timing.memory_limit_bytes(None) == 64 * 2**30


def test_a_batch_between_the_lower_bound_and_the_need_is_refused_before_the_workdir(
    tmp_path, monkeypatch):
  # 100,000 sentences of one smoke model: the lower bound (logits and encoder
  # output) is about 0.27 GiB, XLA's count of the compiled step about 40
  # times that; 4 GiB lies between.
  run, data = _point(seeds=1, batch_size=100_000)
  low = memory.step_bytes(run, data)
  need = memory.step_memory(run, data, budget=0)  # compiled: nothing allocated
  assert low < 2**30 and need > 20 * low
  monkeypatch.setattr(memory, "training_memory", lambda: 4 * 2**30)
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), seeds=1, batch_size=100_000)
  with pytest.raises(ValueError) as info:
    runner.run(cfg, str(tmp_path / "w"), report=reports.write, data=data)
  message = str(info.value)
  assert "\n" not in message and "--batch_size" in message and "100,000 sentences" in message
  assert "XLA's memory analysis of the compiled step" in message
  assert not (tmp_path / "w").exists()


def test_an_out_of_memory_in_a_training_step_is_one_line_naming_batch_size(tmp_path,
                                                                            monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top

  def step(*inputs):  # the trainer's compiled step, as XLA:CPU fails it
    del inputs
    raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory allocating 22419096800 bytes.\n"
        + "\n".join(f"allocator state line {i}" for i in range(40)))

  monkeypatch.setattr(train_lib.EnsembleTrainer, "_build_train_step", lambda self: step)
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), steps=2,
                           eval_examples=8, test_examples=8)
  with pytest.raises(ValueError) as info:
    runner.run(cfg, str(tmp_path / "w"), report=reports.write, log=lambda line: None)
  assert str(info.value) == (
      "[additive d=8] out of memory in training step 1 (2 members, a batch of 32 sentences of "
      f"{_width(cfg)} tokens): lower --batch_size (or --seeds, --members); XLA: "
      "RESOURCE_EXHAUSTED: Out of memory allocating 22419096800 bytes.")


def _width(cfg) -> int:
  """The padded length of the first training batch of `cfg`'s smoke data."""
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  batch = next(data.batches("train", cfg.batch_size, seed=cfg.data_seed, shuffle=True,
                            repeat=True, max_length=cfg.max_length))
  return batch.src.shape[1]


def test_more_members_than_a_cpu_program_runs_in_turn_are_refused():
  run, _ = _point(seeds=1, members="learning_rate=" + ",".join(
      str(1e-3 + i * 1e-6) for i in range(memory.MAX_IN_TURN_MEMBERS)))
  memory.check_members(run)  # 32: one program takes them
  over, _ = _point(seeds=1, members="learning_rate=" + ",".join(
      str(1e-3 + i * 1e-6) for i in range(memory.MAX_IN_TURN_MEMBERS + 1)))
  with pytest.raises(ValueError) as info:
    memory.check_members(over)
  message = str(info.value)
  assert "\n" not in message and message.startswith("--members / --seeds: 33 members")
  assert "over the 32 the CPU takes" in message
  memory.check_members(over, member_groups=2)  # 17 on each of 2 devices


def test_thousands_of_members_are_refused_in_one_line_before_any_work(tmp_path):
  # 5,000 learning rates passed every check, then compiled for 12 minutes
  # (16.7 GB) without a first step.
  rates = ",".join(f"{1e-4 * (1 + i / 5000):.8g}" for i in range(5000))
  proc = subprocess.run([sys.executable, "-m", "experiments.ablation", "--preset=smoke",
                         "--arms=additive", "--dims=8", "--seeds=1",
                         f"--members=learning_rate={rates}", f"--workdir={tmp_path / 'w'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr[-3000:]
  assert err[0].startswith("error: --members / --seeds: 5000 members (1 seed(s) x 5000 values)")
  assert "over the 32 the CPU takes" in err[0]
  assert not (tmp_path / "w").exists()
