"""The FlashMLA anchor (dsv4opt/optimizations/mma_attn/anchor.py): the ctypes side matches
benchmarks/anchor_flashmla/shim.cu's struct; and benchmarks/bench_flashmla_anchor.py's float64
reference agrees with the baseline's torch path (the reference the anchor's check relies on)."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from dsv4opt.optimizations.mma_attn import anchor
from tests import benchmark_files


def _script():
    return benchmark_files.load_script("bench_flashmla_anchor")


def _c_struct_fields(src: str, name: str) -> list[tuple[str, type]]:
    """(field, ctypes type) in declaration order from a plain C struct of ints, floats and pointers."""
    body = re.search(r"struct " + name + r" \{(.*?)\};", src, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    fields = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        ctype, names = re.match(r"(int|float|void)\s*(.*)", decl, re.S).groups()
        for n in names.split(","):
            n = n.strip()
            pointer = n.startswith("*")
            fields.append((n.lstrip("* "), ctypes.c_void_p if pointer else {"int": ctypes.c_int, "float": ctypes.c_float}[ctype]))
    return fields


def test_anchor_args_match_the_shims_struct_field_for_field():
    """A field out of order would hand FlashMLA a wrong pointer: names, order and types must agree."""
    src = benchmark_files.path("anchor_flashmla/shim.cu").read_text()
    want = _c_struct_fields(src, "AnchorArgs")
    got = [(n, t) for n, t in anchor.AnchorArgs._fields_]
    assert len(want) == 31 and got == want


def test_anchor_args_point_each_field_at_its_tensor():
    """anchor_args maps one input set onto the struct: the window cache as FlashMLA's main cache,
    the compressed one as its extra cache, each pointer at its own tensor with its strides."""
    from dsv4opt.workload.kvcache import KVCache, KVLayout

    B, H = 3, 64
    swa = KVCache.allocate(KVLayout(True, 448, 64, 64, 16), 2, torch.bfloat16, "cpu")
    extra = KVCache.allocate(KVLayout(True, 448, 64, 64, 8), 5, torch.bfloat16, "cpu")
    q = torch.zeros(B, H, 512, dtype=torch.bfloat16)
    swa_idx, swa_len = torch.zeros(B, 8, dtype=torch.int32), torch.full((B,), 8, dtype=torch.int32)
    idx, lengths = torch.zeros(B, 24, dtype=torch.int32), torch.full((B,), 24, dtype=torch.int32)
    names = ("out", "lse", "lse_accum", "o_accum", "sched", "splits", "sink")
    out = {n: torch.zeros(i + 1) for i, n in enumerate(names)}  # distinct buffers
    a = anchor.anchor_args(B, 132, 0.04, swa, extra, (q, swa_idx, swa_len, idx, lengths, None), out)
    want = {
        "b": B, "h_q": H, "num_sm_parts": 132, "q": q.data_ptr(), "stride_q_b": H * 512, "stride_q_h": 512,
        "kv": swa.data.data_ptr(), "num_blocks": 2, "page_block_size": 16, "stride_kv_block": swa.layout.page_bytes,
        "topk": 8, "indices": swa_idx.data_ptr(), "stride_indices_b": 8, "topk_length": swa_len.data_ptr(),
        "extra_kv": extra.data.data_ptr(), "extra_num_blocks": 5, "extra_page_block_size": 8,
        "stride_extra_kv_block": extra.layout.page_bytes, "extra_topk": 24, "extra_indices": idx.data_ptr(),
        "stride_extra_indices_b": 24, "extra_topk_length": lengths.data_ptr(),
        "num_splits": out["splits"].data_ptr(), "stream": None,
    } | {n: out[n].data_ptr() for n in names if n != "splits"}
    assert {n: getattr(a, n) for n in want} == want
    assert abs(a.sm_scale - 0.04) < 1e-8


@pytest.mark.parametrize("short", [False, True])
def test_reference_agrees_with_the_baselines_torch_path(short):
    """o with the sink, lse without it (FlashMLA's convention), against the baseline's torch path
    over SGLang's FP8 layout: window and compressed cache, some slots unused, one -1 index."""
    from dsv4opt.workload.attention.sm120 import merge_partials, sparse_decode_sm120
    from dsv4opt.workload.attention.torch_path import sparse_decode_torch
    from dsv4opt.workload.kvcache import KVCache, KVLayout

    mod = _script()
    gen = torch.Generator().manual_seed(3)
    B, H, D = 3, 4, 512
    swa = KVCache.allocate(KVLayout(True, 448, 64, 64, 16), 4, torch.bfloat16, "cpu")
    extra = KVCache.allocate(KVLayout(True, 448, 64, 64, 8), 8, torch.bfloat16, "cpu")
    swa.fill_random(gen)
    extra.fill_random(gen)
    q = torch.randn(B, H, D, generator=gen).to(torch.bfloat16)
    swa_idx = torch.randint(0, swa.tokens, (B, 8), generator=gen, dtype=torch.int32)
    idx = torch.randint(0, extra.tokens, (B, 16), generator=gen, dtype=torch.int32)
    idx[1, 2] = -1
    swa_len = torch.tensor([8, 5, 8], dtype=torch.int32)
    lengths = torch.tensor([16, 16, 3] if short else [16, 16, 16], dtype=torch.int32)
    sink = torch.randn(H, generator=gen)
    scale = D**-0.5

    o_ref, lse_ref = mod.reference(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
    o_base, _ = sparse_decode_sm120(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
    _, lse_base = merge_partials(*sparse_decode_torch(q, swa, swa_idx, swa_len, scale),
                                 *sparse_decode_torch(q, extra, idx, lengths, scale))
    assert mod.rel_err(o_base, o_ref) < 1e-2
    assert mod.rel_err(lse_base, lse_ref) < 1e-5
    # and the check would see a sink left out of o
    o_nosink = mod.reference(q, swa, swa_idx, swa_len, extra, idx, lengths, torch.full((H,), -1e4), scale)[0]
    assert mod.rel_err(o_nosink, o_ref) > 1e-2


def test_load_says_why_without_the_library(tmp_path):
    lib, why = anchor.load(tmp_path / "libflashmla_anchor.so")
    assert lib is None and why == f"{tmp_path / 'libflashmla_anchor.so'} not found (benchmarks/anchor_flashmla/build.sh builds it)"
