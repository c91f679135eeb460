from rich.console import Console

from dsv4opt.analysis.profile import KernelRow, Profile, RankBalance, RankRow, RankTimeline
from dsv4opt.report.rank_balance import print_rank_balance


def _render(**fields) -> str:
    console = Console(record=True, width=250)
    print_rank_balance(Profile(meta={}, total_us=0.0, kernels=[], categories=[], **fields), console)
    return console.export_text()


def _timeline(compute_us: float) -> RankTimeline:
    return RankTimeline(basis="gpu", steps=2, window_us=4000.0, compute_us=compute_us, comm_us=1000.0, overlap_us=200.0)


def test_nothing_for_one_rank():
    assert _render() == ""


def test_ranks_per_step_and_the_balance_line():
    top = KernelRow(name="ncclDevKernel_AllGather", category="communication", count=4, total_us=1.0, share=0.1)
    text = _render(
        ranks=[RankRow(rank=0, file="a", gpu_time_us=1.0, kernels=[top], timeline=_timeline(3000.0)),
               RankRow(rank=1, file="b", gpu_time_us=1.0, timeline=_timeline(2000.0))],
        rank_balance=RankBalance(basis="gpu", slowest_rank=0, imbalance=0.2, comm_share=0.25, comm_share_max=0.25,
                                 exposed_comm_share=0.2, compute_us_spread=1000.0),
    )
    assert "per rank (per step)" in text and "1.50 ms" in text and "500.0 µs" in text and "25.0%" in text
    assert "ncclDevKernel_AllGather 10.0%" in text
    assert "slowest rank 0, compute 20.0% over the mean" in text and "20.0% not hidden" in text


def test_ranks_of_an_older_profile_without_timelines():
    """Profiles written before ranks had timelines still render (their figures left out)."""
    text = _render(ranks=[RankRow(rank=0, file="a", gpu_time_us=10.0), RankRow(rank=1, file="b", gpu_time_us=12.0)])
    assert "per rank" in text and "slowest" not in text
