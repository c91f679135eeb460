"""`dsv4opt profile --ranks N` on a CPU over gloo, end to end: the profile, the per-rank traces, the
ranks' balance against plain sums over those traces, and the refusals and failures as one line."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from dsv4opt.trace.files import SGLANG_TRACE_NAME, rank_from_name
from tests.helpers import REPO, merged_intervals

runner = CliRunner()
RUN = ["profile", "--config", "dsv4-tiny", "--device", "cpu", "--concurrency", "2", "--context", "24",
       "--steps", "1", "--warmup", "0", "--repeat", "2", "--layout", "dp-ep"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank run, shared by the tests that read it."""
    root = tmp_path_factory.mktemp("ranks2")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("DSV4OPT_STATE", str(root / "state" / "state.json"))
        mp.setenv("TRITON_INTERPRET", "0")
        (root / "traces").mkdir()
        result = runner.invoke(app, RUN + ["--ranks", "2", "--trace-dir", str(root / "traces")])
    saved = list((root / "profiles").glob("embedded-dsv4-tiny-c2-r2-baseline-*.json"))
    return result, saved, root / "traces"


def test_two_ranks_write_one_profile_of_two_ranks(two_ranks):
    result, saved, _ = two_ranks
    assert result.exit_code == 0, result.output
    assert len(saved) == 1
    prof = Profile.load(saved[0])
    meta = prof.meta
    assert (meta["ranks"], meta["expert_parallel"], meta["backend"], meta["concurrency"]) == (2, 2, "gloo", 2)
    assert meta["settings"]["ranks"] == 2 and len(meta["contexts"]) == 4
    t = prof.throughput
    assert len(t["ms_per_step_windows"]) == 2 and len(t["ms_per_step_by_rank"]) == 2
    assert t["ms_per_step"] >= min(t["ms_per_step_by_rank"])  # each window at its slowest rank's pace
    assert abs(t["tokens_per_s"] - 2 * 2 * 1000 / t["ms_per_step"]) < 1e-6
    assert abs(t["tokens_per_s_per_rank"] - 2 * 1000 / t["ms_per_step"]) < 1e-6
    assert [r.rank for r in prof.ranks] == [0, 1]
    assert prof.category_share("communication") > 0
    for line in ("2 ranks of dp-ep over gloo", "per rank", "slowest rank"):
        assert line in result.output


def test_each_rank_writes_a_trace_named_as_sglang_names_its_ranks(two_ranks):
    _, _, traces = two_ranks
    files = sorted(traces.glob("*.trace.json.gz"))
    assert [rank_from_name(f.name) for f in files] == [0, 1]
    assert all(SGLANG_TRACE_NAME.match(f.name) for f in files)
    for f in files:  # each holds its own rank's collectives
        names = {e.get("name") for e in json.loads(gzip.open(f).read())["traceEvents"]}
        assert {"moe", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"} <= names


def test_analyze_reads_the_rank_traces_as_one_run(two_ranks):
    """`dsv4opt analyze` on the trace folder merges the ranks, and says what it merged."""
    _, _, traces = two_ranks
    r = runner.invoke(app, ["analyze", str(traces)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "2 traces merged as the ranks of one run; torch.distributed ranks 0, 1 of 2" in r.output


def _plain_timeline(path: Path) -> dict:
    """Independently of the analysis: communication = gloo ranges and c10d operators; compute = the
    other operators that no operator on their thread encloses."""
    events = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in events
            if (e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")) or
            (e.get("cat") == "cpu_op" and e["name"].startswith("c10d::"))]
    work = []
    for tid in {e["tid"] for e in ops}:
        end = None
        for e in sorted((e for e in ops if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            if end is None or e["ts"] >= end:
                if not e["name"].startswith("c10d::"):
                    work.append((e["ts"], e["ts"] + e["dur"]))
                end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
            else:
                end = max(end, e["ts"] + e["dur"])
    c, w = merged_intervals(comm), merged_intervals(work)
    both = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in c for b in w)
    return {"comm": sum(e - s for s, e in c), "compute": sum(e - s for s, e in w), "overlap": both}


def test_rank_balance_matches_plain_sums_over_the_traces(two_ranks):
    _, saved, traces = two_ranks
    prof = Profile.load(saved[0])
    plain = [_plain_timeline(f) for f in sorted(traces.glob("*.trace.json.gz"))]
    for row, want in zip(prof.ranks, plain):
        got = row.timeline
        assert got.comm_us == pytest.approx(want["comm"], rel=1e-9)
        assert got.compute_us == pytest.approx(want["compute"], rel=1e-9)
        assert got.overlap_us == pytest.approx(want["overlap"], rel=1e-9, abs=1e-6)
    compute = [p["compute"] for p in plain]
    balance = prof.rank_balance
    assert balance.slowest_rank == compute.index(max(compute))
    assert balance.imbalance == pytest.approx(max(compute) / (sum(compute) / 2) - 1, rel=1e-9)
    assert 0 < balance.comm_share < 1


@pytest.mark.slow
def test_four_ranks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, RUN[:-6] + ["--steps", "1", "--warmup", "0", "--repeat", "1", "--layers", "4", "--ranks", "4",
                                       "--layout", "dp-ep"])
    assert r.exit_code == 0, r.output
    prof = Profile.load(next((tmp_path / "profiles").glob("*-r4-*.json")))
    assert [row.rank for row in prof.ranks] == [0, 1, 2, 3]
    assert prof.meta["expert_parallel"] == 4 and prof.rank_balance.comm_share > 0


@pytest.mark.slow
def test_four_tp4_ranks_all_reduce_and_step_the_same_requests(tmp_path, monkeypatch):
    """tp4 as four processes: SGLang's TP trace names, all-reduces in every rank's trace, one set of
    contexts, and tokens/s of the deployment equal to one rank's (every rank decodes all C)."""
    monkeypatch.chdir(tmp_path)
    run = [a for a in RUN[:-2]] + ["--layout", "tp4", "--ranks", "4", "--repeat", "1", "--trace-dir", str(tmp_path)]
    run[run.index("--repeat") + 1] = "1"
    r = runner.invoke(app, run)
    assert r.exit_code == 0, r.output
    prof = Profile.load(next((tmp_path / "profiles").glob("*-r4-*.json")))
    meta, t = prof.meta, prof.throughput
    assert (meta["layout"], meta["expert_parallel"], len(meta["contexts"])) == ("tp4", None, 2)
    assert abs(t["tokens_per_s"] - t["tokens_per_s_per_rank"]) < 1e-9
    files = sorted(tmp_path.glob("*.trace.json.gz"))
    assert [f.name.rsplit("-TP-", 1)[1] for f in files] == [f"{i}.trace.json.gz" for i in range(4)]
    for f in files:
        names = {e.get("name") for e in json.loads(gzip.open(f).read())["traceEvents"]}
        assert "c10d::allreduce_" in names and "c10d::_allgather_base_" not in names


@pytest.mark.parametrize("extra, said", [
    (["--ranks", "3"], "--ranks 3: use one of 1, 2, 4, 8"),
    (["--ranks", "8", "--layout", "tp8"], "dsv4-tiny cannot run the tp8 layout"),
    (["--ranks", "2", "--experts-resident", "4"], "leave --experts-resident out"),
    (["--ranks", "2", "--target", "sglang"], "--ranks is for the embedded target"),
    (["--ranks", "2", "--layout", "tp4"], "the tp4 layout has 4 ranks; run --ranks 4 or leave it out"),
])
def test_bad_ranks_are_one_line(extra, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, RUN + extra)
    assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "profiles").exists()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_a_rank_killed_mid_run_ends_the_command_with_one_line(tmp_path):
    """A real `dsv4opt profile --ranks 2`: one rank is killed while they step; the command exits 1
    with one line naming it, and no rank, fork server or other child outlives it."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "DSV4OPT_STATE": str(tmp_path / "state.json"), "TMPDIR": str(tmp_path),
           # the checkout first, absolute: run from its tree (PYTHONPATH=.) the cwd below would hide it
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    cli = subprocess.Popen([sys.executable, "-m", "dsv4opt", *RUN[:-6], "--steps", "200", "--warmup", "200", "--ranks", "2",
                            "--layout", "dp-ep"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, ranks, family = time.monotonic() + 120, [], []  # a loaded machine (pytest -n 12) is slow to start them
        while len(ranks) < 2 and time.monotonic() < deadline:  # the CLI -> fork server -> ranks
            family = _children(cli.pid)
            ranks = [r for child in family for r in _children(child)]
            time.sleep(0.1)
        assert len(ranks) == 2, "the ranks did not start"
        time.sleep(1.0)
        os.kill(ranks[1], signal.SIGKILL)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 1, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    # one line, the last said (the CPU note may come before it), naming the killed rank
    assert len(errors) == 1 and errors[0] == lines[-1], err
    assert re.match(r"error: rank [01] of 2 was killed by SIGKILL \(its log: .*rank-[01]\.log\)$", errors[0]), err
    assert "Traceback" not in err + out
    time.sleep(0.5)
    assert not any(_alive(p) for p in ranks + family)
