"""Truncated two-sided geometric noise and the optimal per-key release functions (spec sections 1-2).

* ``TG(eps, k)``: integer noise on ``{-k, ..., k}`` with ``P[X = x] = A e^{-eps |x|}``,
  ``A = (1 - e^{-eps}) / (1 + e^{-eps} - 2 e^{-eps (k+1)})`` (spec 1.1).
* ``k*(eps, delta) = (1/eps) ln((e^eps + 2 delta - 1) / (delta (e^eps + 1)))`` solves ``A(k) e^{-eps k} = delta``;
  the truncation is ``k = ceil(k*)`` and ``delta_eff = A(k) e^{-eps k} <= delta`` (spec 1.2).
* Thresholded noisy count (spec 1.2): a key with count ``c >= 1`` is released with value ``c + X`` iff
  ``c + X >= k + 1``; this is ``(eps, delta_eff)``-DP for one count changing by one (including 0 <-> 1),
  and its release probability equals the optimal reporting function ``pi(c; eps, delta_eff)``.
* ``pi*`` (spec 2.2): the largest per-key inclusion probability that obeys the DP recursion and a cap
  ``p(c)`` (a Poisson sampling rate).

Sampling is exact integer sampling by inverse CDF over the ``2k + 1`` support points (a float64 table;
no floating-point Laplace noise is drawn or rounded).
"""

from __future__ import annotations

import math

import numpy as np

from pate_accountant.events import NEIGHBOURING_RELATIONS, REPLACE_ONE
from pate_accountant.validation import check_int, check_real

__all__ = [
    "TruncatedGeometric",
    "delta_effective",
    "k_star",
    "optimal_inclusion",
    "per_count_budget",
    "truncation",
]


def _check_eps_delta(epsilon, delta) -> tuple[float, float]:
    epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    return epsilon, delta


def per_count_budget(epsilon: float, delta: float, relation: str = REPLACE_ONE) -> tuple[float, float]:
    """The per-count ``(eps_c, delta_c)`` of a total ``(epsilon, delta)`` (spec section 0).

    Replacing one teacher moves one vote, so two counts change by one: each count gets half the budget.
    Adding or removing a teacher changes one count: each count gets all of it.
    """
    epsilon, delta = _check_eps_delta(epsilon, delta)
    if relation not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {relation!r}")
    return (epsilon / 2, delta / 2) if relation == REPLACE_ONE else (epsilon, delta)


def k_star(epsilon: float, delta: float) -> float:
    """Real-valued truncation point solving ``A(k) e^{-eps k} = delta``; always below ``ln(1/delta)/eps``."""
    epsilon, delta = _check_eps_delta(epsilon, delta)
    return math.log((math.expm1(epsilon) + 2 * delta) / (delta * (math.exp(epsilon) + 1))) / epsilon


def truncation(epsilon: float, delta: float) -> int:
    """The integer truncation ``k = ceil(k*)`` (at least 0): the error bound ``L`` of the noisy counts."""
    return max(0, math.ceil(k_star(epsilon, delta) - 1e-12))


def _normaliser(epsilon: float, k: int) -> float:
    r = math.exp(-epsilon)
    return (1 - r) / (1 + r - 2 * r ** (k + 1))


def delta_effective(epsilon: float, k: int) -> float:
    """``A(k) e^{-eps k}``: the delta actually spent by ``TG(eps, k)`` with threshold ``k + 1``."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
    k = check_int("k", k, minimum=0)
    return _normaliser(epsilon, k) * math.exp(-epsilon * k)


class TruncatedGeometric:
    """The distribution ``TG(eps, k)`` on ``{-k, ..., k}``, with an exact table for pmf, cdf and sampling."""

    __slots__ = ("epsilon", "k", "_support", "_pmf", "_cdf")

    def __init__(self, epsilon: float, k: int):
        self.epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
        self.k = check_int("k", k, minimum=0)
        self._support = np.arange(-self.k, self.k + 1)
        weights = np.exp(-self.epsilon * np.abs(self._support))
        self._pmf = weights / weights.sum()
        self._cdf = np.cumsum(self._pmf)
        self._cdf[-1] = 1.0

    @property
    def support(self) -> np.ndarray:
        return self._support

    @property
    def normaliser(self) -> float:
        """``A``, the probability of 0."""
        return float(self._pmf[self.k])

    def pmf(self, x) -> np.ndarray:
        x = np.asarray(x)
        inside = np.abs(x) <= self.k
        return np.where(inside, self._pmf[np.clip(x + self.k, 0, 2 * self.k)], 0.0)

    def cdf(self, x) -> np.ndarray:
        """``P[X <= x]``."""
        x = np.asarray(x)
        index = np.clip(np.floor(x).astype(np.int64) + self.k, -1, 2 * self.k)
        return np.where(index < 0, 0.0, self._cdf[np.maximum(index, 0)])

    def sf(self, x) -> np.ndarray:
        """``P[X >= x]`` (note: ``>=``, the release event of a threshold)."""
        return 1.0 - self.cdf(np.ceil(np.asarray(x, dtype=np.float64)) - 1)

    def sample(self, rng: np.random.Generator, size=None) -> np.ndarray:
        """Exact integer draws by inverse CDF over the ``2k + 1`` support points."""
        uniforms = rng.random(size)
        return np.searchsorted(self._cdf, uniforms, side="right") - self.k


def optimal_inclusion(cap, epsilon: float, delta: float) -> np.ndarray:
    """``pi*`` for counts ``0 .. len(cap) - 1`` (spec 2.2): ``pi*(0) = 0`` and

    ``pi*(c) = min(cap[c], e^eps pi*(c-1) + delta, 1 - e^{-eps} (1 - pi*(c-1) - delta))``.

    With ``cap = 1`` everywhere this is the optimal reporting function ``pi(c; eps, delta)`` of
    DVGM22 / CGSS21, which equals the thresholded truncated-geometric release probability (spec 1.2).
    """
    epsilon, delta = _check_eps_delta(epsilon, delta)
    cap = np.asarray(cap, dtype=np.float64)
    if cap.ndim != 1 or cap.size == 0:
        raise ValueError(f"cap must be a non-empty 1-d array indexed by count, got shape {cap.shape}")
    if ((cap < 0) | (cap > 1)).any():
        raise ValueError("cap must hold probabilities in [0, 1]")
    e_pos, e_neg = math.exp(epsilon), math.exp(-epsilon)
    out = np.zeros(cap.size)
    previous = 0.0
    for c in range(1, cap.size):
        previous = min(cap[c], e_pos * previous + delta, 1.0 - e_neg * (1.0 - previous - delta), 1.0)
        out[c] = previous
    return out
