"""Each baseline kernel (Triton, under the interpreter on a CPU) against its float64 definition in
dsv4opt/workload/kernels/naive.py, over awkward shapes. Outputs come from NaN-poisoned torch.empty
(tests/conftest.py), so an element a kernel forgets to write fails."""

from __future__ import annotations


import pytest
import torch

from dsv4opt.numerics import error_report
from dsv4opt.workload import quant
from dsv4opt.workload.kernels import compress, indexer, linear, mhc, moe, naive, norm, rope
from dsv4opt.workload.kvcache import IndexKeyCache, KVCache, KVLayout, quantize_index_key

interpreted = pytest.mark.skipif(
    type(norm._rms_norm_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
    reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import",
)
pytestmark = interpreted
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Activations in fp16 on the CPU (the interpreter's bf16 products are wrong), bf16 on a GPU.
ACT = torch.bfloat16 if DEV == "cuda" else torch.float16
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # relative, per input dtype
F64 = torch.float64


def _tables(max_pos: int, rope_dim: int):
    i = torch.arange(0, rope_dim, 2, dtype=F64)
    a = (torch.arange(max_pos, dtype=F64)[:, None] * 10000.0 ** (-i / rope_dim)[None]).float()
    return a.cos().to(DEV), a.sin().to(DEV)


def _ok(out, ref, tol):
    report = error_report(out, ref)
    assert report.ok(tol), report


@pytest.mark.parametrize("T,N,weighted", [(1, 8, True), (5, 48, True), (3, 300, False)], ids=["one-row", "odd-width", "no-weight-300"])
def test_rms_norm(T, N, weighted):
    x = torch.randn(T, N + 3, device=DEV).to(ACT)[:, 3:]  # a strided view, as q_norm gets
    w = (torch.rand(N, device=DEV) + 0.5).to(ACT) if weighted else None
    _ok(norm.rms_norm(x, w, 1e-6), naive.rms_norm(x.double(), None if w is None else w.double(), 1e-6), TOL[ACT])


@pytest.mark.parametrize("T,hc,d", [(1, 4, 16), (3, 4, 100), (2, 2, 2500)], ids=["one-token", "odd-width", "several-blocks"])
def test_hc_prenorm_and_post(T, hc, d):
    h = torch.randn(T, hc, d, device=DEV).to(ACT)
    flat, r = mhc.hc_prenorm(h, 1e-6)
    rf, rr = naive.hc_prenorm(h.reshape(T, -1).double(), 1e-6)
    _ok(flat, rf, 0.0)
    _ok(r, rr, 1e-6)
    y = torch.randn(T, d, device=DEV).to(ACT)
    post, comb = torch.rand(T, hc, device=DEV), torch.rand(T, hc, hc, device=DEV)
    _ok(mhc.hc_post(y, h, post, comb), naive.hc_post(y.double(), h.double(), post.double(), comb.double()), TOL[ACT])


@pytest.mark.parametrize("T", [1, 7])
def test_hc_split_sinkhorn_matches(T):
    mix, scale, base = torch.randn(T, 24, device=DEV) * 3, torch.rand(3, device=DEV) + 0.5, torch.randn(24, device=DEV)
    got = mhc.hc_split_sinkhorn(mix, scale, base, 4, 20, 1e-6)
    ref = naive.hc_split_sinkhorn(mix.double(), scale.double(), base.double(), 4, 20, 1e-6)
    for g, r in zip(got, ref):
        _ok(g, r, 1e-5)
    # the last normalisation is over columns; rows converge more slowly on large logits
    assert torch.allclose(got[2].double().sum(-2).cpu(), torch.ones(T, 4, dtype=F64), atol=1e-4)


@pytest.mark.parametrize("M,K,N,block", [(1, 32, 16, 16), (5, 64, 40, 16), (3, 256, 130, 128)],
                         ids=["one-row", "N-not-a-block-multiple", "flash-block"])
def test_group_quant_and_block_fp8_matmul(M, K, N, block):
    x = torch.randn(M, K, device=DEV) * torch.logspace(-2, 2, K, device=DEV)  # groups of very different size
    q, s = linear.group_quant_fp8(x, block)
    q_ref, s_ref = quant.quantize_groups_fp8(x.double(), block)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8).to(q.device))
    _ok(s, s_ref, 1e-6)
    w8, ws = quant.quantize_block_fp8(torch.randn(N, K, device=DEV), block)
    out = linear.block_fp8_matmul(q, s, w8, ws, block, torch.float32)
    _ok(out, naive.block_fp8_matmul(q, s.double(), w8, ws.double(), block), 1e-5)


def test_mxfp4_slot_gemv_including_repeated_and_shared_slots():
    gen = torch.Generator(device=DEV).manual_seed(0)
    packed, scales = quant.random_mxfp4((3, 40, 96), 96, gen, DEV)
    a = torch.randn(4, 96, device=DEV).to(ACT)
    rows = torch.tensor([0, 1, 1, 3, 2, 0], dtype=torch.int32, device=DEV)
    experts = torch.tensor([2, 0, 1, 1, 2, 2], dtype=torch.int32, device=DEV)
    out = moe.mxfp4_slot_gemv(a, rows, experts, packed, scales)
    _ok(out, naive.mxfp4_slot_gemv(a.double(), rows, experts, packed, scales), TOL[ACT])


def test_e2m1_decoding_by_hand():
    # byte 0x1F: low nibble 0xF = -6.0 (even index), high nibble 0x1 = +0.5 (odd); byte 0xA3: 1.5, -1.0
    packed = torch.zeros(1, 1, 16, dtype=torch.uint8)  # one group of 32 values
    packed[0, 0, :2] = torch.tensor([0x1F, 0xA3], dtype=torch.uint8)
    scales = torch.tensor([[[2.0]]])
    assert quant.dequantize_mxfp4(packed, scales)[0, 0, :4].tolist() == [-12.0, 1.0, 3.0, -2.0]


@pytest.mark.parametrize("hashed", [False, True], ids=["biased-topk", "hash-table"])
def test_moe_gate(hashed):
    M, E, k = 5, 16, 3
    logits, bias = torch.randn(M, E, device=DEV) * 2, torch.randn(E, device=DEV)
    tokens = torch.tensor([3, 0, 7, 3, 1], device=DEV)
    table = torch.stack([torch.randperm(E)[:k] for _ in range(8)]).int().to(DEV) if hashed else None
    ids, w = moe.moe_gate(logits, bias, k, tokens, table)
    ref_ids, ref_w = naive.moe_gate(logits.double(), bias.double(), k, tokens, table)
    assert torch.equal(ids.sort(-1).values.cpu(), ref_ids.sort(-1).values.cpu())
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)
    _ok(w.gather(1, order), ref_w.gather(1, ref_order.to(ref_w.device)), 1e-5)


def test_silu_mul_clamp_clamps_both_halves():
    x = torch.randn(3, 2 * 40, device=DEV) * 20
    _ok(moe.silu_mul_clamp(x.to(ACT), 10.0), naive.silu_mul_clamp(x.to(ACT).double(), 10.0), TOL[ACT])


@pytest.mark.parametrize("B,H,D,R", [(1, 1, 32, 8), (3, 4, 48, 16)], ids=["one", "odd-nope"])
def test_q_norm_rope_and_inverse_rope(B, H, D, R):
    cos, sin = _tables(40, R)
    pos = torch.tensor([5, 0, 39][:B], device=DEV)
    q = torch.randn(B, H, D, device=DEV).to(ACT)
    _ok(rope.q_norm_rope(q, 1e-6, cos, sin, pos, R, 8),
        naive.rope(naive.rms_norm(q.double(), None, 1e-6), cos.double(), sin.double(), pos), TOL[ACT])
    x = torch.randn(B, H, D, device=DEV)
    y = x.clone()
    rope.rope_inplace(y, cos, sin, pos, R, inverse=True)
    _ok(y, naive.rope(x.double(), cos.double(), sin.double(), pos, inverse=True), 1e-6)
    rope.rope_inplace(y, cos, sin, pos, R)
    _ok(y, x, 1e-6)


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8-layout", "bf16-layout"])
def test_kv_norm_rope_store_writes_the_layout_exactly(fp8):
    D, R = 32, 8
    cos, sin = _tables(40, R)
    layout = KVLayout(fp8, D - R, R, 8, 4)
    got = KVCache.allocate(layout, 6, torch.float32, DEV)
    kv = torch.randn(3, D + 5, device=DEV)[:, 5:]  # the kv half of the fused q/kv projection
    w = torch.rand(D, device=DEV) + 0.5
    pos, loc = torch.tensor([3, 17, 0], device=DEV), torch.tensor([2, 9, 21], device=DEV)
    rope.kv_norm_rope_store(kv, w, 1e-6, cos, sin, pos, got, loc)
    want = KVCache.allocate(layout, 6, torch.float32, DEV)
    want.write(loc, naive.rope(naive.rms_norm(kv.double(), w.double(), 1e-6), cos.double(), sin.double(), pos))
    if fp8:
        assert torch.equal(got.data, want.data)
    else:
        _ok(got.read(loc), want.read(loc), 1e-6)


@pytest.mark.parametrize("ratio,overlap", [(4, True), (16, False)], ids=["csa-overlap", "hca"])
def test_compress_forward_pools_and_updates_the_ring(ratio, overlap):
    C, hd = 4, 32
    ring, width = (2 * ratio, 4 * hd) if overlap else (ratio, 2 * hd)
    state, kv_score = torch.randn(C, ring, width, device=DEV), torch.randn(C, width, device=DEV)
    ape = torch.randn(ring, hd, device=DEV) * 0.1
    # first group (no previous group to overlap), boundaries, and a token inside a group
    pos = torch.tensor([ratio - 1, 2 * ratio - 1, 2, 5 * ratio - 1], device=DEV)
    before = state.clone()
    out = compress.compress_forward(state, kv_score, ape, pos, ratio, overlap)
    ref = naive.compress(before.double(), kv_score.double(), ape.double(), pos, ratio, overlap)
    emit = ((pos + 1) % ratio == 0).cpu()
    _ok(out.cpu()[emit], ref.cpu()[emit], 1e-6)
    assert torch.equal(state[torch.arange(C), pos % ring], kv_score)


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8-layout", "bf16-layout"])
def test_compress_norm_rope_store_only_for_completed_groups(fp8):
    C, hd, R, ratio = 4, 32, 8, 4
    cos, sin = _tables(40, R)
    x, w = torch.randn(C, hd, device=DEV), torch.rand(hd, device=DEV) + 0.5
    pos, loc = torch.tensor([3, 7, 2, 11], device=DEV), torch.tensor([0, 5, 2, 7], device=DEV)
    layout = KVLayout(fp8, hd - R, R, 8, 4)
    got, want = KVCache.allocate(layout, 3, torch.float32, DEV), KVCache.allocate(layout, 3, torch.float32, DEV)
    compress.compress_norm_rope_store(x, w, 1e-6, cos, sin, pos, loc, ratio, R, torch.float32, got)
    emit = (pos + 1) % ratio == 0
    y = naive.rope(naive.rms_norm(x.double(), w.double(), 1e-6), cos.double(), sin.double(), (pos + 1 - ratio).clamp(min=0))
    want.write(loc[emit], y[emit])
    if fp8:
        assert torch.equal(got.data, want.data)  # token 2 (pos 2) untouched: still zeros
    else:
        _ok(got.data, want.data, 1e-6)


def test_index_key_store_and_query_quantisation():
    C, Di, R, Hi = 4, 16, 8, 3
    cos, sin = _tables(40, R)
    x, w = torch.randn(C, Di, device=DEV), torch.rand(Di, device=DEV) + 0.5
    pos, loc = torch.tensor([3, 7, 2, 11], device=DEV), torch.tensor([0, 5, 2, 7], device=DEV)
    cache = IndexKeyCache.allocate(Di, 4, 3, DEV)
    compress.compress_norm_rope_store(x, w, 1e-6, cos, sin, pos, loc, 4, R, torch.float32, cache)
    emit = (pos + 1) % 4 == 0
    y = naive.rope(naive.rms_norm(x.double(), w.double(), 1e-6), cos.double(), sin.double(), (pos + 1 - 4).clamp(min=0))
    keys, scales = quantize_index_key(naive.hadamard(y[emit]))
    got_keys, got_scales = cache.read(loc[emit])
    assert torch.equal(got_keys.cpu(), keys.double().cpu())
    _ok(got_scales, scales.double(), 1e-6)
    q, hw = torch.randn(C, Hi * Di, device=DEV).to(ACT), torch.randn(C, Hi, device=DEV).to(ACT)
    q8, weights = indexer.index_q_rope_hadamard_quant(q, hw, 0.25, cos, sin, pos, Hi, R)
    ref8, ref_scale = quantize_index_key(naive.hadamard(naive.rope(q.view(C, Hi, Di).double(), cos.double(), sin.double(), pos)).reshape(-1, Di))
    assert torch.equal(q8.reshape(-1, Di).view(torch.uint8).cpu(), ref8.view(torch.uint8).cpu())
    _ok(weights, hw.double() * 0.25 * ref_scale.view(C, Hi), 1e-6)


def test_hadamard_is_orthonormal():
    x = torch.randn(5, 16, dtype=F64)
    assert torch.allclose(naive.hadamard(naive.hadamard(x)), x, atol=1e-12)


@pytest.mark.parametrize("seq_lens", [[5, 12, 0], [1, 11, 11]], ids=["empty-request", "full"])
def test_index_logits_torch_path_and_topk(seq_lens):
    B, H, Di, page, pages = 3, 4, 16, 4, 3
    cache = IndexKeyCache.allocate(Di, page, B * pages, DEV)
    keys, scales = quantize_index_key(torch.randn(B * pages * page, Di, device=DEV))
    cache.write(torch.arange(B * pages * page, device=DEV), keys, scales)
    q8, _ = quantize_index_key(torch.randn(B * H, Di, device=DEV))
    w = torch.randn(B, H, device=DEV)
    table = (torch.arange(B)[:, None] * pages + torch.arange(pages)[None, :]).int().to(DEV)
    sl = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
    got = indexer.index_logits_torch(q8.view(B, H, Di), w, cache, sl, table, 11)
    k, s = cache.read(torch.arange(B * pages * page, device=DEV))
    ref = naive.index_logits(q8.view(B, H, Di), w, k.view(B, -1, Di), s.view(B, -1), sl)[:, :11]
    _ok(got, ref, 1e-5)
    top = indexer.topk_transform(got, sl, torch.tensor([0, 100, 200], device=DEV, dtype=torch.int32), 6).cpu()
    for b, n in enumerate(seq_lens):
        chosen = sorted(int(i) - 100 * b for i in top[b] if i >= 0)
        expect = sorted(ref[b, :n].cpu().topk(min(6, n)).indices.tolist())
        assert chosen == expect


def test_topk_over_a_graph_wide_row_reads_each_requests_entries_only():
    """At SGLang's graph width a logits row is far wider than the request's entries; what lies past
    seq_lens (here large finite values, not the contract's -inf) must never be selected."""
    B, S = 3, 4096
    sl = torch.tensor([700, 5, 0], device=DEV, dtype=torch.int32)
    logits = torch.randn(B, S, device=DEV)
    logits[torch.arange(S, device=DEV)[None, :] >= sl[:, None]] = 1e6
    base = torch.tensor([0, 10_000, 20_000], device=DEV, dtype=torch.int32)
    top = indexer.topk_transform(logits, sl, base, 6).cpu()
    for b, n in enumerate(sl.tolist()):
        chosen = sorted(int(i) - int(base[b]) for i in top[b] if i >= 0)
        assert chosen == sorted(logits[b, :n].cpu().topk(min(6, n)).indices.tolist())
        assert (top[b, min(6, n):] == -1).all()


def test_routed_experts_baseline_matches_its_definition_and_skips_other_ranks_slots():
    """SGLang's per-slot path (the baseline slot) against the slot's float64 definition, with slots
    of other ranks (-1) that must contribute nothing."""
    from dsv4opt.workload.baseline import routed_experts_sm120
    from dsv4opt.workload.weights import Mxfp4Experts

    gen = torch.Generator().manual_seed(4)
    M, d, I, R, k = 7, 64, 32, 4, 3
    w13, w2 = Mxfp4Experts(R, 2 * I, d, gen, "cpu"), Mxfp4Experts(R, d, I, gen, "cpu")
    x = torch.randn(M, d, generator=gen, dtype=torch.float64)
    ids = torch.randint(-1, R, (M, k), generator=gen, dtype=torch.int32)
    ids[0] = -1  # a token wholly on other ranks
    gates = torch.rand(M, k, generator=gen, dtype=torch.float64)
    ref = naive.routed_experts(x, ids, gates, w13, w2, 10.0, 1.5)
    out = routed_experts_sm120(x, ids, gates, w13, w2, 10.0, 1.5)
    assert error_report(out, ref).ok(1e-6), error_report(out, ref)  # SGLang's path takes the activation in fp32
    assert torch.count_nonzero(ref[0]) == 0
    moved = ids.clone()
    moved[moved < 0] = 0  # the same slots computed on local expert 0 instead of dropped
    assert not error_report(naive.routed_experts(x, moved, gates, w13, w2, 10.0, 1.5), ref).ok(1e-3)
