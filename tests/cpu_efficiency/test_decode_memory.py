"""experiments/cpu_efficiency/decode_memory.py: the compiled search's memory with and without the
Transformer's beam hooks (at a small size; the committed figures are at d_k 1024)."""

import os
import subprocess
import sys

import pytest

from experiments.cpu_efficiency import decode_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_beam_hooks_hold_fewer_temporaries_than_the_plain_search():
  new = decode_memory.measure(2, 12, 3, plain=False, run=True, d_k=64, max_length=16)
  plain = decode_memory.measure(2, 12, 3, plain=True, run=False, d_k=64, max_length=16)
  # the same parameters go in; the plain form repeats the encoder memory per beam
  assert new["arg_mib"] == plain["arg_mib"] > 0
  assert 0 < new["temp_mib"] < plain["temp_mib"]
  assert new["run_s"] > 0 and "run_s" not in plain
  greedy = decode_memory.measure(2, 12, 1, plain=False, run=False, d_k=64, max_length=16)
  assert greedy["temp_mib"] < new["temp_mib"]  # one hypothesis per sentence


@pytest.mark.parametrize("flag, said", [("--beam=0", "`--beam`"),
                                        ("--src_len=500", "`--src_len` 500")])
def test_a_bad_flag_is_one_line_before_any_work(flag, said):
  proc = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency.decode_memory", flag], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert proc.returncode == 1 and len(lines) == 1 and said in lines[0], proc.stderr[-2000:]
  assert "MiB" not in proc.stdout
