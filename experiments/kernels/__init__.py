"""Attention kernels timed against each other: the benchmark, one module per part.

- `settings`: `Settings` (every knob, named as its flag) and the presets.
- `kernels` (with `kernel_impls`, what is timed), `additive`, `models`: the
  suites, each `run(settings, write)`; `write(row)` records one measurement.
- `timing`: interleaved timing under load, repeats, memory limit.
- `jsonl`: appending rows to `benchmark.jsonl`.
- `report`: `benchmark.md` tables and the plots.

Every measured kernel is first checked against a naive float32 reference and
compiled before the clock starts; see `experiments/kernels/run.py`.
"""
