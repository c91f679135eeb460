"""Per-kernel spread of launch durations: is a kernel's mean made of alike launches or of a few
slow ones (shapes that change, contention, a cold first launch)?"""

from __future__ import annotations

import numpy as np
import pandas as pd

SPREAD_COLUMNS = ["name", "min_us", "median_us", "p90_us", "max_us", "std_us"]


def kernel_spread(kernels: pd.DataFrame) -> pd.DataFrame:
    """[GPU events] name, dur_us -> [distinct names] min_us, median_us, p90_us (linear
    interpolation between launches, as numpy's default), max_us, std_us (population: 0 for a single
    launch), in order of first appearance."""
    if kernels.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "name" else float) for c in SPREAD_COLUMNS})
    frame = pd.DataFrame({"name": kernels["name"].astype(object).to_numpy(), "dur": kernels["dur_us"].to_numpy(np.float64)})
    g = frame.groupby("name", sort=False)["dur"]
    out = pd.DataFrame({
        "min_us": g.min(),
        "median_us": g.median(),
        "p90_us": g.quantile(0.9),
        "max_us": g.max(),
        "std_us": g.std(ddof=0),
    }).reset_index()
    return out[SPREAD_COLUMNS]
