"""How a deployment splits DeepSeek-V4-Flash over its GPUs, and what one rank of it holds and runs.

Two ways SGLang runs the model (sgl-project/sglang@37ef295c7; ../shared/docs/sglang-dsv4-deployment.md):

- **tensor parallel** (`tp4`, `tp8`): the only sm_120 recipe is TP 4 on one node, no EP, no DP
  attention (docs_new/src/snippets/configs/deepseek-ai/deepseek-v4.jsx:1184-1202). Every rank
  holds every request; its 64/TP query heads are computed and padded back to 64 for the sparse
  decode kernel (deepseek_v4.py:909-926), 8/TP output groups, `wo_b` row-parallel and all-reduced;
  indexer, compressor, mHC and the KV cache replicated. The MoE runs on the rank's own tokens, all
  256 experts resident, each sharded along its intermediate width (moe/fused_moe_triton/layer.py:
  199-219), no expert map, the shared expert sharded the same way, then the second all-reduce.
- **data-parallel attention + expert parallelism** (`dp-ep`, the project's first premise): each rank
  attends for its own requests with all heads; the MoE all-gathers every rank's tokens, holds
  experts / ranks whole experts, maps the others to -1 and reduce-scatters back
  (dsv4opt/workload/collectives.py). SGLang does not recommend it on sm_120.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.errors import DsvOptError, unknown_name
from dsv4opt.workload.config import ModelConfig

TP, DP_EP = "tp", "dp-ep"


@dataclass(frozen=True)
class Layout:
    """A named deployment: `ranks` GPUs, tensor-parallel (`kind` tp) or DP attention + EP (dp-ep;
    its rank count is the config's `expert_parallel` unless given)."""

    name: str
    kind: str
    ranks: int | None
    what: str

    @classmethod
    def from_name(cls, name: str) -> "Layout":
        try:
            return LAYOUTS[name]
        except KeyError:
            raise unknown_name("layout", name, LAYOUTS, lead="use") from None

    def deploy(self, cfg: ModelConfig, ranks: int | None = None) -> "Deployment":
        """What one rank of this layout holds for `cfg`; `ranks` overrides dp-ep's rank count
        (tensor-parallel layouts have theirs in the name)."""
        if self.kind == TP:
            if ranks not in (None, self.ranks):
                raise DsvOptError(f"the {self.name} layout has {self.ranks} ranks; run --ranks {self.ranks} or leave it out")
            n = self.ranks
        else:
            n = ranks or cfg.expert_parallel
            cfg = cfg.with_expert_parallel(n)
        problems = _split_problems(cfg, self.kind, n)
        if problems:
            fits = [name for name, lay in LAYOUTS.items() if not _split_problems(cfg, lay.kind, lay.ranks or cfg.expert_parallel)]
            raise DsvOptError(f"{cfg.name} cannot run the {self.name} layout ({'; '.join(problems)}); "
                              f"layouts that fit it: {', '.join(fits) or 'none'}")
        tp = self.kind == TP
        return Deployment(
            layout=self.name, tensor_parallel=tp, ranks=n,
            heads=cfg.heads // n if tp else cfg.heads, padded_heads=cfg.heads,
            groups=cfg.o_groups // n if tp else cfg.o_groups,
            experts=cfg.experts if tp else cfg.experts // n,
            expert_width=cfg.expert_width // n if tp else cfg.expert_width,
            shared_width=cfg.expert_width * cfg.shared_experts // n,
        )


@dataclass(frozen=True)
class Deployment:
    """One rank's share of a layout, for one config: what it computes and holds."""

    layout: str
    tensor_parallel: bool  # True: every rank all requests, all-reduces; False: DP attention + EP
    ranks: int
    heads: int  # query heads this rank computes
    padded_heads: int  # heads the sparse decode kernel runs (SGLang pads q back to the model's 64)
    groups: int  # output groups (wo_a) this rank holds
    experts: int  # routed experts whose weights this rank holds
    expert_width: int  # intermediate width of each of them on this rank
    shared_width: int  # this rank's slice of the shared expert's width

    @property
    def moe_rows_per_request(self) -> int:
        """Rows the MoE runs per request of this rank: DP attention gathers every rank's tokens."""
        return 1 if self.tensor_parallel else self.ranks


def _split_problems(cfg: ModelConfig, kind: str, n: int) -> list[str]:
    """Why `cfg` cannot be split `n` ways as `kind` (empty: it can)."""
    from dsv4opt.workload.quant import MXFP4_GROUP  # here: quant loads torch, naming a layout must not

    out = []
    shared = cfg.expert_width * cfg.shared_experts
    if shared % (n * cfg.fp8_block):
        out.append(f"a shared-expert width of {shared} does not split into {n} whole FP8 blocks of {cfg.fp8_block}")
    if kind == TP:
        if cfg.heads % n or cfg.o_groups % n:
            out.append(f"{cfg.heads} heads in {cfg.o_groups} output groups do not split {n} ways")
        if cfg.expert_width % (n * MXFP4_GROUP):
            out.append(f"an expert width of {cfg.expert_width} does not split into {n} whole MXFP4 groups of {MXFP4_GROUP}")
    elif cfg.experts % n:
        out.append(f"{cfg.experts} experts do not split over {n} ranks")
    return out


LAYOUTS = {
    lay.name: lay
    for lay in (
        Layout("tp4", TP, 4, "SGLang's sm_120 recipe: tensor parallel over 4 GPUs, no EP, no DP attention"),
        Layout("tp8", TP, 8, "tensor parallel over 8 GPUs, no EP, no DP attention"),
        Layout(DP_EP, DP_EP, None, "DP attention + EP over 8 GPUs, no all-to-all backend (not a recipe SGLang gives for sm_120)"),
    )
}
DEFAULT_LAYOUT = "tp4"
