"""Launch counting from XLA:GPU's thunk sequence (pure text; no GPU, no AOT environment)."""

import pytest

from attention_jax.measure import thunks

# The shape of a `*.thunk_sequence_after_thunk_passes.txt` dump (jax 0.11.2): a
# command buffer before a loop, whose body has a copy on another stream, a
# one-kernel command buffer and a three-kernel one.
SEQUENCE = """\
000: kCommandBuffer [source       | next=005 (1)] 
    001: kCustomKernel [source       | sink        ] loop_broadcast_fusion_2 grid: [64, 1, 1]
    002: kCopy         [source       | next=003 (1)] kCopy
    003: kCopy         [prev=002 (1) | sink        ] kCopy
005: kWhile         [prev=000 (1) | next=015 (1)]   
condition:
    006: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1]
  body:
    007: kAsyncStart    [source       | next=000 (3)] stream=computation_stream[0], async_id=7
        009: kDynamicSliceFusion [source | sink] params=1, results=1
            008: kCopy [source | sink] kCopy
    000: kCommandBuffer [source       | next=000 (2)] 
        010: kCustomKernel [source | sink] gemm_fusion_dot_general_1 grid: [4, 1, 1]
    011: kAsyncDone     [source       | sink        ] async_id=7
    000: kCommandBuffer [prev=000 (2) | sink        ] 
        012: kCustomKernel [source       | next=013 (1)] loop_tanh_fusion grid: [4, 1, 1]
        013: kCustomKernel [prev=012 (1) | next=014 (1)] loop_dus_fusion grid: [4, 1, 1]
        014: kCustomKernel [prev=013 (1) | sink        ] loop_add_fusion_1 grid: [1, 1, 1]
015: kCustomKernel [prev=005 (1) | sink] loop_broadcast_fusion grid: [32, 1, 1]
"""


def test_parse_nests_by_indentation_and_sections():
  top = thunks.parse_thunk_sequence(SEQUENCE)
  assert [t.kind for t in top] == ["kCommandBuffer", "kWhile", "kCustomKernel"]
  assert [t.thunk_id for t in top[0].children()] == [1, 2, 3]
  loop = top[1]
  assert [t.thunk_id for t in loop.sections["condition"]] == [6]
  assert [t.kind for t in loop.sections["body"]] == [
      "kAsyncStart", "kCommandBuffer", "kAsyncDone", "kCommandBuffer"]
  assert loop.sections["body"][0].children()[0].children()[0].thunk_id == 8
  assert [t.thunk_id for t in loop.sections["body"][3].children()] == [12, 13, 14]


def test_launches_count_a_command_buffer_once():
  count = thunks.launch_count(thunks.parse_thunk_sequence(SEQUENCE), {5: 10})
  # Outside the loop: one command buffer and one kernel. Per iteration: the
  # condition, the async copy and two command buffers; the condition once more.
  assert count["launches"] == 2 + 10 * 3 + 11 * 1
  # Kernels: 3 + 1 outside; 5 per iteration; 11 conditions.
  assert count["kernels"] == 4 + 10 * 5 + 11
  assert count["command_buffers"] == 1 + 10 * 2
  assert count["host_iterations"] == 10 and count["captured_iterations"] == 0


def test_a_loop_inside_a_command_buffer_is_one_launch():
  captured = "000: kCommandBuffer [source | sink]\n" + "\n".join(
      "    " + line for line in SEQUENCE.splitlines())
  count = thunks.launch_count(thunks.parse_thunk_sequence(captured), {5: 10})
  assert count["launches"] == 1
  assert count["kernels"] == 4 + 10 * 5 + 11
  assert count["host_iterations"] == 0 and count["captured_iterations"] == 10


def test_unknown_trip_count_and_bad_text_are_refused():
  with pytest.raises(ValueError, match="while thunk 5"):
    thunks.launch_count(thunks.parse_thunk_sequence(SEQUENCE), {})
  with pytest.raises(ValueError, match="line 1"):
    thunks.parse_thunk_sequence("not a thunk\n")


def test_trip_counts_and_while_annotations():
  hlo = ('  %while.12 = (s32[], f32[4]) while(%t), condition=%c, body=%b, '
         'backend_config={"known_trip_count":{"n":"16"},"known_init_step":{}}\n'
         '  ROOT %while.3 = (s32[]) while(%u), condition=%c2, body=%b2, '
         'backend_config={"known_trip_count":{"n":"80"}}\n')
  assert thunks.trip_counts(hlo) == {"while.12": 16, "while.3": 80}
  meta = ('thunk_metadata {\n  thunk_info {\n    profile_annotation: "while.12"\n'
          '    thunk_id: 5\n  }\n  thunk_kind: "kWhile"\n}\n'
          'thunk_metadata {\n  thunk_info {\n    profile_annotation: "fusion.1"\n'
          '    thunk_id: 6\n  }\n  thunk_kind: "kCustomKernel"\n}\n')
  assert thunks.while_annotations(meta) == {5: "while.12"}
