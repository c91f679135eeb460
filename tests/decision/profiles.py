"""Hand-made profiles with round numbers, so expected figures can be worked out by hand."""

from __future__ import annotations

from dsv4opt.analysis.profile import CategoryRow, KernelRow, Profile


def make_profile(kernels: list[tuple[str, str, int, float]], *, steps: int = 10, meta: dict | None = None,
                 throughput: dict | None = None) -> Profile:
    """kernels: (name, category, launches, total_us)."""
    total = sum(k[3] for k in kernels)
    rows = sorted(
        (KernelRow(name=n, category=c, count=cnt, total_us=t, share=t / total) for n, c, cnt, t in kernels),
        key=lambda r: -r.total_us,
    )
    cats: dict[str, CategoryRow] = {}
    for r in rows:
        row = cats.setdefault(r.category, CategoryRow(category=r.category, count=0, total_us=0.0, share=0.0))
        row.count += r.count
        row.total_us += r.total_us
        row.share += r.share
    return Profile(
        meta={"target": "trace", **(meta or {})},
        total_us=total,
        kernels=rows,
        categories=sorted(cats.values(), key=lambda r: -r.total_us),
        steps={"count": steps},
        throughput=throughput,
    )


# The story after mma-attn: FP32 SIMT GEMM ~19% as one kernel, glue ~60% over thousands of tiny launches.
def story_after_attention() -> Profile:
    return make_profile(
        [
            ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel",
             "gemm_fp32_simt", 860, 1920.0),
            ("mma_sparse_decode_kernel", "attention", 430, 960.0),
            ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN", "gemm_tc", 2000, 1120.0),
            ("at::native::vectorized_elementwise_kernel<4, ...>", "elementwise", 40000, 4000.0),
            ("at::native::reduce_kernel<512, 1, ...>", "reduction", 15000, 1500.0),
            ("CatArrayBatchedCopy<...>", "copy", 5000, 500.0),
        ],
        steps=10,
        meta={"concurrency": 32, "optimizations": ["mma-attn"], "model": "deepseek-ai/DeepSeek-V4-Flash"},
    )


def fuse_glue_on_record(concurrency: int) -> float:
    """fuse-glue's kernel speed-up at `concurrency` as committed from the H200 bench (read here, not
    through the code under test)."""
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).resolve().parents[2] / "dsv4opt/optimizations/fuse_glue/measured.json").read_text())
    return float(record["kernel_speedup"][str(concurrency)])


def amdahl_of(share: float, speedup: float) -> float:
    return 1 / ((1 - share) + share / speedup)
