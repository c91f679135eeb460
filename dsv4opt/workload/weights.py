"""Weight holders in the formats the production model keeps (and SGLang's sm_120 path reads)."""

from __future__ import annotations

import hashlib
from typing import Callable

import torch

from dsv4opt.workload import quant
from dsv4opt.workload.quant import MXFP4_GROUP
from dsv4opt.workload.kernels.linear import block_fp8_matmul, group_quant_fp8


class Fp8Linear:
    """y = x @ W^T with W in block FP8 (e4m3, one fp32 scale per block x block tile).

    What SGLang's `Fp8LinearMethod` runs on sm_120 (fp8_utils.py:475-477, 833-852): the activations
    quantised per token in groups of `block` values (one kernel), then the block-FP8 Triton GEMM
    (one kernel). The output is in x's dtype.
    """

    def __init__(self, weight: torch.Tensor, block: int, fill_sms: bool = False,
                 gemm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self.out_features, self.in_features = weight.shape
        self.block = block
        self.fill_sms = fill_sms  # tiles chosen to occupy every SM (the Hopper path's DeepGEMM stand-in)
        # gemm(x, w8, w_scale): a production kernel in place of ours (DeepGEMM's, production/deepgemm.py)
        self.gemm = gemm
        self.w8, self.w_scale = quant.quantize_block_fp8(weight, block)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm is not None:
            return self.gemm(x, self.w8, self.w_scale)
        q, s = group_quant_fp8(x, self.block)
        return block_fp8_matmul(q, s, self.w8, self.w_scale, self.block, x.dtype, self.fill_sms)

    def dense(self) -> torch.Tensor:
        """The weight this layer applies, [out, in] float64 on the CPU (for references)."""
        return quant.dequantize_block_fp8(self.w8.cpu(), self.w_scale.cpu(), self.block)

    @property
    def nbytes(self) -> int:
        return self.w8.nbytes + self.w_scale.nbytes


class Mxfp4Experts:
    """Expert weight sets [R, N, K] in MXFP4: e2m1 nibbles [R, N, K/2] and fp32 group scales [R, N, K/32].
    `marlin`: the same sets in Marlin's layout (production/marlin.py's MarlinExperts) where the Hopper
    path runs SGLang's Marlin MoE, else None."""

    marlin = None

    def __init__(self, sets: int, out_features: int, in_features: int, generator: torch.Generator, device):
        self.packed, self.scales = quant.random_mxfp4((sets, out_features, in_features), in_features, generator, device)

    @classmethod
    def drawn(cls, seeds: list[int], out_features: int, in_features: int, device,
              rows: list[slice] | None = None, cols: slice | None = None) -> "Mxfp4Experts":
        """Random sets, one per seed, each from a generator of its own: a set depends on its seed only,
        so a rank holding some experts has exactly the sets a process holding all of them has. Each
        set is drawn whole and cut to `rows` (slices of the output features, concatenated) or `cols`
        (a slice of the input features, whole MXFP4 groups): a rank's tensor-parallel slice."""
        assert cols is None or (cols.start % MXFP4_GROUP == 0 and cols.stop % MXFP4_GROUP == 0), cols

        def cut(packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if rows is not None:
                packed, scales = torch.cat([packed[r] for r in rows]), torch.cat([scales[r] for r in rows])
            if cols is not None:
                packed = packed[:, cols.start // 2 : cols.stop // 2]
                scales = scales[:, cols.start // MXFP4_GROUP : cols.stop // MXFP4_GROUP]
            return packed.contiguous(), scales.contiguous()

        sets = [cut(*quant.random_mxfp4((out_features, in_features), in_features,
                                        torch.Generator(device=device).manual_seed(s), device)) for s in seeds]
        experts = cls.__new__(cls)
        experts.packed, experts.scales = torch.stack([p for p, _ in sets]), torch.stack([q for _, q in sets])
        return experts

    @classmethod
    def of(cls, packed: torch.Tensor, scales: torch.Tensor) -> "Mxfp4Experts":
        """Weight sets held in existing tensors (no copy)."""
        experts = cls.__new__(cls)
        experts.packed, experts.scales = packed, scales
        return experts

    def dense(self, index: int) -> torch.Tensor:
        """Weight set `index` as [N, K] float64 on the CPU."""
        return quant.dequantize_mxfp4(self.packed[index].cpu(), self.scales[index].cpu())

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + (self.marlin.nbytes if self.marlin is not None else 0)


def derived_seed(seed: int, *keys) -> int:
    """A seed for one named part of a workload (an expert of a layer): stable across runs and machines."""
    digest = hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
