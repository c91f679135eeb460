from rich.console import Console

from dsv4opt.analysis.profile import Profile
from dsv4opt.report.rank_balance import print_rank_balance


def _render(extra) -> str:
    console = Console(record=True, width=250)
    print_rank_balance(Profile(meta={}, gpu_time_us=0.0, kernels=[], categories=[], extra=extra), console)
    return console.export_text()


def test_nothing_for_one_rank():
    assert _render({}) == ""


def test_ranks_per_step_and_the_balance_line():
    timeline = {"basis": "gpu", "steps": 2, "window_us": 4000.0, "compute_us": 3000.0, "comm_us": 1000.0, "overlap_us": 200.0}
    text = _render({
        "ranks": [{"rank": 0, "timeline": timeline, "kernels": [{"short_name": "ncclDevKernel_AllGather", "share": 0.1}]},
                  {"rank": 1, "timeline": {**timeline, "compute_us": 2000.0}}],
        "rank_balance": {"basis": "gpu", "slowest_rank": 0, "imbalance": 0.2, "comm_share": 0.25, "comm_share_max": 0.25,
                         "exposed_comm_share": 0.2},
    })
    assert "per rank (per step)" in text and "1.50 ms" in text and "500.0 µs" in text and "25.0%" in text
    assert "slowest rank 0, compute 20.0% over the mean" in text and "20.0% not hidden" in text


def test_ranks_of_an_older_profile_without_timelines():
    """Profiles written before ranks had timelines still render (their figures left blank)."""
    text = _render({"ranks": [{"rank": 0, "gpu_time_us": 10.0}, {"rank": 1, "gpu_time_us": 12.0}]})
    assert "per rank" in text
