"""SGLang 0.5.23's own Hopper kernels, run where they can: DeepGEMM (dense FP8 GEMMs, the indexer's
paged MQA logits, the mHC tf32 pre-norm GEMM), Marlin's W4A16 MoE and TileLang's mHC kernels.

artefacts.py says where they are cached and, per family, whether the real kernel runs here or why the
stand-in does; build.py fetches and compiles them (`dsv4opt build-kernels`); deepgemm.py, marlin.py
and mhc_tilelang.py call them with the tensors, layouts and scale formats SGLang passes, converted
from the workload's. Docs: docs/production-kernels.md.
"""
