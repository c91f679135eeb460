"""SGLang 0.5.23's Marlin W4A16 MoE (`moe_wna16_marlin_gemm`) on the workload's MXFP4 experts.

What SGLang runs for the routed experts under the H200 recipe's `--moe-runner-backend marlin`
without expert parallelism (`fused_marlin_moe`, srt/layers/moe/fused_moe_triton/fused_marlin_moe.py):

    block_size_m  the first of 8, 16, 32, 48, 64 with M * top_k / E / block < 0.9 (:246-250): 8 at
                  decode, where every one of the 256 experts is local
    align         tokens sorted by expert into blocks of block_size_m (:255-276; SGLang's JIT
                  moe_align kernels, here `align` in torch): sorted ids padded with M * top_k, one
                  expert id per block, ascending, and [padded tokens, inactive blocks] int32
    workspace     zeros(SMs * 4) int32 per call (moe_runner/marlin.py:157-159)
    GEMM1         <bf16, F, F, T, F, T>: x [M, d] -> [M * top_k, 2I] (gate then up) (:315-347)
    activation    silu(min(gate, limit)) * clamp(up, +-limit) (swiglu_limit_func, :356-360)
    GEMM2         <bf16, F, F, T, T, T>: [M * top_k, I] -> [M * top_k, d], rows times their top-k
                  weight, in which SGLang has folded the routed scale (:379-406)
    sum           over the top-k rows of each token (moe_topk_sum, :424-432)

Weights: SGLang keeps the checkpoint's MXFP4 experts [E, N, K/2] (two e2m1 codes a byte, the first
in the low nibble) and E8M0 scales [E, N, K/32], and at load time repacks them for Marlin
(`prepare_moe_mxfp4_layer_for_marlin`, srt/layers/quantization/marlin_utils_fp4.py:346-466):
each expert's codes viewed int32 [N, K/8] and transposed to GPTQ's [K/8, N], then
`gptq_marlin_repack(num_bits=4, no perm)` (kernels/jit/csrc/gemm/marlin/gptq_marlin_repack.cuh)
into [K/16, 2N] int32; its scales transposed to [K/32, N], permuted by `marlin_permute_scales`
(marlin_utils.py:301-321) and, for bf16 activations, each run of 4 reordered 0, 2, 1, 3 before
the cast to float8_e8m0fnu (`mxfp4_marlin_process_scales`, marlin_utils_fp4.py:216-231).
`repack_codes` and `permute_scales` below do the same in torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.workload.kernels.moe import silu_mul_clamp
from dsv4opt.workload.production.artefacts import MARLIN, TVM_FFI, cache_dir, present
from dsv4opt.workload.quant import MXFP4_GROUP

TILE_K, TILE_N = 16, 64  # gptq_marlin_repack's tile (marlin.cuh: tile_size 16, tile_n = 4 * tile_k)
PACK = 8  # 4-bit codes an int32 holds
BLOCK_SIZES = (8, 16, 32, 48, 64)
# Within a 16 x 64 tile, thread t of warp w writes int32 number t * 4 + w of the tile's 128; its 8
# codes are rows tc_row + (0, 1, 8, 9) of columns cur_n and cur_n + 8, interleaved 0 2 4 6 1 3 5 7
# (gptq_marlin_repack.cuh:150-221).
_TC_OFFSETS = (0, 1, 8, 9)
_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def scalar_type_id(exponent: int, mantissa: int, signed: bool, bias: int, finite_only: bool, nan_repr: int) -> int:
    """ScalarType::id() of sgl_kernel/scalar_type.hpp:122-132: the fields packed low to high
    (exponent 8 bits, mantissa 8, signed 1, bias 32, finite_values_only 1, nan_repr 8)."""
    out, shift = 0, 0
    for value, bits in ((exponent, 8), (mantissa, 8), (int(signed), 1), (bias, 32), (int(finite_only), 1),
                        (nan_repr, 8)):
        out |= (value & ((1 << bits) - 1)) << shift
        shift += bits
    return out


FE2M1F_ID = scalar_type_id(2, 1, True, 0, True, 0)  # kFE2M1f: float_(2, 1, finite only, NAN_NONE)


def _tile_index() -> torch.Tensor:
    """[128, 8]: for each int32 of a repacked 16 x 64 tile, the row-major positions (k * 64 + n) of
    its 8 codes, lowest nibble first."""
    idx = torch.empty(128, 8, dtype=torch.long)
    for w in range(4):
        for t in range(32):
            col, row = w * 16 + t // 4, (t % 4) * 2
            vals = [(row + o) * TILE_N + col for o in _TC_OFFSETS] + [(row + o) * TILE_N + col + 8 for o in _TC_OFFSETS]
            idx[t * 4 + w] = torch.tensor([vals[i] for i in _NIBBLE_ORDER])
    return idx


_TILE_INDEX = _tile_index()


def codes(packed: torch.Tensor) -> torch.Tensor:
    """MXFP4 bytes [..., N, K/2] -> e2m1 codes [..., N, K] uint8 (the low nibble first)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def repack_codes(packed: torch.Tensor) -> torch.Tensor:
    """One expert's MXFP4 bytes [N, K/2] -> Marlin's int32 [K/16, 2N] (gptq_marlin_repack, 4 bits, no perm)."""
    N, K = packed.shape[0], packed.shape[1] * 2
    assert K % TILE_K == 0 and N % TILE_N == 0, (N, K)
    q = codes(packed).t().to(torch.int64)  # [K, N]: GPTQ's orientation
    tiles = q.reshape(K // TILE_K, TILE_K, N // TILE_N, TILE_N).permute(0, 2, 1, 3).reshape(K // TILE_K, N // TILE_N, -1)
    nib = tiles[:, :, _TILE_INDEX.to(q.device)]  # [K/16, N/64, 128, 8]
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    words = (nib << shifts).sum(-1)  # disjoint nibbles: the sum is the OR
    words = torch.where(words >= 1 << 31, words - (1 << 32), words)  # the same 32 bits as int32
    return words.reshape(K // TILE_K, -1).to(torch.int32)


def scale_perm() -> list[int]:
    """marlin_utils.get_scale_perms' grouped permutation (64 entries)."""
    return [i + 8 * j for i in range(8) for j in range(8)]


def permute_scales(scales: torch.Tensor) -> torch.Tensor:
    """One expert's power-of-two scales [N, K/32] (any float dtype) -> Marlin's [K/32, N] float8_e8m0fnu."""
    N = scales.shape[0]
    s = scales.t().contiguous().to(torch.bfloat16)  # _normalize_scale_tensor: the value 2^e in bf16
    s = s.reshape(-1, 64)[:, scale_perm()].reshape(-1, N)
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(-1, N)
    return s.to(torch.float8_e8m0fnu).contiguous()


@dataclass
class MarlinExperts:
    """Expert weight sets in Marlin's layout: codes [E, K/16, 2N] int32, scales [E, K/32, N] e8m0."""

    weight: torch.Tensor
    scales: torch.Tensor
    size_n: int
    size_k: int

    @classmethod
    def from_mxfp4(cls, packed: torch.Tensor, scales: torch.Tensor) -> "MarlinExperts":
        """From the workload's Mxfp4Experts tensors (packed [E, N, K/2] uint8, scales [E, N, K/32])."""
        E, N, half = packed.shape
        assert scales.shape == (E, N, half * 2 // MXFP4_GROUP), (packed.shape, scales.shape)
        weight = torch.stack([repack_codes(packed[e]) for e in range(E)])
        marlin_scales = torch.stack([permute_scales(scales[e]) for e in range(E)])
        return cls(weight, marlin_scales, N, half * 2)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes


def block_size_m(tokens: int, top_k: int, experts: int) -> int:
    """fused_marlin_moe's block_size_m (:246-250)."""
    for block in BLOCK_SIZES:
        if tokens * top_k / experts / block < 0.9:
            return block
    return BLOCK_SIZES[-1]


def align(topk_ids: torch.Tensor, block: int, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align_block_size with return_inactive_prefix_count, in torch (sync-free): topk_ids [M, k]
    int32, every id local -> (sorted ids [L] int32 padded with M * k, expert ids [ceil(L / block)]
    int32 ascending, [padded tokens, 0] int32). L is SGLang's buffer length (the align kernel's
    max_num_tokens_padded): k * block for one token, else M * k + (E + 1) * (block - 1), rounded to 4."""
    numel = topk_ids.numel()
    length = numel * block if numel < experts + 1 else numel + (experts + 1) * (block - 1)
    length = -(-length // 4) * 4
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    counts = torch.zeros(experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    start = torch.cumsum(padded, 0) - padded  # first sorted position of each expert
    first = torch.cumsum(counts, 0) - counts  # first slot of each expert in expert order
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    position = start[expert_of] + torch.arange(numel, device=dev) - first[expert_of]
    sorted_ids = torch.full((length,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, position, order.to(torch.int32))
    blocks = -(-length // block)
    bounds = torch.cumsum(padded, 0)  # end of each expert's blocks
    block_start = torch.arange(blocks, device=dev) * block
    expert_ids = torch.searchsorted(bounds, block_start, right=True).clamp(max=experts - 1).to(torch.int32)
    total = padded.sum().to(torch.int32)
    # past the padded count SGLang's ids are unused; these keep the last expert (non-decreasing)
    post = torch.stack([total, torch.zeros_like(total)])
    return sorted_ids, expert_ids, post


@lru_cache(maxsize=None)
def modules() -> tuple:
    """The two tvm-ffi modules (GEMM1, GEMM2) from the cache; tvm_ffi from this Python, else the cache's."""
    cache = cache_dir()
    if not present(MARLIN, cache) or not present(TVM_FFI, cache):
        raise DsvOptError(f"no Marlin build in {cache}; run `dsv4opt build-kernels`")
    try:
        import tvm_ffi
    except ImportError:
        sys.path.insert(0, str(cache / TVM_FFI))
        import tvm_ffi
    folder = cache / MARLIN
    return tuple(tvm_ffi.load_module(str(folder / f"moe_wna16_marlin_{g}.so")) for g in ("gemm1", "gemm2"))


def marlin_gemm(module, a: torch.Tensor, c: torch.Tensor, experts: MarlinExperts, workspace: torch.Tensor,
                sorted_ids: torch.Tensor, expert_ids: torch.Tensor, post: torch.Tensor, topk_weights: torch.Tensor,
                block: int, top_k: int, mul_topk_weights: bool) -> torch.Tensor:
    """One moe_wna16_marlin_gemm call with the arguments SGLang's wrapper passes for MXFP4 without EP
    (kernels/ops/moe/moe_wna16_marlin.py:52-209): no bias, zeros, act order or global scale; K full;
    no atomic add (MXFP4), fp32 reduce with its c_tmp; group size 32."""
    dev = a.device
    size_m, size_k, size_n = a.shape[0], experts.size_k, experts.size_n
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    c_tmp_size = min(size_n * sorted_ids.shape[0], sms * 4 * block * 256) * (2 if block == 8 else 1)
    c_tmp = torch.empty(c_tmp_size, dtype=torch.float32, device=dev)
    none_i32 = torch.empty(0, dtype=torch.int32, device=dev)
    none_a = torch.empty(0, dtype=a.dtype, device=dev)
    groups = experts.scales.shape[1]
    # the scales' bytes as uint8: the kernel reads them by its scalar type and checks no dtype, and
    # torch 2.11's DLPack export may not know float8_e8m0fnu
    scales = experts.scales.view(torch.uint8)
    module.moe_wna16_marlin_gemm(
        a, c, experts.weight, none_a, scales, none_a, none_a, none_i32, none_i32, workspace, sorted_ids,
        expert_ids, post, topk_weights, none_a, c_tmp, block, top_k, mul_topk_weights, False, FE2M1F_ID, size_m,
        size_n, size_k, False, False, True, False, groups, size_k // groups, False, True, False)
    return c


def routed_experts(x: torch.Tensor, topk_ids: torch.Tensor, gates: torch.Tensor, w13: MarlinExperts,
                   w2: MarlinExperts, limit: float, scale: float, act=None) -> torch.Tensor:
    """The `routed_experts` slot's contract (dsv4opt/workload/slots.py) under tensor parallelism (every
    id local): x [M, d] bf16, topk_ids [M, k] int32, gates [M, k] fp32 -> [M, d] bf16 =
    scale * sum_j gates * w2 @ act(w13 @ x). `act(inter, limit)` is the SwiGLU between the GEMMs
    (default: the workload's silu_mul_clamp kernel)."""
    act = act or silu_mul_clamp
    gemm1, gemm2 = modules()
    M, k = topk_ids.shape
    E = w13.weight.shape[0]
    block = block_size_m(M, k, E)
    sorted_ids, expert_ids, post = align(topk_ids, block, E)
    weights = (gates.float() * scale).contiguous()  # SGLang folds the routed scale into the weights
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    workspace = torch.zeros(sms * 4, dtype=torch.int32, device=x.device)
    inter = torch.empty(M * k, w13.size_n, dtype=x.dtype, device=x.device)
    marlin_gemm(gemm1, x, inter, w13, workspace, sorted_ids, expert_ids, post, weights, block, k, False)
    down = torch.empty(M * k, w2.size_n, dtype=x.dtype, device=x.device)
    marlin_gemm(gemm2, act(inter, limit), down, w2, workspace, sorted_ids, expert_ids, post, weights, block, 1, True)
    return down.view(M, k, -1).sum(1)
