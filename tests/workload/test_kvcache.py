"""Cache layouts: the FP8 byte geometry SGLang uses, and exact write/read round trips."""

import pytest
import torch

from dsv4opt.workload.kvcache import IndexKeyCache, KVCache, KVLayout, quantize_index_key, quantize_rows


def test_flash_fp8_layout_geometry_matches_sglang():
    # deepseek_v4_memory_pool.py / flash_mla_sm120.py: 576 data bytes + 8 scale bytes a token,
    # pages padded to whole 576-byte records.
    window = KVLayout(True, 448, 64, 64, 256)
    assert (window.data_bytes, window.scale_bytes, window.token_bytes) == (576, 8, 584)
    assert window.page_bytes == 149760
    assert KVLayout(True, 448, 64, 64, 64).page_bytes == 37440
    assert KVLayout(True, 448, 64, 64, 2).page_bytes == 1728
    assert KVLayout(False, 448, 64, 64, 256).token_bytes == 1024
    assert IndexKeyCache.allocate(128, 64, 1, "cpu").page_bytes == 8448


def test_fp8_write_read_round_trip_and_scale_choice():
    L = KVLayout(True, 24, 8, 8, 4)
    cache = KVCache.allocate(L, 3, torch.float32, "cpu")
    rows = torch.randn(5, 32, dtype=torch.float64) * torch.tensor([1e-3, 1, 10, 100, 1e3], dtype=torch.float64)[:, None]
    tokens = torch.tensor([0, 3, 4, 9, 11])
    cache.write(tokens, rows)
    back = cache.read(tokens)
    # rope is bf16 (8 bits), nope e4m3 under a power-of-two scale at or above amax/448 (3 bits)
    assert torch.allclose(back[:, 24:], rows[:, 24:], rtol=2**-8, atol=0)
    nope, exps, _ = quantize_rows(rows, L)
    scale = torch.exp2(exps.double() - 127)
    amax = rows[:, :24].abs().view(5, 3, 8).amax(-1)
    assert ((amax / 448 <= scale) & (scale < 2 * amax / 448)).all()
    err = (back[:, :24] - rows[:, :24]).abs().view(5, 3, 8)
    assert (err <= scale[..., None] * 2**-9 + amax[..., None] * 2**-4).all()
    untouched = cache.read(torch.tensor([1, 2]))
    assert torch.equal(untouched, torch.zeros(2, 32, dtype=torch.float64))


def test_fill_random_writes_what_write_would():
    L = KVLayout(True, 24, 8, 8, 4)
    a = KVCache.allocate(L, 3, torch.float32, "cpu")
    a.fill_random(torch.Generator().manual_seed(0))
    rows = torch.randn(12, 32, generator=torch.Generator().manual_seed(0))
    b = KVCache.allocate(L, 3, torch.float32, "cpu")
    b.write(torch.arange(12), rows)
    assert torch.equal(a.data, b.data)


def test_index_key_cache_round_trip():
    cache = IndexKeyCache.allocate(16, 4, 2, "cpu")
    keys, scales = quantize_index_key(torch.randn(3, 16))
    cache.write(torch.tensor([0, 5, 7]), keys, scales)
    got_k, got_s = cache.read(torch.tensor([0, 5, 7]))
    assert torch.equal(got_k, keys.double()) and torch.equal(got_s, scales.double())
    with pytest.raises(Exception):
        cache.read(torch.tensor([8]))  # past the last page
