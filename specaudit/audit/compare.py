"""The one rule that decides whether a reported figure agrees with a derived one.

Every surface that puts an engine's figure next to specaudit's own (the checker's SA5xx
and SA6xx rules, `diff`, `report`, the DuckDB views' `specaudit_agrees()`, the
estimator's verdict, the server's live gauges) calls this module, so one number gets
one verdict wherever it is shown.

Words:
    reported  the figure the engine printed or stored (a counter, a mean, a rate)
    derived   the same quantity re-derived by specaudit from raw data (the committed
              tokens, the accepted path, the clock)
    precision the interval a reported float stands for

The rule:
    * A counter (an int, or `counter=True` for a count stored as a float) compares
      exactly: 511 committed tokens is not 512. (This is the printed-precision rule
      below applied to a whole number: "512" stands for [511.5, 512.5), and a count
      derived from rows is whole.)
    * A printed float carries its printed precision: it stands for every value that
      prints as it. 3.41 stands for [3.405, 3.415); 120.5 for [120.45, 120.55); 2.0 for
      [1.95, 2.05). The derived value agrees when it lies in that half-open interval,
      compared exactly in decimal (no binary rounding slack). The precision is read
      from the text when the caller has it (`printed="2.00"`: [1.995, 2.005), or a
      `Printed("2.00")`, a float that keeps its text: the CLI's typed figures), else
      from the shortest repr of the float (a parsed "2.00" is 2.0: the looser [1.95,
      2.05), which can only miss, never raise, an alarm).
    * A float with FULL_PRECISION_DIGITS significant digits or more was not printed for
      people (a mean written by code at full precision): it agrees within a relative
      FULL_PRECISION_REL (summation order only).
    * Missing, NaN, infinite or non-numeric on either side: no verdict (None), never a
      silent "agrees".

Against a band (the estimator: a 95% interval widened by a tolerance), a reported
figure agrees when its precision interval overlaps the band: `within(reported, lo, hi)`.
A point (lo == hi == derived) gives the same answer as `agrees(reported, derived)`.

    >>> agrees(3.41, 3.4149), agrees(3.41, 3.4151), agrees(120.5, 120.62)
    (True, False, False)
    >>> agrees(512, 511), agrees(2.0, 2.04), agrees(2.0, 2.04, printed="2.00")
    (False, True, False)
"""
from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

FULL_PRECISION_DIGITS = 15     # a float with this many significant digits was computed, not printed
FULL_PRECISION_REL = 1e-9      # relative slack for such a float (summation order)

AGREES, DISAGREES, NO_VERDICT = "agrees", "disagrees", "no verdict"


class Printed(float):
    """A float that remembers how it was written ("7.0000" on a command line): precision()
    reads its digits from that text, not from repr (which would say 7.0, +-0.05). Adding an
    int keeps the digits (a depth given as 6.00 is judged as 7.00)."""

    def __new__(cls, text: str):
        v = super().__new__(cls, text)
        v.text = text.strip()
        return v

    def __getnewargs__(self):       # copies and pickles rebuild it from its text, not from the float
        return (self.text,)

    def __add__(self, other):
        if isinstance(other, int) and not isinstance(other, bool):
            try:
                return Printed(str(Decimal(self.text) + other))
            except InvalidOperation:
                pass
        return float(self) + other

    __radd__ = __add__


def _number(x) -> float | None:
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float, Decimal)):
        try:  # numpy scalars and the like
            import numpy as np
            if isinstance(x, (np.integer, np.floating)):
                return float(x)
        except ImportError:  # pragma: no cover
            pass
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    try:
        import numpy as np
        return isinstance(x, np.integer)
    except ImportError:  # pragma: no cover
        return False


def precision(reported, printed: str | None = None) -> tuple[Decimal, Decimal] | None:
    """[lo, hi) that the reported float stands for, or None when it was not printed for
    people (full precision: compare relatively) or is not a finite number."""
    v = _number(reported)
    if v is None:
        return None
    if printed is None and isinstance(reported, Printed):
        printed = reported.text
    if isinstance(printed, str) and printed.strip():
        text = printed.strip()
    else:
        text = str(int(reported)) if _is_int(reported) else repr(float(v))
    try:
        d = Decimal(text)
    except InvalidOperation:
        d = Decimal(repr(float(v)))
    if not d.is_finite():
        return None
    sign, digits, exp = d.as_tuple()
    if printed is None and not _is_int(reported) and len(digits) >= FULL_PRECISION_DIGITS:
        return None
    half = Decimal(5).scaleb(exp - 1)      # half a unit of the last printed digit
    return d - half, d + half


def agrees(reported, derived, *, counter: bool = False, printed: str | None = None) -> bool | None:
    """True / False under the module's rule; None when either side is missing or not a
    finite number. An int reported, or counter=True, compares exactly."""
    r, d = _number(reported), _number(derived)
    if r is None or d is None:
        return None
    if counter or _is_int(reported):
        return r == d
    if r == d and printed is None:
        # the float itself lies in its own precision interval (and within any relative
        # slack): the same answer as below, without the decimal arithmetic
        return True
    iv = precision(reported, printed)
    if iv is None:
        return abs(r - d) <= FULL_PRECISION_REL * max(abs(r), abs(d), 1e-300)
    lo, hi = iv
    dd = Decimal(d)
    return lo <= dd < hi


def within(reported, low, high, *, printed: str | None = None) -> bool | None:
    """True when reported's precision interval overlaps [low, high]; None on missing data.

    With low == high this is agrees(reported, low)."""
    r, lo, hi = _number(reported), _number(low), _number(high)
    if r is None or lo is None or hi is None:
        return None
    if lo > hi:
        lo, hi = hi, lo
    if lo == hi:
        return agrees(reported, lo, counter=False, printed=printed)
    iv = precision(reported, printed)
    if iv is None:
        slack = FULL_PRECISION_REL * max(abs(r), 1e-300)
        return lo - slack <= r <= hi + slack
    plo, phi = iv
    return plo <= Decimal(hi) and Decimal(lo) < phi


def verdict(reported, derived, **kw) -> str:
    """'agrees' / 'disagrees' / 'no verdict': agrees() as the word every surface prints."""
    a = agrees(reported, derived, **kw)
    return NO_VERDICT if a is None else (AGREES if a else DISAGREES)
