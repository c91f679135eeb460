"""The weight-stream probe (benchmarks/probe_grouped_moe_ceiling.py) streams what it says: each program's
items read every value and scale of its rows once, the decode gives the dequantised weights, and the
MMA mode multiplies them by its token tile. Interpreter only (fp16); the rates need a GPU."""

from __future__ import annotations

import pytest
import torch

from dsv4opt.tritonlib import interpreted
from dsv4opt.workload.kernels.grouped_moe.configs import GemmTiles
from dsv4opt.workload.kernels.grouped_moe.layout import packed_experts
from dsv4opt.workload.weights import Mxfp4Experts
from tests.benchmark_files import load_script

pytestmark = pytest.mark.skipif(not interpreted(), reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")


def _probe():
    return load_script("probe_grouped_moe_ceiling")


def test_each_mode_reads_every_item_and_row_once():
    probe = _probe()
    w = Mxfp4Experts(3, 256, 256, torch.Generator().manual_seed(0), "cpu")
    packed = packed_experts(w)
    x = torch.randn(128, 16, generator=torch.Generator().manual_seed(1)).half()
    # 3 experts x 2 items of 128 stacked rows, 2 K steps of 128 columns; 4 programs on the CPU, so two
    # of them take a second item
    out = {r["mode"]: r["out"] for r in probe.stream_rates(packed, 1.0, GemmTiles(64, 128, 4, 2, ctas=1),
                                                          dtype=torch.float16, x=x, whole=True)}
    items = [(e, r0) for e in range(3) for r0 in (0, 128)]
    vals = packed.values.view(torch.int32).reshape(3, 16, 4, 128)  # [expert, 16-row unit, 64-column unit, words]
    scales = packed.scales.view(torch.int32).reshape(3, 16, 4, 8)

    def xor_steps_then_sum(t):  # t [8 row units, 4 column units, words]: steps of 2 column units XORed
        return int((t[:, 0:2] ^ t[:, 2:4]).long().sum())

    for i, (e, r0) in enumerate(items):
        u = slice(r0 // 16, r0 // 16 + 8)
        want = (xor_steps_then_sum(vals[e, u]) + xor_steps_then_sum(scales[e, u]) + 2**31) % 2**32 - 2**31  # int32 sum
        assert float(out["load"][i]) == pytest.approx(float(want), rel=1e-6), i
        dense = w.dense(e).double()[r0:r0 + 128]  # [128 rows, 256 columns]
        steps = dense[:, :128] + dense[:, 128:]  # the K steps' tiles, summed as the decode mode sums them
        assert torch.allclose(out["decode"][i].double(), steps, atol=2e-2, rtol=2e-3), i
        want_mma = dense[:, :128] @ x.double() + dense[:, 128:] @ x.double()  # each step times the same tile
        assert torch.allclose(out["mma"][i].double(), want_mma, atol=5e-2, rtol=5e-3), i
