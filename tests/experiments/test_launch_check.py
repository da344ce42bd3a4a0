"""The launch check's pure parts: its prediction, row merging and table (no compile)."""

from experiments import launch_check


def _row(case, variant, launches, steps=6000):
  return {"case": case, "variant": variant, "kernels": 17114, "thunk_kernels": 15040,
          "launches": launches, "command_buffers": 646, "host_iterations": 480,
          "predicted_s": 0.1086, "roofline_s": 0.0522, "steps": steps,
          "predicted_launch_s": launch_check.predicted_launch_seconds(
              {"roofline_s": 0.0522, "launches": launches, "host_iterations": 480},
              3e-6, 10e-6)}


def test_predicted_launch_seconds_counts_launches_and_host_iterations():
  row = {"roofline_s": 0.05, "launches": 1000, "host_iterations": 480}
  assert abs(launch_check.predicted_launch_seconds(row, 3e-6, 10e-6) - 0.0578) < 1e-12


def test_merge_replaces_the_same_case_and_variant_only():
  rows = [_row("additive d=1024", "default", 7773), _row("additive d=1024", "while_loops", 10)]
  merged = launch_check.merge(rows, _row("additive d=1024", "default", 7000))
  assert sorted(r["launches"] for r in merged) == [10, 7000]


def test_table_marks_the_measured_cell_and_sums_the_sweep_only_when_whole():
  rows = [dict(_row("additive d=1024", "default", 7773), commit="f0c83c5+dirty")]
  text = launch_check.table(rows)
  assert "| 7,773 |" in text and "21-23 ms (H200, per-step code" in text
  # the same cell compiled at another commit is another program: no measurement
  assert "H200" not in launch_check.table([dict(rows[0], commit="d4095aa")])
  assert "H200" not in launch_check.table([_row("additive d=1024", "default", 7773)])
  assert "predicted at" not in text  # one cell of 12: no sweep total
  whole = [_row(f"additive d={d}", "default", 7773) for d in (128, 256, 512, 1024)] * 3
  for i, r in enumerate(whole):
    r["case"] = f"{['additive', 'multiplicative', 'scaled'][i // 4]} d={[128, 256, 512, 1024][i % 4]}"
  total = 12 * 6000 * (0.0522 + 7773 * 3e-6 + 480 * 10e-6) / 60
  assert f"predicted at {total:.1f} min" in launch_check.table(whole)
