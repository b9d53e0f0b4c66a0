"""exact_sum_partials: the partials' exact sum is the values' exact sum, whichever
way the per-exponent sums are taken (np.bincount below BINCOUNT_MAX values, a sort by
exponent past it), and partials of any grouping combine into the correctly rounded sum."""
import math
from fractions import Fraction

import numpy as np
import pytest

from specaudit.audit.check import exact_sum as es


def exact(values) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


def cases():
    rng = np.random.default_rng(7)
    yield rng.integers(1, 9, 5000) / rng.integers(1, 40, 5000)            # per-request means
    yield rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)  # wide exponents, signs
    yield np.r_[1e16, 1.0, -1e16, np.full(200, 1e-3), np.zeros(50)]       # cancellation, zeros
    yield np.full(4000, 0.1)


@pytest.mark.parametrize("bins", ["bincount", "sort"])
def test_partials_sum_exactly(monkeypatch, bins):
    if bins == "sort":
        monkeypatch.setattr(es, "BINCOUNT_MAX", 0)
    for x in cases():
        got = es._exact_sum_int(x)
        assert got is not None
        assert exact(got) == exact(x)
        assert math.fsum(got) == math.fsum(x.tolist())


def test_both_ways_the_same_partials(monkeypatch):
    for x in cases():
        a = es._exact_sum_int(x)
        monkeypatch.setattr(es, "BINCOUNT_MAX", 0)
        b = es._exact_sum_int(x)
        monkeypatch.undo()
        assert a == b


def test_groupings_combine_to_the_rounded_sum():
    x = next(cases())
    parts = es.exact_sum_partials(x[:1700])
    parts = es.exact_sum_partials(x[1700:], parts)
    assert math.fsum(parts) == math.fsum(x.tolist())
    assert exact(parts) == exact(x)


def test_out_of_range_falls_back_to_shewchuk():
    assert es._exact_sum_int(np.r_[np.ones(100), np.inf]) is None
    x = np.r_[np.full(100, 1e-300), np.full(100, 1e300)]          # exponents too far apart
    assert es._exact_sum_int(x) is None
    assert math.fsum(es.exact_sum_partials(x)) == math.fsum(x.tolist())
