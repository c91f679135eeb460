"""grouped-moe's kernels: the routed experts as grouped MXFP4 GEMMs, each local expert's slots once.

They are grouped-moe's `routed_experts` on the sm_120 path (in place of SGLang's
`mxfp4_moe_forward_triton`, a CUDA-core GEMV a slot) and, on the Hopper path of SGLang 0.5.23, the
baseline's stand-in for Marlin's W4A16 MoE (`moe_wna16_marlin_gemm`). One entry,
`grouped_routed_experts`, runs each GEMM on the backend the tile table names (direct: both GEMMs
or neither):

- `kernel.py`: the Triton kernels (`_route_kernel`, gate/up `_moe_up_kernel`, down `_moe_down_kernel`,
  `_moe_combine_kernel`) and the entry itself; runs everywhere Triton does, the interpreter included.
- `ws.py`: the two GEMMs warp-specialised in Gluon (sm_90a, Triton 3.6), a producer warp feeding the
  decoding warpgroup; they stand for the Triton GEMMs on routed tiles (dp-ep from C = 2, tp4 from
  C = 5). `ws_runs_on` says where the Gluon kernels run; elsewhere the Triton rows they replaced.
- `direct.py`: the two GEMMs in Gluon with mma.sync for a few slots, each lane's weight bytes loaded
  straight into its MMA fragments; they stand for the Triton GEMMs on slotwise tiles (tp4, C = 1-4).

All three read `layout.py`'s production layout (MXFP4 values repacked in units of 16 rows x 64
columns, e8m0 scales), and `configs.py` holds the table. The definition they match:
`dsv4opt/workload/kernels/naive.py`; maths, bytes and floors: docs/optimizations/grouped_moe.md.

The modules load on first use (PEP 562): Triton picks interpreter or compiler when a kernel is
defined, and reading the table or the layout defines none.
"""

from importlib import import_module

_HOME = {
    "grouped_routed_experts": "kernel", "route": "kernel", "table_config": "kernel", "Routing": "kernel",
    "MoeConfig": "configs", "GemmTiles": "configs", "choose": "configs", "candidates": "configs",
    "PackedExperts": "layout", "packed_experts": "layout", "e8m0": "layout",
    "ws_runs_on": "ws",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_HOME)
