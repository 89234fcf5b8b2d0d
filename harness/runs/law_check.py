"""Goodness of fit of sampled token sequences to an exact law: the statistics behind the
losslessness checks (tests/test_sampling.py on a tiny model, scripts/check_lossless_law.py on the
real target).

Pearson chi-square over cells, cells whose expected count is below `min_expected` pooled into one
bin (>= 5 is the usual validity rule of the chi-square approximation; 10 also keeps the degrees of
freedom down, which raises the power against biased rules). The p-value comes from the regularised
incomplete gamma function below (scipy is not a dependency).
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, x/2)
    (series for small x, Lentz continued fraction otherwise; Numerical Recipes' gammq)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def pooled_chi2(observed: Sequence[float], expected: Sequence[float], min_expected: float = 10.0
                ) -> tuple[float, int, float]:
    """Pearson chi-square of counts against expected counts (same cells, same total), cells with
    expected count < `min_expected` pooled into one bin (merged with the smallest kept cell if
    still too small). Returns (statistic, degrees of freedom, p-value)."""
    o, e = [], []
    o_small = e_small = 0.0
    for oi, ei in zip(observed, expected):
        if ei >= min_expected:
            o.append(float(oi))
            e.append(float(ei))
        else:
            o_small += oi
            e_small += ei
    if e_small > 0:
        if e_small >= min_expected or not e:
            o.append(o_small)
            e.append(e_small)
        else:
            j = min(range(len(e)), key=e.__getitem__)
            o[j] += o_small
            e[j] += e_small
    elif o_small:
        return math.inf, max(1, len(e) - 1), 0.0  # samples where the law puts no mass at all
    stat = sum((oi - ei) ** 2 / ei for oi, ei in zip(o, e))
    df = max(1, len(e) - 1)
    return stat, df, chi2_sf(stat, df)
