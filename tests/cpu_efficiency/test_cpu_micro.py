"""experiments/cpu_efficiency/cpu_micro.py: its two measurements, each in a fresh process, at toy size
(the committed micro.log is the quick preset's, about 3 minutes)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child(*args):
  proc = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency.cpu_micro", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_output_layer_is_timed_both_ways():
  ms = _child("--child=output_layer", "--repeats=2")
  assert set(ms) == {"3-D Linear", "layers.dense"} and min(ms.values()) > 0


def test_a_step_reports_its_time_faults_and_temporaries():
  row = _child("--child=step", "--allocator=keep", "--preset=smoke", "--dim=8",
               "--batches=2", "--rounds=1")
  assert set(row) == {"median_ms", "faults_per_step", "temp_mib"}
  assert row["median_ms"] > 0 and row["temp_mib"] > 0 and row["faults_per_step"] >= 0


def test_a_bad_flag_is_one_line():
  proc = subprocess.run([sys.executable, "-m", "experiments.cpu_efficiency.cpu_micro", "--rounds=0"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == "error: `--rounds` must be >= 1, got 0."
