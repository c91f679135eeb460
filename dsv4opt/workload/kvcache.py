"""The latent KV caches of one layer, in the layout SGLang stores them (or plain rows in the model dtype).

FP8 layout (`flash_mla_sm120_triton.py`, `flash_mla_sm120.py:1-40` at sgl-project/sglang@37ef295c7):
a cache is pages of `page_size` tokens. A page holds first `page_size` data records of
`nope + 2 * rope` bytes each (the nope values in e4m3, then the rope values in bf16), then
`page_size` scale records of `tiles + 1` bytes (one UE8M0 exponent per `tile` nope values and one
pad byte); the page is padded to a whole number of data records. DeepSeek-V4-Flash: 448 + 128 data
bytes and 8 scale bytes per token (584 B), 576-byte records.

bf16 layout: one row of D = nope + rope values in the model dtype per token.

Token `t` of a cache lives in page t // page_size at slot t % page_size: attention indices are such
token numbers, -1 for an unused slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4opt.formats import FP8_MAX
from dsv4opt.workload.quant import FP8, quantize_groups_fp8

FP8_LAYOUT, BF16_LAYOUT = "fp8", "bf16"
AMAX_EPS = 1e-4  # the smallest amax a KV or index-key scale is computed from


@dataclass(frozen=True)
class KVLayout:
    """Byte geometry of one FP8 cache; for the bf16 layout only `dim` and `fp8=False` matter."""

    fp8: bool
    nope: int
    rope: int
    tile: int  # nope values per UE8M0 scale
    page_size: int

    @property
    def dim(self) -> int:
        return self.nope + self.rope

    @property
    def tiles(self) -> int:
        return -(-self.nope // self.tile)

    @property
    def data_bytes(self) -> int:
        return self.nope + 2 * self.rope

    @property
    def scale_bytes(self) -> int:
        return self.tiles + 1

    @property
    def page_bytes(self) -> int:
        per_page = self.page_size * (self.data_bytes + self.scale_bytes)
        return -(-per_page // self.data_bytes) * self.data_bytes

    @property
    def token_bytes(self) -> int:
        """Bytes a kernel reads per token (data and scales)."""
        return self.data_bytes + self.scale_bytes if self.fp8 else 2 * self.dim


@dataclass
class KVCache:
    """One paged latent cache. data: fp8 layout uint8 [pages, page_bytes]; bf16 layout [pages * page_size, D]."""

    layout: KVLayout
    data: torch.Tensor

    @classmethod
    def allocate(cls, layout: KVLayout, pages: int, dtype: torch.dtype, device) -> "KVCache":
        if layout.fp8:
            return cls(layout, torch.zeros(pages, layout.page_bytes, dtype=torch.uint8, device=device))
        return cls(layout, torch.zeros(pages * layout.page_size, layout.dim, dtype=dtype, device=device))

    @property
    def tokens(self) -> int:
        return self.data.shape[0] * (self.layout.page_size if self.layout.fp8 else 1)

    def pages(self, first: int, count: int) -> "KVCache":
        """A copy of pages [first, first + count) only (token numbers start again at 0)."""
        rows = self.layout.page_size if not self.layout.fp8 else 1
        return KVCache(self.layout, self.data[first * rows : (first + count) * rows].clone())

    def views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same bytes as (e4m3, uint8, bf16) flat tensors, for kernels that read the FP8 layout."""
        raw = self.data.view(-1).view(torch.uint8)
        return raw.view(FP8), raw, raw.view(torch.bfloat16)

    def fill_random(self, generator: torch.Generator, pages_per_chunk: int = 256) -> None:
        """Every token of the cache set to a random N(0, 1) row, written page by page in its layout."""
        L = self.layout
        if not L.fp8:
            self.data.normal_(generator=generator)
            return
        pages = self.data.shape[0]
        for p0 in range(0, pages, pages_per_chunk):
            n = min(pages_per_chunk, pages - p0)
            rows = torch.randn(n * L.page_size, L.dim, generator=generator, device=self.data.device)
            nope8, exps, rope = quantize_rows(rows, L)
            chunk = self.data[p0 : p0 + n]
            data = chunk[:, : L.page_size * L.data_bytes].view(n, L.page_size, L.data_bytes)
            data[..., : L.nope] = nope8.view(torch.uint8).view(n, L.page_size, L.nope)
            data[..., L.nope :] = rope.view(torch.uint8).view(n, L.page_size, 2 * L.rope)
            scale_end = L.page_size * (L.data_bytes + L.scale_bytes)
            scales = chunk[:, L.page_size * L.data_bytes : scale_end].view(n, L.page_size, L.scale_bytes)
            scales[..., : L.tiles] = exps.view(n, L.page_size, L.tiles)

    def write(self, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        """Store rows [n, D] (any float dtype) at token numbers `tokens` [n] (torch; graph-safe)."""
        L = self.layout
        if not len(tokens):
            return
        tokens = tokens.to(self.data.device)
        if not L.fp8:
            self.data[tokens.long()] = rows.to(self.data.dtype)
            return
        nope8, scale_bytes, rope = quantize_rows(rows, L)
        page, slot = tokens.long() // L.page_size, tokens.long() % L.page_size
        data_at = page[:, None] * L.page_bytes + slot[:, None] * L.data_bytes  # [n, 1]
        scales_at = page[:, None] * L.page_bytes + L.page_size * L.data_bytes + slot[:, None] * L.scale_bytes
        raw = self.data.view(-1)
        raw[data_at + torch.arange(L.nope, device=raw.device)] = nope8.view(torch.uint8)
        raw[data_at + L.nope + torch.arange(2 * L.rope, device=raw.device)] = rope.view(torch.uint8).reshape(len(rows), -1)
        raw[scales_at + torch.arange(L.tiles, device=raw.device)] = scale_bytes

    def read(self, tokens: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
        """Rows [n, D] at token numbers `tokens` (>= 0), decoded to `dtype`."""
        L = self.layout
        tokens = tokens.to(self.data.device)
        if not L.fp8:
            return self.data[tokens.long()].to(dtype)
        page, slot = tokens.long() // L.page_size, tokens.long() % L.page_size
        data_at = page[:, None] * L.page_bytes + slot[:, None] * L.data_bytes
        scales_at = page[:, None] * L.page_bytes + L.page_size * L.data_bytes + slot[:, None] * L.scale_bytes
        raw = self.data.view(-1)
        nope = raw[data_at + torch.arange(L.nope, device=raw.device)].view(FP8).to(dtype)
        rope = raw[data_at + L.nope + torch.arange(2 * L.rope, device=raw.device)].contiguous().view(torch.bfloat16).to(dtype)
        exps = raw[scales_at + torch.arange(L.tiles, device=raw.device)].to(dtype) - 127.0
        scale = torch.exp2(exps).repeat_interleave(L.tile, dim=1)[:, : L.nope]
        return torch.cat([nope * scale, rope], dim=1)


def quantize_rows(rows: torch.Tensor, L: KVLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows [n, D] -> (nope e4m3 [n, nope], UE8M0 scale bytes [n, tiles], rope bf16 [n, rope]).

    Each tile's scale is the power of two at or above max(amax, 1e-4) / 448 (UE8M0, SGLang's
    `cast_to_ue8m0`), so the tile fits e4m3.
    """
    x = rows[:, : L.nope]
    n = x.shape[0]
    padded = torch.zeros(n, L.tiles * L.tile, dtype=x.dtype if x.dtype == torch.float64 else torch.float32, device=x.device)
    padded[:, : L.nope] = x
    tiles = padded.view(n, L.tiles, L.tile)
    amax = tiles.abs().amax(-1).clamp(min=AMAX_EPS)
    exp = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
    q = (tiles / torch.exp2(exp)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(n, L.tiles * L.tile)[:, : L.nope]
    return q, (exp + 127).to(torch.uint8), rows[:, L.nope :].to(torch.bfloat16)


@dataclass
class IndexKeyCache:
    """The indexer's key cache: pages of `page_size` entries, each page `page_size * dim` e4m3
    values then `page_size` fp32 scales (SGLang's index-K buffer, deepseek_v4_memory_pool.py:279-299;
    64 entries x 132 B for DeepSeek-V4-Flash). data: uint8 [pages, page_size * (dim + 4)]."""

    dim: int
    page_size: int
    data: torch.Tensor

    @classmethod
    def allocate(cls, dim: int, page_size: int, pages: int, device) -> "IndexKeyCache":
        return cls(dim, page_size, torch.zeros(pages, page_size * (dim + 4), dtype=torch.uint8, device=device))

    @property
    def page_bytes(self) -> int:
        return self.page_size * (self.dim + 4)

    def pages(self, first: int, count: int) -> "IndexKeyCache":
        """A copy of pages [first, first + count) only."""
        return IndexKeyCache(self.dim, self.page_size, self.data[first : first + count].clone())

    def fill_random(self, generator: torch.Generator) -> None:
        """Every entry set to a random N(0, 1) key, quantised as the compressor would store it."""
        pages = self.data.shape[0]
        keys, scales = quantize_index_key(torch.randn(pages * self.page_size, self.dim, generator=generator,
                                                      device=self.data.device))
        self.data[:, : self.page_size * self.dim] = keys.view(torch.uint8).view(pages, -1)
        self.data[:, self.page_size * self.dim :] = scales.view(torch.uint8).view(pages, -1)

    def write(self, tokens: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor) -> None:
        """Store e4m3 keys [n, dim] with fp32 scales [n] at entry numbers `tokens` [n]."""
        if not len(tokens):
            return
        tokens = tokens.to(self.data.device)
        page, slot = tokens.long() // self.page_size, tokens.long() % self.page_size
        raw = self.data.view(-1)
        at = page[:, None] * self.page_bytes + slot[:, None] * self.dim
        raw[at + torch.arange(self.dim, device=raw.device)] = keys.view(torch.uint8)
        at_s = page[:, None] * self.page_bytes + self.page_size * self.dim + 4 * slot[:, None]
        raw[at_s + torch.arange(4, device=raw.device)] = scales.float().contiguous().view(torch.uint8).view(-1, 4)

    def read(self, tokens: torch.Tensor, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys [n, dim], scales [n]) at entry numbers `tokens`, decoded to `dtype`."""
        tokens = tokens.to(self.data.device)
        page, slot = tokens.long() // self.page_size, tokens.long() % self.page_size
        raw = self.data.view(-1)
        at = page[:, None] * self.page_bytes + slot[:, None] * self.dim
        keys = raw[at + torch.arange(self.dim, device=raw.device)].view(FP8).to(dtype)
        at_s = page[:, None] * self.page_bytes + self.page_size * self.dim + 4 * slot[:, None]
        scales = raw[at_s + torch.arange(4, device=raw.device)].contiguous().view(torch.float32).view(-1).to(dtype)
        return keys, scales


def quantize_index_key(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, dim] -> (e4m3 [n, dim], fp32 scale [n] = max(amax, 1e-4) / 448): one scale per key or query."""
    q, scale = quantize_groups_fp8(x, x.shape[1], eps=AMAX_EPS)
    return q, scale[:, 0]
