"""SGLang 0.5.23's TileLang mHC kernels on Hopper, from the cubins `dsv4opt build-kernels` lowered.

What SGLang runs at each post -> pre boundary of DeepSeek-V4-Flash (`mhc_fused_post_pre`,
sglang/kernels/ops/layernorm/mhc.py:1608-1830; on by default on Hopper) and at the first read of a
step (`mhc_pre`, :1062-1136 with SGLANG_OPT_DEEPGEMM_HC_PRENORM):

- up to 32 tokens (:1692-1731): `mhc_fused_post_pre_fma_tilelang` (one CTA per token, output tile
  and hidden split: the post step, its bf16 residual, the pre-mix GEMM partials and square sums),
  tile_n 2 and 8 splits below 8 tokens, tile_n 3 and 4 splits from 8 to 32;
- more than 32 tokens (:1733-1781): `mhc_post_tilelang`, then DeepGEMM's `tf32_hc_prenorm_gemm`
  (deepgemm.hc_prenorm_gemm) with _compute_num_split_for_mhc_pre's split count (64 up to 64 tokens);
- then `mhc_pre_big_fuse_with_norm_tilelang` (:890-1060, :1801-1832): the partials summed, the RMS
  factor, sigmoid gates, 20 Sinkhorn iterations, the weighted sum of the copies and the sublayer's
  RMSNorm, one CTA of 96 threads per token.

Every launch goes on torch's current stream with PDL (cubin.py). Tensors are SGLang's: residual
[T, hc, d] bf16, post [T, hc] fp32, comb [T, hc, hc] fp32 (row j = source copy), fn [24, hc*d] fp32,
scale [3], base [24] fp32, norm weight [d] bf16; all contiguous.
"""

from __future__ import annotations

import ast
import json
import operator
from functools import lru_cache
from pathlib import Path

import torch

from dsv4opt import tritonlib
from dsv4opt.errors import DsvOptError
from dsv4opt.workload.production.artefacts import MHC, cache_dir, present
from dsv4opt.workload.production.cubin import CubinKernel

FMA_MAX_TOKENS = 32  # mhc.py:1690 fma_token_threshold
BIG_FUSE_SPLITS = (4, 8, 64)  # the big-fuse cubins built: SGLang's decode picks up to 128 tokens on 64+ SMs
HC_SPLIT_BLOCK = 64  # _compute_num_split_for_mhc_pre's block_m and block_k (mhc.py:816-823)


def fma_plan(tokens: int, hidden: int) -> tuple[int, int]:
    """(tile_n, n_splits) SGLang's boundary picks for the FMA kernel (mhc.py:1692-1695)."""
    return (2 if tokens < 8 else 3), (8 if tokens < 8 and hidden <= 4096 else 4)


def prenorm_splits(tokens: int, hc_hidden: int, sms: int) -> int:
    """_compute_num_split_for_mhc_pre (mhc.py:816-823): the tf32 pre-norm GEMM's K splits."""
    grid = -(-tokens // HC_SPLIT_BLOCK)
    return max(1, min(sms // max(grid, 1), -(-hc_hidden // HC_SPLIT_BLOCK) // 4))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod}


def extent(expr: str, sizes: dict[str, int]) -> int:
    """A thread extent the lowering recorded ("num_tokens", "12", "(num_tokens + 1) // 2") at `sizes`."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("Div", "FloorDiv", "truncdiv"):
            return ev(node.args[0]) // ev(node.args[1])  # TVM's spelling of an integer division
        raise ValueError(f"cannot evaluate thread extent {expr!r}")
    return int(ev(ast.parse(expr, mode="eval")))


class Variant:
    """One cubin of the manifest, launched with SGLang's argument names."""

    def __init__(self, name: str, entry: dict, folder: Path):
        self.name = name
        self.constants = entry["constants"]
        self.params = [p for p, _ in entry["params"]]
        self.grid_expr, self.block = entry["grid"], tuple(entry["block"])
        types = tuple("ptr" if t == "handle" else "int32" for _, t in entry["params"])
        self.kernel = CubinKernel((folder / entry["cubin"]).read_bytes(), entry["entry"], types, entry["dyn_smem"],
                                  pdl=entry["pdl_sync"])

    def __call__(self, **named) -> None:
        sizes = {k: v for k, v in named.items() if isinstance(v, int)}
        grid = tuple(extent(e, sizes) for e in self.grid_expr)
        missing = set(self.params) - set(named)
        assert not missing, f"{self.name}: missing {missing}"
        self.kernel.launch(grid, self.block, *[named[p] for p in self.params])


@lru_cache(maxsize=None)
def variants(folder: str | None = None) -> dict[str, Variant]:
    """The cubins in the cache (or `folder`), by name: big_fuse_s{4,8,64}, fma_t{2,3}, post."""
    path = Path(folder) if folder else cache_dir() / MHC
    if not present(MHC, path.parent):
        raise DsvOptError(f"no TileLang mHC cubins in {path}; run `dsv4opt build-kernels`")
    manifest = json.loads((path / "variants.json").read_text())
    return {name: Variant(name, entry, path) for name, entry in manifest["variants"].items()}


def _contiguous(*ts: torch.Tensor) -> None:
    for t in ts:
        assert t.is_cuda and t.is_contiguous(), (tuple(t.shape), t.stride())


def big_fuse(mix: torch.Tensor, sq: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
             norm_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_pre_big_fuse_with_norm_tilelang: partials mix [S, T, 24], sq [S, T] fp32 (S in 4, 8, 64) and
    the copies residual [T, hc, d] bf16 -> (x normed [T, d] bf16, post [T, hc], comb [T, hc, hc] fp32).
    The contract of the workload's hc_pre_big_fuse (kernels/mhc_fused.py)."""
    S, T, N = mix.shape
    _, hc, d = residual.shape
    kernel = variants().get(f"big_fuse_s{S}")
    if kernel is None:
        raise DsvOptError(f"no big-fuse cubin for {S} splits; SGLang's decode uses 4, 8 and 64")
    _contiguous(mix, sq, residual, scale, base, norm_weight)
    post = torch.empty(T, hc, device=mix.device, dtype=torch.float32)
    comb = torch.empty(T, hc, hc, device=mix.device, dtype=torch.float32)
    x = torch.empty(T, d, device=mix.device, dtype=torch.bfloat16)
    if T:
        kernel(gemm_out_mul=mix, gemm_out_sqrsum=sq, hc_scale=scale, hc_base=base, residual=residual,
               post_mix=post, comb_mix=comb, layer_input=x, norm_weight=norm_weight, num_tokens=T)
    return x, post, comb


def post_pre_fma(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                 tile_n: int, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_fused_post_pre_fma_tilelang: the post step out = post * y + comb^T residual (bf16) and the
    next pre's partials -> (out [T, hc, d] bf16, mix [splits, T, 24], sq [splits, T] fp32)."""
    T, hc, d = residual.shape
    kernel = variants()[f"fma_t{tile_n}"]
    _contiguous(y, residual, post, comb, fn)
    out = torch.empty_like(residual)
    mix = torch.empty(splits, T, fn.shape[0], device=y.device, dtype=torch.float32)
    sq = torch.empty(splits, T, device=y.device, dtype=torch.float32)
    if T:
        kernel(prev_comb_mix=comb, prev_residual=residual, prev_post_mix=post, hidden_in=y, pre_fn=fn,
               mixes_partial_out=mix, sqrsum_partial_out=sq, cur_residual_out=out, num_tokens=T, split_k=splits)
    return out, mix, sq


def post(y: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """mhc_post_tilelang as the boundary calls it over 32 tokens: the contract of the workload's
    hc_post (y [T, d], residual [T, hc, d] bf16, post [T, hc], comb [T, hc, hc] -> [T, hc, d] bf16)."""
    T = residual.shape[0]
    _contiguous(y, residual, post_mix, comb)
    out = torch.empty_like(residual)
    if T:
        variants()["post"](a=comb, b=residual, c=post_mix, d=y, x=out, num_tokens=T)
    return out


def fused_post_pre(y, residual, post_mix, comb, fn, scale, base, norm_weight, prenorm_gemm=None):
    """The whole boundary as SGLang's mhc_fused_post_pre runs it with a norm weight ->
    (residual_cur [T, hc, d], x normed [T, d], post_cur [T, hc], comb_cur [T, hc, hc]).
    `prenorm_gemm(flat, fn, splits)` is DeepGEMM's tf32_hc_prenorm_gemm (deepgemm.hc_prenorm_gemm),
    needed above 32 tokens."""
    T, hc, d = residual.shape
    if T <= FMA_MAX_TOKENS:
        tile_n, splits = fma_plan(T, d)
        cur, mix, sq = post_pre_fma(y, residual, post_mix, comb, fn, tile_n, splits)
    else:
        cur = post(y, residual, post_mix, comb)
        mix, sq = prenorm_gemm(cur.view(T, hc * d), fn, prenorm_splits(T, hc * d, tritonlib.sm_count(y.device)))
    x, post_cur, comb_cur = big_fuse(mix, sq, cur, scale, base, norm_weight)
    return cur, x, post_cur, comb_cur
