"""OpenAI's triton_kernels MoE path (bf16 x MXFP4 `matmul` with ragged metadata) on grouped-moe's
inputs, as the bench's anchor. Not a dependency: it is imported when importable (put its package,
upstream triton-lang/triton d5689405 `python/triton_kernels/triton_kernels`, on PYTHONPATH).

The same weights: each `Mxfp4Experts` set handed to it as its packed e2m1 bytes (K-major, the
layout its Hopper swizzle expects) and the fp32 scales as e8m0 bytes, gate and up columns
interleaved as its fused SwiGLU reads them, swizzled once with its Hopper value and scale layouts.
Its SwiGLU is GPT-OSS's, silu(min(g, limit)) * (clamp(u, -limit, limit) + 1) with alpha 1, not the
model's: `reference` is the float64 definition of what it computes, the check it is held to.

A call: routing metadata from the local ids in fixed-shape torch operations (a stable sort by
expert, a histogram, its `make_ragged_tensor_metadata`), gate/up with the gather and fused SwiGLU,
down with the gates as its per-row scale and the scatter to slot rows, and the top-k sum in torch.
"""

from __future__ import annotations

import torch

from dsv4opt.workload.kernels.grouped_moe import e8m0
from dsv4opt.workload import quant


def available() -> bool:
    try:
        import triton_kernels.matmul  # noqa: F401
    except Exception:  # noqa: BLE001  (absent, or present and broken: no anchor either way)
        return False
    return True


def _swizzled(packed: torch.Tensor, scales: torch.Tensor, cols: torch.Tensor | None):
    """[R, N, K/2] bytes + [R, N, K/32] fp32 -> its (value, scale) tensors for w [R, K, N]."""
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    if cols is not None:
        packed, scales = packed[:, cols], scales[:, cols]
    w = packed.transpose(1, 2)  # [R, K/2, N], K contiguous
    s = e8m0(scales).transpose(1, 2)  # [R, K/32, N]
    value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    return (convert_layout(wrap_torch_tensor(w, dtype=FP4), value_layout, **value_opts),
            convert_layout(wrap_torch_tensor(s), scale_layout, **scale_opts))


class TritonKernelsMoe:
    """The anchor prepared for one rank's weights: `__call__` has the routed_experts slot's signature."""

    def __init__(self, w13, w2, limit: float):
        import triton_kernels.swiglu
        from triton_kernels.matmul import FnSpecs, FusedActivation, PrecisionConfig

        R, two_i, _ = w13.packed.shape
        I = two_i // 2
        dev = w13.packed.device
        inter = torch.stack([torch.arange(I, device=dev), I + torch.arange(I, device=dev)], dim=1).reshape(-1)
        self.w1, s1 = _swizzled(w13.packed, w13.scales, inter)
        self.w2, s2 = _swizzled(w2.packed, w2.scales, None)
        self.pc1 = PrecisionConfig(b_mx_scale=s1)
        self.pc2 = PrecisionConfig(b_mx_scale=s2)
        self.act = FusedActivation(FnSpecs("swiglu", triton_kernels.swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                                   (1.0, limit))
        self.experts = R

    def route(self, local_ids: torch.Tensor, gates: torch.Tensor):
        """Its routing inputs, fixed shapes: (metadata, gather rows, scatter rows, per-row gates, valid)."""
        from triton_kernels.tensor import make_ragged_tensor_metadata

        M, k = local_ids.shape
        flat = local_ids.reshape(-1).long()
        valid = flat >= 0
        key = torch.where(valid, flat, self.experts)
        order = torch.argsort(key, stable=True)
        sizes = torch.zeros(self.experts + 1, dtype=torch.int32, device=flat.device)
        sizes.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
        meta = make_ragged_tensor_metadata(sizes[: self.experts], flat.numel())
        return meta, (order // k).int(), order.int(), gates.reshape(-1)[order].float(), valid

    def gemms(self, x, routed):
        """Its two GEMMs on routed inputs: gate/up with the gather and fused SwiGLU, down with the
        gates as per-row scale and the scatter to slot rows -> [M * k, d] (other ranks' rows unwritten)."""
        from triton_kernels.matmul import matmul

        meta, gather, scatter, g, _ = routed
        h = matmul(x, self.w1, None, meta, gather_indx=gather, precision_config=self.pc1, fused_activation=self.act)
        return matmul(h, self.w2, None, meta, scatter_indx=scatter, precision_config=self.pc2, gammas=g)

    def routed_gemms(self, x, local_ids, gates, w13=None, w2=None, limit=None, scale=None):
        """Its routing and two GEMMs, the top-k sum left out (what the bench's table times)."""
        return self.gemms(x, self.route(local_ids, gates))

    def __call__(self, x, local_ids, gates, w13, w2, limit, scale):
        M, k = local_ids.shape
        routed = self.route(local_ids, gates)
        y = self.gemms(x, routed)
        y = torch.where(routed[4][:, None], y.reshape(M * k, -1).float(), 0.0)  # other ranks' rows are never written
        return (scale * y.view(M, k, -1).sum(1)).to(x.dtype)


def reference(x, local_ids, gates, w13, w2, limit: float, scale: float) -> torch.Tensor:
    """What the anchor computes, in float64: the slot's definition with its SwiGLU (+1 on up)."""
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(local_ids[local_ids >= 0]).tolist():
        m, j = torch.nonzero(local_ids == e, as_tuple=True)
        w_up = quant.dequantize_mxfp4(w13.packed[e], w13.scales[e])
        w_down = quant.dequantize_mxfp4(w2.packed[e], w2.scales[e])
        h = x[m].double() @ w_up.t()
        I = h.shape[1] // 2
        gate, up = h[:, :I].clamp(max=limit), h[:, I:].clamp(-limit, limit)
        act = torch.nn.functional.silu(gate) * (up + 1.0)
        out.index_add_(0, m, gates[m, j].double()[:, None] * (act @ w_down.t()))
    return scale * out
