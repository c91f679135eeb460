"""Compile every Triton kernel the decode step launches for a GPU this machine does not have.

    python -m tests.compile.harness --arch 120 [--concurrency 1,32,64] [--json OUT]

A stand-in Triton driver reports the target (`GPUTarget("cuda", arch, 32)`), every launch becomes
Triton's own compile-only warm-up (it binds, specialises and compiles exactly what the code passes,
and launches nothing), and `tritonlib.compile_only_target` gives the code the target's limits
(SM count, shared memory a block, capability) where it would read the device's. The workload is
dsv4-flash at full width, 4 layers (two window-only, one CSA, one HCA), one tp4 rank, FP8 KV,
built with zero weights (drawing them would take minutes) and stepped once per configuration: what
a GPU of that target would launch, kernel for kernel, tiles and constants as the code chooses them.
Outputs of the launches that were not made are zero-filled allocations, so the step goes on.
Each compiled kernel is then read: shared memory (what Triton's launcher checks against the
device), registers and spilled bytes (ptxas -v on its PTX), tensor-core instructions in the PTX.
Runs in its own process with Triton's compiler (TRITON_INTERPRET unset), never the interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass

os.environ["TRITON_INTERPRET"] = "0"  # before Triton defines any kernel
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns without it; 1 is its default

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from dsv4opt import tritonlib  # noqa: E402
from dsv4opt.sass import ptxas_log  # noqa: E402

# Each target's limits from the CUDA C++ Programming Guide's table of compute capabilities (shared
# memory a block may opt in to, per SM, registers, threads an SM); the SM counts are those of the
# GPUs named (RTX PRO 6000 Blackwell: 188; H100 SXM / H200: 132).
TARGETS = {
    120: tritonlib.DeviceLimits("sm_120 (RTX PRO 6000 Blackwell)", (12, 0), 188, 101376, 102400, 65536, 1536),
    90: tritonlib.DeviceLimits("sm_90 (H100 / H200)", (9, 0), 132, 232448, 233472, 65536, 2048),
}
# The configurations stepped: the story's baseline (SGLang 0.5.14's sm_120 path) and the tool's
# optimisations on it: fuse-glue alone (the per-slot MoE's regions), the slot kernels, and all of them.
CONFIGS = {
    "baseline": (),
    "fuse-glue": ("fuse-glue",),  # its regions of the per-slot MoE path
    "optimised": ("mma-attn", "bf16-gemm", "grouped-moe"),
    "optimised+fuse-glue": ("mma-attn", "bf16-gemm", "grouped-moe", "fuse-glue"),
}


@dataclass
class Compiled:
    kernel: str
    configs: list[str]  # where it was launched: "baseline C=1", ...
    shared_bytes: int
    registers: int
    spill_bytes: int
    num_warps: int
    dots: int  # tt.dot in its Triton IR
    mma_sync: int  # tensor-core instructions in its PTX
    wgmma: int


class _TargetDriver(CudaDriver):
    """Triton's CUDA driver answering for a GPU that is not here: compile-only, launches never made."""

    def __init__(self, arch: int):  # no CUDA initialisation
        self.arch = arch

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return divmod(self.arch, 10)


@contextlib.contextmanager
def compile_only(arch: int, seen: dict):
    """Launches compile for `arch` and are recorded in `seen` (Triton's cache key -> (name, kernel, label))."""
    real_run = JITFunction.run
    label = {"now": ""}

    def run(self, *args, grid, warmup, **kwargs):
        compiled = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        key = (self.fn.__qualname__, id(compiled))
        seen.setdefault(key, (self.fn.__name__, compiled, kwargs.get("num_warps") or 4, []))[3].append(label["now"])
        return compiled

    before = triton_driver._active  # None on a machine without a GPU: Triton finds no driver to reset to
    triton_driver.set_active(_TargetDriver(arch))
    JITFunction.run = run
    try:
        with tritonlib.compile_only_target(TARGETS[arch]), _zeroed_allocations():
            yield label
    finally:
        JITFunction.run = real_run
        triton_driver._active = before


@contextlib.contextmanager
def _zeroed_allocations():
    """torch.empty and friends give zeros: what no launch wrote stays a valid index, count or value."""
    patched = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}

    def zeroed(fn):
        return lambda *a, **k: fn(*a, **k).zero_()

    for name, fn in patched.items():
        setattr(torch, name, zeroed(fn))
    real_new_empty = torch.Tensor.new_empty
    torch.Tensor.new_empty = lambda self, *a, **k: real_new_empty(self, *a, **k).zero_()
    try:
        yield
    finally:
        for name, fn in patched.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = real_new_empty


@contextlib.contextmanager
def _zero_weights():
    """The workload built with zero weights and caches (drawing dsv4-flash's takes minutes on a CPU)."""
    from dsv4opt.workload import kvcache, model, weights
    from dsv4opt.workload.kernels.grouped_moe import layout as moe_layout

    saved = (model.DecodeWorkload._randn, weights.Mxfp4Experts.drawn, kvcache.KVCache.fill_random,
             kvcache.IndexKeyCache.fill_random, moe_layout._values)

    def randn(self, *shape, dtype=None, scale=None):
        return torch.zeros(*shape, device=self.device, dtype=dtype or self.dtype)

    def drawn(cls, seeds, out_features, in_features, device, rows=None, cols=None):
        out = sum(r.stop - r.start for r in rows) if rows else out_features
        inp = (cols.stop - cols.start) if cols else in_features
        return cls.of(torch.zeros(len(seeds), out, inp // 2, dtype=torch.uint8, device=device),
                      torch.ones(len(seeds), out, inp // 32, device=device))  # fp32 scales 2^0

    model.DecodeWorkload._randn = randn
    weights.Mxfp4Experts.drawn = classmethod(drawn)
    kvcache.KVCache.fill_random = lambda self, *a, **k: None
    kvcache.IndexKeyCache.fill_random = lambda self, *a, **k: None
    # grouped-moe's production layout of zero weights is zeros (its bit shuffle takes minutes at full width)
    moe_layout._values = lambda packed, n16, k64: torch.zeros(
        packed.shape[0], n16, k64, moe_layout.UNIT_BYTES, dtype=torch.uint8, device=packed.device)
    try:
        yield
    finally:
        (model.DecodeWorkload._randn, weights.Mxfp4Experts.drawn, kvcache.KVCache.fill_random,
         kvcache.IndexKeyCache.fill_random, moe_layout._values) = saved


def step_each(configs: dict, concurrency: int, label: dict, context: int = 8192) -> None:
    """One workload at `concurrency` (built once), stepped once under each configuration's slot
    implementations."""
    from dsv4opt.optimizations.registry import implementations
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload
    from dsv4opt.workload.slots import with_overrides

    with _zero_weights():
        w = DecodeWorkload(ModelConfig.from_name("dsv4-flash"), concurrency, context, layers=4, layout="tp4")
        baseline = dict(w.impls)
        for name, opts in configs.items():
            label["now"] = f"{name} C={concurrency}"
            w.impls = with_overrides(baseline, implementations(opts))
            w.step(torch.zeros(concurrency, dtype=torch.long))


def read(name: str, compiled, warps: int, labels: list[str], arch: int) -> Compiled:
    ptx = compiled.asm["ptx"]
    log = ptxas_log(ptx, arch)
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    return Compiled(
        kernel=name, configs=sorted(set(labels)), shared_bytes=compiled.metadata.shared, registers=regs,
        spill_bytes=spills, num_warps=warps, dots=len(re.findall(r"\btt\.dot\b", compiled.asm["ttir"])),
        mma_sync=len(re.findall(r"\bmma\.sync\b", ptx)), wgmma=len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
    )


def compile_step(arch: int, concurrencies: list[int], configs: dict = CONFIGS) -> list[Compiled]:
    """Every distinct kernel compile the configurations' steps launch, read."""
    seen: dict = {}
    with compile_only(arch, seen) as label:
        for c in concurrencies:
            step_each(configs, c, label)
    return [read(name, compiled, warps, labels, arch) for name, compiled, warps, labels in seen.values()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, choices=sorted(TARGETS), default=120)
    ap.add_argument("--concurrency", default="1,32,64")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="write the table here")
    a = ap.parse_args(argv)
    rows = compile_step(a.arch, [int(c) for c in a.concurrency.split(",")],
                        {k: CONFIGS[k] for k in a.configs.split(",")})
    limit = TARGETS[a.arch].shared_per_block
    for r in sorted(rows, key=lambda r: (r.kernel, r.shared_bytes)):
        flag = "" if r.shared_bytes <= limit else "  OVER"
        print(f"{r.kernel:38s} smem {r.shared_bytes:7d}{flag} regs {r.registers:3d} spill {r.spill_bytes:5d} "
              f"w{r.num_warps} dot {r.dots} mma.sync {r.mma_sync} wgmma {r.wgmma}  [{r.configs[0]}..]")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": a.arch, "limits": asdict(TARGETS[a.arch]), "kernels": [asdict(r) for r in rows]}, f,
                      indent=1)


if __name__ == "__main__":
    sys.exit(main())
