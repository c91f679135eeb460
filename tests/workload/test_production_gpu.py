"""SGLang 0.5.23's own kernels on a Hopper GPU against the workload's float64 / plain-torch
definitions, at the tp4 rank's shapes and awkward ones, outputs NaN-poisoned (tests/conftest.py
poisons torch.empty, which every caller allocates its outputs with). Each family is skipped with its
one-line reason where it cannot run (no CUDA, not sm_90, nothing built: `dsv4opt build-kernels`)."""

from __future__ import annotations

import pytest
import torch

from dsv4opt.numerics import error_report
from dsv4opt.workload import quant
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kvcache import IndexKeyCache
from dsv4opt.workload.production import artefacts, shapes
from dsv4opt.workload.weights import Mxfp4Experts

pytestmark = pytest.mark.gpu
CFG, DEP = shapes.deployment()


def ready(key: str):
    if not torch.cuda.is_available():
        return pytest.mark.skip(reason="no CUDA GPU")
    (row,) = [a for a in artefacts.availability() if a.family.key == key]
    return pytest.mark.skipif(not row.ready, reason=row.line())


def check(out, ref, tol, what):
    report = error_report(out, ref)
    assert report.ok(tol), f"{what}: {report}"


# ---- DeepGEMM -------------------------------------------------------------------------------------

GEMMS = {g.name: g for g in shapes.dense_gemms(CFG, DEP, fp8_wo_a=True)}


@ready(artefacts.DEEPGEMM)
@pytest.mark.parametrize("M", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("name", sorted(GEMMS))
def test_fp8_gemm_nt(name, M):
    from dsv4opt.workload.production import deepgemm
    from dsv4opt.workload.production.act_quant import quantize_groups_ue8m0

    g, block = GEMMS[name], CFG.fp8_block
    torch.manual_seed(M)
    w8, ws = quant.quantize_block_fp8(torch.randn(g.n, g.k, device="cuda") * g.k**-0.5, block)
    x = torch.randn(M, g.k, device="cuda", dtype=torch.bfloat16)
    out = deepgemm.fp8_linear(x, w8, ws)
    q, s = quantize_groups_ue8m0(x.double(), block)  # the same operands, decoded in float64
    ref = quant.dequantize_groups_fp8(q.cpu(), s.cpu()) @ quant.dequantize_block_fp8(w8.cpu(), ws.cpu(), block).t()
    check(out, ref, 1e-2, f"{name} M={M}")


@ready(artefacts.DEEPGEMM)
@pytest.mark.parametrize("lens", [[1], [5, 64, 65, 130], [2048] * 3 + [17], [1000, 0, 3]],
                         ids=["one-entry", "page-edges", "long-and-short", "empty-row"])
def test_fp8_paged_mqa_logits(lens):
    from dsv4opt.workload.production import deepgemm

    torch.manual_seed(len(lens))
    B, H, Di, page = len(lens), CFG.index_heads, CFG.index_dim, CFG.index_page
    pages = -(-max(max(lens), 1) // page) + 2
    cache = IndexKeyCache.allocate(Di, page, B * pages, "cuda")
    cache.fill_random(torch.Generator(device="cuda").manual_seed(0))
    # each request's pages in a shuffled order, with one spare column past them
    table = torch.randperm(B * pages, device="cuda").view(B, pages).int()
    seq = torch.tensor(lens, device="cuda", dtype=torch.int32)
    q8, _ = quant.quantize_groups_fp8(torch.randn(B * H, Di, device="cuda"), Di)
    q8 = q8.view(B, H, Di)
    w = torch.randn(B, H, device="cuda")
    max_len = pages * page
    out = deepgemm.index_logits(q8, w, cache, seq, table, max_len)
    s = torch.arange(max_len, device="cuda")
    entries = (table.long()[:, s // page] * page + s % page).reshape(-1)
    keys, scales = cache.read(entries, torch.float64)
    ref = naive.index_logits(q8, w, keys.view(B, max_len, Di), scales.view(B, max_len), seq)
    check(out, ref, 1e-4, f"lens={lens}")
    assert torch.isneginf(out[s[None, :].expand(B, -1) >= seq[:, None]]).all()


@ready(artefacts.DEEPGEMM)
@pytest.mark.parametrize("T, splits", [(1, 64), (7, 8), (33, 64), (64, 64)])
def test_tf32_hc_prenorm_gemm(T, splits):
    from dsv4opt.workload.production import deepgemm

    torch.manual_seed(T)
    K = CFG.hc * CFG.hidden
    flat = torch.randn(T, K, device="cuda").to(torch.bfloat16)
    fn = torch.randn(CFG.hc_mix, K, device="cuda") * K**-0.5
    mix, sq = deepgemm.hc_prenorm_gemm(flat, fn, splits)
    ref_mix, ref_sq = naive.hc_pre_gemm(flat.double(), fn.double())
    check(mix.sum(0), ref_mix, 2e-3, "mix")
    check(sq.sum(0), ref_sq, 1e-5, "square sums")


# ---- TileLang mHC ---------------------------------------------------------------------------------

def _mhc_inputs(T: int):
    g = torch.Generator().manual_seed(T)
    d, hc, N = CFG.hidden, CFG.hc, CFG.hc_mix
    h = torch.randn(T, hc, d, generator=g).to(torch.bfloat16)
    y = torch.randn(T, d, generator=g).to(torch.bfloat16)
    fn = torch.randn(N, hc * d, generator=g) * (hc * d) ** -0.5
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(N, generator=g) * 0.1
    norm = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16)
    _, post, comb = naive.hc_split_sinkhorn(torch.randn(T, N, generator=g), scale, base, hc, CFG.hc_sinkhorn_iters,
                                            CFG.hc_eps)
    return [t.cuda().contiguous() for t in (h, y, fn, scale, base, norm, post.float(), comb.float())]


@ready(artefacts.MHC)
@pytest.mark.parametrize("T, splits", [(1, 8), (7, 8), (8, 4), (32, 4), (33, 64), (64, 64)])
def test_big_fuse_with_norm(T, splits):
    from dsv4opt.workload.production import mhc_tilelang

    h, _, fn, scale, base, norm, _, _ = _mhc_inputs(T)
    part = CFG.hc * CFG.hidden // splits
    flat = h.reshape(T, -1).float()
    chunks = [slice(i * part, (i + 1) * part) for i in range(splits)]  # K split as the GEMM splits it
    mix = torch.stack([flat[:, c] @ fn[:, c].t() for c in chunks]).contiguous()
    sq = torch.stack([flat[:, c].square().sum(-1) for c in chunks]).contiguous()
    x, post, comb = mhc_tilelang.big_fuse(mix, sq, h, scale, base, norm)
    rx, rpost, rcomb = naive.hc_pre_from_partials(mix.double(), sq.double(), h, scale, base, norm, CFG.hc,
                                                  CFG.hc_sinkhorn_iters, CFG.hc_eps, CFG.norm_eps, torch.float64)
    check(post, rpost, 1e-5, "post")
    check(comb, rcomb, 1e-5, "comb")
    check(x, rx, 2e-2, "x")


@ready(artefacts.MHC)
@pytest.mark.parametrize("T", [1, 5, 8, 31, 32])
def test_fused_post_pre_fma(T):
    from dsv4opt.workload.production import mhc_tilelang

    h, y, fn, scale, base, norm, post, comb = _mhc_inputs(T)
    tile, splits = mhc_tilelang.fma_plan(T, CFG.hidden)
    cur, mix, sq = mhc_tilelang.post_pre_fma(y, h, post, comb, fn, tile, splits)
    ref_cur = naive.hc_post(y.double(), h.double(), post.double(), comb.double()).to(torch.bfloat16)
    check(cur, ref_cur, 1e-2, "post step")
    ref_mix, ref_sq = naive.hc_pre_gemm(cur.reshape(T, -1).double(), fn.double())
    check(mix.sum(0), ref_mix, 1e-5, "mix partials")
    check(sq.sum(0), ref_sq, 1e-5, "square sums")


@ready(artefacts.MHC)
@pytest.mark.parametrize("T", [1, 33, 64, 100])
def test_post(T):
    from dsv4opt.workload.production import mhc_tilelang

    h, y, _, _, _, _, post, comb = _mhc_inputs(T)
    out = mhc_tilelang.post(y, h, post, comb)
    check(out, naive.hc_post(y.double(), h.double(), post.double(), comb.double()), 1e-2, "post")


# ---- Marlin ---------------------------------------------------------------------------------------

@ready(artefacts.MARLIN)
@pytest.mark.parametrize("M, experts", [(1, 256), (5, 32), (16, 256), (33, 64), (64, 256)])
def test_marlin_routed_experts(M, experts):
    from dsv4opt.workload.production import marlin

    gen = torch.Generator(device="cuda").manual_seed(M)
    d, I, k = CFG.hidden, DEP.expert_width, CFG.experts_per_token
    w13 = Mxfp4Experts(experts, 2 * I, d, gen, "cuda")
    w2 = Mxfp4Experts(experts, d, I, gen, "cuda")
    x = torch.randn(M, d, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, device="cuda", generator=gen)[:k] for _ in range(M)]).int()
    gates = torch.rand(M, k, device="cuda", generator=gen)
    gates = gates / gates.sum(-1, keepdim=True)
    m13, m2 = marlin.MarlinExperts.from_mxfp4(w13.packed, w13.scales), marlin.MarlinExperts.from_mxfp4(w2.packed, w2.scales)
    out = marlin.routed_experts(x, ids, gates, m13, m2, CFG.swiglu_limit, CFG.routed_scale)
    ref = naive.routed_experts(x.double(), ids, gates.double(), w13, w2, CFG.swiglu_limit, CFG.routed_scale)
    check(out, ref, 2e-2, f"M={M} E={experts}")


# ---- the whole step -------------------------------------------------------------------------------

def all_ready():
    if not torch.cuda.is_available():
        return pytest.mark.skip(reason="no CUDA GPU")
    rows = artefacts.availability()
    missing = [a.line() for a in rows if not a.ready]
    return pytest.mark.skipif(bool(missing), reason="; ".join(missing))


@all_ready()
@pytest.mark.parametrize("C", [2, 33, 128], ids=["fma-boundary", "post-gemm-boundary", "widest-built"])
def test_the_step_with_sglangs_kernels_agrees_with_the_stand_in_step(C):
    """dsv4-flash (4 layers: window, CSA, HCA; SGLang's kernels are built for its widths) on the tp4
    rank, the same weights and caches: SGLang's kernels in every family against our stand-ins, two
    steps, logits and the last hidden state within the paths' tolerance (the FP8 activation scales
    differ: UE8M0 powers of two in DeepGEMM's, fp32 in ours)."""
    from dsv4opt.workload.attention.flashmla import hopper
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload
    from dsv4opt.workload.production.choice import choose

    cfg = ModelConfig.from_name("dsv4-flash")
    kernels = choose("0.5.23", "cuda", True, True, mode="sglang", flashmla=hopper(torch.device("cuda")))
    kw = dict(concurrency=C, context=512, device="cuda", layers=4, dtype=torch.bfloat16, seed=0, sglang="0.5.23")
    real, ours = DecodeWorkload(cfg, kernels=kernels, **kw), DecodeWorkload(cfg, **kw)
    tokens = torch.arange(C, device="cuda") * 7 % cfg.vocab
    for step in range(2):
        a, b = real.step(tokens), ours.step(tokens)
        check(a, b.double(), 3e-2, f"logits, step {step}")
        check(real.last_hidden, ours.last_hidden.double(), 3e-2, f"hidden, step {step}")
        tokens = b.argmax(-1)


@all_ready()
def test_profile_runs_sglangs_kernels_under_cuda_graphs(tmp_path):
    """`profile --kernels sglang` as a user runs it: captured in a CUDA graph, every part's kernel
    recorded in the profile's meta as SGLang's."""
    import json

    from typer.testing import CliRunner

    from dsv4opt.cli import app

    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "--sglang", "0.5.23", "--kernels", "sglang", "--layers", "4", "-c", "8",
                                      "--context", "512", "--steps", "2", "--warmup", "1", "--repeat", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["kernels"]["qkv"].startswith("SGLang 0.5.23: DeepGEMM fp8_gemm_nt")
    assert all(v.startswith(("SGLang 0.5.23", "FlashMLA")) for v in meta["kernels"].values()), meta["kernels"]
    assert meta["cuda_graph"] and meta["fp8_wo_a"] is False
