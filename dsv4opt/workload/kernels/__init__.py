"""Triton kernels of the baseline decode step, each standing in for one SGLang kernel (sm_120 path).

Each public function runs its Triton kernel on a GPU (or under the interpreter) and a plain-torch
path elsewhere; both compute the function written in `dsv4opt/workload/kernels/naive.py`.
"""
