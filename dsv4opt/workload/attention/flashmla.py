"""The Hopper path's attention: FlashMLA's sparse FP8 decode itself, as SGLang 0.5.23 calls it.

On sm_90 SGLang 0.5.23 runs `flash_mla.flash_mla_with_kvcache` of the `sgl-flash-mla==1.0.0` wheel
for every decode layer of DeepSeek-V4 (srt/layers/attention/deepseek_v4_backend.py:4362-4399, bound
with use_legacy=True at :1262-1272): q [B, 1, H, 512] bf16 with H padded to 64, each pool viewed as
e4m3 [pages, page_size, 1, 584], index rows [B, 1, K] (K a multiple of 64), top-k lengths [B],
attn_sink [H] fp32, and one `FlashMLASchedMeta` per compress ratio, made empty once per forward,
filled by the first layer that uses it and reused by the later ones (:210-215). The wheel's objects
use torch's stable C interface, so they load under this tool's torch on a Hopper GPU; this module
calls them, the production kernel and not a stand-in. Its lse excludes the sink; the model does not
read lse.

Where FlashMLA cannot run (a CPU, the tiny config's shapes) the sm_120 path's kernel computes the
same function in its place; a profile's kernel names say which ran.
"""

from __future__ import annotations

import importlib.util

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.workload.attention.sm120 import sparse_decode_sm120
from dsv4opt.workload.kvcache import KVCache

PACKAGE = "sgl-flash-mla==1.0.0"  # what SGLang 0.5.23 pins (METADATA:272)
HEADS = (64, 128)  # the query head counts FlashMLA's sparse decode is built for
DIM = 512
TOKEN_BYTES = 584  # 576 data + 8 scale bytes a token: SGLang's V4 pool record


def flash_mla_module():
    """The `flash_mla` module of sgl-flash-mla; a one-line refusal naming the install when missing."""
    if importlib.util.find_spec("flash_mla") is None:
        raise DsvOptError(f"the SGLang 0.5.23 Hopper path runs FlashMLA itself: pip install --no-deps {PACKAGE}")
    try:
        import flash_mla
    except Exception as exc:  # a wheel built for another torch or CUDA fails here, not at find_spec
        raise DsvOptError(f"flash_mla does not import here ({type(exc).__name__}: {exc})") from None
    return flash_mla


def hopper(device: torch.device) -> bool:
    """`device` is a Hopper GPU (sm_90), the one FlashMLA's sparse FP8 decode is built for here."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def missing_on(device: torch.device) -> str | None:
    """Why the Hopper path cannot run on `device` (a Hopper GPU without the wheel), or None: off Hopper
    the sm_120 kernel stands in, so only a Hopper GPU needs FlashMLA."""
    if not hopper(device):
        return None
    try:
        flash_mla_module()
    except DsvOptError as exc:
        return str(exc)
    return None


def runs_flashmla(q: torch.Tensor, swa: KVCache) -> bool:
    """FlashMLA can take this call: a Hopper GPU, SGLang's FP8 pools, bf16 queries of its head counts
    and width."""
    return (hopper(q.device) and swa.layout.fp8 and q.dtype == torch.bfloat16 and q.shape[1] in HEADS
            and q.shape[2] == DIM)


def k_cache_view(cache: KVCache) -> torch.Tensor:
    """A pool as SGLang's backend passes it: e4m3 [pages, page_size, 1, 584], page stride kept."""
    size = cache.layout.page_size
    return cache.data.view(torch.float8_e4m3fn)[:, : size * TOKEN_BYTES].view(cache.data.shape[0], size, 1, TOKEN_BYTES)


_STEP_METADATA: dict[int, object] = {}  # compress ratio -> this step's FlashMLASchedMeta


def new_step() -> None:
    """Forget the scheduler metadata: the model calls this before each step's layers, as SGLang's
    backend makes new metadata each forward (under CUDA graphs the step that is captured makes it,
    and every replay recomputes it in the graph)."""
    _STEP_METADATA.clear()


def sparse_decode_flashmla(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                           extra_lengths, sink, scale):
    """The `attention` slot on the Hopper path (contract: dsv4opt/workload/slots.py; lse without the
    sink, FlashMLA's). One FlashMLASchedMeta per compress ratio a step (0: window only), made empty
    by the first layer of its ratio, filled by FlashMLA there and reused by the later layers, as
    SGLang's backend does (deepseek_v4_backend.py:210-215)."""
    if not runs_flashmla(q, swa):
        return sparse_decode_sm120(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale)
    fm = flash_mla_module()
    ratio = 0 if extra is None else swa.layout.page_size // extra.layout.page_size
    if ratio not in _STEP_METADATA:
        _STEP_METADATA[ratio] = fm.get_mla_metadata()[0]
    out, lse = fm.flash_mla_with_kvcache(
        q=q.unsqueeze(1), k_cache=k_cache_view(swa), block_table=None, cache_seqlens=None, head_dim_v=DIM,
        tile_scheduler_metadata=_STEP_METADATA[ratio], softmax_scale=scale, causal=False, is_fp8_kvcache=True,
        indices=swa_indices.unsqueeze(1), attn_sink=sink.float(),
        extra_k_cache=None if extra is None else k_cache_view(extra),
        extra_indices_in_kvcache=None if extra is None else extra_indices.unsqueeze(1),
        topk_length=swa_lengths, extra_topk_length=None if extra is None else extra_lengths, use_legacy=True,
    )
    return out.squeeze(1), lse.squeeze(-1)
