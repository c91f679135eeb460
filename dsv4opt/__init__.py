"""dsv4opt: profiling-driven decode optimisation for DeepSeek-V4-Flash."""

__version__ = "0.1.0"
