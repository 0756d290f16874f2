"""Speed-ups with a confidence interval, and a verdict that says when noise leaves them
unresolved.

Strategies run round-robin (planner.compare), so each round gives one time per strategy
taken minutes apart at most. A round is the paired unit: the ratio of two strategies'
times in the same round cancels a slow spell of the machine that hit both. Ratios
multiply, so the statistics are on their logarithms:

    d_r   = ln(t_slower,r / t_faster,r)                  one per round
    x     = exp(mean d)                                  the speed-up (geometric mean)
    CI    = exp(mean d ± t_{n-1, (1+c)/2} · sd(d) / √n)  Student's t, paired rounds

A verdict is "faster" when the whole interval lies above 1, "slower" when it lies
below, "same" when it lies within SAME_WITHIN of 1 either way (two plans that run alike are
told apart by no number of rounds: that is an answer too), else "unresolved". With one round there is no spread to judge by: unresolved.
Student's t is used rather than a bootstrap because compare runs 2 to ~10 rounds, and
a bootstrap of so few points returns intervals far narrower than the truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev
from typing import Literal

Verdict = Literal["faster", "slower", "same", "unresolved"]
SAME_WITHIN = 0.05  # an interval inside [1/1.05, 1.05]: the same speed, within 5%


@dataclass(frozen=True)
class SpeedUp:
    """How much faster one strategy ran than another: > 1 means faster."""

    ratio: float  # geometric mean over rounds of the same-round time ratio
    low: float  # confidence interval of the ratio
    high: float
    rounds: int
    confidence: float

    @property
    def verdict(self) -> Verdict:
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        if self.low >= 1 / (1 + SAME_WITHIN) and self.high <= 1 + SAME_WITHIN:
            return "same"
        return "unresolved"


def paired_speedup(slower_ms: Sequence[float], faster_ms: Sequence[float], *, confidence: float = 0.95) -> SpeedUp:
    """Speed-up of the strategy timed `faster_ms` over the one timed `slower_ms`, round by
    round (both lists in round order, one time per round)."""
    if len(slower_ms) != len(faster_ms) or not slower_ms:
        raise ValueError("paired speed-up needs one time per round for both strategies")
    logs = [math.log(s / f) for s, f in zip(slower_ms, faster_ms)]
    mean = fmean(logs)
    n = len(logs)
    if n < 2:
        return SpeedUp(math.exp(mean), 0.0, math.inf, n, confidence)
    half = student_t_quantile((1 + confidence) / 2, n - 1) * stdev(logs) / math.sqrt(n)
    return SpeedUp(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, confidence)


# ---------------------------------------------------------------- Student's t


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (p in (0.5, 1)), by
    bisection on the CDF; exact to ~1e-10, enough for an interval."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError("need 0.5 <= p < 1 and df >= 1")
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if student_t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def student_t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t: 1 - I_x(df/2, 1/2)/2 with x = df / (df + t²), t ≥ 0."""
    tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (Lentz's method), using the symmetry
    I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(x, a, b) / a
    return 1 - front * _beta_fraction(1 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result
