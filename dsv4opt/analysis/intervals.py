"""Interval containment, vectorised: which range of a thread (or stream) holds a point in time.

One helper answers the question every attribution asks - the part around a kernel, the operator
or Python frame around a launch, the operator around another operator - for all queries at once.
Intervals need not nest: "innermost" is the latest-starting interval that still covers the point
(ties in start: the shorter one), which is the innermost one when they do nest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Intervals:
    """Closed intervals [start, end] in groups (threads, streams), sorted by group, then start, then
    longer first. `order[k]` is the caller's row of sorted interval k; `outer[k]` is the latest
    earlier interval of its group that ends after it (-1 when none): following it from any interval
    reaches, in order, every earlier interval that could still be open later on."""

    order: np.ndarray  # [n] int64
    start: np.ndarray  # [n] float64, sorted within groups
    end: np.ndarray  # [n] float64
    group: np.ndarray  # [n] int64, sorted
    outer: np.ndarray  # [n] int64

    @classmethod
    def of(cls, start, end, group=None) -> "Intervals":
        start = np.asarray(start, np.float64)
        end = np.asarray(end, np.float64)
        group = np.zeros(len(start), np.int64) if group is None else np.asarray(group, np.int64)
        order = np.lexsort((start - end, start, group))
        s, e, g = start[order], end[order], group[order]
        return cls(order, s, e, g, _previous_greater(e, g))

    def __len__(self) -> int:
        return len(self.start)

    def innermost(self, t, group=None) -> np.ndarray:
        """[queries] the caller's row of the innermost interval of the query's group covering t
        (start <= t <= end), -1 when none covers it or t is NaN."""
        t = np.asarray(t, np.float64)
        group = np.zeros(len(t), np.int64) if group is None else np.asarray(group, np.int64)
        j = self._last_started(t, group)
        return self._rows(self._climb(j, t))

    def parents(self) -> np.ndarray:
        """[intervals, caller's order] the caller's row of the innermost earlier interval (earlier
        start, or the same start and longer) of the same group still open at each interval's start;
        -1 for top-level intervals."""
        n = len(self)
        prev = np.arange(n) - 1
        if n:
            prev[np.flatnonzero(np.r_[True, self.group[1:] != self.group[:-1]])] = -1
        k = self._climb(prev, self.start)
        out = np.full(n, -1, np.int64)
        out[self.order] = self._rows(k)
        return out

    def _rows(self, k: np.ndarray) -> np.ndarray:
        """Sorted indices -> the caller's rows, -1 kept."""
        out = np.full(len(k), -1, np.int64)
        found = k >= 0
        out[found] = self.order[k[found]]
        return out

    def _last_started(self, t: np.ndarray, group: np.ndarray) -> np.ndarray:
        """[queries] sorted index of the last interval of the query's group with start <= t, -1 none."""
        n, q = len(self), len(t)
        if n == 0 or q == 0:
            return np.full(q, -1, np.int64)
        # Merge intervals and queries by (group, time); at equal times an interval sorts first, as
        # a range that starts at t covers t. The running maximum of interval positions then gives,
        # for each query, the last interval at or before it; it counts only in the same group.
        when = np.concatenate([self.start, np.nan_to_num(t, nan=np.inf)])
        grp = np.concatenate([self.group, group])
        kind = np.r_[np.zeros(n, np.int8), np.ones(q, np.int8)]
        tie = np.r_[np.arange(n), np.zeros(q, np.int64)]
        merged = np.lexsort((tie, kind, when, grp))
        seen = np.where(merged < n, merged, -1)
        last = np.maximum.accumulate(seen)
        at = np.empty(q, np.int64)
        is_query = merged >= n
        at[merged[is_query] - n] = last[is_query]
        same = (at >= 0) & (self.group[np.maximum(at, 0)] == group)
        return np.where(same & np.isfinite(t), at, -1)

    def _climb(self, j: np.ndarray, t: np.ndarray) -> np.ndarray:
        """[queries] the first interval from sorted index j along `outer` whose end >= t; -1 none."""
        j = np.asarray(j, np.int64).copy()
        live = np.flatnonzero(j >= 0)
        while live.size:
            open_at_t = self.end[j[live]] >= t[live]
            live = live[~open_at_t]
            j[live] = self.outer[j[live]]
            live = live[j[live] >= 0]
        return j


def _previous_greater(end: np.ndarray, group: np.ndarray) -> np.ndarray:
    """[n] for each interval the latest earlier one in its group with a strictly later end, -1 none.

    Pointer jumping: a candidate that ends no later than the interval is replaced by its own
    candidate, which is still valid (everything skipped ends no later); each round halves the
    chains, so a few dozen rounds of whole-array steps replace the sequential stack."""
    n = len(end)
    cand = np.arange(n, dtype=np.int64) - 1
    if n == 0:
        return cand
    cand[np.flatnonzero(np.r_[True, group[1:] != group[:-1]])] = -1
    live = np.flatnonzero(cand >= 0)
    while live.size:
        live = live[end[cand[live]] <= end[live]]
        cand[live] = cand[cand[live]]
        live = live[cand[live] >= 0]
    return cand
