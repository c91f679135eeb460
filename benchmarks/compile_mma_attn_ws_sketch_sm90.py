"""Feasibility sketch for a warp-specialised FP8 loop (issue 13, step 2): not a kernel of the package.

    PYTHONPATH=. python3 benchmarks/compile_mma_attn_ws_sketch_sm90.py    # Triton 3.6, no GPU

Compiles, for sm_90a with Triton 3.6's Gluon, the building blocks the warp-specialised variant
needs, in one gl.warp_specialize: a 4-warp producer partition that gathers u8 rows by cp.async
into staging, dequantises them (e4m3 -> bf16, scales left out) into a ring of two [32, 512] bf16
tiles and signals `full` mbarriers; the 8-warp default partition that waits on them, runs the QK
and PV wgmma (a stand-in softmax: exp2, no running max, no masks) and signals `empty`. No indices,
no scales, no second cache, no partials: what it answers is whether the pieces lower together
(setmaxnreg per partition, mbarriers, cp.async in a worker, wgmma in the default partition) and
what registers and shared memory they take. Prints ptxas's figures and what the PTX holds.
"""
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, mbarrier

@gluon.jit
def _producer(p_kv8, ring, staging, full, empty, NT: gl.constexpr, BK: gl.constexpr, D: gl.constexpr):
    """NT tiles of BK rows of p_kv8 [NT * BK, D] u8 -> ring slot t % 2 [BK, D] bf16, once the
    consumer has released it (`empty`), then `full`. One staging buffer: no gather overlaps the
    dequantisation here (the real variant would keep two)."""
    L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # 4 warps
    o_r = gl.arange(0, BK, layout=gl.SliceLayout(1, L))
    o_c = gl.arange(0, 64, layout=gl.SliceLayout(0, L))
    for t in range(NT):
        slot = t % 2
        mbarrier.wait(empty.index(slot), ((t // 2) & 1) ^ 1)
        for j in gl.static_range(D // 64):
            cp.async_copy_global_to_shared(staging.index(j), p_kv8 + ((t * BK + o_r) * D)[:, None] + (j * 64 + o_c)[None, :])
        cp.commit_group()
        cp.wait_group(0)
        for j in gl.static_range(D // 64):
            b = staging.index(j).load(L).to(gl.float8e4nv, bitcast=True).to(gl.float32)
            ring.index(slot).slice(j * 64, 64, dim=1).store(b.to(gl.bfloat16))
        fence_async_shared()
        mbarrier.arrive(full.index(slot))

@gluon.jit
def _consumer(q_smem, ring, full, empty, p_o, NT: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, D: gl.constexpr):
    """QK [BH, BK] and PV [BH, D] per ring slot as it fills; the accumulator to p_o [BH, D] fp32."""
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
    acc = gl.zeros([BH, D], gl.float32, layout=O_MMA)
    s0 = gl.zeros([BH, BK], gl.float32, layout=S_MMA)
    for t in range(NT):
        slot = t % 2
        mbarrier.wait(full.index(slot), (t // 2) & 1)
        s = warpgroup_mma(q_smem, ring.index(slot).permute((1, 0)), s0, use_acc=False)
        p = gl.convert_layout(gl.exp2(s).to(gl.bfloat16), P_DOT)
        acc = warpgroup_mma(p, ring.index(slot), acc)
        mbarrier.arrive(empty.index(slot))
    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, O_MMA))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, O_MMA))
    gl.store(p_o + o_h[:, None] * D + o_d[None, :], acc)

@gluon.jit
def ws_kernel(p_q, p_kv8, p_o, NT: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, D: gl.constexpr):
    """q [BH, D] bf16 into shared memory once; the ring, staging and barriers; then the partitions
    (producer: 4 warps at 40 registers; the default 8 warps get the rest)."""
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ROW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, LOAD))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BH, D], SMEM, gl.load(p_q + o_h[:, None] * D + o_d[None, :]))
    ring = gl.allocate_shared_memory(gl.bfloat16, [2, BK, D], SMEM)
    staging = gl.allocate_shared_memory(gl.uint8, [D // 64, BK, 64], ROW2)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        # count 1: Gluon lowers arrive to a partition-wide bar.sync and one thread's arrive (an earlier
        # version of this sketch set 128 and 256, which would never complete)
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([(_consumer, (q_smem, ring, full, empty, p_o, NT, BH, BK, D)),
                        (_producer, (p_kv8, ring, staging, full, empty, NT, BK, D))], [4], [40])

def main() -> None:
    fn = ws_kernel
    cons = dict(NT=10, BH=64, BK=32, D=512)
    sig = {"p_q": "*bf16", "p_kv8": "*u8", "p_o": "*fp32", **{k: "constexpr" for k in cons}}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    c = triton.compile(GluonASTSource(fn, sig, cons, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = c.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_text(ptx)
        from triton.backends.nvidia.compiler import get_ptxas
        d = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
        print(d.returncode, d.stderr[-1500:])
    regs = sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    print(f"Triton {triton.__version__}, sm_90a: shared memory {c.metadata.shared} B; setmaxnreg {regs}; "
          f"{len(re.findall('wgmma.mma_async', ptx))} wgmma.mma_async, {len(re.findall('mbarrier', ptx))} mbarrier ops, "
          f"{len(re.findall('cp.async.c', ptx))} cp.async")


if __name__ == "__main__":
    main()
