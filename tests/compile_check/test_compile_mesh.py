"""The multi-device compile check (experiments/compile_check/mesh.py, the
collectives of hlo.py, compile_targets.collective_seconds): its pure parts
here; compiling for 8 H100s, a v5e-8 and a v4-32 in the AOT environment
(`.venv-aot`, scripts/aot_env.sh), in a subprocess, marked `aot`."""

import json
import os
import subprocess
import textwrap

import pytest

from experiments.compile_check import mesh as compile_mesh
from experiments.compile_check import tables as compile_tables
from attention_jax.measure import compile_targets
from attention_jax.measure import hlo
from experiments.compile_check import run as cc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOT_PYTHON = os.path.join(ROOT, ".venv-aot", "bin", "python")

# A module whose entry runs an all-reduce over pairs of devices (iota
# groups), a loop of 5 steps with an all-gather inside a fusion, and XLA:GPU's
# async forms: an all-reduce-start whose operands are a tuple of their own
# and whose groups are named mesh axes, and an all-gather-start.
MODULE = textwrap.dedent("""\
    HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

    %add (a: f32[], b: f32[]) -> f32[] {
      %a = f32[] parameter(0)
      %b = f32[] parameter(1)
      ROOT %s = f32[] add(%a, %b)
    }

    %gather_fusion (p: bf16[2,16]) -> bf16[2,64] {
      %p = bf16[2,16]{1,0} parameter(0)
      ROOT %ag = bf16[2,64]{1,0} all-gather(%p), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={1}
    }

    %body (t: (s32[], bf16[2,16])) -> (s32[], bf16[2,16]) {
      %t = (s32[], bf16[2,16]{1,0}) parameter(0)
      %x = bf16[2,16]{1,0} get-tuple-element(%t), index=1
      %f = bf16[2,64]{1,0} fusion(%x), kind=kOutput, calls=%gather_fusion
      %i = s32[] get-tuple-element(%t), index=0
      ROOT %r = (s32[], bf16[2,16]{1,0}) tuple(%i, %x)
    }

    %cond (t: (s32[], bf16[2,16])) -> pred[] {
      %t = (s32[], bf16[2,16]{1,0}) parameter(0)
      %n = s32[] constant(5)
      %i = s32[] get-tuple-element(%t), index=0
      ROOT %c = pred[] compare(%i, %n), direction=LT
    }

    ENTRY %main (x: f32[8], y: bf16[2,16]) -> f32[8] {
      %x = f32[8]{0} parameter(0)
      %y = bf16[2,16]{1,0} parameter(1)
      %ar = f32[8]{0} all-reduce(%x), channel_id=1, replica_groups=[4,2]<=[8], to_apply=%add
      %t = (s32[], bf16[2,16]{1,0}) tuple(%x, %y)
      %w = (s32[], bf16[2,16]{1,0}) while(%t), condition=%cond, body=%body
      %all-reduce-start = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%ar), channel_id=3, replica_groups=mesh['members'=1,'data'=8] {'data'}, use_global_device_ids=true, to_apply=%add, output_to_operand_aliasing={{1}: (0, {})}, backend_config={"is_sync":false}
      %all-reduce-done = f32[8]{0} all-reduce-done(%all-reduce-start)
      %all-gather-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%all-reduce-done), channel_id=4, replica_groups={}, dimensions={0}
      %all-gather-done = f32[64]{0} all-gather-done(%all-gather-start)
      ROOT %out = f32[8]{0} get-tuple-element(%w), index=1
    }
    """)


def test_collectives_counts_kinds_groups_and_bytes_with_loops_and_async_forms():
  rows = hlo.collectives(MODULE, num_devices=8)
  assert rows == [
      # In a fusion in a 5-step loop: its gathered result, 2 x 64 bf16, 5 times.
      {"kind": "all-gather", "group_size": 4, "count": 5, "bytes": 5 * 2 * 64 * 2},
      # Once at the top level (4 bytes x 64, gathered over all 8 devices).
      {"kind": "all-gather", "group_size": 8, "count": 1, "bytes": 64 * 4},
      {"kind": "all-reduce", "group_size": 2, "count": 1, "bytes": 8 * 4},
      # The async start: its result, not its operands' tuple; 'data' = 8 devices.
      {"kind": "all-reduce", "group_size": 8, "count": 1, "bytes": 8 * 4},
  ]


def test_group_sizes_and_reduce_scatter_bytes():
  assert hlo.group_size("x all-reduce(%a), replica_groups=[2,4]<=[4,2]T(1,0)", 8) == 4
  assert hlo.group_size("x all-reduce(%a), replica_groups={{0,1,2}}", 8) == 3
  assert hlo.group_size("x all-reduce(%a), replica_groups={}", 16) == 16
  assert hlo.group_size(
      "x all-reduce(%a), replica_groups=mesh['members'=2,'data'=4] {'members','data'}", 8) == 8
  assert hlo.group_size("x collective-permute(%a), source_target_pairs={{0,1}}", 8) == 2
  # A reduce-scatter works on its input: the result times the group.
  line = "  %rs = f32[4]{0} reduce-scatter(%a), replica_groups=[2,4]<=[8], dimensions={0}"
  assert hlo.collective_bytes(line, "reduce-scatter", 4) == 4 * 4 * 4


def test_parsable_drops_what_the_cpu_parser_refuses():
  text = hlo.parsable(MODULE)
  assert "output_to_operand_aliasing" not in text and "mesh[" not in text
  assert "replica_groups={}, use_global_device_ids=true, to_apply=%add, backend_config" in text
  # Nothing else changes.
  assert len(text.splitlines()) == len(MODULE.splitlines())
  assert hlo.collectives(text, 8)[-1]["group_size"] == 8  # {} = every device


def test_collective_time_is_ring_traffic_over_the_links_plus_a_fixed_cost():
  target = compile_targets.TARGETS["h100x8"]
  rows = [{"kind": "all-reduce", "group_size": 8, "count": 3, "bytes": 450e6},
          {"kind": "all-gather", "group_size": 2, "count": 1, "bytes": 900e6},
          {"kind": "all-reduce", "group_size": 1, "count": 7, "bytes": 1e9}]  # no traffic
  expected = (3 * 10e-6 + 2 * 7 / 8 * 450e6 / 450e9) + (10e-6 + 1 / 2 * 900e6 / 450e9)
  assert compile_targets.collective_seconds(rows, target) == pytest.approx(expected)
  assert compile_targets.collective_seconds([], target) == 0.0
  with pytest.raises(ValueError, match="link_bandwidth"):
    compile_targets.collective_seconds(rows[:1], compile_targets.TARGETS["h100"])


def test_multi_device_targets():
  v5e8, v432, h8 = (compile_targets.TARGETS[n] for n in ("tpu_v5e_8", "tpu_v4_32", "h100x8"))
  assert (v5e8.devices, v5e8.hosts, v5e8.chips_per_host_bounds) == (8, 1, (2, 4, 1))
  assert (v432.devices, v432.hosts, v432.chip_config_name) == (16, 4, "megacore")
  assert (h8.devices, h8.hosts, h8.topology) == (8, 1, "1x1x8")
  assert compile_targets.TARGETS["h100"].devices == 1


def test_pad_members():
  assert compile_mesh.pad_members(21, 8) == 24
  assert compile_mesh.pad_members(21, 16) == 32
  assert compile_mesh.pad_members(24, 8) == 24
  with pytest.raises(ValueError, match="`groups`"):
    compile_mesh.pad_members(4, 0)


def test_mesh_cases_lay_out_the_gpu_preset_and_the_grid():
  # The `gpu` preset has 4 seeds: on 8 devices its members alone take 4
  # (one each), members x data all 8 (4 x 2), data parallelism 1 x 8.
  layouts = {p: {(c.members, c.data, c.num_members, c.padding)
                 for c in compile_mesh.mesh_cases(p, 8)}
             for p in ("gpu_members", "gpu_members_data", "gpu_data")}
  assert layouts == {"gpu_members": {(4, 1, 4, 0)}, "gpu_members_data": {(4, 2, 4, 0)},
                     "gpu_data": {(1, 8, 4, 0)}}
  # The additive arm at each of the 4 dims, each standing for the 3 arms.
  gpu = compile_mesh.mesh_cases("gpu_data", 8)
  assert [(c.shapes["arm"], c.shapes["dim"], c.runs) for c in gpu] == [
      ("additive", d, 3) for d in (128, 256, 512, 1024)]
  grid = compile_mesh.mesh_cases("lr_grid", 16)
  assert [c.shapes["dim"] for c in grid] == [16, 64, 256, 1024]
  # 7 rates x 3 seeds = 21 members, padded to 32 on 16 devices; each program
  # stands for 2 layer norms x 4 scores.
  assert {(c.members, c.data, c.num_members, c.padding, c.runs, c.steps) for c in grid} == {
      (16, 1, 32, 11, 8, 3000)}
  today = compile_mesh.mesh_cases("lr_grid_data", 8)
  assert {(c.members, c.data, c.num_members, c.runs) for c in today} == {(1, 8, 3, 56)}


def _mesh_row(program, case, scheme, devices, mesh, **fields):
  return {"program": program, "case": case, "status": "compiled", "fits": True,
          "scheme": scheme, "num_devices": devices, "mesh": mesh, "hosts": 1, "members": 4,
          "padding": 0, "runs": 1, **fields}


def test_mesh_tables_name_devices_collectives_and_totals():
  rows = [
      _mesh_row("gpu_members", "additive d=128", "members", 4, {"members": 4, "data": 1},
                total_bytes=1.2e9, flops=275e9, collectives=[], collective_s=0.0,
                predicted_s=0.03, steps=6000, predicted_total_s=180.0),
      _mesh_row("gpu_data", "additive d=128", "data", 8, {"members": 1, "data": 8},
                total_bytes=2.5e9, flops=140e9,
                collectives=[{"kind": "all-reduce", "group_size": 8, "count": 3,
                              "bytes": 98e6}],
                collective_s=0.001, predicted_s=0.04, steps=6000, predicted_total_s=240.0),
  ]
  table = compile_tables.mesh_table(rows).splitlines()
  assert table[2] == ("| gpu_members | additive d=128 | members | 4 | 4 × 1 | 1 | 4 (0) | 1.20 | "
                      "yes | 275 | – | none | 0 µs | 30.00 ms | 1 × 6,000 | 3.0 min |")
  assert table[3].startswith("| gpu_data | additive d=128 | data | 8 | 1 × 8 | 1 | 4 (0) | 2.50 |")
  assert "| all-reduce ×3 (0.098 GB, group 8) | 1.00 ms | 40.00 ms |" in table[3]
  totals = compile_tables.mesh_totals(rows).splitlines()
  assert totals[2] == "| `gpu` preset, members split over devices | 4 | 3.0 min | 0 µs |"
  assert totals[3] == "| `gpu` preset, data parallel (today) | 8 | 4.0 min | 6.00 s |"
  text = compile_tables.summary(rows, compile_targets.TARGETS["h100x8"])
  assert "8 devices on 1 host(s)" in text and "## Multi-device programs" in text


def test_summary_names_each_commit_of_rows_made_in_parts():
  versions = {"jax": "0.11.2"}
  made = lambda program, commit: _mesh_row(
      program, "additive d=128", "members", 4, {"members": 4, "data": 1}, commit=commit,
      command=f"python -m experiments.compile_check.run --programs={program}", versions=versions,
      date="2026-11-27T12:00:00Z")
  one = compile_tables.provenance([made("gpu_members", "aaa"), made("gpu_members", "aaa")])
  assert one.count("commit") == 1 and "commit aaa" in one
  parts = compile_tables.provenance([made("lr_grid", "aaa"), made("gpu_data", "bbb"),
                                     made("gpu_members", "bbb")]).splitlines()
  assert parts[0] == 'Compiled on a CPU-only host with {"jax": "0.11.2"}, in parts:'
  assert parts[1].startswith("- `lr_grid` (1 row(s)): commit aaa,")
  assert parts[2].startswith("- `gpu_data` (1 row(s)): commit bbb,")
  assert parts[3].startswith("- `gpu_members` (1 row(s)): commit bbb,")
  assert parts[3].endswith("`python -m experiments.compile_check.run --programs=gpu_members`")


def test_parse_options_chooses_the_programs_of_the_target():
  several = cc.parse_options("tpu_v5e_8", None, "/tmp/x", "512", "256")
  assert several.programs == cc.MESH_PROGRAMS
  assert cc.parse_options("h100", None, "/tmp/x", "512", "256").programs == cc.PROGRAMS
  with pytest.raises(ValueError, match="`--programs`: 'gpu_members' needs a target of several"):
    cc.parse_options("h100", "gpu_members", "/tmp/x", "512", "256")


# Compiles, for one multi-device target, the training step of a tiny
# Transformer with 8 members (`gpu_members`' layout: the members split, one
# per device) and with today's data parallelism; prints one JSON line: the
# rows and the hosts of every device.
_SCRIPT = textwrap.dedent("""\
    import json, os, sys
    for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from attention_jax.measure import compile_device, compile_targets
    from experiments.compile_check import mesh as compile_mesh
    from attention_jax.sweep import config as config_lib
    target = compile_targets.TARGETS[sys.argv[1]]
    devices = compile_device.target_devices(target)
    cfg = config_lib.ExperimentConfig(
        model="transformer", arms=("scaled_dot",), dims=(16,), seeds=8, vocab_size=64,
        hidden_dim=32, num_heads=2, ff_dim=64, encoder_layers=1, decoder_layers=1,
        batch_size=8, max_length=15, dtype="bfloat16")
    out = {"processes": sorted({d.process_index for d in devices}), "devices": len(devices)}
    for scheme, members, data in (("members", 8, 1), ("data", 1, 8)):
        case = compile_mesh.train_step_mesh_case("test", scheme, cfg, cfg.sweep()[0], scheme,
                                                 members, data)
        out[scheme] = compile_mesh.compile_mesh_case(case, target, devices)
    print(json.dumps(out))
    """)


@pytest.mark.aot
@pytest.mark.slow  # two compiles for 8 devices: 1-3 min on the 2-core machine
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
@pytest.mark.parametrize("target", ["tpu_v5e_8", "h100x8"])
def test_members_split_over_devices_compile_without_collectives(target):
  proc = subprocess.run([AOT_PYTHON, "-c", _SCRIPT, target], cwd=ROOT, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8
  assert out["processes"] == [0]  # one host: a v5e-8 is not two hosts of 4 chips
  members, data = out["members"], out["data"]
  for row in (members, data):
    assert row["status"] == "compiled", row.get("error")
    assert row["num_devices"] == 8 and row["hosts"] == 1 and row["fits"]
  # Each device its own member: no all-reduce, no all-gather, nothing at all.
  assert members["collectives"] == [] and members["collective_s"] == 0
  # Today's scheme sums every member's gradients over the 8 devices.
  reduces = [c for c in data["collectives"] if c["kind"] == "all-reduce"]
  assert reduces and all(c["group_size"] == 8 for c in reduces)
  assert data["collective_s"] > 0
  # One member per device against all 8 per device: less held per device.
  assert members["argument_bytes"] < data["argument_bytes"]
  if target == "h100x8":  # cuDNN's attention inside the members' shard_map too
    assert members["fused_attention"] == data["fused_attention"] == "cudnn"


@pytest.mark.aot
@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason="no .venv-aot (bash scripts/aot_env.sh builds it)")
def test_the_v4_32_is_16_chips_over_4_hosts():
  script = textwrap.dedent("""\
      import json, os
      for key, value in __import__("experiments.compile_check.run").compile_check.run.ENVIRONMENT.items():
          os.environ.setdefault(key, value)
      from attention_jax.measure import compile_device, compile_targets
      from experiments.compile_check import mesh as compile_mesh
      devices = compile_device.target_devices(compile_targets.TARGETS["tpu_v4_32"])
      print(json.dumps([len(devices), compile_mesh.hosts_of(devices), devices[0].device_kind]))
      """)
  proc = subprocess.run([AOT_PYTHON, "-c", script], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == [16, 4, "TPU v4"]


def test_pad_grid_adds_the_fewest_members():
  assert compile_mesh.pad_grid(3, 7, 8) == (3, 8)
  assert compile_mesh.pad_grid(3, 7, 16) == (4, 8)
  assert compile_mesh.pad_grid(4, 2, 8) == (4, 2)
  with pytest.raises(ValueError, match="`groups`"):
    compile_mesh.pad_grid(3, 7, 0)
  (case, *_) = compile_mesh.mesh_cases("lr_grid", 8)
  assert case.shapes["member_values"] == (
      "learning_rate=1e-05,3e-05,0.0001,0.0003,0.001,0.003,0.01,0.03")
  assert (case.shapes["seeds"], case.num_members, case.padding) == (3, 24, 3)
