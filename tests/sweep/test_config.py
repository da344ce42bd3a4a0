import pytest

from attention_jax.sweep import config


@pytest.mark.parametrize("preset", list(config.PRESETS))
def test_presets_are_valid(preset):
  cfg = config.from_preset(preset)
  assert cfg.arms and cfg.dims and cfg.seeds >= 1


def test_quick_and_gpu_presets_are_the_issue_sweeps():
  quick = config.from_preset("quick")
  assert set(quick.arms) == {"additive", "multiplicative", "scaled_multiplicative"}
  assert len(quick.dims) == 2 and quick.seeds == 2 and quick.dataset == "bible_en_es"
  gpu = config.from_preset("gpu")
  assert gpu.dims == (128, 256, 512, 1024) and gpu.seeds == 4 and len(gpu.arms) == 3


@pytest.mark.parametrize("field,value,match", [
    ("arms", ("additive", "bogus"), "arms"),
    ("model", "lstm", "model"),
    ("dims", (0,), "dims"),
    ("seeds", 0, "seeds"),
    ("dropout", 1.5, "dropout"),
    ("dtype", "float16", "dtype"),
    ("schedule", "linear", "schedule"),
    # non-finite or absurd values used to train and write a BLEU
    ("learning_rate", float("nan"), "learning_rate"),
    ("learning_rate", 1e4, "learning_rate"),
    ("learning_rate", 0.0, "learning_rate"),
    ("clip_norm", float("inf"), "clip_norm"),
    ("length_penalty", float("nan"), "length_penalty"),
    ("max_minutes", float("nan"), "max_minutes"),
    ("label_smoothing", float("nan"), "label_smoothing"),
])
def test_bad_values_name_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    config.from_preset("smoke", **{field: value})


def test_unknown_preset():
  with pytest.raises(ValueError, match="preset.*smoke"):
    config.from_preset("huge")
