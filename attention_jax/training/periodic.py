"""A training loop with periodic actions: the step, then whatever is due.

An action is registered with its period and runs after every `every`-th
step and after the last one, in the order of registration::

    actions = [PeriodicAction(100, log_progress), PeriodicAction(1000, save)]
    state, stop = train_loop(state, 20_000, advance, batches, actions)

`state` is any pytree with an integer `step` that `advance(state, batch)`
increments; each action takes the state and returns `(state, stop)`, and a
`stop` that is not None ends the loop early with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence, TypeVar

State = TypeVar("State")


@dataclasses.dataclass(frozen=True)
class PeriodicAction:
  """`fn(state) -> (state, stop)` after every `every`-th step and the last."""
  every: int
  fn: Callable[[Any], tuple[Any, Any]]

  def __post_init__(self):
    if self.every <= 0:
      raise ValueError(f"`every` of {self.fn!r} must be > 0, got {self.every!r}.")

  def due(self, step: int, last_step: int) -> bool:
    """Whether it runs after `step` of a loop that ends at `last_step`."""
    return step % self.every == 0 or step == last_step


def train_loop(state: State, last_step: int, advance: Callable[[State, Any], State],
               batches: Iterator, actions: Sequence[PeriodicAction]) -> tuple[State, Any]:
  """Advances `state` one batch of `batches` at a time until its `step` is
  `last_step`, running after each step the actions due at it, in order.

  Returns:
    `(state, stop)`: `stop` is None once `last_step` is reached, else the
    `stop` of the action that ended the loop (the actions after it in the
    list did not run at that step).
  """
  while state.step < last_step:
    state = advance(state, next(batches))
    for action in actions:
      if action.due(state.step, last_step):
        state, stop = action.fn(state)
        if stop is not None:
          return state, stop
  return state, None
