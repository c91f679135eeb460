"""grouped-moe: the routed experts grouped by expert on tensor cores, other ranks' slots skipped."""

from dsv4opt.optimizations.grouped_moe.check import check
from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts

IMPLEMENTATIONS = {"routed_experts": grouped_routed_experts}

__all__ = ["IMPLEMENTATIONS", "check", "grouped_routed_experts"]
