"""The verdict notices a hot kernel that moved even when a category of many small kernels stays #1."""

from dsv4opt.analysis.compare import compare_profiles
from tests.decision.profiles import make_profile


def _before():
    return make_profile([("_simt_sparse_decode_kernel", "attention", 10, 190.0), ("moe_gemm", "moe", 10, 140.0),
                         ("add", "elementwise", 100, 130.0), ("mul", "elementwise", 100, 110.0), ("x", "copy", 10, 430.0)])


def test_hot_kernel_moved_is_reported():
    before = make_profile([("_simt_sparse_decode_kernel", "attention", 10, 300.0), ("moe_gemm", "moe", 10, 200.0),
                           ("add", "elementwise", 100, 260.0), ("mul", "elementwise", 100, 240.0)])
    after = make_profile([("_mma_sparse_decode_kernel", "attention", 10, 20.0), ("moe_gemm", "moe", 10, 200.0),
                          ("add", "elementwise", 100, 260.0), ("mul", "elementwise", 100, 240.0)])
    comp = compare_profiles(before, after)
    # by hand: elementwise 500/1000 = 50.0% -> 500/720 = 69.4%; SIMT kernel 30.0% -> gone; new #1 kernel
    # is add at 260/720 = 36.1%
    assert comp.bottleneck_moved
    assert comp.verdict.startswith("#1 kernel moved: _simt_sparse_decode_kernel (attention) 30.0% -> 0.0%")
    assert "36.1%" in comp.verdict and "#1 category still elementwise 50.0% -> 69.4%" in comp.verdict


def test_nothing_moved():
    comp = compare_profiles(_before(), _before())
    assert not comp.bottleneck_moved and comp.verdict.startswith("bottleneck did not move")
