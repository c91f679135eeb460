"""The eager glue of SGLang's sm_120 decode path, region by region.

Each function is one run of eager torch operations between two of SGLang's kernels, written with
exactly the operations SGLang runs there, in its order, so the baseline launches what SGLang
launches (tests/workload/test_fidelity.py): the baseline of the glue slots (hc_split_sum,
moe_local; contracts in dsv4opt/workload/slots.py) and the pieces of the routed-experts baseline
(dsv4opt/workload/baseline.py). Their float64 definitions are in dsv4opt/workload/kernels/naive.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4opt.workload.kernels.mhc import hc_split_sinkhorn


def moe_local_eager(ids: torch.Tensor, owner: torch.Tensor, row_rank: torch.Tensor) -> torch.Tensor:
    """The local expert of each (row, expert) slot, -1 for experts of another rank: SGLang's
    global -> local map (token_dispatcher/standard.py:169-212), one advanced index: 3 launches on a
    GPU (the index tensors cast to int64, the gather)."""
    return owner[row_rank[:, None], ids]


def moe_slots_eager(local_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-slot path's set-up: each slot's local set (other ranks' experts run on set 0), the
    row it reads, whether it is another rank's (in mxfp4_moe_sm120_triton.py:327-454): 4 launches."""
    M, k = local_ids.shape
    flat = local_ids.reshape(-1)
    invalid = flat < 0
    experts = flat.clamp(min=0)
    rows = torch.arange(M, device=local_ids.device, dtype=torch.int32).unsqueeze(1).expand(M, k).reshape(-1).contiguous()
    return experts, rows, invalid


def moe_act_eager(inter: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU with SGLang's clamp between the two slot GEMVs, in fp32 (in
    mxfp4_moe_sm120_triton.py:327-454): 7 launches."""
    I = inter.shape[1] // 2
    gate = inter[:, :I].float()
    up = inter[:, I:].float()
    gate = torch.clamp(gate, max=limit)
    up = torch.clamp(up, min=-limit, max=limit)
    return (F.silu(gate) * up).to(inter.dtype)


def moe_combine_eager(down: torch.Tensor, invalid: torch.Tensor, gates: torch.Tensor, scale: float) -> torch.Tensor:
    """The other ranks' slots zeroed, the weighted sum over each row's top-k, SGLang's scaling
    inside the fallback (in mxfp4_moe_sm120_triton.py:327-454): 7 launches."""
    M, k = gates.shape
    down = down * (~invalid).unsqueeze(1).to(down.dtype)
    out = (down * gates.reshape(-1).unsqueeze(1).to(down.dtype)).view(M, k, -1).sum(dim=1)
    out.mul_(scale)
    return out


def hc_split_sum_eager(mix: torch.Tensor, rsqrt: torch.Tensor, flat: torch.Tensor, scale: torch.Tensor,
                       base: torch.Tensor, hc: int, iters: int, eps: float, dtype: torch.dtype):
    """The hyper-connection pre-mix after its linear (in deepseek_v4.py:1234-1332): the RMS factor
    applied, the TileLang Sinkhorn split, the weighted sum of the copies: 5 launches."""
    T = flat.shape[0]
    mix = mix * rsqrt[:, None]
    pre, post, comb = hc_split_sinkhorn(mix, scale, base, hc, iters, eps)
    x = (pre[:, :, None] * flat.view(T, hc, -1)).sum(1).to(dtype)
    return x, post, comb
