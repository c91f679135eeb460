"""Classify, rank, attribute, diagnose and diff GPU kernels from a trace."""
