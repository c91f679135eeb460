"""Compile grouped-moe's two GEMM kernels for sm_90a without a GPU and print what ptxas and the PTX say.

    python3 benchmarks/compile_grouped_moe_sm90.py [--layout dp-ep,tp4] [--concurrency 1,32] [--dump DIR]

Needs Triton 3.6 (the H200's) and no GPU: the launch's types and constexprs are written out here
for the layout's shapes and the config `configs.choose` gives. Prints registers, spills, shared
memory, and what the PTX holds per kernel: wgmma (and whether its A operand comes from registers),
shared-memory traffic the layout conversions add (st.shared / ld.shared outside cp.async), 16-byte
global and cp.async loads, the bf16x2 multiplies of the decode, and the SASS opcodes of each loop
holding an HGMMA (nvdisasm from Triton's wheel).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dsv4opt.sass import listing, loops, ptxas_log  # noqa: E402
from dsv4opt.workload.kernels.grouped_moe import kernel  # noqa: E402
from dsv4opt.workload.kernels.grouped_moe import configs  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
D16 = [["tt.divisibility", 16]]
LAYOUTS = {"dp-ep": (32, 2048, 4096, 8), "tp4": (256, 512, 4096, 1), "tp8": (256, 256, 4096, 1)}


def _source(fn, types: dict, constexprs: dict, divisible: set[str]):
    sig = {n: ("constexpr" if n in constexprs else types[n]) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): D16 for n, t in types.items() if t.startswith("*") or n in divisible}
    return ASTSource(fn, sig, constexprs, attrs)


def up_source(cfg: configs.MoeConfig, I: int, d: int, fold: bool = True):
    t = cfg.up
    types = dict(p_x="*bf16", p_w="*u8", p_s="*u8", p_ids="*i32", p_rows="*i32", p_tile_expert="*i32", p_tile_rows="*i32",
                 p_meta="*i32", p_act="*bf16", p_part="*fp32", p_count="*i32", stride_xm="i32", stride_act="i32", stride_part_s="i32",
                 stride_part_n="i32", limit="fp32", num_progs="i32", n_slots="i32", I="i32", K="i32", N16="i32", K64="i32")
    const = dict(TOPK=6, BM=cfg.bm, BN=t.bn, BK=t.bk, SPLIT=t.split, FLAT=t.flat, FOLD=fold, EMULATE=False, EVEN=True,
                 N_BLK=triton.cdiv(I, t.bn) if t.static else 0, STEPS=triton.cdiv(d, t.bk * t.split) if t.static else 0,
                 SLOTWISE=cfg.slotwise)
    div = {"stride_xm", "stride_act", "stride_part_s", "stride_part_n", "I", "K", "N16", "K64"}
    return _source(kernel._moe_up_kernel, types, const, div), t


def down_source(cfg: configs.MoeConfig, I: int, d: int, fold: bool = True):
    t = cfg.down
    types = dict(p_act="*bf16", p_w="*u8", p_s="*u8", p_ids="*i32", p_rows="*i32", p_tile_expert="*i32",
                 p_tile_rows="*i32", p_meta="*i32", p_down="*fp32", p_gates="*fp32", p_out="*bf16", p_count="*i32",
                 stride_act="i32", stride_ds="i32", stride_dm="i32", stride_om="i32", scale="fp32", num_progs="i32",
                 n_slots="i32", N="i32", K="i32", N16="i32", K64="i32")
    const = dict(TOPK=6, BM=cfg.bm, BN=t.bn, BK=t.bk, SPLIT=t.split, FLAT=t.flat, FOLD=fold, EMULATE=False, EVEN=True,
                 N_BLK=triton.cdiv(d, t.bn) if t.static else 0, STEPS=triton.cdiv(I, t.bk * t.split) if t.static else 0,
                 SLOTWISE=cfg.slotwise)
    div = {"stride_act", "stride_ds", "stride_dm", "N", "K", "N16", "K64"}
    return _source(kernel._moe_down_kernel, types, const, div), t


def route_source(R: int, slots: int):
    types = dict(p_ids="*i32", p_counts="*i32", p_start="*i32", p_rank="*i32", p_rows="*i32", p_tile_expert="*i32",
                 p_tile_rows="*i32", p_meta="*i32", S="i32", R="i32")
    r_p, s_p = triton.next_power_of_2(R), triton.next_power_of_2(slots)
    one = s_p <= kernel.ONE_PASS_SLOTS and s_p * r_p <= kernel.ONE_PASS_ELEMENTS
    const = dict(BM=16, R_P=r_p, CH=max(s_p, 16) if one else 1024, ONE_PASS=one)
    return _source(kernel._route_kernel, types, const, set()), configs.GemmTiles(bn=64, bk=64, warps=8, stages=1)


def report(src, tiles: configs.GemmTiles, label: str, dump: Path | None) -> dict:
    opts = {"num_warps": tiles.warps, "num_stages": tiles.stages} | ({"maxnreg": tiles.maxnreg} if tiles.maxnreg else {})
    compiled = triton.compile(src, target=TARGET, options=opts)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    log = ptxas_log(ptx)
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill_st, spill_ld = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    row = {
        "kernel": label, "registers": regs, "spill_store_bytes": spill_st, "spill_load_bytes": spill_ld,
        "shared_bytes": compiled.metadata.shared,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_reg_a": len(re.findall(r"wgmma\.mma_async[^;]*\{[^}]*\},\s*\{", ptx)),
        "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
        "mul_bf16x2": len(re.findall(r"mul\.rn\.bf16x2", ptx)),
        "ld_global_v4": len(re.findall(r"ld\.global[^;]*\.v4", ptx)),
        "cp_async_16": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, 0x10", ptx)),
        "st_shared": len(re.findall(r"\bst\.shared", ptx)),
        "ld_shared": len(re.findall(r"\bld\.shared", ptx)),
        "ldmatrix": len(re.findall(r"ldmatrix", ptx)),
        "convert_layout": len(re.findall(r"ttg\.convert_layout", ttgir)),
        "local_alloc": len(re.findall(r"ttg\.local_alloc", ttgir)),
    }
    print(f"{label}\n  " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "kernel"), flush=True)
    sass = listing(compiled)
    for name, ops in loop_counts(sass):
        row.setdefault("mma_loops", []).append({"loop": name, "instructions": sum(ops.values()), "ops": dict(ops)})
        print(f"  loop {name}: {sum(ops.values())} SASS instructions: "
              + ", ".join(f"{k} {v}" for k, v in ops.most_common(12)), flush=True)
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9]+", "_", label)
        for ext in ("ttgir", "ptx"):
            (dump / f"{stem}.{ext}").write_text(compiled.asm[ext])
        (dump / f"{stem}.sass").write_text(sass)
    return row


def loop_counts(sass: str) -> list[tuple[str, Counter]]:
    """Each loop of the listing that holds an HGMMA, its SASS opcodes counted. The innermost is the
    K loop (its instructions a step a thread); a loop around it counts the K loop's with its own."""
    return [(name, ops) for name, ops in loops(sass) if ops.get("HGMMA")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="dp-ep,tp4")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--candidates", action="store_true", help="every sweep candidate, not only the table's choice")
    ap.add_argument("--no-fold", action="store_true", help="the two-multiply scale path")
    ap.add_argument("--static", action="store_true", help="the table's configs with constant item and K-step counts")
    ap.add_argument("--slotwise", action="store_true", help="the table's configs slotwise (down's loop nested)")
    ap.add_argument("--dump", type=Path)
    args = ap.parse_args()
    for name in args.layout.split(","):
        R, I, d, ranks = LAYOUTS[name]
        for slots in (6 * ranks, 6 * ranks * 64):
            src, tiles = route_source(R, slots)
            report(src, tiles, f"{name} route, {slots} slots", args.dump)
        for c in (int(v) for v in args.concurrency.split(",")):
            slots = ranks * c * 6
            cfgs = configs.candidates(R, I, d, slots) if args.candidates else [configs.choose(R, I, d, slots)]
            if args.static:
                cfgs = [replace(cfg, up=replace(cfg.up, static=True), down=replace(cfg.down, static=True)) for cfg in cfgs]
            if args.slotwise:
                cfgs = [replace(cfg, slotwise=True, down=replace(cfg.down, flat=False)) for cfg in cfgs]
            for cfg in cfgs:
                for which, make in (("up", up_source), ("down", down_source)):
                    src, tiles = make(cfg, I, d, fold=not args.no_fold)
                    report(src, tiles, f"{name} C={c} {which} {cfg.name}", args.dump)


if __name__ == "__main__":
    main()
