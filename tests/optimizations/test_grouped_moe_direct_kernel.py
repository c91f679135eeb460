"""The direct few-slot kernels (dsv4opt/workload/kernels/grouped_moe/direct.py) without a GPU: the module
imports anywhere and declines CPU tensors, and (with Triton 3.6's Gluon, the H200's) the table's tiles
compile for sm_90a as the docs say: no spills, no shared-memory ring, one 16-byte load a lane for each
of a warp's units and four mma.sync a unit. Their numbers need an H200: the graph-replay cases in
test_grouped_moe.py check them there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsv4opt.workload.kernels.grouped_moe import direct
from dsv4opt.workload.kernels.grouped_moe import ws

_UP, _DOWN = direct.DirectTiles(4, 1, 4), direct.DirectTiles(4, 1, 1)  # tp4's table row to C = 4


def test_cpu_tensors_are_declined():
    packed = SimpleNamespace(rows=1024, k64=64, fold=True)
    packed2 = SimpleNamespace(rows=4096, k64=8, fold=True)
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    assert direct.direct_supported(x, packed, packed2, _UP, _DOWN) is False


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere")
    if not ws.GLUON_API_OK:
        pytest.skip("written against Triton 3.6's Gluon API")
    return direct.compile_report(I=512, d=4096, up=_UP, down=_DOWN)


@pytest.mark.parametrize("gemm", ["up", "down"])
def test_the_table_tiles_compile_without_spills_or_a_ring(report, gemm):
    row = report[gemm]
    assert row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0
    assert row["shared_bytes"] <= 16  # no staging in shared memory (the epilogue's barrier only)


@pytest.mark.parametrize("gemm, units", [("up", 4096 // 64 // 4), ("down", 512 // 64 // 1)])
def test_each_unit_is_one_16_byte_load_and_four_mma_sync(report, gemm, units):
    row = report[gemm]
    assert row["mma_sync"] == 4 * units  # a unit's four k16 blocks, every one of the warp's K range
    assert row["mul_bf16x2"] == 16 * units  # the folded decode: four bf16x2 multiplies a word, four words a lane
    assert row["ld_global_v4"] >= units
