import numpy as np
import pandas as pd
import pytest

from dsv4opt.analysis.codes import factorize_names, factorize_rows


def test_names_of_a_categorical_code_as_their_strings_do():
    # categories in another order than the names first appear, and one never used
    names = pd.Series(pd.Categorical.from_codes([3, 1, 3, 0, 2, 1], categories=pd.Index(["d", "c", "b", "a"], dtype=object)))
    codes, distinct = factorize_names(names)
    assert codes.tolist() == [0, 1, 0, 2, 3, 1]
    assert distinct.dtype == object and distinct.tolist() == ["a", "c", "d", "b"]
    plain_codes, plain = factorize_names(names.astype(object))
    assert plain_codes.tolist() == codes.tolist() and plain.tolist() == distinct.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_rows_code_as_a_multiindex_factorizes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    a, c = rng.integers(-3, 3, n), rng.integers(0, 3, n)
    b = rng.integers(0, 4, n).astype(float)
    if n and seed % 2:
        b[rng.integers(0, n, 3)] = np.nan  # a missing value is one more value, as in a MultiIndex
    want = pd.MultiIndex.from_arrays([a, b, c]).factorize()[0]
    assert factorize_rows(a, b, c).tolist() == want.tolist()
