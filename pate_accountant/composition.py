"""Composition bounds for (epsilon, delta)-DP steps.

This module is the one home of these formulas: the accountants (:mod:`pate_accountant.accountants.advanced`),
the TCT bound (:mod:`pate_accountant.tct`) and planning (:mod:`pate_accountant.planning`) call it.

* :func:`basic`: ``(sum eps_i, sum delta_i)``.
* :func:`drv`: heterogeneous advanced composition (Dwork, Rothblum, Vadhan 2010; Dwork-Roth Thm 3.20 and
  its heterogeneous form): for any ``delta' > 0`` the composition is ``(eps', sum delta_i + delta')``-DP with
  ``eps' = sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^{eps_i} - 1)``; :func:`drv_epsilon` is the same
  for ``k`` identical ``eps0`` steps (``eps0 sqrt(2k ln(1/delta')) + k eps0 (e^eps0 - 1)``) and
  :func:`drv_from_sums` for running sums (:func:`drv_terms`).
* :func:`kov`: the optimal bound for ``k`` identical ``(eps0, delta0)`` steps (Kairouz, Oh, Viswanath 2015,
  Thm 3.3) on its grid ``eps0 (k - 2i)``: the smallest grid point whose exact optimal delta (KOV's
  ``delta_i``, equal to :func:`pure_optimal_delta` there) fits the pure part's delta :func:`pure_part_delta`.
  It agrees with ``dp_accounting.pld.accountant.advanced_composition`` (tested), which computes
  ``(1 + e^eps0)^k`` as a float and overflows beyond ``k ~ 1000``; this one works at every ``k``.
* :func:`pure_optimal_delta` / :func:`pure_optimal_epsilon`: the exact optimal composition of ``k`` pure
  ``eps0``-DP steps with a continuous ``eps'`` (the worst pair is binary randomized response, so the
  privacy loss is ``eps0 (k - 2I)``, ``I ~ Bin(k, 1/(1 + e^{eps0}))``); equals KOV at its grid points.
* :func:`optimal_epsilon`: the same for ``k`` identical ``(eps0, delta0)`` steps: the worst such step leaks
  with probability ``delta0`` and is otherwise binary randomized response, so the total delta at ``eps'`` is
  ``1 - (1 - delta0)^k (1 - delta_RR(eps'))`` and the pure part may spend
  ``delta_RR = 1 - (1 - delta) / (1 - delta0)^k`` (:func:`pure_part_delta`).

Rounding is kept on the safe side: an epsilon returned here is never below the exact value of the bound
it names.  ``pure_part_delta`` is computed as ``-expm1(k log1p(-delta0) - log1p(-delta))`` (no cancellation
in ``(1 - delta0)^k`` when nearly all of ``delta`` goes to the steps' own deltas), with its exponent moved
up by a bound on its rounding error; a computed ``delta_RR(eps')`` is accepted only if it stays below the
target after a relative margin ``DELTA_SAFETY`` (which covers the rounding of the binomial weights and of
their sum, and moves epsilon by far less than ``1e-9``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from pate_accountant.validation import check_int, check_real

__all__ = [
    "DELTA_SAFETY",
    "MAX_EXACT_STEPS",
    "basic",
    "drv",
    "drv_epsilon",
    "drv_from_sums",
    "drv_terms",
    "kov",
    "optimal_epsilon",
    "pure_optimal_delta",
    "pure_optimal_epsilon",
    "pure_part_delta",
]

#: Relative margin on every computed delta compared with a target (see the module docstring).
DELTA_SAFETY = 1e-9
#: Unit roundoff bound used in the error bounds below (twice the double-precision unit roundoff).
_ULP = 2.0**-52


def basic(epsilons, deltas) -> tuple[float, float]:
    """Basic composition: the sums."""
    return float(np.sum(epsilons)), float(min(1.0, np.sum(deltas)))


def _drv(root_factor: float, squares: float, drift: float, delta_prime: float) -> float:
    """The DRV formula, written once: ``root_factor sqrt(2 squares ln(1/delta')) + drift`` with
    ``root_factor^2 squares = sum eps_i^2`` and ``drift = sum eps_i (e^{eps_i} - 1)`` (identical steps keep
    ``eps0`` outside the root, ``eps0 sqrt(2k ln(1/delta'))``, as the bound is usually written)."""
    return root_factor * math.sqrt(2.0 * squares * math.log(1.0 / delta_prime)) + drift


def drv_terms(epsilon0: float, count: int = 1) -> tuple[float, float]:
    """What ``count`` steps of ``epsilon0`` add to DRV's two sums: ``(count eps0^2, count eps0 (e^eps0 - 1))``
    (no argument checks: the streaming accountant's fast path)."""
    return count * epsilon0 * epsilon0, count * epsilon0 * math.expm1(epsilon0)


def drv_from_sums(sum_squares: float, sum_drift: float, delta_prime: float) -> float:
    """DRV epsilon from running sums ``sum eps_i^2`` and ``sum eps_i (e^{eps_i} - 1)`` (:func:`drv_terms`) at
    slack ``0 < delta_prime < 1`` (no argument checks: the streaming accountant's fast path)."""
    return _drv(1.0, sum_squares, sum_drift, delta_prime)


def drv(epsilons, delta_prime: float) -> float:
    """Heterogeneous advanced composition epsilon for slack ``delta_prime`` (the steps' deltas add on top)."""
    delta_prime = check_real("delta_prime", delta_prime, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    eps = np.asarray(epsilons, dtype=np.float64)
    return float(drv_from_sums(float(np.sum(eps**2)), float(np.sum(eps * np.expm1(eps))), delta_prime))


def drv_epsilon(k: int, epsilon0: float, delta_prime: float) -> float:
    """DRV epsilon of ``k`` identical ``epsilon0``-DP steps at slack ``delta_prime``:
    ``eps0 sqrt(2k ln(1/delta')) + k eps0 (e^eps0 - 1)`` (the steps' deltas add on top)."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta_prime = check_real("delta_prime", delta_prime, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    return _drv(epsilon0, k, drv_terms(epsilon0, k)[1], delta_prime)


def kov(epsilon0: float, delta0: float, k: int, total_delta: float, *, cache: bool = True) -> float:
    """Optimal epsilon for ``k`` identical ``(epsilon0, delta0)`` steps at total delta on KOV's grid (Thm 3.3):
    the smallest ``eps0 (k - 2i)`` whose exact optimal delta fits :func:`pure_part_delta`.

    Returns ``inf`` when no epsilon reaches ``total_delta`` (``total_delta`` below ``1 - (1 - delta0)^k``).
    ``cache``: as in :func:`optimal_epsilon`.  A grid point's delta is compared with the target without the
    ``DELTA_SAFETY`` margin (dp-accounting's test has none either): only where that delta lies within rounding of the
    target can the value be one grid step low, which the advanced accountant guards against (it drops a KOV
    value below its safely rounded optimum).
    """
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    k = check_int("k", k, minimum=0)
    total_delta = check_real("total_delta", total_delta, minimum=0.0, maximum=1.0)
    if k == 0:
        return 0.0
    target = pure_part_delta(k, delta0, total_delta)
    if target < 0.0:
        return math.inf
    if epsilon0 == 0.0:
        return 0.0
    weights, losses = _law(k, epsilon0, cache)

    def fits(i: int) -> bool:  # grid point i reaches the target (KOV's delta_i is the exact delta there)
        return _delta_from_law(weights, losses, epsilon0 * (k - 2 * i)) <= target

    # Start at the grid point just above the continuous optimum, then step to the exact smallest one.
    exact = _bisect_epsilon(weights, losses, k * epsilon0, target)
    i = max(0, min(k // 2, math.floor((k - exact / epsilon0) / 2.0 + 1e-9)))
    while i > 0 and not fits(i):
        i -= 1
    while i < k // 2 and fits(i + 1):
        i += 1
    return epsilon0 * (k - 2 * i)


def _loss_law(k: int, epsilon0: float) -> tuple[np.ndarray, np.ndarray]:
    """The privacy loss law of ``k`` binary randomized-response steps: ``(weights, losses)`` with
    ``losses = eps0 (k - 2i)``, ``i ~ Bin(k, 1/(1 + e^eps0))``; outcomes whose weight underflows to zero
    (they contribute nothing) are left out, which keeps the arrays short for large ``k``."""
    i = np.arange(k + 1)
    weights = stats.binom.pmf(i, k, 1.0 / (1.0 + math.exp(epsilon0)))
    keep = weights > 0.0
    return weights[keep], epsilon0 * (k - 2 * i[keep])


_cached_loss_law = functools.lru_cache(maxsize=256)(_loss_law)


def _law(k: int, epsilon0: float, cache: bool) -> tuple[np.ndarray, np.ndarray]:
    return _cached_loss_law(k, epsilon0) if cache else _loss_law(k, epsilon0)


def pure_optimal_delta(k: int, epsilon0: float, epsilon: float) -> float:
    """Exact smallest delta for which ``k`` adaptive ``epsilon0``-DP steps are ``(epsilon, delta)``-DP."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    if k == 0 or epsilon0 == 0.0:
        return 0.0
    weights, losses = _law(k, epsilon0, True)
    return _delta_from_law(weights, losses, epsilon)


def pure_optimal_epsilon(k: int, epsilon0: float, delta: float) -> float:
    """Smallest epsilon (bisection to 1e-12, from above) with :func:`pure_optimal_delta` at most ``delta``;
    a candidate is accepted only when its delta, enlarged by ``DELTA_SAFETY``, is at most ``delta``
    (:func:`optimal_epsilon` with ``delta0 = 0``)."""
    return optimal_epsilon(k, epsilon0, 0.0, delta)


def _delta_from_law(weights: np.ndarray, losses: np.ndarray, epsilon: float) -> float:
    # Only losses above epsilon contribute; clipping the exponent at 0 is exact and avoids overflow.
    return float(np.sum(weights * -np.expm1(np.minimum(epsilon - losses, 0.0))))


def _bisect_epsilon(weights: np.ndarray, losses: np.ndarray, top: float, delta: float) -> float:
    """Smallest epsilon in ``[0, top]`` (to 1e-12 relative, from above) whose delta under the loss law
    ``(weights, losses)``, times ``1 + DELTA_SAFETY``, is at most ``delta`` (``top`` itself always is: no
    loss exceeds it)."""

    def fits(eps: float) -> bool:
        return _delta_from_law(weights, losses, eps) * (1.0 + DELTA_SAFETY) <= delta

    if fits(0.0):
        return 0.0
    lo, hi = 0.0, top
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def pure_part_delta(k: int, delta0: float, delta: float) -> float:
    """A lower bound (to rounding) on ``1 - (1 - delta) / (1 - delta0)^k``: the delta the pure part of ``k``
    identical ``(eps0, delta0)`` steps may spend at total ``delta``.  Negative when nothing is left.

    The target is ``-expm1(x)`` with ``x = ln((1 - delta) / (1 - delta0)^k) = b - a``,
    ``a = -log1p(-delta)``, ``b = -k log1p(-delta0)`` (no cancellation in ``(1 - delta0)^k``).  The rounding
    of ``x`` is at most ``4 u (a + b)`` (``u = 2^-52``; each ``log1p``, the product and the difference round
    once), so ``x + 4 u (a + b)`` bounds the exact exponent from above, and ``-expm1`` of it, shrunk by
    ``2 u`` for its own rounding, bounds the target from below.
    """
    k = check_int("k", k, minimum=0)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    if k == 0 or delta0 == 0.0:
        return delta
    if delta >= 1.0:
        return 1.0
    if delta0 >= 1.0:
        return -1.0
    a = -math.log1p(-delta)
    b = -k * math.log1p(-delta0)
    x = (b - a) + 4.0 * _ULP * (a + b)
    if x > 0.0:
        return -1.0
    return min(1.0, -math.expm1(x) * (1.0 - 2.0 * _ULP))


#: The most steps whose exact privacy-loss law (``k + 1`` binomial weights) :func:`optimal_epsilon` builds: about
#: a second and a few hundred MB.  Beyond it, it answers with the smaller of two valid upper bounds of the
#: optimal value, DRV (at the pure part's delta) and basic composition: more than the exact value, never less.
#: (A boundary-wrapped mechanism at a large epsilon has a tiny ``q``, and one target hit then needs billions
#: of private draws.)
MAX_EXACT_STEPS = 2**22


def optimal_epsilon(k: int, epsilon0: float, delta0: float, delta: float, *, cache: bool = True) -> float:
    """Optimal epsilon of ``k`` identical ``(epsilon0, delta0)`` steps at total ``delta`` (continuous, never
    below the exact value; ``inf`` when ``delta`` does not even cover ``1 - (1 - delta0)^k``).  Above
    :data:`MAX_EXACT_STEPS` steps, an upper bound of it (DRV or basic composition, whichever is smaller).

    ``cache=False`` does not keep the ``k + 1`` binomial weights in the module's small LRU cache (for a caller
    that asks for a new ``k`` every time, like a budgeted accountant); the value is the same.
    """
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    target = pure_part_delta(k, delta0, delta)
    if target < 0.0:
        return math.inf
    if k == 0 or epsilon0 == 0.0:
        return 0.0
    if k > MAX_EXACT_STEPS:
        basic = k * epsilon0
        return min(basic, drv_epsilon(k, epsilon0, target)) if 0.0 < target < 1.0 else basic
    weights, losses = _law(k, epsilon0, cache)
    return _bisect_epsilon(weights, losses, k * epsilon0, target)
