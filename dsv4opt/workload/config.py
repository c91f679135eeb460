"""Named model configs: the only place the workload's shapes come from."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsv4opt.errors import DsvOptError, unknown_name

WINDOW, CSA, HCA = "window", "csa", "hca"


@dataclass(frozen=True)
class ModelConfig:
    """Per-layer shapes of a DeepSeek-V4-Flash-shaped decoder (public config, see docs/workload.md)."""

    name: str
    hidden: int
    layers: int
    heads: int
    head_dim: int  # latent KV width = query head width (nope + rope)
    rope_dim: int
    q_lora: int
    o_groups: int
    o_lora: int
    window: int  # raw tokens every layer attends to
    window_only_layers: int  # the first layers attend only to the window
    csa_ratio: int  # tokens folded into one compressed entry on CSA layers (with indexer)
    hca_ratio: int  # ... on HCA layers (no indexer, all entries attended)
    index_heads: int
    index_dim: int
    index_topk: int
    hc: int  # hyper-connection copies of the residual stream
    hc_sinkhorn_iters: int
    experts: int
    experts_per_token: int
    expert_width: int
    shared_experts: int
    hash_layers: int  # the first layers route by a token-id hash instead of the router
    vocab: int
    expert_parallel: int  # ranks the routed experts are spread over in the modelled deployment
    fp8_block: int  # block-FP8 weights: one scale per fp8_block x fp8_block tile; activations in groups of it
    kv_tile: int  # nope values per UE8M0 scale in the FP8 KV layout
    kv_page: int  # tokens per KV page (window pages hold kv_page tokens, compressed pages kv_page / ratio)
    index_page: int  # entries per page of the indexer's key cache
    max_context: int  # the checkpoint's context length: what SGLang sizes its decode metadata to
    routed_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    hc_eps: float = 1e-6

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        try:
            return CONFIGS[name]
        except KeyError:
            raise unknown_name("model config", name, CONFIGS) from None

    def with_layers(self, layers: int | None) -> "ModelConfig":
        """The first `layers` layers only (None: all)."""
        if layers is None:
            return self
        if not 1 <= layers <= self.layers:
            raise DsvOptError(f"--layers {layers} is out of range for {self.name}; use 1..{self.layers}")
        return replace(self, layers=layers)

    def with_expert_parallel(self, ranks: int) -> "ModelConfig":
        """The deployment spread over `ranks` ranks: each holds experts / ranks routed experts and a
        1 / ranks slice of the shared expert's width (whole FP8 blocks)."""
        if ranks == self.expert_parallel:
            return self
        width = self.expert_width * self.shared_experts
        if ranks < 1 or self.experts % ranks or width % (ranks * self.fp8_block):
            fits = [n for n in (1, 2, 4, 8) if not self.experts % n and not width % (n * self.fp8_block)]
            raise DsvOptError(
                f"{self.name} cannot be spread over {ranks} ranks (its {self.experts} experts and shared-expert "
                f"width {width} must split evenly, in FP8 blocks of {self.fp8_block}); use {', '.join(map(str, fits))}"
            )
        return replace(self, expert_parallel=ranks)

    @property
    def hc_mix(self) -> int:
        """Numbers the hyper-connection pre-mix produces: pre hc, post hc, comb hc x hc (24 for hc=4)."""
        return 2 * self.hc + self.hc * self.hc

    @property
    def shared_width(self) -> int:
        """Shared-expert width one rank computes: the shared expert is tensor-parallel over the ranks."""
        return self.expert_width * self.shared_experts // self.expert_parallel

    @property
    def window_page(self) -> int:
        """Tokens per page of the window cache (SGLang's SWA pages are whole KV pages)."""
        return self.kv_page

    def extra_page(self, kind: str) -> int:
        """Entries per page of a compressed cache."""
        return self.kv_page // self.ratio(kind)

    @property
    def experts_resident_default(self) -> int:
        """Expert weight sets one rank holds in the modelled expert-parallel deployment."""
        return self.experts // self.expert_parallel

    def layer_kind(self, i: int) -> str:
        if i < self.window_only_layers:
            return WINDOW
        return CSA if (i - self.window_only_layers) % 2 == 0 else HCA

    def ratio(self, kind: str) -> int:
        return {CSA: self.csa_ratio, HCA: self.hca_ratio}[kind]


CONFIGS = {
    c.name: c
    for c in (
        ModelConfig(
            name="dsv4-flash", hidden=4096, layers=43, heads=64, head_dim=512, rope_dim=64,
            q_lora=1024, o_groups=8, o_lora=1024, window=128, window_only_layers=2,
            csa_ratio=4, hca_ratio=128, index_heads=64, index_dim=128, index_topk=512,
            hc=4, hc_sinkhorn_iters=20, experts=256, experts_per_token=6, expert_width=2048,
            shared_experts=1, hash_layers=3, vocab=129280, expert_parallel=8,
            fp8_block=128, kv_tile=64, kv_page=256, index_page=64,
            # 1M tokens: SGLang's cookbook ("1M-token context", DeepSeek-V4.mdx:138 at 37ef295c7)
            # and the checkpoint's max_position_embeddings as quoted in
            # ../shared/docs/sglang-dsv4-deployment.md (section 4c); the checkpoint itself not read.
            max_context=1 << 20,
        ),
        # Small enough for CPU tests, yet every code path runs: window-only, CSA with top-k smaller
        # than the compressed entries, HCA, hash routing, resident sets fewer than experts, several
        # KV pages per request, a shared-expert shard one FP8 block wide; four output groups and an
        # expert width of 128 so that the tp4 layout splits them (one group, 32 = one MXFP4 group of
        # width a rank). Its maximum context is scaled down so a CPU run stays short.
        ModelConfig(
            name="dsv4-tiny", hidden=64, layers=6, heads=4, head_dim=32, rope_dim=8,
            q_lora=32, o_groups=4, o_lora=16, window=8, window_only_layers=2,
            csa_ratio=4, hca_ratio=16, index_heads=8, index_dim=16, index_topk=6,
            hc=4, hc_sinkhorn_iters=20, experts=16, experts_per_token=3, expert_width=128,
            shared_experts=1, hash_layers=3, vocab=256, expert_parallel=4,
            fp8_block=16, kv_tile=8, kv_page=16, index_page=4, max_context=1 << 14,
        ),
    )
}
