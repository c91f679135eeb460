"""Achieved FLOP/s and bytes/s per kernel, and the fraction of the device's peak, where the trace
recorded operator shapes (torch.profiler's record_shapes).

Each launch is tied to the operator call that launched it (External id, else the innermost
operator around the launch); that call's FLOPs and bytes come from its input shapes and dtypes by a
model per operator (below) and are shared among the kernels the call launched in proportion to
their time (an aten::mm's GEMM and its split-K reduce show the call's rate). Per kernel name the
launches' figures are summed: rate = FLOPs / GPU time of the modelled launches. Bytes are what the
operator must read and write once (its inputs and output), a floor on its memory traffic. Operators
without a model, graph-replayed launches (no operator), memcpy/memset and traces without shapes
give no row.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsv4opt.analysis.categories import GEMM_TC
from dsv4opt.analysis.codes import factorize_names, factorize_rows
from dsv4opt.analysis.devices import BF16, FP8, FP32, TF32, DevicePeak
from dsv4opt.analysis.modelled import ATTENTION_LAYOUT, BINARY, GEMMS, UNARY, modelled_ops  # noqa: F401 (modelled_ops: public here too)
from dsv4opt.trace.reader import OpShapes

EFFICIENCY_COLUMNS = ["name", "op", "launches", "modelled_us", "rated_us", "flop", "bytes", "flop_at_peak_us",
                      "bytes_at_peak_us", "tflops", "gbps", "compute_of_peak", "bandwidth_of_peak"]

_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
          "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
          "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::complex<float>": 8}
_FP8_TYPES = {"c10::Float8_e4m3fn", "c10::Float8_e5m2", "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"}


def op_model(name: str, shapes: OpShapes | None) -> tuple[float, float, str | None] | None:
    """(FLOPs, bytes, peak kind) of one operator call, None when there is no model or the shapes do
    not fit it. The kind is the tensor-core rate to compare with (fp8, bf16, or fp32 meaning "tf32 or
    fp32, by the kernel"); None for memory-bound operators, judged by bandwidth only."""
    if shapes is None or not shapes.dims:
        return None
    try:
        return _model(name, shapes)
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def _model(name: str, s: OpShapes) -> tuple[float, float, str | None] | None:
    dims, types = s.dims, s.types
    if name in GEMMS:
        if name == "aten::linear":
            (*lead, k), (n, _) = dims[0], dims[1]
            m, batch, a, b = math.prod(lead), 1, 0, 1
        else:
            a = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
            (*batch_a, m, k), (*_, _, n) = dims[a], dims[a + 1]
            batch = math.prod(batch_a)
            b = a + 1
        flop = 2.0 * batch * m * n * k
        ea, eb = _BYTES[types[a]], _BYTES[types[b]]
        out = 2 if name == "aten::_scaled_mm" else ea
        nbytes = batch * (m * k * ea + k * n * eb + m * n * out)
        if a == 1 or name == "aten::linear" and len(dims) > 2 and dims[2]:
            bias = dims[0] if a == 1 else dims[2]
            nbytes += math.prod(bias) * _BYTES[types[0 if a == 1 else 2]]
        return flop, float(nbytes), _kind(types[a])
    if name in ATTENTION_LAYOUT:
        layout, causal_at = ATTENTION_LAYOUT[name]
        q, k, v = dims[0], dims[1], dims[2]
        if len(q) != 4:
            return None  # varlen (packed) inputs: lengths per sequence are not in the shapes
        if layout == "BLHD":
            (b, lq, h, d), lk, dv = q, k[1], v[3]
        else:
            (b, h, lq, d), lk, dv = q, k[2], v[3]
        causal = len(s.concrete) > causal_at and s.concrete[causal_at] == "True"
        # Causal: the upper-left aligned mask of torch's SDPA, row i sees min(i + 1, lk) keys.
        pairs = (lq * (lq + 1) // 2 if lq <= lk else lk * (lk + 1) // 2 + (lq - lk) * lk) if causal else lq * lk
        flop = 2.0 * b * h * pairs * (d + dv)
        e = _BYTES[types[0]]
        nbytes = e * (math.prod(q) + math.prod(k) + math.prod(v) + b * h * lq * dv)
        return flop, float(nbytes), _kind(types[0])
    op = name.removeprefix("aten::").removesuffix("_")
    # 0-dim inputs (Python numbers wrapped as tensors) travel as kernel arguments, not memory.
    tensors = [(d, _BYTES[t]) for d, t in zip(dims, types) if t in _BYTES and isinstance(d, (list, tuple)) and d]
    if not tensors:
        return None
    if name == "aten::copy_":
        return 0.0, float(sum(math.prod(d) * e for d, e in tensors[:2])), None
    if op in BINARY or op in UNARY:
        out = math.prod(_broadcast([d for d, _ in tensors]))
        return float(out), float(sum(math.prod(d) * e for d, e in tensors) + out * tensors[0][1]), None
    return None


def _kind(dtype: str) -> str | None:
    if dtype in _FP8_TYPES:
        return FP8
    if dtype in ("c10::BFloat16", "c10::Half"):
        return BF16
    if dtype == "float":
        return FP32
    return None


def _broadcast(shapes: list[tuple]) -> tuple:
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    return tuple(max(col) for col in zip(*padded))


def kernel_efficiency(kernels: pd.DataFrame, op_row: np.ndarray, cpu_ops: pd.DataFrame, peak: DevicePeak | None,
                      call: np.ndarray | None = None) -> pd.DataFrame:
    """[GPU events] name, cat, category, dur_us, with op_row: [GPU events] the row of cpu_ops (name,
    shapes) of each launch's operator, -1 unknown, and call: [GPU events] which call of it the
    launch belongs to (by default its op_row; graph replays of one captured call are separate calls)
    -> [kernel names with a modelled launch]
    EFFICIENCY_COLUMNS, by modelled time descending. tflops in 1e12 FLOP/s, gbps in 1e9 bytes/s;
    rated_us: the modelled time of launches whose operator has a compute rate (GEMMs, attention);
    flop_at_peak_us / bytes_at_peak_us: how long the work would take at the datasheet rate and
    bandwidth; compute_of_peak / bandwidth_of_peak: those over the time it took (NaN when the device
    or the kind of rate is not known)."""
    empty = pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "op") else float) for c in EFFICIENCY_COLUMNS})
    # Copies over PCIe and memsets are not judged against HBM: kernels only.
    op_row = np.where(kernels["cat"].astype(object).to_numpy() == "kernel", np.asarray(op_row, np.int64), -1) \
        if "cat" in kernels else np.asarray(op_row, np.int64)
    if kernels.empty or "shapes" not in cpu_ops or not (op_row >= 0).any():
        return empty
    call = op_row if call is None else np.asarray(call, np.int64)
    known = np.flatnonzero(op_row >= 0)
    rows = op_row[known]
    calls = pd.unique(rows)
    names = cpu_ops["name"].astype(object).to_numpy()[calls]
    shapes = cpu_ops["shapes"].to_numpy()[calls]
    # Calls with the same operator and shapes share one model evaluation. A trace holds one object
    # per distinct recorded shape, so the object stands for its content (two traces' equal shapes
    # are only evaluated twice).
    key = factorize_rows(names, np.fromiter(map(id, shapes), np.int64, len(shapes)))
    per_key = [op_model(names[i], shapes[i]) for i in np.unique(key, return_index=True)[1]]
    models = [per_key[k] for k in key]
    has = np.array([m is not None for m in models], bool)
    if not has.any():
        return empty
    call_flop = pd.Series([m[0] for m, h in zip(models, has) if h], index=calls[has])
    call_bytes = pd.Series([m[1] for m, h in zip(models, has) if h], index=calls[has])
    call_kind = pd.Series([m[2] for m, h in zip(models, has) if h], index=calls[has], dtype=object)
    call_op = pd.Series(names[has], index=calls[has])
    sel = known[pd.Index(calls[has]).get_indexer(rows) >= 0]
    rows = op_row[sel]
    dur = kernels["dur_us"].to_numpy()[sel]
    calls_of = call[sel]
    call_us = pd.Series(dur).groupby(calls_of).sum()
    part = dur / call_us.reindex(calls_of).to_numpy()
    part = np.where(np.isfinite(part), part, 0.0)
    flop = call_flop.reindex(rows).to_numpy() * part
    nbytes = call_bytes.reindex(rows).to_numpy() * part
    kind = call_kind.reindex(rows).to_numpy()
    category = kernels["category"].astype(object).to_numpy()[sel] if "category" in kernels else np.full(len(sel), None)
    # An FP32 operator runs at the TF32 rate when its kernel is a tensor-core GEMM.
    kind = np.where((kind == FP32) & (category == GEMM_TC), TF32, kind)
    peak_tflops = np.array([(peak.tflops_for(x) if peak is not None and x is not None else None) or np.nan for x in kind], float)
    at_peak_us = flop / (peak_tflops * 1e6)
    bw_us = nbytes / (peak.hbm_gbps * 1e3) if peak is not None else np.full(len(sel), np.nan)
    codes, distinct = factorize_names(kernels["name"])
    frame = pd.DataFrame({"name": codes[sel], "op": call_op.reindex(rows).to_numpy(),
                          "dur": dur, "flop": flop, "bytes": nbytes, "at_peak": at_peak_us, "bw": bw_us,
                          "rated": np.where(np.isfinite(at_peak_us), dur, 0.0)})
    g = frame.groupby("name", sort=False)
    out = pd.DataFrame({
        "launches": g["dur"].size(),
        "modelled_us": g["dur"].sum(),
        "rated_us": g["rated"].sum(),
        "flop": g["flop"].sum(),
        "bytes": g["bytes"].sum(),
        "flop_at_peak_us": g["at_peak"].sum(min_count=1),
        "bytes_at_peak_us": g["bw"].sum(min_count=1),
    })
    # The operator behind most of a kernel's launches names the row.
    ops = frame.groupby(["name", "op"], sort=False).size().reset_index(name="n")
    ops = ops.sort_values("n", ascending=False, kind="mergesort").drop_duplicates("name").set_index("name")["op"]
    out["op"] = ops.reindex(out.index)
    out.index = pd.Index(distinct[out.index.to_numpy()], name="name")
    return rates(out.reset_index())


def rates(sums: pd.DataFrame) -> pd.DataFrame:
    """[kernel names] name, op and the summed columns -> EFFICIENCY_COLUMNS: tflops and gbps
    achieved, and the fractions of the peak (time the work would take at the datasheet rate over the
    time it took - for compute, the time of the launches whose operator has a tensor-core or FP32
    rate, so a copy among GEMM launches does not dilute it; NaN where none has), by modelled time
    descending."""
    out = sums.copy()
    out["tflops"] = out["flop"] / out["modelled_us"] / 1e6
    out["gbps"] = out["bytes"] / out["modelled_us"] / 1e3
    out["compute_of_peak"] = out["flop_at_peak_us"] / out["rated_us"].where(out["rated_us"] > 0)
    out["bandwidth_of_peak"] = out["bytes_at_peak_us"] / out["modelled_us"]
    out = out.sort_values(["modelled_us", "name"], ascending=[False, True], kind="mergesort")
    return out.reset_index(drop=True)[EFFICIENCY_COLUMNS]
