"""The one list of attention score functions: where a new score is added.

Each entry (`Score`) says what the score is (name, formula, paper) and
carries everything that is particular to it: its parameters, logits and
NumPy reference in both attention layers (`rnn`, `mha`: `score_kinds.Form`),
the pure function `attention` accepts (`function`) with its naive float32
form for the benchmark (`naive`), the scaled dot product the fused /
blockwise kernels see in it (`dot_product`, `fused`, `fusable`), the
learned parameters the trainer's diagnostics log (`logged_params`), how
long a source its parameters must be built for (`needs_length`,
`per_position`), and what its cost is made of (`one_product`,
`pair_block`). The layers, `attention`, the trainer, the benchmark, the
drivers and the tests branch on no score name: they read these fields
(`tests/test_registry_names.py` checks the code for comparisons with one).

Every other list of score names is derived from `SCORES` when it is read:
the pure functions `attention`/`compute_scores` accept (`FUNCTION_SCORES`),
the layers' `score=` choices (`LAYER_SCORES`), the ablation's `--arms`
(`ARMS`, plus the RNN decoders without attention) and the benchmark's kernels.

To add a score: give it one entry, here in `SCORES` or from any module at
run time with `register` (`registered` for a test); its functions may live
wherever it is registered (the built-in ones are in `scores.py` and
`score_kinds.py`). Nothing else names it: `tests/test_add_a_score.py` adds
one from a test module alone.

Glossary: q / s the query (decoder state), k / h a key (encoder state),
a the attention dimension, d the query / key size.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Mapping

from attention_jax import score_kinds as kinds
from attention_jax import scores
from attention_jax.score_kinds import Form

__all__ = ["Score", "SCORES", "FUNCTION_SCORES", "LAYER_SCORES", "NO_ATTENTION_ARMS",
           "ARMS", "get", "register", "unregister", "registered"]


@dataclasses.dataclass(frozen=True)
class Score:
  """One score function and what computes it.

  Attributes:
    name: the name used everywhere (`score=`, `--arms`).
    formula: the score of query s and key h.
    paper: where it comes from.
    rnn: its form in `layers.Attention` (one head, the RNN decoders), whose
      logits get the query `[B, Tq, ·]` and the prepared keys `[B, S, ·]`:
      the projections `W_1 s + b_1`, `W_2 h + b_2` for `projected` scores,
      the decoder and encoder states otherwise.
    mha: its form in `layers.MultiHeadAttention`, whose logits get the
      per-head projections `[B, H, T, d_k]`, `[B, H, S, d_k]` (their
      parameters carry a head axis where each head has its own); None: the
      `rnn` form.
    projected: the RNN layer projects query and key to `a` features
      (`query_proj`, `key_proj`) before the logits.
    same_dim: the formula compares query and key directly, so they must
      have the same size.
    needs_length: its parameters (or their initial values) depend on the
      longest source (`location`, `qk_norm`).
    per_position: its parameters have one entry per source position
      (`location`), so the RNN trainer builds it for the widest batch any
      split gives (evaluation is not length-filtered), not for the longest
      training sentence; implies `needs_length`.
    one_product: its logits in both layers are one product `q kᵀ` of the
      query and keys the layer hands over, with at most elementwise work
      besides (a scale, a normalisation, a learned factor): no matrix of its
      own, nothing formed per (query, key) pair. Such logits cost
      2·Tq·Tk·d FLOPs per head and are at least float32 (`scores.py`); the
      hand FLOP count of a Transformer step (experiments/cpu_efficiency)
      covers exactly these scores.
    pair_block: its logits form a vector of `a` features for every (query,
      key) pair (additive's `[..., Tq, Tk, a]` tanh block), so its memory
      and time grow with Tq·Tk·a, not Tq·Tk: the drivers' caps on it
      (`--additive_max_dim`, the kernel suite's `--additive_max_len`,
      init_logits' `--max_block_gb`) apply to such scores.
    fused: the pure score (after any projection) that the fused kernels
      (`jax.nn.dot_product_attention`, cuDNN flash attention) compute, or
      None where no fused kernel applies. `fusable` (a property): the score
      is that pure score itself, so `attention(score=name)` may run on them.
    function: the pure function `attention(score=name)` computes, `f(q, k,
      **params)`, or None where the score is no pure function of q and k.
    function_params: the `params` it requires; `function_options`: those
      it takes when given.
    dot_product: the score as one scaled dot product (the blockwise kernel
      of `attention`; for a `fused` score the fused kernels too), or None.
    naive: `function` written as explicit float32 einsums, independent of
      the library's code, `f(q, k, **params) -> [..., Tq, Tk]` float32: the
      benchmark's reference (`benchmarking.naive_scores`), against which
      every kernel is checked before it is timed; None: the benchmark
      reports the score as having no reference.
    logged_params: `{parameter name: metric name}`: the learned parameters
      of the layers' forms that the trainer's diagnostics log
      (`diagnostics.logged_params`; e.g. qk_norm's `g` as `qk_norm_g`, the
      Transformer's per layer and kind as `qk_norm_g_cross_l0`, ...).
  """
  name: str
  formula: str
  paper: str
  rnn: Form
  mha: Form | None = None
  projected: bool = False
  same_dim: bool = False
  needs_length: bool = False
  fused: str | None = None
  function: Callable[..., Any] | None = None
  function_params: tuple[str, ...] = ()
  function_options: tuple[str, ...] = ()
  dot_product: kinds.DotProduct | None = None
  per_position: bool = False
  one_product: bool = False
  pair_block: bool = False
  naive: Callable[..., Any] | None = None
  # Left out of the entry's hash and equality: a dict cannot be hashed, and a
  # layer keeps its entry as static graph data, which JAX hashes when it
  # compiles (`nnx.jit`'s GraphDef; experiments/init_logits/run.py failed so).
  logged_params: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False,
                                                       compare=False)

  @property
  def fusable(self) -> bool:
    """Whether the fused kernels compute this score itself, not only its
    projections': `attention(score=name, implementation='xla' / 'cudnn')`
    serves it (for dq == dk == dv and no weights)."""
    return self.fused == self.name

  def __post_init__(self):
    if self.mha is None:
      object.__setattr__(self, "mha", self.rnn)
    if self.per_position and not self.needs_length:
      raise ValueError(f"score {self.name!r}: `per_position` needs `needs_length`.")
    if self.naive is not None and self.function is None:
      raise ValueError(f"score {self.name!r}: `naive` is the naive form of `function`, "
                       "which it lacks.")


# Order: the Britz et al. 2017 arms first, then the rest; lists derived below
# keep this order.
SCORES: dict[str, Score] = {s.name: s for s in (
    Score("additive", "vᵀ tanh(W_1 s + b_1 + W_2 h + b_2)",
          "Bahdanau et al. 2015; Britz et al. 2017 eq. 6",
          rnn=Form(kinds.additive_of_projections, kinds.additive_v, kinds.additive_reference),
          mha=Form(kinds.additive_per_head, kinds.additive_heads,
                   kinds.additive_heads_reference, kernel=kinds.additive_heads_kernel),
          projected=True, pair_block=True,
          function=scores.additive, function_params=("w_q", "w_k", "v"),
          naive=kinds.additive_naive),
    Score("multiplicative", "⟨W_1 s + b_1, W_2 h + b_2⟩", "Britz et al. 2017 eq. 7",
          rnn=Form(scores.dot, reference=kinds.dot_reference), projected=True, fused="dot",
          one_product=True),
    Score("scaled_multiplicative", "⟨W_1 s + b_1, W_2 h + b_2⟩ / √a",
          "Britz et al. 2017 eq. 7 with the scaling of Vaswani et al. 2017",
          rnn=Form(scores.scaled_dot, reference=kinds.scaled_dot_reference), projected=True,
          fused="scaled_dot", one_product=True),
    # The modern fixes of logit growth (opt-in arms).
    Score("qk_norm", "g · ⟨ŝ, ĥ⟩, x̂ = x/‖x‖ of W_1 s + b_1, W_2 h + b_2; g learned",
          "Henry et al. 2020 (QKNorm); g starts at log₂(L² − L)",
          rnn=Form(scores.qk_norm, kinds.qk_norm_g, kinds.qk_norm_reference), projected=True,
          needs_length=True, one_product=True, logged_params={"g": "qk_norm_g"}),
    Score("inverse_dim", "⟨W_1 s + b_1, W_2 h + b_2⟩ / a", "Yang et al. 2021 (μP)",
          rnn=Form(scores.inverse_dim, reference=kinds.inverse_dim_reference), projected=True,
          one_product=True),
    Score("dot", "sᵀh", "Luong et al. 2015", rnn=Form(scores.dot, reference=kinds.dot_reference),
          same_dim=True, fused="dot", one_product=True, function=scores.dot,
          dot_product=kinds.DOT, naive=kinds.dot_naive),
    Score("scaled_dot", "sᵀh / √d", "Vaswani et al. 2017",
          rnn=Form(scores.scaled_dot, reference=kinds.scaled_dot_reference),
          same_dim=True, fused="scaled_dot", one_product=True, function=scores.scaled_dot,
          dot_product=kinds.SCALED_DOT, naive=kinds.scaled_dot_naive),
    Score("general", "sᵀ W h", "Luong et al. 2015",
          rnn=Form(scores.general, kinds.general_w, kinds.general_reference),
          mha=Form(kinds.general_per_head, kinds.general_w, kinds.general_heads_reference),
          function=scores.general, function_params=("w",), dot_product=kinds.GENERAL,
          naive=kinds.general_naive),
    Score("cosine", "β · cos(s, h), β learned", "Graves et al. 2014 (content-based)",
          rnn=Form(scores.cosine, kinds.cosine_beta, kinds.cosine_reference),
          mha=Form(kinds.cosine_per_head, kinds.cosine_beta, kinds.cosine_heads_reference),
          same_dim=True, one_product=True, function=scores.cosine,
          function_options=("beta",), dot_product=kinds.COSINE, naive=kinds.cosine_naive),
    Score("location", "(W_a s + b_a)[:S]", "Luong et al. 2015",
          rnn=Form(kinds.location, kinds.location_proj, kinds.location_reference),
          mha=Form(kinds.location_per_head, kinds.location_heads,
                   kinds.location_heads_reference), needs_length=True, per_position=True),
)}
# The scores above, which `unregister` leaves in place.
BUILT_IN = frozenset(SCORES)

# RNN decoders without attention, ablation arms beside the scores
# (Britz et al. 2017 Table 6): the encoder's last state initialises the
# decoder (`none_init`) or is also fed at every step (`none_concat`).
NO_ATTENTION_ARMS = ("none_init", "none_concat")


class _Names(collections.abc.Sequence):
  """A tuple of names read from `SCORES` at every use, so that a list bound
  when a module is imported (`config.ARMS`, `layers.SCORES`) also holds the
  scores `register`ed after. Compares equal to the tuple of its names."""

  def __init__(self, names: Callable[[], tuple[str, ...]]):
    self._names = names

  def __getitem__(self, index):
    return self._names()[index]

  def __len__(self) -> int:
    return len(self._names())

  def __eq__(self, other) -> bool:
    if isinstance(other, (tuple, _Names)):
      return self._names() == tuple(other)
    return NotImplemented

  __hash__ = None  # its contents change with the registry

  def __add__(self, other) -> tuple[str, ...]:
    return self._names() + tuple(other)

  def __radd__(self, other) -> tuple[str, ...]:
    return tuple(other) + self._names()

  def __repr__(self) -> str:
    return repr(self._names())


FUNCTION_SCORES = _Names(lambda: tuple(n for n, s in SCORES.items() if s.function))
LAYER_SCORES = _Names(lambda: tuple(SCORES))
ARMS = _Names(lambda: tuple(SCORES) + NO_ATTENTION_ARMS)


def get(name: str, field: str = "score") -> Score:
  """The entry of `name`; a ValueError naming `field` if there is none."""
  if name not in SCORES:
    raise ValueError(f"`{field}` must be one of {LAYER_SCORES}, got {name!r}.")
  return SCORES[name]


def register(score: Score) -> Score:
  """Adds `score` to `SCORES` (after the others); every derived list,
  `--arms`, the layers' `score=` and `attention(score=)` (for a `function`)
  take it from then on.

  Raises:
    ValueError: naming `score.name` if it is taken (by a score or an arm), or
      `score.fused` if that names no fused dot-product score.
  """
  if not isinstance(score, Score):
    raise TypeError(f"`score` must be a registry.Score, got {type(score).__name__}.")
  if score.name in SCORES or score.name in NO_ATTENTION_ARMS:
    raise ValueError(f"`score.name` {score.name!r} is taken; taken: {ARMS}.")
  fused_names = tuple(n for n, s in SCORES.items() if s.fusable)
  if score.fused is not None and score.fused not in fused_names:
    raise ValueError(f"`score.fused` must be None or one of {fused_names}, "
                     f"got {score.fused!r}.")
  SCORES[score.name] = score
  return score


def unregister(name: str) -> None:
  """Removes a score `register` added (a ValueError naming `name` for a
  built-in or unknown one)."""
  if name in BUILT_IN or name not in SCORES:
    raise ValueError(f"`name` must be a registered score other than the built-in "
                     f"{sorted(BUILT_IN)}, got {name!r}.")
  del SCORES[name]


@contextlib.contextmanager
def registered(score: Score) -> Iterator[Score]:
  """`register(score)` for the duration of a `with` block."""
  register(score)
  try:
    yield score
  finally:
    unregister(score.name)
