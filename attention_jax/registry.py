"""The one list of attention score functions: where a new score is added.

Every other list of score names is derived from `SCORES`: the pure functions
`attention`/`compute_scores` accept (`FUNCTION_SCORES`), the layers'
`score=` choices (`LAYER_SCORES`), the ablation's `--arms` (`ARMS`, plus the
RNN decoders without attention) and the benchmark's kernels.

To add a score: write its formula in `scores.py` (if it is a pure function of
query and keys), give it an entry here, then its parameters in
`layers.Attention` / `layers.MultiHeadAttention` (the `projected` and
`params` fields say what they create).

Glossary: q / s the query (decoder state), k / h a key (encoder state),
a the attention dimension, d the query / key size.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Score", "SCORES", "FUNCTION_SCORES", "LAYER_SCORES", "NO_ATTENTION_ARMS",
           "ARMS", "get"]


@dataclasses.dataclass(frozen=True)
class Score:
  """What the rest of the library needs to know about one score function.

  Attributes:
    name: the name used everywhere (`score=`, `--arms`).
    formula: the score of query s and key h.
    paper: where it comes from.
    function: True if `scores.<name>` exists as a pure function of (q, k,
      weights), i.e. `attention(score=name)` accepts it.
    projected: the layers give it a query and a key projection to `a`
      features (W_1 s + b_1, W_2 h + b_2) before the formula.
    same_dim: the formula compares query and key directly, so they must
      have the same size.
    fused: the pure score (after any projection) that the fused kernels
      (`jax.nn.dot_product_attention`, cuDNN flash attention) compute, or
      None where no fused kernel applies.
    on_projected: the pure function of `scores.py` the layers apply to the
      projected query and key (for `projected` scores; None otherwise).
    params: the score's own parameters in the layers (beyond projections).
    needs_length: its parameters (or their initial values) depend on the
      longest source (`location`, `qk_norm`).
  """
  name: str
  formula: str
  paper: str
  function: bool = False
  projected: bool = False
  same_dim: bool = False
  fused: str | None = None
  on_projected: str | None = None
  params: tuple[str, ...] = ()
  needs_length: bool = False


# Order: the Britz et al. 2017 arms first, then the rest; lists derived below
# keep this order.
SCORES: dict[str, Score] = {s.name: s for s in (
    Score("additive", "vᵀ tanh(W_1 s + b_1 + W_2 h + b_2)",
          "Bahdanau et al. 2015; Britz et al. 2017 eq. 6",
          function=True, projected=True, on_projected="additive_projected", params=("v",)),
    Score("multiplicative", "⟨W_1 s + b_1, W_2 h + b_2⟩", "Britz et al. 2017 eq. 7",
          projected=True, fused="dot", on_projected="dot"),
    Score("scaled_multiplicative", "⟨W_1 s + b_1, W_2 h + b_2⟩ / √a",
          "Britz et al. 2017 eq. 7 with the scaling of Vaswani et al. 2017",
          projected=True, fused="scaled_dot", on_projected="scaled_dot"),
    # The modern fixes of logit growth (opt-in arms).
    Score("qk_norm", "g · ⟨ŝ, ĥ⟩, x̂ = x/‖x‖ of W_1 s + b_1, W_2 h + b_2; g learned",
          "Henry et al. 2020 (QKNorm); g starts at log₂(L² − L)",
          projected=True, on_projected="qk_norm", params=("g",), needs_length=True),
    Score("inverse_dim", "⟨W_1 s + b_1, W_2 h + b_2⟩ / a", "Yang et al. 2021 (μP)",
          projected=True, on_projected="inverse_dim"),
    Score("dot", "sᵀh", "Luong et al. 2015", function=True, same_dim=True, fused="dot"),
    Score("scaled_dot", "sᵀh / √d", "Vaswani et al. 2017", function=True, same_dim=True,
          fused="scaled_dot"),
    Score("general", "sᵀ W h", "Luong et al. 2015", function=True, params=("w",)),
    Score("cosine", "β · cos(s, h), β learned", "Graves et al. 2014 (content-based)",
          function=True, same_dim=True, params=("beta",)),
    Score("location", "(W_a s + b_a)[:S]", "Luong et al. 2015", params=("w_loc",),
          needs_length=True),
)}

FUNCTION_SCORES = tuple(n for n, s in SCORES.items() if s.function)
LAYER_SCORES = tuple(SCORES)
# RNN decoders without attention, ablation arms beside the scores
# (Britz et al. 2017 Table 6): the encoder's last state initialises the
# decoder (`none_init`) or is also fed at every step (`none_concat`).
NO_ATTENTION_ARMS = ("none_init", "none_concat")
ARMS = LAYER_SCORES + NO_ATTENTION_ARMS


def get(name: str, field: str = "score") -> Score:
  """The entry of `name`; a ValueError naming `field` if there is none."""
  if name not in SCORES:
    raise ValueError(f"`{field}` must be one of {LAYER_SCORES}, got {name!r}.")
  return SCORES[name]
