"""grouped-moe for a few slots (Gluon, mma.sync): each lane loads its weight bytes straight into its MMA fragments.

What they stand for: `_moe_up_kernel` and `_moe_down_kernel` (kernel.py) on slotwise tiles
(each slot its own tile, its expert read from the router's ids; tp4 at C = 1: 6 slots on 256
experts), the few-slot decode SGLang runs as `mxfp4_moe_forward_triton` (a GEMV a slot) and
triton_kernels as `matmul_ogs` with one row an expert. There the Triton kernels are latency-bound,
not bandwidth-bound (Nsight Compute at 7936b5b: 0.29 instructions a cycle a scheduler from about 3
warps, a warp waiting 9.3 cycles an instruction on global loads, the shared-memory pipe and
barriers; evidence/h200/grouped_moe/ncu_stalls_tp4c1_7936b5b.log).

So here: no shared memory, no ring and no barrier in the K loop. The production layout
(layout.py) was built so that a lane's 16 bytes of a unit (16 rows x 64 columns) are
its m16n8k16 A fragments for the unit's four k16 blocks (row g and g + 8, columns q * 2 + h and
+ 8 of each block; lane = 4g + q). Each warp owns `REP` units of rows and an item's K range of
`STEPS` units, issues all its 16-byte loads (and scale words) at once, decodes them with the
production shifts, masks and folded bf16x2 multiply (`ws.decode_asm`), and runs
mma.sync m16n8k16 against the slot's token in column 0 of 8 (the rest zero). A work item: (slot,
rows, K split); the splits' fp32 partials meet by a ticket (the last to arrive sums them):
- gate/up (`_moe_up_direct_kernel`): half the item's units gate rows, half the same up rows; the
  last split writes act[slot, n] = silu(min(g, limit)) * clamp(u, -limit, limit) in x's dtype;
- down (`_moe_down_direct_kernel`): w2 rows; the last of a token's top-k x splits arrivals for its
  rows sums them with the gates into out (no combine launch), as `_down_combine` does.

Not covered (the Triton kernels keep them): routed tiles (more than one slot a tile), unfolded
scales (scales above 2), ragged K or rows, fp16 tokens. `direct_supported` says when it applies.

    PYTHONPATH=. python3 -m dsv4opt.workload.kernels.grouped_moe.direct --compile-only
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

import torch
import triton

from dsv4opt.sass import listing, opcodes, ptxas_log
from dsv4opt.workload.kernels.grouped_moe.layout import UNIT_BYTES, UNIT_COLS, UNIT_ROWS, UNIT_SCALES
from dsv4opt.workload.kernels.grouped_moe.ws import GLUON, compile_only_args, decode_asm, ws_runs_on

if GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
else:
    from dsv4opt.workload.kernels.grouped_moe.ws import gl, gluon  # stand-ins: the kernels stay uncompiled

_DECODE = gl.constexpr(decode_asm())
_N = gl.constexpr(8)  # mma.sync's narrow side: the slot's token in column 0
_UB, _US = gl.constexpr(UNIT_BYTES), gl.constexpr(UNIT_SCALES)  # a unit's value and scale bytes (16 rows x 64 columns)


@dataclass(frozen=True)
class DirectTiles:
    """One GEMM's launch: warps a program, units of 16 rows a warp (rep), K split (each split
    K / 64 / split units a warp)."""

    warps: int
    rep: int
    split: int

    def rows(self) -> int:
        """Weight rows an item (gate/up: half gate, half the same up rows)."""
        return UNIT_ROWS * self.warps * self.rep


_constexpr_function = gluon.constexpr_function if GLUON else (lambda fn: fn)


@_constexpr_function
def _load_layout(W, STEPS):
    """The loads' layout [REP * W * STEPS, 32 lanes, 4 words, 4 bytes]: a warp's units (STEPS a unit
    of rows, one REP after another), each lane its 16 bytes of each."""
    return gl.BlockedLayout([STEPS, 1, 4, 4], [1, 32, 1, 1], [W, 1, 1, 1], [3, 2, 1, 0])


@_constexpr_function
def _acc_layout(W):
    """The accumulator's mma.sync layout: warp w rows w * 16 (then every W * 16 rows)."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])


@gluon.jit
def _unit_row(j, e, n0, I, N16, HALF: gl.constexpr, UP: gl.constexpr):
    """The unit row (expert * N16 + row block, int64) of an item's j-th unit of rows from row n0: gate/up's
    first HALF units gate rows, then the same up rows; down's consecutive."""
    if UP:
        return e * N16 + gl.where(j < HALF, n0 // 16 + j, (I + n0) // 16 + j - HALF)
    return e * N16 + n0 // 16 + j


@gluon.jit
def _weights(p_w, p_s, e, n0, I, N16, kb0, K64, W: gl.constexpr, REP: gl.constexpr, STEPS: gl.constexpr,
             UP: gl.constexpr):
    """The item's A operand [REP * W * 16 rows, STEPS * 64 columns] from K unit kb0, decoded in the
    mma.sync layout; its j-th unit of rows (with warp j % W) is `_unit_row`'s."""
    lv: gl.constexpr = _load_layout(W, STEPS)
    acc_l: gl.constexpr = _acc_layout(W)
    # 16 contiguous bytes a lane a unit along one dimension (one 16-byte load), then split into words
    l16: gl.constexpr = gl.BlockedLayout([STEPS, 1, 16], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    o_r16 = gl.arange(0, REP * W * STEPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, l16)))
    o_l16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, l16)))
    o_b16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, l16)))
    unit16 = _unit_row(o_r16 // STEPS, e, n0, I, N16, REP * W // 2, UP) * K64 + kb0 + o_r16 % STEPS
    b_v = gl.load(p_w + unit16[:, None, None] * _UB + o_l16[None, :, None] * 16 + o_b16[None, None, :])  # [R, 32 lanes, 16 bytes]
    b_v = gl.convert_layout(gl.reshape(b_v, [REP * W * STEPS, 32, 4, 4]), lv, assert_trivial=True)
    ls: gl.constexpr = gl.SliceLayout(2, lv)
    o_rs = gl.arange(0, REP * W * STEPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, ls)))
    o_ls = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, ls)))
    o_bs = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, ls)))
    unit_s = _unit_row(o_rs // STEPS, e, n0, I, N16, REP * W // 2, UP) * K64 + kb0 + o_rs % STEPS
    b_s = gl.load(p_s + unit_s[:, None, None] * _US + (o_ls // 4)[None, :, None] * 4 + o_bs[None, None, :])  # [R, 32, 4]: (group, row half)
    r0, r1 = gl.inline_asm_elementwise(_DECODE, "=r," * 16 + "r,r,r,r,r,r,r,r", [b_v, gl.expand_dims(b_s, 2)],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=16)
    # (rep, warp, step, g, q, s, ih, h, w): row = (rep * W + warp) * 16 + ih * 8 + g,
    # column = step * 64 + s * 16 + w * 8 + q * 2 + h
    b_t = gl.reshape(gl.join(r0, r1), [REP, W, STEPS, 8, 4, 4, 2, 2, 2])
    b_t = gl.reshape(gl.permute(b_t, (0, 1, 6, 3, 2, 5, 8, 4, 7)), [REP * W * 16, STEPS * 64])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    return gl.convert_layout(b_t, a_l, assert_trivial=True)


@gluon.jit
def _product(a, p_tok, W: gl.constexpr, REP: gl.constexpr, STEPS: gl.constexpr):
    """a [rows, STEPS * 64] times the token at p_tok (STEPS * 64 contiguous values) in column 0 of
    mma.sync's 8 -> the rows' fp32 sums [rows] (column 0 of the accumulator)."""
    acc_l: gl.constexpr = _acc_layout(W)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_l, k_width=2)
    o_k = gl.arange(0, STEPS * 64, layout=gl.SliceLayout(1, b_l))
    o_n = gl.arange(0, _N, layout=gl.SliceLayout(0, b_l))
    b_b = gl.load(p_tok + o_k[:, None] + o_n[None, :] * 0, mask=(o_n == 0)[None, :] & (o_k >= 0)[:, None], other=0.0)
    acc = mma_v2(a, b_b, gl.zeros([REP * W * 16, _N], gl.float32, acc_l))
    o_c = gl.arange(0, _N, layout=gl.SliceLayout(0, acc_l))
    return gl.sum(gl.where((o_c == 0)[None, :], acc, 0.0), axis=1)


@gluon.jit
def _moe_up_direct_kernel(p_x, p_ids, p_w, p_s, p_act, p_part, p_count, stride_xm, limit, n_slots, I, N16, K64,
                          TOPK: gl.constexpr, W: gl.constexpr, REP: gl.constexpr, STEPS: gl.constexpr,
                          SPLIT: gl.constexpr):
    """Item (slot, REP * W * 8 act rows, K split): this split's gate and up rows as fp32 partials
    part[split, slot, 2I], a ticket (count[slot, group]); the last of the SPLIT to arrive sums them and
    writes act[slot, n] (x's dtype), and sets the ticket back to 0 for the next call. Another rank's
    slot (id -1) reads expert 0 (its act is never combined)."""
    HALF: gl.constexpr = REP * W // 2
    pid = gl.program_id(0)
    n_grp = I // (HALF * 16)
    sp = pid % SPLIT
    grp = pid // SPLIT % n_grp
    slot = pid // SPLIT // n_grp
    e = gl.maximum(gl.load(p_ids + slot), 0).to(gl.int64)
    n0 = grp * (HALF * 16)
    kb0 = sp * STEPS
    acc_l: gl.constexpr = _acc_layout(W)
    a = _weights(p_w, p_s, e, n0, I, N16, kb0, K64, W, REP, STEPS, True)
    rows = _product(a, p_x + (slot // TOPK).to(gl.int64) * stride_xm + kb0 * 64, W, REP, STEPS)
    o_r = gl.arange(0, 2 * HALF * 16, layout=gl.SliceLayout(1, acc_l))
    p_row = p_part + (sp * n_slots + slot).to(gl.int64) * (2 * I) + gl.where(o_r < HALF * 16, n0 + o_r, I + n0 + o_r - HALF * 16)
    gl.store(p_row, rows)
    gl.thread_barrier()  # every thread's partials issued before the ticket (released at GPU scope)
    ticket = p_count + slot * n_grp + grp
    if gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
        out_l: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
        o_n = gl.arange(0, HALF * 16, layout=out_l)
        b_g = gl.zeros([HALF * 16], gl.float32, out_l)
        b_u = gl.zeros([HALF * 16], gl.float32, out_l)
        for s in gl.static_range(SPLIT):  # L2 reads: other SMs wrote them
            p_split = p_part + (s * n_slots + slot).to(gl.int64) * (2 * I) + n0 + o_n
            b_g += gl.load(p_split, cache_modifier=".cg")
            b_u += gl.load(p_split + I, cache_modifier=".cg")
        b_g = gl.minimum(b_g, limit)
        b_u = gl.minimum(gl.maximum(b_u, -limit), limit)
        b_a = b_g * (1 / (1 + gl.exp(-b_g))) * b_u  # tl.sigmoid's definition
        gl.store(p_act + slot.to(gl.int64) * I + n0 + o_n, b_a.to(p_act.dtype.element_ty))
        gl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _moe_down_direct_kernel(p_act, p_ids, p_gates, p_w, p_s, p_down, p_out, p_count, stride_om, scale, n_slots, d,
                            N16, K64, TOPK: gl.constexpr, W: gl.constexpr, REP: gl.constexpr, STEPS: gl.constexpr,
                            SPLIT: gl.constexpr):
    """Item (slot, REP * W * 16 output rows, K split): down[split, slot, rows] (fp32), then a ticket a
    (token, rows); the last of the token's TOPK x SPLIT arrivals writes out[token, rows] = scale *
    sum_j gates[j] * sum_s down[s, token * TOPK + j, rows] over its slots on this rank (id >= 0), and
    sets the ticket back to 0."""
    ROWS: gl.constexpr = REP * W * 16
    pid = gl.program_id(0)
    n_grp = d // ROWS
    sp = pid % SPLIT
    grp = pid // SPLIT % n_grp
    slot = pid // SPLIT // n_grp
    e = gl.maximum(gl.load(p_ids + slot), 0).to(gl.int64)
    n0 = grp * ROWS
    kb0 = sp * STEPS
    acc_l: gl.constexpr = _acc_layout(W)
    a = _weights(p_w, p_s, e, n0, 0, N16, kb0, K64, W, REP, STEPS, False)
    rows = _product(a, p_act + slot.to(gl.int64) * (K64 * 64) + kb0 * 64, W, REP, STEPS)
    o_r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_l))
    gl.store(p_down + (sp * n_slots + slot).to(gl.int64) * d + n0 + o_r, rows)
    gl.thread_barrier()  # every thread's row issued before the ticket (released at GPU scope)
    tok = slot // TOPK
    ticket = p_count + tok * n_grp + grp
    if gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == TOPK * SPLIT - 1:
        out_l: gl.constexpr = gl.BlockedLayout([4], [32], [W], [0])
        o_n = gl.arange(0, ROWS, layout=out_l)
        b_o = gl.zeros([ROWS], gl.float32, out_l)
        for j in gl.static_range(TOPK):
            at = tok * TOPK + j
            ok = gl.load(p_ids + at) >= 0  # another rank's slot (its rows computed on expert 0): selected away
            b_d = gl.zeros([ROWS], gl.float32, out_l)
            for s in gl.static_range(SPLIT):  # L2 reads: other SMs wrote them
                b_d += gl.load(p_down + (s * n_slots + at).to(gl.int64) * d + n0 + o_n, cache_modifier=".cg")
            b_o += gl.where(ok, gl.load(p_gates + at) * b_d, 0.0)
        gl.store(p_out + tok.to(gl.int64) * stride_om + n0 + o_n, (b_o * scale).to(p_out.dtype.element_ty))
        gl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def direct_shape_ok(d: int, I: int, up: DirectTiles, down: DirectTiles) -> bool:
    """Whether the tiles fit hidden size d and width I (no GPU needed): whole units, I and d divided
    exactly into items, K into whole units a split, and the extents the kernels lay out (a warp's
    units, its K columns, an item's rows) powers of two, at most 32 units a warp issued at once (the
    most compiled without spills, `compile_report`)."""
    if d % UNIT_COLS or I % UNIT_COLS or up.warps not in (4, 8) or down.warps not in (4, 8):
        return False
    k64_up, k64_down = d // UNIT_COLS, I // UNIT_COLS
    if k64_up % up.split or k64_down % down.split:
        return False
    steps_up, steps_down = k64_up // up.split, k64_down // down.split
    return (all(_pow2(n) for n in (up.rep, down.rep, steps_up, steps_down))
            and up.rep * up.warps % 2 == 0 and I % (up.rows() // 2) == 0 and d % down.rows() == 0
            and steps_up * up.rep <= 32 and steps_down * down.rep <= 32)


def direct_supported(x: torch.Tensor, packed13, packed2, up: DirectTiles, down: DirectTiles) -> bool:
    """Whether `direct_routed_experts` covers this call: Triton 3.6's Gluon on an sm_90 GPU, bf16
    tokens with unit stride, folded scales, weights of x's width, and tiles `direct_shape_ok` admits."""
    if not ws_runs_on(x):
        return False
    d, I = x.shape[1], packed13.rows // 2
    return (x.dtype == torch.bfloat16 and x.stride(1) == 1 and packed13.fold and packed2.fold
            and d == packed13.k64 * UNIT_COLS and I == packed2.k64 * UNIT_COLS and packed2.rows == d
            and direct_shape_ok(d, I, up, down))


def direct_routed_experts(x: torch.Tensor, ids: torch.Tensor, gates: torch.Tensor, packed13, packed2, limit: float,
                          scale: float, tickets: torch.Tensor, up: DirectTiles, down: DirectTiles) -> torch.Tensor:
    """out [M, d] in x's dtype = the routed experts' sum for x [M, d] with ids [M, k] (int32, -1 another
    rank's), gates [M, k] fp32: two launches, no host synchronisation (CUDA-graph safe). tickets: int32,
    zero, at least `tickets_needed` (the last arrivals set them back to 0). Caller checks
    `direct_supported` first."""
    M, d = x.shape
    k = ids.shape[1]
    S = M * k
    I = packed13.rows // 2
    out = torch.empty(M, d, device=x.device, dtype=x.dtype)
    up_part = torch.empty(up.split, S, 2 * I, device=x.device, dtype=torch.float32)
    act = torch.empty(S, I, device=x.device, dtype=x.dtype)
    down_part = torch.empty(down.split, S, d, device=x.device, dtype=torch.float32)
    up_tickets = _up_tickets(S, I, up)
    _moe_up_direct_kernel[(S * (I // (up.rows() // 2)) * up.split,)](
        p_x=x, p_ids=ids, p_w=packed13.values, p_s=packed13.scales, p_act=act, p_part=up_part, p_count=tickets,
        stride_xm=x.stride(0), limit=limit, n_slots=S, I=I, N16=packed13.n16, K64=packed13.k64, TOPK=k,
        W=up.warps, REP=up.rep, STEPS=packed13.k64 // up.split, SPLIT=up.split, num_warps=up.warps)
    _moe_down_direct_kernel[(S * (d // down.rows()) * down.split,)](
        p_act=act, p_ids=ids, p_gates=gates, p_w=packed2.values, p_s=packed2.scales, p_down=down_part, p_out=out,
        p_count=tickets[up_tickets:], stride_om=out.stride(0), scale=scale, n_slots=S, d=d, N16=packed2.n16,
        K64=packed2.k64, TOPK=k, W=down.warps, REP=down.rep, STEPS=packed2.k64 // down.split, SPLIT=down.split,
        num_warps=down.warps)
    return out


def _up_tickets(slots: int, I: int, up: DirectTiles) -> int:
    """gate/up's tickets, one a (slot, act-row group), rounded up to 4 so that down's start 16-byte aligned."""
    return -(-slots * (I // (up.rows() // 2)) // 4) * 4


def tickets_needed(slots: int, tokens: int, I: int, d: int, up: DirectTiles, down: DirectTiles) -> int:
    """The tickets `direct_routed_experts` uses: gate/up's (slot, act-row group), then down's (token, row group)."""
    return _up_tickets(slots, I, up) + tokens * (d // down.rows())


def compile_report(I: int = 512, d: int = 4096, topk: int = 6, up: DirectTiles = DirectTiles(4, 1, 4),
                   down: DirectTiles = DirectTiles(4, 1, 1)) -> dict:
    """Compile both kernels for sm_90a (no GPU needed): registers, spills, PTX counts, the SASS of each."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    rows = {}
    for name, kernel, t, k64, sig in (
            ("up", _moe_up_direct_kernel, up, d // 64,
             dict(p_x="*bf16", p_ids="*i32", p_w="*u8", p_s="*u8", p_act="*bf16", p_part="*fp32", p_count="*i32",
                  stride_xm="i32", limit="fp32", n_slots="i32", I="i32", N16="i32", K64="i32")),
            ("down", _moe_down_direct_kernel, down, I // 64,
             dict(p_act="*bf16", p_ids="*i32", p_gates="*fp32", p_w="*u8", p_s="*u8", p_down="*fp32", p_out="*bf16",
                  p_count="*i32", stride_om="i32", scale="fp32", n_slots="i32", d="i32", N16="i32", K64="i32"))):
        const = dict(TOPK=topk, W=t.warps, REP=t.rep, STEPS=k64 // t.split, SPLIT=t.split)
        names = list(sig)
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if sig[n].startswith("*") or n in ("stride_xm", "stride_om", "I", "d", "N16", "K64")}
        src = GluonASTSource(kernel, {**sig, **{c: "constexpr" for c in const}}, const, attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": t.warps})
        ptx = c.asm["ptx"]
        log = ptxas_log(ptx)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
        sass = listing(c)
        ops = opcodes(sass)
        rows[name] = dict(tiles=t, steps=k64 // t.split, registers=int(re.search(r"Used (\d+) registers", log).group(1)),
                          spill_store_bytes=int(spills[0]), spill_load_bytes=int(spills[1]),
                          shared_bytes=c.metadata.shared, mma_sync=len(re.findall(r"mma\.sync", ptx)),
                          mul_bf16x2=len(re.findall(r"mul\.rn\.bf16x2", ptx)),
                          ld_global_v4=len(re.findall(r"ld\.global(?:\.\w+)*\.v4", ptx)),
                          sass_instructions=sum(ops.values()),
                          sass_ops=dict(ops.most_common(16)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--up", default="4,1,4", help="gate/up's warps,rep,split (default: tp4's table row to C = 4)")
    ap.add_argument("--down", default="4,1,1", help="down's warps,rep,split")
    args = compile_only_args(ap)
    up = DirectTiles(*map(int, args.up.split(",")))
    down = DirectTiles(*map(int, args.down.split(",")))
    for name, row in compile_report(up=up, down=down).items():
        print(name, row)


if __name__ == "__main__":
    main()
