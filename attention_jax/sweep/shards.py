"""A sweep's runs shared among drivers: `--shard=I/N`, or read from a scheduler.

Shard I of N trains run k of the sweep (`runner.Plan.jobs`, in its order:
grid points, then arms, then dims) where k mod N == I: a deterministic
share that needs no coordination, so a job array's tasks each know theirs.
Which run a live driver trains is settled by the run's own lock
(`runner`, `workdir_lock`), so shards that overlap, or a requeued task whose
predecessor is still stopping, never train one run twice.

`auto` reads the share from the scheduler: SLURM's job array
(`SLURM_ARRAY_TASK_ID`, and `SLURM_ARRAY_TASK_COUNT`, or the array's
`SLURM_ARRAY_TASK_MIN`/`MAX` where an older SLURM sets no count); `auto/N`
takes the index from SLURM or, on Kubernetes (an indexed Job, as JobSet and
xpk run them), from `JOB_COMPLETION_INDEX`, with N given (Kubernetes puts no
count in the environment).
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

T = TypeVar("T")
AUTO = "auto"


def _int(value: str, what: str) -> int:
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"`--shard`: {what} must be an integer, got {value!r}.") from None


def _from_scheduler(environ: Mapping[str, str], count: int | None) -> tuple[int, int]:
  """(index, count) from SLURM's array or Kubernetes' completion index."""
  if "SLURM_ARRAY_TASK_ID" in environ:
    index = _int(environ["SLURM_ARRAY_TASK_ID"], "SLURM_ARRAY_TASK_ID")
    if count is None:
      if "SLURM_ARRAY_TASK_COUNT" in environ:
        count = _int(environ["SLURM_ARRAY_TASK_COUNT"], "SLURM_ARRAY_TASK_COUNT")
      elif "SLURM_ARRAY_TASK_MAX" in environ:
        low = _int(environ.get("SLURM_ARRAY_TASK_MIN", "0"), "SLURM_ARRAY_TASK_MIN")
        count = _int(environ["SLURM_ARRAY_TASK_MAX"], "SLURM_ARRAY_TASK_MAX") - low + 1
        index -= low
      else:
        raise ValueError("`--shard=auto`: SLURM set SLURM_ARRAY_TASK_ID but no "
                         "SLURM_ARRAY_TASK_COUNT or _MAX; give --shard=auto/N.")
    return index, count
  if "JOB_COMPLETION_INDEX" in environ:
    if count is None:
      raise ValueError("`--shard=auto`: Kubernetes gives the index (JOB_COMPLETION_INDEX) but "
                       "not the count; give --shard=auto/N, N the Job's completions.")
    return _int(environ["JOB_COMPLETION_INDEX"], "JOB_COMPLETION_INDEX"), count
  raise ValueError("`--shard=auto`: no scheduler's array index in the environment "
                   "(SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX); give --shard=I/N.")


def parse(spec: str, environ: Mapping[str, str]) -> tuple[int, int] | None:
  """`--shard` as (index, count); None for '' (every run). A ValueError of
  one line naming the flag for anything else than I/N with 0 <= I < N,
  `auto` or `auto/N`."""
  spec = spec.strip()
  if not spec:
    return None
  head, slash, tail = spec.partition("/")
  count = _int(tail, "N (after the /)") if slash else None
  if count is not None and count < 1:
    raise ValueError(f"`--shard`: N must be >= 1, got {count}.")
  if head == AUTO:
    index, count = _from_scheduler(environ, count)
  elif not slash:
    raise ValueError(f"`--shard` must be I/N (this driver's share I of N), auto or auto/N, "
                     f"got {spec!r}.")
  else:
    index = _int(head, "I (before the /)")
  if count < 1 or not 0 <= index < count:
    raise ValueError(f"`--shard`: the index must be in 0..{count - 1} for {count} shards, "
                     f"got {index}.")
  return index, count


def share(items: Sequence[T], shard: tuple[int, int] | None) -> tuple[T, ...]:
  """The items of `shard` (all of them for None): item k where k mod N == I."""
  if shard is None:
    return tuple(items)
  index, count = shard
  return tuple(item for k, item in enumerate(items) if k % count == index)
