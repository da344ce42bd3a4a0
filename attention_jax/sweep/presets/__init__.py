"""The named presets of `ExperimentConfig`, one file each.

Each module holds `OVERRIDES`, a dict of field values on top of the
dataclass defaults (which are the Britz et al. 2017 baseline where the paper
fixes a value), and a docstring with its command, its time on this project's
2-core CPU machine and on one GPU, and the result it is expected to give.
How a preset's values came to be is told in `results/HISTORY.md` and the
results' READMEs, not here.

A study's own presets live in its folder (`experiments/<study>/presets/`,
beside the rule they were registered with); the drivers' package adds them to
these (`config.add_presets`), so that `--preset` of every driver names them.
"""

from attention_jax.sweep.presets import britz_wmt, gpu, quick, smoke, transformer, transformer_smoke

# In the order `--preset` lists them.
MODULES = (smoke, transformer_smoke, quick, transformer, gpu, britz_wmt)
ALL = {module.__name__.rsplit(".", 1)[-1]: module.OVERRIDES for module in MODULES}
