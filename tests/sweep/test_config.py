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


@pytest.mark.parametrize("rate", [1e-300, 1e-45, 1e-39])  # 0, and subnormal, in float32
def test_a_learning_rate_float32_cannot_hold_is_one_line_naming_it(rate):
  with pytest.raises(ValueError) as e:
    config.from_preset("smoke", learning_rate=rate)
  assert str(e.value).startswith(f"`learning_rate` {rate!r} is below float32's smallest normal")
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"`--members` learning_rate=1e-300: `learning_rate`"):
    config.from_preset("smoke", members="learning_rate=1e-3,1e-300")
  assert config.from_preset("smoke", learning_rate=1.2e-38).learning_rate == 1.2e-38


def test_unknown_preset():
  with pytest.raises(ValueError, match="preset.*smoke"):
    config.from_preset("huge")
