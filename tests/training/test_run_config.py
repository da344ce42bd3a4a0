"""One run's settings (`training/run_config.py`), derived from the flags
(`sweep.config.ExperimentConfig.point`)."""

import dataclasses

import jax.numpy as jnp
import pytest

from attention_jax import models
from attention_jax.data import input_pipeline
from attention_jax.sweep import config

# The flat config a run's config.json and `workdir.fingerprint` are made of: a
# workdir made before the nested configs existed resumes only if it stays so.
DEFAULTS = {
    "arms": ("additive", "multiplicative", "scaled_multiplicative"),
    "dims": (128, 256, 512, 1024), "seeds": 4, "members": "", "additive_max_dim": 0,
    "baseline": "",
    "model": "rnn", "cell": "gru", "embed_dim": 512, "hidden_dim": 512, "encoder_layers": 1,
    "decoder_layers": 2, "num_heads": 8, "ff_dim": 2048, "dropout": 0.2, "layer_norm": "post",
    "qk_init": "glorot", "dtype": "float32", "dataset": "bible_en_es", "data_dir": "",
    "vocab_size": 8000, "max_length": 64, "batch_size": 64, "data_seed": 0, "steps": 20000,
    "learning_rate": 0.001, "adam_b2": 0.999, "schedule": "constant", "warmup_steps": 0,
    "clip_norm": 5.0, "label_smoothing": 0.0, "beam_size": 10, "val_beam_size": 0,
    "length_penalty": 0.6, "eval_every": 2000, "eval_batch_size": 256, "eval_memory_gb": 0.0,
    "eval_examples": 0, "test_examples": 0, "diag_every": 200, "checkpoint_every": 1000,
    "log_every": 100, "max_minutes": 0.0, "workers": 1,
}
# Flat fields that describe the sweep, not one of its points.
SWEEP_ONLY = {"arms", "dims", "additive_max_dim", "baseline", "model"}
FAMILY_ONLY = {"rnn": {"cell", "embed_dim"},
               "transformer": {"num_heads", "ff_dim", "layer_norm", "qk_init"}}


def test_the_flat_config_is_unchanged_key_for_key_and_in_order():
  assert list(config.ExperimentConfig().to_dict().items()) == list(DEFAULTS.items())


def _leaves(obj, out):
  """{field name: value} of every non-dataclass field of nested dataclasses,
  but for the model config (the model family's own, `_model_fields`)."""
  for field in dataclasses.fields(obj):
    value = getattr(obj, field.name)
    if field.name == "model":
      continue
    if dataclasses.is_dataclass(value) and not isinstance(value, config.Arm):
      _leaves(value, out)
    else:
      assert field.name not in out, f"{field.name} appears twice"
      out[field.name] = value
  return out


# The flags a point's model config takes, and the model field each lands in
# (written out here, not read from the code that maps them).
MODEL_FLAGS = {
    "rnn": {"embed_dim": "embed_dim", "hidden_dim": "hidden_dim", "cell": "cell",
            "encoder_layers": "encoder_layers", "decoder_layers": "decoder_layers",
            "dropout": "dropout", "dtype": "dtype"},
    "transformer": {"hidden_dim": "d_model", "num_heads": "num_heads", "ff_dim": "d_ff",
                    "encoder_layers": "encoder_layers", "decoder_layers": "num_layers",
                    "dropout": "dropout", "dtype": "dtype", "layer_norm": "pre_layer_norm",
                    "qk_init": "qk_init"},
}


@pytest.mark.parametrize("model", ["rnn", "transformer"])
def test_every_flag_of_a_point_lands_once_in_its_run_config(model):
  # Values unlike the defaults and unlike each other, so a field read from the
  # wrong flag shows.
  cfg = config.from_preset("smoke", model=model, arms=("dot",) if model == "transformer"
                           else ("additive",), dims=(8,), hidden_dim=48, num_heads=4,
                           ff_dim=96, embed_dim=24, encoder_layers=3, decoder_layers=2,
                           max_length=17, batch_size=12, data_seed=5, steps=77,
                           warmup_steps=7, val_beam_size=3, eval_examples=9,
                           test_examples=11, log_every=13, diag_every=14, eval_every=15,
                           checkpoint_every=16, workers=2, seeds=3, dropout=0.3,
                           dtype="bfloat16", layer_norm="pre" if model == "transformer"
                           else "post", qk_init="premise" if model == "transformer"
                           else "glorot", members="learning_rate=1e-3,3e-3")
  arm = config.Arm.of(cfg.arms[0], 8)
  run = cfg.point(arm)
  # The model config is the family's own, each model flag in its field once.
  assert isinstance(run.model, models.TransformerConfig if model == "transformer"
                    else models.Seq2SeqConfig)
  assert run.family == model
  flags = {flag: getattr(cfg, flag) for flag in MODEL_FLAGS[model]}
  flags.update(dtype=jnp.bfloat16, layer_norm=True)  # the flags' spellings, as values
  got = {flag: getattr(run.model, field) for flag, field in MODEL_FLAGS[model].items()}
  assert got == {flag: flags[flag] for flag in MODEL_FLAGS[model]}
  assert (run.model.score, run.model.attention_dim) == (arm.score, 8)
  # Every other flag of a point lands once in the run's other settings.
  leaves = _leaves(run, {})
  assert leaves.pop("arm") == arm
  # The flag's text, parsed: (field, values).
  assert leaves.pop("member_axes") == (("learning_rate", (1e-3, 3e-3)),)
  other = FAMILY_ONLY["rnn" if model == "transformer" else "transformer"]
  wanted = {k: v for k, v in cfg.to_dict().items()
            if k not in SWEEP_ONLY | other | {"members"} | set(MODEL_FLAGS[model])}
  assert leaves == wanted
  assert run.evaluation.validation_beam == 3
  smoke = config.from_preset("smoke", val_beam_size=0)
  assert smoke.point(smoke.sweep()[0]).evaluation.validation_beam == 2


def test_the_model_configs_build_the_model_of_their_family_and_arm():
  data = input_pipeline.load("copy", max_length=20)
  cfg = config.from_preset("smoke", model="transformer", arms=("scaled_dot",), dims=(8,),
                           hidden_dim=16, num_heads=2)
  arm = config.Arm.of("scaled_dot", 8)
  cls, model_config = cfg.point(arm).build_model(data)
  assert cls.__name__ == "Transformer"
  assert (model_config.d_model, model_config.head_dim, model_config.score) == (16, 8, "scaled_dot")
  assert model_config.vocab_size == data.tokenizer.vocab_size
  rnn = config.from_preset("smoke", arms=("none_init",), dims=(8,))
  cls, model_config = rnn.point(config.Arm.of("none_init", 8)).build_model(data)
  assert cls.__name__ == "Seq2Seq" and model_config.decoder == "none_init"
  assert model_config.hidden_dim == rnn.hidden_dim == 32
  # Only what the data sets differs from the run's model config.
  run = rnn.replace(arms=("qk_norm",)).point(config.Arm.of("qk_norm", 8))
  _, built = run.build_model(data)
  tok = data.tokenizer
  assert built == dataclasses.replace(run.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                      eos_id=tok.eos_id, sos_id=tok.sos_id)
  assert built.max_source_length == rnn.max_length + 1  # the trained length


@pytest.mark.parametrize("model,changes,flag", [
    ("transformer", dict(hidden_dim=30, num_heads=4), "`hidden_dim` (30) must be divisible by "
     "`num_heads` (4)"),
    ("transformer", dict(ff_dim=0), "`ff_dim` must be a positive int, got 0"),
    ("transformer", dict(decoder_layers=0), "`decoder_layers` must be a positive int, got 0"),
    ("transformer", dict(qk_init="xavier"), "`qk_init` must be one of ('glorot', 'premise', "
     "'zero_query'), got 'xavier'"),
    ("rnn", dict(hidden_dim=0), "`hidden_dim` must be a positive int, got 0"),
    ("rnn", dict(cell="rnn"), "`cell` must be one of ('gru', 'lstm'), got 'rnn'"),
    ("rnn", dict(dropout=1.0), "`dropout` must be a float in [0, 1), got 1.0"),
    ("rnn", dict(encoder_layers=-1), "`encoder_layers` must be a positive int, got -1"),
])
def test_a_model_setting_is_refused_by_its_model_config_naming_the_flag(model, changes, flag):
  # Checked once, by the model config the flags make; the error names the
  # flag (`hidden_dim`), not the model's field (`d_model`), in one line.
  preset = "transformer_smoke" if model == "transformer" else "smoke"
  with pytest.raises(ValueError) as info:
    config.from_preset(preset, **changes)
  message = str(info.value)
  assert flag in message and "\n" not in message, message
  assert message.startswith(f"--model={model}, arm "), message


@pytest.mark.parametrize("schedule,warmup", [("constant", 0), ("constant", 10), ("cosine", 10)])
def test_the_learning_rate_warms_up_then_holds_or_decays_to_a_tenth(schedule, warmup):
  opt = config.ExperimentConfig(schedule=schedule, warmup_steps=warmup, steps=100,
                                learning_rate=2e-3).point(config.Arm.of("additive", 8)).optimizer
  lr = opt.learning_rate_schedule()
  if warmup:
    assert float(lr(0)) == 0.0 and float(lr(warmup // 2)) == pytest.approx(1e-3)
  assert float(lr(warmup)) == pytest.approx(2e-3)
  assert float(lr(100)) == pytest.approx(2e-4 if schedule == "cosine" else 2e-3)
