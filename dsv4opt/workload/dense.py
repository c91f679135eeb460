"""Dense projections in the weight format the device can run closest to production.

Production DeepSeek-V4-Flash keeps its non-expert weights in FP8 e4m3. Decode is bound by the bytes
of weights read, so on a GPU with FP8 tensor cores (sm_89+) a projection keeps its weight as e4m3
with one fp32 scale per output row and multiplies with `torch._scaled_mm`, quantising the
activations per token on the fly; elsewhere (CPU, older GPUs, tests) it stays in the model dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

BF16, FP8_FORMAT = "bf16", "fp8"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], fp32 scale [M]) with x ~= q * scale[:, None]; no host sync."""
    scale = x.detach().abs().amax(dim=-1).float().clamp(min=1e-12) / FP8_MAX
    q = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor-core matmuls exist (sm_89+) and this torch exposes them."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class Dense:
    """y = x @ W^T for W: [out, in], stored in the model dtype or as fp8 e4m3 with row scales."""

    def __init__(self, weight: torch.Tensor, fmt: str = BF16):
        self.out_features, self.in_features = weight.shape
        self.format = fmt
        if fmt == FP8_FORMAT:
            self.w8, self.w_scale = quantize_rows(weight)
            self.weight = None
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in] -> [..., out] in x's dtype."""
        if self.weight is not None:
            return F.linear(x, self.weight)
        lead = x.shape[:-1]
        x8, x_scale = quantize_rows(x.reshape(-1, self.in_features))
        y = torch._scaled_mm(
            x8, self.w8.t(), scale_a=x_scale[:, None], scale_b=self.w_scale[None, :], out_dtype=x.dtype
        )
        return y.reshape(*lead, self.out_features)

    def dense(self) -> torch.Tensor:
        """The weight the projection effectively applies, [out, in] float64 (for references)."""
        if self.weight is not None:
            return self.weight.double()
        return self.w8.double() * self.w_scale.double()[:, None]

    @property
    def nbytes(self) -> int:
        if self.weight is not None:
            return self.weight.nbytes
        return self.w8.nbytes + self.w_scale.nbytes

    def fall_back(self, dtype: torch.dtype) -> None:
        """Keep the dequantised weight in `dtype` (when fp8 cannot run this shape)."""
        if self.weight is None:
            self.weight = (self.w8.float() * self.w_scale[:, None]).to(dtype)
            self.w8 = self.w_scale = None
            self.format = BF16
