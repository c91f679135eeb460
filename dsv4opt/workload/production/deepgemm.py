"""DeepGEMM 2.5.0 (as vllm 0.23.0 bundles it) called the way SGLang 0.5.23 calls it on sm_90.

- Dense block-FP8 linears (`apply_fp8_linear`, srt/layers/quantization/fp8_utils.py:1559-1563 ->
  deep_gemm_wrapper/entrypoint.py:219-243): activations quantised per token in groups of 128 with
  power-of-two fp32 scales, row-major [M, K/128] (act_quant.py), then
  `fp8_gemm_nt((A, As), (B, Bs), C)` with the checkpoint's fp32 block scales [N/128, K/128] and a
  bf16 C. DeepGEMM lays both scale tensors out for TMA itself (the transposes SGLang's sm_90
  step launches).
- Indexer logits (srt/layers/attention/dsv4/indexer.py:1078-1098): q [B, 1, H, 128] e4m3, the
  index-K pages viewed [pages, 64, 1, 132] uint8 (64 keys of 128 e4m3, then their 64 fp32 scales),
  weights [B, H] fp32, the compressed lengths [B] int32, the page table [B, P] int32, the schedule
  `get_paged_mqa_logits_metadata(lengths [B, 1], 64, num_sms)` made once per step
  (attention/dsv4/metadata.py:204-272; SGLang's own JIT schedule kernel computes the same table by
  default), `max_context_len`, clean_logits False: entries at or past a request's length are
  left as they were.
- The mHC pre-norm GEMM (kernels/ops/layernorm/mhc.py:1128-1136, 1749-1756):
  `tf32_hc_prenorm_gemm(x [T, hc*d] bf16, fn [24, hc*d] fp32, out [S, T, 24], sqrsum [S, T], S)`.

SGLang turns DeepGEMM's PDL on (SGLANG_DEEPGEMM_PDL, default true: deep_gemm_wrapper/entrypoint.py:
298-302); `load()` does the same. DeepGEMM JIT-compiles each kernel at its first call with nvcc (or
NVRTC with DG_JIT_USE_NVRTC=1) into DG_JIT_CACHE_DIR, which defaults here to the cache's
deep_gemm_jit/.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from types import ModuleType

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.workload.production.act_quant import group_quant_fp8_ue8m0
from dsv4opt.workload.production.artefacts import DEEPGEMM, cache_dir, find_cuda_home, present

GROUP = 128  # DeepGEMM's sm_90 activation and weight scale granularity
INDEX_PAGE = 64  # entries per index-K page: DeepGEMM's block_kv on sm_90 (32 or 64)
JIT_CACHE_ENV = "DG_JIT_CACHE_DIR"


def load() -> ModuleType:
    """The cached DeepGEMM, imported as `deep_gemm` (no sys.path change), PDL on as SGLang sets it."""
    module = sys.modules.get("deep_gemm")
    if module is not None:
        return module
    cache = cache_dir()
    folder = cache / DEEPGEMM
    if not present(DEEPGEMM, cache):
        raise DsvOptError(f"no DeepGEMM in {folder}; run `dsv4opt build-kernels`")
    os.environ.setdefault(JIT_CACHE_ENV, str(cache / "deep_gemm_jit"))
    home = find_cuda_home()
    if home and os.environ.get("DG_JIT_USE_NVRTC") == "1":
        os.environ["CUDA_HOME"] = nvrtc_cuda_home(home)
    elif home and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = home  # DeepGEMM's _C.init would guess dirname(dirname(which nvcc))
    _preload("libnvrtc.so.13", home)
    spec = importlib.util.spec_from_file_location("deep_gemm", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["deep_gemm"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["deep_gemm"]
        raise
    module.set_pdl(True)
    return module


def nvrtc_cuda_home(home: str, under: str | None = None) -> str:
    """A CUDA folder NVRTC can compile DeepGEMM's kernels against. CUDA 13 keeps CCCL (cuda/std/...)
    in include/cccl/, which nvcc searches by itself; DeepGEMM hands NVRTC only -I$CUDA_HOME/include
    (csrc/jit/compiler.hpp, NVRTCCompiler), so its kernels fail with "cannot open source file
    cuda/std/cstdint" (seen on the H100, CUDA 13.0). Where include/cccl exists: a folder beside the
    toolkit's whose include/ links both, made once (`under`: where, default the temporary folder);
    elsewhere the toolkit's own."""
    cccl = Path(home, "include", "cccl")
    if not cccl.is_dir():
        return home
    merged = Path(under or tempfile.gettempdir(), f"dsv4opt-cuda-{zlib.crc32(home.encode()):08x}")
    if (merged / "include" / "cuda.h").exists():
        return str(merged)
    staging = Path(tempfile.mkdtemp(dir=merged.parent, prefix=merged.name + "."))
    _link_union(staging / "include", [Path(home, "include"), cccl], skip={"cccl"})
    for name in ("bin", "lib64", "nvvm"):
        if Path(home, name).exists():
            (staging / name).symlink_to(Path(home, name))
    try:
        staging.rename(merged)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    return str(merged)


def _link_union(dest: Path, sources: list[Path], skip: set[str] = frozenset()) -> None:
    """`dest` holding a link to every entry of `sources`; a folder found in several is made and merged."""
    dest.mkdir(parents=True)
    names: dict[str, list[Path]] = {}
    for src in sources:
        for entry in src.iterdir():
            if entry.name not in skip:
                names.setdefault(entry.name, []).append(entry)
    for name, entries in names.items():
        if len(entries) > 1 and all(e.is_dir() for e in entries):
            _link_union(dest / name, entries)
        else:
            (dest / name).symlink_to(entries[0])


def _preload(soname: str, cuda_home: str | None) -> None:
    """Load `soname` globally if the loader would not find it: DeepGEMM's `_C` needs libnvrtc.so.13,
    which torch's wheel does not always load and which may sit outside the loader's paths (the
    toolkit's lib64, or the nvidia-cuda-nvrtc wheel's nvidia/cu13/lib)."""
    try:
        ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    places = [Path(cuda_home) / sub for sub in ("lib64", "lib", "targets/x86_64-linux/lib")] if cuda_home else []
    for site in map(Path, sys.path):
        places += [site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cuda_nvrtc" / "lib"]
    for place in places:
        if (place / soname).exists():
            ctypes.CDLL(str(place / soname), mode=ctypes.RTLD_GLOBAL)
            return


def fp8_gemm(q: torch.Tensor, q_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """fp8_gemm_nt: q [M, K] e4m3 with scales [M, K/128] fp32, w8 [N, K] e4m3 with block scales
    [N/128, K/128] fp32 -> q @ w^T [M, N] in out_dtype."""
    out = torch.empty(q.shape[0], w8.shape[0], device=q.device, dtype=out_dtype)
    if q.shape[0]:
        load().fp8_gemm_nt((q, q_scale), (w8, w_scale), out)
    return out


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """A dense block-FP8 linear as SGLang runs it on sm_90 (two launches plus DeepGEMM's scale
    layouts): x [M, K] bf16 -> [M, N] bf16. With the workload's Fp8Linear: fp8_linear(x, lin.w8, lin.w_scale)."""
    q, s = group_quant_fp8_ue8m0(x, GROUP)
    return fp8_gemm(q, s, w8, w_scale, x.dtype)


def kv_view(data: torch.Tensor, page_size: int, dim: int) -> torch.Tensor:
    """The index-K pages [pages, page_size * (dim + 4)] uint8 as DeepGEMM reads them (indexer.py:1078-1081)."""
    return data.view(data.shape[0], page_size, 1, dim + 4)


def paged_mqa_schedule(seq_lens: torch.Tensor, page_size: int = INDEX_PAGE) -> torch.Tensor:
    """get_paged_mqa_logits_metadata over the step's compressed lengths [B] int32 (once per step)."""
    dg = load()
    return dg.get_paged_mqa_logits_metadata(seq_lens.to(torch.int32).view(-1, 1).contiguous(), page_size,
                                            dg.get_num_sms())


_STEP_SCHEDULE: dict[tuple[int, int], torch.Tensor] = {}


def new_step() -> None:
    """Forget the step's schedule: the model calls this before each step's layers (under CUDA graphs
    the captured step makes it, and every replay recomputes it in the graph)."""
    _STEP_SCHEDULE.clear()


def step_schedule(seq_lens: torch.Tensor, page_size: int = INDEX_PAGE) -> torch.Tensor:
    """The step's paged-MQA schedule: made by the first CSA layer over the step's lengths, reused by
    the others, as SGLang makes it once a step with the decode metadata (metadata.py:204-272)."""
    key = (seq_lens.data_ptr(), page_size)
    if key not in _STEP_SCHEDULE:
        _STEP_SCHEDULE[key] = paged_mqa_schedule(seq_lens, page_size)
    return _STEP_SCHEDULE[key]


def paged_mqa_logits(q8: torch.Tensor, weights: torch.Tensor, cache, seq_lens: torch.Tensor, page_table: torch.Tensor,
                     max_len: int, schedule: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_paged_mqa_logits on the workload's IndexKeyCache: q8 [B, H, D] e4m3, weights [B, H] fp32,
    seq_lens [B] int32, page_table [B, P] int32 -> logits [B, max_len] fp32 (a view: DeepGEMM pads
    its rows); entries at or past seq_lens[b] are not written."""
    if schedule is None:
        schedule = paged_mqa_schedule(seq_lens, cache.page_size)
    kv = kv_view(cache.data, cache.page_size, cache.dim)
    return load().fp8_paged_mqa_logits(q8.unsqueeze(1).contiguous(), kv, weights.contiguous(),
                                       seq_lens.to(torch.int32).contiguous(), page_table, schedule, max_len, False)


def index_logits(q8, weights, cache, seq_lens, page_table, max_len, schedule=None) -> torch.Tensor:
    """The `indexer_logits` slot's contract (dsv4opt/workload/slots.py): paged_mqa_logits, then -inf
    at s >= seq_lens[b] (one more launch SGLang does not make: its top-k reads the lengths)."""
    logits = paged_mqa_logits(q8, weights, cache, seq_lens, page_table, max_len, schedule)
    s = torch.arange(max_len, device=logits.device)
    return logits.masked_fill(s[None, :] >= seq_lens[:, None], float("-inf"))


def hc_prenorm_gemm(flat: torch.Tensor, fn: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tf32_hc_prenorm_gemm: flat [T, hc*d] bf16, fn [N, hc*d] fp32 -> (partials [S, T, N],
    square sums [S, T]) fp32; summed over S they are flat @ fn^T and sum(flat^2). The contract of
    the workload's hc_pre_gemm (kernels/mhc_fused.py) with h viewed [T, hc*d]."""
    T, N = flat.shape[0], fn.shape[0]
    mix = torch.empty(splits, T, N, device=flat.device, dtype=torch.float32)
    sq = torch.empty(splits, T, device=flat.device, dtype=torch.float32)
    if T:
        load().tf32_hc_prenorm_gemm(flat, fn, mix, sq, num_splits=splits)
    return mix, sq
