"""Power-law fits: how a quantity scales with a size (numpy only).

`loglog_slope(x, y)` fits `log y = c + p · log x` by least squares and
returns the exponent p with its confidence interval, the question "does the
attention-logit std grow like d_k^0.5?" asks of a handful of sizes. The
interval is the usual one of an ordinary least-squares slope: estimate ±
t_{(1+confidence)/2, n-2} · standard error, with the t quantile computed
here (`t_quantile`) so the package needs nothing beyond numpy.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["loglog_slope", "t_quantile"]

# Simpson intervals of the t density on [0, t]: the density is smooth and
# unimodal there, so this many give quantiles to ~1e-9 at any dof >= 1.
_SIMPSON_INTERVALS = 4096


def _t_density(t: np.ndarray, dof: float) -> np.ndarray:
  log_norm = (math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)
              - 0.5 * math.log(dof * math.pi))
  return np.exp(log_norm - (dof + 1) / 2 * np.log1p(t * t / dof))


def _t_mass(t: float, dof: float) -> float:
  """P(0 <= T <= t) for Student's t with `dof` degrees of freedom (Simpson)."""
  grid = np.linspace(0.0, t, _SIMPSON_INTERVALS + 1)
  f = _t_density(grid, dof)
  h = t / _SIMPSON_INTERVALS
  return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))


def t_quantile(p: float, dof: float) -> float:
  """The p-quantile of Student's t with `dof` degrees of freedom, p in (0.5, 1).

  Bisection on the integrated density; what a two-sided interval of
  confidence c needs is `t_quantile((1 + c) / 2, dof)`.
  """
  if not 0.5 < p < 1.0:
    raise ValueError(f"`p` must be in (0.5, 1), got {p!r}.")
  if not dof > 0 or not math.isfinite(dof):
    raise ValueError(f"`dof` must be a finite number > 0, got {dof!r}.")
  target = p - 0.5
  lo, hi = 0.0, 1.0
  while _t_mass(hi, dof) < target:  # bracket the quantile
    lo, hi = hi, 2.0 * hi
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    if _t_mass(mid, dof) < target:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def _positive_vector(values, name: str) -> np.ndarray:
  arr = np.asarray(values, dtype=np.float64)
  if arr.ndim != 1:
    raise ValueError(f"`{name}` must be one-dimensional, got shape {arr.shape}.")
  if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
    raise ValueError(f"`{name}` must hold finite positive values (a log-log fit), "
                     f"got {arr.tolist()}.")
  return arr


def loglog_slope(x, y, *, confidence: float = 0.95) -> tuple[float, float, float]:
  """Least-squares exponent p of `y ≈ c · x^p`, with its confidence interval.

  Args:
    x: positive sizes, at least 3 and not all equal.
    y: positive values, as many as `x`.
    confidence: two-sided level of the interval, in (0, 1).

  Returns:
    `(slope, lo, hi)`: the slope of log y on log x and its interval from the
    t distribution with n - 2 degrees of freedom (lo == hi == slope when the
    points lie exactly on a line).

  Raises:
    ValueError naming `x`, `y` or `confidence`: fewer than 3 points,
    lengths that differ, non-positive or non-finite values, a constant `x`.
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"`confidence` must be in (0, 1), got {confidence!r}.")
  x_arr, y_arr = np.asarray(x), np.asarray(y)
  if x_arr.shape != y_arr.shape:
    raise ValueError(f"`x` and `y` must have the same length, got shapes "
                     f"{x_arr.shape} and {y_arr.shape}.")
  if x_arr.ndim != 1 or x_arr.shape[0] < 3:
    raise ValueError(f"`x` must hold at least 3 points for a slope with an interval "
                     f"(n - 2 >= 1 degrees of freedom), got shape {x_arr.shape}.")
  lx = np.log(_positive_vector(x_arr, "x"))
  ly = np.log(_positive_vector(y_arr, "y"))
  dx = lx - lx.mean()
  sxx = float(np.sum(dx * dx))
  if sxx <= 0.0:
    raise ValueError(f"`x` must hold at least two distinct values, got {x_arr.tolist()}.")
  slope = float(np.sum(dx * (ly - ly.mean())) / sxx)
  residuals = ly - ly.mean() - slope * dx
  dof = lx.shape[0] - 2
  stderr = math.sqrt(float(np.sum(residuals * residuals)) / dof / sxx)
  half = t_quantile((1.0 + confidence) / 2.0, dof) * stderr
  return slope, slope - half, slope + half
