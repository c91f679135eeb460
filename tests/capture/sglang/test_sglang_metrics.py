"""Window figures from streamed chunks, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from dsv4opt.capture.sglang.metrics import window_metrics

# Window [1.0, 2.0]. A: one token per chunk every 0.5 s. B: two tokens per chunk every 0.5 s.
# C: starts inside the window. D: entirely after it.
A = [(0.5, 1), (1.0, 2), (1.5, 3), (2.0, 4), (2.5, 5)]
B = [(0.9, 2), (1.4, 4), (1.9, 6)]
C = [(1.2, 1), (1.6, 2)]
D = [(3.0, 1)]


def test_hand_worked_window():
    m = window_metrics([A, B, C, D], 1.0, 2.0)
    # tokens: A 3 (2,3,4 after 1), B 2+2, C 1 (first) + 1
    assert m["output_tokens"] == 9
    assert m["output_tokens_per_s"] == pytest.approx(9.0)
    assert m["requests"] == 3
    # per-token gaps in ms: A 500,500,500; B 250,250; C 400 -> sorted 250,250,400,500,500,500
    assert m["itl_ms_p50"] == pytest.approx(450.0)
    assert m["itl_ms_p90"] == pytest.approx(500.0)
    # TPOT per request: A (2.0-1.0)/(4-2)=500, B 0.5/2=250, C 0.4/1=400
    assert m["tpot_ms_mean"] == pytest.approx((500 + 250 + 400) / 3)
    assert m["tpot_ms_median"] == pytest.approx(400.0)


def test_window_without_chunks_keeps_keys():
    m = window_metrics([D], 1.0, 2.0)
    assert m["output_tokens"] == 0 and m["requests"] == 0
    assert math.isnan(m["itl_ms_p99"]) and math.isnan(m["tpot_ms_median"])


def test_empty_window_is_an_error():
    with pytest.raises(ValueError):
        window_metrics([A], 2.0, 2.0)
