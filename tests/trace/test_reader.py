import gzip
import json
import math

import pytest

from dsv4opt.errors import TraceError
from dsv4opt.trace import expand_trace_paths, rank_from_name, read_trace
from tests.helpers import SHARED_TRACES
from tests.trace.traces import ids, plain_gpu_sums, real_traces

TRACES = real_traces()


@pytest.mark.skipif(not TRACES, reason="no real traces (../shared/traces absent, tests/data empty)")
@pytest.mark.parametrize("path", TRACES, ids=ids(TRACES))
def test_gpu_totals_equal_raw_sums(path):
    total, per_name, counts = plain_gpu_sums(path)
    trace = read_trace(path)
    assert trace.gpu_time_us == total  # fsum on both sides: exact, sub-µs kept
    got = trace.kernels.groupby(trace.kernels["name"].astype(object))["dur_us"].agg(["sum", "size"])
    assert set(got.index) == set(per_name)
    for name, row in got.iterrows():
        assert row["size"] == counts[name]
        assert math.isclose(row["sum"], per_name[name], rel_tol=1e-12, abs_tol=1e-9)


def _write(tmp_path, name, payload, gz=False):
    p = tmp_path / name
    data = payload.encode() if isinstance(payload, str) else payload
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 0.25, "args": {"correlation": 3}}


def test_cpu_events_with_stream_arg_are_not_gpu_work(tmp_path):
    cpu = {"ph": "X", "cat": "cpu_op", "name": "triton launch", "pid": 1, "tid": 1, "ts": 1, "dur": 50, "args": {"stream": 7}}
    p = _write(tmp_path, "t.json", json.dumps({"traceEvents": [EVENT, cpu, dict(EVENT, cat="gpu_memset", dur=0.125)]}))
    assert read_trace(p).gpu_time_us == 0.375


def test_bare_array_and_gzip_sniffed_by_content(tmp_path):
    p = _write(tmp_path, "plain-name.json", json.dumps([EVENT, EVENT]), gz=True)
    assert read_trace(p).gpu_time_us == 0.5


def test_events_spanning_many_windows(tmp_path, monkeypatch):
    from dsv4opt.trace import stream

    monkeypatch.setattr(stream, "CHUNK_CHARS", 97)
    events = [dict(EVENT, ts=i * 1.0, dur=0.001 * (i + 1), name=f"kernel_{i % 3}") for i in range(200)]
    p = _write(tmp_path, "t.json", json.dumps({"meta": {"a": [1, 2]}, "traceEvents": events, "deviceProperties": [{"name": "H200"}]}, indent=2))
    trace = read_trace(p)
    assert trace.gpu_time_us == math.fsum(e["dur"] for e in events)
    assert trace.device == "H200"


BAD = {
    "empty": ("", "empty"),
    "random_bytes": (bytes(range(256)) * 4, "not"),
    "truncated_json": ('{"traceEvents": [' + json.dumps(EVENT) + ", " + json.dumps(EVENT)[:20], "truncated"),
    "no_trace_events": ('{"schemaVersion": 1}', "no traceEvents"),
    "trace_events_null": ('{"traceEvents": null}', "null"),
    "corrupt_event_dur": (json.dumps({"traceEvents": [dict(EVENT, dur="abc")]}), "corrupt"),
    "corrupt_event_syntax": ('{"traceEvents": [{"ph": "X", "cat": "kernel" "name": "k"}, ' + json.dumps(EVENT) * 1 + "]}", "not valid JSON"),
    "event_not_object": ('{"traceEvents": [1, 2]}', "not a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_naming_the_file(tmp_path, case):
    payload, words = BAD[case]
    p = _write(tmp_path, f"{case}.json", payload)
    with pytest.raises(TraceError) as exc:
        read_trace(p)
    msg = str(exc.value)
    assert "\n" not in msg and str(p) in msg and words in msg


@pytest.mark.parametrize("at", [0, 1, 150, 199])
def test_a_corrupt_event_is_named_by_its_place_in_the_file(tmp_path, monkeypatch, at):
    from dsv4opt.trace import stream

    monkeypatch.setattr(stream, "CHUNK_CHARS", 500)  # the events arrive in many runs
    events = [dict(EVENT, ts=float(i)) for i in range(200)]
    events[at] = dict(EVENT, dur=-1.0)
    p = _write(tmp_path, "t.json", json.dumps({"traceEvents": events}))
    with pytest.raises(TraceError, match=rf"event #{at} \(kernel\) is corrupt"):
        read_trace(p)


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps({"traceEvents": [EVENT] * 2000}).encode())
    p = _write(tmp_path, "t.json.gz", data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        read_trace(p)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        expand_trace_paths([tmp_path / "nope.json"])
    with pytest.raises(TraceError, match="no .json"):
        expand_trace_paths([tmp_path])


def test_folder_of_ranks_sorted_by_rank(tmp_path):
    for r in (10, 2, 0):
        _write(tmp_path, f"1700-TP-{r}-DP-0-EP-{r}-DECODE.trace.json.gz", json.dumps([EVENT]), gz=True)
    files = expand_trace_paths([tmp_path])
    assert [rank_from_name(f.name) for f in files] == [0, 2, 10]
    assert rank_from_name("abc-TP-3-EXTEND.trace.json.gz") == 3
    assert rank_from_name("trace.json") is None


TRICKY = [
    # a name holding an event boundary, args that are not an object, nested objects in lists
    dict(EVENT, name='k}, {"ph": "X", "cat": "kernel"', dur=0.5),
    dict(EVENT, args="not an object", dur=0.75),
    dict(EVENT, args={"correlation": 9, "list": [{"a": 1}, {"b": [{}, {}]}], "s": "}, {"}, dur=1.0),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 3, "dur": 4,
     "args": {"External id": 5, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}},
]


@pytest.mark.parametrize("chunk", [64, 4096, 1 << 22], ids=["tiny-window", "small-window", "default-window"])
def test_runs_cut_at_false_boundaries_still_read_every_event(tmp_path, monkeypatch, chunk):
    from dsv4opt.trace import stream

    monkeypatch.setattr(stream, "CHUNK_CHARS", chunk)
    events = [dict(e, ts=float(i)) for i in range(60) for e in TRICKY]
    p = _write(tmp_path, "t.json", json.dumps({"traceEvents": events}))
    trace = read_trace(p, shapes_of=frozenset({"aten::mm"}))
    gpu = [e for e in events if e["cat"] == "kernel"]
    assert trace.gpu_time_us == math.fsum(e["dur"] for e in gpu) and trace.event_count == len(events)
    assert trace.kernels["name"].astype(object).tolist() == [e["name"] for e in gpu]
    assert trace.kernels["correlation"].tolist() == [e["args"].get("correlation", -1) if isinstance(e["args"], dict) else -1 for e in gpu]
    shapes = trace.cpu_ops["shapes"].tolist()
    assert len(shapes) == 60 and all(s.dims == [[4, 8], [8, 16]] and s.types == ["float", "float"] for s in shapes)


@pytest.mark.parametrize("layout", [{}, {"indent": 2}, {"separators": (",", ":")}], ids=["default", "indented", "compact"])
@pytest.mark.parametrize("chunk", [64, 1 << 22], ids=["tiny-window", "default-window"])
def test_recorded_shapes_whatever_the_layout(tmp_path, monkeypatch, layout, chunk):
    from dsv4opt.trace import stream

    monkeypatch.setattr(stream, "CHUNK_CHARS", chunk)
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 3, "dur": 4,
          "args": {"Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "c10::BFloat16"], "Concrete Inputs": ["", "µ"]}}
    bare = dict(op, args={"Input Dims": [[4, 8], [8, 16]]})
    events = [dict(e, ts=float(i)) for i in range(20) for e in (op, bare, dict(op, name="aten::add"))]
    p = _write(tmp_path, "t.json", json.dumps({"traceEvents": events}, **layout))
    shapes = read_trace(p, shapes_of=frozenset({"aten::mm"})).cpu_ops["shapes"].tolist()
    assert shapes[0::3] == [([[4, 8], [8, 16]], ["float", "c10::BFloat16"], ["", "µ"])] * 20
    assert shapes[1::3] == [([[4, 8], [8, 16]], [], [])] * 20 and shapes[2::3] == [None] * 20


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_recorded_shapes_as_in_the_file():
    path = SHARED_TRACES / "tracelens_h100_qwen1.5_0.5b.json.gz"
    with gzip.open(path, "rt") as f:
        want = [e["args"]["Input Dims"] for e in json.load(f)["traceEvents"]
                if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    ops = read_trace(path, shapes_of=frozenset({"aten::addmm"})).cpu_ops
    got = ops["shapes"][ops["name"].astype(object) == "aten::addmm"].tolist()
    assert want and [s.dims for s in got] == want
    assert ops["shapes"][ops["name"].astype(object) != "aten::addmm"].isna().all()
