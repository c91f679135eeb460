"""One rank's batched decode step of DeepSeek-V4-Flash as SGLang runs it (random weights).

The step launches what SGLang's sm_120 path launches at sgl-project/sglang@37ef295c7, part by part
(docs/workload.md has the table, with SGLang's source lines), with our
own kernels standing in for SGLang's TileLang/JIT/sgl-kernel ones (dsv4opt/workload/kernels/); or,
with `sglang="0.5.23"`, what SGLang 0.5.23 launches on Hopper, FlashMLA itself among it
(dsv4opt/workload/paths.py says what each path changes).
Every part runs inside a `torch.profiler.record_function` range named after it (PARTS), and the
step is free of host syncs so it can be captured as a CUDA graph.

One rank of a deployment (dsv4opt/workload/layout.py). Tensor parallel (`tp4`, SGLang's sm_120
recipe; `tp8`): the rank holds every request, computes its slice of the query heads and pads q back
to the model's heads for the sparse decode kernel, holds its output groups, every expert sliced along
its intermediate width and its slice of the shared expert; `wo_b`'s output and the MoE's are
all-reduced. Data-parallel attention with expert parallelism (`dp-ep`): attention for the rank's
own C requests; the MoE over the tokens of all ranks (SGLang gathers them when no all-to-all
backend is set), the rank's share of the tensor-parallel shared expert, and per-slot GEMVs over
every (token, expert) slot, where slots of experts on other ranks run on local expert 0 and are
zeroed; then the reduce-scatter back (dsv4opt/workload/collectives.py).

By default one process plays rank 0 alone and runs no collective: under dp-ep the other ranks'
tokens are copies of its own and its own tokens are routed to resident expert set e mod R, so the
step computes their whole MoE; under tensor parallelism the all-reduces are left out (each would
sum the ranks' partial outputs). Given the ranks of a torch.distributed group (`comm`), each
process is one real rank and communicates for real.

The index rows of the sparse attention and the indexer's page table are as wide as SGLang's
CUDA-graph decode metadata when `graph_context` is given (deepseek_v4_backend.py:498: sized to the
model's context length, whatever the batch's lengths), else as wide as the drawn contexts need.

Everything random is drawn so that it does not depend on how the deployment is split: every rank
draws the requests of all ranks and keeps its own, draws each sharded weight whole and keeps its
slice, and draws each expert whole from a generator of its own. Under dp-ep N ranks of C requests
therefore hold exactly the state of one process with N * C requests and every expert
(`with_expert_parallel(1)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from dsv4opt import tritonlib
from dsv4opt.errors import DsvOptError
from dsv4opt.workload.attention import flashmla
from dsv4opt.workload.collectives import ModelledRanks, ProcessGroupRanks
from dsv4opt.workload.config import CSA, HCA, WINDOW, ModelConfig
from dsv4opt.workload.kernels.compress import compress_forward, compress_norm_rope_store
from dsv4opt.workload.kernels.indexer import index_q_rope_hadamard_quant
from dsv4opt.workload.kernels.linear import block_fp8_matmul, group_quant_fp8, mm_out_fp32
from dsv4opt.workload.kernels.mhc import hc_post, hc_prenorm
from dsv4opt.workload.kernels.mhc_fused import hc_pre_big_fuse, hc_pre_gemm
from dsv4opt.workload.kernels.moe import moe_gate, silu_mul_clamp
from dsv4opt.workload.kernels.norm import rms_norm
from dsv4opt.workload.kernels.rope import kv_norm_rope_store, q_norm_rope, rope_inplace
from dsv4opt.workload.kvcache import BF16_LAYOUT, FP8_LAYOUT, IndexKeyCache, KVCache, KVLayout
from dsv4opt.workload.layout import Layout
from dsv4opt.workload.paths import DEFAULT_PATH, SGLangPath
from dsv4opt.workload.production.choice import KernelChoice
from dsv4opt.workload.slots import with_overrides
from dsv4opt.workload.weights import Fp8Linear, Mxfp4Experts, derived_seed

PARTS = (
    "embed", "mhc_pre", "attn_norm", "qkv", "indexer", "compress", "attn", "o_proj", "mhc_post",
    "ffn_norm", "moe", "mhc_head", "lm_head",
)
INDEX_ALIGN = 64  # index widths are padded to a multiple of this (SGLang's PAGE_INDEX_ALIGNED_SIZE)


class Boundary(NamedTuple):
    """A block's output before its hyper-connection post step. With TileLang's mHC kernels SGLang
    applies the post in the next block's pre step (mhc_fused_post_pre: one FMA kernel up to 32 tokens,
    else post, tf32 GEMM and big fuse), so a block hands this on instead of the new residual."""

    y: torch.Tensor  # the sublayer's output [T, d]
    residual: torch.Tensor  # the copies it read [T, hc, d]
    post: torch.Tensor  # [T, hc] fp32
    comb: torch.Tensor  # [T, hc, hc] fp32


@dataclass
class Layer:
    """Weights and caches of one layer; `slots` = compressed entries a request can hold (0: window only)."""

    index: int
    kind: str
    slots: int
    w: dict = field(default_factory=dict)
    swa: KVCache | None = None  # the window cache: one page of cfg.window_page tokens per request
    extra: KVCache | None = None  # compressed entries: `pages` pages per request
    pages: int = 0
    state: torch.Tensor | None = None  # compressor state ring [C, ring, W] fp32
    index_keys: IndexKeyCache | None = None  # CSA only
    index_pages: int = 0
    index_state: torch.Tensor | None = None


class DecodeWorkload:
    """C requests decoding one token per `step`, with their caches filled at construction.

    Two workloads built with the same arguments on the same device hold identical weights, caches
    and contexts whatever `impls` says: an optimisation only replaces slot implementations.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        concurrency: int,
        context: int,
        device: str | torch.device = "cpu",
        layers: int | None = None,
        experts_resident: int | None = None,
        impls: dict[str, Callable] | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.bfloat16,
        kv: str = FP8_LAYOUT,
        max_new_tokens: int = 256,
        on_layer: Callable[[int], None] | None = None,
        comm: ModelledRanks | ProcessGroupRanks | None = None,
        layout: str | None = None,
        graph_context: int | None = None,
        sglang: str = DEFAULT_PATH,
        kernels: KernelChoice | None = None,
    ):
        if concurrency < 1 or context < 1:
            raise DsvOptError("concurrency and context must be at least 1")
        if kv not in (FP8_LAYOUT, BF16_LAYOUT):
            raise DsvOptError(f"unknown KV layout {kv!r}; use fp8 or bf16")
        real = comm is not None and comm.real
        self.path = SGLangPath.from_name(sglang)
        # which of SGLang's own kernels run (production/choice.py decides; None: the stand-ins)
        self.kernels = kernels or KernelChoice()
        if self.kernels.any_real and not self.path.fused_mhc_pre:
            raise DsvOptError(f"SGLang's own kernels are wired for the Hopper path, not {self.path.label}")
        self.deploy = dep = Layout.from_name(layout or self.path.layout).deploy(cfg, comm.ranks if real else None)
        self.tensor_parallel = tp = dep.tensor_parallel
        if not tp:
            cfg = cfg.with_expert_parallel(dep.ranks)
        self.comm = comm or ModelledRanks(dep.ranks)
        self.cfg = cfg = cfg.with_layers(layers)
        self.concurrency = C = concurrency
        self.context = context
        self.device = torch.device(device)
        self.dtype = dtype
        self.kv_layout = kv
        self.seed = seed
        self.experts_resident = R = experts_resident or dep.experts
        if tp and R != dep.experts:
            raise DsvOptError(f"under the {dep.layout} layout every rank holds all {dep.experts} experts (sliced); "
                              "leave --experts-resident out")
        if not 1 <= R <= cfg.experts:
            raise DsvOptError(f"--experts-resident must be within 1..{cfg.experts}")
        if real and R != dep.experts:
            raise DsvOptError(f"with {self.comm.ranks} ranks each holds {dep.experts} experts; "
                              "leave --experts-resident out")
        self.impls = with_overrides(self.path.implementations(self.kernels), impls or {})
        # Under DP attention every rank draws the requests of all ranks and keeps its own (rank-major);
        # under tensor parallelism every rank holds them all. The slice of heads, groups, expert and
        # shared-expert widths a rank holds is its rank's (0 when one process plays the rank).
        self._drawn, self._first = (C * self.comm.ranks, C * self.comm.rank) if real and not tp else (C, 0)
        self.shard = self.comm.rank
        first_expert = R * self.comm.rank if real and not tp else 0
        self.resident_experts = range(first_expert, first_expert + R)

        host = torch.Generator().manual_seed(seed)
        lo, hi = max(1, round(0.75 * context)), max(1, round(1.25 * context))
        drawn = torch.randint(lo, hi + 1, (self._drawn,), generator=host)  # tokens already seen
        self.contexts = self._mine(drawn)
        self.max_context = int(drawn.max()) + max_new_tokens  # every rank's caches have the same geometry
        if graph_context is not None and graph_context < self.max_context:
            raise DsvOptError(f"--graph-context {graph_context} is shorter than the longest request can grow "
                              f"({self.max_context} tokens at --context {context}); raise it or lower --context")
        self.graph_context = graph_context  # None: index rows as wide as the drawn contexts need
        self.pos = self.contexts.to(self.device, copy=True)  # position of the token each request decodes next
        self.rows = torch.arange(C, device=self.device)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._rope_tables()

        self.embed = self._randn(cfg.vocab, cfg.hidden, scale=1.0)
        self.layers = []
        for i in range(cfg.layers):
            self.layers.append(self._build_layer(i))
            if on_layer:
                on_layer(i)
        self.hc_head_fn = self._randn(cfg.hc, cfg.hc * cfg.hidden, dtype=torch.float32)
        self.hc_head_scale = torch.ones(1, device=self.device)
        self.hc_head_base = torch.zeros(cfg.hc, device=self.device)
        self.final_norm = self._norm_weight(cfg.hidden)
        self.lm_head = self._randn(cfg.vocab, cfg.hidden)  # bf16 in production as well
        # dp-ep: global expert -> local weight set, by the rank whose token a gathered row is; -1 (an
        # expert elsewhere) the slot kernels run on local expert 0 and zero. Real ranks: SGLang's
        # local_expert_mapping for every row. One process alone: its own rows route to resident set
        # e mod R, the rows standing for other ranks' tokens to -1. Tensor parallelism has no map
        # (SGLang builds one only with EP): every expert is local.
        E, EP = cfg.experts, dep.ranks
        owner = torch.full((EP, E), -1, dtype=torch.int32, device=self.device)
        if real:
            owner[:, first_expert : first_expert + R] = torch.arange(R, device=self.device, dtype=torch.int32)
        else:
            owner[0] = torch.arange(E, device=self.device, dtype=torch.int32) % R
        self.local_expert = owner
        self.row_rank = torch.arange(EP * C, device=self.device) // C
        self.last_hidden: torch.Tensor | None = None
        # Set by correctness gates: each block also runs with these slot implementations, on the
        # same input, and the pair of outputs is passed to `on_block` (see _run_block).
        self.compare_impls: dict[str, Callable] | None = None
        self.on_block: Callable[[str, int, torch.Tensor, torch.Tensor], None] | None = None

    # ---- construction -------------------------------------------------------------------------

    def _randn(self, *shape: int, dtype: torch.dtype | None = None, scale: float | None = None) -> torch.Tensor:
        """Seeded normal weights; scale defaults to fan_in^-1/2 so activations stay O(1)."""
        t = torch.randn(*shape, generator=self._gen, device=self.device, dtype=dtype or self.dtype)
        return t.mul_(shape[-1] ** -0.5 if scale is None else scale)

    def _norm_weight(self, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return 1.0 + self._randn(n, dtype=dtype or self.dtype, scale=0.1)

    def _padded_sink(self, sink: torch.Tensor) -> torch.Tensor:
        """The per-head sink as the sparse decode kernel gets it: this rank's heads, then zeros for
        the padded heads (deepseek_v4.py:915-926 builds it once, so no launch per step)."""
        mine = self._sliced(sink, 0)
        return torch.cat([mine, mine.new_zeros(self.deploy.padded_heads - mine.shape[0])])

    def _fp8(self, out_features: int, in_features: int) -> Fp8Linear:
        return self._linear(self._randn(out_features, in_features))

    def _linear(self, weight: torch.Tensor) -> Fp8Linear:
        """A block-FP8 linear of this path: SGLang 0.5.14's sm_120 Triton GEMM, or 0.5.23's DeepGEMM
        on Hopper (DeepGEMM's fp8_gemm_nt itself where it runs here, else a stand-in that fills the SMs)."""
        gemm = None
        if self.kernels.deep_gemm:
            from dsv4opt.workload.production import deepgemm

            gemm = deepgemm.fp8_linear
        return Fp8Linear(weight, self.cfg.fp8_block, fill_sms=self.path.fp8_gemm_fills_sms, gemm=gemm)

    def _mine(self, drawn: torch.Tensor, rows_per_request: int = 1) -> torch.Tensor:
        """This rank's rows of a tensor drawn for every rank's requests."""
        if not self.comm.real:
            return drawn
        return drawn[self._first * rows_per_request : (self._first + self.concurrency) * rows_per_request].clone()

    def _filled(self, cache, pages_per_request: int):
        """A cache filled at random for every rank's requests, cut to this rank's pages."""
        cache.fill_random(self._gen)
        if not self.comm.real:
            return cache
        return cache.pages(self._first * pages_per_request, self.concurrency * pages_per_request)

    def _shared_expert(self) -> tuple[Fp8Linear, Fp8Linear]:
        """This rank's shard of the tensor-parallel shared expert (gate and up rows, down columns),
        cut from the whole expert, which every rank draws."""
        cfg = self.cfg
        width, shard = cfg.expert_width * cfg.shared_experts, self.deploy.shared_width
        w13, w2 = self._randn(2 * width, cfg.hidden), self._randn(cfg.hidden, width)
        cols = slice(self.shard * shard, (self.shard + 1) * shard)
        gate_up = torch.cat([w13[:width][cols], w13[width:][cols]])
        return self._linear(gate_up), self._linear(w2[:, cols].contiguous())

    def _experts(self, layer: int, name: str, out_features: int, in_features: int) -> Mxfp4Experts:
        """The resident experts' weight sets, each from a generator seeded by (seed, layer, name, expert);
        under tensor parallelism each drawn whole and cut to this rank's slice of the intermediate
        width (w13: its gate rows and its up rows; w2: its columns)."""
        seeds = [derived_seed(self.seed, layer, name, e) for e in self.resident_experts]
        if not self.tensor_parallel:
            return Mxfp4Experts.drawn(seeds, out_features, in_features, self.device)
        width, part = self.cfg.expert_width, self.deploy.expert_width
        mine = slice(self.shard * part, (self.shard + 1) * part)
        if name == "w13":
            rows = [mine, slice(width + mine.start, width + mine.stop)]
            return Mxfp4Experts.drawn(seeds, out_features, in_features, self.device, rows=rows)
        return Mxfp4Experts.drawn(seeds, out_features, in_features, self.device, cols=mine)

    def _sliced(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's 1 / ranks of a weight drawn whole, along `dim` (all of it under DP attention)."""
        if not self.tensor_parallel:
            return t
        n = t.shape[dim] // self.deploy.ranks
        return t.narrow(dim, self.shard * n, n).contiguous()

    def _rope_tables(self) -> None:
        """cos/sin [positions, rope/2] fp32 for every position the run can reach (SGLang's freqs_cis)."""
        cfg = self.cfg
        i = torch.arange(0, cfg.rope_dim, 2, dtype=torch.float64)
        t = torch.arange(self.max_context + 1, dtype=torch.float64)
        angles = (t[:, None] * cfg.rope_theta ** (-i / cfg.rope_dim)[None, :]).float()
        self.cos = angles.cos().to(self.device)
        self.sin = angles.sin().to(self.device)

    def kv_cache_layout(self, page_size: int) -> KVLayout:
        cfg = self.cfg
        return KVLayout(self.kv_layout == FP8_LAYOUT, cfg.head_dim - cfg.rope_dim, cfg.rope_dim, cfg.kv_tile, page_size)

    def _build_layer(self, i: int) -> Layer:
        cfg, dev = self.cfg, self.device
        kind = cfg.layer_kind(i)
        H, D, G, d = cfg.heads, cfg.head_dim, cfg.o_groups, cfg.hidden
        shared_w13, shared_w2 = self._shared_expert()
        w: dict = {
            "attn_norm": self._norm_weight(d),
            "wqkv_a": self._fp8(cfg.q_lora + D, d),  # wq_a and wkv fused (SGLANG_OPT_FUSE_WQA_WKV)
            "q_norm": self._norm_weight(cfg.q_lora),
            # column-parallel: this rank's heads (all of them under DP attention)
            "wq_b": self._linear(self._sliced(self._randn(H * D, cfg.q_lora), 0)),
            "kv_norm": self._norm_weight(D),
            "sink": self._padded_sink(self._randn(H, dtype=torch.float32, scale=1.0)),
            # this rank's output groups: bf16 on sm_120 (FP8_WO_A_GEMM off there), block FP8 on the
            # Hopper path (on by default: srt/environ.py:1871; DeepGEMM's fp8_einsum, one Fp8Linear
            # a group here)
            "wo_a": self._wo_a(self._sliced(self._randn(G, cfg.o_lora, H // G * D), 0)),
            # row-parallel: the columns of this rank's groups; the partial outputs are all-reduced
            "wo_b": self._linear(self._sliced(self._randn(d, G * cfg.o_lora), 1)),
            "ffn_norm": self._norm_weight(d),
            "router": self._randn(cfg.experts, d),
            "router_bias": self._randn(cfg.experts, dtype=torch.float32, scale=0.1),
            "shared_w13": shared_w13,
            "shared_w2": shared_w2,
            "w13": self._experts(i, "w13", 2 * cfg.expert_width, d),
            "w2": self._experts(i, "w2", d, cfg.expert_width),
        }
        if self.kernels.marlin:  # SGLang repacks the MXFP4 experts for Marlin once, at load
            from dsv4opt.workload.production.marlin import MarlinExperts

            for name in ("w13", "w2"):
                w[name].marlin = MarlinExperts.from_mxfp4(w[name].packed, w[name].scales)
        for sub in ("attn", "ffn"):
            w[f"hc_{sub}_fn"] = self._randn(cfg.hc_mix, cfg.hc * d, dtype=torch.float32)
            w[f"hc_{sub}_scale"] = 1.0 + self._randn(3, dtype=torch.float32, scale=0.1)
            w[f"hc_{sub}_base"] = self._randn(cfg.hc_mix, dtype=torch.float32, scale=0.1)
        if i < cfg.hash_layers:
            w["hash_experts"] = torch.rand(cfg.vocab, cfg.experts, generator=self._gen, device=dev).argsort(-1)[
                :, : cfg.experts_per_token
            ].to(torch.int32).contiguous()
        layer = Layer(index=i, kind=kind, slots=0, w=w)
        layer.swa = self._filled(KVCache.allocate(self.kv_cache_layout(cfg.window_page), self._drawn, self.dtype, dev), 1)
        if kind != WINDOW:
            ratio = cfg.ratio(kind)
            overlap = kind == CSA
            layer.slots = math.ceil(self.max_context / ratio)
            page = cfg.extra_page(kind)
            layer.pages = math.ceil(layer.slots / page)
            layer.extra = self._filled(KVCache.allocate(self.kv_cache_layout(page), self._drawn * layer.pages,
                                                        self.dtype, dev), layer.pages)
            self._add_compressor(layer, "comp", D, ratio, overlap)
        if kind == CSA:
            Hi, Di = cfg.index_heads, cfg.index_dim
            w["idx_wq_b"] = self._fp8(Hi * Di, cfg.q_lora)
            w["idx_weights_proj"] = self._randn(Hi, d)  # bf16, unquantised
            self._add_compressor(layer, "idx", Di, cfg.csa_ratio, True)
            layer.index_pages = math.ceil(layer.slots / cfg.index_page)
            layer.index_keys = self._filled(IndexKeyCache.allocate(Di, cfg.index_page, self._drawn * layer.index_pages, dev),
                                            layer.index_pages)
        return layer

    def _add_compressor(self, layer: Layer, prefix: str, hd: int, ratio: int, overlap: bool) -> None:
        """Weights and state ring of a compressor: kv|score projections (doubled with overlap)."""
        coff = 2 if overlap else 1
        win = coff * ratio
        layer.w[f"{prefix}_wkv_gate"] = self._randn(2 * coff * hd, self.cfg.hidden)  # bf16, fp32 output
        layer.w[f"{prefix}_ape"] = self._randn(win, hd, dtype=torch.float32, scale=0.1)
        layer.w[f"{prefix}_norm"] = self._norm_weight(hd, torch.float32)
        state = self._mine(self._randn(self._drawn, win, 2 * coff * hd, dtype=torch.float32, scale=1.0))
        if prefix == "idx":
            layer.index_state = state
        else:
            layer.state = state

    # ---- the decode step ----------------------------------------------------------------------

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [C] int64 -> logits [C, vocab] fp32; every request advances by one token."""
        cfg, C = self.cfg, self.concurrency
        with record_function("embed"):
            flashmla.new_step()  # the Hopper path's FlashMLA scheduler metadata, made anew each forward
            if self.kernels.deep_gemm:
                from dsv4opt.workload.production import deepgemm

                deepgemm.new_step()  # and DeepGEMM's indexer schedule
            x = self.embed[tokens]
            h = x[:, None, :].expand(C, cfg.hc, cfg.hidden).contiguous()
            meta = self._metadata(tokens)
        for layer in self.layers:
            h = self._run_block(self._attention_block, layer, h, meta)
            h = self._run_block(self._ffn_block, layer, h, meta)
        if isinstance(h, Boundary):  # the last block's post: no next pre step to fuse it with
            from dsv4opt.workload.production import mhc_tilelang

            with record_function("mhc_post"):
                h = mhc_tilelang.post(*h)
        with record_function("mhc_head"):
            flat, rsqrt = hc_prenorm(h, cfg.norm_eps)
            mix = F.linear(flat, self.hc_head_fn) * rsqrt[:, None]
            pre = torch.sigmoid(mix * self.hc_head_scale + self.hc_head_base) + cfg.hc_eps
            x = (pre[:, :, None] * flat.view(C, cfg.hc, cfg.hidden)).sum(1).to(self.dtype)
        with record_function("lm_head"):
            logits = F.linear(rms_norm(x, self.final_norm, cfg.norm_eps), self.lm_head).float()
        self.pos.add_(1)
        self.last_hidden = x
        return logits

    def _run_block(self, block, layer: Layer, h: torch.Tensor, meta: dict) -> torch.Tensor:
        """One block; with `compare_impls` set, first run it with those on the same input (no chaos:
        both see identical state), then as configured, so the configured run's cache writes stand."""
        other = None
        if self.compare_impls is not None:
            configured, self.impls = self.impls, with_overrides(self.impls, self.compare_impls)
            try:
                other = self.impls["regions"](block, self.impls)(layer, h, meta)
            finally:
                self.impls = configured
        out = self.impls["regions"](block, self.impls)(layer, h, meta)
        if other is not None and self.on_block is not None:
            self.on_block(block.__name__.strip("_"), layer.index, _settled(out), _settled(other))
        return out

    def _metadata(self, tokens: torch.Tensor) -> dict:
        """Per-step indices every layer shares (SGLang builds them once per forward, before the layers)."""
        cfg, pos, rows = self.cfg, self.pos, self.rows
        W, page = cfg.window, cfg.window_page
        back = pos[:, None] - torch.arange(W, device=self.device)[None, :]  # newest first
        meta = {
            "swa_loc": rows * page + pos % page,
            "swa_indices": torch.where(back >= 0, rows[:, None] * page + back % page, -1).int(),
            "swa_lengths": torch.clamp(pos + 1, max=W).int(),
            # for hash routing, once per step: the MoE's rows (every rank's under DP attention)
            "gathered_tokens": tokens if self.tensor_parallel else self.comm.all_gather(tokens),
        }
        for layer in self.layers:  # one compressed geometry per kind
            if layer.kind == WINDOW or layer.kind in meta:
                continue
            ratio, span = cfg.ratio(layer.kind), layer.pages * cfg.extra_page(layer.kind)
            done = (pos + 1) // ratio  # complete entries, this step's included
            geo = {"base": (rows * span).int(), "done": done.int(), "loc": rows * span + (done - 1).clamp(min=0)}
            if layer.kind == CSA:
                geo["lengths"] = done.clamp(min=1, max=cfg.index_topk).int()
                ispan = layer.index_pages * cfg.index_page
                geo["index_loc"] = rows * ispan + (done - 1).clamp(min=0)
                # SGLang's page table reads req_to_token up to the graph's width: past a request's
                # own pages its entries are 0, so the torch fallback gathers page 0 there.
                j = torch.arange(self._index_pages_width(layer), device=self.device)[None, :]
                geo["page_table"] = torch.where(j < layer.index_pages, rows[:, None] * layer.index_pages + j, 0).int()
            else:
                j = torch.arange(self._hca_width(layer), device=self.device)[None, :]
                geo["indices"] = torch.where(j < done[:, None], geo["base"][:, None] + j, -1).int()
                geo["lengths"] = done.clamp(min=1).int()
            meta[layer.kind] = geo
        return meta

    def _hca_width(self, layer: Layer) -> int:
        """Slots of an HCA layer's compressed index row: the graph's width (SGLang's
        c128_page_indices, metadata_kernel.py:60-86, 125-130), else what the drawn contexts need."""
        entries = -(-self.graph_context // self.cfg.ratio(layer.kind)) if self.graph_context else layer.slots
        return -(-entries // INDEX_ALIGN) * INDEX_ALIGN

    def _index_pages_width(self, layer: Layer) -> int:
        """Pages of a CSA layer's indexer page table: the graph's width in KV pages
        (deepseek_v4_backend.py:1699-1702; dsv4/metadata.py:153-154), else the request's own."""
        if not self.graph_context:
            return layer.index_pages
        return -(-self.graph_context // (self.cfg.index_page * self.cfg.csa_ratio))

    def _pre(self, layer: Layer, sub: str, h: torch.Tensor | Boundary):
        """The hyper-connection pre step and the sublayer's RMSNorm -> (residual, x normed, post, comb).
        On the Hopper path one GEMM (DeepGEMM's tf32 pre-norm GEMM) and one kernel for the rest, the
        norm included (TileLang's mhc_pre_big_fuse_with_norm), as SGLang 0.5.23 runs it; with
        TileLang's own kernels `h` may be the previous block's Boundary, whose post runs here, fused."""
        if self.kernels.mhc:
            return self._pre_tilelang(layer, sub, h)
        return (h, *self._pre_standing_in(layer, sub, h))

    def _pre_tilelang(self, layer: Layer, sub: str, h: torch.Tensor | Boundary):
        """SGLang's mhc_fused_post_pre at a boundary, and at the step's first read DeepGEMM's tf32 GEMM
        then TileLang's big fuse (kernels/ops/layernorm/mhc.py:1128-1136, 1608-1830)."""
        from dsv4opt.workload.production import deepgemm, mhc_tilelang

        w = layer.w
        fn, scale, base, norm = w[f"hc_{sub}_fn"], w[f"hc_{sub}_scale"], w[f"hc_{sub}_base"], w[f"{sub}_norm"]
        with record_function("mhc_pre"):
            if isinstance(h, Boundary):
                return mhc_tilelang.fused_post_pre(*h, fn, scale, base, norm, deepgemm.hc_prenorm_gemm)
            T = h.shape[0]
            splits = mhc_tilelang.prenorm_splits(T, h[0].numel(), tritonlib.sm_count(h.device))
            mix, sq = deepgemm.hc_prenorm_gemm(h.view(T, -1), fn, splits)
            return (h, *mhc_tilelang.big_fuse(mix, sq, h, scale, base, norm))

    def _pre_standing_in(self, layer: Layer, sub: str, h: torch.Tensor):
        """The pre step with our kernels -> (x normed, post, comb)."""
        cfg, w = self.cfg, layer.w
        if self.path.fused_mhc_pre:
            with record_function("mhc_pre"):
                mix, squares = hc_pre_gemm(h, w[f"hc_{sub}_fn"])
                return hc_pre_big_fuse(mix, squares, h, w[f"hc_{sub}_scale"], w[f"hc_{sub}_base"], w[f"{sub}_norm"],
                                       cfg.hc, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps, self.dtype)
        x, post, comb = self._hc_pre(layer, sub, h)
        # the part names written out: a compiled block finds a call's part from the lines it sits in
        if sub == "attn":
            with record_function("attn_norm"):
                return rms_norm(x, w["attn_norm"], cfg.norm_eps), post, comb
        with record_function("ffn_norm"):
            return rms_norm(x, w["ffn_norm"], cfg.norm_eps), post, comb

    def _hc_pre(self, layer: Layer, sub: str, h: torch.Tensor):
        """The hyper-connection pre-mix (SGLang's hc_pre with TILELANG_MHC_PRE off, deepseek_v4.py:1234-1332)."""
        cfg, w = self.cfg, layer.w
        with record_function("mhc_pre"):
            flat, rsqrt = hc_prenorm(h, cfg.norm_eps)
            mix = self.impls["hc_premix"](flat, w[f"hc_{sub}_fn"])
            return self.impls["hc_split_sum"](mix, rsqrt, flat, w[f"hc_{sub}_scale"], w[f"hc_{sub}_base"], cfg.hc,
                                              cfg.hc_sinkhorn_iters, cfg.hc_eps, self.dtype)

    def _attention_block(self, layer: Layer, h: torch.Tensor, meta: dict) -> torch.Tensor:
        cfg, w, C, pos = self.cfg, layer.w, self.concurrency, self.pos
        H, D, R = cfg.heads, cfg.head_dim, cfg.rope_dim
        h, x, post, comb = self._pre(layer, "attn", h)
        with record_function("qkv"):
            qkv_a = w["wqkv_a"](x)
            q_lora = rms_norm(qkv_a[:, : cfg.q_lora], w["q_norm"], cfg.norm_eps)
            q = self._query(w["wq_b"](q_lora), pos)
            kv_norm_rope_store(qkv_a[:, cfg.q_lora :], w["kv_norm"], cfg.norm_eps, self.cos, self.sin, pos,
                               layer.swa, meta["swa_loc"])
        extra, extra_indices, extra_lengths = None, None, None
        if layer.kind == CSA:
            geo = meta[CSA]
            with record_function("indexer"):
                Hi, Di = cfg.index_heads, cfg.index_dim
                weights = F.linear(x, w["idx_weights_proj"])
                q8, head_w = index_q_rope_hadamard_quant(w["idx_wq_b"](q_lora), weights, Di**-0.5 * Hi**-0.5,
                                                         self.cos, self.sin, pos, Hi, R)
                self._compress(layer, x, "idx", geo["index_loc"])
                extra_indices = self.impls["indexer_topk"](q8, head_w, layer.index_keys, geo["done"], geo["page_table"],
                                                           geo["base"], cfg.index_topk, self.impls["indexer_logits"])
                extra_lengths = geo["lengths"]
        elif layer.kind == HCA:
            extra_indices, extra_lengths = meta[HCA]["indices"], meta[HCA]["lengths"]
        if layer.kind != WINDOW:
            extra = layer.extra
            self._compress(layer, x, "comp", meta[layer.kind]["loc"])
        with record_function("attn"):
            o, _ = self.impls["attention"](q, layer.swa, meta["swa_indices"], meta["swa_lengths"], extra,
                                           extra_indices, extra_lengths, w["sink"], D**-0.5)
            o = o[:, : self.deploy.heads]  # this rank's heads (a view; the padded ones are dropped)
            rope_inplace(o, self.cos, self.sin, pos, R, inverse=True)
        with record_function("o_proj"):
            if self.path.fp8_wo_a:
                low = self._wo_a_fp8(o.reshape(C, -1), w["wo_a"])
            else:
                low = torch.einsum("tgd,grd->tgr", o.view(C, self.deploy.groups, -1), w["wo_a"]).flatten(1)
            y = w["wo_b"](low)
            if self.tensor_parallel:
                y = self.comm.all_reduce(y)  # row-parallel wo_b (reduce_results=attn_tp_size > 1)
        if self.kernels.mhc:
            return Boundary(y, h, post, comb)  # its post runs fused in the next block's pre step
        with record_function("mhc_post"):
            return hc_post(y, h, post, comb)

    def _wo_a(self, weight: torch.Tensor):
        """wo_a [G, o_lora, heads/G * D] as the path keeps it: bf16, or one block-FP8 linear a group."""
        if not self.path.fp8_wo_a:
            return weight
        return [self._linear(w) for w in weight]

    def _wo_a_fp8(self, o: torch.Tensor, groups: list[Fp8Linear]) -> torch.Tensor:
        """o [C, G * K] -> [C, G * o_lora]: the activations quantised once per token group of 128
        (sglang_per_token_group_quant_fp8_dsv4_wo_a), then each output group's block-FP8 GEMM over
        its K columns, standing in for DeepGEMM's one fp8_einsum "bhr,hdr->bhd" (deepseek_v4.py:705-722)."""
        block = self.cfg.fp8_block
        q, s = group_quant_fp8(o, block)
        K = q.shape[1] // len(groups)
        outs = [block_fp8_matmul(q[:, g * K : (g + 1) * K], s[:, g * K // block : (g + 1) * K // block], lin.w8,
                                 lin.w_scale, block, o.dtype, lin.fill_sms) for g, lin in enumerate(groups)]
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]

    def _query(self, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """q [C, heads * D] -> per-head norm + rope, [C, padded heads, D]: under tensor parallelism
        written into the first heads of an uninitialised buffer of the model's head count, as SGLang
        pads it for the sparse decode kernel (deepseek_v4.py:909-926, q_padded = x.new_empty)."""
        cfg, C, dep = self.cfg, self.concurrency, self.deploy
        q = q.view(C, dep.heads, cfg.head_dim)
        if dep.padded_heads == dep.heads:
            return q_norm_rope(q, cfg.norm_eps, self.cos, self.sin, pos, cfg.rope_dim, cfg.kv_tile)
        padded = q.new_empty(C, dep.padded_heads, cfg.head_dim)
        q_norm_rope(q, cfg.norm_eps, self.cos, self.sin, pos, cfg.rope_dim, cfg.kv_tile, out=padded[:, : dep.heads])
        return padded

    def _compress(self, layer: Layer, x: torch.Tensor, prefix: str, loc: torch.Tensor) -> None:
        """One compressor: kv/score projection (fp32 out), state update and pooling, norm+rope+store."""
        cfg, w = self.cfg, layer.w
        index = prefix == "idx"
        ratio = cfg.csa_ratio if index else cfg.ratio(layer.kind)
        with record_function("compress"):
            kv_score = mm_out_fp32(x, w[f"{prefix}_wkv_gate"])
            state = layer.index_state if index else layer.state
            entry = compress_forward(state, kv_score, w[f"{prefix}_ape"], self.pos, ratio, overlap=index or layer.kind == CSA)
            compress_norm_rope_store(entry, w[f"{prefix}_norm"], cfg.norm_eps, self.cos, self.sin, self.pos, loc, ratio,
                                     cfg.rope_dim, self.dtype, layer.index_keys if index else layer.extra)

    def _ffn_block(self, layer: Layer, h: torch.Tensor, meta: dict) -> torch.Tensor:
        cfg, w = self.cfg, layer.w
        h, x, post, comb = self._pre(layer, "ffn", h)
        with record_function("moe"):
            y = self._moe(layer, x, meta["gathered_tokens"])
        if self.kernels.mhc:
            return Boundary(y, h, post, comb)  # its post runs fused in the next block's pre step
        with record_function("mhc_post"):
            return hc_post(y, h, post, comb)

    def _moe(self, layer: Layer, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """SGLang's DeepseekV2MoE on sm_120 (deepseek_v2.py:875-958): under tensor parallelism on the
        rank's own tokens, every expert local, then the all-reduce; under DP attention with EP on
        every rank's gathered tokens through the local-expert map, then the reduce-scatter."""
        cfg, w = self.cfg, layer.w
        xg = x if self.tensor_parallel else self.comm.all_gather(x)  # dispatch (alone: copies of this rank's)
        shared = w["shared_w2"](silu_mul_clamp(w["shared_w13"](xg), cfg.swiglu_limit))
        logits = mm_out_fp32(xg, w["router"])
        table = w.get("hash_experts")
        ids, gates = moe_gate(logits, w["router_bias"], cfg.experts_per_token, tokens if table is not None else None, table)
        local = ids if self.tensor_parallel else self.impls["moe_local"](ids, self.local_expert, self.row_rank)
        routed = self.impls["routed_experts"](xg, local, gates, w["w13"], w["w2"], cfg.swiglu_limit, cfg.routed_scale)
        shared.add_(routed, alpha=cfg.routed_scale if self.path.routed_scaled_twice else 1.0)
        if self.tensor_parallel:
            return self.comm.all_reduce(shared)  # the partial sums of every rank's expert slices
        return self.comm.reduce_scatter(shared)  # combine: this rank's rows, summed over the ranks

    # ---- accounting ---------------------------------------------------------------------------

    def state_bytes(self) -> dict[str, int]:
        """Bytes held on the device: weights and caches (what the memory estimate predicts)."""
        def size(v) -> int:
            if isinstance(v, list):  # one linear a group (wo_a in FP8)
                return sum(size(x) for x in v)
            return v.nbytes if isinstance(v, (torch.Tensor, Fp8Linear, Mxfp4Experts)) else 0

        weights = self.embed.nbytes + self.lm_head.nbytes + self.hc_head_fn.nbytes + self.final_norm.nbytes
        weights += sum(size(v) for layer in self.layers for v in layer.w.values())
        caches = 0
        for layer in self.layers:
            for t in (layer.swa, layer.extra, layer.index_keys):
                caches += t.data.nbytes if t is not None else 0
            for t in (layer.state, layer.index_state):
                caches += t.nbytes if t is not None else 0
        return {"weights": weights, "caches": caches}


def _settled(h: torch.Tensor | Boundary) -> torch.Tensor:
    """A block's output as the new residual: a Boundary's post applied (our kernel: for comparisons)."""
    return hc_post(*h) if isinstance(h, Boundary) else h
