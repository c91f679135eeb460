"""Which main loop mma-attn runs: one decision over the kernels production runs.

    FP8 caches, Gluon usable, the whole-width shapes  -> "gluon-fp8-ws" (kernel_gluon_fp8_ws.py, one launch)
    bf16 caches, Gluon usable, the same shapes         -> "gluon-ws"     (kernel_gluon_bf16_ws.py, one launch)
    bf16 caches where only the per-cache loop applies  -> "gluon"        (kernel_gluon.py, once per cache)
    anything else (the interpreter, other GPUs, other
    Triton versions, fp32/fp16 q, value splits, ...)   -> "triton"       (kernel.py's block-level kernel)

Every Gluon loop writes partials that kernel.py's combine merges. The experiments that were once
switches here (the FP8 loop without warp specialisation, in-kernel split merges, straight fp32
partial stores) were measured and left off; their code lives in git history and
docs/kernels/mma_attn.md says what each measured. This module imports no other of the package at
load time, so every kernel file may import it.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch
import triton

from dsv4opt.tritonlib import HOPPER_SHARED_PER_BLOCK, device_limits

if TYPE_CHECKING:
    from dsv4opt.workload.kvcache import KVCache


@triton.jit
def _probe():
    pass


# Triton chooses interpreter or compiler when a kernel is defined (TRITON_INTERPRET at import).
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"

# Triton versions the Gluon loops were compiled and gated on: Gluon's API is experimental, and on
# other versions the block-level kernel runs (the Gluon modules are not even imported).
GLUON_VALIDATED_TRITON = ("3.6.",)

FUSED_ENGINES = ("gluon-fp8-ws", "gluon-ws")  # one launch over both caches


@functools.lru_cache(maxsize=None)
def gluon_unavailable_reason() -> str:
    """Why the Gluon loops cannot run here, in a phrase ("" where they can): they need a Hopper GPU
    with its shared memory (not capped by DSV4OPT_SHARED_MEMORY_LIMIT), a Triton version they were validated on, not the interpreter, and not switched off with
    DSV4OPT_MMA_ATTN_GLUON=0. Where they cannot, the block-level kernel runs every launch. Read
    once per process, so what the gate reports is what the dispatch did."""
    if INTERPRETED:
        return "Triton's interpreter runs the kernels"
    if os.environ.get("DSV4OPT_MMA_ATTN_GLUON", "1") == "0":
        return "switched off (DSV4OPT_MMA_ATTN_GLUON=0)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    limits = device_limits(torch.device("cuda"))
    major, minor = limits.capability
    if major != 9:
        return f"compute capability {major}.{minor}, not Hopper (9.x)"
    if limits.shared_per_block < HOPPER_SHARED_PER_BLOCK:
        return f"{limits.shared_per_block:,} B of shared memory a block (the loops are tiled for Hopper's {HOPPER_SHARED_PER_BLOCK:,})"
    if not triton.__version__.startswith(GLUON_VALIDATED_TRITON):
        validated = ", ".join(v + "x" for v in GLUON_VALIDATED_TRITON)
        return f"Triton {triton.__version__}, validated on {validated} only"
    return ""


def gluon_available() -> bool:
    """The Gluon loops can run here (gluon_unavailable_reason says why not)."""
    return not gluon_unavailable_reason()


def gluon_shape_ok(heads: int, dim: int, tiles, rope_follows: bool, q_strides: tuple, idx_stride: int) -> bool:
    """The shapes the Gluon loops were written and gated for: 64 heads, the 512-wide latent in one
    contiguous row (no split nope/rope), the whole-width family's tiles (64-row tiles, 8 warps) with
    a split (a single pass stays on the block-level kernel, which then needs no partials), rows of
    q and of the indices contiguous."""
    return (
        rope_follows and heads == 64 and dim == 512
        and tiles.block_h == 64 and tiles.block_k == 64 and tiles.block_v == 0 and tiles.num_warps == 8
        and not tiles.reload_v and tiles.nsplit > 1
        and q_strides[2] == 1 and q_strides[1] == dim and idx_stride == 1
    )


def gluon_operands_ok(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """bf16 (the dtype they were gated in) and 16-byte aligned KV rows: their cp.async gathers move
    16 B at a time, and Triton specialises pointers and strides on multiples of 16."""
    return (
        q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16
        and kv.stride(0) % 16 == 0 and kv.data_ptr() % 16 == 0
    )


def gluon_fp8_operands_ok(q: torch.Tensor, swa: KVCache, extra: KVCache | None) -> bool:
    """bf16 q and caches in the FP8 geometry the FP8 loop is written for (7 tiles of 64 e4m3 nope
    values, 64 bf16 rope values: 576-byte data and 8-byte scale records), with 16-byte aligned
    pages and buffers: its cp.async gathers move 16 bytes of a data record at a time."""
    from dsv4opt.optimizations.mma_attn import gluon_blocks as g

    def fits(c: KVCache) -> bool:
        L = c.layout
        return (
            L.fp8 and L.nope == g.NOPE_TILES * g.TILE and L.tile == g.TILE and L.rope == g.ROPE
            and L.data_bytes == g.DATA_BYTES and L.scale_bytes == g.SCALE_BYTES and L.page_bytes % 16 == 0
            and c.data.data_ptr() % 16 == 0 and c.data.is_contiguous()
        )

    return q.dtype == torch.bfloat16 and fits(swa) and (extra is None or fits(extra))


def gluon_bf16_ws_operands_ok(q: torch.Tensor, swa: KVCache, extra: KVCache | None) -> bool:
    """bf16 q and bf16 caches whose rows are 16-byte aligned and equally strided (the loop reads
    both caches through one pointer and one row stride; its cp.async gathers move 16 bytes)."""
    caches = [swa] + ([extra] if extra is not None else [])
    return all(gluon_operands_ok(q, c.data) and c.data.stride(1) == 1 for c in caches) and (
        extra is None or extra.data.stride(0) == swa.data.stride(0)
    )


def _fused_shape_ok(q: torch.Tensor, swa_indices, extra_indices, tiles) -> bool:
    """What a one-launch Gluon loop needs besides its operands: a CUDA q, the shapes of
    gluon_shape_ok, both caches' indices of unit stride, and Gluon usable here."""
    B, H, D = q.shape
    return (
        q.is_cuda and gluon_shape_ok(H, D, tiles, True, q.stride(), swa_indices.stride(1))
        and (extra_indices is None or extra_indices.stride(1) == 1) and gluon_available()
    )


def fused_engine(q: torch.Tensor, swa: KVCache, swa_indices, extra: KVCache | None, extra_indices, tiles) -> str:
    """The one-launch loop over both caches: "gluon-fp8-ws" on FP8 rows, "gluon-ws" on bf16 rows,
    where it applies; else "triton" on FP8 rows and "" on bf16 rows (then `cache_engine` decides
    per cache)."""
    ok = _fused_shape_ok(q, swa_indices, extra_indices, tiles)
    if swa.layout.fp8:
        return "gluon-fp8-ws" if ok and gluon_fp8_operands_ok(q, swa, extra) else "triton"
    return "gluon-ws" if ok and gluon_bf16_ws_operands_ok(q, swa, extra) else ""


def cache_engine(q: torch.Tensor, cache: KVCache, indices: torch.Tensor, tiles) -> str:
    """The loop for one bf16 cache on its own: "gluon" (kernel_gluon.py) where it applies, else "triton"."""
    B, H, D = q.shape
    if (
        q.is_cuda and not cache.layout.fp8
        and gluon_shape_ok(H, D, tiles, True, q.stride(), indices.stride(1))
        and gluon_operands_ok(q, cache.data) and gluon_available()
    ):
        return "gluon"
    return "triton"
