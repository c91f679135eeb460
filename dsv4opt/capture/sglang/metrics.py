"""Decode figures from streamed chunks: output tokens/s, time per output token, inter-token latency.

Input is what the load generator records per request: (arrival time in s, cumulative completion
tokens) for every streamed chunk. A chunk may carry several tokens (SGLang's stream interval), so
inter-token latency is the gap between chunks divided by the tokens the later chunk added, counted
once per chunk. Only chunks arriving inside the window [t0, t1] count; a gap that starts before t0
and ends inside counts (its tokens were produced inside the window's clock).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

Events = Sequence[tuple[float, int]]  # (time_s, cumulative completion tokens), time-ordered


def window_metrics(requests: Sequence[Events], t0: float, t1: float) -> dict[str, float | int]:
    """Figures over [t0, t1] for the given per-request event lists (keys carry units)."""
    if t1 <= t0:
        raise ValueError(f"empty window: t0={t0} t1={t1}")
    tokens = 0
    itl_ms: list[float] = []
    tpot_ms: list[float] = []
    for events in requests:
        inside = [(t, n) for t, n in events if t0 <= t <= t1]
        before = [(t, n) for t, n in events if t < t0]
        prev = before[-1] if before else None
        for t, n in inside:
            if prev is not None and n > prev[1]:
                tokens += n - prev[1]
                itl_ms.append((t - prev[0]) * 1e3 / (n - prev[1]))
            elif prev is None:
                tokens += n  # first chunk of a request that started in the window
            prev = (t, n)
        if len(inside) >= 2 and inside[-1][1] > inside[0][1]:
            (ta, na), (tb, nb) = inside[0], inside[-1]
            tpot_ms.append((tb - ta) * 1e3 / (nb - na))
    out: dict[str, float | int] = {
        "window_s": t1 - t0,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / (t1 - t0),
        "requests": sum(1 for events in requests if any(t0 <= t <= t1 for t, _ in events)),
    }
    out.update(_summary("tpot_ms", tpot_ms, ("mean", "median")))
    out.update(_summary("itl_ms", itl_ms, ("p50", "p90", "p99")))
    return out


def _summary(prefix: str, values: list[float], stats: tuple[str, ...]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    out = {}
    for stat in stats:
        if arr.size == 0:
            out[f"{prefix}_{stat}"] = float("nan")
        elif stat == "mean":
            out[f"{prefix}_{stat}"] = float(arr.mean())
        elif stat == "median":
            out[f"{prefix}_{stat}"] = float(np.median(arr))
        else:
            out[f"{prefix}_{stat}"] = float(np.percentile(arr, float(stat[1:])))
    return out
