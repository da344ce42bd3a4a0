"""Runs every score function through `attention_jax.attention` on random data.

    python -m experiments.demo
"""

from absl import app
import jax
import jax.numpy as jnp

import attention_jax as aj
from attention_jax import registry


def main(argv):
  del argv
  kq, kk, kv, kp = jax.random.split(jax.random.PRNGKey(0), 4)
  b, h, t, d, a = 2, 4, 6, 16, 32
  query = jax.random.normal(kq, (b, h, t, d))  # [B, H, T, D]
  keys = jax.random.normal(kk, (b, h, t, d))  # [B, H, T, D]
  values = jax.random.normal(kv, (b, h, t, d))  # [B, H, T, D]
  w = jax.random.normal(kp, (d, a)) / jnp.sqrt(d)
  params = {"w": jnp.eye(d), "w_q": w, "w_k": w, "v": jnp.ones(a) / a}
  mask = aj.masks.combine(aj.masks.causal(t), aj.masks.padding(jnp.array([[1] * t, [1] * 4 + [0] * 2]))[:, None, None, :])
  for score in registry.FUNCTION_SCORES:
    context, weights = aj.attention(query, keys, values, score=score, params=params,
                                    mask=mask, return_weights=True)
    print(f"{score:>10}: context {tuple(context.shape)}, weights row sums "
          f"{jnp.round(weights.sum(-1)[0, 0], 3).tolist()}")


if __name__ == "__main__":
  app.run(main)
