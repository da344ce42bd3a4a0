"""attention_jax: attention mechanisms in JAX/Flax, from formulas to ablations.

Pure functions live in `scores`, `masks`, `positional` and `attention`
(exported here as `attend` / `attention`); `registry` lists the scores;
Flax NNX modules build on them.
"""

from attention_jax import masks, positional, registry, scores
from attention_jax.attention import attend, attention, compute_scores

__all__ = ["attend", "attention", "compute_scores", "masks", "positional", "registry",
           "scores"]
__version__ = "0.1.0"
