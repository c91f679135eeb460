"""RMS norm, one launch per call: stands for SGLang's `RMSNorm` CUDA kernel (sgl_kernel rmsnorm)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import runs_triton
from dsv4opt.workload.kernels import naive


@triton.jit
def _rms_norm_kernel(p_x, p_w, p_y, stride_x, stride_y, eps,
                     N: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o_n = tl.arange(0, BLOCK)
    m_n = o_n < N
    b_x = tl.load(p_x + i_t * stride_x + o_n, mask=m_n, other=0.0).to(tl.float32)  # [BLOCK]
    b_y = b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=0) / N + eps)
    if HAS_W:
        b_y = b_y * tl.load(p_w + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(p_y + i_t * stride_y + o_n, b_y.to(p_y.dtype.element_ty), mask=m_n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x: [T, N] -> [T, N] in x's dtype; statistics in fp32, weight (any float dtype) applied after."""
    assert x.dim() == 2 and x.stride(1) == 1, x.shape
    if not runs_triton(x):
        return naive.rms_norm(x, weight, eps)
    T, N = x.shape
    y = torch.empty_like(x)
    if T:
        block = triton.next_power_of_2(N)
        _rms_norm_kernel[(T,)](
            p_x=x, p_w=weight if weight is not None else x, p_y=y, stride_x=x.stride(0), stride_y=y.stride(0),
            eps=eps, N=N, BLOCK=block, HAS_W=weight is not None, num_warps=min(16, max(1, block // 256)),
        )
    return y
