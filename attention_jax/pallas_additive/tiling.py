"""What a call of the Pallas additive kernels is configured with, and what
bounds it: tile sizes (`Blocks`) and each platform's defaults, the backward's
form and the tanh's, the TPU's VMEM and a GPU's registers and shared memory,
and the tiles the benchmark's tile search times (`tile_candidates`). Pure:
nothing here traces or runs a kernel.
"""

from __future__ import annotations

import dataclasses
import math

from attention_jax import _validate

BACKWARDS = ("fused", "split")
TANH_IMPLS = ("accurate", "approx")

# The most VMEM a kernel may ask Mosaic for on a TPU (v5e has 128 MiB per
# core; Mosaic's default scoped limit is 16 MiB, which the kernels exceed at
# a = 1024 from a few hundred keys on, since they keep one head's projected
# keys, or queries, whole in VMEM). What is left is for Mosaic's own scratch.
TPU_VMEM_LIMIT_BYTES = 100 * 2 ** 20

# What a Triton kernel's tanh tile may take per thread (float32 values,
# `rows · cols · chunk / (32 · num_warps)`): the default tile, 16 × 16 × 32
# over 4 warps, is 64, and with it ptxas gave the forward, `dq` and `dkv`
# kernels 128, 168 and 227 registers for `sm_90a` and no spills
# (results/compile_check/pallas_additive, commit d094991), against the 255 a
# thread may have (CUDA C++ Programming Guide, technical specifications per
# compute capability). Larger tiles per thread are not offered by
# `tile_candidates`: nothing has shown that they fit without spilling.
GPU_TILE_FLOATS_PER_THREAD = 64
# Shared memory one thread block may have on an H100 / H200 (compute
# capability 9.0: 227 KB; CUDA C++ Programming Guide, same table). Triton
# stages a dot's operands and cross-warp reductions there; `tile_candidates`
# charges a tile's tanh values, its score tile and the dot's operands to it.
GPU_SHARED_MEMORY_BYTES = 227 * 1024


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes: `rows` (on sublanes: queries in the forward and `dq`
  kernels, keys in the backward's), `cols` (on lanes: the other side),
  `chunk` (the features of `a` in one tanh tile). The tanh tile is
  `rows × cols × chunk`. `num_warps`: Triton's warps per program (GPU only)."""
  rows: int
  cols: int
  chunk: int
  num_warps: int = 4

  def __post_init__(self):
    for name in ("rows", "cols", "chunk", "num_warps"):
      _validate.positive_int(getattr(self, name), name)


def default_blocks(platform: str) -> Blocks:
  """Tile sizes per platform. TPU: a lane-dense `[8, 128]` score tile and
  128-wide chunks (Mosaic slices lanes at multiples of 128; a 512 KiB tanh
  tile). GPU (Triton): powers of two of at least 16 (its `dot` needs them),
  `16 × 16 × 32`, 8k float32 values, 64 per thread of 4 warps. Interpret
  mode (CPU): small tiles. None of them is tuned: no device has timed them
  (`tile_candidates` lists the tiles the benchmark's tile search times)."""
  if platform == "tpu":
    return Blocks(8, 128, 128)
  if platform == "gpu":
    return Blocks(16, 16, 32)
  return Blocks(8, 8, 8)


def default_backward(platform: str) -> str:
  """`fused` (3 tanh evaluations per element over forward and backward) on a
  CPU, i.e. in interpret mode, where it is tested; `split` (5) on a TPU,
  whose Mosaic kernels have no atomic add, and on a GPU until the fused
  kernel has been compiled and timed there (its atomic adds and registers
  are unmeasured; the module docstring)."""
  return "fused" if platform == "cpu" else "split"


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _tile_bytes(shape, itemsize: int = 4) -> int:
  """VMEM bytes of a block on a TPU: the last two axes padded to (8, 128) tiles."""
  *lead, sub, lane = (1,) * max(0, 2 - len(shape)) + tuple(shape)
  return math.prod(lead) * (-(-sub // 8) * 8) * (-(-lane // 128) * 128) * itemsize


def tpu_vmem_bytes(tq: int, tk: int, a: int, dv: int, blocks: Blocks, masked: bool = True,
                   itemsize: int = 4) -> int:
  """The most VMEM one of the kernels needs on a TPU (bytes): its blocks,
  double-buffered as Mosaic's pipeline holds them, and its tanh tile a few
  times over. The whole projected keys (forward, `dq`) or queries (`dkv`) of
  one head are one block, so this grows with `T·a`."""
  r, c, f = blocks.rows, blocks.cols, blocks.chunk
  chunks = -(-a // f)
  tile = 4 * _tile_bytes((r * c, f))  # the tanh tile and its products
  fwd = (_tile_bytes((chunks, r, f), itemsize) + _tile_bytes((chunks, tk, f), itemsize)
         + _tile_bytes((tk, dv), itemsize) + _tile_bytes((chunks, 1, f))
         + (_tile_bytes((r, tk)) if masked else 0) + _tile_bytes((r, dv)) + _tile_bytes((r, 1)))
  dq = fwd + _tile_bytes((r, dv), itemsize) + 2 * _tile_bytes((r, 1)) + _tile_bytes((chunks, r, f))
  dkv = (_tile_bytes((chunks, r, f), itemsize) + _tile_bytes((chunks, tq, f), itemsize)
         + _tile_bytes((r, dv), itemsize) + _tile_bytes((chunks, 1, f))
         + (_tile_bytes((r, tq)) if masked else 0) + 2 * _tile_bytes((1, tq))
         + _tile_bytes((tq, dv), itemsize) + _tile_bytes((chunks, r, f)) + _tile_bytes((r, dv))
         + _tile_bytes((chunks, 1, f)))
  return 2 * max(fwd, dq, dkv) + tile


def _powers_of_two(low: int, high: int) -> list[int]:
  return [1 << e for e in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << e <= high]


def tile_candidates(platform: str, tq: int, tk: int, a: int, dv: int = 64,
                    masked: bool = False) -> list[Blocks]:
  """The tiles the benchmark's tile search times
  (`experiments/kernels/additive.py`), smallest tanh tile first.

  GPU (Triton): `rows`, `cols` and `chunk` powers of two from 16 (Triton's
  dot needs 16 on the score tile's sides; 16 float32 features keep each
  row's loads 64 bytes wide), none beyond what it tiles (the longer of Tq
  and Tk, or a, rounded up to a power of two), 4 or 8 warps; kept when the
  tanh tile takes at most `GPU_TILE_FLOATS_PER_THREAD` values per thread and
  the tanh tile, the score tile and the dots' operands fit
  `GPU_SHARED_MEMORY_BYTES` (the register budget binds first: 64 per thread
  of 8 warps is 64 KiB). TPU: `rows` 8–64 (sublanes), `cols` and `chunk`
  128–512 (lanes), within `TPU_VMEM_LIMIT_BYTES` by `tpu_vmem_bytes`.
  """
  for name, value in (("tq", tq), ("tk", tk), ("a", a), ("dv", dv)):
    _validate.positive_int(value, name)
  t = max(tq, tk)
  found = []
  if platform == "gpu":
    dv_pad = max(16, 1 << (dv - 1).bit_length())
    side = _powers_of_two(16, max(16, 1 << (t - 1).bit_length()))
    chunks = _powers_of_two(16, max(16, 1 << (a - 1).bit_length()))
    for rows in side:
      for cols in side:
        for chunk in chunks:
          for warps in (4, 8):
            tile = rows * cols * chunk
            shared = 4 * (tile + rows * cols + (rows + cols) * dv_pad)
            if (tile <= GPU_TILE_FLOATS_PER_THREAD * 32 * warps
                and shared <= GPU_SHARED_MEMORY_BYTES):
              found.append(Blocks(rows, cols, chunk, warps))
  elif platform == "tpu":
    for rows in (8, 16, 32, 64):
      for cols in (128, 256, 512):
        for chunk in (128, 256, 512):
          if rows > round_up(t, 8) or cols > round_up(t, 128) or chunk > round_up(a, 128):
            continue
          blocks = Blocks(rows, cols, chunk)
          step = math.lcm(rows, cols)
          need = tpu_vmem_bytes(round_up(tq, step), round_up(tk, step), round_up(a, chunk),
                                dv, blocks, masked)
          if need <= TPU_VMEM_LIMIT_BYTES:
            found.append(blocks)
  else:
    raise ValueError(f"`platform` must be 'gpu' or 'tpu', got {platform!r}.")
  return sorted(found, key=lambda b: (b.rows * b.cols * b.chunk, b.rows, b.cols, b.chunk,
                                      b.num_warps))
