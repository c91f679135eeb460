"""The baseline indexer score and pre-mix against their float64 references on awkward shapes."""

import pytest
import torch

from dsv4opt.numerics import error_report
from dsv4opt.workload.baseline import IMPLEMENTATIONS, hc_premix_fp32, indexer_score_fp32
from dsv4opt.workload.dense import quantize_rows
from dsv4opt.workload.impls import SLOTS
from dsv4opt.workload.naive import hc_premix_ref, indexer_score_ref

INDEXER_CASES = {  # id: (B, S, Hi, Di)
    "batch1-one-entry": (1, 1, 4, 16),
    "odd-entries": (3, 37, 8, 16),
    "flash-heads": (2, 129, 64, 128),
}


@pytest.mark.parametrize("shape", INDEXER_CASES.values(), ids=INDEXER_CASES.keys())
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["q-fp32", "q-bf16"])
def test_indexer_score_matches_reference(shape, q_dtype):
    B, S, Hi, Di = shape
    q = torch.randn(B, Hi, Di).to(q_dtype)
    keys, scale = quantize_rows(torch.randn(B * S, Di) * 3)
    w = torch.randn(B, Hi)
    k, k_scale = keys.view(B, S, Di), scale.view(B, S)
    out = indexer_score_fp32(q, k, k_scale, w)
    assert out.dtype == torch.float32 and out.shape == (B, S)
    report = error_report(out, indexer_score_ref(q, k, k_scale, w))
    assert report.ok(1e-5), report


def test_indexer_score_reference_is_the_weighted_relu_sum():
    # One request, two heads, one key: worked by hand.
    q = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]).view(1, 2, 2)
    k = torch.tensor([[[2.0, -1.0]]]).to(torch.float8_e4m3fn)
    scale = torch.tensor([[0.5]])
    w = torch.tensor([[3.0, 5.0]])
    # head 0: q . k*0.5 = 1 -> relu 1 -> 3; head 1: -0.5 -> relu 0 -> 0
    assert indexer_score_ref(q, k, scale, w).tolist() == [[3.0]]


PREMIX_CASES = {"one-token": (1, 4 * 64), "odd-tokens": (7, 4 * 96), "flash-width": (3, 4 * 4096)}


@pytest.mark.parametrize("shape", PREMIX_CASES.values(), ids=PREMIX_CASES.keys())
def test_hc_premix_matches_reference(shape):
    T, width = shape
    x, weight = torch.randn(T, width), torch.randn(24, width) * width**-0.5
    out = hc_premix_fp32(x, weight)
    assert out.dtype == torch.float32
    report = error_report(out, hc_premix_ref(x, weight))
    assert report.ok(1e-5), report


def test_baseline_fills_every_slot():
    assert set(IMPLEMENTATIONS) == set(SLOTS)


def test_quantize_rows_round_trip_within_e4m3_precision():
    x = torch.randn(5, 33) * torch.logspace(-3, 3, 5)[:, None]
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5,)
    back = q.double() * scale.double()[:, None]
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normal values; values far
    # below the row's maximum fall into subnormals, bounded by the smallest step times the scale.
    bound = torch.maximum(x.double().abs() * 2**-4, scale.double()[:, None] * 2**-9)
    assert ((back - x.double()).abs() <= bound + 1e-12).all()
    assert torch.allclose(back.abs().amax(1), x.double().abs().amax(1), rtol=2**-4)


def test_fp8_dense_multiplies_the_dequantised_operands():
    from dsv4opt.workload.dense import Dense

    w, x = torch.randn(48, 64) * 0.1, torch.randn(3, 64)
    d = Dense(w, "fp8")
    x8, xs = quantize_rows(x)
    expected = (x8.double() * xs.double()[:, None]) @ d.dense().t()
    report = error_report(d(x), expected)
    assert report.ok(1e-5), report
    assert d.nbytes == 48 * 64 + 48 * 4
