"""analyze merges several trace files only when their own metadata says they can be ranks of one run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis import analyze_paths
from dsv4opt.cli import app
from dsv4opt.errors import TraceError

DATA = Path(__file__).resolve().parents[1] / "data"
BASE_NS = 1_790_857_026_000_000_000  # a Kineto base time: ts are microseconds after it


def _trace(path: Path, *, device="NVIDIA H200", rank=None, world=None, pid=100, host="node0", start_us=5e12,
           name=None) -> Path:
    header = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "host_name": host,
              "deviceProperties": [{"id": 0, "name": device}] if device else []}
    if rank is not None:
        header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": start_us, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": name or "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
         "ts": start_us + 1.0, "dur": 5.0},
    ]
    path.write_bytes(gzip.compress(json.dumps({**header, "traceEvents": events}).encode()))
    return path


def _two(tmp_path, a: dict, b: dict, names=("a.trace.json.gz", "b.trace.json.gz")) -> Path:
    _trace(tmp_path / names[0], **a)
    _trace(tmp_path / names[1], **b)
    return tmp_path


def test_ranks_of_one_job_are_merged_and_said_so(tmp_path):
    d = _two(tmp_path, dict(rank=0, world=2, pid=100), dict(rank=1, world=2, pid=101, start_us=5e12 + 1500))
    prof = analyze_paths([d])
    assert prof.total_us == 10.0 and [r.rank for r in prof.ranks] == [0, 1]
    assert prof.meta["merged"] == ("2 traces merged as the ranks of one run; torch.distributed ranks 0, 1 of 2; "
                                   "NVIDIA H200; host node0; started within 1.5 ms of each other")


REFUSED = {
    "devices": (dict(device="NVIDIA H200"), dict(device="NVIDIA A100-SXM4-80GB", pid=101),
                "ran on NVIDIA H200 and b.trace.json.gz on NVIDIA A100-SXM4-80GB"),
    "in_and_out_of_a_job": (dict(rank=0, world=2), dict(pid=101), "outside one"),
    "world_sizes": (dict(rank=0, world=2), dict(rank=1, world=8, pid=101), "rank 0 of 2 and b.trace.json.gz rank 1 of 8"),
    "same_rank": (dict(rank=0, world=2), dict(rank=0, world=2, pid=101), "both rank 0 of 2: two runs, not two ranks"),
    "same_process": (dict(), dict(), "come from one process (pid 100 on node0)"),
    "days_apart": (dict(), dict(pid=101, start_us=5e12 + 2 * 86400e6), "48.0 h apart"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_strangers_are_refused(case, tmp_path):
    a, b, said = REFUSED[case]
    d = _two(tmp_path, a, b)
    with pytest.raises(TraceError, match="not|twice|apart") as err:
        analyze_paths([d])
    assert said in str(err.value)


def test_another_host_is_no_stranger(tmp_path):
    """A multi-node job: the ranks' hosts differ, the same pid on two hosts is two processes."""
    d = _two(tmp_path, dict(rank=0, world=2, host="node0"), dict(rank=1, world=2, host="node1"))
    assert "hosts node0, node1" in analyze_paths([d]).meta["merged"]


SGLANG = {
    "two_profile_runs": (("1700-TP-0-DECODE.trace.json.gz", "1800-TP-1-DECODE.trace.json.gz"),
                         "different SGLang profile runs (1700 and 1800)"),
    "two_stages": (("1700-TP-0-EXTEND.trace.json.gz", "1700-TP-0-DECODE.trace.json.gz"),
                   "different stages (DECODE and EXTEND)"),
    "one_rank_twice": (("x-1700-TP-0-DP-0-EP-0.trace.json.gz", "y-1700-TP-0-DP-0-EP-0.trace.json.gz"),
                       "different SGLang profile runs"),
    "mixed_names": (("1700-TP-0-DECODE.trace.json.gz", "run.trace.json.gz"), "is not: not ranks of one run"),
}


@pytest.mark.parametrize("case", list(SGLANG))
def test_sglang_names_must_be_one_run_one_stage(case, tmp_path):
    names, said = SGLANG[case]
    d = _two(tmp_path, dict(pid=100), dict(pid=101), names=names)
    with pytest.raises(TraceError) as err:
        analyze_paths([d])
    assert said in str(err.value)


def test_the_same_rank_named_twice_is_refused(tmp_path):
    _trace(tmp_path / "1700-TP-0-DECODE.trace.json.gz", pid=100)
    other = tmp_path / "sub"
    other.mkdir()
    _trace(other / "1700-TP-0-DECODE.trace.json.gz", pid=101)
    with pytest.raises(TraceError, match="the same rank of one run"):
        analyze_paths([tmp_path / "1700-TP-0-DECODE.trace.json.gz", other / "1700-TP-0-DECODE.trace.json.gz"])


def test_sglang_ranks_of_one_run_merge(tmp_path):
    d = _two(tmp_path, dict(pid=100), dict(pid=101), names=("1700-TP-0-DECODE.trace.json.gz", "1700-TP-1-DECODE.trace.json.gz"))
    prof = analyze_paths([d])
    assert [r.rank for r in prof.ranks] == [0, 1] and "2 traces merged" in prof.meta["merged"]


def test_an_eager_step_and_its_replay_are_one_process_not_two_ranks(tmp_path):
    """The committed H200 pair: one embedded run's eager reference step and its CUDA-graph replay."""
    r = CliRunner().invoke(app, ["analyze", str(DATA / "h200-dsv4flash-faithful-l4-c32-graph.trace.json.gz"),
                                 str(DATA / "h200-dsv4flash-faithful-l4-c32-eager.trace.json.gz")])
    assert r.exit_code == 1 and "Traceback" not in r.output and r.output.count("\n") == 1
    assert "come from one process (pid 457)" in r.output and "--capture" in r.output


def test_a_capture_vouches_for_its_own_files(tmp_path):
    """profile's own traces (one capture wrote them) are not second-guessed: the stand-in SGLang
    server writes the same trace for each rank."""
    d = _two(tmp_path, dict(), dict(), names=("1700-TP-0.trace.json.gz", "1700-TP-1.trace.json.gz"))
    assert analyze_paths([d], one_capture=True).total_us == 10.0
