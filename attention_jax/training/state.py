"""What training carries from step to step, and how a checkpoint holds it.

`TrainState` is one pytree: the trainer (`train_lib`) makes it, the loop's
actions (`actions`) change it after every step, and a checkpoint holds its
`arrays()` and `meta()`. It lives apart from both so that neither module
needs the other to name it.
"""

from __future__ import annotations

import math
from typing import Any

from flax import struct
import numpy as np


@struct.dataclass
class TrainState:
  """What training carries from step to step; arrays have the ensemble axis E.

  `arrays()` and `meta()` are what a checkpoint holds (`restored` reads them
  back); `loss` is the last step's training loss, not checkpointed.
  """
  params: Any
  opt_state: Any
  best_params: Any  # each member's parameters of its best validation BLEU
  best_bleu: np.ndarray  # [E] float64; -1 before the first validation
  best_step: np.ndarray  # [E] int64
  diverged_at: np.ndarray  # [E] int64: the step it diverged at; 0 = never
  loss: np.ndarray  # [E] the losses of the last step, before its update
  # [E] float64: the validation perplexity of `best_params`, which breaks
  # ties in validation BLEU (`actions.improved`); +inf before the first
  # validation; NaN where not known (`restored`).
  best_ppl: np.ndarray
  step: int = struct.field(pytree_node=False, default=0)  # steps taken
  train_seconds: float = struct.field(pytree_node=False, default=0.0)  # in training steps

  def arrays(self) -> dict[str, Any]:
    return {"params": self.params, "opt_state": self.opt_state,
            "best_params": self.best_params}

  def meta(self) -> dict[str, Any]:
    return {"step": self.step, "train_seconds": self.train_seconds,
            "best_bleu": self.best_bleu.tolist(), "best_step": self.best_step.tolist(),
            "diverged_at": self.diverged_at.tolist(),
            "best_ppl": [_number_to_json(x) for x in self.best_ppl]}

  def restored(self, arrays: dict[str, Any], meta: dict[str, Any]) -> "TrainState":
    """This state with a checkpoint's `arrays` and `meta`.

    An older checkpoint without `diverged_at` keeps this state's; one
    without `best_ppl` (written before ties in BLEU were broken by
    perplexity; `with_logged_best_ppl` fills it from the metrics log where
    it can) gets NaN: not known, so a later tie in BLEU never replaces that
    member's best, the rule the checkpoint was trained under, until its
    BLEU strictly improves. Not +inf: then every later tie would replace
    it, however high its perplexity.
    """
    unknown = [None] * len(meta["best_bleu"])
    return self.replace(
        params=arrays["params"], opt_state=arrays["opt_state"],
        best_params=arrays["best_params"], step=meta["step"],
        train_seconds=meta["train_seconds"],
        best_bleu=np.asarray(meta["best_bleu"], np.float64),
        best_step=np.asarray(meta["best_step"], np.int64),
        diverged_at=np.asarray(meta.get("diverged_at", self.diverged_at), np.int64),
        best_ppl=np.asarray([_number_of_json(x) for x in meta.get("best_ppl", unknown)],
                            np.float64))


def _number_to_json(x: float) -> float | str:
  """`x` for a checkpoint's JSON metadata: strict JSON has no inf or NaN,
  so those are written as the strings "inf" and "nan"."""
  x = float(x)
  return x if math.isfinite(x) else str(x)


def _number_of_json(x) -> float:
  """`_number_to_json`'s value back; None (not known) is NaN."""
  return math.nan if x is None else float(x)


def with_logged_best_ppl(meta: dict[str, Any], history: list[dict],
                         seeds: tuple[int, ...]) -> dict[str, Any]:
  """A checkpoint's `meta` with each member's best perplexity, where a
  checkpoint written before it was kept lacks it: the `val_ppl` the
  metrics log (`history`) holds for that seed at its `best_step` (logged to
  6 significant digits); +inf for a member with no validation yet, as a new
  run starts; None (not known, `TrainState.restored`) where the log has no
  such line. A `meta` that has `best_ppl` is returned as it is."""
  if "best_ppl" in meta:
    return meta
  logged = {(r["seed"], r["step"]): r.get("val_ppl") for r in history if "val_ppl" in r}
  best = []
  for seed, step, bleu in zip(seeds, meta["best_step"], meta["best_bleu"]):
    if step == 0 and bleu < 0:
      best.append("inf")
    else:
      best.append(logged.get((seed, step)))
  return {**meta, "best_ppl": best}
