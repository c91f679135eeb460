"""FlashMLA's Hopper sparse FP8 decode, built from source, as mma-attn's anchor: the library that
benchmarks/anchor_flashmla/build.sh builds (deepseek-ai/FlashMLA at 9241ae3 behind its shim.cu), loaded
through ctypes, one input set mapped onto the shim's struct, and one batch size's calls. The twin of
grouped_moe/anchor.py. Not a dependency: `load` says why not when the library is absent.

Used by bench_peers.py (`dsv4opt bench mma-attn`'s peers table) and benchmarks/bench_flashmla_anchor.py.
GPU only, apart from the struct mapping.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

HEAD_DIM_V = 512


def load(path: Path) -> tuple[ctypes.CDLL | None, str]:
    """(the library with its argument types set, "yes"), else (None, why not)."""
    if not Path(path).exists():
        return None, f"{path} not found (benchmarks/anchor_flashmla/build.sh builds it)"
    lib = ctypes.CDLL(str(path))
    lib.anchor_sched.argtypes = lib.anchor_decode.argtypes = [ctypes.POINTER(AnchorArgs)]
    return lib, "yes"


class AnchorArgs(ctypes.Structure):
    """shim.cu's AnchorArgs, field for field."""

    _fields_ = [
        ("b", ctypes.c_int), ("h_q", ctypes.c_int), ("num_sm_parts", ctypes.c_int), ("sm_scale", ctypes.c_float),
        ("q", ctypes.c_void_p), ("stride_q_b", ctypes.c_int), ("stride_q_h", ctypes.c_int),
        ("kv", ctypes.c_void_p), ("num_blocks", ctypes.c_int), ("page_block_size", ctypes.c_int),
        ("stride_kv_block", ctypes.c_int), ("topk", ctypes.c_int),
        ("indices", ctypes.c_void_p), ("stride_indices_b", ctypes.c_int), ("topk_length", ctypes.c_void_p),
        ("extra_kv", ctypes.c_void_p), ("extra_num_blocks", ctypes.c_int), ("extra_page_block_size", ctypes.c_int),
        ("stride_extra_kv_block", ctypes.c_int), ("extra_topk", ctypes.c_int),
        ("extra_indices", ctypes.c_void_p), ("stride_extra_indices_b", ctypes.c_int),
        ("extra_topk_length", ctypes.c_void_p),
        ("sink", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("lse_accum", ctypes.c_void_p), ("o_accum", ctypes.c_void_p), ("sched", ctypes.c_void_p),
        ("num_splits", ctypes.c_void_p), ("stream", ctypes.c_void_p),
    ]


def anchor_args(batch: int, parts: int, scale: float, swa, extra, inputs: tuple, out: dict) -> AnchorArgs:
    """The struct for one input set: the window cache as FlashMLA's main cache, the compressed one
    as its extra cache; `out` holds the tensors FlashMLA writes (out, lse, lse_accum, o_accum, sched,
    splits) and the fp32 sink. The stream is set at each call."""
    q, swa_idx, swa_len, idx, lengths, _ = inputs
    return AnchorArgs(
        b=batch, h_q=q.shape[1], num_sm_parts=parts, sm_scale=scale,
        q=q.data_ptr(), stride_q_b=q.stride(0), stride_q_h=q.stride(1),
        kv=swa.data.data_ptr(), num_blocks=swa.data.shape[0], page_block_size=swa.layout.page_size,
        stride_kv_block=swa.data.stride(0), topk=swa_idx.shape[1],
        indices=swa_idx.data_ptr(), stride_indices_b=swa_idx.stride(0), topk_length=swa_len.data_ptr(),
        extra_kv=extra.data.data_ptr(), extra_num_blocks=extra.data.shape[0],
        extra_page_block_size=extra.layout.page_size, stride_extra_kv_block=extra.data.stride(0),
        extra_topk=idx.shape[1], extra_indices=idx.data_ptr(), stride_extra_indices_b=idx.stride(0),
        extra_topk_length=lengths.data_ptr(),
        sink=out["sink"].data_ptr(), lse=out["lse"].data_ptr(), out=out["out"].data_ptr(),
        lse_accum=out["lse_accum"].data_ptr(), o_accum=out["o_accum"].data_ptr(), sched=out["sched"].data_ptr(),
        num_splits=out["splits"].data_ptr(), stream=None,
    )


class FlashMLA:
    """One batch size's calls into the library: buffers shared by the input sets, metadata per set."""

    def __init__(self, lib, batch: int, swa, extra, sets: list[tuple], scale: float):
        self.lib = lib
        heads = sets[0][0].shape[1]
        # FlashMLA's get_meta: SMs / s_q / (h_q / 64) parts (a request's two CTAs are a cluster at 128)
        parts = torch.cuda.get_device_properties(0).multi_processor_count // (heads // 64)
        meta_ints = lib.anchor_sched_meta_size() // 4
        dev = "cuda"
        self.out = torch.empty(batch, heads, HEAD_DIM_V, device=dev, dtype=torch.bfloat16)
        self.lse = torch.empty(batch, heads, device=dev)
        shared = {"out": self.out, "lse": self.lse, "lse_accum": torch.empty(batch + parts, heads, device=dev),
                  "o_accum": torch.empty(batch + parts, heads, HEAD_DIM_V, device=dev)}
        self.keep, self.args = [], []
        for inputs in sets:
            own = shared | {"sched": torch.empty(parts, meta_ints, device=dev, dtype=torch.int32),
                            "splits": torch.empty(batch + 1, device=dev, dtype=torch.int32),
                            "sink": inputs[5].float().contiguous()}
            a = anchor_args(batch, parts, scale, swa, extra, inputs, own)
            a.stream = torch.cuda.current_stream().cuda_stream
            if lib.anchor_sched(ctypes.byref(a)) != 0:
                raise RuntimeError("FlashMLA's scheduler failed (message above)")
            self.keep.append(own)  # the struct holds raw pointers: keep what they point to alive
            self.args.append(a)
        torch.cuda.synchronize()
        self.turn = 0

    def call(self, i: int | None = None):
        """FlashMLA on input set i (the next one in turn when None), on the current stream."""
        if i is None:
            i, self.turn = self.turn, (self.turn + 1) % len(self.args)
        a = self.args[i]
        a.stream = torch.cuda.current_stream().cuda_stream
        if self.lib.anchor_decode(ctypes.byref(a)) != 0:
            raise RuntimeError("FlashMLA's decode failed (message above)")
        return self.out, self.lse
