"""Which SGLang decode path the embedded workload reproduces: the version, the GPU family, the kernels.

- **0.5.14 on sm_120** (the default; the story's path, sgl-project/sglang@37ef295c7): SGLang's
  sm_120 fallbacks of June 2026, on a card this tool does not have: the CUDA-core sparse-MLA kernel
  with an eager merge, the float32 indexer `bmm` and mHC pre-mix, per-slot MXFP4 GEMVs
  (dsv4opt/workload/baseline.py). Default layout tp4, SGLang's sm_120 recipe.
- **0.5.23 on Hopper**: what a user of an H200 runs with today's SGLang (read from the PyPI wheel,
  docs/workload.md "The Hopper path"), under the H200 recipe for the FP4 checkpoint: TP 4, Marlin
  MoE, no DP attention or EP (the cookbook cell h200 / flash / fp4 / high-throughput, the one without
  speculative decoding; Leoyzen/sglang@06ad7b2b0 docs/src/snippets/configs/deepseek-ai/
  deepseek-v4.jsx:1970-1981, DeepSeek-V4.mdx:300-307). FlashMLA's sparse FP8 decode itself
  (sgl-flash-mla, loaded and called: dsv4opt/workload/attention/flashmla.py), DeepGEMM's FP8 indexer
  logits, the fused mHC pre step (DeepGEMM's tf32 pre-norm GEMM, then one TileLang kernel for
  Sinkhorn, the weighted sum and the RMSNorm) and Marlin's W4A16 grouped MoE (SGLang's own
  `moe_wna16_marlin_gemm`, the routed scale folded into the top-k weights). DeepGEMM, TileLang and
  SGLang's JIT kernels (Marlin's among them: kernels/ops/moe/moe_wna16_marlin.py:7-35, `load_jit`)
  compile with nvcc at run time: `dsv4opt build-kernels` builds them ahead into a cache, and where
  they can run (a Hopper GPU, bf16, the cache; dsv4opt/workload/production/choice.py) the step calls
  them; elsewhere our Triton kernels stand in, each docstring naming what it stands for. `wo_a` is a
  bf16 einsum, as under the H200 recipe: SGLang turns its FP8 GEMM off on sm_90 unless the variable
  is set explicitly (srt/arg_groups/serving_hook.py:471-493; docs/production-kernels.md).

The path sets the baseline's slot implementations (an optimisation replaces them as on any path),
the structure of the hyper-connection pre step, and the default layout. Adding a path is one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dsv4opt.errors import DsvOptError, unknown_name


@dataclass(frozen=True)
class SGLangPath:
    """One SGLang release's decode path for DeepSeek-V4-Flash on one GPU family."""

    name: str  # what --sglang takes: the SGLang version
    family: str  # the GPU family it runs on, in words
    family_code: str  # the same as optimizations/sglang_versions.py names it: sm_120, sm_90
    layout: str  # the layout of SGLang's recipe for that family (dsv4opt/workload/layout.py)
    what: str
    fused_mhc_pre: bool  # the pre step as one GEMM and one fused Sinkhorn + sum + norm kernel
    # the routed experts' sum scaled inside the MoE and again when added to the shared expert (the
    # sm_120 fork's per-slot path, docs/workload.md), else once (0.5.23's Marlin folds the scale into
    # the top-k weights and adds with alpha 1: mxfp4_flashinfer_trtllm_moe.py:561-565)
    routed_scaled_twice: bool
    fp8_wo_a: bool  # wo_a block FP8 (SGLANG_OPT_FP8_WO_A_GEMM), else bf16
    fp8_gemm_fills_sms: bool  # the block-FP8 GEMM's tiles fill the SMs (DeepGEMM's stand-in)

    def implementations(self, kernels=None) -> dict[str, Callable]:
        """The baseline's slot implementations on this path, SGLang's own kernels where `kernels`
        (production.choice.KernelChoice) says they run (imported here: the baseline loads torch,
        which naming a path, as every command's option check does, must not)."""
        from dsv4opt.workload.baseline import IMPLEMENTATIONS, hopper_0523

        return dict(IMPLEMENTATIONS) if self.name == SM120_0514 else hopper_0523(kernels)

    @property
    def label(self) -> str:
        """"0.5.14 (sm_120)", "0.5.23 (Hopper, sm_90)": the version and the GPU family, for tables."""
        return f"{self.name} ({self.family})"

    @classmethod
    def from_name(cls, name: str) -> "SGLangPath":
        try:
            return PATHS[name]
        except KeyError:
            raise unknown_name("SGLang path", name, PATHS, lead="use") from None


SM120_0514, HOPPER_0523 = "0.5.14", "0.5.23"
PATHS = {
    p.name: p
    for p in (
        SGLangPath(SM120_0514, "sm_120", "sm_120", "tp4", "SGLang 0.5.14's sm_120 path of June 2026 (the story's; "
                   "sgl-project/sglang@37ef295c7)", fused_mhc_pre=False, routed_scaled_twice=True,
                   fp8_wo_a=False, fp8_gemm_fills_sms=False),
        SGLangPath(HOPPER_0523, "Hopper (sm_90)", "sm_90", "tp4", "SGLang 0.5.23's Hopper path (FlashMLA, DeepGEMM FP8, "
                   "fused mHC, Marlin W4A16 MoE)", fused_mhc_pre=True, routed_scaled_twice=False,
                   fp8_wo_a=False, fp8_gemm_fills_sms=True),
    )
}
DEFAULT_PATH = SM120_0514

# Hopper-path profiles from before the workload read wo_a's default from the wheel ran it in FP8.
LEGACY_FP8_WO_A = {SM120_0514: False, HOPPER_0523: True}


def ran_fp8_wo_a(meta: dict) -> bool:
    """Whether an embedded profile ran wo_a in block FP8: its meta says, else what its path did then."""
    if "fp8_wo_a" in meta:
        return bool(meta["fp8_wo_a"])
    return LEGACY_FP8_WO_A.get(meta.get("sglang") or SM120_0514, False)
