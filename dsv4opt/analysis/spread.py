"""Per-kernel spread of launch durations: is a kernel's mean made of alike launches or of a few
slow ones (shapes that change, contention, a cold first launch)?"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsv4opt.analysis.codes import factorize_names

SPREAD_COLUMNS = ["name", "min_us", "median_us", "p90_us", "max_us", "std_us"]


def kernel_spread(kernels: pd.DataFrame) -> pd.DataFrame:
    """[GPU events] name, dur_us -> [distinct names] min_us, median_us, p90_us (linear
    interpolation between launches, as numpy's default), max_us, std_us (population: 0 for a single
    launch), in order of first appearance."""
    if kernels.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "name" else float) for c in SPREAD_COLUMNS})
    codes, distinct = factorize_names(kernels["name"])
    g = pd.Series(kernels["dur_us"].to_numpy(np.float64)).groupby(codes)  # codes count up in order of first appearance
    out = pd.DataFrame({
        "name": distinct,
        "min_us": g.min().to_numpy(),
        "median_us": g.median().to_numpy(),
        "p90_us": g.quantile(0.9).to_numpy(),
        "max_us": g.max().to_numpy(),
        "std_us": g.std(ddof=0).to_numpy(),
    })
    return out[SPREAD_COLUMNS]
