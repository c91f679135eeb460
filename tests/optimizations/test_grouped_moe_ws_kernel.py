"""The warp-specialised gate/up and down kernels (dsv4opt/workload/kernels/grouped_moe/ws.py) on the
CPU: the module imports anywhere and declines CPU tensors, its launch arithmetic, and (with Triton
3.6's Gluon, the H200's) their sm_90a compiles: no spills, the partitions' register caps, wgmma with
register A on ring tokens, cp.async into the ring (gate/up's token rows zero-filled) with noinc
arrives. Their numbers need an H200: the graph-replay test in test_grouped_moe.py checks them there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsv4opt.workload.kernels.grouped_moe import ws


def _packed(rows: int, cols: int, fold: bool = True):
    """What ws_supported reads of a PackedExperts (rows N = 2I, K64 units of columns, fold)."""
    return SimpleNamespace(rows=rows, cols=cols, k64=cols // 64, n16=rows // 16, fold=fold)


def test_cpu_tensors_are_declined():
    x = torch.zeros(4, 4096, dtype=torch.bfloat16)
    assert ws.ws_supported(x, _packed(2 * 2048, 4096), 16) is False
    assert ws.ws_down_supported(torch.zeros(2048, 16, dtype=torch.bfloat16), _packed(4096, 2048), 16) is False


def test_launch_arithmetic():
    # 2 programs an SM: 8 warps each (the producer warp pads to a warpgroup) share 64K registers
    assert ws.launch_options(2) == {"num_warps": 4, "maxnreg": 128}
    assert ws.launch_options(1) == {"num_warps": 4}  # 256 a thread: no cap
    assert ws.grid_size(max_items=10_000, sms=132, ctas=2) == 264
    assert ws.grid_size(max_items=12, sms=132, ctas=2) == 12
    assert ws.grid_size(max_items=0, sms=132, ctas=2) == 1


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    if not ws.GLUON_API_OK:
        pytest.skip("written against Triton 3.6's Gluon API")
    return ws.compile_report(stages=4, ctas=2)


def test_compiles_for_sm90a_without_spills(report):
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0
    assert report["launch_regs"] == 128 and report["warps"] == 8
    # setmaxnreg: the consumer gets what the producer's cap leaves of 2 x 128
    assert 256 - ws.PRODUCER_REGS in report["setmaxnreg"] and ws.PRODUCER_REGS in report["setmaxnreg"]
    assert report["shared_bytes"] >= 4 * (16 * 512 + 16 * 32 + 16 * 128 * 2)  # the ring's four slots
    assert not report["wgmma_serialized"]


def test_ptx_streams_through_the_ring(report):
    # every wgmma takes its A from registers (the decode), B from the ring's tokens
    assert report["wgmma"] > 0 and report["wgmma_reg_a"] == report["wgmma"]
    # a K step's copies: 16 value units + 1 scale copy + 8 token chunks a lane, one noinc arrive
    assert report["cp_async"] == 25 and report["cp_async_arrive_noinc"] == 1
    assert report["fence_proxy_async"] >= 2  # the ring's tokens before each wgmma reads them
    assert report["mul_bf16x2"] > 0


def test_token_copies_zero_fill_rows_past_the_tile(report):
    # 8 token copies a lane with a source-size register: 16 bytes, or 0 (zeros) past the tile's slots
    assert report["cp_async_zero_fill"] == 8


@pytest.fixture(scope="module")
def down_report():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    if not ws.GLUON_API_OK:
        pytest.skip("written against Triton 3.6's Gluon API")
    return ws.compile_report(stages=4, ctas=2, down=True)


def test_down_compiles_for_sm90a_without_spills(down_report):
    assert down_report["spill_store_bytes"] == 0 and down_report["spill_load_bytes"] == 0
    assert down_report["launch_regs"] == 128 and down_report["warps"] == 8
    assert 256 - ws.PRODUCER_REGS in down_report["setmaxnreg"] and ws.PRODUCER_REGS in down_report["setmaxnreg"]
    assert down_report["shared_bytes"] >= 4 * (16 * 512 + 16 * 32 + 128 * 16 * 2)
    assert not down_report["wgmma_serialized"]


def test_down_streams_act_columns_unmasked(down_report):
    # a K step: 16 value units + 1 scale copy + 8 act chunks a lane (128 rows x 32 bytes), none zero-filled
    assert down_report["wgmma"] > 0 and down_report["wgmma_reg_a"] == down_report["wgmma"]
    assert down_report["cp_async"] == 25 and down_report["cp_async_arrive_noinc"] == 1
    assert down_report["cp_async_zero_fill"] == 0
