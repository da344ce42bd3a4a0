"""What a grid's resolution allows, without interpolation: the range of slopes
of log lr* on log d_k that its grid intervals leave open (`slope_bracket`), the
cells that keep that range wide (`wide_intervals`), and what the range says of
a predicted slope (`verdict`: holds / fails / not resolved by this grid, read
from the bracket alone; `deciding_half_width`: how narrow it would have to be).
Pure functions of (d_k, low, high) intervals; `threshold` feeds them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

def slope_bracket(intervals: Sequence[tuple[int, float, float]]) -> tuple[float, float] | None:
  """The model-free bracket of the slope: the smallest and largest
  least-squares slope of log lr on log d_k over every choice of each lr
  inside its grid interval ((d_k, low, high) `intervals`; low 0 or high inf
  for an interval open below or above: a censored cell), no interpolation.
  The slope is linear in the log lr, so each extreme takes every lr at an
  end of its interval (for the largest: the high end where log d_k is above
  its mean, the low end below it); a d_k at the mean weighs nothing. None
  with fewer than two distinct d_k bounded on some side."""
  intervals = [(d, lo, hi) for d, lo, hi in intervals if lo > 0 or hi < math.inf]
  if len({d for d, _, _ in intervals}) < 2:
    return None
  x = np.log([d for d, _, _ in intervals])
  x = x - x.mean()
  norm = float(np.sum(x * x))
  tiny = 1e-9 * float(np.max(np.abs(x)))

  def extreme(high_above_mean: bool) -> float:
    total = 0.0
    for xi, (_, lo, hi) in zip(x, intervals):
      if abs(xi) <= tiny:
        continue  # the slope does not depend on it
      end = hi if (xi > 0) == high_above_mean else lo
      total += xi * (math.log(end) if 0 < end < math.inf else -math.inf if end == 0 else math.inf)
    return total / norm

  return extreme(False), extreme(True)


# An interval of lr* wider than this (in decades) is wider than one step of the
# quarter-decade ladder, whose steps are 0.243-0.255 decades once its rates are
# rounded to two digits (1.8, 3.2, 5.6): a cell the ladder could still refine.
LADDER_STEP_DECADES = 0.26


def wide_intervals(intervals: Sequence[tuple[int, float, float]],
                   decades: float = LADDER_STEP_DECADES) -> tuple[tuple[int, float, float], ...]:
  """The (d_k, low, high) of `intervals` that keep a slope bracket wider than
  one ladder step allows: open (a censored cell: low 0 or high inf) or wider
  than `decades`."""
  return tuple((d, lo, hi) for d, lo, hi in intervals
               if lo <= 0 or hi == math.inf or math.log10(hi / lo) > decades)


HOLDS, FAILS, UNRESOLVED = "holds", "fails", "not resolved by this grid"


def verdict(bracket: tuple[float, float] | None, reference: float | None,
            band: tuple[float, float] | None = None) -> str | None:
  """What a slope's model-free `bracket` says of the predicted `reference`:
  FAILS where the bracket excludes it; HOLDS where it lies inside `band`
  (pre-registered with the grid; without one nothing holds); else
  UNRESOLVED. None without a bracket or a prediction."""
  if bracket is None or reference is None:
    return None
  low, high = bracket
  if not low <= reference <= high:
    return FAILS
  if band is not None and band[0] <= low and high <= band[1]:
    return HOLDS
  return UNRESOLVED


def deciding_half_width(point: float | None, reference: float | None,
                        band: tuple[float, float] | None) -> float | None:
  """The bracket half-width, centred on the point estimate `point`, at which
  an unresolved verdict would be decided: the bracket excludes `reference`
  once narrower than their distance, and lies inside `band` once within it;
  refining decides at the larger of the two. None without a point
  estimate, a prediction or a band."""
  if point is None or reference is None or band is None:
    return None
  apart = abs(point - reference)
  inside = min(point - band[0], band[1] - point)
  return max(apart, inside)
