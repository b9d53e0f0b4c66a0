"""specaudit/numfmt: the one home of number formatting. Each style pins the output that
messages, the diff, the report and the A/B evidence printed before they shared it."""
from __future__ import annotations

import math

import pytest

from specaudit.numfmt import cell, count, figure, fixed, signed


@pytest.mark.parametrize("v, want", [
    (2.3456, "2.346"), (2.0, "2"), (0.000123456, "0.0001235"), (1234.56, "1234.6"), (999.95, "1000"),
    (7, "7"), (None, "None"), ("x", "x"), (math.nan, "nan"), (math.inf, "inf"), (-12.5, "-12.5")])
def test_figure_is_the_catalog_message_style(v, want):
    assert figure(v) == want


@pytest.mark.parametrize("args, kw, want", [
    ((2.345,), {}, "2.35"), ((2.0,), {}, "2.00"), ((3,), {}, "3.00"), ((None,), {}, "?"),
    ((math.inf,), {}, "inf"), ((0.12345, 3), {}, "0.123"), ((None,), {"missing": "-"}, "-"),
    ((3,), {"exact_ints": True}, "3"), ((3.0,), {"exact_ints": True}, "3.00"),
    ((math.nan,), {"missing": "-", "exact_ints": True}, "nan")])
def test_fixed_prints_the_decimals_engines_print(args, kw, want):
    assert fixed(*args, **kw) == want


def test_count():
    assert [count(x) for x in (None, 12.0, 12, 2.5)] == ["?", "12", "12", "2.5"]


@pytest.mark.parametrize("v, want", [
    (None, ""), (1234567, "1,234,567"), (2.345678, "2.346"), (2.5e6, "2,500,000"), (math.nan, "nan"),
    ("SA301", "SA301")])
def test_cell_is_the_report_table_style(v, want):
    assert cell(v) == want


@pytest.mark.parametrize("v, sign, want", [
    (None, False, "nan"), (math.nan, True, "nan"), (0.0, True, "+0"), (0.0, False, "0"),
    (0.0123456, True, "+0.0123"), (-0.5, True, "-0.5"), (123.45, False, "123.5"), (12345.6, True, "+12,346")])
def test_signed_is_the_ab_evidence_style(v, sign, want):
    assert signed(v, sign) == want
