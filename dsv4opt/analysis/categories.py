"""The fixed category names every profile uses, so profiles stay comparable."""

from dsv4opt.display import MISSING

ATTENTION = "attention"
GEMM_TC = "gemm_tc"
GEMM_FP32_SIMT = "gemm_fp32_simt"
MOE = "moe"
COMMUNICATION = "communication"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
COPY = "copy"
TOPK_SORT = "topk_sort"
OTHER = "other"

CATEGORIES = (
    ATTENTION,
    GEMM_TC,
    GEMM_FP32_SIMT,
    MOE,
    COMMUNICATION,
    ELEMENTWISE,
    REDUCTION,
    COPY,
    TOPK_SORT,
    OTHER,
)

GLUE = (ELEMENTWISE, REDUCTION, COPY, TOPK_SORT, OTHER)
# An optimisation's target may name the glue categories together.
GLUE_TARGET = "glue"


def members(target: str) -> tuple[str, ...]:
    """The categories a target stands for: the glue ones for "glue", else the category itself."""
    return GLUE if target == GLUE_TARGET else (target,)


LABELS = {
    ATTENTION: "attention",
    GEMM_TC: "tensor-core GEMM",
    GEMM_FP32_SIMT: "FP32 SIMT GEMM",
    MOE: "MoE",
    COMMUNICATION: "communication",
    ELEMENTWISE: "elementwise",
    REDUCTION: "reduction",
    COPY: "copy",
    TOPK_SORT: "top-k/sort",
    OTHER: "other",
}


def category_label(category: str | None) -> str:
    """How a category is shown ("tensor-core GEMM"); a name that is not a category ("glue") as is."""
    if not category:
        return MISSING
    return LABELS.get(category, category)
