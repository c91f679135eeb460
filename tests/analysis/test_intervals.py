"""The interval helper against a brute-force scan over every interval (plain Python)."""

import numpy as np
import pytest

from dsv4opt.analysis.intervals import Intervals


def _sort_key(start, end, i):
    # the helper's order: start, then longer first, then the caller's row
    return (start[i], -(end[i] - start[i]), i)


def _brute_innermost(start, end, group, t, tg):
    out = []
    for q in range(len(t)):
        cover = [i for i in range(len(start)) if group[i] == tg[q] and start[i] <= t[q] <= end[i]]
        out.append(max(cover, key=lambda i: _sort_key(start, end, i)) if cover else -1)
    return out


def _brute_parents(start, end, group):
    out = []
    for i in range(len(start)):
        before = [k for k in range(len(start)) if group[k] == group[i] and _sort_key(start, end, k) < _sort_key(start, end, i)
                  and end[k] >= start[i]]
        out.append(max(before, key=lambda k: _sort_key(start, end, k)) if before else -1)
    return out


def _nested(rng, n):
    """A call tree per thread: children inside parents, siblings apart, some sharing a start."""
    start, end, group = [], [], []
    for g in range(3):
        stack = [(0.0, 1000.0)]
        t = 0.0
        while len(start) < n * (g + 1) // 3:
            lo, hi = stack[-1]
            if rng.random() < 0.3 and len(stack) > 1:
                stack.pop()
                continue
            s = t if rng.random() < 0.2 else rng.uniform(t, min(hi, t + 5))
            e = rng.uniform(s, hi) if rng.random() < 0.5 else s + rng.uniform(0, (hi - s) / 4)
            start.append(s)
            end.append(e)
            group.append(g)
            stack.append((s, e))
            t = s
    return np.array(start), np.array(end), np.array(group)


CASES = {
    "nested": lambda rng: _nested(rng, 300),
    "overlapping": lambda rng: (lambda s: (s, s + rng.exponential(20, s.size), rng.integers(0, 4, s.size)))(
        np.round(rng.uniform(0, 500, 400), 1)),
    "ties": lambda rng: (np.repeat([0.0, 5.0, 5.0, 10.0], 3), np.repeat([20.0, 8.0, 8.0, 10.0], 3), np.zeros(12, np.int64)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_innermost_and_parents_match_a_brute_force_scan(case):
    rng = np.random.default_rng(7)
    start, end, group = CASES[case](rng)
    t = np.concatenate([rng.uniform(-10, 1100, 300), start[:50], end[:50], [np.nan]])
    tg = rng.integers(0, 4, t.size)
    iv = Intervals.of(start, end, group)
    assert iv.innermost(t, tg).tolist() == _brute_innermost(start, end, group, t, tg)
    assert iv.parents().tolist() == _brute_parents(start, end, group)


def test_empty_inputs_keep_their_shape():
    iv = Intervals.of(np.zeros(0), np.zeros(0), np.zeros(0, np.int64))
    assert iv.innermost(np.array([1.0, 2.0])).tolist() == [-1, -1]
    assert iv.parents().tolist() == []
    assert Intervals.of([0.0], [1.0]).innermost(np.zeros(0)).tolist() == []
