"""The ranks' timelines: interval sums against a brute-force grid, a real NCCL trace against plain
sums over its JSON, and the balance across ranks against hand-made figures."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from dsv4opt.analysis.profile import RankRow, RankTimeline
from dsv4opt.analysis.rank_balance import length, overlap, rank_balance, rank_timeline, union
from dsv4opt.trace import read_trace
from tests.helpers import SHARED_TRACES, merged_intervals

A100 = SHARED_TRACES / "hta_a100_train_control.json.gz"  # rank 3 of 8, NCCL kernels on their own stream


def _grid(intervals, size):
    covered = np.zeros(size, bool)
    for s, e in intervals:
        covered[s:e] = True
    return covered


@pytest.mark.parametrize("seed", range(5))
def test_union_and_overlap_match_a_grid(seed):
    """Integer intervals (nested, touching, disjoint): lengths equal the covered cells of a grid."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 200, (30, 2)); a.sort(1)
    b = rng.integers(0, 200, (25, 2)); b.sort(1)
    ga, gb = _grid(a, 200), _grid(b, 200)
    ua, ub = union(a[:, 0].astype(float), a[:, 1].astype(float)), union(b[:, 0].astype(float), b[:, 1].astype(float))
    assert length(ua) == ga.sum() and length(ub) == gb.sum()
    assert overlap(ua, ub) == (ga & gb).sum()
    assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint and sorted


def test_empty_sets():
    empty = union(np.zeros(0), np.zeros(0))
    assert length(empty) == 0.0 and overlap(empty, union(np.array([0.0]), np.array([1.0]))) == 0.0


def _intersection(a, b):
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@pytest.mark.skipif(not A100.exists(), reason="needs ../shared/traces")
def test_nccl_overlap_on_a_real_training_trace():
    """DDP overlaps its all-reduces with the backward pass: communication partly hidden behind compute."""
    events = [e for e in json.loads(gzip.open(A100).read())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    comm = merged_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if "nccl" in e["name"].lower()])
    work = merged_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if "nccl" not in e["name"].lower()])
    got = rank_timeline(read_trace(A100))
    assert got.basis == "gpu"
    assert got.comm_us == pytest.approx(sum(e - s for s, e in comm), rel=1e-9)
    assert got.compute_us == pytest.approx(sum(e - s for s, e in work), rel=1e-9)
    assert got.overlap_us == pytest.approx(_intersection(comm, work), rel=1e-9)
    assert 0 < got.overlap_us < got.comm_us
    first, last = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)
    assert got.window_us == pytest.approx(last - first, rel=1e-12)


def _summary(rank, compute, comm, overlap_us, window):
    return RankRow(rank=rank, file=f"r{rank}.json", gpu_time_us=compute + comm,
                   timeline=RankTimeline(basis="gpu", steps=2, window_us=window, compute_us=compute, comm_us=comm,
                                         overlap_us=overlap_us))


def test_balance_names_the_slowest_rank_and_the_spread():
    ranks = [_summary(0, 80.0, 30.0, 10.0, 100.0), _summary(1, 100.0, 10.0, 0.0, 100.0),
             _summary(2, 90.0, 20.0, 5.0, 100.0)]
    b = rank_balance(ranks)
    assert b.slowest_rank == 1
    assert b.imbalance == pytest.approx(100 / 90 - 1)
    assert b.comm_share == pytest.approx(0.2) and b.comm_share_max == pytest.approx(0.3)
    assert b.exposed_comm_share == pytest.approx((20 + 10 + 15) / 300)
    assert b.compute_us_spread == pytest.approx(20.0)


def test_no_balance_without_two_timed_ranks():
    assert rank_balance([_summary(0, 1.0, 1.0, 0.0, 2.0)]) is None
    assert rank_balance([_summary(0, 1.0, 1.0, 0.0, 2.0), _summary(1, 0.0, 0.0, 0.0, 0.0)]) is None
