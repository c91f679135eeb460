"""The forked reader of `dsv4opt analyze` (trace/prefetch.py): what comes back through the pipe is
what reading in process gives, a TraceError comes back as the same message, and anything
unexpected leaves the caller to read the file itself. Run in a fresh process: a test runner's
worker holds threads, and the helper is never forked from a threaded process."""

import json
import subprocess
import sys

import pytest

from tests.trace.traces import ids, real_traces

TRACES = real_traces()
EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 0.25, "args": {"correlation": 3}}

# Reads the files given through a Prefetch and in process, prints one JSON line per file: "same",
# the TraceError messages of both, or "none" when the helper gave no answer.
COMPARE = """
import json, os, sys, threading
from dsv4opt.analysis.modelled import modelled_ops
from dsv4opt.errors import TraceError
from dsv4opt.trace.columns import read_columns
from dsv4opt.trace import prefetch
from dsv4opt.trace.prefetch import Prefetch
prefetch.MIN_BYTES = 0  # the fixtures are small
prefetch.MIN_FREE_CPUS = float("-inf")  # and the test runner keeps the CPUs busy

def plain(c):
    tables = {k: {kind: {col: list(a) for col, a in getattr(getattr(c, k), kind).items()}
                  for kind in ("floats", "ints", "strings")}
              for k in ("kernels", "launches", "cpu_ops", "frames", "annotations", "flows")}
    return (tables, c.vocab, c.threads, c.shapes, c.header, c.process_names, c.event_count, c.skipped_events, c.path)

mode, paths = sys.argv[1], sys.argv[2:]
assert threading.active_count() == 1
pre = Prefetch.start(paths, modelled_ops())
assert pre is not None
if mode == "no-answer":  # as from a helper that died before writing
    pre._pipe.close()
    pre._pipe = open(os.devnull, "rb")
for i, p in enumerate(paths):
    if mode == "out-of-order" and i == 0:
        print(json.dumps({"got": "none" if pre.take(paths[-1], modelled_ops()) is None else "cols"}))
        continue
    try:
        got = pre.take(p, modelled_ops())
        got = "none" if got is None else plain(got)
    except TraceError as exc:
        got = "error: " + str(exc)
    try:
        want = plain(read_columns(p, modelled_ops()))
    except TraceError as exc:
        want = "error: " + str(exc)
    print(json.dumps({"got": got if isinstance(got, str) else ("same" if got == want else "differs"),
                      "want": want if isinstance(want, str) else "columns"}))
pre.close()
print(json.dumps({"helper": "reaped" if pre._pid is None else "left"}))
"""


def _run(mode, paths):
    out = subprocess.run([sys.executable, "-c", COMPARE, mode, *map(str, paths)], capture_output=True, text=True,
                         check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.skipif(not TRACES, reason="no real traces (../shared/traces absent, tests/data empty)")
def test_prefetched_columns_equal_reading_in_process():
    rows = _run("in-order", TRACES)
    assert rows[:-1] == [{"got": "same", "want": "columns"}] * len(TRACES), ids(TRACES)
    assert rows[-1] == {"helper": "reaped"}


def test_a_trace_error_comes_back_as_the_same_message_and_stops_the_helper(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"traceEvents": [EVENT]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [EVENT, dict(EVENT, dur="abc")]}))
    rows = _run("in-order", [good, bad, good])
    assert rows[0] == {"got": "same", "want": "columns"}
    assert rows[1]["got"] == rows[1]["want"] and "event #1 (kernel) is corrupt" in rows[1]["got"]
    assert rows[2] == {"got": "none", "want": "columns"}  # after an error the caller reads on itself


def test_a_file_asked_out_of_order_or_a_dead_helper_leaves_the_reading_to_the_caller(tmp_path):
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"t{i}.json")
        paths[-1].write_text(json.dumps({"traceEvents": [dict(EVENT, dur=i + 0.5)]}))
    assert _run("out-of-order", paths) == [{"got": "none"}, {"got": "none", "want": "columns"}, {"helper": "reaped"}]
    assert _run("no-answer", paths) == [{"got": "none", "want": "columns"}] * 2 + [{"helper": "reaped"}]


@pytest.mark.parametrize("settings", ["prefetch.MIN_FREE_CPUS = float('-inf')",  # a tiny file, CPUs free
                                      "prefetch.MIN_BYTES = 0; prefetch.MIN_FREE_CPUS = float('inf')"],  # none free
                         ids=["small-file", "no-free-cpu"])
def test_no_helper_where_it_would_not_pay(tmp_path, settings):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [EVENT]}))
    code = f"import sys; from dsv4opt.trace import prefetch; {settings}; print(prefetch.Prefetch.start([sys.argv[1]], frozenset()))"
    out = subprocess.run([sys.executable, "-c", code, str(t)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
