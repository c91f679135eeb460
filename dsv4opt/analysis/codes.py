"""Small int codes for table keys, so group-bys and lookups run on ints instead of the strings or
tuples they stand for.

pandas hashes a string's whole text on every lookup, and kernel names run to hundreds of characters;
a MultiIndex factorizes through Python tuples. Either costs milliseconds per ten thousand events,
several times per trace. A Trace's names are categoricals, whose codes come free.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def factorize_names(names) -> tuple[np.ndarray, np.ndarray]:
    """[N] names (a categorical, or strings) -> [N] codes in order of first appearance and [distinct]
    the names as an object array: pd.factorize, which factorizes a categorical by its codes."""
    codes, distinct = pd.factorize(names)
    return codes, np.asarray(distinct, dtype=object)


def factorize_rows(*columns) -> np.ndarray:
    """[N] a code per distinct row of the columns' values, in order of first appearance: as
    pd.MultiIndex.from_arrays(columns).factorize()[0] (a missing value is a value), without tuples."""
    codes = pd.factorize(columns[0], use_na_sentinel=False)[0]
    for column in columns[1:]:
        more, distinct = pd.factorize(column, use_na_sentinel=False)
        codes = pd.factorize(codes.astype(np.int64) * len(distinct) + more)[0]
    return codes
