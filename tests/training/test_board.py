"""TensorBoard event files: written without TensorFlow, read back
with TensorBoard's own reader, one run per seed, a resume purges what a
killed process wrote after its checkpoint."""

import os

import pytest

from attention_jax.training import metrics_log

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")


def _scalars(folder):
  acc = event_accumulator.EventAccumulator(folder)
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_rows_become_scalars_per_seed_readable_by_tensorboard(tmp_path):
  board = metrics_log.Board(str(tmp_path), seeds=(0, 3))
  board.row({"step": 10, "seed": 0, "loss": 2.5, "max_logit": 41.0, "logit_std": None})
  board.row({"step": 10, "seed": 3, "loss": 2.25, "val_bleu": 7.5, "val_ppl": 30.0})
  board.every_seed(10, {"learning_rate": 1e-3, "tokens_per_second": 1234.0})
  board.close()
  seed0 = _scalars(str(tmp_path / "tensorboard" / "seed_0"))
  seed3 = _scalars(str(tmp_path / "tensorboard" / "seed_3"))
  assert seed0 == {"train/loss": [(10, 2.5)], "attention/max_logit": [(10, 41.0)],
                   "train/learning_rate": [(10, pytest.approx(1e-3))],
                   "train/target_tokens_per_second": [(10, 1234.0)]}
  assert seed3["validation/bleu"] == [(10, 7.5)]
  assert seed3["validation/perplexity"] == [(10, 30.0)]
  assert seed3["train/loss"] == [(10, 2.25)]


def test_a_resumed_run_purges_what_came_after_its_checkpoint(tmp_path):
  first = metrics_log.Board(str(tmp_path), seeds=(0,))
  for step in (10, 20, 30):  # killed after step 30; its checkpoint was step 20
    first.row({"step": step, "seed": 0, "loss": float(step)})
  first.close()
  resumed = metrics_log.Board(str(tmp_path), seeds=(0,), start_step=20)
  for step in (30, 40):
    resumed.row({"step": step, "seed": 0, "loss": step + 0.5})
  resumed.close()
  loss = _scalars(str(tmp_path / "tensorboard" / "seed_0"))["train/loss"]
  assert loss == [(10, 10.0), (20, 20.0), (30, 30.5), (40, 40.5)]


def test_other_processes_write_nothing(tmp_path):
  board = metrics_log.Board(str(tmp_path), seeds=(0,), enabled=False)
  board.row({"step": 1, "seed": 0, "loss": 1.0})
  board.close()
  assert not os.path.exists(tmp_path / "tensorboard")
