"""Model-part attribution: GPU time per record_function range (attn, indexer, mhc_pre, moe, ...)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dsv4opt.analysis.intervals import Intervals
from dsv4opt.analysis.steps import STEP_LIKE, STEP_NAME

NO_PART = "(outside any annotation)"
UNMATCHED_REPLAY = "(graph replay, unmatched)"
# Inductor's generated kernels outside any part: glue torch.compile fused, often across two parts,
# so no one part is theirs (triton_poi_/red_/per_/tem_/spl_ in Inductor's naming).
COMPILED_GLUE = "(fused by torch.compile)"
INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem|spl|for)_")
PART_COLUMNS = ["part", "count", "total_us", "share"]


# Ranges torch.compile wraps around a compiled region ("## Call CompiledFxGraph <hash> ##" from
# Inductor's output code, "Torch-Compiled Region: 0/0" from Dynamo, aot_autograd's
# "CompiledFunction"): they say a graph ran, not which part of the model it was.
COMPILE_WRAPPER = re.compile(r"^## Call CompiledFxGraph|^Torch-Compiled Region|^CompiledFunction|^TorchDynamo Cache Lookup")


def part_annotations(annotations: pd.DataFrame) -> pd.DataFrame:
    """The annotations that can be parts: all but step ranges (ProfilerStep#N, names with
    step/iteration) and torch.compile's wrappers around compiled regions."""
    if annotations.empty:
        return annotations
    names = annotations["name"].astype(object)
    not_part = (names.str.match(STEP_NAME.pattern).fillna(False).to_numpy(bool)
                | names.str.contains(STEP_LIKE.pattern, case=False, regex=True).fillna(False).to_numpy(bool)
                | names.str.contains(COMPILE_WRAPPER.pattern, regex=True).fillna(False).to_numpy(bool))
    return annotations[~not_part]


def kernel_parts(kernel_ts_us: np.ndarray, launch_ts_us: np.ndarray, launch_tid: np.ndarray,
                 annotations: pd.DataFrame) -> np.ndarray | None:
    """[kernels] the innermost part annotation around each kernel (NO_PART outside any), or None when
    the trace has no part annotations. GPU-side ranges by the kernel's own time when the trace has
    them, else CPU-side ranges on the launching thread by launch time."""
    ann = part_annotations(annotations)
    if ann.empty:
        return None
    gpu = ann[ann["on_gpu"] == 1]
    if not gpu.empty:
        ann, t, tid = gpu, np.asarray(kernel_ts_us, float), None
    else:
        ann, t, tid = ann[ann["on_gpu"] == 0], np.asarray(launch_ts_us, float), np.asarray(launch_tid)
    start = ann["ts_us"].to_numpy()
    ranges = Intervals.of(start, start + ann["dur_us"].to_numpy(), None if tid is None else ann["tid"].to_numpy())
    row = ranges.innermost(t, tid)
    # row -1 (no range around the kernel) picks the NO_PART appended at the end.
    names = np.append(ann["name"].astype(object).to_numpy(), NO_PART)
    return names[row]


def with_replayed_parts(own: np.ndarray | None, replayed: np.ndarray, reference_index: np.ndarray,
                        reference_parts: np.ndarray) -> np.ndarray:
    """[kernels] parts of a graph-replay trace: a replayed kernel takes the part of the reference
    kernel it was matched to (reference_index >= 0), else UNMATCHED_REPLAY; the others keep their
    own part (`own`, NO_PART when the trace has no part annotations)."""
    out = np.full(len(replayed), NO_PART, object) if own is None else own.copy()
    out[replayed] = UNMATCHED_REPLAY
    matched = replayed & (reference_index >= 0)
    out[matched] = reference_parts[reference_index[matched]]
    return out


def with_compiled_glue(part: np.ndarray | None, names: pd.Series) -> np.ndarray | None:
    """[kernels] `part`, with Inductor's kernels that no part holds named COMPILED_GLUE."""
    if part is None:
        return None
    fused = names.astype(object).str.match(INDUCTOR_KERNEL.pattern).fillna(False).to_numpy(bool)
    return np.where(fused & (part == NO_PART), COMPILED_GLUE, part)


def part_table_of(part: np.ndarray | None, dur_us: np.ndarray, total_us: float) -> pd.DataFrame:
    """[parts] part, count, total_us, share from one part name per kernel; empty (same schema) for None."""
    if part is None or len(part) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "part" else float) for c in PART_COLUMNS})
    g = pd.DataFrame({"part": part, "dur": dur_us}).groupby("part")["dur"]
    out = pd.DataFrame({"count": g.size(), "total_us": g.sum()}).reset_index()
    out["share"] = out["total_us"] / total_us if total_us > 0 else 0.0
    return out.sort_values("total_us", ascending=False, kind="mergesort").reset_index(drop=True)[PART_COLUMNS]

