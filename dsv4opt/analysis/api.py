"""Trace files -> Profile: read each rank, rank kernels, find steps, attribute, aggregate ranks."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsv4opt.analysis import (attribute, cpu_ops, efficiency, figures, glue, launch_sites, one_run, parts, rank,
                              rank_balance, steps)
from dsv4opt.analysis.classify import classify_names
from dsv4opt.analysis.codes import factorize_names, factorize_rows
from dsv4opt.analysis.names import short_name
from dsv4opt.analysis.profile import CaptureMatch, CategoryRow, KernelRow, PartRow, Profile, RankRow, is_profile_file
from dsv4opt.analysis.sweep import SWEEP_SCHEMA, summary_rows
from dsv4opt.errors import ProfileError, TraceError
from dsv4opt.trace import Trace, expand_trace_paths, rank_from_name, read_trace
from dsv4opt.trace.prefetch import Prefetch
from dsv4opt.trace.reader import trace_of
from dsv4opt.validate import read_json

ATTRIBUTED_KERNELS = 30
RANK_TOP = 10
RANK_KERNEL_COLUMNS = ["name", "short_name", "category", "count", "total_us", "share"]


def analyze_paths(paths: list[str | Path], meta: dict | None = None, capture: Path | None = None,
                  one_capture: bool = False, prefetch: Prefetch | None = None) -> Profile:
    """Analyse trace files (or folders of per-rank traces) into one Profile.

    Several files are reported per rank (`ranks`) and aggregated (kernels, categories,
    steps of the first rank with steps), once their own metadata says they can be the ranks of one
    run (analysis/one_run.py; meta["merged"] says what was merged). one_capture: the caller wrote
    them in one capture, so they are not checked. `meta` is merged into profile.meta; target
    defaults to "trace". `prefetch`: a helper already reading the capture and then the files
    (trace/prefetch.py); a file it does not hold is read here.
    """
    files = expand_trace_paths(list(paths))
    if not one_capture:
        one_run.check_names(files)
    run = one_run.OneRun()
    reference = _Reference.of(_read(capture, None, prefetch)) if capture is not None else None
    per_rank: list[RankRow] = []
    all_kernels: list[pd.DataFrame] = []
    attributions: dict[str, dict] = {}
    cpu_tables: list[pd.DataFrame] = []
    step_info = None
    part_frames: list[pd.DataFrame] = []
    devices: list[str] = []
    has_stacks = False
    capture_match = {"replayed": 0, "matched": 0}
    glue_regions = None
    rank_figures: list[tuple[int, figures.RankFigures]] = []
    step_figures = None
    for i, f in enumerate(files):
        trace = _read(f, _rank_of(f, i), prefetch)
        if not one_capture:
            run.add(one_run.origin_of(trace))  # before the analysis: a stranger is refused at once
        result = _analyze_one(trace, reference)
        per_rank.append(result["summary"])
        if trace.device and trace.device not in devices:
            devices.append(trace.device)
        if not trace.kernels.empty:
            all_kernels.append(trace.kernels[["name", "dur_us"]])  # names of several ranks concatenate as strings
        for name, att in result["attribution"].items():
            attributions.setdefault(name, att)
        if step_info is None and result["steps"] is not None:
            step_info, step_figures = result["steps"], result["figures"]
        if result["figures"] is not None:
            rank_figures.append((_rank_of(f, i), result["figures"]))
        if not result["parts"].empty:
            part_frames.append(result["parts"])
        if result["cpu_table"] is not None:
            cpu_tables.append(result["cpu_table"])
        has_stacks = has_stacks or result["has_stacks"]
        if glue_regions is None or (glue_regions.steps <= 1 < (result["glue"].steps if result["glue"] else 0)):
            glue_regions = result["glue"]
        for key, value in result["capture_match"].items():
            capture_match[key] += value
        del trace, result

    kernels = pd.concat(all_kernels, ignore_index=True) if all_kernels else pd.DataFrame({"name": [], "dur_us": []})
    profile_meta: dict[str, Any] = {
        "target": "trace",
        "sources": [str(f) for f in files],
        "device": devices[0] if len(devices) == 1 else (", ".join(devices) or None),
        "ranks": len(files),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if capture is not None:
        profile_meta["capture_trace"] = str(capture)
    if run.describe():
        profile_meta["merged"] = run.describe()
    profile_meta.update(meta or {})
    # How many graph-replayed kernels found their launch in the capture trace: a reader judges the
    # replay's operators and parts by this.
    found = {"has_stacks": has_stacks, "ranks": per_rank if len(per_rank) > 1 else None,
             "rank_balance": rank_balance.rank_balance(per_rank) if len(per_rank) > 1 else None,
             "capture_match": CaptureMatch(**capture_match) if capture is not None else None}

    if kernels.empty:
        if not cpu_tables:
            raise TraceError(f"{files[0]}: holds no GPU kernels and no CPU operators; nothing to analyze")
        merged = pd.concat(cpu_tables, ignore_index=True)
        g = (merged.groupby("name", sort=False)
             .agg(count=("count", "sum"), total_us=("total_us", "sum"), category=("category", "first"))
             .reset_index())
        total = float(g["total_us"].sum())
        g["mean_us"] = g["total_us"] / g["count"]
        g["share"] = g["total_us"] / total if total > 0 else 0.0
        g["short_name"] = g["name"]
        g = g.sort_values(["total_us", "name"], ascending=[False, True], kind="mergesort")
        part_rows = None
        if part_frames:
            p = pd.concat(part_frames, ignore_index=True).groupby("part").agg(count=("count", "sum"), total_us=("total_us", "sum")).reset_index()
            p["share"] = p["total_us"] / total if total > 0 else 0.0
            part_rows = _rows(PartRow, p.sort_values("total_us", ascending=False, kind="mergesort"))
        return Profile(meta=profile_meta, total_us=total, kernels=_rows(KernelRow, g[rank.KERNEL_COLUMNS]),
                       categories=_rows(CategoryRow, rank.category_table(g, total)), steps=step_info,
                       time_basis="cpu_self", parts=part_rows,
                       note="no GPU events in the trace: ranking CPU operators by self time", **found)

    total = rank.total_gpu_us(kernels)
    ktable = rank.kernel_table(kernels, total)
    ctable = rank.category_table(ktable, total)
    more = figures.kernel_fields(kernels, figures.merge_efficiency([f.efficiency for _, f in rank_figures]))
    krows = [KernelRow(**row, **attributions.get(row["name"], {}), **more.get(row["name"], {})) for row in rank.records(ktable)]
    if step_info is not None and step_figures is not None:
        step_info = figures.steps_with_busy(step_info, step_figures)
    part_rows = None
    if part_frames:
        merged = pd.concat(part_frames, ignore_index=True).groupby("part").agg(count=("count", "sum"), total_us=("total_us", "sum")).reset_index()
        merged["share"] = merged["total_us"] / total
        part_rows = _rows(PartRow, merged.sort_values("total_us", ascending=False))
    return Profile(meta=profile_meta, total_us=total, kernels=krows, categories=_rows(CategoryRow, ctable),
                   steps=step_info, time_basis="gpu", parts=part_rows, glue=glue_regions,
                   timeline=figures.timeline_of(rank_figures),
                   peak=figures.peak_row(devices[0] if len(devices) == 1 else None), **found)


def _rows(row_type, table: pd.DataFrame) -> list:
    return [row_type(**row) for row in rank.records(table)]


def _rank_of(path: Path, index: int) -> int:
    r = rank_from_name(path.name)
    return index if r is None else r


@dataclass
class _Reference:
    """The capture trace given with `capture=`, read once for every rank: its operators and, when it
    is an eager reference run, the part, launch sites and operator of each of its kernels (None when
    it is a graph capture)."""

    trace: Trace
    attributor: attribute.Attributor
    kernel_parts: np.ndarray | None
    kernel_sites: pd.DataFrame | None  # launch_sites of its kernels, for an eager reference run
    kernel_op_rows: np.ndarray | None  # [reference kernels] its operator's row in trace.cpu_ops, -1 none

    @classmethod
    def of(cls, trace: Trace) -> "_Reference":
        part = sites = op_rows = None
        attributor = attribute.Attributor(trace)
        if attribute.is_reference_run(trace):
            la = attribute.launch_info(trace)
            part = parts.kernel_parts(trace.kernels["ts_us"].to_numpy(), la["launch_ts_us"].to_numpy(),
                                      la["launch_tid"].to_numpy(), trace.annotations)
            sites = launch_sites.launch_sites(trace, la, attributor)
            op_rows = attributor.operator_rows(la["external_id"].to_numpy(), la["launch_pid"].to_numpy(),
                                               la["launch_tid"].to_numpy(), la["launch_ts_us"].to_numpy())
        return cls(trace, attributor, part, sites, op_rows)


def _analyze_one(trace: Trace, reference: _Reference | None) -> dict[str, Any]:
    k = trace.kernels
    attributor = attribute.Attributor(trace)
    out: dict[str, Any] = {"attribution": {}, "steps": None, "parts": pd.DataFrame(), "cpu_table": None,
                           "has_stacks": attributor.has_stacks, "capture_match": {}, "glue": None,
                           "figures": None}
    summary: dict[str, Any] = {"rank": trace.rank, "file": str(trace.path), "device": trace.device,
                               "timeline": rank_balance.rank_timeline(trace)}
    if k.empty:
        cpu = cpu_ops.analyze_cpu_ops(trace.cpu_ops, trace.annotations)
        out.update({"cpu_table": cpu.table, "steps": cpu.steps, "parts": cpu.parts})
        out["summary"] = RankRow(
            **summary, gpu_time_us=0.0, cpu_self_us=cpu.total_us,
            categories=_rows(CategoryRow, rank.category_table(cpu.table, cpu.total_us)),
            kernels=_rows(KernelRow, cpu.table.head(RANK_TOP)[RANK_KERNEL_COLUMNS]),
        )
        return out
    total = rank.total_gpu_us(k)
    ktable = rank.kernel_table(k, total)
    launches = attribute.launch_info(trace)
    via = launches["via_graph"].to_numpy()
    top = ktable["name"].head(ATTRIBUTED_KERNELS).tolist()
    captured = cap_attr = None
    if reference is not None and via.any():
        captured = attribute.match_capture(k, launches, reference.trace)
        cap_attr = reference.attributor
        out["has_stacks"] = out["has_stacks"] or cap_attr.has_stacks
        found = (captured["cap_kernel"].to_numpy() >= 0) | np.isfinite(captured["cap_ts_us"].to_numpy())
        out["capture_match"] = {"replayed": int(via.sum()), "matched": int((via & found).sum())}
    out["attribution"] = attribute.attribute_top(k, launches, top, attributor, captured, cap_attr)

    launch_known = bool(np.isfinite(launches["launch_ts_us"].to_numpy()).mean() >= 0.95)
    source, ranges = steps.step_ranges(trace.annotations, prefer_cpu=launch_known)
    step_of = np.zeros(len(k), np.int64)  # no step ranges: the whole trace is one step
    if not ranges.empty:
        on_gpu = bool(ranges["on_gpu"].iat[0])
        lts = launches["launch_ts_us"].to_numpy()
        anchor = k["ts_us"].to_numpy() if on_gpu else np.where(np.isfinite(lts), lts, k["ts_us"].to_numpy())
        table = steps.step_table(k, anchor, ranges)
        idx = np.searchsorted(ranges["start_us"].to_numpy(), anchor, side="right") - 1
        inside = (idx >= 0) & (anchor <= ranges["end_us"].to_numpy()[np.clip(idx, 0, None)])
        out["steps"] = steps.steps_summary(source, table, k["dur_us"].to_numpy()[inside])
        step_of = np.where(inside, idx, -1)
    replayed = None
    if captured is not None and reference.kernel_op_rows is not None:
        replayed = figures.ReplayedOps(captured["cap_kernel"].to_numpy(), reference.kernel_op_rows, reference.trace.cpu_ops)
    category_of = dict(zip(ktable["name"], ktable["category"]))
    out["figures"] = figures.rank_figures(trace, launches, attributor, step_of, category_of, replayed)
    part = parts.kernel_parts(k["ts_us"].to_numpy(), launches["launch_ts_us"].to_numpy(),
                              launches["launch_tid"].to_numpy(), trace.annotations)
    if captured is not None and reference.kernel_parts is not None:
        part = parts.with_replayed_parts(part, via, captured["cap_kernel"].to_numpy(), reference.kernel_parts)
    part = parts.with_compiled_glue(part, k["name"])
    out["parts"] = parts.part_table_of(part, k["dur_us"].to_numpy(), total)
    sites = launch_sites.launch_sites(trace, launches, attributor)
    if via.any():
        sites = launch_sites.with_replayed_sites(sites, via, captured["cap_kernel"].to_numpy() if captured is not None
                                                 else np.full(len(k), -1), reference.kernel_sites if reference else None)
    n_steps = len(ranges) if not ranges.empty else 1
    out["glue"] = glue.glue_summary(_glue_sequence(k, step_of, part, sites), total, n_steps, rank=trace.rank)
    if part is not None:
        for name, where in _dominant_part(k, part, top).items():
            out["attribution"].setdefault(name, {})["part"] = where
    out["summary"] = RankRow(
        **summary, gpu_time_us=total, launches=int(len(k)), graph_replay_share=float(launches["via_graph"].mean()),
        categories=_rows(CategoryRow, rank.category_table(ktable, total)),
        kernels=_rows(KernelRow, ktable.head(RANK_TOP)[RANK_KERNEL_COLUMNS]),
    )
    return out


def _read(path: Path, rank: int | None, prefetch: Prefetch | None) -> Trace:
    shapes_of = efficiency.modelled_ops()
    cols = prefetch.take(path, shapes_of) if prefetch is not None else None
    return trace_of(cols, rank) if cols is not None else read_trace(path, rank=rank, shapes_of=shapes_of)


def _glue_sequence(k: pd.DataFrame, step_of: np.ndarray, part: np.ndarray | None, sites: pd.DataFrame) -> pd.DataFrame:
    """[GPU events] glue.SEQ_COLUMNS of one trace."""
    codes, distinct = factorize_names(k["name"])
    short = np.array([short_name(x) for x in distinct], dtype=object)
    eager = np.array([launch_sites.is_eager_kernel(x) for x in distinct], dtype=bool)
    return pd.DataFrame({
        "stream": factorize_rows(k["pid"].to_numpy(), k["tid"].to_numpy()), "ts_us": k["ts_us"].to_numpy(),
        "dur_us": k["dur_us"].to_numpy(), "category": classify_names(k["name"]).to_numpy(), "step": step_of,
        "part": part if part is not None else np.full(len(k), None, object),
        "site": sites["site"].to_numpy(), "op": sites["op"].to_numpy(), "op_call": sites["op_call"].to_numpy(),
        "frame_call": sites["frame_call"].to_numpy(), "name": short[codes],
        "handwritten": ~eager[codes], "bytes": np.full(len(k), np.nan),
    })


def _dominant_part(kernels: pd.DataFrame, part: np.ndarray, names: list[str]) -> dict[str, str]:
    """For each kernel name in `names`: the model part holding most of its GPU time."""
    frame = pd.DataFrame({"name": kernels["name"].astype(object).to_numpy(), "part": part,
                          "dur": kernels["dur_us"].to_numpy()})
    frame = frame[frame["name"].isin(names)]
    if frame.empty:
        return {}
    g = frame.groupby(["name", "part"], sort=False)["dur"].sum().reset_index()
    g = g.sort_values("dur", ascending=False, kind="mergesort").drop_duplicates("name")
    return dict(zip(g["name"], g["part"]))


@dataclass
class SavedProfiles:
    """A folder's saved profiles, each loaded or with why it could not be."""

    folder: Path
    profiles: list[tuple[Path, Profile]]
    unreadable: list[tuple[Path, str]]


def saved_profiles_in(folder: str | Path) -> SavedProfiles | None:
    """The saved profiles of a folder that holds profiles and no trace, in name order; None when it
    holds no profile (a folder of per-rank traces). A folder of both is refused in one line."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(q for q in folder.iterdir() if q.is_file() and (q.name.endswith(".json") or q.name.endswith(".json.gz")))
    saved = [q for q in files if is_profile_file(q)]
    if not saved:
        return None
    if len(saved) < len(files):
        raise ProfileError(f"{folder} holds both saved profiles ({len(saved)}) and traces ({len(files) - len(saved)}): "
                           "name the trace files to analyze them, or one profile to view it")
    out = SavedProfiles(folder, [], [])
    for q in saved:
        try:
            out.profiles.append((q, load_profile_or_trace(q)))
        except ProfileError as exc:
            out.unreadable.append((q, str(exc).removeprefix(f"{q}: ")))
    return out


def load_profile_or_trace(path: str | Path) -> Profile:
    """A saved profile (schema dsv4opt.profile/1) as is; anything else is analysed as a trace/folder.
    A JSON file naming another dsv4opt schema is refused in one line (a sweep summary: with its
    profiles)."""
    path = Path(path)
    if not is_profile_file(path):
        return analyze_paths([path])
    data = read_json(path, ProfileError, "profile")
    if isinstance(data, dict) and data.get("schema") == SWEEP_SCHEMA:
        listed = [row.profile for row in summary_rows(data, str(path))]
        shown = ", ".join(listed[:3]) + (f", … {len(listed)} in all" if len(listed) > 3 else "")
        raise ProfileError(f"{path}: is a sweep summary, not a profile; pass the profiles it lists ({shown or 'none'})")
    return Profile.from_dict(data, source=str(path))
