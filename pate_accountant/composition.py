"""Composition bounds for (epsilon, delta)-DP steps.

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
    "basic",
    "drv",
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
    return _delta_from_law(weights, losses, epsilon)


def pure_optimal_epsilon(k: int, epsilon0: float, delta: float) -> float:
    """Smallest epsilon (bisection to 1e-12, from above) with :func:`pure_optimal_delta` at most ``delta``;
    a candidate is accepted only when its delta, enlarged by ``DELTA_SAFETY``, is at most ``delta``."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    if k == 0 or epsilon0 == 0.0:
        return 0.0
    weights, losses = _loss_law(k, epsilon0)
    return _bisect_epsilon(weights, losses, k * epsilon0, delta)


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


def optimal_epsilon(k: int, epsilon0: float, delta0: float, delta: float) -> float:
    """Optimal epsilon of ``k`` identical ``(epsilon0, delta0)`` steps at total ``delta`` (continuous, never
    below the exact value; ``inf`` when ``delta`` does not even cover ``1 - (1 - delta0)^k``)."""
    k = check_int("k", k, minimum=0)
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    target = pure_part_delta(k, delta0, delta)
    if target < 0.0:
        return math.inf
    if k == 0 or epsilon0 == 0.0:
        return 0.0
    weights, losses = _loss_law(k, epsilon0)
    return _bisect_epsilon(weights, losses, k * epsilon0, target)
