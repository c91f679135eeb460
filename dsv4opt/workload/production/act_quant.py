"""Activations to e4m3 in groups of 128 with power-of-two (UE8M0) fp32 scales: what SGLang 0.5.23
quantises a dense FP8 linear's input with before DeepGEMM on sm_90.

`apply_fp8_linear` on sm_90 with the checkpoint's power-of-two activation scales (Fp8Config sets
act_scale_ue8m0: srt/layers/quantization/fp8.py:550) calls
`sglang_per_token_group_quant_fp8(x, 128, scale_ue8m0=True)` (fp8_utils.py:1559-1563): row-major
fp32 scales [M, K/128], scale = 2^ceil(log2(max(amax, 1e-10) / 448)), q = clamp(x / scale)
(kernels/ops/quantization/fp8_kernel.py:214-220; SGLang runs its JIT `per_token_group_quant_8bit_v2`
for it). DeepGEMM then reads the fp32 scales and lays them out for TMA itself.

`quantize_groups_ue8m0` is the plain-torch definition; `group_quant_fp8_ue8m0` the Triton kernel
that stands in for SGLang's JIT one (the workload's group quant, kernels/linear.py, with POW2).
"""

from __future__ import annotations

import torch

from dsv4opt.formats import FP8_MAX
from dsv4opt.workload.kernels.linear import launch_group_quant
from dsv4opt.workload.quant import FP8, SCALE_EPS


def quantize_groups_ue8m0(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], fp32 power-of-two scales [M, K // group]); in x's precision."""
    M, K = x.shape
    assert K % group == 0, (K, group)
    g = x.reshape(M, K // group, group)
    raw = g.abs().amax(dim=-1).clamp(min=SCALE_EPS) / FP8_MAX
    scale = torch.exp2(torch.ceil(torch.log2(raw)))
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(M, K), scale.float()


def group_quant_fp8_ue8m0(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (K a multiple of group, rows contiguous) -> (e4m3 [M, K], fp32 scales [M, K // group]):
    the workload's group quant kernel with power-of-two scales."""
    return launch_group_quant(x, group, True, quantize_groups_ue8m0)
