"""The members split over devices (`placement.member_mesh`, `over_members_on`):
on 8 CPU devices the trainer's numbers are the one-device run's, and its
compiled step has no collective; the mesh each `--mesh` gives; 2 processes
of 4 devices give the numbers of 1 process of 8."""

import os
import subprocess
import sys
import textwrap

import pytest

from attention_jax.training import placement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("scheme, members, devices, shape", [
    ("members", 8, 8, (8, 1)), ("members", 16, 8, (8, 1)), ("data", 8, 8, (1, 8)),
    ("members,data", 4, 8, (4, 2)), ("members,data", 3, 8, (1, 8)),
    ("auto", 16, 8, (8, 1)), ("auto", 4, 8, (4, 2)), ("auto", 4, 16, (4, 4)),
    ("auto", 8, 1, (1, 1))])
def test_mesh_shape(scheme, members, devices, shape):
  assert placement.mesh_shape(scheme, members, devices) == shape


@pytest.mark.parametrize("args, match", [
    (("members", 21, 8), "`--mesh=members`: 21 members do not split over 8 devices"),
    (("auto", 21, 8), "`--mesh=members`: 21 members"),  # members first: 21 >= 8
    (("rows", 8, 8), "`--mesh` must be one of auto, members, data, members,data"),
    (("members", 0, 8), "`num_members`")])
def test_mesh_shape_names_what_does_not_fit(args, match):
  with pytest.raises(ValueError, match=match):
    placement.mesh_shape(*args)


def test_member_mesh_needs_every_device_once():
  with pytest.raises(ValueError, match=r"`members` x `data` \(4 x 4\) must equal the number of "
                                       r"devices \(8\)"):
    placement.member_mesh(list(range(8)), 4, 4)
  with pytest.raises(ValueError, match="`data` must be an integer >= 1"):
    placement.member_mesh(list(range(8)), 8, 0)


# The smoke model, smaller, with 8 members, trained 3 steps on one device
# and on 8 (members split one per device; members x data, 4 x 2); prints
# what the test compares.
_SCRIPT = textwrap.dedent("""\
    import json
    import jax, numpy as np
    from attention_jax.data import input_pipeline
    from attention_jax.sweep import config
    from attention_jax.training import placement, train_lib
    assert jax.device_count() == 8, jax.devices()
    cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), seeds=8, embed_dim=16,
                             hidden_dim=16, batch_size=16, eval_batch_size=16, dropout=0.1)
    data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
    out = {}
    for name, mesh in (("one", None), ("members", placement.member_mesh(jax.devices(), 8)),
                       ("members,data", placement.member_mesh(jax.devices(), 4, 2))):
      t = train_lib.EnsembleTrainer(cfg.point(config.Arm.of("additive", 8)), data, mesh=mesh)
      it = t.train_batches(0)
      batch = next(it)
      src, tgt_in, tgt_out = t.evaluator.teacher_forced(batch)
      text = t._train_step.lower(t.params, t.rest, t.opt_state, np.int32(0), src, tgt_in,
                                 tgt_out).compile().as_text()
      losses = []
      for b in (batch, next(it), next(it)):
        t.state = t.step(t.state, b)
        losses.append(t.state.loss)
      leaves = jax.tree.leaves(t.params)
      out[name] = {"losses": np.stack(losses).tolist(),
                   "params": [np.asarray(x).tolist() for x in leaves],
                   "sharding": str(getattr(leaves[0].sharding, "spec", None)),
                   "all_reduce": "all-reduce" in text, "all_gather": "all-gather" in text}
    print("RESULT " + json.dumps(out))
    """)


@pytest.mark.slow  # 68 s of CPU (236 s wall on the 2 loaded cores), three trainers compiled
def test_members_split_over_8_devices_give_the_one_device_numbers_and_no_collective():
  import numpy as np  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env={**os.environ, **EIGHT},
                        capture_output=True, text=True, timeout=900)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  out = __import__("json").loads(lines[-1][len("RESULT "):])
  one, members, both = out["one"], out["members"], out["members,data"]
  # Each device runs its own member as the one device ran it: the same
  # numbers, to the bit, with dropout on (each member its own key).
  assert members["losses"] == one["losses"]
  assert members["params"] == one["params"]
  assert members["sharding"] == "P('members',)"
  assert not members["all_reduce"] and not members["all_gather"]
  # Members x data sums the gradients over the 2 devices of each group: an
  # all-reduce, and sums in another order (float32 rounding).
  assert both["all_reduce"]
  np.testing.assert_allclose(both["losses"], one["losses"], rtol=1e-5)
  for a, b in zip(both["params"], one["params"]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)


_ARGS = ["--preset=smoke", "--arms=additive", "--dims=8", "--steps=20", "--seeds=8",
         "--embed_dim=16", "--hidden_dim=16", "--eval_every=10", "--checkpoint_every=10",
         "--diag_every=10", "--log_every=10", "--eval_examples=16", "--test_examples=16",
         "--mesh=members"]


def _ablation(workdir, *extra, devices):
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.ablation", *_ARGS, f"--workdir={workdir}", *extra],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # three runs of 8 members, two of them one process each
@pytest.mark.timeout(2400)
def test_two_processes_of_4_devices_equal_one_process_of_8_with_the_members_split(tmp_path):
  from tests.training import test_distributed as distributed  # pylint: disable=g-import-not-at-top
  one = _ablation(tmp_path / "one", devices=8)
  out_one, _ = one.communicate(timeout=900)
  assert one.returncode == 0, out_one
  coordinator = f"localhost:{distributed._free_port()}"  # pylint: disable=protected-access
  procs = [_ablation(tmp_path / "two", f"--coordinator_address={coordinator}",
                     "--num_processes=2", f"--process_id={i}", devices=4) for i in range(2)]
  outs = [p.communicate(timeout=900)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  strip = lambda rows: [{k: v for k, v in r.items() if k not in ("train_seconds", "provenance")}
                        for r in rows]
  rows = distributed._rows  # pylint: disable=protected-access
  rows_one = strip(rows(tmp_path / "one" / "results.jsonl"))
  assert len(rows_one) == 8 and all(r["test_bleu"] is not None for r in rows_one)
  assert rows_one == strip(rows(tmp_path / "two" / "results.jsonl"))
  metrics = os.path.join("runs", "additive_d8", "metrics.jsonl")
  assert rows(tmp_path / "two" / metrics) == rows(tmp_path / "one" / metrics)
  # And the same as one device: each member ran as it would alone there.
  alone = _ablation(tmp_path / "alone", devices=1)
  out_alone, _ = alone.communicate(timeout=900)
  assert alone.returncode == 0, out_alone
  assert strip(rows(tmp_path / "alone" / "results.jsonl")) == rows_one


def test_members_that_do_not_split_are_refused_in_one_line_before_any_work(tmp_path):
  proc = _ablation(tmp_path / "w", "--seeds=3", devices=8)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 1
  assert out.strip().splitlines()[-1] == (
      "error: `--mesh=members`: 3 members do not split over 8 devices; give a multiple of 8 "
      "members (seeds x learning rates) or `--mesh=members,data`.")
  assert not os.path.exists(tmp_path / "w" / "runs")


# The evaluation programs on the same 8 devices: perplexity, beam decoding
# and the softmax diagnostics of 8 members, on one device and split one per
# device; what the test compares (the compiled programs' collectives too).
_EVAL_SCRIPT = textwrap.dedent("""\
    import json
    import jax, numpy as np
    from attention_jax.data import input_pipeline
    from attention_jax.sweep import config
    from attention_jax.training import placement, train_lib
    assert jax.device_count() == 8, jax.devices()
    cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), seeds=8, embed_dim=16,
                             hidden_dim=16, batch_size=16, eval_batch_size=16,
                             eval_examples=16, test_examples=16)
    data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
    COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all",
                   "reduce-scatter")
    out = {}
    for name, mesh in (("one", None), ("members", placement.member_mesh(jax.devices(), 8))):
      t = train_lib.EnsembleTrainer(cfg.point(config.Arm.of("additive", 8)), data, mesh=mesh)
      ev = t.evaluator
      batch = next(t.train_batches(0))
      src, tgt_in, tgt_out = ev.teacher_forced(batch)
      texts = {
          "eval": ev._eval_step.lower(t.params, t.rest, src, tgt_in, tgt_out),
          "decode": ev._decoder(2).lower(t.params, t.rest, src),
          "diagnostics": t._diag_step.lower(t.params, t.rest, src, tgt_in, tgt_out)}
      texts = {k: v.compile().as_text() for k, v in texts.items()}
      hyps, _ = ev.translate(t.params, "validation", 16, 2)
      diag = t.diagnose(t.params, batch)
      out[name] = {"collectives": {k: [c for c in COLLECTIVES if c in text]
                                   for k, text in texts.items()},
                   "ppl": np.asarray(ev.perplexity(t.params, "validation")).tolist(),
                   "hyps": hyps,
                   "max_logit": np.asarray(diag["max_logit"]).tolist()}
    print("RESULT " + json.dumps(out))
    """)


@pytest.mark.slow  # two trainers and their evaluators compiled on 8 host devices
def test_evaluation_on_a_members_mesh_holds_no_collective_and_gives_the_one_device_numbers():
  proc = subprocess.run([sys.executable, "-c", _EVAL_SCRIPT], cwd=ROOT,
                        env={**os.environ, **EIGHT}, capture_output=True, text=True, timeout=900)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  out = __import__("json").loads(lines[-1][len("RESULT "):])
  one, members = out["one"], out["members"]
  # Each device evaluates its own member: no program moves data between devices...
  assert members["collectives"] == {"eval": [], "decode": [], "diagnostics": []}
  # ... and each member's numbers are one device's: the translations and the
  # diagnostics to the bit, the perplexity (a sum over batches) to float32
  # rounding (3e-8 relative measured).
  import numpy as np  # pylint: disable=g-import-not-at-top
  np.testing.assert_allclose(members["ppl"], one["ppl"], rtol=1e-6)
  assert members["hyps"] == one["hyps"]
  assert members["max_logit"] == one["max_logit"]


def test_a_checkpoint_records_its_layout_and_a_resume_on_another_says_so():
  one = placement.Placement(None).layout()
  assert one == {"devices": 1, "members": 1, "data": 1}
  two = {"devices": 2, "members": 2, "data": 1}
  assert placement.layout_change(one, one) is None
  assert placement.layout_change(None, two) is None  # a checkpoint from before layouts
  assert placement.layout_change(one, two) == (
      "its checkpoint was trained on 1 device, this run is on 2 devices (members 2 x data 1): "
      "from here its numbers may differ from an uninterrupted run's in float32 rounding "
      "(docs/method.md)")
  assert "on 8 devices (members 4 x data 2), this run is on 1 device" in placement.layout_change(
      {"devices": 8, "members": 4, "data": 2}, one)


# The Transformer's members on 2 devices: 5 steps of a tiny one on one device
# and split one member per device; then a run of 4 steps checkpointed at
# step 2 on one device and resumed on both. Prints what the test compares.
_TRANSFORMER_SCRIPT = textwrap.dedent("""\
    import json, sys
    import jax, numpy as np
    from attention_jax.data import input_pipeline
    from attention_jax.sweep import config
    from attention_jax.training import placement, train_lib
    assert jax.device_count() == 2, jax.devices()
    cfg = config.from_preset("transformer_smoke", arms=("scaled_dot",), dims=(8,), seeds=1,
                             members="learning_rate=1e-3,3e-3", hidden_dim=16, ff_dim=32,
                             batch_size=16, eval_batch_size=16, steps=4, warmup_steps=2,
                             checkpoint_every=2, eval_every=4, diag_every=2, log_every=2,
                             eval_examples=8, test_examples=8)
    data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
    point = cfg.point(config.Arm.of("scaled_dot", 8))
    both = placement.member_mesh(jax.devices(), 2)
    out = {}
    for name, mesh in (("one", None), ("members", both)):
      t = train_lib.EnsembleTrainer(point, data, mesh=mesh)
      it, losses = t.train_batches(0), []
      for _ in range(5):
        t.state = t.step(t.state, next(it))
        losses.append(t.state.loss.tolist())
      out[name] = {"losses": losses,
                   "params": [np.asarray(x).tolist() for x in jax.tree.leaves(t.params)]}
    lines = []
    train_lib.EnsembleTrainer(point, data).run(sys.argv[1], log=lines.append, deadline=0.0)
    train_lib.EnsembleTrainer(point, data, mesh=both).run(sys.argv[1], log=lines.append)
    out["lines"] = lines
    print("RESULT " + json.dumps(out))
    """)


@pytest.mark.slow  # four tiny Transformer trainers on 2 host devices (~60 s on 2 busy cores)
def test_the_transformers_members_over_devices_are_one_devices_to_rounding_and_a_resume_says_so(
    tmp_path):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tests.conftest import xla_flags_with  # pylint: disable=g-import-not-at-top
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": xla_flags_with("--xla_force_host_platform_device_count=2")}
  proc = subprocess.run([sys.executable, "-c", _TRANSFORMER_SCRIPT, str(tmp_path / "run")],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  out = __import__("json").loads(lines[-1][len("RESULT "):])
  one, members = out["one"], out["members"]
  # Not to the bit, as the RNN's (docs/method.md): the softmax's gradient
  # inside `shard_map` divides where one device multiplies by a reciprocal;
  # Adam carries the last bits into parameters whose gradient is near 0.
  np.testing.assert_allclose(members["losses"], one["losses"], rtol=1e-6)
  for a, b in zip(members["params"], one["params"]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-3)
  resumed = [l for l in out["lines"] if "resumed at step" in l]
  assert resumed == [
      "[scaled_dot d=8] resumed at step 2; its checkpoint was trained on 1 device, this run is "
      "on 2 devices (members 2 x data 1): from here its numbers may differ from an "
      "uninterrupted run's in float32 rounding (docs/method.md)"]
