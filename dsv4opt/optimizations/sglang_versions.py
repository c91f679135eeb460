"""The SGLang versions dsv4opt knows, as data: per version and GPU family, what SGLang runs where each
optimisation works, the SGLang function a drop-in replaces, the env switches and their defaults, and
what SGLang already does itself. Adding a version is one entry in VERSIONS.

Read from the PyPI wheels (`pip download --no-deps sglang==X`), file:line inside the wheel; 0.5.14 is
sgl-project/sglang@37ef295c7 for the files cited. Nothing here was run against a live server.
`apply --target sglang`, `sglang-switches`, the drop-in launcher and `recommend` all read this table;
tests/sglang/test_sglang_wheels.py holds it against the wheels' own code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version as _dist_version

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.mma_attn import sglang_contract as A

SM120, SM90 = "sm_120", "sm_90"
FAMILIES = {SM120: "sm_120", SM90: "Hopper (sm_90)"}  # sm_120: RTX PRO 6000, RTX 50xx; sm_90: H100, H200
# SGLang's own test for each family, the same function in every version known
# (sglang/srt/utils/common.py: is_sm120_supported and is_sm90_supported, cached, no arguments).
GPU_CHECKS = {SM120: ("sglang.srt.utils.common", "is_sm120_supported"), SM90: ("sglang.srt.utils.common", "is_sm90_supported")}


@dataclass(frozen=True)
class Slot:
    """One SGLang function a drop-in replaces by setting the module attribute its callers look up."""

    module: str
    attribute: str
    replacement: str  # "module:function" of ours, same signature
    parameters: tuple[A.Param, ...]
    reached: str  # when SGLang calls it, in words
    dispatcher: tuple[str, str, tuple[str, ...]] | None = None  # (module, global, values under which the caller reaches it)
    hint: str = ""  # how to make the dispatcher reach it
    fallback: bool = False  # ours hands the calls it does not take to SGLang's own (sglang_entry.set_fallback)


@dataclass(frozen=True)
class Switch:
    """An env switch SGLang reads, with what it is on that GPU family when the user sets nothing."""

    name: str
    default: str
    selects: str
    source: str  # file:line in the wheel


@dataclass(frozen=True)
class EnvSetting:
    """A value to set: SGLang's own choice that applies an optimisation's fix."""

    name: str
    value: str
    selects: str
    caveat: str = ""


@dataclass(frozen=True)
class Part:
    """One optimisation on one SGLang version and GPU family."""

    sglang_runs: str  # what SGLang runs there by default: module.function and the kernel
    slots: tuple[Slot, ...] = ()  # the functions dsv4opt's drop-in replaces; () none
    env: tuple[EnvSetting, ...] = ()  # values that switch SGLang to its own fix; () none that works
    upstream: str = ""  # non-empty: SGLang already does what the optimisation does here; nothing is proposed
    record_applies: bool = False  # the speed-up on record (measured.json) was timed against what runs here
    note: str = ""
    # An embedded profile whose `real_part` ran SGLang's own kernel (its meta's "kernels") measures the
    # optimisation against that kernel, not against a stand-in: `upstream` no longer rules it out, and
    # `over_real` says what was measured against the real kernel.
    real_part: str = ""
    over_real: str = ""


@dataclass(frozen=True)
class SGLangVersion:
    version: str
    source: str
    torch: str  # the torch the release pins
    switches: dict[str, tuple[Switch, ...]]  # family -> the switches that matter on it
    parts: dict[tuple[str, str], Part]  # (optimisation, family)
    force_sm120_path: bool = False  # dsv4opt's --force-sm120-path works here (sglang/sm120_path.py)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def part(self, optimisation: str, family: str) -> Part | None:
        return self.parts.get((optimisation, family))

    def optimisations(self) -> list[str]:
        return list(dict.fromkeys(name for name, _ in self.parts))


_TRITON_HINT_14 = "unset SGLANG_SM120_TRITON_FLASHMLA (1, the default, selects the Triton path)"
_TRITON_14 = Slot(
    module=A.ENTRY_MODULE, attribute=A.ENTRY_NAME,
    replacement="dsv4opt.optimizations.mma_attn.sglang_entry:flash_mla_sparse_decode_triton",
    parameters=A.ENTRY_PARAMETERS,
    reached="decode on sm_120, through flash_mla_sm120.flash_mla_with_kvcache_sm120 (flash_mla_sm120.py:203-238)",
    dispatcher=(A.DISPATCH_MODULE, A.DISPATCH_BACKEND[0], (A.DISPATCH_BACKEND[1],)),
    hint=_TRITON_HINT_14,
)
_BACKEND_HINT_23 = ("unset SGLANG_SM120_FLASHMLA_BACKEND (flashinfer, the default) or set it to triton; "
                    "torch selects SGLang's eager path, which no drop-in replaces")
_FLASHINFER_23 = Slot(
    module=A.SM120_MODULE_023, attribute=A.FLASHINFER_NAME,
    replacement="dsv4opt.optimizations.mma_attn.sglang_entry:flash_mla_flashinfer",
    parameters=A.FLASHINFER_PARAMETERS,
    reached="decode of 64 tokens or fewer on sm_120 with SGLANG_SM120_FLASHMLA_BACKEND=flashinfer, the default "
            "(flash_mla_sm120.py:316-341); larger batches go to FlashInfer's prefill kernel",
    dispatcher=(A.SM120_MODULE_023, "_sm120_default_backend", ("flashinfer", "triton")),
    hint=_BACKEND_HINT_23,
)
_TRITON_23 = Slot(
    module=A.TRITON_MODULE_023, attribute=A.ENTRY_NAME,
    replacement="dsv4opt.optimizations.mma_attn.sglang_entry:flash_mla_sparse_decode_triton",
    parameters=A.ENTRY_PARAMETERS,
    reached="every sm_120 attention call with SGLANG_SM120_FLASHMLA_BACKEND=triton (flash_mla_sm120.py:343-360)",
    dispatcher=(A.SM120_MODULE_023, "_sm120_default_backend", ("flashinfer", "triton")),
    hint=_BACKEND_HINT_23,
)
_FLASHMLA_23 = Slot(
    module=A.FLASHMLA_MODULE_023, attribute=A.FLASHMLA_NAME,
    replacement="dsv4opt.optimizations.mma_attn.sglang_entry:flash_mla_with_kvcache",
    parameters=A.FLASHMLA_PARAMETERS,
    reached="every decode layer off sm_120: the DeepSeek-V4 backend binds it in its __init__ "
            "(deepseek_v4_backend.py:1262-1272) and calls it at :4384-4399",
    fallback=True,
)

_NO_TC_14 = ("SGLANG_SM120_TRITON_FLASHMLA picks the Triton kernel (1, the default) or the torch path (0): "
             "neither uses tensor cores")
_FORCED_14 = "server_args.py:3787-3799 sets it on sm_120 whatever the environment holds"

V0_5_14 = SGLangVersion(
    version=A.SGLANG_VERSION,
    source=f"PyPI sglang {A.SGLANG_VERSION} (= sgl-project/sglang@{A.SGLANG_COMMIT[:9]} for the files cited)",
    torch="2.11.0",
    switches={
        SM120: (
            Switch("SGLANG_SM120_TRITON_FLASHMLA", "1", "sparse-MLA decode: 1 the CUDA-core Triton kernel, 0 the torch path",
                   "srt/layers/attention/flash_mla_sm120.py:198-200"),
            Switch("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "True (forced on sm_120)", "the indexer's float32 torch.bmm path",
                   "srt/environ.py:794; srt/server_args.py:3799"),
            Switch("SGLANG_OPT_USE_TILELANG_INDEXER", "False", "TileLang's FP8 indexer kernel", "srt/environ.py:787"),
            Switch("SGLANG_OPT_USE_TILELANG_MHC_PRE", "False (forced on sm_120)", "TileLang's mHC pre-mix",
                   "srt/environ.py:782; srt/server_args.py:3797"),
            Switch("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "False (forced on sm_120)", "DeepGEMM's mHC pre-norm GEMM",
                   "srt/environ.py:781; srt/server_args.py:3798"),
            Switch("SGLANG_OPT_FUSE_MHC_POST_PRE", "False", "the fused mHC post+pre boundary", "srt/environ.py:786"),
        ),
        SM90: (
            Switch("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "False", "the indexer's torch path (else DeepGEMM's)",
                   "srt/environ.py:794; srt/layers/attention/dsv4/indexer.py:514-529"),
            Switch("SGLANG_OPT_USE_TILELANG_MHC_PRE", "True", "TileLang's mHC pre-mix", "srt/environ.py:782"),
            Switch("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "True", "DeepGEMM's mHC pre-norm GEMM", "srt/environ.py:781"),
        ),
    },
    parts={
        ("mma-attn", SM120): Part(
            sglang_runs="flash_mla_sm120_triton.flash_mla_sparse_decode_triton: the CUDA-core Triton kernel once per "
                        "cache (one program per request and head), then an eager merge and sink",
            slots=(_TRITON_14,), record_applies=True, note=_NO_TC_14,
        ),
        ("mma-attn", SM90): Part(
            sglang_runs="sgl_kernel.flash_mla.flash_mla_with_kvcache: FlashMLA's sparse FP8 decode "
                        "(deepseek_v4_backend.py:1434-1450)",
            note="no Hopper slot is written for 0.5.14: --force-sm120-path sends decode through the sm_120 path, "
                 "whose Triton entry the drop-in replaces",
        ),
        ("bf16-gemm", SM120): Part(
            sglang_runs="indexer: fp8_paged_mqa_logits_torch_sm120, fp32 gather and torch.bmm (dsv4/indexer.py:155-215); "
                        "mHC pre-mix: hc_pre_torch_impl, fp32 F.linear per sublayer (models/deepseek_v4.py:1292-1298)",
            record_applies=True,
            note=f"no switch applies it: {_FORCED_14} (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=True, "
                 "SGLANG_OPT_USE_TILELANG_MHC_PRE=False, SGLANG_OPT_DEEPGEMM_HC_PRENORM=False)",
        ),
        ("bf16-gemm", SM90): Part(
            sglang_runs="DeepGEMM's fp8_paged_mqa_logits (dsv4/indexer.py:529) and TileLang / DeepGEMM for the mHC pre-mix",
            upstream="the indexer runs DeepGEMM's FP8 kernel and the mHC pre-mix TileLang's and DeepGEMM's "
                     "(srt/environ.py:781-787 defaults); the float32 fallbacks bf16-gemm replaces are sm_120's",
        ),
        ("grouped-moe", SM120): Part(
            sglang_runs="Marlin's W4A16 MoE: moe_runner_backend marlin on sm_120 (server_args.py:3788-3792), "
                        "Mxfp4MarlinMoEMethod (layers/quantization/fp8.py:284-289)",
            upstream="the PyPI wheel runs Marlin's grouped W4A16 MoE on sm_120 (server_args.py:3788-3792); the "
                     "per-slot fallback grouped-moe replaces is a fork's path, not in the wheel",
        ),
        ("grouped-moe", SM90): Part(
            sglang_runs="SGLang's MoE runner for the checkpoint (auto)",
            upstream="the per-slot MXFP4 fallback grouped-moe replaces runs on sm_120 only (and only in forks)",
        ),
    },
    force_sm120_path=True,
)

_MHC_23 = ("the mHC post+pre boundary is one fused TileLang kernel (SGLANG_OPT_FUSE_MHC_POST_PRE on, "
           "srt/arg_groups/model_hook.py:491-492; its pre-mix math is still fp32, no longer an F.linear)")
V0_5_23 = SGLangVersion(
    version=A.SGLANG_023,
    source="PyPI sglang 0.5.23 (sglang-0.5.23 wheel)",
    torch="2.14.1",
    switches={
        SM120: (
            Switch("SGLANG_SM120_FLASHMLA_BACKEND", "flashinfer",
                   "sparse-MLA decode: flashinfer (FlashInfer's tensor-core split-K kernel), triton (the CUDA-core "
                   "Triton kernel) or torch; read once, at import", "srt/environ.py:1272; kernels/ops/attention/flash_mla_sm120.py:209"),
            Switch("SGLANG_OPT_SM120_DIRECT_SWA_KV", "False", "the window KV stored in FlashInfer's 64-token pages",
                   "srt/environ.py:1275"),
            Switch("SGLANG_OPT_USE_TILELANG_INDEXER", "True (set on sm_120 unless set)", "TileLang's FP8 indexer kernel",
                   "srt/environ.py:1824; srt/arg_groups/model_hook.py:501-502"),
            Switch("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "True (set on sm_120 unless set)",
                   "the torch indexer (bf16) when TileLang's is off", "srt/environ.py:1837; srt/arg_groups/model_hook.py:499-500"),
            Switch("SGLANG_OPT_FUSE_MHC_POST_PRE", "True (set on sm_120 unless set)", "the fused TileLang mHC post+pre boundary",
                   "srt/environ.py:1823; srt/arg_groups/model_hook.py:491-492"),
            Switch("SGLANG_OPT_USE_TILELANG_MHC_PRE", "False (set on sm_120 unless set)", "TileLang's mhc_pre for the unfused read",
                   "srt/environ.py:1820; srt/arg_groups/model_hook.py:489-490"),
            Switch("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "False (set on sm_120 unless set)", "DeepGEMM's mHC pre-norm GEMM",
                   "srt/environ.py:1819; srt/arg_groups/model_hook.py:493-494"),
        ),
        SM90: (
            Switch("SGLANG_OPT_USE_TILELANG_INDEXER", "False", "TileLang's FP8 indexer kernel (else DeepGEMM's)", "srt/environ.py:1824"),
            Switch("SGLANG_OPT_FUSE_MHC_POST_PRE", "True", "the fused TileLang mHC post+pre boundary", "srt/environ.py:1823"),
            Switch("SGLANG_OPT_USE_TILELANG_MHC_PRE", "True", "TileLang's mhc_pre", "srt/environ.py:1820"),
            Switch("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "True", "DeepGEMM's mHC pre-norm GEMM", "srt/environ.py:1819"),
        ),
    },
    parts={
        ("mma-attn", SM120): Part(
            sglang_runs="flash_mla_sm120._flash_mla_flashinfer: FlashInfer 0.7.2's sm_120 sparse-MLA decode "
                        "(block-scaled MXFP8 tensor cores, split-K, a merge kernel) after a page-split copy "
                        "(flash_mla_sm120.py:583-675); the Triton entry only with SGLANG_SM120_FLASHMLA_BACKEND=triton",
            slots=(_FLASHINFER_23, _TRITON_23),
            note="FlashInfer's kernel builds only for sm_120/121, so mma-attn has not been timed against it",
        ),
        ("mma-attn", SM90): Part(
            sglang_runs="flash_mla_interface.flash_mla_with_kvcache: FlashMLA's sparse FP8 decode from sgl-flash-mla "
                        "1.0.0 (deepseek_v4_backend.py:4362-4399)",
            slots=(_FLASHMLA_23,),
        ),
        ("bf16-gemm", SM120): Part(
            sglang_runs="indexer: tilelang_fp8_paged_mqa_logits (dsv4/indexer.py:862-865); mHC: mhc_fused_post_pre "
                        "(models/deepseek_v4_boundary.py:265-312)",
            upstream="the indexer runs TileLang's FP8 kernel (srt/arg_groups/model_hook.py:501-502) and " + _MHC_23,
        ),
        ("bf16-gemm", SM90): Part(
            sglang_runs="DeepGEMM's fp8_paged_mqa_logits and the fused TileLang mHC boundary",
            upstream="the indexer runs DeepGEMM's FP8 kernel and " + _MHC_23.replace(
                "srt/arg_groups/model_hook.py:491-492", "srt/environ.py:1823"),
        ),
        ("grouped-moe", SM120): Part(
            sglang_runs="FlashInfer's cutlass_fused_moe, MXFP8 activations x MXFP4 weights "
                        "(moe_runner_backend flashinfer_mxfp4: srt/arg_groups/model_overrides/deepseek_v4.py:66-88)",
            upstream="the experts run FlashInfer's CUTLASS MXFP8 x MXFP4 grouped GEMM (flashinfer_mxfp4, "
                     "srt/layers/quantization/fp8.py:459-466)",
        ),
        ("grouped-moe", SM90): Part(
            sglang_runs="FlashInfer's CUTLASS W4A16 mixed-input grouped MoE (flashinfer_mxfp4) by default; Marlin "
                        "W4A16 under the H200 recipe (--moe-runner-backend marlin)",
            upstream="the experts run a grouped W4A16 tensor-core MoE: FlashInfer's CUTLASS (flashinfer_mxfp4) by "
                     "default, Marlin's under the H200 recipe (--moe-runner-backend marlin, fused_marlin_moe.py:140)",
            real_part="moe",
            over_real="measured against Marlin's own moe_wna16_marlin_gemm on an H100 (docs/production-kernels.md, "
                      "commit 1e45400): grouped-moe's whole slot 15.7 / 122.6 / 193.8 / 278.7 µs, Marlin's two GEMMs "
                      "alone 30.4 / 124.9 / 200.8 / 296.5 µs at C = 1 / 16 / 32 / 64",
        ),
    },
    notes=("a live server needs torch 2.14.1, FlashInfer 0.7.2 and sglang-kernel 0.4.10 (METADATA:232-281)",),
)

VERSIONS: dict[str, SGLangVersion] = {v.version: v for v in (V0_5_14, V0_5_23)}
NEWEST = max(VERSIONS, key=lambda v: tuple(int(x) for x in v.split(".")))


def known() -> str:
    return ", ".join(VERSIONS)


def get(version: str) -> SGLangVersion:
    """The table entry of `version`; a one-line refusal naming the versions known otherwise."""
    try:
        return VERSIONS[version]
    except KeyError:
        raise DsvOptError(f"SGLang {version} is not a version dsv4opt knows ({known()})") from None


def installed() -> str | None:
    """The version of the SGLang installed in this Python, None without one."""
    try:
        return _dist_version("sglang")
    except PackageNotFoundError:
        return None


def resolve(explicit: str | None) -> SGLangVersion:
    """The version named, else the installed one; a one-line refusal when neither is known."""
    if explicit:
        return get(explicit)
    found = installed()
    if found is None:
        raise DsvOptError(f"SGLang is not installed here: name the server's version with --sglang-version ({known()})")
    try:
        return get(found)
    except DsvOptError:
        raise DsvOptError(f"SGLang {found} is installed here, not a version dsv4opt knows ({known()}): "
                          "pass --sglang-version for the server's") from None


# GPU names a trace or profile records -> family; None when the name says nothing dsv4opt knows.
_FAMILY_NAMES = ((SM90, r"\b(?:H100|H200|H800|H20|GH200)\b"), (SM120, r"RTX PRO 6000|RTX 50\d0|\bGB10\b|RTX PRO 5000"))


def family_of_device(name: str | None) -> str | None:
    for family, pattern in _FAMILY_NAMES:
        if name and re.search(pattern, name, re.IGNORECASE):
            return family
    return None


def family_of_kernels(names) -> str | None:
    """The family a trace's kernel names say (sm120 / sm90 in FlashInfer's, FlashMLA's, DeepGEMM's and
    cuBLAS's names), None when they say both or neither."""
    said = set()
    for name in names:
        low = name.lower()
        if re.search(r"sm_?12[01]", low):
            said.add(SM120)
        elif re.search(r"sm_?90(?![0-9])", low):
            said.add(SM90)
    return said.pop() if len(said) == 1 else None
