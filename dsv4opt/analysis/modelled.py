"""The operators the efficiency table has a FLOP/byte model for, by name (efficiency.py holds the
models). Apart and free of numpy and pandas: the reader is told which operators' shapes to keep
before the analysis is imported (trace/prefetch.py)."""

from __future__ import annotations

BINARY = {"add", "sub", "mul", "div", "maximum", "minimum", "rsub"}
UNARY = {"neg", "rsqrt", "sqrt", "exp", "log", "silu", "gelu", "relu", "sigmoid", "tanh", "sin", "cos", "abs",
         "pow", "reciprocal", "square"}
ATTENTION_LAYOUT = {  # operator -> (q/k/v layout, index of is_causal among the inputs)
    "aten::_flash_attention_forward": ("BLHD", 8),
    "aten::_scaled_dot_product_flash_attention": ("BHLD", 4),
    "aten::_scaled_dot_product_efficient_attention": ("BHLD", 6),
    "aten::_scaled_dot_product_cudnn_attention": ("BHLD", 6),
}
GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::linear"}


def modelled_ops() -> frozenset[str]:
    """Operator names with a model: the reader keeps shapes for these only."""
    pointwise = {f"aten::{op}{suffix}" for op in BINARY | UNARY for suffix in ("", "_")}
    return frozenset(GEMMS | set(ATTENTION_LAYOUT) | pointwise | {"aten::copy_"})
