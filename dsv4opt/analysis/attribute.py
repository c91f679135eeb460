"""Who launched each kernel: the CPU operator (ac2g flow / correlation / External id), the source
line (innermost Python frame outside torch, when the trace has stacks), and whether it came from a
CUDA-graph replay - where correlation ids point at the one graph launch, not at the operator."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsv4opt.analysis.codes import factorize_names
from dsv4opt.analysis.intervals import Intervals
from dsv4opt.trace.model import Trace

SAMPLES_PER_KERNEL = 32
_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)
_KERNEL_LAUNCH = re.compile(r"Launch(?:Kernel|CooperativeKernel)|ModuleLaunch|cuLaunch", re.IGNORECASE)
_BEGIN_CAPTURE = re.compile(r"StreamBeginCapture", re.IGNORECASE)
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
# Frames that are machinery, not the user's model code.
_LIBRARY = re.compile(r"(^|/)(torch|triton|contextlib\.py|threading\.py|runpy\.py)(/|$)|site-packages/torch/|^<built-in|^nn\.Module|^torch/|^<frozen|^\w+\.py\(\d+\): _call_impl")


def launch_info(trace: Trace) -> pd.DataFrame:
    """[kernels] launch_ts_us, launch_pid, launch_tid, launch_name, external_id, via_graph (bool).

    Kernels whose launch cannot be found get launch_ts_us = NaN and keep their own External id.
    """
    k = trace.kernels
    n = len(k)
    out = pd.DataFrame({
        "launch_ts_us": np.full(n, np.nan),
        "launch_pid": np.full(n, -1, np.int64),
        "launch_tid": np.full(n, -1, np.int64),
        "launch_name": np.full(n, "", object),
        "external_id": k["external_id"].to_numpy().copy(),
        "via_graph": np.zeros(n, bool),
    })
    if n == 0 or trace.launches.empty:
        return out
    la = trace.launches[trace.launches["correlation"] >= 0].drop_duplicates("correlation")
    la = la.set_index("correlation")
    pos = la.index.get_indexer(k["correlation"].to_numpy())
    found = pos >= 0
    p = pos[found]
    cols = {c: out[c].to_numpy().copy() for c in out}
    cols["launch_ts_us"][found] = la["ts_us"].to_numpy()[p]
    cols["launch_pid"][found] = la["pid"].to_numpy()[p]
    cols["launch_tid"][found] = la["tid"].to_numpy()[p]
    codes, distinct = factorize_names(la["name"])
    cols["launch_name"] = np.full(n, "", object)
    cols["launch_name"][found] = distinct[codes[p]]
    graph = np.array([bool(_GRAPH_LAUNCH.search(x)) for x in distinct], bool)[codes[p]]
    via = cols["via_graph"]
    via[np.flatnonzero(found)[graph]] = True
    ext = cols["external_id"]
    launch_ext = la["external_id"].to_numpy()[p]
    fill = found & (ext < 0)
    ext[fill] = launch_ext[fill[found]]
    # A graph launch's External id names the replay call, not the operator that built the kernel.
    ext[via] = -1
    return pd.DataFrame(cols)


def frame_location(name: str) -> str:
    """'/x/y/indexer.py(204): forward' -> 'indexer.py:204'."""
    m = _FRAME.match(name)
    if not m:
        return name
    return f"{Path(m.group('file')).name}:{m.group('line')}"


def frame_site(name: str) -> str:
    """'/x/y/glue.py(59): moe_act_eager' -> 'glue.py:59 moe_act_eager' (the line is the function's)."""
    m = _FRAME.match(name)
    if not m:
        return name
    return f"{Path(m.group('file')).name}:{m.group('line')} {m.group('func')}"


def is_user_frame(name: str) -> bool:
    return not _LIBRARY.search(name)


class Attributor:
    """Looks up operators and source lines in one trace (the replay trace, or a capture trace), for
    many launches at once: arrays in, arrays of names (None where unknown) out."""

    def __init__(self, trace: Trace):
        ops = trace.cpu_ops
        self._op_names = np.append(ops["name"].astype(object).to_numpy(), None)  # [ops + 1]: -1 -> None
        # Innermost operator per External id: the shortest one.
        row = np.flatnonzero(ops["external_id"].to_numpy() >= 0)
        row = row[np.argsort(ops["dur_us"].to_numpy()[row], kind="mergesort")]
        ext = ops["external_id"].to_numpy()[row]
        first = ~pd.Index(ext).duplicated()
        self._op_row_by_ext = pd.Series(row[first], index=ext[first])
        # Older Kineto traces reuse the correlation id as External id; then the operator is the
        # innermost cpu_op around the launch on its thread.
        self._op_ranges = None
        if not ops.empty:
            start = ops["ts_us"].to_numpy()
            self._op_ranges = Intervals.of(start, start + ops["dur_us"].to_numpy(),
                                           _thread(ops["pid"].to_numpy(), ops["tid"].to_numpy()))
        self._frames = None
        f = trace.frames
        if not f.empty:
            codes, distinct = factorize_names(f["name"])
            keep = np.array([is_user_frame(x) for x in distinct], dtype=bool)[codes]
            if keep.any():
                self._frames = _Ranges.of(f[keep], distinct[codes[keep]])

    def operator_rows(self, external_id: np.ndarray, pid: np.ndarray | None = None, tid: np.ndarray | None = None,
                      ts_us: np.ndarray | None = None) -> np.ndarray:
        """[launches] the row in cpu_ops of each launch's operator: by External id, else (when the
        launch's thread and time are given) the innermost operator around it; -1 when none."""
        external_id = np.asarray(external_id, np.int64)
        rows = np.full(len(external_id), -1, np.int64)
        if len(self._op_row_by_ext):
            pos = self._op_row_by_ext.index.get_indexer(external_id)
            hit = (external_id >= 0) & (pos >= 0)
            rows[hit] = self._op_row_by_ext.to_numpy()[pos[hit]]
        if ts_us is not None and self._op_ranges is not None:
            gap = rows < 0
            rows[gap] = self._op_ranges.innermost(np.asarray(ts_us, float)[gap], _thread(pid[gap], tid[gap]))
        return rows

    def operators(self, external_id: np.ndarray) -> np.ndarray:
        """[launches] the operator each External id names (None for -1 or unknown ids)."""
        return self._op_names[self.operator_rows(external_id)]

    def operators_at(self, pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray) -> np.ndarray:
        """[launches] innermost cpu_op around each time on its thread."""
        if self._op_ranges is None:
            return np.full(len(ts_us), None, object)
        return self._op_names[self._op_ranges.innermost(ts_us, _thread(pid, tid))]

    def locations(self, pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray) -> np.ndarray:
        """[launches] innermost user frame enclosing each time on its thread, as 'file.py:line'."""
        if self._frames is None:
            return np.full(len(ts_us), None, object)
        found = self._frames.innermost(pid, tid, ts_us)
        distinct = pd.unique(found[found != None])  # noqa: E711 (elementwise)
        where = dict(zip(distinct, (frame_location(str(x)) for x in distinct)))
        return np.array([None if x is None else where[x] for x in found], object)

    def frame_calls(self, pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[launches] the innermost user frame enclosing each time on its thread (raw frame name,
        None when none) and when that call of it started (NaN when none): which call it was."""
        if self._frames is None:
            return np.full(len(ts_us), None, object), np.full(len(ts_us), np.nan)
        return self._frames.innermost_with_start(pid, tid, ts_us)

    @property
    def has_stacks(self) -> bool:
        return self._frames is not None


@dataclass(frozen=True)
class _Ranges:
    """Named ranges of a trace's threads (operators, Python frames) for innermost-range lookups."""

    intervals: Intervals
    names: np.ndarray  # [ranges + 1] object; the last entry (None) stands for "no range"
    start: np.ndarray  # [ranges + 1] float; the last entry NaN

    @classmethod
    def of(cls, table: pd.DataFrame, names: np.ndarray) -> "_Ranges | None":
        if table.empty:
            return None
        start = table["ts_us"].to_numpy()
        thread = _thread(table["pid"].to_numpy(), table["tid"].to_numpy())
        return cls(Intervals.of(start, start + table["dur_us"].to_numpy(), thread), np.append(names, None),
                   np.append(start, np.nan))

    def innermost(self, pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray) -> np.ndarray:
        return self.names[self.intervals.innermost(ts_us, _thread(pid, tid))]

    def innermost_with_start(self, pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        row = self.intervals.innermost(ts_us, _thread(pid, tid))
        return self.names[row], self.start[row]


def _thread(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return np.asarray(pid, np.int64) * (1 << 32) + np.asarray(tid, np.int64)


def match_capture(kernels: pd.DataFrame, launches: pd.DataFrame, capture: Trace) -> pd.DataFrame:
    """[kernels] cap_external_id, cap_pid, cap_tid, cap_ts_us: the captured launch each graph-replayed
    kernel came from (-1/NaN where none); cap_kernel: the row in capture.kernels it was matched to
    when the capture is an eager reference run (-1 otherwise).

    An eager reference (the capture trace has GPU kernels and no Stream{Begin}Capture call: the same
    step run without the graph, as the embedded workload records it) is matched by kernel name, see
    match_reference. Otherwise the capture trace is a graph capture: it is cut into captures at each
    Stream{Begin,End}Capture call (one graph each; the whole trace when it has none). Per graph
    launch, its replayed kernels (by start time) are walked against each capture's kernel launches
    (by time); when the capture records kernel names (HIP does) the next launch with the same name is
    taken and the capture with most matches wins; without names only a capture with exactly as many
    launches as the replay is used, position by position. Anything else stays unmatched.
    """
    if is_reference_run(capture):
        return match_reference(kernels, launches, capture)
    n = len(kernels)
    cols = _unmatched(n)
    cl = capture.launches
    if n == 0 or cl.empty:
        return pd.DataFrame(cols)
    cl = cl.sort_values("ts_us", kind="mergesort")
    cnames = cl["name"].astype(object).to_numpy()
    is_launch = np.array([bool(_KERNEL_LAUNCH.search(x)) and not _GRAPH_LAUNCH.search(x) for x in cnames], bool)
    is_begin = np.array([bool(_BEGIN_CAPTURE.search(x)) for x in cnames], bool)
    segment = np.cumsum(is_begin)[is_launch]
    cap = cl[is_launch]
    if cap.empty:
        return pd.DataFrame(cols)
    cap_kernel = cap["kernel"].astype(object).to_numpy()
    have_names = bool((cap_kernel != "").any())
    captures = [np.flatnonzero(segment == s) for s in np.unique(segment)]
    via = launches["via_graph"].to_numpy()
    corr = kernels["correlation"].to_numpy()
    knames = kernels["name"].astype(object).to_numpy()
    ts = kernels["ts_us"].to_numpy()
    c_ext, c_pid, c_tid, c_ts = (cap[c].to_numpy() for c in ("external_id", "pid", "tid", "ts_us"))
    # Graph memcpy/memset nodes were not captured through a kernel-launch call: match kernels only.
    replayed = via & (kernels["cat"].astype(object).to_numpy() == "kernel")
    for c_id in np.unique(corr[replayed]):
        idx = np.flatnonzero(replayed & (corr == c_id))
        idx = idx[np.argsort(ts[idx], kind="mergesort")]
        best: list[tuple[int, int]] = []
        for rows in captures:
            pairs = _align_by_name(idx, knames, rows, cap_kernel) if have_names else (
                list(zip(idx, rows)) if len(rows) == len(idx) else [])
            if len(pairs) > len(best):
                best = pairs
        for i, j in best:
            cols["cap_external_id"][i] = c_ext[j]
            cols["cap_pid"][i] = c_pid[j]
            cols["cap_tid"][i] = c_tid[j]
            cols["cap_ts_us"][i] = c_ts[j]
    return pd.DataFrame(cols)


def is_reference_run(capture: Trace) -> bool:
    """True when the capture trace is an eager run of the step (its kernels ran) rather than a graph
    capture (whose launches were recorded into a graph between Stream{Begin,End}Capture calls)."""
    if capture.kernels.empty:
        return False
    names = capture.launches["name"].astype(object)
    return not names.str.contains(_BEGIN_CAPTURE.pattern, case=False, regex=True).fillna(False).any()


def match_reference(kernels: pd.DataFrame, launches: pd.DataFrame, reference: Trace) -> pd.DataFrame:
    """match_capture's columns for an eager reference run: per graph launch, its replayed GPU events
    (kernels, memcpy and memset nodes, by start time) are aligned with the reference's GPU events (by
    start time) by name with a shortest-edit-script alignment (align_names), so a few kernels present
    on one side only (graph memcpy nodes, kernels that differ between eager and graph) are skipped
    rather than shifting every later match. A replayed kernel whose name has no counterpart at its
    place in the order stays unmatched. The reference should hold one step: each graph launch is
    aligned with all of it. Graph launches replaying the same kernel sequence share one alignment."""
    n = len(kernels)
    cols = _unmatched(n)
    via = launches["via_graph"].to_numpy()
    ref = reference.kernels
    if n == 0 or ref.empty or not via.any():
        return pd.DataFrame(cols)
    ref_launch = launch_info(reference)
    ref_order = np.argsort(ref["ts_us"].to_numpy(), kind="mergesort")
    replayed = np.flatnonzero(via)
    corr = kernels["correlation"].to_numpy()[replayed]
    replayed = replayed[np.lexsort((kernels["ts_us"].to_numpy()[replayed], corr))]
    codes, _ = pd.factorize(np.concatenate([kernels["name"].astype(object).to_numpy()[replayed],
                                            ref["name"].astype(object).to_numpy()[ref_order]]))
    rep_codes, ref_codes = codes[: len(replayed)], codes[len(replayed):].tolist()
    starts = np.flatnonzero(np.diff(kernels["correlation"].to_numpy()[replayed])) + 1
    alignments: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    rep_rows, ref_rows = [], []
    for seg in np.split(np.arange(len(replayed)), starts):
        key = rep_codes[seg].tobytes()
        if key not in alignments:
            alignments[key] = align_names(rep_codes[seg].tolist(), ref_codes)
        ia, ib = alignments[key]
        rep_rows.append(replayed[seg[ia]])
        ref_rows.append(ref_order[ib])
    i, j = np.concatenate(rep_rows), np.concatenate(ref_rows)
    cols["cap_kernel"][i] = j
    cols["cap_external_id"][i] = ref_launch["external_id"].to_numpy()[j]
    cols["cap_pid"][i] = ref_launch["launch_pid"].to_numpy()[j]
    cols["cap_tid"][i] = ref_launch["launch_tid"].to_numpy()[j]
    cols["cap_ts_us"][i] = ref_launch["launch_ts_us"].to_numpy()[j]
    return pd.DataFrame(cols)


def align_names(a: list, b: list, max_edits: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Positions (ia, ib) of a longest in-order pairing of equal items of a and b (Myers' shortest edit
    script). When more than max_edits insertions+deletions would be needed (default: a quarter of
    both lengths, at most 2000, which bounds the work) the sequences are too different to pair
    honestly and nothing is matched."""
    n, m = len(a), len(b)
    head = 0
    while head < n and head < m and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and a[n - 1 - tail] == b[m - 1 - tail]:
        tail += 1
    A, B = a[head:n - tail], b[head:m - tail]
    N, M = len(A), len(B)
    if max_edits is None:
        max_edits = min(2000, max(16, (n + m) // 4))
    # v[k]: furthest x on diagonal k = x - y; history[d] is v before edit d, for the walk back.
    v = {1: 0}
    history = []
    found = N == 0 and M == 0
    d = 0
    if not found:
        for d in range(max_edits + 1):
            history.append(v.copy())
            for k in range(-d, d + 1, 2):
                x = v[k + 1] if k == -d or (k != d and v[k - 1] < v[k + 1]) else v[k - 1] + 1
                y = x - k
                while x < N and y < M and A[x] == B[y]:
                    x += 1
                    y += 1
                v[k] = x
                if x >= N and y >= M:
                    found = True
                    break
            if found:
                break
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs: list[tuple[int, int]] = []
    x, y = N, M
    for e in range(len(history) - 1, -1, -1):
        hv = history[e]
        k = x - y
        prev_k = k + 1 if k == -e or (k != e and hv[k - 1] < hv[k + 1]) else k - 1
        prev_x = hv[prev_k]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:
        x -= 1
        y -= 1
        pairs.append((x, y))
    mid = np.array(pairs[::-1], np.int64).reshape(-1, 2)
    ia = np.concatenate([np.arange(head), mid[:, 0] + head, np.arange(n - tail, n)]).astype(np.int64)
    ib = np.concatenate([np.arange(head), mid[:, 1] + head, np.arange(m - tail, m)]).astype(np.int64)
    return ia, ib


def _unmatched(n: int) -> dict[str, np.ndarray]:
    return {"cap_external_id": np.full(n, -1, np.int64), "cap_pid": np.full(n, -1, np.int64),
            "cap_tid": np.full(n, -1, np.int64), "cap_ts_us": np.full(n, np.nan),
            "cap_kernel": np.full(n, -1, np.int64)}


def _align_by_name(replayed: np.ndarray, knames: np.ndarray, rows: np.ndarray, cap_kernel: np.ndarray) -> list[tuple[int, int]]:
    """Greedy in-order alignment: each replayed kernel takes the next captured launch of the same name."""
    pairs = []
    j = 0
    for i in replayed:
        k = j
        while k < len(rows) and cap_kernel[rows[k]] != knames[i]:
            k += 1
        if k < len(rows):
            pairs.append((i, rows[k]))
            j = k + 1
    return pairs


def attribute_top(kernels: pd.DataFrame, launches: pd.DataFrame, names: list[str], attributor: Attributor,
                  captured: pd.DataFrame | None = None, capture_attributor: Attributor | None = None) -> dict[str, dict]:
    """For each kernel name in `names`: launched_by, source, graph_replay_share (and how many replayed
    launches were matched to a capture), from a sample of up to SAMPLES_PER_KERNEL launches; the
    most common operator/line wins (ties: the one met first). Replayed kernels with no capture
    match are attributed to the graph replay itself, never guessed."""
    if kernels.empty:
        return {}
    codes, distinct = factorize_names(kernels["name"])
    wanted = set(names)
    rows = np.flatnonzero(np.array([x in wanted for x in distinct], dtype=bool)[codes])
    # By code, which counts up in order of first appearance as the names would group.
    groups = {distinct[c]: pos for c, pos in pd.Series(rows).groupby(codes[rows], sort=False).indices.items()}
    via = launches["via_graph"].to_numpy()
    sample = np.concatenate([rows[pos[np.linspace(0, len(pos) - 1, min(len(pos), SAMPLES_PER_KERNEL)).astype(int)]]
                             for pos in groups.values()]) if groups else np.zeros(0, np.int64)
    s_name = distinct[codes[sample]]
    lpid, ltid, lts = (launches[c].to_numpy()[sample] for c in ("launch_pid", "launch_tid", "launch_ts_us"))
    s_via = via[sample]
    ops = attributor.operators(launches["external_id"].to_numpy()[sample])
    unknown = ops == None  # noqa: E711 (elementwise)
    ops[unknown] = attributor.operators_at(lpid[unknown], ltid[unknown], lts[unknown])
    locs = attributor.locations(lpid, ltid, lts)
    # Graph replays: the capture's launch when one was matched, else the replay call itself.
    matched = np.zeros(len(sample), bool)
    if captured is not None and capture_attributor is not None:
        found = (captured["cap_kernel"].to_numpy() >= 0) | np.isfinite(captured["cap_ts_us"].to_numpy())
        matched = s_via & found[sample]
        m = sample[matched]
        c_pid, c_tid, c_ts = (captured[c].to_numpy()[m] for c in ("cap_pid", "cap_tid", "cap_ts_us"))
        c_ops = capture_attributor.operators(captured["cap_external_id"].to_numpy()[m])
        gap = c_ops == None  # noqa: E711
        c_ops[gap] = capture_attributor.operators_at(c_pid[gap], c_tid[gap], c_ts[gap])
        ops[matched] = c_ops
        locs[matched] = capture_attributor.locations(c_pid, c_tid, c_ts)
    replay = s_via & ~matched
    ops[replay] = [f"{x} (graph replay)" for x in launches["launch_name"].to_numpy()[sample[replay]]]
    locs[replay] = [None if x is None else f"graph replay at {x}" for x in locs[replay]]

    launched_by, source = _most_common(s_name, ops), _most_common(s_name, locs)
    out: dict[str, dict] = {}
    for name, pos in groups.items():
        row = {
            "launched_by": launched_by.get(name),
            "source": source.get(name),
            "graph_replay_share": float(via[rows[pos]].mean()),
        }
        mine = s_name == name
        if captured is not None and s_via[mine].any():
            row["capture_matched"] = f"{int(matched[mine].sum())}/{int(s_via[mine].sum())} sampled"
        out[name] = row
    return out


def _most_common(keys: np.ndarray, values: np.ndarray) -> dict:
    """key -> its most frequent non-empty value; ties go to the value met first."""
    # A plain count: the samples are a few hundred, where a pandas group-by costs more to set up.
    seen: dict[tuple, list[int]] = {}  # (key, value) -> [count, first position]
    for i, (k, v) in enumerate(zip(keys.tolist(), values.tolist())):
        if v is not None and v != "":
            seen.setdefault((k, v), [0, i])[0] += 1
    best: dict = {}
    for (k, v), (n, first) in seen.items():
        if k not in best or (n, -first) > best[k][:2]:
            best[k] = (n, -first, v)
    return {k: v for k, (_, _, v) in best.items()}
