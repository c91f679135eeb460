"""Where each kernel of a trace was launched from, launch by launch: the operator and its call, the
innermost user Python frame (source site) and which call of it - what glue regions are keyed and
cut by (dsv4opt/analysis/glue.py). Graph-replayed kernels take their reference kernel's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsv4opt.analysis import attribute
from dsv4opt.analysis.codes import factorize_rows
from dsv4opt.analysis.names import demangle
from dsv4opt.trace.model import Trace

SITE_COLUMNS = ["site", "op", "op_call", "frame_call"]
# ATen's own eager kernels (and the copies and fills the runtime records as memcpy/memset): what
# glue fusion removes. Anything else (Triton, TileLang, cuBLAS, a library's kernel) is hand-written.
_EAGER = ("at::native::", "at_cuda_detail::", "Memcpy", "Memset")


def is_eager_kernel(name: str) -> bool:
    text = demangle(name)
    return any(mark in text for mark in _EAGER)


def launch_sites(trace: Trace, launches: pd.DataFrame, attributor: attribute.Attributor) -> pd.DataFrame:
    """[kernels] SITE_COLUMNS from this trace's own CPU side: None / -1 where unknown. op_call is the
    launch's External id (the operator call); frame_call numbers the user frame calls."""
    n = len(trace.kernels)
    ext = launches["external_id"].to_numpy()
    lpid, ltid = launches["launch_pid"].to_numpy(), launches["launch_tid"].to_numpy()
    lts = launches["launch_ts_us"].to_numpy()
    via = launches["via_graph"].to_numpy()
    direct = np.flatnonzero(~via)
    op = np.full(n, None, object)
    op[direct] = attributor.operators(np.where(ext[direct] >= 0, ext[direct], -1))
    gap = direct[(op[direct] == None) & np.isfinite(lts[direct])]  # noqa: E711 (elementwise)
    op[gap] = attributor.operators_at(lpid[gap], ltid[gap], lts[gap])
    site = np.full(n, None, object)
    frame_call = np.full(n, -1, np.int64)
    timed = direct[np.isfinite(lts[direct])]
    if attributor.has_stacks and len(timed):
        frame, start = attributor.frame_calls(lpid[timed], ltid[timed], lts[timed])
        found = frame != None  # noqa: E711
        rows = timed[found]
        distinct = pd.unique(frame[found])
        where = dict(zip(distinct, (attribute.frame_site(str(x)) for x in distinct)))
        site[rows] = [where[x] for x in frame[found]]
        # One number per call of a frame: its thread and start, in order of first launch.
        frame_call[rows] = factorize_rows(lpid[rows], ltid[rows], start[found])
    return pd.DataFrame({"site": site, "op": op, "op_call": np.where(~via & (ext >= 0), ext, -1).astype(np.int64),
                         "frame_call": frame_call})


def with_replayed_sites(own: pd.DataFrame, via: np.ndarray, reference_index: np.ndarray,
                        reference: pd.DataFrame | None) -> pd.DataFrame:
    """[kernels] sites of a graph-replay trace: a replayed kernel takes those of the reference
    kernel it was matched to (reference_index >= 0), else none; the others keep their own."""
    out = own.copy()
    out.loc[via, "site"] = None
    out.loc[via, "op"] = None
    out.loc[via, ["op_call", "frame_call"]] = -1
    if reference is None:
        return out
    matched = via & (reference_index >= 0)
    j = reference_index[matched]
    out.loc[matched, "site"] = reference["site"].to_numpy()[j]
    out.loc[matched, "op"] = reference["op"].to_numpy()[j]
    # Call numbers of the reference live in their own range, apart from this trace's.
    offset = int(max(own["frame_call"].max(), own["op_call"].max(), 0)) + 1 if len(own) else 0
    ref_op, ref_frame = reference["op_call"].to_numpy()[j], reference["frame_call"].to_numpy()[j]
    out.loc[matched, "op_call"] = np.where(ref_op >= 0, ref_op + offset, -1)
    out.loc[matched, "frame_call"] = np.where(ref_frame >= 0, ref_frame + offset, -1)
    return out
