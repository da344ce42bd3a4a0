"""experiments/cpu_efficiency.py: its FLOP counts and its flags."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from attention_jax import flops
from attention_jax import models
from attention_jax.training import steps
from experiments import cpu_efficiency

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("kw", [
    dict(score="additive"),
    dict(score="multiplicative", cell="lstm", decoder_layers=2),
    dict(score="scaled_multiplicative", decoder="bahdanau", bidirectional=False,
         encoder_layers=2),
    dict(score="additive", input_feeding="attentional", dropout=0.0),
])
def test_hand_count_equals_the_jaxpr_count_of_the_training_step(kw):
  c = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12, attention_dim=20, **kw)
  graphdef, params, rest = nnx.split(models.Seq2Seq(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
  tx = optax.adam(1e-3)
  src, tgt = jnp.full((3, 7), 5, jnp.int32), jnp.full((3, 9), 6, jnp.int32)
  step = functools.partial(steps.train_step, graphdef, tx, pad_id=0, dropout=c.dropout > 0)
  counted = flops.count(step, params, rest, tx.init(params), src, tgt, tgt, jax.random.key(0))
  assert counted.matmul == cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)


def test_no_hand_count_for_unprojected_scores():
  c = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12, score="general")
  with pytest.raises(ValueError, match="general"):
    cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)


@pytest.mark.parametrize("args, named", [
    (["--cells=additive"], "--cells"),
    (["--seeds=0"], "--seeds"),
    (["--threads=3"], "--threads"),
    (["--cells=nosuch:8"], "nosuch"),
])
def test_bad_flags_exit_with_one_line_before_any_work(args, named):
  out = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency", "--preset=smoke",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  lines = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and named in lines[0], out.stderr[-2000:]
  assert "matmul" not in out.stdout


@pytest.mark.slow  # a whole measurement (compiles and times a step): kept out of the default suite
def test_a_smoke_cell_reports_its_share_of_the_peak(tmp_path):
  path = tmp_path / "rows.jsonl"
  out = subprocess.run(
      [sys.executable, "-m", "experiments.cpu_efficiency", "--preset=smoke",
       "--cells=multiplicative:8", "--seeds=2", "--batches=2", "--repeats=1", f"--out={path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  import json  # pylint: disable=g-import-not-at-top
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  peak, cell = rows
  assert peak["kind"] == "matmul_peak" and peak["peak_flops_per_s"] > 0
  assert cell["seeds"] == 2 and cell["matmul_flops"] == cell["hand_matmul_flops"]
  assert cell["share_of_peak"] == pytest.approx(cell["matmul_flops_per_s"] / peak["peak_flops_per_s"])
  assert cell["xla_flops"] < cell["flops"]  # XLA counts the scans' bodies once
  assert "provenance" in cell and cell["provenance"]["xla_flags"].count("intra_op") == 1
