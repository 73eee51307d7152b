"""The Target-Charging Technique (TCT) bound (paper, "Privacy analysis considerations"; Cohen and Lyu,
"The Target-Charging Technique for Privacy Analysis across Interactive Computations", NeurIPS 2023).

Setting: an adaptive sequence of queries; query ``i``, on every neighbouring pair of data sets, splits as
``M_i(D_b) = p C + (1 - p) B_b`` with a shared part ``C`` and parts ``B_0, B_1`` that are
``eps0``-indistinguishable and put probability at least ``q`` on the target set (a *q-target at level
eps0*).  The interaction halts at the ``tau``-th target hit.  Each "private draw" (a draw from ``B_b``)
hits with probability at least ``q`` whatever happened before, so the number ``K`` of private draws needed
for ``tau`` hits satisfies ``P[K > k] <= P[Bin(k, q) <= tau - 1]`` (a negative-binomial tail).  Truncating
at ``k`` private draws gives a ``k``-fold adaptive composition of ``eps0``-DP steps, at the price of the
tail probability in delta:

    eps'(tau) = min over beta of eps_comp(k_beta; eps0, delta - beta),
    k_beta = min{k : P[Bin(k, q) <= tau - 1] <= beta},

with ``eps_comp`` the exact optimal composition of pure steps (or DRV advanced composition), and ``beta``
searched over a fixed set of fractions of ``delta``.  This is the bound for *pure* q-target queries only.
Approximate-DP queries are charged through a per-query mixture weight (:func:`wrapped_query_delta`,
:func:`query_delta_epsilon`): a query that is a q-target query only after removing a mixture weight
``w_i`` costs ``w_i`` in delta on every run, hit or not, and the total ``Delta = sum w_i`` adds
``(ln(1/(1 - Delta)), Delta)`` to the pure bound.  (Earlier versions charged a per-*private-draw* delta
inside the bound instead; that under-counts, because every query of an approximate inner pays, not only
the bounded number of private draws.)  :func:`target_charging_split` splits a budget between the two
parts, once, for the accountant and for planning alike.  The derivation is in
``docs/tct_and_individual.md`` (section 1).  The bound is our own proof along the lines of the TCT paper;
the paper's full text was not available to us, so its constants may be tighter than ours.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

from scipy import stats

from pate_accountant.composition import drv_epsilon, pure_optimal_epsilon
from pate_accountant.validation import check_int, check_real

__all__ = [
    "MAX_EPSILON_FOR_ONE_THIRD",
    "MAX_PRIVATE_DRAWS",
    "NO_LIMIT",
    "QUERY_DELTA_ROUNDING",
    "SPLITS",
    "TargetChargingSplit",
    "between_thresholds_q_limit",
    "boundary_wrapper_q",
    "check_composition",
    "query_delta_epsilon",
    "largest_fitting",
    "negative_binomial_tail",
    "private_draws_needed",
    "tct_details",
    "tct_epsilon",
    "tct_max_hits",
    "target_charging_split",
    "tct_splits",
    "wrapped_event_terms",
    "wrapped_query_delta",
]

#: Fractions of delta tried for the tail ``beta`` (the rest goes to the composition).
SPLITS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
COMPOSITIONS = ("optimal", "drv")
#: The most private draws a TCT bound is computed for (float64 counts integers exactly up to here).  A query
#: class whose hits need more (a boundary-wrapped mechanism at a large epsilon has ``q`` near ``e^-2eps``) has
#: an infinite bound: it charges everything, never less than the truth.
MAX_PRIVATE_DRAWS = 2**53
#: The query limit of a pure class (no per-query weight): no limit (a plain integer keeps the check one
#: comparison in the accountant's fast path).
NO_LIMIT = sys.maxsize
#: The relative amount by which the accountant rounds the total per-query weight ``Delta`` up (float
#: rounding of the sum); :func:`target_charging_split` keeps the rounded ``Delta`` within the reserve.
QUERY_DELTA_ROUNDING = 1e-12


#: The largest ``eps_A`` for which the boundary wrapper's target is a ``1/3``-target at level ``2 eps_A``:
#: the root of ``(E + 1) / (2 E^2 + E + 2) = 1/3``, ``E = (1 + sqrt 3) / 2``.
MAX_EPSILON_FOR_ONE_THIRD = math.log((1 + math.sqrt(3)) / 2)


def boundary_wrapper_q(eps_a: float) -> float:
    """The ``q`` of the boundary wrapper's target at level ``2 eps_A`` for an ``eps_A``-DP inner mechanism:
    ``min(1/3, (E + 1) / (2 E^2 + E + 2))`` with ``E = e^{eps_A}`` (exactly ``1/3`` up to
    :data:`MAX_EPSILON_FOR_ONE_THIRD`; ``docs/mechanisms/boundary_wrapper.md`` derives it)."""
    eps_a = check_real("eps_a", eps_a, minimum=0.0, min_open=True)
    e = math.exp(eps_a)
    return min(1.0 / 3.0, (e + 1) / (2 * e * e + e + 2))


def between_thresholds_q_limit(eps0: float) -> float:
    """The limit ``1 / (1 + e^{eps0})`` that the ``q`` of a BetweenThresholds query's ``between`` target at level
    ``eps0`` approaches as the gap grows, and never reaches: ``q = (1 - e^{-eps0 g'}) / (1 + e^{eps0})`` with
    ``g' = g`` for continuous Laplace noise and ``g' = g + 1`` for our discrete noise
    (docs/mechanisms/between_thresholds.md, "The q-target: derivation"), strictly below it for every gap.

    Computed as ``1.0 / (1.0 + math.exp(eps0))``, the float expression that the closed form of that ``q``
    divides by, so every ``q`` a BetweenThresholds mechanism certifies (the closed form, or less) is at most
    it and a ``q`` above it claims more than any BetweenThresholds gives (beyond float rounding of the closed
    form itself, a few units in the last place).  ``0.0`` once ``e^{eps0}`` overflows (every ``q`` refused)."""
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    try:
        return 1.0 / (1.0 + math.exp(eps0))
    except OverflowError:
        return 0.0


def wrapped_event_terms(eps_a: float, delta_a: float) -> tuple[float, float]:
    """The ``(epsilon, delta)`` guarantee of the boundary wrapper around an ``(eps_A, delta_A)``-DP inner
    mechanism, for composition accountants: ``(2 eps_A, 2 delta_A)`` when ``delta_A < e^{eps_A} - 1``
    (always, in practice), and ``(2 eps_A, min(1, (2 + e^{eps_A}) delta_A))`` otherwise.

    Proof sketch (docs/mechanisms/boundary_wrapper.md).  Write ``a = 1 - pi`` for the mass outside the most
    likely inner outcome; the wrapper outputs the target with ``t(a) = a / (1 + a)`` and outcome ``y`` with
    ``P(y) / (1 + a)``.  For an ``(eps, delta)`` pair ``(P, Q)``: ``a_P <= e^eps a_Q + delta``, and ``t`` is
    increasing with slope at most one, so ``t(a_P) <= e^eps t(a_Q) + delta``; when ``delta < e^eps - 1`` also
    ``1 + a_Q <= e^eps (1 + a_P)``, so every ``y`` term is at most ``e^{2 eps}`` times its counterpart plus a
    share of ``delta``.  The hockey-stick divergence at ``e^{2 eps}`` is at most ``delta + delta``.
    """
    eps_a = check_real("eps_a", eps_a, minimum=0.0)
    delta_a = check_real("delta_a", delta_a, minimum=0.0, maximum=1.0)
    if delta_a == 0.0:
        return 2.0 * eps_a, 0.0
    if delta_a < math.expm1(eps_a):
        return 2.0 * eps_a, min(1.0, 2.0 * delta_a)
    return 2.0 * eps_a, min(1.0, (2.0 + math.exp(eps_a)) * delta_a)


def wrapped_query_delta(delta_a: float) -> float:
    """The per-query delta a target-charging accountant pays for a boundary-wrapped ``(eps_A, delta_A)``
    inner mechanism: ``w = 1 - (1 - delta_A)^2 <= 2 delta_A``, on every query, hit or not.

    Why (docs/tct_and_individual.md, section 1): an ``(eps_A, delta_A)`` pair of inner laws splits as
    ``P = (1 - delta_A) P~ + delta_A E`` (and the same for ``Q``) with ``P~, Q~`` pure
    ``eps_A``-indistinguishable (Kairouz, Oh and Viswanath's reduction of every ``(eps, delta)`` pair to
    the four-outcome canonical pair); the wrapper maps ``P >= (1 - u) P~`` to
    ``W(P) >= (1 - u)^2 W(P~)``; and ``W(P~), W(Q~)`` have a ``q``-target at level ``2 eps_A``.  So each
    wrapped query is, up to a mixture weight ``w``, a pure q-target query.
    """
    delta_a = check_real("delta_a", delta_a, minimum=0.0, maximum=1.0)
    if delta_a == 0.0:
        return 0.0
    return min(1.0, -math.expm1(2.0 * math.log1p(-delta_a))) if delta_a < 1.0 else 1.0


def query_delta_epsilon(query_delta: float) -> float:
    """The epsilon term ``ln(1 / (1 - Delta))`` that a total per-query mixture weight ``Delta`` adds to the
    TCT bound (docs/tct_and_individual.md, section 1): ``inf`` at ``Delta >= 1``."""
    query_delta = check_real("query_delta", query_delta, minimum=0.0)
    if query_delta >= 1.0:
        return math.inf
    return -math.log1p(-query_delta)


def negative_binomial_tail(hits: int, q: float, k: int) -> float:
    """``P[Bin(k, q) <= hits - 1]``: the chance that ``k`` private draws give fewer than ``hits`` hits."""
    return float(stats.binom.cdf(hits - 1, k, q))


@functools.lru_cache(maxsize=4096)
def private_draws_needed(hits: int, q: float, beta: float) -> int:
    """Smallest ``k >= hits`` with ``P[Bin(k, q) <= hits - 1] <= beta``; ``MAX_PRIVATE_DRAWS + 1`` when it is
    known to exceed :data:`MAX_PRIVATE_DRAWS`."""
    hits = check_int("hits", hits, minimum=0)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    beta = check_real("beta", beta, minimum=0.0, maximum=1.0, min_open=True)
    if hits == 0:
        return 0
    if hits > 2 * q * MAX_PRIVATE_DRAWS and beta < 0.5:
        # Bin(MAX, q) has mean below hits / 2, so (Markov) it stays below hits with chance at least 1/2 > beta:
        # more than MAX_PRIVATE_DRAWS draws are needed.
        return MAX_PRIVATE_DRAWS + 1
    if negative_binomial_tail(hits, q, hits) <= beta:
        return hits
    # One more than the largest k whose tail still exceeds beta; the first probe is at 2 hits / q + 10 (about
    # twice the mean number of draws), so that the search usually bisects below it at once.
    first_step = max(1, int(2 * hits / q) + 10 - hits)
    return largest_fitting(lambda k: negative_binomial_tail(hits, q, k) > beta, start=hits, step=first_step) + 1


def tct_splits(hits: int, q: float, delta: float):
    """The delta splits the TCT bound tries: ``(fraction, k, slack)`` for each ``fraction`` of :data:`SPLITS`,
    with the tail ``beta = fraction * delta``, the truncation ``k = private_draws_needed(hits, q, beta)`` and
    the composition's share ``slack = delta - beta``."""
    for fraction in SPLITS:
        beta = fraction * delta
        yield fraction, private_draws_needed(hits, q, beta), delta - beta


@functools.lru_cache(maxsize=4096)
def _tct(hits: int, q: float, eps0: float, delta: float, composition: str) -> tuple[float, int, float]:
    best = (math.inf, 0, 0.0)
    if hits == 0:
        return (0.0, 0, 0.0)
    for fraction, k, slack in tct_splits(hits, q, delta):
        if k > MAX_PRIVATE_DRAWS:  # an infinite bound for this split
            continue
        if composition == "optimal":
            eps = pure_optimal_epsilon(k, eps0, slack)
        else:
            eps = drv_epsilon(k, eps0, slack)
        if eps < best[0]:
            best = (eps, k, fraction)
    return best


def check_composition(composition) -> str:
    """``composition`` if it is one of :data:`COMPOSITIONS` (``ValueError`` otherwise)."""
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    return composition


def _check_tct(hits, q, eps0, delta, composition) -> tuple[int, float, float, float]:
    hits = check_int("hits", hits, minimum=0)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    check_composition(composition)
    return hits, q, eps0, delta


def tct_epsilon(hits: int, q: float, eps0: float, delta: float, *, composition: str = "optimal") -> float:
    """The epsilon (at total ``delta``) after ``hits`` target hits of *pure* ``q``-target queries at level
    ``eps0`` (no per-query delta: add :func:`query_delta_epsilon` for approximate-DP queries)."""
    hits, q, eps0, delta = _check_tct(hits, q, eps0, delta, composition)
    return _tct(hits, q, eps0, delta, composition)[0]


def tct_details(hits: int, q: float, eps0: float, delta: float, *, composition: str = "optimal") -> dict:
    """:func:`tct_epsilon` with the truncation ``k`` and the delta split that achieved it."""
    hits, q, eps0, delta = _check_tct(hits, q, eps0, delta, composition)
    eps, k, fraction = _tct(hits, q, eps0, delta, composition)
    return {"epsilon": eps, "private_draws": k, "tail_fraction_of_delta": fraction}


def tct_max_hits(q: float, eps0: float, epsilon: float, delta: float, *, composition: str = "optimal") -> int:
    """The largest number of target hits whose :func:`tct_epsilon` stays within ``epsilon``."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    return largest_fitting(lambda h: tct_epsilon(h, q, eps0, delta, composition=composition) <= epsilon)


def _max_queries(reserved: float, query_delta: float) -> int:
    """``floor(reserved / w)``, less any query whose total ``Delta = m w``, rounded up as the accountant rounds
    it (``(m w)(1 + QUERY_DELTA_ROUNDING)``), would exceed ``reserved``."""
    m = int(math.floor(reserved / query_delta))
    if m >= 2**50:  # more queries than any run makes, and beyond exact integer steps in floats: a margin
        return min(NO_LIMIT, int(math.floor(reserved / (query_delta * (1.0 + 4.0 * QUERY_DELTA_ROUNDING)))))
    while m > 0 and not m * query_delta * (1.0 + QUERY_DELTA_ROUNDING) <= reserved:
        m -= 1
    return m


class TargetChargingSplit(NamedTuple):
    """What :func:`target_charging_split` splits a budget into (docs/tct_and_individual.md, section 1).

    ``max_hits``: the TCT hit limit at ``(epsilon_tct, delta_tct)``; ``max_queries``: how many queries, hits
    or not, the reserve pays for (:data:`NO_LIMIT` for a pure class); ``epsilon_tct``, ``delta_tct``: the
    budget of the pure TCT part; ``reserved``: ``Delta_max``, the delta reserved for the per-query weights
    (``0`` for a pure class).
    """

    max_hits: int
    max_queries: int
    epsilon_tct: float
    delta_tct: float
    reserved: float


def target_charging_split(
    epsilon: float,
    delta: float,
    eps0: float,
    q: float,
    query_delta: float = 0.0,
    *,
    share: float = 0.5,
    composition: str = "optimal",
) -> TargetChargingSplit:
    """Split a budget ``(epsilon, delta)`` once for ``q``-target queries at level ``eps0`` that each pay the
    mixture weight ``query_delta = w`` (:func:`wrapped_query_delta`; ``0`` for pure queries).

    * ``w > 0``: ``reserved = share * delta`` pays for ``max_queries = floor(reserved / w)`` queries, hit
      or not (one fewer where the accountant's rounded-up ``Delta`` of that many would exceed ``reserved``);
      the TCT part gets ``epsilon_tct = epsilon - ln(1/(1 - reserved))`` and ``delta_tct = delta - reserved``
      (each an ulp lower where needed, so that the reported sums never round above the budget).
    * ``w = 0``: no reserve, ``max_queries = NO_LIMIT``, the TCT part gets the whole budget.

    ``max_hits = tct_max_hits(q, eps0, epsilon_tct, delta_tct)`` (``0`` when ``epsilon_tct <= 0``).  Any
    transcript with at most ``max_hits`` hits and ``max_queries`` queries, halted at its last hit, is
    ``(epsilon, delta)``-DP by the theorem of docs/tct_and_individual.md, section 1.  This is the split
    :class:`~pate_accountant.accountants.target_charging.TargetChargingAccountant` makes at its first
    query, and the one :mod:`pate_accountant.planning` plans with.
    """
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    query_delta = check_real("query_delta", query_delta, minimum=0.0, maximum=1.0)
    share = check_real("share", share, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    check_composition(composition)
    if query_delta > 0.0:
        reserved = share * delta
        max_queries = _max_queries(reserved, query_delta)
        spare = query_delta_epsilon(reserved)
        epsilon_tct = epsilon - spare
        # Float safety: any bound tct <= epsilon_tct plus ln(1/(1 - Delta)) for Delta <= reserved must round to
        # at most epsilon (fl(a + b) is monotone in a and b); step down by ulps where fl(epsilon_tct + spare)
        # would round above epsilon.
        while epsilon_tct > 0.0 and epsilon_tct + spare > epsilon:
            epsilon_tct = math.nextafter(epsilon_tct, -math.inf)
    else:
        reserved, max_queries, epsilon_tct = 0.0, NO_LIMIT, epsilon
    delta_tct = delta - reserved
    while delta_tct + reserved > delta:  # the same for delta_tct + Delta (exact for share 1/2)
        delta_tct = math.nextafter(delta_tct, 0.0)
    max_hits = tct_max_hits(q, eps0, epsilon_tct, delta_tct, composition=composition) if epsilon_tct > 0.0 else 0
    return TargetChargingSplit(max_hits, max_queries, epsilon_tct, delta_tct, reserved)


def largest_fitting(fits, start: int = 0, step: int = 1) -> int:
    """The largest integer ``k >= start`` with ``fits(k)``, for a predicate that holds up to some point and
    fails after it; ``fits(start)`` is taken to hold.  Gallops up from ``start`` (first probe at
    ``start + step``, the step doubling), then bisects.  The one integer search of the package: the TCT hit
    limit, the truncation ``k`` of :func:`private_draws_needed` and planning's query limits use it."""
    step = check_int("step", step, minimum=1)
    lo = start
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
