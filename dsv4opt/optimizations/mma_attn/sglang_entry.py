"""mma-attn behind SGLang's sparse-MLA decode functions: same signatures, same tensors, same results.

Three drop-ins, each standing for the SGLang function of its name (the contracts in
sglang_contract.py):

- `flash_mla_sparse_decode_triton`: the sm_120 Triton entry of SGLang 0.5.14
  (`sglang/srt/layers/attention/flash_mla_sm120_triton.py:325-370`) and 0.5.23
  (`sglang/kernels/ops/attention/flash_mla_sm120_triton.py`, the same file). SGLang runs its
  CUDA-core kernel once per cache, then merges the two results and folds in the sink in eager torch;
  here one `mma_attention` call does all of it.
- `flash_mla_flashinfer`: SGLang 0.5.23's `_flash_mla_flashinfer` (`flash_mla_sm120.py:583-675`), the
  sm_120 default for 64 tokens or fewer, which copies the referenced window pages into 64-token pages
  and runs FlashInfer's split-K kernel. Here the 256-token pages are read where they are; the result
  is (out, None), as SGLang's.
- `flash_mla_with_kvcache`: SGLang 0.5.23's `flash_mla_interface.flash_mla_with_kvcache`, FlashMLA's
  sparse FP8 decode on Hopper. DeepSeek-V4's calls (sparse indices, 584-byte FP8 rows, one query per
  request, the legacy kernels) run mma-attn and return FlashMLA's (out, lse without the sink); every
  other call goes to SGLang's own function, which `set_fallback` names (the launcher does).

SGLang's tensors go to the kernel as views, nothing copied: q [B, 1, H, D] is squeezed, k_cache's
pages are our FP8 layout byte for byte (`KVCache` over the same memory), indices [B, 1, K] are
reshaped. Copies happen only off SGLang's path: indices or lengths not int32, a pool whose page
stride is not ceil(page_size * 584 / 576) * 576 (copied into that geometry on every call), and an
fp16 q (the output is bf16, as SGLang's).
"""

from __future__ import annotations

import logging

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.mma_attn import sglang_contract as C
from dsv4opt.workload.kvcache import KVCache

log = logging.getLogger("dsv4opt.sglang")

# The sink stands for "no sink" when attn_sink is None: far below any score, so exp(sink) vanishes
# next to every used slot, yet finite so a request with no used slot gets 0 / exp(sink) = 0.
_NO_SINK = -1.0e20
_first_call_logged: set[str] = set()
_fallback = {}  # SGLang's own function a drop-in hands the calls it does not take


class DropInInputError(DsvOptError):
    """A tensor the drop-in cannot take the way SGLang's function would."""


def _attention(q, k_cache, indices, topk_length, attn_sink, softmax_scale, extra_k_cache, extra_indices,
               extra_topk_length, who: str, lse_with_sink: bool = True):
    """The shared part: SGLang's arguments -> (o [B, H, 512] in q's dtype, lse [B, H] fp32 with the
    sink, or FlashMLA's without it when not lse_with_sink; the caches as (KVCache, indices [B, K],
    lengths [B]))."""
    from dsv4opt.optimizations.mma_attn.kernel import mma_attention

    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)  # flash_mla_sm120_triton.py:342-343
    q3 = _queries(q)
    B, H, _ = q3.shape
    parts = [(_cache(k_cache, "k_cache"), *_slots(indices, topk_length, B, "indices"))]
    if extra_k_cache is not None and extra_indices is not None:  # :355, both or neither
        parts.append((_cache(extra_k_cache, "extra_k_cache"), *_slots(extra_indices, extra_topk_length, B, "extra_indices")))
    sink = _sink(attn_sink, H, q3.device)
    _log_first_call(who, q, parts)
    (swa, swa_idx, swa_len), *extra = parts
    extra_cache, extra_idx, extra_len = extra[0] if extra else (None, None, None)
    o, lse = mma_attention(q3, swa, swa_idx, swa_len, extra_cache, extra_idx, extra_len, sink, float(softmax_scale),
                           lse_with_sink=lse_with_sink)
    return o, lse, parts


def flash_mla_sparse_decode_triton(
    q,
    k_cache,
    indices,
    topk_length,
    attn_sink,
    head_dim_v,
    softmax_scale,
    extra_k_cache=None,
    extra_indices=None,
    extra_topk_length=None,
):
    """SGLang's sm_120 sparse MLA decode over the window cache and, when given, the compressed cache.

    q: [B, 1, H, 512] bf16; k_cache, extra_k_cache: [pages, page_size, 1, 584] e4m3 (or uint8) views
    of SGLang's FP8 pools; indices, extra_indices: [B, ..., K] int32 token numbers (-1 unused);
    topk_length, extra_topk_length: [B] int32 or None (all K slots); attn_sink: [H] fp32 or None;
    head_dim_v: not read (nor is it by SGLang's Triton path); softmax_scale: float or None (D ** -0.5).
    Returns (out [B, 1, H, 512] bf16, lse [B, H, 1] fp32), flash_mla_sm120_triton.py:340-370.
    CUDA-graph safe: no host synchronisation.
    """
    o, lse, parts = _attention(q, k_cache, indices, topk_length, attn_sink, softmax_scale, extra_k_cache,
                               extra_indices, extra_topk_length, "flash_mla_sparse_decode_triton")
    if attn_sink is None:
        # SGLang's lse is -inf where nothing is used (:199); used slots make the stand-in sink vanish.
        lse = torch.where(_any_used(parts)[:, None], lse, torch.full_like(lse, float("-inf")))
    out = o.to(torch.bfloat16)  # SGLang's output is bf16 whatever q's dtype (:240)
    return out.unsqueeze(1), lse.unsqueeze(1).permute(0, 2, 1)  # :278-279, :369-370


def flash_mla_flashinfer(
    q,
    k_cache,
    indices,
    topk_length,
    attn_sink,
    head_dim_v,
    softmax_scale,
    extra_k_cache,
    extra_indices,
    extra_topk_length,
):
    """SGLang 0.5.23's `_flash_mla_flashinfer`: the arguments of the Triton entry, all required.

    q: [B, 1, H, 512] or [B, H, 512]; the caches as SGLang's pools give them (window pages of 256
    tokens, or 64 with SGLANG_OPT_SM120_DIRECT_SWA_KV); indices [B, 1, K] or [B, K]. Returns
    (out [B, 1, H, head_dim_v] bf16, None), flash_mla_sm120.py:639, 675. CUDA-graph safe.
    """
    if head_dim_v != C.DIM:
        raise DropInInputError(f"head_dim_v must be {C.DIM} (the latent width the kernel writes), got {head_dim_v}")
    q4 = q.unsqueeze(1) if q.dim() == 3 else q
    o, _, _ = _attention(q4, k_cache, indices, topk_length, attn_sink, softmax_scale, extra_k_cache,
                         extra_indices, extra_topk_length, "_flash_mla_flashinfer")
    return o.to(torch.bfloat16).unsqueeze(1), None


def flash_mla_with_kvcache(
    q,
    k_cache,
    block_table,
    cache_seqlens,
    head_dim_v,
    tile_scheduler_metadata,
    num_splits=None,
    softmax_scale=None,
    causal=False,
    descale_q=None,
    descale_k=None,
    is_fp8_kvcache=False,
    indices=None,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices_in_kvcache=None,
    topk_length=None,
    extra_topk_length=None,
    kv_format=None,
    *,
    use_legacy=True,
):
    """SGLang 0.5.23's `flash_mla_interface.flash_mla_with_kvcache` (FlashMLA) for DeepSeek-V4's decode.

    A DeepSeek-V4 sparse FP8 decode call (`is_v4_sparse_decode`) runs mma-attn and returns FlashMLA's
    result: out [B, 1, H, 512] bf16 and lse [B, H, 1] fp32, the log-sum-exp of the scores without
    the sink, +inf where no slot is used, written by the kernel's own launches (`lse_with_sink=False`:
    no conversion after it). block_table and cache_seqlens are ignored, as FlashMLA's
    sparse path ignores them; tile_scheduler_metadata is left as it came (mma-attn plans from the
    shapes alone). Any other call goes to SGLang's own function. CUDA-graph safe.
    """
    call = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens, head_dim_v=head_dim_v,
                tile_scheduler_metadata=tile_scheduler_metadata, num_splits=num_splits, softmax_scale=softmax_scale,
                causal=causal, descale_q=descale_q, descale_k=descale_k, is_fp8_kvcache=is_fp8_kvcache,
                indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
                extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
                extra_topk_length=extra_topk_length, kv_format=kv_format)
    if not is_v4_sparse_decode(**call, use_legacy=use_legacy):
        own = _fallback.get(C.FLASHMLA_NAME)
        if own is None:
            raise DropInInputError(
                "not a DeepSeek-V4 sparse FP8 decode call, and SGLang's own flash_mla_with_kvcache is not known "
                "in this process (the launcher names it)")
        return own(**call, use_legacy=use_legacy)
    o, lse, _ = _attention(q, k_cache, indices, topk_length, attn_sink, softmax_scale, extra_k_cache,
                           extra_indices_in_kvcache, extra_topk_length, "flash_mla_with_kvcache", lse_with_sink=False)
    return o.to(torch.bfloat16).unsqueeze(1), lse.unsqueeze(-1)


def is_v4_sparse_decode(q, k_cache, head_dim_v, is_fp8_kvcache, indices, extra_k_cache, causal, kv_format,
                        num_splits, descale_q, descale_k, use_legacy, **_) -> bool:
    """The call is DeepSeek-V4's sparse FP8 decode as the backend makes it (deepseek_v4_backend.py:
    4384-4399): the one kind of FlashMLA call mma-attn computes."""
    def v4_rows(cache) -> bool:
        return isinstance(cache, torch.Tensor) and cache.dim() == 4 and cache.shape[-1] == C.TOKEN_BYTES

    return (
        indices is not None and v4_rows(k_cache) and (extra_k_cache is None or v4_rows(extra_k_cache))
        and isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[1] == 1 and q.shape[-1] == C.DIM
        and q.dtype in (torch.bfloat16, torch.float16) and head_dim_v == C.DIM and bool(is_fp8_kvcache)
        and not causal and kv_format is None and num_splits is None and descale_q is None
        and descale_k is None and use_legacy
    )


def set_fallback(name: str, fn) -> None:
    """SGLang's own function `name`, for the calls its drop-in hands back (the launcher and the plugin
    set it as they install the drop-in; a second install keeps the first, SGLang's)."""
    if getattr(fn, "__module__", None) != __name__:
        _fallback.setdefault(name, fn)


def _queries(q: torch.Tensor) -> torch.Tensor:
    """[B, 1, H, 512] -> the [B, H, 512] view the kernel reads (`q.squeeze(1)`, :235-238)."""
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[-1] != C.DIM:
        raise DropInInputError(
            f"q must be [B, 1, H, {C.DIM}] (one query per request, {C.NOPE} nope + {C.ROPE} rope), got {list(q.shape)}"
        )
    q3 = q.squeeze(1)
    return q3 if q3.stride(-1) == 1 else q3.contiguous()


def _cache(k_cache: torch.Tensor, name: str) -> KVCache:
    """SGLang's [pages, page_size, 1, 584] view -> a KVCache over the same pages (as_strided, :225-233)."""
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != C.TOKEN_BYTES:
        raise DropInInputError(f"{name} must be [pages, page_size, 1, {C.TOKEN_BYTES}], got {list(k_cache.shape)}")
    if k_cache.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise DropInInputError(f"{name} must be float8_e4m3fn or uint8 (SGLang's FP8 pool), got {k_cache.dtype}")
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    L = C.layout(page_size)
    stride = k_cache.stride(0)  # bytes between pages, as SGLang's kernel takes it (:219)
    raw = k_cache.view(torch.uint8).as_strided((pages, stride), (stride, 1))
    if stride == L.page_bytes:
        return KVCache(L, raw)
    # Another page stride: the same records, moved into the geometry the kernel's layout describes.
    used = page_size * (L.data_bytes + L.scale_bytes)
    if stride < used:
        raise DropInInputError(f"{name}: pages {stride} bytes apart cannot hold {page_size} tokens of {C.TOKEN_BYTES} bytes")
    data = torch.zeros(pages, L.page_bytes, dtype=torch.uint8, device=k_cache.device)
    data[:, :used] = raw[:, :used]
    return KVCache(L, data)


def _slots(indices: torch.Tensor, lengths, B: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, ..., K] indices -> [B, K] int32 rows (`indices.reshape(B, -1)`, :222); lengths [B] int32,
    all K when None (:104-107). Lengths above K mean K, as SGLang clamps them."""
    if indices.shape[0] != B:
        raise DropInInputError(f"{name} has {indices.shape[0]} rows for {B} queries")
    flat = indices.reshape(B, -1)
    if flat.dtype != torch.int32:
        flat = flat.to(torch.int32)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    if lengths is None:
        return flat, torch.full((B,), flat.shape[1], dtype=torch.int32, device=flat.device)
    lengths = lengths.reshape(-1)
    if lengths.shape[0] != B:
        raise DropInInputError(f"the lengths for {name} have {lengths.shape[0]} entries for {B} queries")
    return flat, lengths.to(torch.int32).contiguous()


def _sink(attn_sink, H: int, device) -> torch.Tensor:
    if attn_sink is None:
        return torch.full((H,), _NO_SINK, dtype=torch.float32, device=device)
    if attn_sink.numel() != H:
        raise DropInInputError(f"attn_sink has {attn_sink.numel()} values for {H} heads")
    return attn_sink.reshape(H).contiguous()


def _any_used(parts) -> torch.Tensor:
    """[B] bool: some slot of some cache is used (index >= 0 at a position below its length)."""
    used = None
    for _, idx, lengths in parts:
        positions = torch.arange(idx.shape[1], device=idx.device)
        u = ((idx >= 0) & (positions[None, :] < lengths[:, None])).any(dim=1)
        used = u if used is None else used | u
    return used


def _log_first_call(who: str, q, parts) -> None:
    """One line in the server log per process and drop-in: proof that SGLang called it, with what."""
    if who in _first_call_logged:
        return
    _first_call_logged.add(who)
    caches = ", ".join(f"{c.data.shape[0]} pages of {c.layout.page_size} tokens, K {idx.shape[1]}" for c, idx, _ in parts)
    log.info("dsv4opt mma-attn drop-in: first call of %s, q %s %s, caches: %s", who, list(q.shape), q.dtype, caches)
