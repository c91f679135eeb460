"""Which of SGLang 0.5.23's own Hopper kernels a `--sglang 0.5.23` workload runs, part by part.

`choose` decides once, before the workload is built, from what `artefacts.availability` finds (the
cache, the GPU, nvcc, Python) and from what the run needs (bf16 on a CUDA device; Marlin under the
recipe's tensor-parallel layouts, where every expert id is local, as `fused_marlin_moe` takes them;
TileLang's mHC with DeepGEMM's tf32 pre-norm GEMM beside it, as SGLang runs the pair). Modes:

    auto      SGLang's kernel wherever it can run, the stand-in elsewhere, one line a reason (default)
    sglang    SGLang's kernel everywhere, else a one-line refusal naming what is missing
    stand-in  our Triton stand-ins throughout (the baseline the committed Hopper profiles ran)

`KernelChoice.parts()` is what a profile's meta records under "kernels": per model part (the
profile's record_function ranges), the baseline's kernel there, SGLang's or a stand-in, with the
version. Optimisations replace slots on top of it and are recorded apart, so two profiles compare
when their baselines ran the same kernels, whatever was applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.errors import DsvOptError, unknown_name
from dsv4opt.workload.production.artefacts import (
    DEEPGEMM, MARLIN, MHC, SGLANG_VERSION, Availability, Machine, availability,
)

AUTO, SGLANG, STAND_IN = "auto", "sglang", "stand-in"
MODES = (AUTO, SGLANG, STAND_IN)

REAL = f"SGLang {SGLANG_VERSION}"
DENSE = "DeepGEMM fp8_gemm_nt"
DENSE_STAND_IN = "Triton block-FP8 GEMM"


@dataclass(frozen=True)
class KernelChoice:
    """The families running SGLang's own kernel (the others run our stand-ins) and why not the rest."""

    deep_gemm: bool = False
    marlin: bool = False
    mhc: bool = False
    flashmla: bool = False  # FlashMLA itself (sgl-flash-mla), chosen by the device (attention/flashmla.py)
    notes: tuple[str, ...] = ()  # one line per reason a family runs a stand-in

    @property
    def any_real(self) -> bool:
        return self.deep_gemm or self.marlin or self.mhc

    def parts(self) -> dict[str, str]:
        """Per model part, the baseline's kernel: "SGLang 0.5.23: ..." or "stand-in: ... (for ...)"."""
        def kernel(real: bool, theirs: str, ours: str) -> str:
            return f"{REAL}: {theirs}" if real else f"stand-in: {ours} (for {theirs})"

        dense = kernel(self.deep_gemm, DENSE, DENSE_STAND_IN)
        mhc_pre = kernel(self.mhc, "TileLang mhc_pre_big_fuse_with_norm + DeepGEMM tf32_hc_prenorm_gemm",
                         "Triton hc_pre_big_fuse + hc_pre_gemm")
        return {
            "attn": ("FlashMLA flash_mla_with_kvcache (sgl-flash-mla 1.0.0)" if self.flashmla
                     else "stand-in: Triton sm_120 sparse decode (for FlashMLA)"),
            "qkv": dense,
            "indexer": kernel(self.deep_gemm, "DeepGEMM fp8_paged_mqa_logits", "Triton FP8 indexer_tc")
                       + f"; idx_wq_b: {dense}",
            "o_proj": dense,
            "moe": kernel(self.marlin, "Marlin moe_wna16_marlin_gemm", "Triton grouped MXFP4 MoE")
                   + f"; shared expert: {dense}",
            "mhc_pre": mhc_pre,
            # SGLang fuses each block's post into the next block's pre (mhc_fused_post_pre): with
            # TileLang's kernels the post runs in mhc_pre's range, but for the step's last block
            "mhc_post": kernel(self.mhc, "TileLang mhc_post / mhc_fused_post_pre_fma", "Triton hc_post"),
        }


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise unknown_name("kernels mode", mode, MODES, lead="use")
    return mode


def choose(path_name: str, device_type: str, bf16: bool, tensor_parallel: bool, mode: str = AUTO,
           flashmla: bool = False, found: list[Availability] | None = None) -> KernelChoice:
    """The kernel of each family for a run of SGLang path `path_name` on a `device_type` device in
    bf16 (or not), under a tensor-parallel layout (or not). `found`: availability() (looked up when
    None, only where a GPU run could use it)."""
    from dsv4opt.workload.paths import HOPPER_0523

    check_mode(mode)
    if path_name != HOPPER_0523:
        if mode == SGLANG:
            raise DsvOptError(f"--kernels sglang: SGLang's own kernels are wired for the {HOPPER_0523} path only; "
                              f"add --sglang {HOPPER_0523}")
        return KernelChoice()
    if mode == STAND_IN:
        return KernelChoice(flashmla=flashmla, notes=(f"--kernels stand-in: our Triton kernels stand in for SGLang "
                                                      f"{SGLANG_VERSION}'s DeepGEMM, Marlin and TileLang mHC",))
    reasons: dict[str, list[str]] = {}  # reason -> families it keeps on the stand-in
    ready: dict[str, bool] = {}
    if device_type != "cuda":
        for key in (DEEPGEMM, MARLIN, MHC):
            ready[key] = False
        reasons["no CUDA GPU here"] = [_title(k) for k in (DEEPGEMM, MARLIN, MHC)]
    else:
        for a in found if found is not None else availability(machine=Machine.here()):
            ready[a.family.key] = a.ready
            if not a.ready:
                reasons.setdefault(a.reason, []).append(_title(a.family.key))
        needs = [(not bf16, "SGLang's kernels take bf16 activations; this run's dtype is not bf16", (DEEPGEMM, MARLIN, MHC)),
                 (not tensor_parallel, "Marlin is wired for the recipe's tensor-parallel layouts (every expert local)",
                  (MARLIN,)),
                 (not ready.get(DEEPGEMM), "TileLang's mHC runs beside DeepGEMM's tf32 pre-norm GEMM, which is not "
                  "ready", (MHC,))]
        for unmet, reason, keys in needs:
            for key in keys:
                if unmet and ready.get(key):
                    ready[key] = False
                    reasons.setdefault(reason, []).append(_title(key))
    notes = tuple(f"stand-in for {', '.join(names)}: {reason}" for reason, names in reasons.items())
    choice = KernelChoice(ready.get(DEEPGEMM, False), ready.get(MARLIN, False), ready.get(MHC, False), flashmla, notes)
    if mode == SGLANG and notes:
        raise DsvOptError("--kernels sglang: " + "; ".join(notes))
    return choice


def _title(key: str) -> str:
    return {DEEPGEMM: "DeepGEMM", MARLIN: "Marlin", MHC: "TileLang mHC"}[key]
