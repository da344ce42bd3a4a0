"""`sweep.shards`: the `--shard` spec, its scheduler forms, and the share."""

import pytest

from attention_jax.sweep import shards


@pytest.mark.parametrize("spec, environ, want", [
    ("", {}, None),
    ("0/1", {}, (0, 1)),
    ("2/3", {}, (2, 3)),
    ("auto", {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, (1, 4)),
    # an older SLURM: no count, the array's bounds (--array=3-5)
    ("auto", {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "3",
              "SLURM_ARRAY_TASK_MAX": "5"}, (1, 3)),
    ("auto/5", {"JOB_COMPLETION_INDEX": "3"}, (3, 5)),
    ("auto/2", {"SLURM_ARRAY_TASK_ID": "1"}, (1, 2)),
])
def test_parse(spec, environ, want):
  assert shards.parse(spec, environ) == want


@pytest.mark.parametrize("spec, environ, match", [
    ("3", {}, "must be I/N"),
    ("3/3", {}, r"0\.\.2 for 3 shards, got 3"),
    ("-1/3", {}, r"0\.\.2"),
    ("a/3", {}, "I \\(before the /\\) must be an integer"),
    ("1/0", {}, "N must be >= 1"),
    ("auto", {}, "no scheduler's array index"),
    ("auto", {"JOB_COMPLETION_INDEX": "1"}, "give --shard=auto/N"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"},
     "SLURM_ARRAY_TASK_ID must be an integer"),
])
def test_bad_specs_are_one_line_naming_the_flag(spec, environ, match):
  with pytest.raises(ValueError, match=match) as e:
    shards.parse(spec, environ)
  assert "`--shard" in str(e.value) and "\n" not in str(e.value)


def test_the_shares_partition_the_items_in_order():
  items = list(range(11))
  parts = [shards.share(items, (i, 3)) for i in range(3)]
  assert parts == [(0, 3, 6, 9), (1, 4, 7, 10), (2, 5, 8)]
  assert sorted(x for p in parts for x in p) == items
  assert shards.share(items, None) == tuple(items)
  assert shards.share(items, (0, 20)) == (0,) and shards.share(items, (15, 20)) == ()
