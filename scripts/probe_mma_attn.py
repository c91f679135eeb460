"""Where the mma-attn main kernel's time goes, by ablation (no hardware counters needed): the same
loop with the QK product, the softmax or the PV product left out, timed by CUDA-graph replay on
the bench's inputs. The outputs of the ablated kernels are meaningless; only their times are used.

    PYTHONPATH=. python3 scripts/probe_mma_attn.py
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl
import triton.testing

from dsv4opt.optimizations.mma_attn import kernel as k
from dsv4opt.optimizations.mma_attn.bench import DIM, HEADS, POOL_GB, TOPK, input_sets


@triton.jit
def _ablated_kernel(
    p_q, p_kv, p_idx, p_len, p_o_part, stride_qb, stride_kv, stride_ib, H, qk_scale_log2,
    K: tl.constexpr, CHUNK: tl.constexpr, NSPLIT: tl.constexpr, D: tl.constexpr,
    BH: tl.constexpr, BK: tl.constexpr, DO_QK: tl.constexpr, DO_SOFTMAX: tl.constexpr, DO_PV: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_s = tl.program_id(2)
    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, D)
    b_q = tl.load(p_q + i_b * stride_qb + o_h[:, None] * D + o_d[None, :])
    n_used = tl.load(p_len + i_b)
    b_m = tl.full([BH], -1.0e30, tl.float32)
    b_l = tl.zeros([BH], tl.float32)
    b_acc = tl.zeros([BH, D], tl.float32)
    b_chk = tl.zeros([BH, BK], tl.float32)
    for k0 in range(0, CHUNK, BK):
        o_k = i_s * CHUNK + k0 + tl.arange(0, BK)
        b_idx = tl.load(p_idx + i_b * stride_ib + o_k, mask=(o_k < K) & (o_k < n_used), other=-1)
        m_row = b_idx >= 0
        row = tl.where(m_row, b_idx, 0).to(tl.int64)
        b_k = tl.load(p_kv + row[:, None] * stride_kv + o_d[None, :], mask=m_row[:, None], other=0.0)
        if DO_QK:
            b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale_log2
        elif DO_PV:
            b_s = tl.zeros([BH, BK], tl.float32) + b_idx.to(tl.float32)[None, :] * 1e-9
        else:  # keep the gathered tile live with a cheap use of it
            b_s = tl.zeros([BH, BK], tl.float32) + tl.sum(b_k.to(tl.float32), axis=1)[None, :] * 1e-9
        b_s = tl.where(m_row[None, :], b_s, float("-inf"))
        if DO_SOFTMAX:
            b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
            b_alpha = tl.exp2(b_m - b_m_new)
            b_p = tl.exp2(b_s - b_m_new[:, None])
            b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
            b_m = b_m_new
        else:
            b_alpha = tl.full([BH], 1.0, tl.float32)
            b_p = b_s
        if DO_PV:
            b_acc = tl.dot(b_p.to(b_k.dtype), b_k, acc=b_acc * b_alpha[:, None])
        else:
            b_chk += b_p
    row_part = (i_b * NSPLIT + i_s).to(tl.int64) * H + o_h
    b_out = b_acc + tl.sum(b_chk, axis=1)[:, None] + (b_l + b_m)[:, None]
    tl.store(p_o_part + row_part[:, None] * D + o_d[None, :], b_out)


@triton.jit
def _register_prefetch_kernel(
    p_q, p_kv, p_idx, p_len, p_o_part, p_lse_part, stride_qb, stride_kv, stride_ib, H, qk_scale_log2,
    K: tl.constexpr, CHUNK: tl.constexpr, NSPLIT: tl.constexpr, D: tl.constexpr,
    BH: tl.constexpr, BK: tl.constexpr, EARLY: tl.constexpr,
):
    """The main kernel with the next tile gathered into registers by plain loads, issued before
    (EARLY) or after this tile's QK product, instead of by the pipeliner's cp.async at the end of
    the iteration; num_stages 1. Same partials as the production kernel."""
    i_b = tl.program_id(0)
    i_s = tl.program_id(2)
    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, D)
    b_q = tl.load(p_q + i_b * stride_qb + o_h[:, None] * D + o_d[None, :])
    n_used = tl.load(p_len + i_b)
    p_idx_b = p_idx + i_b * stride_ib
    end = tl.minimum(i_s * CHUNK + CHUNK, tl.minimum(n_used, K))
    b_m = tl.full([BH], -1.0e30, tl.float32)
    b_l = tl.zeros([BH], tl.float32)
    b_acc = tl.zeros([BH, D], tl.float32)
    o_k = i_s * CHUNK + tl.arange(0, BK)
    b_idx = tl.load(p_idx_b + o_k, mask=o_k < end, other=-1)
    row = tl.where(b_idx >= 0, b_idx, 0).to(tl.int64)
    b_kv = tl.load(p_kv + row[:, None] * stride_kv + o_d[None, :], mask=(b_idx >= 0)[:, None], other=0.0)
    o_k1 = o_k + BK
    b_idx1 = tl.load(p_idx_b + o_k1, mask=o_k1 < end, other=-1)
    for k0 in range(0, CHUNK, BK):
        m_row = b_idx >= 0
        row1 = tl.where(b_idx1 >= 0, b_idx1, 0).to(tl.int64)
        if EARLY:
            b_kv1 = tl.load(p_kv + row1[:, None] * stride_kv + o_d[None, :], mask=(b_idx1 >= 0)[:, None], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_kv)) * qk_scale_log2
        if not EARLY:
            b_kv1 = tl.load(p_kv + row1[:, None] * stride_kv + o_d[None, :], mask=(b_idx1 >= 0)[:, None], other=0.0)
        o_k2 = i_s * CHUNK + k0 + 2 * BK + tl.arange(0, BK)
        b_idx2 = tl.load(p_idx_b + o_k2, mask=o_k2 < end, other=-1)
        b_s = tl.where(m_row[None, :], b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = tl.dot(b_p.to(b_kv.dtype), b_kv, acc=b_acc * b_alpha[:, None])
        b_m = b_m_new
        b_kv = b_kv1
        b_idx = b_idx1
        b_idx1 = b_idx2
    row_part = (i_b * NSPLIT + i_s).to(tl.int64) * H + o_h
    m_any = b_l > 0
    tl.store(p_o_part + row_part[:, None] * D + o_d[None, :], b_acc / tl.where(m_any, b_l, 1.0)[:, None])
    tl.store(p_lse_part + row_part, tl.where(m_any, b_m + tl.log2(tl.where(m_any, b_l, 1.0)), float("-inf")))


@triton.jit
def _gather_rows_kernel(p_kv, p_idx, p_out, stride_kv, D: tl.constexpr, ROWS: tl.constexpr):
    """Read ROWS selected latent rows and write one sum per row: the gather alone, at high occupancy."""
    o_r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row = tl.load(p_idx + o_r).to(tl.int64)
    b_x = tl.load(p_kv + row[:, None] * stride_kv + tl.arange(0, D)[None, :])
    tl.store(p_out + o_r, tl.sum(b_x.to(tl.float32), axis=1))


def gather_ceiling(kv: torch.Tensor, gen: torch.Generator) -> None:
    """The read bandwidth of a gather of random distinct 1 KB latent rows, with nothing else in the
    kernel, next to a contiguous read of the same number of bytes and torch's index_select; calls
    cycle through input sets as the bench's do, so the rows come from HBM."""
    print(f"{'B':>3} {'gather':<34} {'us':>7} {'read GB/s':>10}")
    for batch in (32, 64):
        flats = [s[1].flatten().contiguous() for s in input_sets(batch, kv, gen)]
        cycle = itertools.cycle(flats)
        n = flats[0].numel()
        nbytes = n * DIM * kv.element_size()
        sums = torch.empty(n, device="cuda", dtype=torch.float32)
        runs = []
        for rows, warps in ((8, 4), (16, 4), (32, 8), (64, 8)):
            def launch(rows=rows, warps=warps):
                _gather_rows_kernel[(n // rows,)](kv, next(cycle), sums, kv.stride(0), D=DIM, ROWS=rows, num_warps=warps)
            runs.append((f"triton {rows} rows/program, {warps} warps", launch))
        seqs = itertools.cycle([torch.arange(n, device="cuda", dtype=torch.int32) + i * n for i in range(len(flats))])
        runs.append(("triton contiguous rows, 16/program",
                     lambda: _gather_rows_kernel[(n // 16,)](kv, next(seqs), sums, kv.stride(0), D=DIM, ROWS=16, num_warps=4)))
        runs.append(("torch index_select (reads+writes)", lambda: torch.index_select(kv, 0, next(cycle))))
        for name, fn in runs:
            fn()
            us = 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
            print(f"{batch:>3} {name:<34} {us:7.1f} {nbytes / (us * 1e-6) / 1e9:10.0f}", flush=True)


def split_costs(kv: torch.Tensor, gen: torch.Generator) -> None:
    """The production kernels timed apart: the main kernel alone (writing fp32 partials), the
    split-combine kernel alone, and the two together as mma_sparse_decode launches them."""

    print(f"{'B':>3} {'nsplit':>6} {'main us':>8} {'combine us':>10} {'both us':>8}")
    for batch in (16, 32, 64):  # whole-width tiles (at B <= 4 the value slices multiply the programs)
        sets = input_sets(batch, kv, gen)
        t = k.choose_tiles(batch, HEADS, TOPK, kv.device, DIM)
        chunk, nsplit = k.split_chunks(TOPK, t.block_k, t.nsplit)
        o = torch.empty(batch, HEADS, DIM, device="cuda", dtype=kv.dtype)
        lse = torch.empty(batch, HEADS, device="cuda", dtype=torch.float32)
        o_part = torch.randn(batch, nsplit, HEADS, DIM, device="cuda", dtype=torch.float32)
        lse_part = torch.randn(batch, nsplit, HEADS, device="cuda", dtype=torch.float32)
        torch.cuda.synchronize()
        cycle = itertools.cycle(sets)

        def main_kernel():
            q, indices, lengths, sink = next(cycle)
            k._mma_sparse_decode_kernel[(batch, 1, nsplit)](
                q, kv, kv, indices, lengths, sink, o, lse, o_part, lse_part,
                q.stride(0), q.stride(1), kv.stride(0), kv.stride(0), indices.stride(0), o.stride(0), o.stride(1),
                HEADS, 0.06, K=TOPK, CHUNK=chunk, NSPLIT=nsplit, DN=DIM, DR=0, D_P=DIM, ROPE_FOLLOWS_NOPE=True,
                BH=t.block_h, BK=t.block_k, BV=DIM, RELOAD_V=False, num_warps=t.num_warps, num_stages=t.num_stages)

        def combine():
            k._attn_combine_splits_kernel[(batch, HEADS)](
                o_part, lse_part, sets[0][3], o, lse, o.stride(0), o.stride(1), HEADS,
                NSPLIT=nsplit, NS_P=triton.next_power_of_2(nsplit), D=DIM, D_P=DIM, num_warps=4)

        def both():
            q, indices, lengths, sink = next(cycle)
            k.mma_sparse_decode(q, kv, indices, lengths, sink, DIM**-0.5)

        times = []
        for fn in (main_kernel, combine, both):
            fn()
            times.append(1e3 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
        print(f"{batch:>3} {nsplit:>6} {times[0]:8.1f} {times[1]:10.1f} {times[2]:8.1f}", flush=True)


def register_prefetch(kv: torch.Tensor, gen: torch.Generator) -> None:
    """The register-prefetch variants against the production main kernel, both alone (no combine)."""

    print(f"{'B':>3} {'variant':<32} {'us':>7}")
    for batch in (32, 64):
        sets = input_sets(batch, kv, gen)
        t = k.choose_tiles(batch, HEADS, TOPK, kv.device, DIM)
        for name, block_k, early in (("production main kernel", t.block_k, None),
                                     ("register prefetch, BK 32, early", 32, True),
                                     ("register prefetch, BK 32, after QK", 32, False),
                                     ("register prefetch, BK 64, early", 64, True),
                                     ("register prefetch, BK 64, after QK", 64, False)):
            chunk, nsplit = k.split_chunks(TOPK, block_k, t.nsplit)
            o_part = torch.empty(batch, nsplit, HEADS, DIM, device="cuda", dtype=torch.float32)
            lse_part = torch.empty(batch, nsplit, HEADS, device="cuda", dtype=torch.float32)
            o = torch.empty(batch, HEADS, DIM, device="cuda", dtype=kv.dtype)
            lse = torch.empty(batch, HEADS, device="cuda", dtype=torch.float32)
            cycle = itertools.cycle(sets)

            def launch(cycle=cycle, chunk=chunk, nsplit=nsplit, block_k=block_k, early=early,
                       o_part=o_part, lse_part=lse_part, o=o, lse=lse):
                q, indices, lengths, sink = next(cycle)
                if early is None:
                    k._mma_sparse_decode_kernel[(batch, 1, nsplit)](
                        q, kv, kv, indices, lengths, sink, o, lse, o_part, lse_part,
                        q.stride(0), q.stride(1), kv.stride(0), kv.stride(0), indices.stride(0), o.stride(0),
                        o.stride(1), HEADS, 0.06, K=TOPK, CHUNK=chunk, NSPLIT=nsplit, DN=DIM, DR=0, D_P=DIM,
                        ROPE_FOLLOWS_NOPE=True, BH=64, BK=block_k, BV=DIM, RELOAD_V=False,
                        num_warps=t.num_warps, num_stages=t.num_stages)
                else:
                    _register_prefetch_kernel[(batch, 1, nsplit)](
                        q, kv, indices, lengths, o_part, lse_part, q.stride(0), kv.stride(0), indices.stride(0),
                        HEADS, 0.06, K=TOPK, CHUNK=chunk, NSPLIT=nsplit, D=DIM, BH=64, BK=block_k, EARLY=early,
                        num_warps=8, num_stages=1)

            launch()
            us = 1e3 * triton.testing.do_bench_cudagraph(launch, rep=50, return_mode="median")
            # same chunks as the production kernel (B = 64): the partials must agree
            launch(cycle=itertools.cycle(sets[:1]))
            torch.cuda.synchronize()
            if early is None:
                reference = (chunk, o_part.clone())
                agree = ""
            elif reference[0] == chunk:
                err = ((o_part - reference[1]).abs().max() / reference[1].abs().max()).item()
                agree = f"  partials vs production: max rel {err:.1e}"
            else:
                agree = "  (other chunks than production: partials not compared)"
            print(f"{batch:>3} {name:<32} {us:7.1f}  (nsplit {nsplit}){agree}", flush=True)


def gluon_variant(kv: torch.Tensor, gen: torch.Generator) -> None:
    """kernel_gluon.py against the block-level kernel (kernel.py): same partials (checked against
    the block-level main kernel's and, through the combine, against the float64 reference), then
    times, main kernel alone and with the combine, with the bench's rotating inputs."""
    from dsv4opt.numerics import error_report
    from dsv4opt.workload.attention import sparse_attention_ref

    from dsv4opt.optimizations.mma_attn import kernel_gluon as g
    print(f"{'B':>3} {'main us':>8} {'gluon main us':>13} {'main+combine us':>15} {'gluon+combine us':>16}  check")
    for batch in (16, 32, 64):
        sets = input_sets(batch, kv, gen)
        t = k.choose_tiles(batch, HEADS, TOPK, kv.device, DIM)
        chunk, nsplit = k.split_chunks(TOPK, t.block_k, t.nsplit)
        shape = (batch, nsplit, HEADS)
        bufs = {name: (torch.empty(*shape, DIM, device="cuda"), torch.empty(*shape, device="cuda")) for name in ("prod", "gluon")}
        o = torch.empty(batch, HEADS, DIM, device="cuda", dtype=kv.dtype)
        lse = torch.empty(batch, HEADS, device="cuda", dtype=torch.float32)

        def prod_main(q, indices, lengths, sink):
            k._mma_sparse_decode_kernel[(batch, 1, nsplit)](
                q, kv, kv, indices, lengths, sink, o, lse, *bufs["prod"],
                q.stride(0), q.stride(1), kv.stride(0), kv.stride(0), indices.stride(0), o.stride(0), o.stride(1),
                HEADS, DIM**-0.5 * 1.4426950408889634, K=TOPK, CHUNK=chunk, NSPLIT=nsplit, DN=DIM, DR=0, D_P=DIM,
                ROPE_FOLLOWS_NOPE=True, BH=64, BK=t.block_k, BV=DIM, RELOAD_V=False,
                num_warps=t.num_warps, num_stages=t.num_stages)

        def gluon_main(q, indices, lengths, sink):
            g.gluon_sparse_decode_partials(q, kv, indices, lengths, *bufs["gluon"], chunk, nsplit, DIM**-0.5)

        def combine(name, sink):
            k._attn_combine_splits_kernel[(batch, HEADS)](
                *bufs[name], sink, o, lse, o.stride(0), o.stride(1), HEADS,
                NSPLIT=nsplit, NS_P=triton.next_power_of_2(nsplit), D=DIM, D_P=DIM, num_warps=4)
            return o, lse

        def prod_full(q, indices, lengths, sink):
            prod_main(q, indices, lengths, sink)
            return combine("prod", sink)

        def gluon_full(q, indices, lengths, sink):
            gluon_main(q, indices, lengths, sink)
            return combine("gluon", sink)

        q, indices, lengths, sink = sets[0]
        prod_main(q, indices, lengths, sink)
        gluon_main(q, indices, lengths, sink)
        torch.cuda.synchronize()
        part = error_report(bufs["gluon"][0], bufs["prod"][0])
        go, glse = gluon_full(q, indices, lengths, sink)
        ref_o, ref_lse = sparse_attention_ref(q, kv, indices, lengths, sink, DIM**-0.5)
        full = error_report(go.float(), ref_o)
        check = f"partials vs production {part}; o vs float64 {full}; lse vs float64 {error_report(glse, ref_lse)}"
        times = []
        for fn in (prod_main, gluon_main, prod_full, gluon_full):
            cycle = itertools.cycle(sets)
            call = lambda fn=fn, cycle=cycle: fn(*next(cycle))  # noqa: E731
            call()
            times.append(1e3 * triton.testing.do_bench_cudagraph(call, rep=50, return_mode="median"))
        print(f"{batch:>3} {times[0]:8.1f} {times[1]:13.1f} {times[2]:15.1f} {times[3]:16.1f}  {check}", flush=True)


def gluon_gate() -> None:
    """kernel_gluon.py through the correctness gate's GPU table at every B (the product uses it only
    above SMALL_BATCH_MAX), every case with contiguous latent rows (it has no split nope/rope
    layout): its main kernel plus the combine, NaN-poisoned outputs, against the float64 reference
    at the gate's tolerance."""
    from dsv4opt.numerics import error_report
    from dsv4opt.optimizations.mma_attn.cases import gpu_cases, make_inputs
    from dsv4opt.optimizations.mma_attn.check import REL_TOL
    from dsv4opt.workload.attention import sparse_attention_ref

    from dsv4opt.optimizations.mma_attn import kernel_gluon as g
    k.SMALL_BATCH_MAX = 0  # whole-width 64-row tiles at every B
    worst, failed, ran = 0.0, [], 0
    for case in gpu_cases():
        if case.split_kv:
            continue
        x = make_inputs(case, "cuda", torch.bfloat16, seed=0)
        B, H, D = x.q.shape
        t = k.choose_tiles(B, H, x.indices.shape[1], x.q.device, D)
        chunk, nsplit = k.split_chunks(x.indices.shape[1], t.block_k, t.nsplit)
        nan = float("nan")
        o_part = torch.full((B, nsplit, H, D), nan, device="cuda")
        lse_part = torch.full((B, nsplit, H), nan, device="cuda")
        o = torch.full_like(x.q, nan)
        lse = torch.full((B, H), nan, device="cuda")
        g.gluon_sparse_decode_partials(x.q, x.kv, x.indices, x.lengths, o_part, lse_part, chunk, nsplit, x.scale)
        k._attn_combine_splits_kernel[(B, H)](
            o_part, lse_part, x.sink, o, lse, o.stride(0), o.stride(1), H,
            NSPLIT=nsplit, NS_P=triton.next_power_of_2(nsplit), D=D, D_P=triton.next_power_of_2(D), num_warps=4)
        ref_o, ref_lse = sparse_attention_ref(*x.args())
        eo, el = error_report(o, ref_o), error_report(lse, ref_lse)
        ok = eo.ok(REL_TOL) and el.ok(REL_TOL)
        ran += 1
        worst = max(worst, eo.rel)
        if not ok:
            failed.append(case.name)
        print(f"{case.name:<28} o {eo.rel:.2e} lse {el.rel:.2e} nonfinite {eo.nonfinite + el.nonfinite} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    print(f"gluon gate: {ran - len(failed)}/{ran} cases within rel {REL_TOL}; worst o rel {worst:.2e}; failed: {failed}")


def main() -> None:
    import sys

    if "--gluon-gate" in sys.argv:
        gluon_gate()
        return
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(int(POOL_GB * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    modes = {"--gluon": gluon_variant, "--register-prefetch": register_prefetch, "--split": split_costs,
             "--ceiling": gather_ceiling}
    for flag, probe in modes.items():
        if flag in sys.argv:
            probe(kv, gen)
            return
    ablation(kv, gen)


def ablation(kv: torch.Tensor, gen: torch.Generator) -> None:
    """The main loop with the QK product, the softmax or the PV product left out."""
    print(f"{'B':>3} {'variant':<24} {'us':>7}")
    for batch in (32, 64):
        sets = input_sets(batch, kv, gen)  # cycled through, so the rows come from HBM
        q = sets[0][0]
        t = k.choose_tiles(batch, HEADS, TOPK, q.device, DIM)
        chunk, nsplit = k.split_chunks(TOPK, t.block_k, t.nsplit)
        part = torch.empty(batch, nsplit, HEADS, DIM, device="cuda", dtype=torch.float32)
        for name, qk, sm, pv in (
            ("full", True, True, True), ("no softmax", True, False, True), ("no QK", False, True, True),
            ("no PV", True, True, False), ("QK only", True, False, False), ("gather only", False, False, False),
        ):
            cycle = itertools.cycle(sets)

            def launch(cycle=cycle, qk=qk, sm=sm, pv=pv):
                q, indices, lengths, _ = next(cycle)
                _ablated_kernel[(batch, 1, nsplit)](
                    q, kv, indices, lengths, part, q.stride(0), kv.stride(0), indices.stride(0), HEADS, 0.06,
                    K=TOPK, CHUNK=chunk, NSPLIT=nsplit, D=DIM, BH=64, BK=t.block_k,
                    DO_QK=qk, DO_SOFTMAX=sm, DO_PV=pv, num_warps=t.num_warps, num_stages=t.num_stages,
                )
            launch()
            us = 1e3 * triton.testing.do_bench_cudagraph(launch, rep=50, return_mode="median")
            print(f"{batch:>3} {name:<24} {us:7.1f}  (nsplit {nsplit}, BK {t.block_k})", flush=True)


if __name__ == "__main__":
    main()
