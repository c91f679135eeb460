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


def grouped_gemm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """torch._grouped_mm runs on CPUs and on sm_90+ GPUs (bf16); elsewhere use the dense fallback."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (9, 0)
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)


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


class GroupedDense:
    """Stacked per-group weights W: [G, out, in] for grouped GEMMs over rows sorted by group.

    fp8: e4m3 with one fp32 scale per (group, output row), multiplied with
    `torch._scaled_grouped_mm` (sm_90+); otherwise the model dtype with `torch._grouped_mm`.
    """

    def __init__(self, weight: torch.Tensor, fmt: str = BF16):
        self.groups, self.out_features, self.in_features = weight.shape
        self.format = fmt
        self.dtype = weight.dtype
        if fmt == FP8_FORMAT:
            parts = [quantize_rows(w) for w in weight.unbind(0)]  # one group at a time: small transients
            self.w8 = torch.stack([p[0] for p in parts])
            self.w_scale = torch.stack([p[1] for p in parts])  # [G, out]
            self.weight = None
        else:
            self.weight = weight

    def grouped(self, rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """rows: [P, in] sorted by group, offs: [G] int32 cumulative group ends -> [P, out].

        Rows past offs[-1] belong to no group; their outputs are undefined.
        """
        if self.weight is not None:
            return torch._grouped_mm(rows, self.weight.transpose(1, 2), offs=offs)
        r8, r_scale = quantize_rows(rows)
        return torch._scaled_grouped_mm(
            r8, self.w8.transpose(1, 2), r_scale, self.w_scale, offs=offs, out_dtype=rows.dtype
        )

    def stacked(self) -> torch.Tensor:
        """[G, out, in] in the model dtype (for the dense fallback)."""
        if self.weight is not None:
            return self.weight
        return (self.w8.float() * self.w_scale[:, :, None]).to(self.dtype)

    def dense(self, group: int) -> torch.Tensor:
        """The weight group `group` effectively applies, [out, in] float64 (for references)."""
        if self.weight is not None:
            return self.weight[group].double()
        return self.w8[group].double() * self.w_scale[group].double()[:, None]

    @property
    def nbytes(self) -> int:
        if self.weight is not None:
            return self.weight.nbytes
        return self.w8.nbytes + self.w_scale.nbytes

    def fall_back(self) -> None:
        if self.weight is None:
            self.weight = self.stacked()
            self.w8 = self.w_scale = None
            self.format = BF16
