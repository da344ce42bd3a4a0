"""The ensemble trainer: vmapped seeds == separate runs; data parallelism == one device."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
from flax import nnx
import numpy as np
import pytest

from attention_jax import models
from attention_jax.analysis import significance, tables
from attention_jax.data import input_pipeline
from attention_jax.sweep import config
from attention_jax.training import checkpoints, evaluation, memory, metrics_log
from attention_jax.training import run_config, state as state_lib, steps, train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refuse(constant):
  raise ValueError(f"not JSON: {constant}")


def _cfg(**kw):
  return config.from_preset("smoke", **{"arms": ("additive",), "dims": (8,), **kw})


def _trainer(cfg, arm, data, seeds, **kw):
  """The trainer of `cfg`'s point `arm` at dimension `cfg.dims[0]`."""
  return train_lib.EnsembleTrainer(cfg.point(config.Arm.of(arm, cfg.dims[0])), data, seeds, **kw)


def _take_steps(trainer, batches, steps: int) -> np.ndarray:
  """`steps` training steps of `trainer` on the next batches of `batches`,
  into its state: the losses `[steps, E]`."""
  losses = []
  for _ in range(steps):
    trainer.state = trainer.step(trainer.state, next(batches))
    losses.append(trainer.state.loss)
  return np.stack(losses)


def _train(cfg, seeds, steps=3):
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = _trainer(cfg, "additive", data, seeds)
  return trainer, _take_steps(trainer, trainer.train_batches(0), steps)


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_vmapped_seeds_equal_separate_runs():
  cfg = _cfg(dropout=0.1)  # dropout on: each member must draw its own stream
  joint, joint_losses = _train(cfg, (0, 1))
  for e, seed in [(1, 1)]:  # member 1: a mix-up of keys or members would show here
    alone, losses = _train(cfg, (seed,))
    np.testing.assert_allclose(joint_losses[:, e], losses[:, 0], rtol=2e-5, atol=2e-6)
    for a, b in zip(jax.tree.leaves(joint.params), jax.tree.leaves(alone.params)):
      np.testing.assert_allclose(np.asarray(a)[e], np.asarray(b)[0], rtol=2e-4, atol=2e-6)
  # different seeds really are different models
  p = jax.tree.leaves(joint.params)[0]
  assert not np.allclose(np.asarray(p)[0], np.asarray(p)[1])


def test_token_loss_ignores_padding():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 7))
  targets = np.array([[3, 4, 1, 0], [5, 1, 0, 0]])
  loss, ntok = steps.token_loss(logits, targets, pad_id=0)
  logp = jax.nn.log_softmax(logits)
  picked = [-logp[b, t, targets[b, t]] for b in range(2) for t in range(4) if targets[b, t]]
  assert float(ntok) == 5
  assert float(loss) == pytest.approx(float(np.mean(picked)), rel=1e-6)


def test_token_loss_label_smoothing_matches_smoothed_one_hot_cross_entropy():
  logits = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 6)) * 3
  targets = np.array([[3, 4, 1], [5, 1, 0]])
  eps = 0.1
  logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
  want = []
  for b in range(2):
    for t in range(3):
      if targets[b, t]:
        q = np.full(6, eps / 6)  # optax.smooth_labels: (1 - eps) * onehot + eps / V
        q[targets[b, t]] += 1 - eps
        want.append(-(q * logp[b, t]).sum())
  loss, _ = steps.token_loss(logits, targets, pad_id=0, label_smoothing=eps)
  assert float(loss) == pytest.approx(np.mean(want), rel=1e-6)


@pytest.fixture(scope="module")
def untrained_pair():
  """The smoke point's trainer of seeds 0 and 1, untrained: read, never
  changed, by the tests that take it (building one compiles its model's
  initialisation, ~3 s on 2 cores)."""
  cfg = _cfg()
  assert cfg.seeds == 2
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  return cfg, data, _trainer(cfg, "additive", data, (0, 1))


def test_perplexity_is_exp_of_token_nll_over_the_whole_split(untrained_pair):
  """The trainer's perplexity against a hand computation from the model's
  own teacher-forced log-probabilities, batch by batch over the split."""
  _, data, trainer = untrained_pair
  ppl = trainer.evaluator.perplexity(trainer.params, "validation")
  assert ppl.shape == (2,)
  nll, ntok, rows = np.zeros(2), 0, 0
  # one model's logits, compiled (eager, this loop took ~160 s)
  apply = jax.jit(lambda params, rest, src, tgt_in: nnx.merge(
      trainer.graphdef, params, rest)(src, tgt_in))
  for batch in data.batches("validation", 7, shuffle=False):  # another batch size on purpose
    tgt_in = steps.decoder_input(batch.tgt, 2, 0)
    for e in range(2):
      logits, _ = apply(jax.tree.map(lambda x: x[e], trainer.params),
                        jax.tree.map(lambda x: x[e], trainer.rest), batch.src, tgt_in)
      logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
      for b, t in zip(*np.nonzero(batch.tgt)):
        nll[e] -= logp[b, t, batch.tgt[b, t]]
    ntok += int((batch.tgt != 0).sum())
    rows += batch.num_real
  assert rows == data.num_examples("validation")  # every sentence once
  np.testing.assert_allclose(ppl, np.exp(nll / ntok), rtol=1e-5)
  # an untrained model is close to uniform over the vocabulary
  assert 0.5 * trainer.tok.vocab_size < ppl.min() and ppl.max() < 2 * trainer.tok.vocab_size


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
@pytest.mark.parametrize("poison", ["nan_params", "huge_loss"])
def test_a_diverged_member_is_recorded_as_diverged_never_as_a_bleu(tmp_path, poison):
  """Issue 12: one member's NaN parameters (what lr=nan did after one step) or an
  exploding loss must give a diverged row, not a BLEU; the other member is
  untouched and the table marks the cell."""
  cfg = _cfg(steps=4, eval_every=2, diag_every=2, checkpoint_every=2, log_every=2,
             eval_examples=8, test_examples=8)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = _trainer(cfg, "additive", data, (0, 1))
  if poison == "nan_params":
    trainer.state = trainer.state.replace(
        params=jax.tree.map(lambda x: x.at[1].set(np.nan), trainer.params))
  else:
    trainer.diverged_loss = 0.0  # every loss counts as exploded...
    real = trainer.step

    def step(state, batch):  # ...for seed 1
      state = real(state, batch)
      return state.replace(loss=state.loss * np.array([0.0, 1.0]))

    trainer.step = step
  lines = []
  result = trainer.run(str(tmp_path), log=lines.append)
  good, bad = result.rows
  assert bad["diverged_at_step"] == 1 and bad["test_bleu"] is None and bad["val_bleu"] is None
  assert good["diverged_at_step"] is None and good["test_bleu"] is not None
  assert result.translations["hypotheses"][1] is None
  assert sum("diverged at step 1" in line for line in lines) == 1  # said once, not per step
  metrics = metrics_log.MetricsLog(str(tmp_path / "metrics.jsonl")).read()
  assert all(r["val_bleu"] is None for r in metrics if r["seed"] == 1 and "val_bleu" in r)
  # Strict JSON on every line: a NaN loss is written as null, not as a bare NaN.
  with open(tmp_path / "metrics.jsonl") as f:
    strict = [json.loads(line, parse_constant=_refuse) for line in f]
  assert strict == metrics
  if poison == "nan_params":
    assert any(r["loss"] is None for r in strict if r["seed"] == 1 and "loss" in r)
  table = tables.britz_table(result.rows, ["additive"], [8])
  assert "diverged (1 of 2 seeds)" in table
  other = {"references": result.translations["references"], "hypotheses": [["x"] * 8, None]}
  assert significance.compare_runs(other, result.translations)["p"] and \
      significance.compare_runs({**other, "hypotheses": [None, None]},
                                result.translations)["delta"] is None


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_a_run_resumed_from_its_checkpoint_gives_the_uninterrupted_runs_numbers(tmp_path):
  """A run paused by its deadline right after the checkpoint of step 2, then
  resumed, logs the same metrics byte for byte and ends in the same rows as
  the run trained in one go: the checkpoint holds everything a step needs."""
  cfg = _cfg(steps=4, eval_every=2, diag_every=2, checkpoint_every=2, log_every=2,
             eval_examples=8, test_examples=8)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  quiet = lambda _: None
  whole = _trainer(cfg, "additive", data, (0, 1)).run(str(tmp_path / "whole"), log=quiet)
  lines = []
  paused = _trainer(cfg, "additive", data, (0, 1)).run(str(tmp_path / "pieces"),
                                                         log=lines.append, deadline=0.0)
  assert paused is None and any("time budget reached at step 2" in l for l in lines)
  # Said before the first step and after it, not only at the first progress line.
  said = [l for l in lines if "with compilation" in l or "evaluation batches chosen" in l]
  assert said[0].startswith("[additive d=8] evaluation batches chosen in ")
  assert re.fullmatch(r"\[additive d=8\] step 1: \d+\.\d s with compilation", said[1])
  assert all("with compilation (a new batch shape: " in l for l in said[2:])
  trainer = _trainer(cfg, "additive", data, (0, 1))
  _, meta = checkpoints.Checkpointer(str(tmp_path / "pieces" / "checkpoints")).restore_latest(
      trainer.state.arrays())
  assert list(meta) == ["step", "train_seconds", "best_bleu", "best_step", "diverged_at",
                        "best_ppl", "layout"]
  assert meta["layout"] == {"devices": 1, "members": 1, "data": 1}
  assert meta["step"] == 2 and meta["best_step"] == [2, 2] and meta["diverged_at"] == [0, 0]
  # A checkpoint written before best perplexities were kept gets them back
  # from the metrics log (6 significant digits there).
  history = metrics_log.MetricsLog(str(tmp_path / "pieces" / "metrics.jsonl"),
                                   write=False).read()
  older = {k: v for k, v in meta.items() if k != "best_ppl"}
  np.testing.assert_allclose(state_lib.with_logged_best_ppl(older, history, (0, 1))["best_ppl"],
                             meta["best_ppl"], rtol=5e-6)
  lines = []
  resumed = trainer.run(str(tmp_path / "pieces"), log=lines.append)
  assert "[additive d=8] resumed at step 2" in lines
  compiled = [l for l in lines if "s with compilation" in l]
  assert re.fullmatch(r"\[additive d=8\] step 3: \d+\.\d s with compilation", compiled[0])
  assert all("with compilation (a new batch shape: " in l for l in compiled[1:])
  assert any(l.startswith("[additive d=8] step 3: ") for l in lines)  # the step it resumed with
  assert not any("step 2/4" in line for line in lines)  # no step trained twice
  timeless = lambda rows: [{k: v for k, v in r.items() if k != "train_seconds"} for r in rows]
  assert timeless(resumed.rows) == timeless(whole.rows)
  assert resumed.translations == whole.translations
  for run in ("whole", "pieces"):
    assert (tmp_path / run / "metrics.jsonl").exists()
  assert ((tmp_path / "pieces" / "metrics.jsonl").read_bytes()
          == (tmp_path / "whole" / "metrics.jsonl").read_bytes())


def test_decoder_input_shifts_right_and_keeps_filler_rows_empty():
  tgt = np.array([[7, 8, 1, 0], [0, 0, 0, 0]])
  out = steps.decoder_input(tgt, sos_id=2, pad_id=0)
  np.testing.assert_array_equal(out, [[2, 7, 8, 1], [0, 0, 0, 0]])


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_data_parallel_on_four_cpu_devices_matches_one_device():
  script = textwrap.dedent("""
      import jax, numpy as np
      from attention_jax.analysis import significance, tables
      from attention_jax.data import input_pipeline
      from attention_jax.sweep import config
      from attention_jax.training import train_lib
      assert jax.device_count() == 4, jax.devices()
      cfg = config.from_preset("smoke", arms=("additive",), dims=(8,))
      data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
      out = []
      for mesh in (None, jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))):
        t = train_lib.EnsembleTrainer(cfg.point(config.Arm.of("additive", 8)), data, (0, 1),
                                      mesh=mesh)
        it, losses = t.train_batches(0), []
        for _ in range(3):
          t.state = t.step(t.state, next(it))
          losses.append(t.state.loss)
        out.append((np.stack(losses), jax.tree.leaves(t.params)))
      np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
      for a, b in zip(out[0][1], out[1][1]):
        # sharded reductions sum in another order: ~1e-6 after 3 Adam steps
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
      print("SHARDED-OK")
  """)
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
         "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert "SHARDED-OK" in proc.stdout, proc.stderr[-3000:]


def test_the_transformer_config_honours_both_depths_and_fits_every_split():
  # --encoder_layers used to be ignored (the encoder got decoder_layers)
  cfg = _cfg(model="transformer", arms=("scaled_dot",), encoder_layers=1, decoder_layers=2,
             hidden_dim=16, num_heads=2)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  arm = config.Arm.of("scaled_dot", 8)
  run = cfg.point(arm)
  assert isinstance(run.model, models.TransformerConfig) and run.model.d_model == 16
  cls, model_config = run.build_model(data)
  assert (model_config.num_encoder_layers, model_config.num_layers) == (1, 2)
  assert model_config.head_dim == 8
  longest = max(int(data.token_ids(s)[0].lengths.max()) for s in ("train", "validation", "test"))
  assert model_config.max_length >= longest + 1  # evaluation is not length-filtered


def test_the_location_score_is_built_for_every_sentence_evaluation_sees():
  # Trained on sentences of at most 8 tokens, evaluated on all: the location
  # score needs an output for every position of the widest evaluation batch.
  cfg = _cfg(arms=("location",), max_length=8)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  widest = max(b.src.shape[1] for split in ("validation", "test")
               for b in data.batches(split, cfg.eval_batch_size, shuffle=False))
  assert widest > cfg.max_length + 1
  trainer = _trainer(cfg, "location", data, (0,))
  assert trainer.model_config.max_source_length == widest == run_config.batch_width(data)
  trainer.evaluator.check_memory(log=lambda _: None)
  assert np.isfinite(_take_steps(trainer, trainer.train_batches(0), 1)).all()
  bleu = trainer.evaluator.bleu(trainer.params, "validation", 0, trainer.evaluator.val_beam_size)
  ppl = trainer.evaluator.perplexity(trainer.params, "validation")
  assert 0 <= bleu[0] <= 100 and np.isfinite(ppl[0]) and ppl[0] >= 1


def test_the_training_state_is_measured_without_allocating_it(untrained_pair, monkeypatch):
  cfg, data, trainer = untrained_pair  # 2 seeds
  # The step counted by its lower bound alone (XLA's count of the compiled
  # step: `test_memory.py`): the state's accounting is what is tested.
  monkeypatch.setattr(memory, "step_memory",
                      lambda run, data, budget: memory.step_bytes(run, data))
  arm = config.Arm.of("additive", 8)
  count, need = memory.state_bytes(cfg.point(arm), data)
  held = sum(x.nbytes for x in jax.tree.leaves(trainer.state.arrays()))  # params, Adam, best
  assert count == trainer.num_params and need == 4 * 4 * count * 2
  assert need <= held <= need + 64  # and Adam's step counters
  need += memory.step_bytes(cfg.point(arm), data)  # and a lower bound of one training step
  memory.check_memory(cfg.point(arm), data, available=need)  # fits exactly
  with pytest.raises(ValueError, match=r"additive d=8: 2 seed\(s\) .* --dims") as info:
    memory.check_memory(cfg.point(arm), data, available=need - 1)
  assert "\n" not in str(info.value)
  two = _cfg(seeds=2, workers=2)  # two worker processes share the memory
  with pytest.raises(ValueError, match="shared by 2 --workers"):
    memory.check_memory(two.point(arm), data, available=2 * need - 1)
  # An absurd size is measured in an instant: nothing of it is allocated.
  huge_count, huge = memory.state_bytes(cfg.point(config.Arm.of("additive", 10**9)), data)
  assert huge_count > 6 * 10**10 and huge > 10**12


def test_a_flag_of_the_other_model_family_is_refused():
  config.check_family("rnn", {"cell": "lstm", "embed_dim": 64})
  config.check_family("transformer", {"num_heads": 4, "hidden_dim": 64})
  with pytest.raises(ValueError, match="`cell` applies only to the RNN"):
    config.check_family("transformer", {"cell": "lstm"})
  with pytest.raises(ValueError, match="`num_heads` applies only to the Transformer"):
    config.check_family("rnn", {"num_heads": 4})


@pytest.mark.parametrize("model", ["rnn", "transformer"])
@pytest.mark.parametrize("arm", ["qk_norm", "inverse_dim"])
def test_the_modern_fixes_train_in_both_families_with_their_diagnostics(model, arm):
  # opt-in arms, built by the trainer in either model family
  extra = dict(hidden_dim=16, num_heads=2) if model == "transformer" else {}
  cfg = _cfg(model=model, arms=(arm,), **extra)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = _trainer(cfg, arm, data, (0,))
  batches = trainer.train_batches(0)
  losses = _take_steps(trainer, batches, 2)[:, 0]
  assert all(np.isfinite(losses))
  g = [np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(trainer.params)
       if "'g'" in jax.tree_util.keystr(path) or ".g" in jax.tree_util.keystr(path)]
  if arm == "qk_norm":  # one learned g per attention layer, near log2(L^2 - L) after 2 steps
    length = cfg.max_length + 1 if model == "rnn" else trainer.model_config.max_length
    layers = 1 if model == "rnn" else (cfg.encoder_layers + 2 * cfg.decoder_layers)
    assert len(g) == layers
    for value in g:
      np.testing.assert_allclose(value, np.log2(length ** 2 - length), atol=0.05)
  else:
    assert not g
  stats = trainer.diagnose(trainer.params, next(batches))
  peak = float(stats["max_logit"][0])
  logged = sorted(k for k in stats if k.startswith("qk_norm_g"))
  if arm == "qk_norm":  # |g · cos| <= g
    assert 0.0 < peak <= max(float(np.max(np.abs(x))) for x in g) + 1e-4
    # every learned g is in the diagnostics, named like the max logits
    expected = ["qk_norm_g"] if model == "rnn" else [
        "qk_norm_g_cross_l0", "qk_norm_g_decoder_self_l0", "qk_norm_g_encoder_self_l0"]
    assert logged == expected
    np.testing.assert_allclose(sorted(float(stats[k][0]) for k in logged),
                               sorted(float(x[0]) for x in g), rtol=1e-6)
  else:
    assert np.isfinite(peak) and not logged
  if model == "transformer":
    per_layer = {k for k in stats if k.startswith("max_logit_")}
    assert per_layer == {"max_logit_encoder_self_l0", "max_logit_decoder_self_l0",
                         "max_logit_cross_l0"}
    np.testing.assert_allclose(stats["max_logit_cross_l0"], stats["max_logit"], rtol=1e-6)


def _big_dk_trainer(**kw):
  # d_k 128 over d_model 16 and batches of at most 16 sentences: the choice is
  # the same search at any size; these keep the test split's beam-4
  # translation at the chosen batch short (d_k 512 and 64 sentences: ~25 s more).
  cfg = _cfg(model="transformer", arms=("dot",), dims=(128,), hidden_dim=16, num_heads=2,
             eval_batch_size=16, beam_size=4, **kw)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  return _trainer(cfg, "dot", data, (0,))


def test_evaluation_batches_are_chosen_to_fit_the_memory_budget(tmp_path):
  # A budget no sentence fits in: one line naming the flag, before any training.
  trainer = _big_dk_trainer(eval_memory_gb=1e-6)
  evaluator = trainer.evaluator
  with pytest.raises(ValueError, match=r"beam4 on test needs .* GiB for one sentence.*"
                                       r"--eval_memory_gb"):
    evaluator.eval_batch_size("beam4", "test")
  with pytest.raises(ValueError, match="eval_memory_gb"):
    trainer.run(str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "1")
  # XLA's memory analysis of the beam-4 test decoding of 16 sentences (the
  # tiny budget forces the compiled figure, not the bound).
  need = evaluator._program_bytes("beam4", "test", 16)
  budget = need / 3
  # The same evaluator under that budget, as `--eval_memory_gb` would give it:
  # its programs compiled above are not compiled again (a second trainer of
  # the same model compiled them anew, ~10 s on 2 cores).
  evaluator.settings = dataclasses.replace(evaluator.settings, eval_memory_gb=budget / 2**30)
  evaluator._batch_sizes.clear()
  assert evaluator.budget() == int(budget)
  size = evaluator.eval_batch_size("beam4", "test")
  assert 1 <= size < 16
  assert evaluator._program_bytes("beam4", "test", size) <= budget
  assert evaluator._program_bytes("beam4", "test", size + 1) > budget  # the largest that fits
  # and the decoding it chose runs and translates every test sentence
  hyps, refs = evaluator.translate(trainer.params, "test", 0, 4)
  assert len(hyps[0]) == len(refs) == len(trainer.data.texts("test")[0])


def test_transformer_diagnostics_cover_every_layer_and_kind():
  cfg = _cfg(model="transformer", arms=("scaled_dot",), hidden_dim=16, num_heads=2,
             encoder_layers=2, decoder_layers=1)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = _trainer(cfg, "scaled_dot", data, (0, 1))
  stats = trainer.diagnose(trainer.params, next(trainer.train_batches(0)))
  kinds = {"encoder_self": 2, "decoder_self": 1, "cross": 1}
  for name in ("logit_std", "entropy", "saturated", "max_logit"):
    per_layer = {k for k in stats if k.startswith(name + "_") and k[len(name) + 1:].split(
        "_l")[0] in kinds}
    assert per_layer == {f"{name}_{kind}_l{i}" for kind, n in kinds.items()
                         for i in range(n)}, name
    # one decoder layer: its cross attention is the whole of the global statistic
    np.testing.assert_allclose(stats[f"{name}_cross_l0"], stats[name], rtol=1e-5)
  for kind, n in kinds.items():
    for i in range(n):
      assert np.all((0 < stats[f"entropy_{kind}_l{i}"]) & (stats[f"entropy_{kind}_l{i}"] <= 1))
      assert np.all((0 <= stats[f"saturated_{kind}_l{i}"]) & (stats[f"saturated_{kind}_l{i}"] <= 1))


@pytest.mark.slow
def test_a_piece_stops_before_a_final_evaluation_that_would_pass_its_deadline(tmp_path,
                                                                            monkeypatch):
  """A sweep piece must never pass its minutes because of the final test decode:
  when the estimate says it would, the run stops with its last checkpoint saved,
  and the next piece only evaluates (no step trained again)."""
  cfg = _cfg(steps=4, eval_every=2, diag_every=2, checkpoint_every=2, log_every=2,
             eval_examples=8, test_examples=8, seeds=1)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  asked = []

  def long_evaluation(*args):
    asked.append(args)
    return 1e6  # seconds: far beyond any deadline below

  monkeypatch.setattr(evaluation, "final_evaluation_seconds", long_evaluation)
  deadline = __import__("time").time() + 3600
  lines = []
  trainer = _trainer(cfg, "additive", data, (0,))
  assert trainer.run(str(tmp_path), log=lines.append, deadline=deadline) is None
  assert asked and asked[0][0] > 0  # estimated from a timed validation
  assert asked[0][1:] == (8, cfg.val_beam_size or cfg.beam_size, 8, cfg.beam_size)
  assert any("would pass the time budget" in line for line in lines)
  # The next piece: resumed at the last step, evaluated without training.
  lines = []
  trainer = _trainer(cfg, "additive", data, (0,))
  result = trainer.run(str(tmp_path), log=lines.append, deadline=deadline)
  assert result is not None and result.rows[0]["steps"] == 4
  assert result.rows[0]["test_bleu"] is not None
  assert any("resumed at step 4" in line for line in lines)
  assert not any("loss" in line and "step 4/4" in line for line in lines)


@pytest.mark.slow  # 60 s of CPU on the 2-core Xeon: two trainers' evaluation programs compile
def test_the_evaluation_batch_size_changes_no_translation_and_the_perplexity_by_rounding():
  # Why `eval_batch_size` may be left out of a run's identity (`changes_numbers=False`):
  # it only groups the sentences evaluated. The translations, hence BLEU, are the
  # same; the perplexity, summed in float32 over other groupings, is the same to
  # float32 rounding (2e-7 relative measured), not bit for bit.
  measured = []
  for eval_batch_size in (256, 7):
    cfg = _cfg(eval_batch_size=eval_batch_size, beam_size=2, test_examples=48)
    data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
    trainer = _trainer(cfg, "additive", data, (0, 1))
    _take_steps(trainer, trainer.train_batches(0), 3)
    measured.append(trainer.evaluator.final_test(trainer.params, np.array([True, True])))
  wide, narrow = measured
  assert wide.hypotheses == narrow.hypotheses and wide.bleu == narrow.bleu
  np.testing.assert_allclose(wide.val_ppl, narrow.val_ppl, rtol=1e-6)

