"""Linear layers of the sm_120 path.

- `group_quant_fp8` stands for SGLang's `per_token_group_quant_fp8` Triton kernel
  (quantization/fp8_kernel.py): activations to e4m3 in groups of `group` values per token.
- `block_fp8_matmul` stands for SGLang's `w8a8_block_fp8_matmul` Triton kernel, which sm_120 is
  forced onto (fp8_utils.py:475-477, 833-852): e4m3 x e4m3 tiles, fp32 accumulation, each K tile
  scaled by its activation group scale and its weight block scale.
- `mm_out_fp32` is SGLang's `linear_bf16_fp32` (jit_kernel/dsv4/gemm.py:16-24; the router and the
  compressor's kv/score projection): a bf16 cuBLAS GEMM that writes fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import interpreted, on_gpu, quantize_e4m3, runs_triton, sm_count
from dsv4opt.workload import quant
from dsv4opt.workload.kernels import naive


@triton.jit
def _group_quant_fp8_kernel(p_x, p_q, p_s, stride_x, stride_q, stride_s, eps,
                            GROUP: tl.constexpr, EMULATE: tl.constexpr, POW2: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_g = tl.program_id(1)
    o_k = i_g * GROUP + tl.arange(0, GROUP)
    b_x = tl.load(p_x + i_t * stride_x + o_k).to(tl.float32)  # [GROUP]
    b_q, b_s = quantize_e4m3(b_x, eps, EMULATE, POW2)
    tl.store(p_q + i_t * stride_q + o_k, b_q.to(p_q.dtype.element_ty))
    tl.store(p_s + i_t * stride_s + i_g, b_s)


def group_quant_fp8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], fp32 scales [M, K // group]); one program per (token, group)."""
    return launch_group_quant(x, group, False, quant.quantize_groups_fp8)


def launch_group_quant(x: torch.Tensor, group: int, pow2: bool, reference) -> tuple[torch.Tensor, torch.Tensor]:
    """The group quant kernel, its scales rounded up to powers of two (UE8M0) with `pow2`;
    `reference` (plain torch, the same function) where Triton cannot take x."""
    if not runs_triton(x):
        return reference(x.float(), group)
    M, K = x.shape
    assert K % group == 0 and x.stride(1) == 1, (x.shape, group)
    q = torch.empty(M, K, device=x.device, dtype=quant.FP8)
    s = torch.empty(M, K // group, device=x.device, dtype=torch.float32)
    if M:
        _group_quant_fp8_kernel[(M, K // group)](
            p_x=x, p_q=q, p_s=s, stride_x=x.stride(0), stride_q=q.stride(0), stride_s=s.stride(0),
            eps=quant.SCALE_EPS, GROUP=group, EMULATE=interpreted(), POW2=pow2, num_warps=1,
        )
    return q, s


@triton.jit
def _block_fp8_matmul_kernel(p_a, p_b, p_c, p_as, p_bs, M, N,
                             stride_am, stride_bn, stride_cm, stride_asm, stride_bsn,
                             K: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m = o_m < M
    m_n = o_n < N
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # [BM, BN]
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < K
        b_a = tl.load(p_a + o_m[:, None].to(tl.int64) * stride_am + o_k[None, :],
                      mask=m_m[:, None] & m_k[None, :], other=0.0)  # [BM, BK] e4m3
        b_b = tl.load(p_b + o_n[:, None].to(tl.int64) * stride_bn + o_k[None, :],
                      mask=m_n[:, None] & m_k[None, :], other=0.0)  # [BN, BK] e4m3
        b_as = tl.load(p_as + o_m * stride_asm + k0 // BLOCK_K, mask=m_m, other=0.0)  # [BM]
        b_bs = tl.load(p_bs + (o_n // BLOCK_W) * stride_bsn + k0 // BLOCK_W, mask=m_n, other=0.0)  # [BN]
        if DOT == 0:  # fp8 tensor cores (K tiles of 32 and more)
            b_p = tl.dot(b_a, tl.trans(b_b))
        elif DOT == 1:  # bf16 tensor cores for narrower tiles: e4m3 -> bf16 is exact
            b_p = tl.dot(b_a.to(tl.bfloat16), tl.trans(b_b.to(tl.bfloat16)))
        else:  # the interpreter: exact in fp32
            b_p = tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)))
        b_acc += b_p * b_as[:, None] * b_bs[None, :]
    tl.store(p_c + o_m[:, None].to(tl.int64) * stride_cm + o_n[None, :], b_acc.to(p_c.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])


def block_fp8_matmul(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                     block: int, out_dtype: torch.dtype, fill_sms: bool = False) -> torch.Tensor:
    """a: [M, K] e4m3 with group scales a_scale [M, K/block]; w: [N, K] e4m3 with block scales
    w_scale [ceil(N/block), K/block] -> a @ w^T: [M, N] in out_dtype (fp32 accumulation).

    `fill_sms`: N tiles narrowed (to 32 at the least) until the grid covers the GPU's SMs, as the
    Hopper path's stand-in for DeepGEMM's `fp8_gemm_nt`, whose heuristics choose block sizes so a
    decode-sized GEMM occupies every SM; the sm_120 path keeps the fixed tiles it was measured with."""
    if not runs_triton(a):
        return naive.block_fp8_matmul(a, a_scale, w, w_scale, block).to(out_dtype)
    M, K = a.shape
    N = w.shape[0]
    assert w.shape[1] == K and K % block == 0 and a.stride(1) == 1 and w.stride(1) == 1
    c = torch.empty(M, N, device=a.device, dtype=out_dtype)
    block_m = min(64, max(16, triton.next_power_of_2(M)))
    block_n = min(128, max(16, triton.next_power_of_2(N)))
    if fill_sms and on_gpu(a):
        while block_n > 32 and triton.cdiv(M, block_m) * triton.cdiv(N, block_n) < sm_count(a.device):
            block_n //= 2
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    if M:
        _block_fp8_matmul_kernel[grid](
            p_a=a, p_b=w, p_c=c, p_as=a_scale, p_bs=w_scale, M=M, N=N,
            stride_am=a.stride(0), stride_bn=w.stride(0), stride_cm=c.stride(0),
            stride_asm=a_scale.stride(0), stride_bsn=w_scale.stride(0),
            K=K, BLOCK_W=block, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block,
            DOT=2 if interpreted() else (0 if block >= 32 else 1),
            num_warps=4, num_stages=3,
        )
    return c


def mm_out_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] in the model dtype -> x @ w^T: [M, N] fp32; cuBLAS with an fp32 output on
    a GPU (`torch.mm(..., out_dtype=torch.float32)`, as SGLang's `linear_bf16_fp32` calls it)."""
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return naive.mm_out_fp32(x, w)
