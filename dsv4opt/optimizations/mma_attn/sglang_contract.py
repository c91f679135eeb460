"""SGLang's sm_120 sparse-decode entry point as its callers use it: the facts the drop-in is written for.

Read from sgl-project/sglang@37ef295c7863f87b476dbb5a8098c743e4e9bab7 (2026-06-16); the three files
named below are byte for byte the same in the PyPI release sglang 0.5.14, the release the drop-in
pins. Facts carry over from SGLang's source, its code does not: everything here is written anew.

- Entry point: `flash_mla_sparse_decode_triton` in
  `python/sglang/srt/layers/attention/flash_mla_sm120_triton.py:325-370`. Its one caller,
  `flash_mla_with_kvcache_sm120` (`flash_mla_sm120.py:203-238`), imports it from that module inside
  the function, on every call: replacing the module attribute reaches it. That dispatcher runs it only
  while `_sm120_default_backend == "triton"` (`flash_mla_sm120.py:198-200`, env
  SGLANG_SM120_TRITON_FLASHMLA, default 1), and the DeepSeek-V4 backend calls the dispatcher only on
  sm_120 GPUs (`deepseek_v4_backend.py:1419-1436`, `_is_sm120`); elsewhere it runs FlashMLA.
- Pool (`mem_cache/deepseek_v4_memory_pool.py:94-120`): one uint8 buffer [pages, page_bytes] per layer
  and cache, page_bytes = ceil(page_size * 584 / 576) * 576. A page holds `page_size` data records of
  576 bytes (448 e4m3 nope values, then 64 bf16 rope values), then `page_size` scale records of 8
  bytes (7 UE8M0 exponents, one per 64 nope values, and a pad byte), then padding. `get_key_buffer`
  views it as the KV dtype, float8_e4m3fn (`:149-153`).
- Page sizes: the window (SWA) pool has pages of 256 tokens (`model_runner_kv_cache_mixin.py:394-395`),
  the C4 pool 256 / 4 = 64, the C128 pool 256 / 128 = 2 (`deepseek_v4_memory_pool.py:533-534`).
- Caller (`deepseek_v4_backend.py:1352-1436`): each buffer sliced to `[:, :page_size * 584]` and viewed
  as k_cache [pages, page_size, 1, 584] (strides page_bytes, 584, 584, 1); q [B, 1, H, 512] bf16
  (q.unsqueeze(1) of [B, H, 512]; H padded to 64 under attention TP, deepseek_v4.py:914);
  indices [B, 1, K] int32 token numbers of that cache, -1 unused, K padded with -1 to a multiple of 64
  (`_pad_last_dim`, :117-122); topk_length [B] int32 (window: min(seq_len, 128)); extra cache, indices
  and lengths for the compressed cache of CSA (C4, K = 512) and HCA (C128) layers, None on window-only
  layers; attn_sink [H] fp32 (always given); head_dim_v 512; softmax_scale 512 ** -0.5.
- Result (`flash_mla_sm120_triton.py:240-370`): out [B, 1, H, 512] bf16, the softmax over the used
  slots of both caches with exp(attn_sink[h]) added to the denominator (0 where nothing is used);
  lse [B, H, 1] fp32 (the permuted view of a [B, 1, H] tensor), natural log, sink included
  (attn_sink[h] where nothing is used; -inf then when attn_sink is None). head_dim_v is not read.
"""

from __future__ import annotations

import torch

from dsv4opt.workload.kvcache import KVLayout

SGLANG_COMMIT = "37ef295c7863f87b476dbb5a8098c743e4e9bab7"
SGLANG_VERSION = "0.5.14"
WRITTEN_FOR = f"SGLang {SGLANG_VERSION} (sgl-project/sglang@{SGLANG_COMMIT[:9]})"

ENTRY_MODULE = "sglang.srt.layers.attention.flash_mla_sm120_triton"
ENTRY_NAME = "flash_mla_sparse_decode_triton"
DISPATCH_MODULE = "sglang.srt.layers.attention.flash_mla_sm120"
DISPATCH_BACKEND = ("_sm120_default_backend", "triton")  # module global, the value that calls the entry
BACKEND_MODULE = "sglang.srt.layers.attention.deepseek_v4_backend"
BACKEND_SM120_FLAG = "_is_sm120"

REQUIRED = object()  # a parameter without a default
# (name, default) in order, all positional-or-keyword (flash_mla_sm120_triton.py:325-336)
ENTRY_PARAMETERS: tuple[tuple[str, object], ...] = (
    ("q", REQUIRED),
    ("k_cache", REQUIRED),
    ("indices", REQUIRED),
    ("topk_length", REQUIRED),
    ("attn_sink", REQUIRED),
    ("head_dim_v", REQUIRED),
    ("softmax_scale", REQUIRED),
    ("extra_k_cache", None),
    ("extra_indices", None),
    ("extra_topk_length", None),
)

NOPE, ROPE, TILE = 448, 64, 64  # flash_mla_sm120.py:28-34
DIM = NOPE + ROPE  # 512: the query and latent width the kernel hard-codes
TOKEN_BYTES = 584  # bytes per token: 576 data + 8 scale (kv_cache_total_dim)
INDEX_ALIGN = 64  # the caller pads every index row to a multiple of this
KV_PAGE = 256  # tokens per page of the window pool; compressed pools: KV_PAGE // ratio
SWA_WINDOW = 128  # window slots per query (deepseek_v4_backend.py:78)


def layout(page_size: int) -> KVLayout:
    """Our description of one of SGLang's FP8 pools (dsv4opt/workload/kvcache.py)."""
    return KVLayout(fp8=True, nope=NOPE, rope=ROPE, tile=TILE, page_size=page_size)


def page_bytes(page_size: int) -> int:
    """Bytes between pages of SGLang's pool: page_size * 584 rounded up to whole 576-byte records."""
    return -(-page_size * TOKEN_BYTES // 576) * 576


def pool_buffer(tokens: int, page_size: int, device="cpu") -> torch.Tensor:
    """One layer's zeroed pool buffer as SGLang allocates it: uint8 [(tokens + page_size + 1) // page_size, page_bytes]."""
    pages = (tokens + page_size + 1) // page_size
    return torch.zeros(pages, page_bytes(page_size), dtype=torch.uint8, device=device)


def caller_k_cache(buffer: torch.Tensor, page_size: int) -> torch.Tensor:
    """The k_cache the DeepSeek-V4 backend passes: the pool viewed as e4m3, sliced and viewed as
    [pages, page_size, 1, 584] (deepseek_v4_memory_pool.py:150-151, deepseek_v4_backend.py:1354-1370)."""
    as_kv_dtype = buffer.view(torch.float8_e4m3fn)
    return as_kv_dtype[:, : page_size * TOKEN_BYTES].view(buffer.shape[0], page_size, 1, TOKEN_BYTES)


def pad_indices(indices: torch.Tensor) -> torch.Tensor:
    """[B, K] -> [B, 1, K'] with K' the next multiple of 64, the new slots -1 (`_pad_last_dim`, then unsqueeze)."""
    K = indices.shape[-1]
    padded = torch.nn.functional.pad(indices, (0, -(-K // INDEX_ALIGN) * INDEX_ALIGN - K), value=-1)
    return padded.to(torch.int32).unsqueeze(1)
