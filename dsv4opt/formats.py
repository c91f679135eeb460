"""Number-format constants, with no Triton import: modules that describe data (the KV cache, the
quantisers) import them from here, so importing them leaves Triton unloaded and a CPU gate can
still switch Triton to its interpreter before any kernel is defined (gate_table.use_interpreter)."""

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2
FP8_MAX = 448.0  # largest finite float8_e4m3fn
