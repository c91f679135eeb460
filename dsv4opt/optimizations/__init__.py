"""One package per optimisation: naive.py (reference), kernel.py, check.py, and its registry entry."""
