"""Composition bounds for (epsilon, delta)-DP steps (spec section 6).

* :func:`basic`: ``(sum eps_i, sum delta_i)``.
* :func:`drv`: heterogeneous advanced composition (Dwork, Rothblum, Vadhan 2010; Dwork-Roth Thm 3.20 and
  its heterogeneous form): for any ``delta' > 0`` the composition is ``(eps', sum delta_i + delta')``-DP with
  ``eps' = sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^{eps_i} - 1)``.
* :func:`kov`: the optimal bound for ``k`` identical ``(eps0, delta0)`` steps (Kairouz, Oh, Viswanath 2015,
  Thm 3.3), taken from ``dp_accounting.pld.accountant.advanced_composition``; its values lie on a grid
  of step ``2 eps0``.
* :func:`pure_optimal_delta` / :func:`pure_optimal_epsilon`: the exact optimal composition of ``k`` pure
  ``eps0``-DP steps with a continuous ``eps'`` (the worst pair is binary randomized response, so the
  privacy loss is ``eps0 (k - 2I)``, ``I ~ Bin(k, 1/(1 + e^{eps0}))``); equals KOV at its grid points.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from pate_accountant.validation import check_int, check_real

__all__ = ["basic", "drv", "kov", "pure_optimal_delta", "pure_optimal_epsilon"]


def basic(epsilons, deltas) -> tuple[float, float]:
    """Basic composition: the sums."""
    return float(np.sum(epsilons)), float(min(1.0, np.sum(deltas)))


def drv(epsilons, delta_prime: float) -> float:
    """Heterogeneous advanced composition epsilon for slack ``delta_prime`` (the steps' deltas add on top)."""
    delta_prime = check_real("delta_prime", delta_prime, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    eps = np.asarray(epsilons, dtype=np.float64)
    return float(math.sqrt(2.0 * math.log(1.0 / delta_prime) * float(np.sum(eps**2))) + float(np.sum(eps * np.expm1(eps))))


def kov(epsilon0: float, delta0: float, k: int, total_delta: float) -> float:
    """Optimal epsilon for ``k`` identical ``(epsilon0, delta0)`` steps at total delta (KOV Thm 3.3).

    Returns ``inf`` when no epsilon on the grid reaches ``total_delta`` (for example ``total_delta <= k delta0``).
    """
    from dp_accounting.pld import accountant as pld_accountant
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    k = check_int("k", k, minimum=0)
    total_delta = check_real("total_delta", total_delta, minimum=0.0, maximum=1.0)
    if k == 0:
        return 0.0
    result = pld_accountant.advanced_composition(DifferentialPrivacyParameters(epsilon0, delta0), k, total_delta)
    return math.inf if result is None else float(result)


@functools.lru_cache(maxsize=256)
def _loss_law(k: int, epsilon0: float) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(k + 1)
    weights = stats.binom.pmf(i, k, 1.0 / (1.0 + math.exp(epsilon0)))
    return weights, epsilon0 * (k - 2 * i)


def pure_optimal_delta(k: int, epsilon0: float, epsilon: float) -> float:
    """Exact smallest delta for which ``k`` adaptive ``epsilon0``-DP steps are ``(epsilon, delta)``-DP."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    if k == 0 or epsilon0 == 0.0:
        return 0.0
    weights, losses = _loss_law(k, epsilon0)
    # Only losses above epsilon contribute; clipping the exponent at 0 is exact and avoids overflow.
    return float(np.sum(weights * -np.expm1(np.minimum(epsilon - losses, 0.0))))


def pure_optimal_epsilon(k: int, epsilon0: float, delta: float) -> float:
    """Exact smallest epsilon (to 1e-12) with :func:`pure_optimal_delta` at most ``delta``."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    if k == 0 or epsilon0 == 0.0 or pure_optimal_delta(k, epsilon0, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, k * epsilon0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        if pure_optimal_delta(k, epsilon0, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi
