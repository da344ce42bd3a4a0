"""What happens inside the attention softmax (the Vaswani §3.2.1 hypothesis).

Shape glossary: `[..., Tq, Tk]` attention tensors, where the leading axes are
whatever the model has (RNN `[B, T, S]`, Transformer `[L, B, H, T, S]`).

For a batch of cross-attention logits and weights these return:
  logit_std        standard deviation of the logits across the valid keys of a
                   query row, averaged over valid rows (what the softmax sees:
                   a constant shift per row does not change it)
  entropy          mean row entropy divided by log(#valid keys) (1 = uniform,
                   0 = one-hot); rows with a single valid key are left out
  saturated        fraction of valid rows whose largest weight exceeds 0.99
  max_logit        the largest raw logit at a valid (query, key) pair of the
                   batch: the number large-model trainers watch for
                   attention-logit growth (Wortsman et al. 2023; MaxText's
                   QK-clip); for the Transformer also per layer and kind,
                   `max_logit_<encoder_self|decoder_self|cross>_l<i>`, and
                   so for every statistic here (`per_layer_stats`)
  grad_norm        L2 norm of d loss / d logits over the whole batch (filled in
                   by the trainer, which owns the loss)
and, from the model's parameters, the learned parameters its score's
registry entry names in `logged_params` (`logged_params`), e.g. for `qk_norm`:
  qk_norm_g        the learned scale g of QKNorm, which bounds the logits
                   (|g · cos| <= |g|); the Transformer's are per layer and kind,
                   `qk_norm_g_<encoder_self|decoder_self|cross>_l<i>`
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import registry
from attention_jax.models import common
from attention_jax.models.transformer import ATTENTION_KINDS

SATURATION = 0.99


def softmax_stats(scores: jax.Array, weights: jax.Array, key_valid: jax.Array,
                  query_valid: jax.Array) -> dict[str, jax.Array]:
  """Scalar softmax statistics.

  Args:
    scores: raw logits `[..., Tq, Tk]` (any float dtype).
    weights: softmax weights `[..., Tq, Tk]`, zero at masked keys.
    key_valid: bool, broadcastable to `scores`; True at real keys.
    query_valid: bool, broadcastable to `scores`; True at real query rows.

  Returns:
    dict of float32 scalars `logit_std`, `entropy`, `saturated`, `max_logit`
    (-inf if no pair is valid).
  """
  scores = scores.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  valid = jnp.broadcast_to(key_valid & query_valid, scores.shape)  # [..., Tq, Tk]
  n_keys = jnp.sum(valid, axis=-1)  # [..., Tq]
  row_q = jnp.broadcast_to(query_valid, scores.shape)[..., 0]  # [..., Tq]
  rows = row_q & (n_keys > 0)
  safe_n = jnp.maximum(n_keys, 1).astype(jnp.float32)

  mean = jnp.sum(jnp.where(valid, scores, 0.0), -1) / safe_n  # [..., Tq]
  var = jnp.sum(jnp.where(valid, jnp.square(scores - mean[..., None]), 0.0), -1) / safe_n
  std = jnp.sqrt(var)

  plogp = jnp.where(valid & (weights > 0), weights * jnp.log(jnp.where(weights > 0, weights, 1.0)), 0.0)
  entropy = -jnp.sum(plogp, -1)  # [..., Tq]
  multi = rows & (n_keys > 1)
  norm_entropy = entropy / jnp.log(jnp.maximum(n_keys, 2).astype(jnp.float32))
  saturated = jnp.max(jnp.where(valid, weights, 0.0), -1) > SATURATION

  def masked_mean(x, m):
    return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1)

  return {
      "logit_std": masked_mean(std, rows),
      "entropy": masked_mean(norm_entropy, multi),
      "saturated": masked_mean(saturated.astype(jnp.float32), rows),
      "max_logit": common.masked_max(scores, valid & rows[..., None]),
  }


def transformer_attention(model, src: jax.Array, tgt_in: jax.Array, **kwargs):
  """`model(src, tgt_in, **kwargs)` of a `Transformer`, and what every one of
  its attention modules computed in that pass.

  The modules sow their raw scores and weights (a view with
  `sow_attention`, `layers.MultiHeadAttention.set_view`), read back with
  `nnx.capture`; sowing makes the self attentions take the plain kernel,
  since the fused and blockwise ones never form the weights, and leaves
  `model` itself as it was.

  Returns:
    `(model's outputs, attention)`; attention per kind (`ATTENTION_KINDS`) a
    list over layers of `{'scores', 'weights', 'key_valid', 'query_valid'}`:
    scores raw (before offset and mask) and weights (before dropout) float32
    `[B, H, T, S]`, the masks from `model.attention_masks`.
  """
  sowing = nnx.view(model, sow_attention=True)
  outputs, sown = nnx.capture(sowing, nnx.Intermediate)(src, tgt_in, **kwargs)
  return outputs, sown_attention(model, sown, src, tgt_in)


def sown_attention(model, sown, src: jax.Array, tgt_in: jax.Array) -> dict[str, list]:
  """The `attention` of `transformer_attention` from the `nnx.Intermediate`
  state `sown` that `nnx.capture` of a sowing view of `model` returned on
  `(src, tgt_in)` (each module must have attended exactly once)."""
  valid = model.attention_masks(src, tgt_in)
  attention = {}
  for (stack, sub), kind in ATTENTION_KINDS.items():
    key_valid, query_valid = valid[kind]
    attention[kind] = []
    for i in range(len(getattr(model, stack))):
      values = _sown_values(sown, (stack, i, sub, "attention"))
      if len(values) != 1:
        raise RuntimeError(f"{stack}[{i}].{sub} sowed its attention {len(values)} times in "
                           "one forward pass; expected once.")
      attention[kind].append({"scores": values[0]["scores"], "weights": values[0]["weights"],
                              "key_valid": key_valid, "query_valid": query_valid})
  return attention


def _sown_values(sown, path) -> tuple:
  """The values sown at `path` of the captured state; () where none were."""
  for key in path:
    if key not in sown:
      return ()
    sown = sown[key]
  return sown.get_value()


def max_logits(attention: dict[str, list]) -> dict[str, jax.Array]:
  """The largest raw logit at a real (query, key) pair, over batch and heads,
  of every module of `transformer_attention`'s `attention`: per kind float32
  `[layers]`."""
  return {kind: jnp.stack([common.masked_max(a["scores"], a["key_valid"] & a["query_valid"])
                           for a in layers])
          for kind, layers in attention.items()}


def per_layer_stats(attention: dict[str, list],
                    target_valid: jax.Array | None = None) -> dict[str, jax.Array]:
  """`transformer_attention`'s `attention` (per kind, a list over layers of
  `{'scores', 'weights', 'key_valid', 'query_valid'}`) -> `softmax_stats` of
  every module, flat: `logit_std_cross_l0`, `entropy_encoder_self_l1`,
  `saturated_decoder_self_l0`, `max_logit_cross_l1`, ...

  `target_valid [B, T]` (the gold outputs that are not padding) replaces
  the decoder's query rows: the model only sees its inputs, where the
  `<eos>` shifted in after the last gold token is a real token whose
  prediction is padding, so the global statistics and these count the same
  rows.
  """
  out = {}
  for kind, layers in attention.items():
    for i, a in enumerate(layers):
      rows = a["query_valid"]
      if target_valid is not None and kind != "encoder_self":
        rows = target_valid[:, None, :, None]  # [B, 1, T, 1]
      stats = softmax_stats(a["scores"], a["weights"], a["key_valid"], rows)
      out.update({layer_metric(name, kind, i): value for name, value in stats.items()})
  return out


def layer_metric(prefix: str, kind: str, layer: int) -> str:
  """The metrics-log name of one Transformer attention module's value:
  `<prefix>_<kind>_l<layer>`, kind one of `transformer.ATTENTION_KINDS`."""
  return f"{prefix}_{kind}_l{layer}"


def query_valid_like(scores_ndim: int, target_valid: jax.Array) -> jax.Array:
  """Places a `[B, T]` target-validity mask on the query axis of the scores.

  RNN scores are `[B, T, S]`; Transformer scores `[L, B, H, T, S]`.
  """
  if scores_ndim == 3:
    return target_valid[:, :, None]  # [B, T, 1]
  if scores_ndim == 5:
    return target_valid[None, :, None, :, None]  # [1, B, 1, T, 1]
  raise ValueError(f"attention scores of rank {scores_ndim} are not understood; "
                   "expected [B, T, S] or [L, B, H, T, S].")


def logged_params(params, logged) -> dict[str, jax.Array]:
  """The learned score parameters a registry entry asks to log
  (`registry.Score.logged_params`, `{parameter name: metric name}`) found in
  one model's parameters (an `nnx.State` or nested dict): `<metric>` for the
  RNN's single attention, `<metric>_<kind>_l<i>` for each Transformer
  attention module (named like the per-layer max logits), and
  `<metric>_<path>` for one elsewhere, each followed by `_<j>` per value of a
  parameter with several (e.g. per head); empty without any."""
  out = {}
  for path, value in jax.tree_util.tree_leaves_with_path(params):
    names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
    if names and names[-1] == "value":  # an nnx.Param's array
      names = names[:-1]
    if not names or names[-1] not in logged:
      continue
    metric, where = logged[names[-1]], names[:-1]
    kind = ATTENTION_KINDS.get((where[0], where[2])) if len(where) == 3 else None
    if kind is not None:
      metric = layer_metric(metric, kind, where[1])
    elif where != ["attention"]:
      metric = metric + "_" + "_".join(map(str, where))
    out.update(_one_metric_per_value(metric, value))
  return out


def _one_metric_per_value(metric: str, value: jax.Array) -> dict[str, jax.Array]:
  """`{metric: value}` for a scalar; a parameter of several values (e.g. one
  per head) as `<metric>_<i>` per value in row-major order, since every
  metric of the log is one number per seed."""
  if jnp.ndim(value) == 0:
    return {metric: value}
  return {f"{metric}_{i}": v for i, v in enumerate(jnp.ravel(value))}


def qk_norm_gains(params) -> dict[str, jax.Array]:
  """`logged_params` of the `qk_norm` entry: its learned scales g, as
  `qk_norm_g` (RNN) and `qk_norm_g_<kind>_l<i>` (Transformer)."""
  return logged_params(params, registry.get("qk_norm").logged_params)
