"""The named presets of `ExperimentConfig`, one file each.

Each module holds `OVERRIDES`, a dict of field values on top of the
dataclass defaults (which are the Britz et al. 2017 baseline where the paper
fixes a value), and a docstring with its command, its time on this project's
2-core CPU machine and on one GPU, and the result it is expected to give.
How a preset's values came to be is told in `results/HISTORY.md` and the
results' READMEs, not here.
"""

from attention_jax.sweep.presets import (britz_wmt, gpu, quick, smoke, transformer,
                                            transformer_lr, transformer_lr_cpu,
                                            transformer_lr_premise_cpu, transformer_smoke)

# In the order `--preset` lists them.
ALL = {module.__name__.rsplit(".", 1)[-1]: module.OVERRIDES
       for module in (smoke, transformer_smoke, quick, transformer, transformer_lr_cpu,
                              transformer_lr_premise_cpu, transformer_lr, gpu, britz_wmt)}
