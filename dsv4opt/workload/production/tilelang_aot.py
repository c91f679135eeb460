"""Lower SGLang 0.5.23's TileLang mHC kernels to sm_90a cubins, ahead of time, without a GPU.

A standalone script for a Python that has `tilelang==0.1.12` (which pins z3-solver < 4.15.5 and so
lives in a venv of its own, apart from dsv4opt's); it imports nothing from dsv4opt:

    TILELANG_PY tilelang_aot.py --mhc-source SGLANG/kernels/ops/layernorm/mhc.py --out DIR

It reads the three kernel builders from SGLang's own file (the wheel's, at build time: no SGLang
source is kept in this repository), writes them into a module in DIR/src so TileLang can read
their source, and elaborates each with DeepSeek-V4-Flash's constants into one cubin per variant
SGLang 0.5.23 picks at decode (`mhc_fused_post_pre`, mhc.py:1608-1830; `mhc_pre`, :1062-1136):

    big_fuse_s{4,8,64}  mhc_pre_big_fuse_with_norm_tilelang (:890-1060) with n_splits 4 (8 to 32
                        tokens), 8 (fewer than 8) or 64 (33 to 64 tokens, and the first read,
                        whose split count is _compute_num_split_for_mhc_pre's, :816-823)
    fma_t{2,3}          mhc_fused_post_pre_fma_tilelang (:1361-1607), tile_n 2 (< 8 tokens) or 3
                        (8 to 32); split_k stays a launch argument (T.dynamic)
    post                mhc_post_tilelang (:1265-1330) as the fused boundary calls it (> 32 tokens:
                        num_h_blocks 1)

TileLang's own lowering and its own nvcc call (tilelang_callback_cuda_compile) produce each cubin;
the launch facts come from the lowered device function's attributes: entry name, parameters in
order, the thread extents as expressions of the dynamic sizes, dynamic shared memory, and whether
the kernel waits on / triggers programmatic dependent launch. DIR/manifest.json lists them.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

# DeepSeek-V4-Flash's mHC constants as SGLang passes them (srt/configs/deepseek_v4.py:84, 134-138;
# srt/models/deepseek_v4_mhc.py:102): hidden 4096, 4 copies, rms/hc eps 1e-6, post x2, 20 iterations.
HIDDEN, HC, EPS, POST_MULT, SINKHORN = 4096, 4, 1e-6, 2.0, 20
MIX = HC * (2 + HC)
KERNELS = ("mhc_pre_big_fuse_with_norm_tilelang", "mhc_post_tilelang", "mhc_fused_post_pre_fma_tilelang")
PROLOGUE = (
    "import math\nimport tilelang\nimport tilelang.language as T\n\n\n"
    "def is_arch_support_pdl():\n    return True  # sm_90a (sglang/kernels/jit/utils/arch.py)\n"
)


def variants() -> dict[str, tuple[str, tuple, dict]]:
    """name -> (builder, tensor placeholders, constants), as SGLang's call sites pass them."""
    out = {}
    for splits in (4, 8, 64):
        out[f"big_fuse_s{splits}"] = ("mhc_pre_big_fuse_with_norm_tilelang", (None,) * 9, dict(
            hidden_size=HIDDEN, rms_eps=EPS, hc_pre_eps=EPS, hc_sinkhorn_eps=EPS, hc_post_mult_value=POST_MULT,
            sinkhorn_repeat=SINKHORN, norm_eps=EPS, n_splits=splits, hc_mult=HC, gemm_last_dim=MIX))
    for tile in (2, 3):
        out[f"fma_t{tile}"] = ("mhc_fused_post_pre_fma_tilelang", (None,) * 8, dict(
            hc=HC, hidden_size=HIDDEN, num_mix_outputs=MIX, tile_mix_outputs=tile))
    out["post"] = ("mhc_post_tilelang", (None,) * 5, dict(hc=HC, hidden=HIDDEN, num_h_blocks=1))
    return out


def extract(source: str) -> tuple[str, dict[str, list[int]]]:
    """The builders (with their decorators) out of mhc.py, behind a prologue; and their line spans."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parts, spans = [PROLOGUE], {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in KERNELS:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            parts.append("\n".join(lines[first - 1 : node.end_lineno]))
            spans[node.name] = [first, node.end_lineno]
    missing = set(KERNELS) - set(spans)
    if missing:
        raise SystemExit(f"{sorted(missing)} not found in the mHC source: is it SGLang 0.5.23's mhc.py?")
    return "\n\n\n".join(parts) + "\n", spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mhc-source", required=True, type=Path, help="sglang/kernels/ops/layernorm/mhc.py")
    ap.add_argument("--out", required=True, type=Path, help="an empty folder for the cubins and manifest.json")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()

    import tilelang
    import tvm_ffi
    from tilelang import tvm

    source = args.mhc_source.read_text()
    module_text, spans = extract(source)
    (args.out / "src").mkdir(parents=True, exist_ok=True)
    module_path = args.out / "src" / "sglang_mhc_kernels.py"
    module_path.write_text(module_text)
    spec = importlib.util.spec_from_file_location("sglang_mhc_kernels", module_path)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)

    compiled: list[bytes] = []
    original = tvm_ffi.get_global_func("tilelang_callback_cuda_compile")

    @tvm_ffi.register_global_func("tilelang_callback_cuda_compile", override=True)
    def _record(code, target, pass_config=None):  # TileLang's nvcc call, its cubin kept
        binary = original(code, target, pass_config)
        compiled.append(bytes(binary))
        return binary

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    entries = {}
    for name, (builder, tensors, constants) in variants().items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        jit = getattr(kernels, builder)
        prim = jit.get_tir(*tensors, **constants)
        compiled.clear()
        with tvm.transform.PassContext(opt_level=3, config=dict(jit.pass_configs or {})), target:
            artifact = tilelang.lower(prim, target=target, enable_host_codegen=True, enable_device_compile=True)
        (device_fn,) = [f for _, f in artifact.device_mod.functions.items()]
        attrs = device_fn.attrs
        extents = {str(k): str(v) for k, v in dict(attrs["thread_extent"]).items()}
        assert len(compiled) == 1, f"{name}: expected one cubin, TileLang compiled {len(compiled)}"
        cubin = f"{name}.cubin"
        (args.out / cubin).write_bytes(compiled[0])
        (args.out / "src" / f"{name}.cu").write_text(artifact.kernel_source)
        entries[name] = {
            "builder": builder,
            "constants": constants,
            "cubin": cubin,
            "entry": str(attrs["global_symbol"]),
            "params": [[str(p.name), str(p.dtype)] for p in device_fn.params],
            "grid": [extents.get(f"blockIdx.{a}", "1") for a in "xyz"],
            "block": [int(extents.get(f"threadIdx.{a}", "1")) for a in "xyz"],
            "dyn_smem": int(attrs.get("dyn_shared_memory_buf", 0)),
            "pdl_sync": str(attrs.get("has_cuda_pdl_sync", "0")) == "1",
            "pdl_trigger": str(attrs.get("has_cuda_pdl_trigger", "0")) == "1",
            "compile_s": round(time.perf_counter() - start, 1),
        }
        print(f"{name}: {entries[name]['entry']} grid {entries[name]['grid']} block {entries[name]['block']} "
              f"smem {entries[name]['dyn_smem']} B, {len(compiled[0])} B cubin, {entries[name]['compile_s']} s",
              flush=True)
    manifest = {
        "sglang_source": {"file": "sglang/kernels/ops/layernorm/mhc.py",
                          "sha256": hashlib.sha256(source.encode()).hexdigest(), "lines": spans},
        "tilelang": tilelang.__version__,
        "target": "sm_90a",
        "python": sys.version.split()[0],
        "variants": entries,
    }
    (args.out / "variants.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
