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


def test_xla_with_loops_counted_agrees_with_the_jaxpr_and_xla_as_it_is_does_not():
  from experiments import compile_check  # pylint: disable=g-import-not-at-top
  # Wide enough that the matrix products dominate, as in the presets (the two
  # count elementwise work differently).
  c = models.Seq2SeqConfig(vocab_size=300, embed_dim=64, hidden_dim=64, attention_dim=64,
                           score="multiplicative")
  graphdef, params, rest = nnx.split(models.Seq2Seq(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
  tx = optax.adam(1e-3)
  src, tgt = jnp.full((16, 10), 5, jnp.int32), jnp.full((16, 12), 6, jnp.int32)
  step = jax.jit(functools.partial(steps.train_step, graphdef, tx, pad_id=0))
  traced = step.trace(params, rest, tx.init(params), src, tgt, tgt, jax.random.key(0))
  counted = flops.count_jaxpr(traced.jaxpr.jaxpr)
  compiled = traced.lower().compile()
  with_loops = compile_check.loop_aware_cost(compiled.as_text(),
                                             compile_check.cpu_cost_analysis)["flops"]
  body_once = compiled.cost_analysis()
  body_once = (body_once[0] if isinstance(body_once, (list, tuple)) else body_once)["flops"]
  assert with_loops == pytest.approx(counted.total, rel=0.1)  # 6.5% apart here, 2.3% quick
  assert body_once < 0.6 * counted.total


def test_ops_are_attributed_to_the_scopes_of_the_model_and_the_step():
  part = cpu_efficiency.part_of
  assert part("jit(step_fn)/transpose(jvp(encoder))/while/body/dot_general") == (
      "encoder", "backward")
  assert part("jit(step_fn)/jvp(decoder)/while/body/closed_call/add") == ("decoder", "forward")
  assert part("jit(step_fn)/jvp(decoder)/while/body/jit(_bernoulli)/jit(_uniform)/while") == (
      "dropout masks", "forward")
  assert part("jit(step_fn)/optimizer/mul") == ("optimizer", "forward")
  assert part("jit(step_fn)/transpose(jvp(output))/dot_general") == ("output layer", "backward")
  assert part("jit(step_fn)/jvp(loss)/reduce_max") == ("loss", "forward")
  assert part("") == ("other", "forward")
  marks = [(30, 5, "end: dot.1"), (10, 20, "dot.1"), (0, 2, "while.3"), (40, 1, "end: while.3"),
           (5, 1, "ThunkExecutor::Execute")]
  assert cpu_efficiency.thunk_times(marks) == [(10, 20, "dot.1")]
  hlo = ('  %dot.1 = f32[2,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, '
         'metadata={op_name="jit(f)/jvp(decoder)/dot_general" stack_frame_id=3}\n'
         '  ROOT %copy.2 = f32[2,2]{1,0} copy(%dot.1)\n')
  assert cpu_efficiency.hlo_op_names(hlo) == {"dot.1": "jit(f)/jvp(decoder)/dot_general"}


def test_a_traced_program_is_broken_down_by_its_scopes(tmp_path):
  def f(w, xs):
    with jax.named_scope("encoder"):
      h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros((8, 64)), xs)
    with jax.named_scope("loss"):
      return jnp.sum(h * h)
  w = jnp.eye(64) * 0.5
  xs = jnp.ones((16, 8, 64))
  grad = jax.jit(jax.grad(f))
  compiled = grad.lower(w, xs).compile(compiler_options={"xla_cpu_enable_xprof_traceme": True})
  compiled(w, xs).block_until_ready()
  with jax.profiler.trace(str(tmp_path)):
    for _ in range(3):
      compiled(w, xs).block_until_ready()
  import glob  # pylint: disable=g-import-not-at-top
  xspace = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)[0]
  rows = cpu_efficiency.breakdown(xspace, compiled.as_text(), 3, 1.0)
  found = {(r["part"], r["direction"]): r for r in rows}
  for key in [("encoder", "forward"), ("encoder", "backward")]:
    assert found[key]["ms"] > 0 and found[key]["loop_thunks"] >= 16  # one or more per step
    assert found[key]["matmul_ms"] > 0
  assert rows[-1]["part"] == "between thunks"
  assert sum(r["ms"] for r in rows) == pytest.approx(1e3)  # the rest of the 1 s given


def test_no_hand_count_for_unprojected_scores():
  c = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12, score="general")
  with pytest.raises(ValueError, match="general"):
    cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)


@pytest.mark.parametrize("args, named", [
    (["--cells=additive"], "--cells"),
    (["--seeds=0"], "--seeds"),
    (["--threads=3"], "--threads"),
    (["--cells=nosuch:8"], "nosuch"),
    ([f"--profile={os.path.abspath(__file__)}"], "--profile"),
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
       "--cells=multiplicative:8", "--seeds=2", "--batches=2", "--repeats=1", f"--out={path}",
       f"--profile={tmp_path / 'trace'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  import json  # pylint: disable=g-import-not-at-top
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  peak, cell = rows
  assert peak["kind"] == "matmul_peak" and peak["peak_flops_per_s"] > 0
  assert cell["seeds"] == 2 and cell["matmul_flops"] == cell["hand_matmul_flops"]
  assert cell["share_of_peak"] == pytest.approx(cell["matmul_flops_per_s"] / peak["peak_flops_per_s"])
  assert cell["xla_flops"] < cell["flops"]  # XLA counts the scans' bodies once
  assert cell["xla_loop_aware_flops"] == pytest.approx(cell["flops"], rel=0.15)
  parts = {r["part"] for r in cell["profile"]}
  assert {"encoder", "decoder", "optimizer"} <= parts
  assert "| decoder | backward |" in out.stdout
  assert "provenance" in cell and cell["provenance"]["xla_flags"].count("intra_op") == 1
