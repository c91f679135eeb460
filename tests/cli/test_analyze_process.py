"""`dsv4opt analyze` as its own process: what it imports, and the collector freeze that only a
one-command process may do."""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app

KERNEL = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.5}
# Heavy packages that analyze has no use for; importing one costs the whole process its start-up time.
UNUSED = ("torch", "triton", "matplotlib", "httpx", "scipy", "sglang")

RUN_MAIN = """
import gc, json, os, sys
from dsv4opt.cli import main
sys.argv = ["dsv4opt", "analyze", sys.argv[1], "--json", sys.argv[2]]
try:
    main()
except SystemExit:
    pass
print(json.dumps({"frozen": gc.get_freeze_count(), "collecting": gc.isenabled(),
                  "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(*sys.modules)"], capture_output=True,
                         text=True, check=True)
    return {m.split(".")[0] for m in out.stdout.split()}


def test_importing_the_cli_loads_no_analysis_or_unused_package():
    loaded = _modules_after("import dsv4opt.cli")
    assert not loaded & {*UNUSED, "pandas", "numpy"}


@pytest.mark.parametrize("user_blas", [None, "3"], ids=["blas-unset", "blas-set-by-user"])
def test_analyze_process_imports_nothing_unused_and_freezes(tmp_path, user_blas):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [KERNEL]}))
    out = tmp_path / "p.json"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user_blas:
        env["OPENBLAS_NUM_THREADS"] = user_blas
    r = subprocess.run([sys.executable, "-c", RUN_MAIN, str(t), str(out)], capture_output=True, text=True, check=True,
                       env=env)
    report = json.loads(r.stdout.splitlines()[-1])
    assert json.loads(out.read_text())["gpu_time_us"] == 2.5
    assert not set(report["modules"]) & set(UNUSED)
    assert report["frozen"] > 0 and report["collecting"]
    assert report["blas_threads"] == (user_blas or "1")  # the analysis makes no BLAS call


def test_analyze_in_process_freezes_and_sets_nothing(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [KERNEL]}))
    before, blas = gc.get_freeze_count(), os.environ.get("OPENBLAS_NUM_THREADS")
    r = CliRunner().invoke(app, ["analyze", str(t)])
    assert r.exit_code == 0, r.output
    assert gc.get_freeze_count() == before and gc.isenabled() and os.environ.get("OPENBLAS_NUM_THREADS") == blas


# main() with the helper's answers counted (trace/prefetch.py): True per file it handed over.
RUN_COUNTED = """
import json, sys
from dsv4opt.trace import prefetch
prefetch.MIN_BYTES = 0  # the fixtures are small
prefetch.MIN_FREE_CPUS = float("-inf")  # and the test runner keeps the CPUs busy
took = []
take = prefetch.Prefetch.take
def counted(self, path, shapes_of):
    cols = take(self, path, shapes_of)
    took.append(cols is not None)
    return cols
prefetch.Prefetch.take = counted
from dsv4opt.cli import main
sys.argv = ["dsv4opt", "analyze", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps({"took": took}))
"""


def _both_ways(tmp_path, args):
    """(process: stdout, stderr, files the helper handed over, profile) and the same in process."""
    env = dict(os.environ, COLUMNS="100")
    done = subprocess.run([sys.executable, "-c", RUN_COUNTED, *args, "--json", str(tmp_path / "a.json")],
                          capture_output=True, text=True, env=env)
    *lines, counted = done.stdout.splitlines()
    r = CliRunner().invoke(app, ["analyze", *args, "--json", str(tmp_path / "b.json")], env={"COLUMNS": "100"})
    profiles = []
    for name in ("a.json", "b.json"):
        p = tmp_path / name
        profiles.append(json.loads(p.read_text()) if p.exists() else None)
        if profiles[-1]:
            profiles[-1]["meta"].pop("date")
    process = ("\n".join(lines).replace("a.json", "OUT"), done.stderr, profiles[0])
    return process, json.loads(counted)["took"], (r.stdout.rstrip("\n").replace("b.json", "OUT"), r.stderr, profiles[1])


def test_analyze_process_reads_through_the_helper_and_prints_and_writes_the_same(tmp_path):
    from tests.helpers import DATA

    args = [str(DATA / "h200-dsv4flash-l3-c4-graph.trace.json.gz"), "--capture",
            str(DATA / "h200-dsv4flash-l3-c4-eager.trace.json.gz")]
    process, took, in_process = _both_ways(tmp_path, args)
    assert took == [True, True]  # the capture, then the trace
    assert process == in_process and process[2]["capture_match"]["matched"] > 0


def test_analyze_process_reports_a_corrupt_trace_as_in_process(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [KERNEL, dict(KERNEL, dur="abc")]}))
    process, took, in_process = _both_ways(tmp_path, [str(t)])
    assert took == []  # the helper's TraceError is raised by take, which counts no answer
    assert process == in_process and "event #1 (kernel) is corrupt" in process[1]


def test_the_command_line_scan_knows_every_option_of_analyze():
    import typer.main

    from dsv4opt.cli.analyze import FLAG_OPTIONS, VALUED_OPTIONS

    params = [p for p in typer.main.get_command(app).commands["analyze"].params if p.param_type_name == "option"]
    valued = {o for p in params if not p.is_flag for o in p.opts}
    flags = {o for p in params if p.is_flag for o in p.opts} - {"--help"}
    assert (set(VALUED_OPTIONS), set(FLAG_OPTIONS)) == (valued, flags)


@pytest.mark.parametrize("argv, wanted", [
    (["analyze", "a.json", "--json", "p.json", "--top", "5", "--wide", "b.json", "--force"], (["a.json", "b.json"], None)),
    (["analyze", "--capture", "eager.json.gz", "graph.json.gz"], (["graph.json.gz"], "eager.json.gz")),
    (["analyze", "a.json", "--json=p.json"], None),  # typer's to read
    (["analyze", "a.json", "--help"], None),
    (["analyze", "a.json", "--top"], None),
    (["analyze"], None),
    (["compare", "a.json", "b.json"], None),
], ids=["options-between", "capture", "equals-form", "help", "value-missing", "no-trace", "another-command"])
def test_the_command_line_scan_names_the_traces_or_leaves_them_to_typer(monkeypatch, argv, wanted):
    from dsv4opt.cli import analyze

    asked = []
    monkeypatch.setattr(analyze, "_prefetch", lambda traces, capture: asked.append((traces, capture)) or "helper")
    got = analyze.prefetch_from_argv(argv)
    if wanted is None:
        assert got is None and asked == []
    else:
        traces, capture = wanted
        assert got == "helper"
        assert asked == [([Path(t) for t in traces], Path(capture) if capture else None)]


# A refused option (--top takes a number) after the helper was started from the command line: no
# child is left behind.
RUN_REFUSED = """
import os, sys
from dsv4opt.trace import prefetch
prefetch.MIN_BYTES = 0
prefetch.MIN_FREE_CPUS = float("-inf")
from dsv4opt import cli
sys.argv = ["dsv4opt", "analyze", sys.argv[1], "--top", "many"]
try:
    cli.main()
except SystemExit as exc:
    code = exc.code
try:
    os.waitpid(-1, os.WNOHANG)
    left = "a child"
except ChildProcessError:
    left = "none"
print(code, left)
"""


def test_a_helper_started_from_the_command_line_is_reaped_when_typer_refuses(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [KERNEL]}))
    out = subprocess.run([sys.executable, "-c", RUN_REFUSED, str(t)], capture_output=True, text=True)
    assert out.stdout.split() == ["2", "none"], out.stderr
