"""Goodness of fit of sampled token sequences to an exact law: the statistics behind the
losslessness checks (tests/test_sampling.py on a tiny model, scripts/check_lossless_law.py on the
real target, the law and draft-law checks of `cli.py check-method`).

Pearson chi-square over cells, cells whose expected count is below `min_expected` pooled into one
bin (>= 5 is the usual validity rule of the chi-square approximation; 10 also keeps the degrees of
freedom down, which raises the power against biased rules). The p-value comes from the regularised
incomplete gamma function below (scipy is not a dependency).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch


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


# ---- randomised PIT: a token drawn from a known law, made uniform ------------------------------
# Each checked token x comes with the law it should have been drawn from (a [V] distribution that
# may differ from one token to the next: a drafter's q row, the target's law after its prefix).
# Order the vocabulary by descending probability (ties by id) and draw v ~ U(0, 1): then
#   u = P(tokens before x) + v * P(x)
# is exactly U(0, 1) when x was drawn from that law, and the u of successive tokens are independent
# (each is uniform given everything drawn before it). So any number of tokens under any laws become
# one sample of uniforms, tested by `uniformity_test`: a token drawn more (or less) often than its
# law says shows as too many (or too few) u in the bins its probability spans.

def pit(probs: torch.Tensor, token: int, v: float) -> float:
    """Randomised probability integral transform of `token` under `probs` [V] (sums to 1)."""
    p = probs.double()
    px = p[token]
    before = (p > px) | ((p == px) & (torch.arange(p.numel(), device=p.device) < token))
    return float(p[before].sum() + v * px)


def pit_bins(n: int, max_bins: int = 20, min_expected: float = 10.0) -> int:
    """Equal bins for n uniforms: as many as keep >= `min_expected` expected per bin, at most `max_bins`."""
    return max(2, min(max_bins, int(n // min_expected)))


def uniformity_test(us: Sequence[float], max_bins: int = 20) -> tuple[float, int, float]:
    """Pearson chi-square of values in (0, 1) against the uniform law over `pit_bins` equal bins:
    (statistic, degrees of freedom, p-value)."""
    bins = pit_bins(len(us), max_bins)
    counts = [0] * bins
    for u in us:
        counts[min(bins - 1, max(0, int(u * bins)))] += 1
    return pooled_chi2(counts, [len(us) / bins] * bins)


def noncentral_chi2_sf(x: float, df: int, lam: float) -> float:
    """P(X >= x) for X ~ noncentral chi-square(df, lam): the Poisson(lam / 2) mixture of central
    chi-squares with df + 2k degrees of freedom."""
    if lam <= 0:
        return chi2_sf(x, df)
    half, total = lam / 2.0, 0.0
    centre = int(half)
    for k in range(max(0, centre - 10 * int(math.sqrt(half) + 5)), centre + 10 * int(math.sqrt(half) + 5) + 1):
        weight = math.exp(-half + k * math.log(half) - math.lgamma(k + 1))
        total += weight * chi2_sf(x, df + 2 * k)
    return min(1.0, total)


def chi2_isf(alpha: float, df: int) -> float:
    """The x with P(chi-square(df) >= x) = alpha (bisection)."""
    lo, hi = 0.0, float(df) + 10.0
    while chi2_sf(hi, df) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def detectable_shift(n: int, alpha: float, power: float = 0.8, max_bins: int = 20) -> float:
    """The smallest probability mass moved from one PIT bin to another that `uniformity_test` on n
    values rejects at level `alpha` with probability `power`. Moving mass d between two of B equal
    bins gives the noncentrality n * 2 * B * d^2 (Cohen's w^2 = 2 B d^2)."""
    bins = pit_bins(n, max_bins)
    crit = chi2_isf(alpha, bins - 1)
    lo, hi = 0.0, 1.0
    while noncentral_chi2_sf(crit, bins - 1, hi) < power:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if noncentral_chi2_sf(crit, bins - 1, mid) < power else (lo, mid)
    return math.sqrt(hi / (n * 2 * bins))
