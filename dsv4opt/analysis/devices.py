"""Datasheet peaks of the GPUs traces come from, to say what fraction of the device a kernel used.

Dense tensor-core rates (no structured sparsity) per input type, FP32 on CUDA cores / vector units,
and HBM bandwidth, from each vendor's datasheet. A device is found by the name its trace records in
deviceProperties (first matching row wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FP8, BF16, TF32, FP32 = "fp8", "bf16", "tf32", "fp32"  # fp16 runs at the bf16 rate on all of these


@dataclass(frozen=True)
class DevicePeak:
    pattern: str  # regular expression over deviceProperties' name
    label: str
    hbm_gbps: float
    tflops: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def tflops_for(self, kind: str) -> float | None:
        return self.tflops.get(kind)


PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak(r"\bH200\b", "H200 SXM", 4800.0, {FP8: 1979.0, BF16: 989.4, TF32: 494.7, FP32: 66.9},
               "NVIDIA H200 Tensor Core GPU datasheet (HBM3e 4.8 TB/s; compute as H100 SXM)"),
    DevicePeak(r"\bH100\b.*PCIe", "H100 PCIe", 2000.0, {FP8: 1513.0, BF16: 756.0, TF32: 378.0, FP32: 51.2},
               "NVIDIA H100 Tensor Core GPU datasheet, PCIe column"),
    DevicePeak(r"\bH100\b", "H100 SXM", 3350.0, {FP8: 1979.0, BF16: 989.4, TF32: 494.7, FP32: 66.9},
               "NVIDIA H100 Tensor Core GPU datasheet, SXM column (the 80GB HBM3 part)"),
    DevicePeak(r"\bA100\b.*80GB.*PCIe", "A100 80GB PCIe", 1935.0, {BF16: 312.0, TF32: 156.0, FP32: 19.5},
               "NVIDIA A100 Tensor Core GPU datasheet"),
    DevicePeak(r"\bA100\b.*80GB", "A100 80GB SXM", 2039.0, {BF16: 312.0, TF32: 156.0, FP32: 19.5},
               "NVIDIA A100 Tensor Core GPU datasheet"),
    DevicePeak(r"\bA100\b", "A100 40GB", 1555.0, {BF16: 312.0, TF32: 156.0, FP32: 19.5},
               "NVIDIA A100 Tensor Core GPU datasheet, 40GB HBM2 (the A100-PG509-200 of the HTA traces has 40 GB)"),
    DevicePeak(r"\bV100\b", "V100 SXM2", 900.0, {BF16: 125.0, FP32: 15.7},
               "NVIDIA V100 datasheet, SXM2 (FP16 tensor cores; no bf16, its FP16 rate stands for 16-bit inputs)"),
    DevicePeak(r"\bMI300X\b", "MI300X", 5300.0, {FP8: 2614.9, BF16: 1307.4, TF32: 653.7, FP32: 163.4},
               "AMD Instinct MI300X datasheet (dense matrix rates; FP32 vector)"),
)


def peak_of(device: str | None) -> DevicePeak | None:
    """The datasheet row for a trace's device name, None when unknown (no fractions then)."""
    if not device:
        return None
    for row in PEAKS:
        if re.search(row.pattern, device, re.IGNORECASE):
            return row
    return None
