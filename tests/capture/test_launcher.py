"""The rank launcher: ranks meet and talk; a rank that fails, dies or never arrives stops them all,
with one line and no process left behind."""

import os
import time

import pytest

from dsv4opt.capture.launcher import run_ranks, rank_env
from dsv4opt.capture.ranks import PRELOAD
from dsv4opt.errors import CaptureError
from tests.capture import rank_entries


def _alive(pid: int) -> bool:
    """Running (a reaped or zombie process is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _pids(folder) -> list[int]:
    return [int(p.read_text()) for p in sorted(folder.glob("*.pid"))]


def _none_alive(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_meet_and_reduce(ranks, tmp_path):
    out = run_ranks(rank_entries.sum_of_ranks, ranks, "gloo", tmp_path, preload=PRELOAD)
    assert [o["rank"] for o in out] == list(range(ranks))
    assert all(o["sum"] == ranks * (ranks + 1) / 2 for o in out)
    assert len({o["pid"] for o in out}) == ranks and os.getpid() not in {o["pid"] for o in out}
    assert all(o["nvls"] == "0" for o in out)
    assert _none_alive([o["pid"] for o in out])


@pytest.mark.parametrize("how, said", [
    ("killed", "rank 1 of 3 was killed by SIGKILL"),
    ("user-error", "rank 1 of 3 failed: out of memory on this rank; lower --concurrency"),
    ("bug", "rank 1 of 3 failed: RuntimeError: a bug (traceback in"),
])
def test_a_failing_rank_stops_them_all_with_one_line(how, said, tmp_path):
    """The other ranks wait for rank 1 in a barrier: they are stopped, and the cause is rank 1."""
    with pytest.raises(CaptureError) as exc:
        run_ranks(rank_entries.rank_one_fails, 3, "gloo", tmp_path / "work", args=(how, str(tmp_path)), preload=PRELOAD)
    message = str(exc.value)
    assert message.startswith(said) and "\n" not in message, message
    pids = _pids(tmp_path)
    assert len(pids) == 3 and _none_alive(pids)
    if how == "bug":  # the traceback went to the rank's log, not to the user
        assert "Traceback" in (tmp_path / "work" / "rank-1.log").read_text()


def test_a_rank_that_never_arrives_times_the_rendezvous_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(CaptureError, match=r"^rendezvous timed out: rank 1 of 2 did not arrive within 1 s"):
        run_ranks(rank_entries.rank_one_never_joins, 2, "gloo", tmp_path / "work", args=(str(tmp_path),),
                  rendezvous_timeout_s=1.0, preload=PRELOAD)
    assert time.monotonic() - start < 10
    pids = _pids(tmp_path)
    assert len(pids) == 2 and _none_alive(pids)


def test_rank_env_keeps_nvlink_multicast_off_and_the_users_other_settings():
    env = rank_env(3, 8, {"NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "INFO", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                          "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "0"  # multicast stays off whatever was set
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/bin"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("3", "8", "3")


def test_rank_zeros_progress_reaches_the_caller(tmp_path):
    from dsv4opt.capture.result import Progress

    class Recorded(Progress):
        def __init__(self):
            self.seen = []

        def stage(self, description, total):
            self.seen.append((description, total))

        def advance(self):
            self.seen.append("+")

    progress = Recorded()
    run_ranks(rank_entries.reports_progress, 2, "gloo", tmp_path, progress=progress, preload=PRELOAD)
    stages = [s for s in progress.seen if s != "+"]
    assert stages == [("building", 2), ("profiling", 3)]
    assert progress.seen.index(("profiling", 3)) < len(progress.seen) - 3 and progress.seen[-3:] == ["+"] * 3
