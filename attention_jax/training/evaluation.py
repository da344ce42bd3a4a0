"""Evaluation of an ensemble's members: translation, BLEU, perplexity, alignment.

Every program runs over the ensemble axis E (`placement.over_members_on`: on a
`members` mesh each device its own members, as the training step) and is
compiled once per shape; its batches hold as many sentences as fit the evaluation budget
(`Evaluator.eval_batch_size`, `memory.largest_fitting_batch`).

Shape glossary: E ensemble members (seeds), B batch, S source length,
L decoded length.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import decoding
from attention_jax.data import batching
from attention_jax.data import input_pipeline
from attention_jax.training import memory
from attention_jax.training import multihost
from attention_jax.training import placement as placement_lib
from attention_jax.training import progress
from attention_jax.training import steps
from attention_jax.training.placement import Placement
from attention_jax.training.run_config import RunConfig


def final_evaluation_seconds(validation_seconds: float, validation_sentences: int,
                             validation_beam: int, test_sentences: int, test_beam: int) -> float:
  """A cautious estimate of the final evaluation's time from a validation's.

  The final evaluation decodes `test_sentences` with beam `test_beam` and
  repeats the validation's perplexity; a validation decoded
  `validation_sentences` with `validation_beam` (its time includes the
  perplexity, and for the first one the decoder's compilation). Beam search
  advances beam x batch hypotheses per step, so its cost is taken as linear in
  the beam, an upper bound where a device runs the hypotheses in parallel.
  0 when no validation was timed.
  """
  if validation_seconds <= 0 or validation_sentences <= 0:
    return 0.0
  work = (test_sentences * test_beam) / (validation_sentences * max(validation_beam, 1))
  return validation_seconds * max(1.0, work)


@dataclasses.dataclass
class FinalTest:
  """The final test decoding of the best parameters, per member."""
  hypotheses: list  # [E] lists of N detokenised strings; None for a diverged member
  references: list[str]  # [N]
  bleu: list  # [E] corpus BLEU; None for a diverged member
  val_ppl: np.ndarray  # [E] validation perplexity; NaN for a diverged member


class Evaluator:
  """Decodes and scores the members of one ensemble (one sweep point).

  `graphdef` and `rest` are the model's structure and non-parameter state;
  `params_like` a pytree with the shapes and shardings of its parameters
  (the programs are sized with it, whatever parameters they later run on).
  """

  def __init__(self, run: RunConfig, data, members: int, graphdef, rest, params_like,
               placement: Placement, label: str | None = None):
    self.run, self.data, self.members = run, data, members
    self.label = label or run.arm.label  # how log lines name the run
    self.settings = run.evaluation
    self.graphdef, self.rest, self.placement = graphdef, rest, placement
    self.tok = data.tokenizer
    self.val_beam_size = self.settings.validation_beam
    self._params_like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params_like)
    # Placed as the training step is (`over_members_on`): on a `members`
    # mesh each device evaluates its own members, and the program holds no
    # collective (with `over_members` it gathered the members to every device).
    self._eval_step = jax.jit(placement_lib.over_members_on(
        placement.mesh, functools.partial(steps.eval_step, graphdef, pad_id=self.tok.pad_id),
        (0, 0, None, None, None)))
    self._decoders = {}  # (beam size, return_attention) -> compiled decoder
    self._batch_sizes = {}  # (program, split) -> sentences per batch
    # What the final evaluation's estimate reads (`final_estimate`): each
    # validation's decode and perplexity `progress.Cost` and batches decoded,
    # and the (beam, source shape) of every batch decoded, each a program.
    self.validation_costs: list[tuple[progress.Cost, progress.Cost, int]] = []
    self._decoded: set[tuple[int, tuple[int, ...]]] = set()
    self._translated_batches = 0
    self._test_batches = None  # (source shapes, batches) of the final test decode

  # --- memory ---------------------------------------------------------------

  def budget(self) -> int:
    """Bytes one evaluation program may use (`memory.evaluation_budget`)."""
    return memory.evaluation_budget(self.settings.eval_memory_gb, self.run.workers)

  def eval_batch_size(self, program: str, split: str) -> int:
    """Sentences per batch of one evaluation program on `split`: the
    `eval_batch_size` setting, or fewer where its compiled program would need
    more than `budget()`.

    `program` is 'perplexity' or 'beam<K>' (K = 1: greedy), traced for the
    split's longest batch (`batching.padded_length` of its longest source
    and target). It matters because decoding holds a key/value cache of
    `heads × d_k × output length` per hypothesis and layer, which at d_k =
    1024 and beam 4 needs ~20 GB for 256 sentences. A ValueError, naming the
    budget, if even one sentence does not fit. With the batch sharded over
    several devices, the setting as it is (each device holds a share).
    """
    if self.placement.sharded:
      return self.settings.eval_batch_size
    key = (program, split)
    if key not in self._batch_sizes:
      self._batch_sizes[key] = memory.largest_fitting_batch(
          functools.partial(self._program_bytes, program, split), self.budget(),
          self.settings.eval_batch_size, f"{self.label}: {program} on {split}")
    return self._batch_sizes[key]

  def _program_bytes(self, program: str, split: str, size: int) -> int:
    src_ids, tgt_ids = self.data.token_ids(split)
    s = int(batching.padded_length(int(src_ids.lengths.max(initial=0)) + 1))
    t = int(batching.padded_length(int(tgt_ids.lengths.max(initial=0)) + 1))
    ints = lambda n: jax.ShapeDtypeStruct((size, n), jnp.int32)
    if program == "perplexity":
      traced = self._eval_step.trace(self._params_like, self.rest, ints(s), ints(t), ints(t))
    else:
      traced = self._decoder(int(program.removeprefix("beam"))).trace(
          self._params_like, self.rest, ints(s))
    return memory.program_bytes(traced, self.budget())

  def check_memory(self, log: Callable[[str], None] = print) -> None:
    """Chooses every evaluation batch before training (so a run that cannot
    evaluate stops before the work it would lose) and logs the reduced ones."""
    limit = self.settings.eval_batch_size
    for program, split in ((f"beam{self.val_beam_size}", "validation"),
                           ("perplexity", "validation"),
                           (f"beam{self.settings.beam_size}", "test")):
      size = self.eval_batch_size(program, split)
      if size < limit:
        log(f"[{self.label}] {program} on {split}: {size} sentences per batch "
            f"(not {limit}) to fit the evaluation budget of {self.budget() / 2**30:.1f} GiB")

  # --- programs ---------------------------------------------------------------

  def _decoder(self, beam_size: int, return_attention: bool = False):
    """The compiled vmapped decoder (greedy when `beam_size` is 1); carrying
    attention rows through the search costs time, so only heat maps ask."""
    key = (beam_size, return_attention)
    if key not in self._decoders:
      length_penalty = self.settings.length_penalty

      def member(params, rest, src):
        model = nnx.merge(self.graphdef, params, rest)
        if beam_size == 1:
          return decoding.greedy(model, src, return_attention=return_attention)
        return decoding.beam_search(model, src, beam_size=beam_size,
                                    length_penalty=length_penalty,
                                    return_attention=return_attention)

      self._decoders[key] = jax.jit(placement_lib.over_members_on(
          self.placement.mesh, member, (0, 0, None)))
    return self._decoders[key]

  def teacher_forced(self, batch):
    """`(src, tgt_in, tgt_out)` of a batch on the devices (`tgt_in` shifted right)."""
    tgt_in = steps.decoder_input(batch.tgt, self.tok.sos_id, self.tok.pad_id)
    return self.placement.put(batch.src, tgt_in, batch.tgt)

  # --- measures ---------------------------------------------------------------

  def translate(self, params, split: str, limit: int, beam_size: int):
    """Translations of the first `limit` examples of a split (0 = all).

    Returns `(hypotheses [E][N] str, references [N] str)`.
    """
    sources, references = self.data.texts(split)
    n = len(sources) if not limit else min(limit, len(sources))
    decode = self._decoder(beam_size)
    hyps = [[""] * n for _ in range(self.members)]
    self._translated_batches = 0
    for batch in self.data.batches(split, self.eval_batch_size(f"beam{beam_size}", split),
                                   shuffle=False, repeat=False, limit=n):
      self._decoded.add((beam_size, tuple(np.shape(batch.src))))
      self._translated_batches += 1
      (src,) = self.placement.put(batch.src)
      tokens = multihost.to_host(decode(params, self.rest, src))  # [E, B, L]
      for row, index in enumerate(batch.index):
        if index >= 0:
          for e in range(self.members):
            hyps[e][index] = self.tok.decode(tokens[e, row].tolist())
    return hyps, references[:n]

  def bleu(self, params, split: str, limit: int, beam_size: int) -> np.ndarray:
    """Corpus BLEU (sacrebleu, detokenised text) per member, `[E]`."""
    hyps, refs = self.translate(params, split, limit, beam_size)
    return np.asarray([input_pipeline.corpus_bleu(h, refs) for h in hyps])

  def perplexity(self, params, split: str) -> np.ndarray:
    """Teacher-forced perplexity per target token (EOS included, padding
    excluded) over the whole split, per member, `[E]`: exp(Σ NLL / #tokens)."""
    nll, ntok = np.zeros(self.members), 0.0
    for batch in self.data.batches(split, self.eval_batch_size("perplexity", split),
                                   shuffle=False, repeat=False):
      src, tgt_in, tgt_out = self.teacher_forced(batch)
      batch_nll, batch_ntok = self._eval_step(params, self.rest, src, tgt_in, tgt_out)
      nll += multihost.to_host(batch_nll).astype(np.float64)
      ntok += float(multihost.to_host(batch_ntok)[0])
    return np.exp(nll / max(ntok, 1.0))

  def validate(self, params, ok) -> tuple[np.ndarray, np.ndarray]:
    """`(BLEU [E], perplexity [E])` on the validation split, as training
    checks it (`eval_examples` sentences, the validation beam); NaN where
    `ok [E]` is False (a diverged member)."""
    with progress.Stopwatch() as decode:
      bleu = self.bleu(params, "validation", self.settings.eval_examples, self.val_beam_size)
    batches = self._translated_batches
    with progress.Stopwatch() as perplexity:
      ppl = self.perplexity(params, "validation")
    self.validation_costs.append((decode.cost, perplexity.cost, batches))
    return np.where(ok, bleu, np.nan), np.where(ok, ppl, np.nan)

  def final_test(self, params, ok) -> FinalTest:
    """The final test decoding of `params` (`test_examples` sentences, beam
    `beam_size`) and their validation perplexity; nothing for a member whose
    `ok [E]` is False."""
    hyps, refs = self.translate(params, "test", self.settings.test_examples,
                                self.settings.beam_size)
    hyps = [h if good else None for h, good in zip(hyps, ok)]
    scores = [input_pipeline.corpus_bleu(h, refs) if h is not None else None for h in hyps]
    ppl = np.where(ok, self.perplexity(params, "validation"), np.nan)
    return FinalTest(hypotheses=hyps, references=refs, bleu=scores, val_ppl=ppl)

  def alignment(self, params, split: str = "test") -> dict[str, Any] | None:
    """Member 0's tokens and cross-attention weights for example 0 of `split`
    (None for the decoders without attention)."""
    if not self.run.arm.has_attention:
      return None
    batch = next(self.data.batches(split, 1, shuffle=False, repeat=False, limit=1))
    src = self.placement.replicated(batch.src)  # one sentence: not split over devices
    tokens, weights = self._decoder(self.settings.beam_size, return_attention=True)(
        params, self.rest, src)  # [E, 1, L], [E, 1, L, S]
    return {"src": self._pieces(batch.src[0]),
            "hyp": self._pieces(multihost.to_host(tokens)[0, 0]),
            "weights": multihost.to_host(weights)[0, 0].astype(np.float32)}

  def final_estimate(self, other_seconds: float = 0.0) -> float | None:
    """The final evaluation's seconds as the ETA counts them
    (`progress.final_estimate_seconds`), from this call's validations: their
    median decode and perplexity less compilation, the first one's longest
    compiled program for each program the final evaluation will compile anew
    (the test decoder at each (beam, source shape) not yet decoded, the heat
    map's decoder), plus `other_seconds`. None before a validation. Unlike
    `final_seconds` (a deadline's cautious bound) it aims at the time itself:
    the validation's compilation counted once per new program, not in every
    decode, and the test decode scaled by batches x beam."""
    if not self.validation_costs:
      return None
    first_decode, first_perplexity, val_batches = self.validation_costs[0]
    per_program = max(first_decode.largest_program, first_perplexity.largest_program)
    beam = self.settings.beam_size
    shapes, test_batches = self._test_plan()
    new_programs = len({(beam, shape) for shape in shapes} - self._decoded)
    new_programs += bool(self.run.arm.has_attention)  # `alignment`'s decoder
    work = (test_batches * beam) / max(val_batches * self.val_beam_size, 1)
    return progress.final_estimate_seconds(
        progress.median_or_none([d.steady for d, _, _ in self.validation_costs]),
        progress.median_or_none([p.steady for _, p, _ in self.validation_costs]),
        work, new_programs, per_program, other_seconds)

  def _test_plan(self) -> tuple[set, int]:
    """The source shapes and the number of the final test decode's batches."""
    if self._test_batches is None:
      beam, limit = self.settings.beam_size, self.settings.test_examples
      n = self._sentences("test", limit)
      shapes, count = set(), 0
      for batch in self.data.batches("test", self.eval_batch_size(f"beam{beam}", "test"),
                                     shuffle=False, repeat=False, limit=n):
        shapes.add(tuple(np.shape(batch.src)))
        count += 1
      self._test_batches = (shapes, count)
    return self._test_batches

  def final_seconds(self, slowest_validation: float) -> float:
    """`final_evaluation_seconds` of this point's settings after a validation
    that took `slowest_validation` seconds."""
    s = self.settings
    return final_evaluation_seconds(
        slowest_validation, self._sentences("validation", s.eval_examples),
        self.val_beam_size, self._sentences("test", s.test_examples), s.beam_size)

  def _sentences(self, split: str, limit: int) -> int:
    """How many sentences of `split` an evaluation with `limit` (0 = all) reads."""
    total = len(self.data.texts(split)[0])
    return total if not limit else min(limit, total)

  def _pieces(self, ids) -> list[str]:
    """Token strings up to and including <eos>, for heat-map axes."""
    out = []
    for i in np.asarray(ids).tolist():
      if i == self.tok.pad_id:
        break
      if i == self.tok.eos_id:
        out.append("</s>")
      elif hasattr(self.tok, "id_to_piece"):  # SentencePiece: show sub-word pieces
        out.append(self.tok.id_to_piece(i))
      else:
        out.append(self.tok.decode([i]))
      if i == self.tok.eos_id:
        break
    return out
