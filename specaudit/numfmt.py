"""How a number is printed: one home for the figures in findings, reports and tables.

A ground-floor module (imports nothing of specaudit), so every layer may use it: the
rule catalog, the readers, the post-mortem report, the commands.

    figure(2.3456)        '2.346'    a derived or reported figure in a catalog message
    figure(2.0)           '2'        (4 significant digits; an integral float as an integer)
    fixed(2.3456)         '2.35'     fixed decimals, as engines print their figures
    fixed(None, missing="-")  '-'
    count(12.0)           '12'       a count (a float that is whole prints as one)
    cell(1234567)         '1,234,567'  a table cell of the HTML report ('' when missing)
    signed(0.0123, True)  '+0.0123'  a mean or a gap of the A/B evidence (3 significant digits)
    typed(1e-06)          '1e-06'    a flag's value or bound, as short as reads back the same

Each style keeps the output that the tests and the docs pin; they differ on purpose:
a message shows a figure to 4 significant digits, an engine log's identity is shown to
the decimals the engine printed (a recomputed 2.35 beside the printed 2.35), a table
groups thousands.
"""
from __future__ import annotations

import math


def _finite(x) -> bool:
    return math.isfinite(float(x))


def figure(v) -> str:
    """A figure in a finding's message: a non-integral float to 4 significant digits below
    1000 (one decimal from 1000 on, never an exponent), an integral float as an integer,
    anything else as str()."""
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.1f}"
    if isinstance(v, float):   # whole (nan and inf are not, so they took the line above)
        return str(int(v))
    return str(v)


def fixed(x, nd: int = 2, missing: str = "?", exact_ints: bool = False) -> str:
    """x with nd decimals ('?' or `missing` for None; nan/inf as they are). exact_ints:
    an int prints as it is (the diff's reported counts), not as '3.00'."""
    if x is None:
        return missing
    if exact_ints and not isinstance(x, float):
        return str(x)
    if not _finite(x):
        return str(x)
    return f"{float(x):.{nd}f}"


def count(x) -> str:
    """A count: '?' for None, an integral value without decimals, else the shortest form."""
    return "?" if x is None else (str(int(x)) if float(x) == int(x) else f"{x:g}")


def cell(v, digits: int = 4) -> str:
    """A table cell: '' for None, ints with thousands separators, floats to `digits`
    significant digits (whole and grouped from a million on), nan/inf as they are."""
    if v is None:
        return ""
    if isinstance(v, float):
        if not _finite(v):
            return str(v)
        return f"{v:.{digits}g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def signed(v, sign: bool = False) -> str:
    """A mean or a gap: 3 significant digits below 100, one decimal below 1000, whole and
    grouped above; sign=True prints '+' on positive values (and '+0'); 'nan' when unknown."""
    if v is None or not _finite(v):
        return "nan"
    a = abs(v)
    if a < 1e-9:
        return "+0" if sign else "0"
    p = "+" if sign else ""
    if a >= 1000:
        return f"{v:{p},.0f}"
    if a >= 100:
        return f"{v:{p}.1f}"
    return f"{v:{p}.3g}"


def typed(x) -> str:
    """A number a user typed, or a flag's bound (specaudit/bounds.py): %g when it reads back
    the same (1e-06, 1024, 86400), repr otherwise (1e-320, 0.30000000000000004); nan and
    inf as Python spells them; integers whole."""
    if isinstance(x, float):
        return f"{x:g}" if math.isfinite(x) and float(f"{x:g}") == x else repr(x)
    return str(x)
