"""The warp-specialised weight-stream probe (benchmarks/probe_grouped_moe_ws.py) decodes what it says,
checked on the CPU without running the kernel: its inline PTX (the warp-specialised gate/up
kernel's `decode_asm`, one copy for both; interpreted here, op by op) turns
each lane's 16 value bytes and scale word into the bf16 values MXFP4 dequantisation gives, and the
kernel's join / permute / reshape of those registers puts each value at its row and column of a
K step's [128, 128] tile (gate rows, then up rows, as `_up_step` stacks them). Also the register
cap a variant launches with. The kernel itself and its timing need an H200 (--check there)."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from dsv4opt.workload.kernels.grouped_moe.layout import packed_experts
from dsv4opt.workload.quant import dequantize_mxfp4
from dsv4opt.workload.weights import Mxfp4Experts
from tests.benchmark_files import load_script

M32 = 0xFFFFFFFF


def _probe():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    return load_script("probe_grouped_moe_ws")


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bf16x2_mul(a: int, b: int) -> int:
    """mul.rn.bf16x2 on two packed words (the products here are exact bf16, so fp32 bits truncated)."""
    lo, hi = (struct.unpack("<I", struct.pack("<f", _f32((a >> s & 0xFFFF) << 16) * _f32((b >> s & 0xFFFF) << 16)))[0]
              for s in (0, 16))
    return (lo >> 16) | (hi & 0xFFFF0000)


def _run_asm(asm: str, inputs: dict[int, int]) -> dict[int, int]:
    """The decode's PTX subset on one lane: $n operands and named .reg temporaries, 32-bit words."""
    r = {f"${k}": v for k, v in inputs.items()}
    val = lambda a: int(a, 16) if a.startswith("0x") else (int(a) if a.isdigit() else r[a])  # noqa: E731
    for line in asm.splitlines():
        m = re.match(r"(\w+(?:\.\w+)*) (\$?\w+), (\$?\w+), (\$?\w+)(?:, (\w+))?;", line.strip())
        if not m:
            assert line.strip() in ("{", "}") or line.strip().startswith(".reg"), f"not interpreted: {line!r}"
            continue
        op, d, a, b, c = m.groups()
        a, b = val(a), val(b)
        if op == "prmt.b32":
            src = a | (b << 32)
            r[d] = sum(((src >> (8 * ((int(c, 16) >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "mul.rn.bf16x2":
            r[d] = _bf16x2_mul(a, b)
        else:
            r[d] = {"and.b32": a & b, "or.b32": a | b, "shl.b32": (a << min(b, 32)) & M32, "shr.b32": a >> min(b, 32),
                    "add.u32": (a + b) & M32}[op]  # min: every entry is evaluated, masks included
    return r


def test_the_ptx_and_the_register_permutation_give_the_dequantised_step_tile():
    probe = _probe()
    I, K = 64, 256  # one item (64 gate + 64 up rows) of two K steps
    w = Mxfp4Experts(2, 2 * I, K, torch.Generator().manual_seed(0), "cpu")
    packed = packed_experts(w)
    assert packed.fold
    ref = dequantize_mxfp4(w.packed, w.scales, torch.float32)  # [2, 2I, K]
    vals = packed.values.view(torch.int32).reshape(2, packed.n16, packed.k64, 32, 4)  # lane words
    words = packed.scales.view(torch.int32).reshape(2, packed.n16, packed.k64, 8)  # one scale word a g
    e, n0, step = 1, 0, 1
    out = torch.zeros(16, 8, 4, 4, 4, 2)  # the kernel's registers: unit (kb * 8 + row unit), g, q, s, b, w
    for i in range(16):
        kb, un = divmod(i, 8)
        rb = (n0 // 16 if un < 4 else (I + n0) // 16) + un % 4  # the producer's unit rows
        for lane in range(32):
            unit = (e, rb, 2 * step + kb)
            ins = {16 + s: int(vals[unit][lane, s]) & M32 for s in range(4)} | {20: int(words[unit][lane // 4]) & M32}
            regs = _run_asm(probe.DECODE_ASM.value, ins)
            for k in range(16):  # $0-$7: r0, $8-$15: r1; register k holds elements 2k, 2k + 1 (low half first)
                for h in range(2):
                    bits = (regs[f"${k}"] >> (16 * h)) & 0xFFFF
                    el = 2 * (k % 8) + h  # element (s, b) = s * 4 + b
                    out[i, lane // 4, lane % 4, el // 4, el % 4, k // 8] = _f32(bits << 16)
    # the kernel's join / reshape / permute / reshape
    tile = out.reshape(2, 8, 8, 4, 4, 2, 2, 2).permute(1, 5, 2, 0, 4, 7, 3, 6).reshape(128, 128)
    rows = torch.cat([torch.arange(n0, n0 + 64), torch.arange(I + n0, I + n0 + 64)])
    torch.testing.assert_close(tile, ref[e][rows][:, step * 128:(step + 1) * 128], rtol=0, atol=0)


def test_register_cap_fits_the_programs_an_sm():
    probe = _probe()
    # (stages, consumer warpgroups, producer warps, programs an SM, in flight): the producer pads to a warpgroup
    assert probe._launch_opts((4, 1, 1, 1, 0)) == {"num_warps": 4}  # 8 warps alone: no cap
    assert probe._launch_opts((4, 1, 1, 2, 0)) == {"num_warps": 4, "maxnreg": 128}
    assert probe._launch_opts((4, 2, 4, 2, 1)) == {"num_warps": 8, "maxnreg": 80}
    assert len(probe.variants(type("A", (), dict(stages="4,6", consumers="1,2", producers="1", ctas="2",
                                                   inflight="0,1"))())) == 8
