"""Per-kernel duration spread against the statistics module on a real trace."""

import math
import statistics
from collections import defaultdict

import pandas as pd
import pytest

from dsv4opt.analysis.spread import SPREAD_COLUMNS, kernel_spread
from tests.helpers import SHARED_TRACES
from tests.trace.traces import gpu_events


def test_empty_input_keeps_the_schema():
    assert list(kernel_spread(pd.DataFrame({"name": [], "dur_us": []})).columns) == SPREAD_COLUMNS


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_kernel_spread_against_the_statistics_module():
    gpu = gpu_events(SHARED_TRACES / "hta_v100_ns_resolution.json.gz")
    durs = defaultdict(list)
    for e in gpu:
        durs[e["name"]].append(e["dur"])
    got = kernel_spread(pd.DataFrame({"name": [e["name"] for e in gpu], "dur_us": [e["dur"] for e in gpu]})).set_index("name")
    assert set(got.index) == set(durs)
    for name, d in durs.items():
        xs = sorted(d)
        pos = 0.9 * (len(xs) - 1)  # linear interpolation between order statistics
        p90 = xs[int(pos)] + (xs[min(int(pos) + 1, len(xs) - 1)] - xs[int(pos)]) * (pos - int(pos))
        row = got.loc[name]
        assert (row["min_us"], row["max_us"]) == (xs[0], xs[-1])
        assert math.isclose(row["median_us"], statistics.median(xs), rel_tol=1e-12)
        assert math.isclose(row["p90_us"], p90, rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(row["std_us"], statistics.pstdev(xs), rel_tol=1e-7, abs_tol=1e-9)
