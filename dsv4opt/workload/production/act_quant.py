"""Activations to e4m3 in groups of 128 with power-of-two (UE8M0) fp32 scales: what SGLang 0.5.23
quantises a dense FP8 linear's input with before DeepGEMM on sm_90.

`apply_fp8_linear` on sm_90 with the checkpoint's power-of-two activation scales (Fp8Config sets
act_scale_ue8m0: srt/layers/quantization/fp8.py:550) calls
`sglang_per_token_group_quant_fp8(x, 128, scale_ue8m0=True)` (fp8_utils.py:1559-1563): row-major
fp32 scales [M, K/128], scale = 2^ceil(log2(max(amax, 1e-10) / 448)), q = clamp(x / scale)
(kernels/ops/quantization/fp8_kernel.py:214-220; SGLang runs its JIT `per_token_group_quant_8bit_v2`
for it). DeepGEMM then reads the fp32 scales and lays them out for TMA itself.

`quantize_groups_ue8m0` is the plain-torch definition; `group_quant_fp8_ue8m0` the Triton kernel
that stands in for SGLang's JIT one (one program per token and group).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.formats import FP8_MAX
from dsv4opt.tritonlib import interpreted, round_to_e4m3, runs_triton
from dsv4opt.workload.quant import FP8, SCALE_EPS

_FP8_MAX = tl.constexpr(FP8_MAX)


def quantize_groups_ue8m0(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], fp32 power-of-two scales [M, K // group]); in x's precision."""
    M, K = x.shape
    assert K % group == 0, (K, group)
    g = x.reshape(M, K // group, group)
    raw = g.abs().amax(dim=-1).clamp(min=SCALE_EPS) / FP8_MAX
    scale = torch.exp2(torch.ceil(torch.log2(raw)))
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(M, K), scale.float()


@triton.jit
def _group_quant_ue8m0_kernel(p_x, p_q, p_s, stride_x, stride_q, stride_s, eps,
                              GROUP: tl.constexpr, EMULATE: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_g = tl.program_id(1)
    o_k = i_g * GROUP + tl.arange(0, GROUP)
    b_x = tl.load(p_x + i_t * stride_x + o_k).to(tl.float32)  # [GROUP]
    b_s = tl.maximum(tl.max(tl.abs(b_x), axis=0), eps) / _FP8_MAX
    b_s = tl.exp2(tl.ceil(tl.log2(b_s)))
    b_q = round_to_e4m3(tl.clamp(b_x / b_s, -_FP8_MAX, _FP8_MAX), EMULATE)
    tl.store(p_q + i_t * stride_q + o_k, b_q.to(p_q.dtype.element_ty))
    tl.store(p_s + i_t * stride_s + i_g, b_s)


def group_quant_fp8_ue8m0(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (K a multiple of group, rows contiguous) -> (e4m3 [M, K], fp32 scales [M, K // group])."""
    if not runs_triton(x):
        return quantize_groups_ue8m0(x.float(), group)
    M, K = x.shape
    assert K % group == 0 and x.stride(1) == 1, (x.shape, group)
    q = torch.empty(M, K, device=x.device, dtype=FP8)
    s = torch.empty(M, K // group, device=x.device, dtype=torch.float32)
    if M:
        _group_quant_ue8m0_kernel[(M, K // group)](
            p_x=x, p_q=q, p_s=s, stride_x=x.stride(0), stride_q=q.stride(0), stride_s=s.stride(0), eps=SCALE_EPS,
            GROUP=group, EMULATE=interpreted(), num_warps=1,
        )
    return q, s
