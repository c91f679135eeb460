"""SGLang 0.5.23's real Hopper kernels beside our stand-ins, once, on the GPU machine.

    python benchmarks/production_kernels_probe.py [--smoke] [--pack .prod/sglang-0.5.23-kernels.tar.gz]

Needs the packed kernel cache (`dsv4opt build-kernels --pack .prod/sglang-0.5.23-kernels.tar.gz` on a
machine with the network; .prod/ is git-ignored, carried to the GPU machine). It unpacks the pack into
$DSV4OPT_KERNEL_CACHE (default /tmp/dsv4opt-kernels), reuses .prod/deep_gemm_jit.tar if an earlier run
left one there, then for each family, each in its own try so one failure hides nothing else:

- DeepGEMM: fp8_gemm_nt on every block-FP8 linear of a tp4 rank (UE8M0 activation quant beside),
  fp8_paged_mqa_logits with its schedule, tf32_hc_prenorm_gemm;
- TileLang mHC: the post -> pre boundary as SGLang runs it (FMA kernel + big fuse up to 32 tokens,
  post + DeepGEMM tf32 + big fuse above), and each kernel alone;
- Marlin: the routed experts (align, GEMM1, SwiGLU, GEMM2, sum) and its two GEMMs alone;

at C = 1, 16, 32, 64 (--smoke: C = 16 and one linear): checked against the float64 definition with
NaN-poisoned outputs, then timed (median of a CUDA graph over rotated inputs, on a side stream: the
real kernels must launch on torch's current stream) beside the stand-in at the same shapes. Writes
$OUT/production_kernels.json and $OUT/deep_gemm_jit.tar (DeepGEMM's JIT cache, for the next run),
prints a table. No assertion: a failed check prints no speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from dsv4opt.numerics import error_report, nan_poisoned_allocations  # noqa: E402
from dsv4opt.optimizations import timing  # noqa: E402
from dsv4opt.workload import quant  # noqa: E402
from dsv4opt.workload.kernels import mhc, mhc_fused, naive  # noqa: E402
from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts  # noqa: E402
from dsv4opt.workload.kernels.indexer_tc import index_logits_tc  # noqa: E402
from dsv4opt.workload.kernels.linear import block_fp8_matmul, group_quant_fp8  # noqa: E402
from dsv4opt.workload.kernels.moe import silu_mul_clamp  # noqa: E402
from dsv4opt.workload.kvcache import IndexKeyCache  # noqa: E402
from dsv4opt.workload.production import artefacts, deepgemm, marlin, mhc_tilelang, shapes  # noqa: E402
from dsv4opt.workload.production.act_quant import group_quant_fp8_ue8m0  # noqa: E402
from dsv4opt.workload.production.build import unpack  # noqa: E402
from dsv4opt.workload.weights import Mxfp4Experts  # noqa: E402
NOMINAL_TBS = {"H100": 3.35, "H200": 4.8}  # HBM3 / HBM3e bandwidth the vendor states
# seconds each family may take before it stops timing new rows, so the run ends inside 6 minutes
# (DeepGEMM's first calls JIT-compile each kernel: NVRTC, about 5 to 20 s a kernel)
BUDGET_S = {"dg_indexer": 45, "dg_prenorm": 30, "mhc": 60, "marlin": 80, "dg_dense": 115}
FAMILIES = tuple(BUDGET_S)  # in this order: the dense GEMMs, with the most compiles, last


def setup(args) -> None:
    cache = Path(os.environ.setdefault("DSV4OPT_KERNEL_CACHE", "/tmp/dsv4opt-kernels"))
    os.environ.setdefault("DG_JIT_USE_NVRTC", "1")  # NVRTC compiles DeepGEMM's kernels faster than nvcc
    os.environ.setdefault("DG_JIT_CACHE_DIR", str(cache / "deep_gemm_jit"))
    if args.pack.is_file():
        print(f"unpacked {unpack(args.pack, cache) or 'nothing new'} from {args.pack} into {cache}", flush=True)
    else:
        print(f"no pack at {args.pack}; using what {cache} holds", flush=True)
    jit_tar = args.pack.parent / "deep_gemm_jit.tar"
    if jit_tar.is_file():
        with tarfile.open(jit_tar) as tar:
            tar.extractall(os.environ["DG_JIT_CACHE_DIR"], filter="data")
        print(f"DeepGEMM JIT cache from {jit_tar}", flush=True)


class Probe:
    def __init__(self, smoke: bool):
        self.timing = timing
        self.cfg, self.dep = shapes.deployment()
        self.C = (16,) if smoke else (1, 16, 32, 64)
        self.smoke = smoke
        self.start = self.family_start = time.perf_counter()
        self.family = FAMILIES[0]
        self.rows: list[dict] = []
        props = torch.cuda.get_device_properties(0)
        self.device = props.name
        self.sms = props.multi_processor_count
        self.l2 = getattr(props, "L2_cache_size", 50 << 20)
        self.copy_gbs = timing.copy_bandwidth_gbps(1 << 30)
        self.nominal_gbs = next((v * 1e3 for k, v in NOMINAL_TBS.items() if k in self.device), None)
        print(f"{self.device}: {self.sms} SMs, copy {self.copy_gbs:.0f} GB/s, nominal "
              f"{self.nominal_gbs or float('nan'):.0f} GB/s", flush=True)

    def late(self) -> bool:
        return time.perf_counter() - self.family_start > BUDGET_S[self.family]

    def time_us(self, make, per_call_bytes: int) -> tuple[float, str]:
        """Median µs of one call, rotating over enough input sets to keep them out of L2: `make(i)`
        returns the i-th set's zero-argument call. CUDA graph first; eager CUDA events if capture fails."""
        sets = [make(i) for i in range(self.timing.sets_needed(per_call_bytes, self.l2))]
        turn = [0]

        def call():
            fn = sets[turn[0] % len(sets)]
            turn[0] += 1
            return fn()

        try:
            return 1e3 * self.timing.median_graph_ms(call), "graph"
        except Exception as exc:  # capture refused: say so, time eagerly
            import triton.testing

            print(f"    graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); eager timing",
                  flush=True)
            return 1e3 * float(triton.testing.do_bench(call, rep=50, return_mode="median")), "eager"

    def row(self, family, kernel, C, report, real_us, standin_us, nbytes, how, tol, extra=None):
        floor_us = nbytes / (self.copy_gbs * 1e3)
        ok = report is None or report.ok(tol)
        r = {"family": family, "kernel": kernel, "C": C, "real_us": real_us, "standin_us": standin_us,
             "speedup": (standin_us / real_us) if ok and real_us and standin_us else None, "bytes": nbytes,
             "floor_us_copy": floor_us,
             "floor_us_nominal": nbytes / (self.nominal_gbs * 1e3) if self.nominal_gbs else None,
             "real_of_floor": floor_us / real_us if real_us else None,
             "standin_of_floor": floor_us / standin_us if standin_us else None,
             "check": None if report is None else {"rel": report.rel, "max_abs": report.max_abs,
                                                   "nonfinite": report.nonfinite, "tol": tol, "ok": ok},
             "timing": how, **(extra or {})}
        self.rows.append(r)
        chk = "" if report is None else f"rel {report.rel:.1e}{'' if ok else ' FAIL'}"
        su = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(f"  {kernel:<22} C={C:<3} real {real_us or float('nan'):8.1f} us  stand-in "
              f"{standin_us or float('nan'):8.1f} us  {su:>6}  floor {floor_us:6.1f} us "
              f"({(r['real_of_floor'] or 0):.0%} real)  {chk}", flush=True)

    # ---- DeepGEMM --------------------------------------------------------------------------------

    def dg_dense(self):
        cfg, block = self.cfg, self.cfg.fp8_block
        gemms = shapes.dense_gemms(cfg, self.dep)
        if self.smoke:
            gemms = [g for g in gemms if g.name == "wq_b"]
        for g in gemms:
            w8, ws = quant.quantize_block_fp8(torch.randn(g.n, g.k, device="cuda") * g.k**-0.5, block)
            dense_w = quant.dequantize_block_fp8(w8, ws, block)
            for C in self.C:
                if self.late():
                    return print("  time budget spent: the remaining DeepGEMM rows are left out", flush=True)
                x = torch.randn(C, g.k, device="cuda", dtype=torch.bfloat16)
                q, s = group_quant_fp8_ue8m0(x, block)
                t1 = time.perf_counter()
                with nan_poisoned_allocations():
                    out = deepgemm.fp8_gemm(q, s, w8, ws)
                torch.cuda.synchronize()
                first = time.perf_counter() - t1
                ref = quant.dequantize_groups_fp8(q, s) @ dense_w.t()
                rep = error_report(out, ref)

                def real(i, g=g, C=C, w8=w8, ws=ws):
                    w, sc = w8.clone(), ws.clone()
                    a, b = group_quant_fp8_ue8m0(torch.randn(C, g.k, device="cuda", dtype=torch.bfloat16), block)
                    return lambda: deepgemm.fp8_gemm(a, b, w, sc)

                def standin(i, g=g, C=C, w8=w8, ws=ws):
                    w, sc = w8.clone(), ws.clone()
                    a, b = group_quant_fp8(torch.randn(C, g.k, device="cuda", dtype=torch.bfloat16), block)
                    return lambda: block_fp8_matmul(a, b, w, sc, block, torch.bfloat16, fill_sms=True)

                nbytes = g.bytes(C, block)
                real_us, how = self.time_us(real, nbytes)
                standin_us, _ = self.time_us(standin, nbytes)
                self.row("deep_gemm", f"fp8_gemm_nt {g.name}", C, rep, real_us, standin_us, nbytes, how, 1e-2,
                         {"n": g.n, "k": g.k, "per_step": g.per_step, "first_call_s": first})
        # the activation quantisation beside it (K = hidden: wqkv_a and shared_w13's input)
        for C in self.C:
            if self.late():
                return print("  time budget spent: the remaining DeepGEMM rows are left out", flush=True)
            xs = [torch.randn(C, cfg.hidden, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            real_us, how = self.time_us(lambda i: (lambda x=xs[i % 4]: group_quant_fp8_ue8m0(x, block)), 0)
            standin_us, _ = self.time_us(lambda i: (lambda x=xs[i % 4]: group_quant_fp8(x, block)), 0)
            self.row("deep_gemm", "act quant ue8m0 (ours)", C, None, real_us, standin_us,
                     C * cfg.hidden * 3 + C * cfg.hidden // block * 4, how, 0,
                     {"note": "SGLang runs its JIT per_token_group_quant_8bit_v2 here; ours is a Triton stand-in"})

    def dg_indexer(self):

        cfg = self.cfg
        t0 = time.perf_counter()
        dg = deepgemm.load()
        print(f"deep_gemm {dg.__version__} imported in {time.perf_counter() - t0:.1f} s "
              f"(JIT: {'NVRTC' if os.environ.get('DG_JIT_USE_NVRTC') == '1' else 'nvcc'}, CUDA_HOME "
              f"{os.environ.get('CUDA_HOME')})", flush=True)
        # paged MQA logits at the step's shapes: contexts as the profile draws them (8192 +- 25 %),
        # the page table as wide as SGLang's CUDA-graph metadata (the model's context length)
        H, Di, page = cfg.index_heads, cfg.index_dim, cfg.index_page
        width = -(-cfg.max_context // (page * cfg.csa_ratio))
        for C in self.C:
            if self.late():
                return print("  time budget spent: the remaining DeepGEMM rows are left out", flush=True)
            gen = torch.Generator().manual_seed(C)
            ctx = torch.randint(6144, 10241, (C,), generator=gen)
            lens = (ctx // cfg.csa_ratio).tolist()
            own = -(-max(lens) // page)

            def make_set(i):
                cache = IndexKeyCache.allocate(Di, page, C * own, "cuda")
                cache.fill_random(torch.Generator(device="cuda").manual_seed(i))
                j = torch.arange(width, device="cuda")[None, :]
                rows = torch.arange(C, device="cuda")[:, None]
                table = torch.where(j < own, rows * own + j, 0).int()
                q8 = quant.quantize_groups_fp8(torch.randn(C * H, Di, device="cuda"), Di)[0].view(C, H, Di)
                return cache, table, q8, torch.randn(C, H, device="cuda")

            seq = torch.tensor(lens, device="cuda", dtype=torch.int32)
            cache, table, q8, w = make_set(0)
            max_len = width * page
            t1 = time.perf_counter()
            sched = deepgemm.paged_mqa_schedule(seq, page)
            logits = deepgemm.paged_mqa_logits(q8, w, cache, seq, table, max_len, sched)
            torch.cuda.synchronize()
            first = time.perf_counter() - t1
            n = max(lens)
            s = torch.arange(n, device="cuda")
            entries = (table.long()[:, s // page] * page + s % page).reshape(-1)
            keys, scales = cache.read(entries, torch.float64)
            ref = naive.index_logits(q8, w, keys.view(C, n, Di), scales.view(C, n), seq)
            got = torch.where(s[None, :] < seq[:, None], logits[:, :n], ref)  # entries past a length: unwritten
            rep = error_report(got, ref)
            del keys, scales, ref, entries
            nbytes = shapes.index_logits_bytes(cfg, lens)

            def real(i):
                c, t, q, ww = make_set(i)
                return lambda: deepgemm.paged_mqa_logits(q, ww, c, seq, t, max_len, sched)

            def standin(i):
                c, t, q, ww = make_set(i)
                return lambda: index_logits_tc(q, ww, c, seq, t, max_len, operands="fp8")

            real_us, how = self.time_us(real, nbytes)
            standin_us, _ = self.time_us(standin, nbytes)
            sched_us, _ = self.time_us(lambda i: (lambda: deepgemm.paged_mqa_schedule(seq, page)), 0)
            self.row("deep_gemm", "fp8_paged_mqa_logits", C, rep, real_us, standin_us, nbytes, how, 1e-4,
                     {"first_call_s": first, "schedule_us": sched_us, "max_len": max_len, "mean_len": sum(lens) / C,
                      "note": "stand-in also writes -inf over the whole graph-wide row (its slot contract)"})

    def dg_prenorm(self):

        cfg = self.cfg
        # the tf32 pre-norm GEMM: the first read of a step (64 splits up to 64 tokens), and every
        # boundary over 32 tokens
        K = cfg.hc * cfg.hidden
        for C in self.C:
            if self.late():
                return print("  time budget spent: the remaining DeepGEMM rows are left out", flush=True)
            splits = mhc_tilelang.prenorm_splits(C, K, self.sms)
            fn = torch.randn(cfg.hc_mix, K, device="cuda") * K**-0.5
            flat = torch.randn(C, K, device="cuda").to(torch.bfloat16)
            t1 = time.perf_counter()
            with nan_poisoned_allocations():
                mix, sq = deepgemm.hc_prenorm_gemm(flat, fn, splits)
            torch.cuda.synchronize()
            first = time.perf_counter() - t1
            ref_mix, _ = naive.hc_pre_gemm(flat.double(), fn.double())
            rep = error_report(mix.sum(0), ref_mix)
            nbytes = shapes.hc_prenorm_bytes(cfg, C, splits)

            def real(i):
                f = torch.randn(C, K, device="cuda").to(torch.bfloat16)
                return lambda: deepgemm.hc_prenorm_gemm(f, fn, splits)

            def standin(i):
                h = torch.randn(C, cfg.hc, cfg.hidden, device="cuda").to(torch.bfloat16)
                return lambda: mhc_fused.hc_pre_gemm(h, fn)

            real_us, how = self.time_us(real, nbytes)
            standin_us, _ = self.time_us(standin, nbytes)
            self.row("deep_gemm", "tf32_hc_prenorm_gemm", C, rep, real_us, standin_us, nbytes, how, 2e-3,
                     {"splits": splits, "first_call_s": first})

    # ---- TileLang mHC ----------------------------------------------------------------------------

    def mhc(self):

        cfg = self.cfg
        d, hc, N, K = cfg.hidden, cfg.hc, cfg.hc_mix, cfg.hc * cfg.hidden
        consts = (hc, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps)
        print(f"TileLang cubins: {sorted(mhc_tilelang.variants())}", flush=True)

        def inputs(T, seed):
            g = torch.Generator(device="cuda").manual_seed(seed)
            h = torch.randn(T, hc, d, device="cuda", generator=g).to(torch.bfloat16)
            y = torch.randn(T, d, device="cuda", generator=g).to(torch.bfloat16)
            fn = torch.randn(N, K, device="cuda", generator=g) * K**-0.5
            scale = torch.rand(3, device="cuda", generator=g) + 0.5
            base = torch.randn(N, device="cuda", generator=g) * 0.1
            norm = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(torch.bfloat16)
            _, post, comb = naive.hc_split_sinkhorn(torch.randn(T, N, device="cuda", generator=g), scale, base, hc,
                                                    cfg.hc_sinkhorn_iters, cfg.hc_eps)
            return h, y, fn, scale, base, norm, post.contiguous(), comb.contiguous()

        for C in self.C:
            if self.late():
                return print("  time budget spent: the remaining mHC rows are left out", flush=True)
            h, y, fn, scale, base, norm, post, comb = inputs(C, C)
            with nan_poisoned_allocations():
                cur, x, post2, comb2 = mhc_tilelang.fused_post_pre(y, h, post, comb, fn, scale, base, norm,
                                                                   deepgemm.hc_prenorm_gemm)
            ref_cur = naive.hc_post(y.double(), h.double(), post.double(), comb.double()).to(torch.bfloat16)
            rx, rpost, rcomb = naive.hc_pre_fused(ref_cur.double(), fn.double(), scale.double(), base.double(),
                                                  norm.double(), *consts, torch.float64)
            reps = {"cur": error_report(cur, ref_cur), "x": error_report(x, rx), "post": error_report(post2, rpost),
                    "comb": error_report(comb2, rcomb)}
            worst = max(reps.values(), key=lambda r: r.rel if r.nonfinite == 0 else float("inf"))
            fma = C <= mhc_tilelang.FMA_MAX_TOKENS
            tile, splits = mhc_tilelang.fma_plan(C, d) if fma else (None, mhc_tilelang.prenorm_splits(C, K, self.sms))
            parts = (shapes.fma_bytes(cfg, C, splits) if fma else
                     shapes.post_bytes(cfg, C) + shapes.hc_prenorm_bytes(cfg, C, splits))
            nbytes = parts + shapes.big_fuse_bytes(cfg, C, splits)

            def real(i):
                a = inputs(C, 1000 + i)
                return lambda: mhc_tilelang.fused_post_pre(a[1], a[0], a[6], a[7], a[2], a[3], a[4], a[5],
                                                           deepgemm.hc_prenorm_gemm)

            def standin(i):
                a = inputs(C, 1000 + i)

                def run():
                    c = mhc.hc_post(a[1], a[0], a[6], a[7])
                    mix, sq = mhc_fused.hc_pre_gemm(c, a[2])
                    return mhc_fused.hc_pre_big_fuse(mix, sq, c, a[3], a[4], a[5], *consts[:3], cfg.norm_eps,
                                                     torch.bfloat16)
                return run

            real_us, how = self.time_us(real, nbytes)
            standin_us, _ = self.time_us(standin, nbytes)
            self.row("mhc", f"boundary ({'fma' if fma else 'post+tf32'}+big_fuse)", C, worst, real_us, standin_us,
                     nbytes, how, 2e-2, {"splits": splits, "tile_n": tile,
                                         "checks": {k: [r.rel, r.nonfinite] for k, r in reps.items()}})
            # each kernel alone, beside the stand-in kernel it replaces
            mix = torch.randn(splits, C, N, device="cuda")
            sq = torch.rand(splits, C, device="cuda") * K / splits
            bf_bytes = shapes.big_fuse_bytes(cfg, C, splits)
            real_us, how = self.time_us(lambda i: (lambda: mhc_tilelang.big_fuse(mix, sq, h, scale, base, norm)), bf_bytes)
            standin_us, _ = self.time_us(lambda i: (lambda: mhc_fused.hc_pre_big_fuse(
                mix, sq, h, scale, base, norm, *consts[:3], cfg.norm_eps, torch.bfloat16)), bf_bytes)
            self.row("mhc", f"big_fuse s{splits}", C, None, real_us, standin_us, bf_bytes, how, 0)
            if fma:
                fb = shapes.fma_bytes(cfg, C, splits)
                real_us, how = self.time_us(lambda i: (lambda: mhc_tilelang.post_pre_fma(y, h, post, comb, fn, tile,
                                                                                          splits)), fb)
                self.row("mhc", f"post_pre_fma t{tile}", C, None, real_us, None, fb, how, 0)
            pb = shapes.post_bytes(cfg, C)
            real_us, how = self.time_us(lambda i: (lambda: mhc_tilelang.post(y, h, post, comb)), pb)
            standin_us, _ = self.time_us(lambda i: (lambda: mhc.hc_post(y, h, post, comb)), pb)
            self.row("mhc", "post", C, None, real_us, standin_us, pb, how, 0)

    # ---- Marlin ----------------------------------------------------------------------------------

    def marlin(self):

        cfg, dep = self.cfg, self.dep
        E, d, I, k = cfg.experts, cfg.hidden, dep.expert_width, cfg.experts_per_token
        gen = torch.Generator(device="cuda").manual_seed(0)
        w13, w2 = Mxfp4Experts(E, 2 * I, d, gen, "cuda"), Mxfp4Experts(E, d, I, gen, "cuda")
        t0 = time.perf_counter()
        m13 = marlin.MarlinExperts.from_mxfp4(w13.packed, w13.scales)
        m2 = marlin.MarlinExperts.from_mxfp4(w2.packed, w2.scales)
        torch.cuda.synchronize()
        print(f"Marlin repack of {E} experts: {time.perf_counter() - t0:.1f} s; modules "
              f"{[type(m).__name__ for m in marlin.modules()]}", flush=True)
        limit, scale = cfg.swiglu_limit, cfg.routed_scale
        for C in self.C:
            if self.late():
                return print("  time budget spent: the remaining Marlin rows are left out", flush=True)

            def routing(seed):
                g = torch.Generator(device="cuda").manual_seed(seed)
                ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(C)]).int()
                gates = torch.rand(C, k, device="cuda", generator=g)
                x = torch.randn(C, d, device="cuda", generator=g).to(torch.bfloat16)
                return x, ids, gates / gates.sum(-1, keepdim=True)

            x, ids, gates = routing(C)
            t1 = time.perf_counter()
            with nan_poisoned_allocations():
                out = marlin.routed_experts(x, ids, gates, m13, m2, limit, scale)
            torch.cuda.synchronize()
            first = time.perf_counter() - t1
            ref = naive.routed_experts(x.double(), ids, gates.double(), w13, w2, limit, scale)
            rep = error_report(out, ref)
            distinct = int(torch.unique(ids).numel())
            nbytes = shapes.routed_bytes(cfg, dep, C, distinct)

            def real(i):
                a = routing(100 + i)
                return lambda: marlin.routed_experts(a[0], a[1], a[2], m13, m2, limit, scale)

            def standin(i):
                a = routing(100 + i)
                return lambda: grouped_routed_experts(a[0], a[1], a[2], w13, w2, limit, scale)

            grouped_routed_experts(x, ids, gates, w13, w2, limit, scale)  # its production-layout copy, eagerly
            real_us, how = self.time_us(real, nbytes)
            standin_us, _ = self.time_us(standin, nbytes)
            self.row("marlin", "routed experts (fused_marlin_moe)", C, rep, real_us, standin_us, nbytes, how, 2e-2,
                     {"distinct_experts": distinct, "first_call_s": first, "block_size_m": marlin.block_size_m(C, k, E)})
            # the two GEMMs alone, as SGLang launches them
            gemm1, gemm2 = marlin.modules()
            block = marlin.block_size_m(C, k, E)
            sorted_ids, expert_ids, post = marlin.align(ids, block, E)
            wts = (gates * scale).contiguous()
            ws = torch.zeros(self.sms * 4, dtype=torch.int32, device="cuda")
            inter = torch.empty(C * k, 2 * I, dtype=torch.bfloat16, device="cuda")
            act = silu_mul_clamp(marlin.marlin_gemm(gemm1, x, inter, m13, ws, sorted_ids, expert_ids, post, wts,
                                                    block, k, False), limit)
            down = torch.empty(C * k, d, dtype=torch.bfloat16, device="cuda")
            b1 = distinct * 2 * I * (d // 2 + d // 32)
            b2 = distinct * d * (I // 2 + I // 32)
            us1, how = self.time_us(lambda i: (lambda: marlin.marlin_gemm(gemm1, x, inter, m13, ws, sorted_ids,
                                                                          expert_ids, post, wts, block, k, False)), b1)
            us2, _ = self.time_us(lambda i: (lambda: marlin.marlin_gemm(gemm2, act, down, m2, ws, sorted_ids,
                                                                        expert_ids, post, wts, block, 1, True)), b2)
            self.row("marlin", "moe_wna16_marlin_gemm 1", C, None, us1, None, b1, how, 0)
            self.row("marlin", "moe_wna16_marlin_gemm 2", C, None, us2, None, b2, how, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="one shape per kernel (C = 16, one linear)")
    ap.add_argument("--pack", type=Path, default=REPO / ".prod" / "sglang-0.5.23-kernels.tar.gz")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--only", nargs="*", choices=FAMILIES, help="families (default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setup(args)
    result = {"status": artefacts.status_lines(), "torch": torch.__version__, "nvcc": subprocess.run(["nvcc", "--version"], capture_output=True,
                                                           text=True).stdout.strip().splitlines()[-1:],
        "families": {}, "smoke": args.smoke}
    for line in result["status"]:
        print(line, flush=True)
    probe = Probe(args.smoke)
    result["device"], result["copy_gbs"] = probe.device, probe.copy_gbs
    for name in args.only or FAMILIES:
        t0 = probe.family_start = time.perf_counter()
        probe.family = name
        print(f"== {name}", flush=True)
        try:
            getattr(probe, name)()
            result["families"][name] = {"ok": True}
        except Exception as exc:
            tail = traceback.format_exc().strip().splitlines()[-12:]
            print("\n".join(tail), flush=True)
            result["families"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tail}
        result["families"][name]["seconds"] = round(time.perf_counter() - t0, 1)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    result["rows"] = probe.rows
    result["env"] = {k: os.environ.get(k) for k in ("DSV4OPT_KERNEL_CACHE", "DG_JIT_USE_NVRTC", "DG_JIT_CACHE_DIR",
                                                    "CUDA_HOME")}
    result["seconds"] = round(time.perf_counter() - probe.start, 1)
    (args.out / "production_kernels.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    jit = Path(os.environ["DG_JIT_CACHE_DIR"])
    if jit.is_dir():
        with tarfile.open(args.out / "deep_gemm_jit.tar", "w") as tar:
            tar.add(jit, arcname=".")
    oks = ", ".join(f"{k}: {'ok' if v['ok'] else 'FAILED'}" for k, v in result["families"].items())
    print(f"wrote {args.out / 'production_kernels.json'} ({len(probe.rows)} rows, {result['seconds']} s); {oks}",
          flush=True)


if __name__ == "__main__":
    main()
