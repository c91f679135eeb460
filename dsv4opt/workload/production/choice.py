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
from typing import Callable

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

    def __post_init__(self):
        if self.mhc and not self.deep_gemm:
            raise ValueError("TileLang's mHC runs beside DeepGEMM's tf32 pre-norm GEMM: mhc needs deep_gemm")

    @property
    def any_real(self) -> bool:
        return self.deep_gemm or self.marlin or self.mhc

    def parts(self) -> dict[str, str]:
        """Per model part, the baseline's kernel: "SGLang 0.5.23: ..." or "stand-in: ... (for ...)"."""
        def kernel(real: bool, theirs: str, ours: str) -> str:
            return f"{REAL}: {theirs}" if real else f"stand-in: {ours} (for {theirs})"

        # Where SGLang's kernel runs beside pieces of ours (its JIT quant, align, top-k), they are named:
        # a part is SGLang's only where nothing of ours runs in it.
        dense = kernel(self.deep_gemm, DENSE + " (stand-in: Triton UE8M0 activation quant)", DENSE_STAND_IN)
        return {
            "attn": ("FlashMLA flash_mla_with_kvcache (sgl-flash-mla 1.0.0)" if self.flashmla
                     else "stand-in: Triton sm_120 sparse decode (for FlashMLA)"),
            "qkv": dense,
            "indexer": kernel(self.deep_gemm, "DeepGEMM fp8_paged_mqa_logits (stand-in: Triton top-k for "
                              "topk_transform_paged_v2)", "Triton FP8 indexer_tc") + f"; idx_wq_b: {dense}",
            "o_proj": dense,
            "moe": kernel(self.marlin, "Marlin moe_wna16_marlin_gemm (stand-in: torch align for "
                          "moe_align_block_size, Triton SwiGLU, torch top-k sum)", "Triton grouped MXFP4 MoE")
                   + f"; shared expert: {dense}",
            # SGLang fuses each block's post into the next block's pre (mhc_fused_post_pre): with
            # TileLang's kernels every boundary runs in mhc_pre's range, mhc_post holds the last block's
            "mhc_pre": kernel(self.mhc, "TileLang mhc_fused_post_pre_fma (<= 32 tokens) or mhc_post + DeepGEMM "
                              "tf32_hc_prenorm_gemm, then mhc_pre_big_fuse_with_norm",
                              "Triton hc_pre_gemm + hc_pre_big_fuse"),
            "mhc_post": kernel(self.mhc, "TileLang mhc_post (the step's last block only)", "Triton hc_post"),
        }


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise unknown_name("kernels mode", mode, MODES, lead="use")
    return mode


def fits_the_build(cfg, tokens: int, sms: int) -> dict[str, str]:
    """Why each family's built kernels cannot take this run's shapes (key -> reason; empty: they can).
    The TileLang cubins are elaborated for DeepSeek-V4-Flash's mHC widths and constants
    (tilelang_aot.py), with big-fuse variants for 4, 8 and 64 splits only; DeepGEMM's scale
    granularity and index pages are 128 and 64."""
    from dsv4opt.workload.production import mhc_tilelang, tilelang_aot

    out = {}
    if cfg.fp8_block != 128 or cfg.index_page != 64:
        out[DEEPGEMM] = (f"DeepGEMM takes block-128 FP8 and 64-entry index pages; {cfg.name} has "
                         f"{cfg.fp8_block} and {cfg.index_page}")
    widths = (cfg.hidden, cfg.hc, cfg.hc_sinkhorn_iters, cfg.norm_eps, cfg.hc_eps)
    if widths != (tilelang_aot.HIDDEN, tilelang_aot.HC, tilelang_aot.SINKHORN, tilelang_aot.EPS, tilelang_aot.EPS):
        out[MHC] = f"the TileLang cubins are built for DeepSeek-V4-Flash's mHC widths; {cfg.name} differs"
    else:
        splits = {mhc_tilelang.prenorm_splits(tokens, cfg.hc * cfg.hidden, sms)}  # the first read, boundaries > 32
        if tokens <= mhc_tilelang.FMA_MAX_TOKENS:
            splits.add(mhc_tilelang.fma_plan(tokens, cfg.hidden)[1])
        missing = sorted(s for s in splits if s not in mhc_tilelang.BIG_FUSE_SPLITS)
        if missing:
            out[MHC] = (f"at {tokens} tokens on {sms} SMs SGLang's big fuse takes {missing[0]} splits, a cubin "
                        f"not built (built: {', '.join(map(str, mhc_tilelang.BIG_FUSE_SPLITS))})")
    return out


def choose(path_name: str, device_type: str, bf16: bool, tensor_parallel: bool, mode: str = AUTO,
           flashmla: bool = False, found: list[Availability] | None = None, shapes: dict[str, str] | None = None
           ) -> KernelChoice:
    """The kernel of each family for a run of SGLang path `path_name` on a `device_type` device in
    bf16 (or not), under a tensor-parallel layout (or not). `found`: availability() (looked up when
    None, only where a GPU run could use it); `shapes`: fits_the_build's reasons for this run."""
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
        reasons["this run is on the CPU"] = [_title(k) for k in (DEEPGEMM, MARLIN, MHC)]
    else:
        for a in found if found is not None else availability(machine=Machine.here()):
            ready[a.family.key] = a.ready
            if not a.ready:
                reasons.setdefault(a.reason, []).append(_title(a.family.key))
        needs = [(True, reason, (key,)) for key, reason in (shapes or {}).items()]
        needs += [(not bf16, "SGLang's kernels take bf16 activations; this run's dtype is not bf16", (DEEPGEMM, MARLIN, MHC)),
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


def first_calls(device) -> dict[str, Callable[[], None]]:
    """Per family, a small first call on `device` that loads what the family needs and (DeepGEMM) JIT-
    compiles one kernel, outside any CUDA-graph capture: what fails there would otherwise end a
    profile in its warm-up."""
    import torch

    def deep_gemm() -> None:
        from dsv4opt.workload import quant
        from dsv4opt.workload.production import deepgemm

        w8, ws = quant.quantize_block_fp8(torch.randn(256, 256, device=device), 128)
        out = deepgemm.fp8_linear(torch.randn(2, 256, device=device, dtype=torch.bfloat16), w8, ws)
        torch.cuda.synchronize(device)
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("fp8_gemm_nt gave non-finite values on finite inputs")

    def marlin() -> None:
        from dsv4opt.workload.production import marlin as m

        m.modules()

    def mhc() -> None:
        from dsv4opt.workload.production import mhc_tilelang

        index = torch.device(device).index
        for variant in mhc_tilelang.variants().values():
            variant.kernel._function(torch.cuda.current_device() if index is None else index)

    return {DEEPGEMM: deep_gemm, MARLIN: marlin, MHC: mhc}


def verified(choice: KernelChoice, calls: dict, mode: str = AUTO) -> KernelChoice:
    """`choice` with each family whose first call (first_calls) fails back on its stand-in, one line
    each saying why; under mode sglang the first failure is refused instead."""
    ready = {DEEPGEMM: choice.deep_gemm, MARLIN: choice.marlin, MHC: choice.mhc}
    notes = list(choice.notes)
    for key in (DEEPGEMM, MARLIN, MHC):
        if not ready[key] or (key == MHC and not ready[DEEPGEMM]):
            continue  # not chosen; or mHC without DeepGEMM, said below
        try:
            calls[key]()
        except Exception as exc:  # whatever the loader or the JIT raises: the stand-in runs, and says why
            line = f"stand-in for {_title(key)}: its first call failed here ({type(exc).__name__}: {_first_line(exc)})"
            if mode == SGLANG:
                raise DsvOptError(f"--kernels sglang: {line}") from None
            ready[key] = False
            notes.append(line)
    if ready[MHC] and not ready[DEEPGEMM]:
        ready[MHC] = False
        notes.append("stand-in for TileLang mHC: TileLang's mHC runs beside DeepGEMM's tf32 pre-norm GEMM, which is "
                     "not ready")
    return KernelChoice(ready[DEEPGEMM], ready[MARLIN], ready[MHC], choice.flashmla, tuple(notes))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:200]


def _title(key: str) -> str:
    return {DEEPGEMM: "DeepGEMM", MARLIN: "Marlin", MHC: "TileLang mHC"}[key]
