"""The Target-Charging Technique bound (spec section 4.2, [RECON]: a reconstruction, not the TCT paper's
exact theorem; docs/accountants.md says why it is sound).

Setting: an adaptive sequence of queries, each ``eps0``-DP in the part that depends on the data, with
a ``q``-target (spec 4.1).  The interaction stops at the ``tau``-th target hit.  Each "private draw" hits
its target with probability at least ``q`` whatever happened before, so the number ``K`` of private
draws needed for ``tau`` hits satisfies ``P[K > k] <= P[Bin(k, q) <= tau - 1]`` (a negative-binomial tail).
Truncating at ``k`` private draws gives a ``k``-fold composition of ``eps0``-DP steps, at the price of the
tail probability in delta:

    eps'(tau) = min over beta of eps_comp(k_beta; eps0, delta - beta - k_beta delta0),
    k_beta = min{k : P[Bin(k, q) <= tau - 1] <= beta},

with ``eps_comp`` the exact optimal composition of pure steps (or DRV), and ``beta`` searched over a
fixed set of fractions of ``delta``.  ``delta0`` is the per-step delta of approximate-DP inner parts.
"""

from __future__ import annotations

import functools
import math

from scipy import stats

from pate_accountant.composition import pure_optimal_epsilon
from pate_accountant.validation import check_int, check_real

__all__ = [
    "SPLITS",
    "largest_fitting",
    "negative_binomial_tail",
    "private_draws_needed",
    "tct_details",
    "tct_epsilon",
    "tct_max_hits",
]

#: Fractions of delta tried for the tail ``beta`` (the rest goes to the composition).
SPLITS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
COMPOSITIONS = ("optimal", "drv")


def negative_binomial_tail(hits: int, q: float, k: int) -> float:
    """``P[Bin(k, q) <= hits - 1]``: the chance that ``k`` private draws give fewer than ``hits`` hits."""
    return float(stats.binom.cdf(hits - 1, k, q))


@functools.lru_cache(maxsize=4096)
def private_draws_needed(hits: int, q: float, beta: float) -> int:
    """Smallest ``k >= hits`` with ``P[Bin(k, q) <= hits - 1] <= beta``."""
    hits = check_int("hits", hits, minimum=0)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    beta = check_real("beta", beta, minimum=0.0, maximum=1.0, min_open=True)
    if hits == 0:
        return 0
    lo = hits
    if negative_binomial_tail(hits, q, lo) <= beta:
        return lo
    hi = max(lo + 1, int(2 * hits / q) + 10)
    while negative_binomial_tail(hits, q, hi) > beta:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if negative_binomial_tail(hits, q, mid) <= beta:
            hi = mid
        else:
            lo = mid
    return hi


@functools.lru_cache(maxsize=4096)
def _tct(hits: int, q: float, eps0: float, delta: float, delta0: float, composition: str) -> tuple[float, int, float]:
    best = (math.inf, 0, 0.0)
    if hits == 0:
        return (0.0, 0, 0.0)
    for fraction in SPLITS:
        beta = fraction * delta
        k = private_draws_needed(hits, q, beta)
        slack = delta - beta - k * delta0
        if slack <= 0:
            continue
        if composition == "optimal":
            eps = pure_optimal_epsilon(k, eps0, slack)
        else:  # homogeneous DRV: eps0 sqrt(2k ln(1/delta')) + k eps0 (e^eps0 - 1)
            eps = eps0 * math.sqrt(2 * k * math.log(1 / slack)) + k * eps0 * math.expm1(eps0)
        if eps < best[0]:
            best = (eps, k, fraction)
    return best


def tct_epsilon(
    hits: int, q: float, eps0: float, delta: float, *, delta0: float = 0.0, composition: str = "optimal"
) -> float:
    """The epsilon (at total ``delta``) after ``hits`` target hits of ``q``-target queries at level ``eps0``."""
    hits = check_int("hits", hits, minimum=0)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    return _tct(hits, q, eps0, delta, delta0, composition)[0]


def tct_details(hits: int, q: float, eps0: float, delta: float, *, delta0: float = 0.0, composition: str = "optimal") -> dict:
    """:func:`tct_epsilon` with the truncation ``k`` and the delta split that achieved it."""
    eps = tct_epsilon(hits, q, eps0, delta, delta0=delta0, composition=composition)
    _, k, fraction = _tct(hits, q, eps0, delta, delta0, composition)
    return {"epsilon": eps, "private_draws": k, "tail_fraction_of_delta": fraction}


def tct_max_hits(
    q: float, eps0: float, epsilon: float, delta: float, *, delta0: float = 0.0, composition: str = "optimal"
) -> int:
    """The largest number of target hits whose :func:`tct_epsilon` stays within ``epsilon``."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    return largest_fitting(lambda h: tct_epsilon(h, q, eps0, delta, delta0=delta0, composition=composition) <= epsilon)


def largest_fitting(fits, start: int = 0) -> int:
    """The largest integer ``k >= start`` with ``fits(k)``, for a predicate that holds up to some point and
    fails after it; ``fits(start)`` is taken to hold.  Gallops up from ``start``, then bisects."""
    lo, step = start, 1
    while fits(lo + step):
        lo, step = lo + step, step * 2
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
