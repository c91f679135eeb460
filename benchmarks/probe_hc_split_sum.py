"""Where the time of fuse-glue's `hc_split_sum` kernel goes, on a GPU: variants of the launch
against the baseline's standalone Sinkhorn kernel and a one-store kernel (the launch floor), each
the median of CUDA-graph replays over rotating input sets, as `dsv4opt bench fuse-glue` times.

    PYTHONPATH=. python3 benchmarks/probe_hc_split_sum.py [--batch 1,32,64] [--json OUT]

Variants: the shipped launch; its Sinkhorn programs alone; its Sinkhorn cut to one iteration (what
the 20 dependent iterations cost); the shipped kernel at 2 and 4 warps; and the version before it
(one program a token for the Sinkhorn, 4 warps, 1024 columns a sum program), at 4 warps and at 1.
A probe reports: each comparable variant's largest relative difference from the shipped outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.optimizations.fuse_glue import kernel  # noqa: E402
from dsv4opt.optimizations.fuse_glue.bench import fused_bytes, rotating  # noqa: E402
from dsv4opt.optimizations.fuse_glue.cases import FLASH, GlueCase, make_args  # noqa: E402
from dsv4opt.optimizations.timing import median_graph_ms, sets_needed  # noqa: E402
from dsv4opt.tritonlib import interpreted  # noqa: E402
from dsv4opt.workload.kernels.mhc import hc_post_comb, hc_pre_gate, hc_split_sinkhorn  # noqa: E402


@triton.jit
def _per_token_kernel(p_mix, p_rsqrt, p_flat, p_scale, p_base, p_x, p_post, p_comb,
                      stride_mix, stride_flat, stride_x, eps,
                      D: tl.constexpr, HC: tl.constexpr, ITERS: tl.constexpr, BLOCK_D: tl.constexpr,
                      N_D: tl.constexpr):
    # The launch before the one-warp blocks of tokens (commit b0dd547): grid (T, N_D + 1).
    i_t = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1)
    p_row = p_mix + i_t * stride_mix
    b_r = tl.load(p_rsqrt + i_t)
    if i_d < N_D:
        b_pre = hc_pre_gate(p_row, p_scale, p_base, b_r, eps, HC)
        o_j = tl.arange(0, HC)
        o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        b_f = tl.load(p_flat + i_t * stride_flat + o_j[:, None] * D + o_d[None, :], mask=m_d[None, :], other=0.0)
        tl.store(p_x + i_t * stride_x + o_d, tl.sum(b_pre[:, None] * b_f, axis=0).to(p_x.dtype.element_ty), mask=m_d)
    else:
        hc_post_comb(p_row, p_scale, p_base, p_post + i_t * HC, p_comb + i_t * HC * HC, b_r, eps, HC, ITERS)


@triton.jit
def _one_store_kernel(p_out):
    tl.store(p_out + tl.program_id(0), 1.0)


def outputs(T, d, hc, dev, dtype):
    return (torch.empty(T, d, device=dev, dtype=dtype), torch.empty(T, hc, device=dev, dtype=torch.float32),
            torch.empty(T, hc, hc, device=dev, dtype=torch.float32))


def shipped(warps: int = 1, block_d: int = kernel.SUM_BLOCK_D, iters: int | None = None, sums: bool = True):
    def run(mix, rsqrt, flat, scale, base, hc, n_iter, eps, dtype):
        T, d = flat.shape[0], flat.shape[1] // hc
        x, post, comb = outputs(T, d, hc, flat.device, dtype)
        block = min(block_d, triton.next_power_of_2(d))
        n_d, tokens = triton.cdiv(d, block), 32 * warps
        grid = triton.cdiv(T, tokens) + (T * n_d if sums else 0)
        kernel._hc_split_sum_kernel[(grid,)](
            p_mix=mix, p_rsqrt=rsqrt, p_flat=flat, p_scale=scale, p_base=base, p_x=x, p_post=post, p_comb=comb,
            T=T, stride_mix=mix.stride(0), stride_flat=flat.stride(0), stride_x=x.stride(0), eps=eps,
            D=d, HC=hc, ITERS=iters or n_iter, BLOCK_D=block, N_D=n_d, BLOCK_T=tokens, EMULATE=interpreted(),
            num_warps=warps)
        return x, post, comb
    return run


def per_token(warps: int, block_d: int):
    def run(mix, rsqrt, flat, scale, base, hc, n_iter, eps, dtype):
        T, d = flat.shape[0], flat.shape[1] // hc
        x, post, comb = outputs(T, d, hc, flat.device, dtype)
        block = min(block_d, triton.next_power_of_2(d))
        n_d = triton.cdiv(d, block)
        _per_token_kernel[(T, n_d + 1)](
            p_mix=mix, p_rsqrt=rsqrt, p_flat=flat, p_scale=scale, p_base=base, p_x=x, p_post=post, p_comb=comb,
            stride_mix=mix.stride(0), stride_flat=flat.stride(0), stride_x=x.stride(0), eps=eps,
            D=d, HC=hc, ITERS=n_iter, BLOCK_D=block, N_D=n_d, num_warps=warps)
        return x, post, comb
    return run


def baseline_sinkhorn(mix, rsqrt, flat, scale, base, hc, n_iter, eps, dtype):
    return hc_split_sinkhorn(mix, scale, base, hc, n_iter, eps)


def launch_floor(mix, *rest):
    out = torch.empty(1, device=mix.device)
    _one_store_kernel[(1,)](out)
    return out


VARIANTS = {
    "shipped (1 warp, 32 tokens, 512 cols)": (shipped(), True),
    "shipped, Sinkhorn programs only": (shipped(sums=False), False),
    "shipped, 1 Sinkhorn iteration": (shipped(iters=1), False),
    "shipped at 2 warps (64 tokens)": (shipped(warps=2, block_d=1024), True),
    "shipped at 4 warps (128 tokens)": (shipped(warps=4, block_d=1024), True),
    "per-token, 4 warps, 1024 cols (before)": (per_token(4, 1024), True),
    "per-token, 1 warp, 512 cols": (per_token(1, 512), True),
    "baseline's Sinkhorn kernel alone": (baseline_sinkhorn, False),
    "one-store kernel (launch floor)": (launch_floor, False),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,32,64")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for c in (int(b) for b in args.batch.split(",")):
        case = GlueCase("hc_split_sum", f"dsv4-flash-c{c}", c, FLASH.hidden, hc=FLASH.hc)
        first = make_args(case, "cuda", torch.bfloat16, torch.Generator().manual_seed(0))
        n = sets_needed(fused_bytes(case, first), l2)
        sets = [first] + [make_args(case, "cuda", torch.bfloat16, torch.Generator().manual_seed(i)) for i in range(1, n)]
        want = kernel.hc_split_sum(*first)
        torch.cuda.synchronize()  # do_bench_cudagraph runs on a stream of its own
        for name, (fn, comparable) in VARIANTS.items():
            same = max(error_report(a, b).rel for a, b in zip(fn(*first), want)) if comparable else None
            us = median_graph_ms(rotating(fn, sets)) * 1e3
            rows.append({"concurrency": c, "variant": name, "us": us, "rel_diff_from_shipped": same, "input_sets": n})
            print(f"C={c:<3} {name:<42} {us:7.2f} us  rel diff from shipped: {same}", flush=True)
        del sets, first
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
