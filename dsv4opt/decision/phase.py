"""Whether a trace is decode at all: dsv4opt's levers are for LLM decode, and a training or prefill
trace gets one line saying what it looks like instead of decode advice.

Read from what the analysis already holds: kernel names (backward kernels, NCCL all-reduce,
optimizer kernels), the annotations the parts are named after, the categories (GEMM share) and the
launches (how many, how long the typical one runs). Embedded profiles are decode by construction
and are not judged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsv4opt.analysis.categories import GEMM_FP32_SIMT, GEMM_TC
from dsv4opt.analysis.profile import Profile
from dsv4opt.decision.fragmentation import fragmentation

# Kernels of a backward pass, by name: "…_backward…", FlashAttention's "…_bwd_…", cuDNN's "bn_bw_",
# "dgrad"/"wgrad" engines (a decode step runs none).
BACKWARD = re.compile(r"backward|bwd|_bw_|dgrad|wgrad", re.IGNORECASE)
OPTIMIZER = re.compile(r"adam|adagrad|\bsgd\b|\blamb\b|optimizer", re.IGNORECASE)  # not "lambda"
GRADIENT_REDUCE = re.compile(r"nccl.*allreduce|allreduce.*nccl", re.IGNORECASE)
# Trace names of prefill: SGLang's EXTEND stage (profile_by_stage files, its batches), "prefill".
PREFILL_NAME = re.compile(r"extend|prefill", re.IGNORECASE)

MIN_BACKWARD = 0.05  # share of the time in backward kernels that says training
# A decode step is hundreds of short kernels; prefill GEMMs over whole prompts run long.
PREFILL_MEDIAN_US = 200.0
PREFILL_GEMM = 0.5
GEMM_CATEGORIES = (GEMM_TC, GEMM_FP32_SIMT)


@dataclass(frozen=True)
class Phase:
    kind: str  # "training" or "prefill"
    evidence: tuple[str, ...]

    def line(self) -> str:
        return (f"this trace looks like {self.kind} ({', '.join(self.evidence)}): dsv4opt's levers are for decode, "
                "so none is recommended; profile the decode steps (`dsv4opt profile`, or a trace of decode only)")


def not_decode(profile: Profile) -> Phase | None:
    """What a non-embedded profile looks like when it is not decode: training or prefill; else None."""
    if profile.meta.get("target") == "embedded" or profile.total_us <= 0:
        return None
    total = profile.total_us
    backward = sum(k.total_us for k in profile.kernels if BACKWARD.search(k.name)) / total
    if backward >= MIN_BACKWARD:
        evidence = [f"backward kernels {backward:.1%} of {profile.time_label}"]
        reduce = sum(k.total_us for k in profile.kernels if GRADIENT_REDUCE.search(k.name)) / total
        if reduce > 0:
            evidence.append(f"NCCL all-reduce {reduce:.1%}")
        kernel = next((m.group(0) for k in profile.kernels if (m := OPTIMIZER.search(k.name))), None)
        part = next((p.part for p in profile.parts or [] if OPTIMIZER.search(p.part)), None)
        if kernel:
            evidence.append(f"optimizer kernels ({kernel.lower()})")
        elif part:
            evidence.append(f"an annotation {part.strip()!r}")
        return Phase("training", tuple(evidence))
    named = [str(s) for s in profile.meta.get("sources") or []] + [p.part for p in profile.parts or []]
    said = next((n for n in named if PREFILL_NAME.search(n.rsplit("/", 1)[-1])), None)
    every = fragmentation(profile, {k.category for k in profile.kernels})
    gemm = sum(profile.category_share(c) for c in GEMM_CATEGORIES)
    per = "/step" if profile.step_count else " in the trace"
    if said is not None:
        return Phase("prefill", (f"{said.rsplit('/', 1)[-1]} in its names",))
    if every.median_kernel_us >= PREFILL_MEDIAN_US and gemm >= PREFILL_GEMM:
        return Phase("prefill", (f"median kernel {every.median_kernel_us:.0f} µs", f"GEMMs {gemm:.1%} of "
                                 f"{profile.time_label}", f"{every.launches_per_step:.0f} launches{per}"))
    return None
