"""Rank kernels and categories by GPU time: plain functions from typed tables to typed tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsv4opt.analysis.categories import CATEGORIES
from dsv4opt.analysis.classify import classify_names
from dsv4opt.analysis.codes import factorize_names
from dsv4opt.analysis.names import short_name

KERNEL_COLUMNS = ["name", "short_name", "category", "count", "total_us", "mean_us", "share"]
CATEGORY_COLUMNS = ["category", "count", "total_us", "share"]


def total_gpu_us(kernels: pd.DataFrame) -> float:
    """Exact (correctly rounded) sum of raw `dur` over GPU events."""
    return math.fsum(kernels["dur_us"].tolist())


def kernel_table(kernels: pd.DataFrame, total_us: float | None = None) -> pd.DataFrame:
    """[events] name, dur_us -> [distinct names] KERNEL_COLUMNS, sorted by total_us descending."""
    if kernels.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "short_name", "category") else float) for c in KERNEL_COLUMNS})
    codes, distinct = factorize_names(kernels["name"])
    g = pd.Series(kernels["dur_us"].to_numpy()).groupby(codes)  # codes count up in order of first appearance
    out = pd.DataFrame({"name": pd.Series(distinct), "count": g.size().to_numpy(), "total_us": g.sum().to_numpy()})
    total = total_gpu_us(kernels) if total_us is None else total_us
    out["mean_us"] = out["total_us"] / out["count"]
    out["share"] = out["total_us"] / total if total > 0 else 0.0
    out["category"] = classify_names(out["name"])
    out["short_name"] = out["name"].map(short_name)
    out = out.sort_values(["total_us", "name"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    return out[KERNEL_COLUMNS]


def category_table(ktable: pd.DataFrame, total_us: float) -> pd.DataFrame:
    """[distinct names] -> [categories present] CATEGORY_COLUMNS in the fixed CATEGORIES order."""
    if ktable.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "category" else float) for c in CATEGORY_COLUMNS})
    g = ktable.groupby("category", sort=False).agg(count=("count", "sum"), total_us=("total_us", "sum"))
    g = g.reindex([c for c in CATEGORIES if c in g.index]).reset_index()
    g["share"] = g["total_us"] / total_us if total_us > 0 else 0.0
    g["count"] = g["count"].astype(np.int64)
    return g[CATEGORY_COLUMNS]


def records(table: pd.DataFrame) -> list[dict]:
    """DataFrame -> JSON-ready rows (numpy scalars become Python numbers)."""
    rows = table.to_dict(orient="records")
    for row in rows:
        for k, v in row.items():
            if isinstance(v, np.integer):
                row[k] = int(v)
            elif isinstance(v, np.floating):
                row[k] = float(v)
    return rows
