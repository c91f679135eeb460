"""SGLang's sparse-MLA decode functions as their callers use them: the facts the drop-ins are written for.

SGLang 0.5.14, read from sgl-project/sglang@37ef295c7863f87b476dbb5a8098c743e4e9bab7 (2026-06-16); the three files
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

SGLang 0.5.23 (read from the PyPI wheel `sglang-0.5.23`; paths inside it):

- The sm_120 modules moved to `sglang/kernels/ops/attention/`. The dispatcher
  `flash_mla_sm120.flash_mla_with_kvcache_sm120` (`flash_mla_sm120.py:298-374`) reads the module
  global `_sm120_default_backend` (`:209`, env SGLANG_SM120_FLASHMLA_BACKEND, default "flashinfer",
  read once at import; `srt/environ.py:1272`): "flashinfer" calls `_flash_mla_flashinfer` (`:583-675`)
  by its module-global name for 64 tokens or fewer (`SM120_DECODE_MAX_TOKENS`, `:212`) and FlashInfer's
  prefill kernel above; "triton" imports `flash_mla_sparse_decode_triton` from
  `flash_mla_sm120_triton` at call time (`:343-360`; the file is 0.5.14's with new import paths);
  anything else runs the torch path. `_flash_mla_flashinfer` takes the ten arguments of the Triton
  entry, all positional and required, and returns (out [B, 1, H, head_dim_v] bf16, None).
- Hopper: the DeepSeek-V4 backend binds `functools.partial(flash_mla_interface.flash_mla_with_kvcache,
  use_legacy=not interleaved)` once, in its __init__ (`srt/layers/attention/deepseek_v4_backend.py:
  1262-1272`; the V4 layout is not interleaved, `kernels/ops/attention/dsv4/kv_layout.py:31-33`), and
  calls it by keyword for every decode layer off sm_120 (`:4362-4399`): q [B, 1, H, 512] bf16, the
  same cache views as above, indices [B, 1, K] and extra_indices_in_kvcache [B, 1, K'] (K, K'
  multiples of 64, asserted at `:4246-4252`), topk_length / extra_topk_length [B] int32, attn_sink [H]
  fp32, head_dim_v 512, softmax_scale 512 ** -0.5, block_table and cache_seqlens None,
  is_fp8_kvcache True, tile_scheduler_metadata a `FlashMLASchedMeta` per compress ratio (`:210-215`,
  filled by the first call of a step and reused by later layers), and keeps only the output (`[0]`).
  `flash_mla_interface.flash_mla_with_kvcache` (`kernels/ops/attention/flash_mla_interface.py:66-141`)
  forwards to `flash_mla.flash_mla_with_kvcache` of the `sgl-flash-mla==1.0.0` wheel, which returns
  out [B, 1, H, 512] bf16 and lse [B, H, 1] fp32 without the sink (+inf where nothing is used; its
  `flash_mla_interface.py:142-159`). The same module attribute is also imported at module level by
  `srt/layers/attention/flashmla_backend.py:14-15` (dense MLA of other models): the drop-in hands
  every call that is not DeepSeek-V4's sparse FP8 decode to SGLang's own function.
- Pools and views: as 0.5.14 by default (`SGLANG_DSV4_KV_LAYOUT="v4"`, `srt/environ.py:1754`;
  `KVLayout.V4.page_bytes`, `kv_layout.py:103-105`; the backend's views at
  `deepseek_v4_backend.py:4184-4205`).
"""

from __future__ import annotations

from typing import NamedTuple

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


class Param(NamedTuple):
    """One parameter of an SGLang function, as inspect.signature shows it."""

    name: str
    default: object = REQUIRED
    keyword_only: bool = False


_TEN = ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale",
        "extra_k_cache", "extra_indices", "extra_topk_length")
# In order, all positional-or-keyword (flash_mla_sm120_triton.py:325-336 in both versions)
ENTRY_PARAMETERS: tuple[Param, ...] = tuple(Param(n) for n in _TEN[:7]) + tuple(Param(n, None) for n in _TEN[7:])

# --- SGLang 0.5.23 (the PyPI wheel) --------------------------------------------------------------
SGLANG_023 = "0.5.23"
WRITTEN_FOR_023 = f"SGLang {SGLANG_023} (the PyPI wheel)"
SM120_MODULE_023 = "sglang.kernels.ops.attention.flash_mla_sm120"
TRITON_MODULE_023 = "sglang.kernels.ops.attention.flash_mla_sm120_triton"
FLASHINFER_NAME = "_flash_mla_flashinfer"
# flash_mla_sm120.py:583-594: the same ten names, all required, called positionally (:330-341)
FLASHINFER_PARAMETERS: tuple[Param, ...] = tuple(Param(n) for n in _TEN)
DECODE_MAX_TOKENS_023 = 64  # SM120_DECODE_MAX_TOKENS: larger batches go to FlashInfer's prefill kernel
FLASHMLA_MODULE_023 = "sglang.kernels.ops.attention.flash_mla_interface"
FLASHMLA_NAME = "flash_mla_with_kvcache"
# flash_mla_interface.py:66-88
FLASHMLA_PARAMETERS: tuple[Param, ...] = (
    Param("q"), Param("k_cache"), Param("block_table"), Param("cache_seqlens"), Param("head_dim_v"),
    Param("tile_scheduler_metadata"), Param("num_splits", None), Param("softmax_scale", None),
    Param("causal", False), Param("descale_q", None), Param("descale_k", None),
    Param("is_fp8_kvcache", False), Param("indices", None), Param("attn_sink", None),
    Param("extra_k_cache", None), Param("extra_indices_in_kvcache", None), Param("topk_length", None),
    Param("extra_topk_length", None), Param("kv_format", None), Param("use_legacy", True, keyword_only=True),
)
# The keywords the DeepSeek-V4 backend passes (deepseek_v4_backend.py:4384-4399; use_legacy comes
# from the partial bound at :1268-1271)
FLASHMLA_CALL_KEYWORDS = (
    "q", "k_cache", "head_dim_v", "block_table", "cache_seqlens", "tile_scheduler_metadata", "softmax_scale",
    "is_fp8_kvcache", "indices", "topk_length", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache",
    "extra_topk_length",
)
# ... and to the sm_120 dispatcher (:4350-4361; 0.5.14's deepseek_v4_backend.py:1421-1432 passes the same)
SM120_CALL_KEYWORDS = (
    "q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length", "attn_sink", "extra_k_cache",
    "extra_indices_in_kvcache", "extra_topk_length",
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
