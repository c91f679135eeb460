"""The definition grouped-moe is checked against: the `routed_experts` slot's float64 reference."""

from dsv4opt.workload.kernels.naive import routed_experts

__all__ = ["routed_experts"]
