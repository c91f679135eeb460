"""Shortened names stay distinct and fit their column."""

import gzip
import json

import pytest

from dsv4opt.analysis.names import long_name, short_name
from dsv4opt.report.fit import distinct_labels
from tests.trace.traces import real_traces

GEMMS = [f"Kernel<cutlass_80_tensorop_s1688gemm_{t}>" for t in
         ("64x64_32x4_nn_align1", "64x64_32x6_tn_align4", "64x64_32x4_nt_align1", "128x128_16x4_nt_align1", "256x128_32x3_nn_align1")]


@pytest.mark.parametrize("width", [14, 20, 30])
def test_five_gemms_that_share_their_first_characters(width):
    labels = distinct_labels(GEMMS, width)
    assert len(set(labels)) == 5 and all(len(x) <= width for x in labels), labels


def test_names_that_fit_are_kept_and_equal_names_share_a_label():
    assert distinct_labels(["ampere_sgemm_128x64_nn", "x", "x"], 30) == ["ampere_sgemm_128x64_nn", "x", "x"]


@pytest.fixture(scope="module")
def trace_kernel_names():
    out = {}
    for path in real_traces():
        with gzip.open(path, "rt") as f:
            out[path] = sorted({e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")})
    return out


@pytest.mark.parametrize("width", [14, 24, 56])
def test_every_real_traces_kernels_get_distinct_labels(width, trace_kernel_names):
    for path, names in trace_kernel_names.items():
        labels = distinct_labels([short_name(n) for n in names], width, keys=names, fuller=[long_name(n) for n in names])
        assert len(set(labels)) == len(names), path.name
        assert all(len(x) <= width for x in labels), path.name
