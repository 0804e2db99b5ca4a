"""Mean, standard deviation and a Student-t 95% interval over a handful of seeds.

No SciPy: the two-sided 97.5% quantiles of the t distribution are tabulated for 1..30 degrees
of freedom (four decimals, the values of any statistics table) and interpolated in 1/df beyond,
which is exact to the third decimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098,
         18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595,
         26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799}
_Z975 = 1.9600


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    knots = sorted(_T975) + [math.inf]
    upper = next(k for k in knots if k > df)
    lower = max(k for k in knots if k < df)
    inv = lambda k: 0.0 if k == math.inf else 1.0 / k  # noqa: E731
    value_hi = _Z975 if upper == math.inf else _T975[upper]
    frac = (inv(lower) - 1.0 / df) / (inv(lower) - inv(upper))
    return _T975[lower] + frac * (value_hi - _T975[lower])


@dataclass(frozen=True)
class Stat:
    """``mean`` and sample ``std`` (n-1) of ``n`` values; ``ci`` the 95% t interval (None for n < 2)."""

    mean: float
    std: float | None
    n: int
    ci: tuple[float, float] | None

    @property
    def half_width(self) -> float | None:
        return None if self.ci is None else (self.ci[1] - self.ci[0]) / 2


def describe(values: Iterable[float]) -> Stat:
    data = [float(v) for v in values]
    if not data:
        raise ValueError("no values to describe")
    n = len(data)
    mean = sum(data) / n
    if n < 2:
        return Stat(mean, None, n, None)
    std = math.sqrt(sum((v - mean) ** 2 for v in data) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return Stat(mean, std, n, (mean - half, mean + half))


__all__ = ["Stat", "describe", "t_quantile_975"]
