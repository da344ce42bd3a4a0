"""experiments/cpu_efficiency/run.py: its FLOP counts and its flags; where its profiled step's
time goes (attention_jax/measure/hlo_profile.py)."""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from attention_jax.measure import flops
from attention_jax import models
from attention_jax.measure import hlo
from attention_jax.measure import hlo_profile
from attention_jax.training import steps
from experiments.cpu_efficiency import run as cpu_efficiency

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("kw", [
    dict(score="additive"),
    dict(score="multiplicative", cell="lstm", decoder_layers=2),
    dict(score="scaled_multiplicative", decoder="bahdanau", bidirectional=False,
         encoder_layers=2),
    dict(score="additive", input_feeding="attentional", dropout=0.0),
    # every projected score is counted: a scale or norm of the projections is elementwise
    dict(score="inverse_dim"),
    dict(score="qk_norm", max_source_length=7),
])
def test_hand_count_equals_the_jaxpr_count_of_the_training_step(kw):
  c = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12, attention_dim=20, **kw)
  graphdef, params, rest = nnx.split(models.Seq2Seq(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
  tx = optax.adam(1e-3)
  src, tgt = jnp.full((3, 7), 5, jnp.int32), jnp.full((3, 9), 6, jnp.int32)
  step = functools.partial(steps.train_step, graphdef, tx, pad_id=0, dropout=c.dropout > 0)
  counted = flops.count(step, params, rest, tx.init(params), src, tgt, tgt, jax.random.key(0))
  assert counted.matmul == cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)


def _transformer_step_matmul(c, batch: int, src_len: int, tgt_len: int) -> float:
  """The jaxpr count of the real training step (`steps.train_step`, label
  smoothing and dropout as the preset trains) of a Transformer built from `c`."""
  graphdef, params, rest = nnx.split(models.Transformer(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
  tx = optax.adam(1e-3)
  src = jnp.full((batch, src_len), 5, jnp.int32)
  tgt = jnp.full((batch, tgt_len), 6, jnp.int32)
  step = functools.partial(steps.train_step, graphdef, tx, pad_id=0, label_smoothing=0.1,
                           dropout=c.dropout > 0)
  return flops.count(step, params, rest, tx.init(params), src, tgt, tgt,
                     jax.random.key(0)).matmul


@pytest.mark.parametrize("d_k", [4, 48])  # d_k below and far above d_model / heads
@pytest.mark.parametrize("kw", [
    dict(score="scaled_dot"),
    dict(score="dot", pre_layer_norm=True, share_embeddings=False, encoder_layers=1),
    dict(score="qk_norm", dropout=0.0),
    dict(score="inverse_dim", num_layers=1, encoder_layers=3),
])
def test_transformer_hand_count_equals_the_jaxpr_count_of_the_training_step(d_k, kw):
  c = models.TransformerConfig(**{**dict(vocab_size=50, num_layers=2, d_model=16, num_heads=2,
                                        d_ff=24, attention_dim=d_k, dropout=0.1), **kw})
  hand = cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)
  # Stated tolerance: none. Both are sums of integers far below 2^53, so they
  # agree exactly or the hand count misses a product.
  assert _transformer_step_matmul(c, 3, 7, 9) == hand
  # and the count moves with d_k as the formula says: Q and K projections and
  # the scores grow linearly in d_k, nothing else does
  wider = dataclasses.replace(c, attention_dim=d_k + 1)
  b, s, t, d, h = 3, 7, 9, c.d_model, c.num_heads
  per_dk = 2 * b * (h * d * (2 * s + s * s / d) * c.num_encoder_layers
                    + h * d * (2 * t + t * t / d + t + s + t * s / d) * c.num_layers)
  assert cpu_efficiency.hand_matmul_flops(wider, b, s, t) - hand == pytest.approx(3 * per_dk)


@pytest.mark.parametrize("kw, named", [
    (dict(score="additive", attention_dim=8), "additive"),
    (dict(score="general"), "general"),
    (dict(attention_dropout=0.1), "attention_dropout"),
])
def test_no_transformer_hand_count_where_it_would_be_wrong(kw, named):
  c = models.TransformerConfig(vocab_size=50, num_layers=1, d_model=16, num_heads=2, d_ff=24,
                               **kw)
  with pytest.raises(ValueError, match=named):
    cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)
  # and what it refuses is indeed not what the formula gives
  formula = cpu_efficiency.hand_matmul_flops(
      dataclasses.replace(c, score="scaled_dot", attention_dropout=0.0), 3, 7, 9)
  assert _transformer_step_matmul(c, 3, 7, 9) != formula


def test_hand_count_names_a_config_of_neither_family():
  with pytest.raises(TypeError, match="dict"):
    cpu_efficiency.hand_matmul_flops({}, 3, 7, 9)


def test_xla_with_loops_counted_agrees_with_the_jaxpr_and_xla_as_it_is_does_not():
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
  with_loops = hlo.loop_aware_cost(compiled.as_text(), hlo.cpu_cost_analysis)["flops"]
  body_once = compiled.cost_analysis()
  body_once = (body_once[0] if isinstance(body_once, (list, tuple)) else body_once)["flops"]
  assert with_loops == pytest.approx(counted.total, rel=0.1)  # 6.5% apart here, 2.3% quick
  assert body_once < 0.6 * counted.total


def test_ops_are_attributed_to_the_scopes_of_the_model_and_the_step():
  part = hlo_profile.part_of
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
  assert hlo_profile.thunk_times(marks) == [(10, 20, "dot.1")]
  hlo = ('  %dot.1 = f32[2,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, '
         'metadata={op_name="jit(f)/jvp(decoder)/dot_general" stack_frame_id=3}\n'
         '  ROOT %copy.2 = f32[2,2]{1,0} copy(%dot.1)\n')
  assert hlo_profile.hlo_op_names(hlo) == {"dot.1": "jit(f)/jvp(decoder)/dot_general"}


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
  rows = hlo_profile.breakdown(xspace, compiled.as_text(), 3, 1.0)
  found = {(r["part"], r["direction"]): r for r in rows}
  for key in [("encoder", "forward"), ("encoder", "backward")]:
    assert found[key]["ms"] > 0 and found[key]["loop_thunks"] >= 16  # one or more per step
    assert found[key]["matmul_ms"] > 0
  assert rows[-1]["part"] == "between thunks"
  assert sum(r["ms"] for r in rows) == pytest.approx(1e3)  # the rest of the 1 s given


def _inner(x):
  return jnp.sin(x) @ x


def _middle(x):
  return _inner(x) + 1.0


def _outer(x):
  y = _middle(x)
  return jnp.cos(y) @ y


def test_the_call_stack_of_each_op_is_read_from_the_compiled_module():
  hlo = jax.jit(_outer).lower(jnp.ones((4, 4))).compile().as_text()
  stacks = hlo_profile.hlo_stack_frames(hlo)
  dots = {name: op for name, op in hlo_profile.hlo_op_names(hlo).items()
          if "dot_general" in op}
  found = sorted(stacks[name][-3:] for name in dots)
  assert len(found) == 2
  assert found[0][-3:] == ("_outer", "_middle", "_inner")  # the product in _inner
  assert found[1][-1] == "_outer" and "_middle" not in found[1]  # the one in _outer
  # the printed parent is its id + 1 in jax 0.10.2; a table with 0 for roots is read as is
  table = ('FunctionNames\n1 "f"\n2 "g"\n\nFileLocations\n1 {file_name_id=1 '
           'function_name_id=1 line=1}\n2 {file_name_id=1 function_name_id=2 line=2}\n\n'
           'StackFrames\n1 {file_location_id=1 parent_frame_id=0}\n'
           '2 {file_location_id=2 parent_frame_id=1}\n\n'
           '  %dot.1 = f32[2]{0} dot(%a, %b), metadata={op_name="x" stack_frame_id=2}\n')
  assert hlo_profile.hlo_stack_frames(table) == {"dot.1": ("f", "g")}


def test_transformer_ops_are_attributed_by_the_functions_that_made_them():
  part = hlo_profile.transformer_part_of
  enc = ("train_step", "Transformer.__call__", "Transformer._encode", "EncoderLayer.__call__")
  dec = ("train_step", "Transformer.__call__", "DecoderLayer.__call__")
  mha = ("MultiHeadAttention.__call__",)
  bwd = "jit(step_fn)/transpose(jvp())/dot_general"
  assert part(bwd, enc + mha + ("MultiHeadAttention.project_kv", "Linear.__call__")) == (
      "encoder self attention: projections", "backward")
  assert part("jit(step_fn)/jvp()/dot_general", enc + mha + (
      "MultiHeadAttention.attend", "attend")) == (
          "encoder self attention: scores, softmax, sum", "forward")
  assert part("x", dec + ("DecoderLayer.__call__.<locals>.self_attention",) + mha + (
      "MultiHeadAttention.attend", "Linear.__call__")) == (
          "decoder self attention: projections", "forward")
  assert part("x", dec + ("DecoderLayer.__call__.<locals>.cross_attention",
                          "MultiHeadAttention.attend", "scaled_dot")) == (
      "cross attention: scores, softmax, sum", "forward")
  # the keys and values of the encoder output are projected outside the layer
  assert part("x", ("Transformer.__call__", "MultiHeadAttention.project_kv",
                    "Linear.__call__")) == ("cross attention: projections", "forward")
  assert part("x", dec + ("FeedForward.__call__", "Linear.__call__")) == (
      "decoder FFN", "forward")
  assert part("x", enc + ("_Block._residual", "LayerNorm.__call__")) == (
      "encoder LayerNorm + residual", "forward")
  assert part("x", enc + ("_Block._residual", "Dropout.__call__")) == ("dropout", "forward")
  assert part("jit(step_fn)/jvp()/jit(_bernoulli)/random_bits", ()) == ("dropout", "forward")
  assert part("x", ("Transformer.__call__", "Transformer.logits", "Embed.attend")) == (
      "output layer", "forward")
  assert part("jit(step_fn)/transpose(jvp(loss))/exp", ("token_loss",)) == ("loss", "backward")
  assert part("jit(step_fn)/optimizer/mul", ()) == ("optimizer", "forward")
  assert part("", ()) == ("other", "forward")


def test_every_product_of_a_transformer_step_is_attributed_to_a_part_of_the_model():
  # One layer each: the layers are a Python loop, so a second adds only copies
  # of the same products to compile.
  c = models.TransformerConfig(vocab_size=50, num_layers=1, d_model=16, num_heads=2, d_ff=24,
                               attention_dim=5, dropout=0.1)
  graphdef, params, rest = nnx.split(models.Transformer(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
  tx = optax.adam(1e-3)
  src, tgt = jnp.full((3, 7), 5, jnp.int32), jnp.full((3, 9), 6, jnp.int32)
  step = jax.jit(functools.partial(steps.train_step, graphdef, tx, pad_id=0))
  hlo = step.lower(params, rest, tx.init(params), src, tgt, tgt,
                   jax.random.key(0)).compile().as_text()
  stacks = hlo_profile.hlo_stack_frames(hlo)
  parts = [hlo_profile.transformer_part_of(op, stacks.get(name, ()))
           for name, op in hlo_profile.hlo_op_names(hlo).items() if "dot_general" in op]
  assert parts and ("other", "forward") not in parts and ("other", "backward") not in parts
  for attention in ("encoder self attention", "decoder self attention", "cross attention"):
    for what in ("projections", "scores, softmax, sum"):
      for direction in ("forward", "backward"):
        assert (f"{attention}: {what}", direction) in parts
  for part in ("encoder FFN", "decoder FFN", "output layer"):
    assert (part, "forward") in parts and (part, "backward") in parts


def test_no_hand_count_for_unprojected_scores():
  c = models.Seq2SeqConfig(vocab_size=50, embed_dim=16, hidden_dim=12, score="general")
  with pytest.raises(ValueError, match="general"):
    cpu_efficiency.hand_matmul_flops(c, 3, 7, 9)


_BAD_FLAGS = [
    (["--cells=additive"], "--cells"),
    (["--seeds=0"], "--seeds"),
    (["--threads=3"], "--threads"),
    (["--cells=nosuch:8"], "nosuch"),
    ([f"--profile={os.path.abspath(__file__)}"], "--profile"),
    (["--repeats=0"], "--repeats"),
    (["--num_heads=4"], "num_heads"),  # a Transformer field given to the RNN's preset
]
_PATH_CASES = ["not_utf8", "under_a_file", "file_for_a_folder", "a_folder",
               "profile_under_a_file"]


def _path_case(folder, case):
  """Makes `folder`'s files for `case`: returns the flag, the path it is given
  and what its refusal must say."""
  plain = folder / "plain.txt"
  plain.write_text("a file\n")
  latin1 = folder / "rows.jsonl"
  latin1.write_bytes("{\"caf\u00e9\": 1}\n".encode("latin-1"))
  return {
      "not_utf8": ("--out", latin1, "not UTF-8"),
      "under_a_file": ("--out", plain / "rows.jsonl", "is a file"),
      "file_for_a_folder": ("--out", plain / "deeper" / "rows.jsonl", "is a file"),
      "a_folder": ("--out", folder, "is a folder"),
      "profile_under_a_file": ("--profile", plain / "trace", "is a file"),
  }[case]


@pytest.fixture(scope="module")
def refused_in_one_process(tmp_path_factory, run_refusals):
  """Every bad command line of this file (the flags, then the paths, each in a
  folder of its own) run through the driver's `main` in one process
  (tests/drivers.py): case -> (result, folder, flag, path, said)."""
  cases, keys, made = [], [], {}
  for args, _ in _BAD_FLAGS:
    keys.append(tuple(args))
    cases.append((["--preset=smoke", *args], ROOT))
  for case in _PATH_CASES:
    folder = tmp_path_factory.mktemp(case)
    flag, path, said = _path_case(folder, case)
    made[case] = (folder, flag, path, said)
    keys.append(case)
    cases.append((["--preset=smoke", f"{flag}={path}"], ROOT))
  results = run_refusals("experiments.cpu_efficiency.run", cases, define="define_flags")
  return {key: (result, *made.get(key, ())) for key, result in zip(keys, results)}


def test_a_bad_flag_stops_the_real_process_with_one_line_before_any_work():
  # The process itself once; the other bad flags and paths below run through the
  # same `main` in one process.
  _refused(["--cells=additive"], "--cells")


@pytest.mark.parametrize("args, named", _BAD_FLAGS)
def test_bad_flags_exit_with_one_line_before_any_work(refused_in_one_process, args, named):
  _check_refused(refused_in_one_process[tuple(args)][0], named)


def _refused(args, named):
  """Runs the tool with `args`; asserts it stops with one `error:` line naming
  `named` and measures nothing (no peak printed)."""
  out = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency.run", "--preset=smoke",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
  return _check_refused(out, named)


def _check_refused(out, named):
  assert out.returncode != 0
  lines = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and named in lines[0], out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  assert "matmul" not in out.stdout
  return lines[0]


@pytest.mark.parametrize("case", _PATH_CASES)
def test_output_paths_that_cannot_be_written_are_refused_before_measuring(
    refused_in_one_process, case):
  result, folder, flag, path, said = refused_in_one_process[case]
  line = _check_refused(result, flag)
  assert said in line and str(path) in line
  latin1 = folder / "rows.jsonl"
  assert latin1.read_bytes() == "{\"caf\u00e9\": 1}\n".encode("latin-1")  # left as it was
  assert sorted(p.name for p in folder.iterdir()) == ["plain.txt", "rows.jsonl"]


def test_the_share_by_cpu_time_leaves_out_the_time_another_process_had():
  # a step that got half of its core: 2 s of wall time, 1 s of CPU time
  row = {"seconds": 2.0, "cpu_seconds": 1.0, "matmul_flops": 10e9}
  shares = cpu_efficiency.cpu_time_shares(row, 100e9, threads=1)
  assert shares["cpu_fraction"] == pytest.approx(0.5)
  assert shares["matmul_flops_per_cpu_s"] == pytest.approx(10e9)
  assert shares["cpu_share_of_peak"] == pytest.approx(0.1)  # the wall time says 5 GFLOP/s


def test_rows_are_appended_to_what_the_file_holds(tmp_path):
  path = tmp_path / "rows.jsonl"
  path.write_text('{"kind": "old"}')  # no final newline
  cpu_efficiency.append_rows(str(path), [{"kind": "new", "x": 1}])
  cpu_efficiency.append_rows(str(path), [{"kind": "newer"}])
  rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]
  assert [r["kind"] for r in rows] == ["old", "new", "newer"]
  assert rows[1]["x"] == 1 and "provenance" in rows[1] and "provenance" not in rows[0]


@pytest.mark.slow  # a whole measurement (compiles and times a step): kept out of the default suite
def test_a_smoke_cell_reports_its_share_of_the_peak(tmp_path):
  path = tmp_path / "rows.jsonl"
  out = subprocess.run(
      [sys.executable, "-m", "experiments.cpu_efficiency.run", "--preset=smoke",
       "--cells=multiplicative:8", "--seeds=2", "--batches=2", "--repeats=1", f"--out={path}",
       f"--profile={tmp_path / 'trace'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  peak, cell = rows
  assert peak["kind"] == "matmul_peak" and peak["peak_flops_per_s"] > 0
  assert cell["seeds"] == 2 and cell["matmul_flops"] == cell["hand_matmul_flops"]
  assert cell["share_of_peak"] == pytest.approx(cell["matmul_flops_per_s"] / peak["peak_flops_per_s"])
  assert peak["peak_flops_per_cpu_s"] > 0 and 0 < cell["cpu_fraction"] <= 1.05  # one core
  assert cell["cpu_share_of_peak"] == pytest.approx(
      cell["matmul_flops"] / cell["cpu_seconds"] / peak["peak_flops_per_cpu_s"])
  assert cell["model"] == "rnn"
  assert cell["xla_flops"] < cell["flops"]  # XLA counts the scans' bodies once
  assert cell["xla_loop_aware_flops"] == pytest.approx(cell["flops"], rel=0.15)
  parts = {r["part"] for r in cell["profile"]}
  assert {"encoder", "decoder", "optimizer"} <= parts
  assert "| decoder | backward |" in out.stdout
  assert "provenance" in cell and cell["provenance"]["xla_flags"].count("intra_op") == 1


def test_the_profile_table_is_the_writers_with_each_parts_share():
  from attention_jax.analysis import tables  # pylint: disable=g-import-not-at-top
  parts = [dict(part="attention", direction="forward", ms=3.0, loop_ms=1.25, matmul_ms=2.0,
                thunks=12, loop_thunks=4),
           dict(part="output", direction="backward", ms=1.0, loop_ms=0.0, matmul_ms=0.5,
                thunks=3, loop_thunks=0)]
  assert cpu_efficiency.profile_table(parts, tables) == (
      "| part | direction | ms/step | share | in loop bodies ms | matmul ms | "
      "thunks/step (of them in loop bodies) |\n"
      "|---|---|---|---|---|---|---|\n"
      "| attention | forward | 3.0 | 75% | 1.2 | 2.0 | 12 (4) |\n"
      "| output | backward | 1.0 | 25% | 0.0 | 0.5 | 3 (0) |")
