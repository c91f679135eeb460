"""Compile mma-attn's Gluon main loops for sm_90a without a GPU and print what ptxas says.

    python3 benchmarks/compile_mma_attn_gluon_sm90.py [--kernel fp8-ws,bf16-ws,bf16|all] [--batch 64] [--kx 512]
        [--dump DIR] [--json OUT]

Needs Triton 3.6 (the version the Gluon loops are gated on) and no GPU: the launch's signature
and constexprs are written out here for the dsv4-flash shapes (64 heads of 512, K 512 + window
128, or --kx compressed slots: 8192 for SGLang's graph-width HCA rows; the FP8 layout's page
geometry), with the splits kernel.choose_tiles/split_chunks give for --batch on a 132-SM H200
(each program's share of the used slots is worked out in the kernel from the lengths). Prints registers, spill bytes (ptxas -v on the PTX Triton produced),
Triton's shared memory, and what the PTX holds (cp.async by width, zero-filling ones, wgmma).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402
from dsv4opt.sass import ptxas_log  # noqa: E402
from dsv4opt.workload.config import ModelConfig  # noqa: E402
from dsv4opt.workload.kvcache import KVLayout  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 232448  # bytes of shared memory a CTA may use on H100/H200 (227 KB)
D16 = [["tt.divisibility", 16]]


def _signature(fn, types: dict, constexprs: dict) -> tuple[dict, dict]:
    sig = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): D16 for n, t in types.items() if t.startswith("*") or n in DIVISIBLE}
    return sig, attrs


# integer arguments that are multiples of 16 in the model's launches (Triton specialises on that)
DIVISIBLE = {"stride_qb", "stride_ob", "stride_oh", "stride_kv", "stride_ib", "stride_iw", "stride_ix", "H", "x_delta", "idx_x_delta", "len_x_delta"}


KX = ModelConfig.from_name("dsv4-flash").index_topk  # compressed slots a row (--kx)


def _chunking(batch: int) -> tuple[int, int]:
    """(slots per split with every slot used, splits) at `batch`."""
    cfg = ModelConfig.from_name("dsv4-flash")
    t = kernel.choose_tiles(max(batch, kernel.SMALL_BATCH_MAX + 1), cfg.heads, KX + cfg.window,
                            torch.device("cpu"), cfg.head_dim, fp8=True)
    if batch <= kernel.SMALL_BATCH_MAX:  # the Gluon loops use the whole-width family at every B
        t = kernel.Tiles(64, 64, max(1, round(132 / batch)), 8, 2)
    return kernel.split_chunks(KX + cfg.window, t.block_k, t.nsplit)


def _fp8_launch(batch: int) -> tuple[dict, dict]:
    """Constexprs and argument types of the FP8 loop: the dsv4-flash shapes and page geometry,
    the chunking for `batch` on a 132-SM H200."""
    cfg = ModelConfig.from_name("dsv4-flash")
    _, nsplit = _chunking(batch)
    lw = KVLayout(True, cfg.head_dim - cfg.rope_dim, cfg.rope_dim, cfg.kv_tile, cfg.window_page)
    lx = KVLayout(True, cfg.head_dim - cfg.rope_dim, cfg.rope_dim, cfg.kv_tile, cfg.extra_page("csa"))
    constexprs = dict(KW=cfg.window, KX=KX, NSPLIT=nsplit, PS_W=lw.page_size,
                      PB_W=lw.page_bytes, PS_X=lx.page_size, PB_X=lx.page_bytes, D=cfg.head_dim, BH=cfg.heads)
    types = dict(p_q="*bf16", p_kv8="*u8", p_kv16="*bf16", p_kv32="*i32", p_idx="*i32", p_len="*i32",
                 p_o_part="*fp32", p_lse_part="*fp32", stride_qb="i32", stride_iw="i32", stride_ix="i32", H="i32",
                 qk_scale_log2="fp32", x_delta="i64", idx_x_delta="i32", len_x_delta="i32")
    return constexprs, types


def fp8_ws_source(batch: int):
    from dsv4opt.optimizations.mma_attn import kernel_gluon_fp8_ws as g

    constexprs, types = _fp8_launch(batch)
    constexprs.update(BK=g.BLOCK_K, SUB_=g.SUB, NST=g.NUM_STAGE, PRODUCER_REGS_=g.PRODUCER_REGS, ABLATE_=g.ABLATE)
    types.update(p_o_part="*bf16")
    sig, attrs = _signature(g.gluon_fp8_ws_sparse_decode_kernel, types, constexprs)
    return GluonASTSource(g.gluon_fp8_ws_sparse_decode_kernel, sig, constexprs, attrs), \
        f"FP8 warp-specialised, bf16 partials staged, B {batch}, K {KX}: {constexprs['NSPLIT']} splits"


def bf16_ws_source(batch: int):
    from dsv4opt.optimizations.mma_attn import kernel_gluon_bf16_ws as g
    from dsv4opt.optimizations.mma_attn import kernel_gluon_fp8_ws as ws

    cfg = ModelConfig.from_name("dsv4-flash")
    _, nsplit = _chunking(batch)
    constexprs = dict(KW=cfg.window, KX=KX, NSPLIT=nsplit, D=cfg.head_dim, BH=cfg.heads,
                      BK=ws.BLOCK_K, PRODUCER_REGS_=ws.PRODUCER_REGS, ABLATE_=ws.ABLATE)
    types = dict(p_q="*bf16", p_kv="*bf16", p_idx="*i32", p_len="*i32", p_o_part="*bf16", p_lse_part="*fp32",
                 stride_qb="i32", stride_kv="i32", stride_iw="i32", stride_ix="i32", H="i32", qk_scale_log2="fp32",
                 x_delta="i64", idx_x_delta="i32", len_x_delta="i32")
    fn = g.gluon_bf16_ws_sparse_decode_kernel
    sig, attrs = _signature(fn, types, constexprs)
    return GluonASTSource(fn, sig, constexprs, attrs), \
        f"bf16 warp-specialised, bf16 partials staged, B {batch}, K {KX}: {constexprs['NSPLIT']} splits"


def bf16_source(batch: int):
    from dsv4opt.optimizations.mma_attn import kernel_gluon as g

    cfg = ModelConfig.from_name("dsv4-flash")
    _, nsplit = kernel.split_chunks(KX, 64, max(2, round(132 / batch)))
    fn = g.gluon_sparse_decode_kernel
    constexprs = dict(K=KX, NSPLIT=nsplit, SPLIT_BASE=0, NS_TOTAL=nsplit, D=cfg.head_dim, BH=cfg.heads, BK=64)
    types = dict(p_q="*bf16", p_kv="*bf16", p_idx="*i32", p_len="*i32", p_o_part="*fp32", p_lse_part="*fp32",
                 stride_qb="i32", stride_kv="i32", stride_ib="i32", H="i32", qk_scale_log2="fp32")
    sig, attrs = _signature(fn, types, constexprs)
    return GluonASTSource(fn, sig, constexprs, attrs), f"bf16 loop (compressed cache), B {batch}, K {KX}: {nsplit} splits"


# what --kernel names: the main loops, each a source for a batch size
VARIANTS = {
    "fp8-ws": fp8_ws_source,
    "bf16-ws": bf16_ws_source,
    "bf16": bf16_source,
}


# the launch's warps where not 8 (the default partition's: workers come on top)
NUM_WARPS: dict[str, int] = {}


def report(src, label: str, dump: Path | None, num_warps: int = 8) -> dict:
    compiled = triton.compile(src, target=TARGET, options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    log = ptxas_log(ptx)
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill_st, spill_ld = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    shared = compiled.metadata.shared
    widths = {w: len(re.findall(rf"cp\.async\.c[ag]\.shared\.global[^;]*\], {w:#x}(?:, |;)", ptx)) for w in (4, 8, 16)}
    row = {
        "kernel": label, "registers": regs, "spill_store_bytes": spill_st, "spill_load_bytes": spill_ld,
        "shared_bytes": shared, "fits_227KB": shared <= SMEM_LIMIT,
        "cp_async_by_width": widths, "cp_async_zero_fill": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*\], 0x\d+, %r", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx))),
        "bar_sync": len(re.findall(r"\bbar\.sync", ptx)),
    }
    print(f"{label}\n  registers {regs}, spills {spill_st} B stored / {spill_ld} B loaded, shared memory {shared} B "
          f"({shared / 1024:.1f} KiB; limit {SMEM_LIMIT / 1024:.0f} KiB)\n  PTX: cp.async by width {widths}, "
          f"{row['cp_async_zero_fill']} with a run-time src-size (zero fill), {row['wgmma']} wgmma.mma_async\n"
          f"  ptxas: {' '.join(line.strip() for line in log.splitlines() if 'Used' in line or 'spill' in line)}")
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext in ("ttgir", "llir", "ptx"):
            (dump / f"{label.split(',')[0].replace(' ', '_')}.{ext}").write_text(compiled.asm[ext])
    return row


def main() -> None:
    global KX
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="all",
                    help=f"comma-separated, of {', '.join(VARIANTS)}; all: every one")
    ap.add_argument("--batch", default="64")
    ap.add_argument("--kx", type=int, default=KX, help="compressed-cache slots a row (8192: SGLang's graph width)")
    ap.add_argument("--dump", type=Path, help="write the TTGIR, LLVM IR and PTX here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    KX = args.kx
    print(f"Triton {triton.__version__}, target sm_90a")
    names = {"all": list(VARIANTS)}.get(args.kernel, args.kernel.split(","))
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown --kernel {unknown}; known: {', '.join(VARIANTS)}, all")
    rows = []
    for b in (int(x) for x in args.batch.split(",")):
        for n in names:
            rows.append(report(*VARIANTS[n](b), args.dump, NUM_WARPS.get(n, 8)))
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "target": "sm_90a", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
