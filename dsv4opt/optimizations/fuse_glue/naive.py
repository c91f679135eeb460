"""What fuse-glue must compute (the float64 definitions of each region) and the eager glue it
replaces, region by region (REPLACES: the functions a profile's source sites show for it)."""

from dsv4opt.workload import baseline, glue
from dsv4opt.workload.kernels import naive

REFERENCES = {
    "hc_split_sum": naive.hc_split_sum, "moe_local": naive.moe_local, "moe_slots": naive.moe_slots,
    "moe_act": naive.moe_act, "moe_combine": naive.moe_combine, "routed_experts": naive.routed_experts,
}
# SGLang's operations for each region: the slots' baseline implementations and the per-slot path's
# pieces (the set-up's slot numbers are one more arange inside routed_experts_sm120).
EAGER = {"hc_split_sum": glue.hc_split_sum_eager, "moe_local": glue.moe_local_eager,
         "moe_slots": glue.moe_slots_eager, "moe_act": glue.moe_act_eager, "moe_combine": glue.moe_combine_eager,
         "routed_experts": baseline.routed_experts_sm120}
REPLACES = tuple(f.__name__ for f in (glue.hc_split_sum_eager, glue.moe_local_eager, glue.moe_slots_eager,
                                      glue.moe_act_eager, glue.moe_combine_eager, baseline.routed_experts_sm120))

__all__ = ["EAGER", "REFERENCES", "REPLACES"]
