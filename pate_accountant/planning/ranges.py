"""The ranges, defaults and argument checks of budget planning (docs/planning.md, docs/ranges.md).

* the defaults every planner shares: the aggregator's ``delta0`` of the paper's ``C_delta = 2 ln(1/delta0)``
  (Section "Privacy analysis considerations") and the share of ``delta`` reserved for per-query deltas;
* the documented ranges (docs/ranges.md): a budget epsilon in ``(0, MAX_BUDGET_EPSILON]``, ``eps0`` in
  ``[MIN_EPS0, MAX_EPS0]``, ``q`` in ``[MIN_Q, 1]``, and the limits on the work one plan may do
  (``MAX_SEARCH_STEPS``, ``MAX_BOUND_DRAWS``, ``MAX_PLAN_QUERIES``), with :func:`estimated_steps`, which judges a
  search before it starts;
* the argument checks the planners share (``TypeError`` / ``ValueError`` naming the parameter);
* ``_Result``, the base of every planning result: ``.as_dict()`` gives a JSON-able dict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
from scipy.special import log_ndtr, ndtr

from pate_accountant.tct import wrapped_query_delta
from pate_accountant.validation import (
    MAX_STEP_EPSILON,
    check_delta,
    check_epsilon,
    check_int,
    check_real,
)

#: Default delta0 of the aggregator in the paper's ``C_delta = 2 ln(1/delta0)``.
DEFAULT_AGGREGATOR_DELTA = 1e-6
#: Default share of ``delta`` reserved for the per-query weights of an approximate inner (the same default as
#: ``TargetChargingAccountant(query_delta_share=0.5)``).
DEFAULT_QUERY_DELTA_SHARE = 0.5

# -- documented ranges (docs/ranges.md) --------------------------------------------------------------------
#: The largest total budget epsilon a plan takes: nothing is private at 300 (``e^-300``), and ``plan_for_tokens``
#: may try a per-query level up to twice the budget, whose ``e^{eps0}`` must stay finite (float64: ``e^709``).
MAX_BUDGET_EPSILON = 300.0
#: ``eps0`` (a query's privacy level) lies in ``[MIN_EPS0, MAX_EPS0]``: the per-run range of a mechanism
#: (:data:`pate_accountant.validation.MAX_STEP_EPSILON`), and above float64's smallest normal numbers so that
#: ``C_delta / eps0`` stays finite.
MAX_EPS0 = MAX_STEP_EPSILON
MIN_EPS0 = 1e-300
#: The smallest ``q`` of a q-target: one hit alone needs about ``ln(1/beta) / q`` private draws (up to 7 x 10^5
#: at ``delta = 1e-300``), composed exactly.
MIN_Q = 1e-3
#: ``compare --queries``: the exact optimal composition of ``k`` steps holds a law of ``k + 1`` float64 weights
#: (80 MB and about 2 s at 10^7).
MAX_PLAN_QUERIES = 10**7
#: The most private draws one evaluation of the TCT bound composes (``hits / q``): 8 tail splits, each an exact
#: law of that many steps (about 4 s at 3 x 10^6).
MAX_BOUND_DRAWS = 3 * 10**6
#: The most ``eps0``-DP steps a search may reach (:func:`estimated_steps` of the budget): a search (the hit
#: limit, the plain query limit, the calibration of ``plan_for_tokens``) evaluates exact compositions about 40
#: times, about half a minute on a 2-core machine at this limit.
MAX_SEARCH_STEPS = 3 * 10**5
#: The smallest positive ``target_rate``: the queries a budget affords grow like ``hits / rate`` (and, per
#: teacher, ``n / rate``), which must stay well inside float64.
MIN_TARGET_RATE = 1e-12


# -- results ---------------------------------------------------------------------------------------------


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Result:
    """Mixin: ``as_dict()`` gives a JSON-able dict (``inf``/``nan`` become ``None``)."""

    def as_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


# -- validation helpers ----------------------------------------------------------------------------------


_BUDGET_WHY = "a larger budget promises nothing, and the plans' e^epsilon terms must stay finite; docs/ranges.md"


def _check_budget(epsilon, delta, name: str = "epsilon") -> tuple[float, float]:
    epsilon = check_epsilon(name, epsilon, maximum=MAX_BUDGET_EPSILON, why=_BUDGET_WHY)
    delta = check_delta("delta", delta)
    return epsilon, delta


def _check_eps0(eps0) -> float:
    eps0 = check_epsilon("eps0", eps0, maximum=MAX_EPS0, why="the per-run range of a mechanism; docs/ranges.md")
    if eps0 < MIN_EPS0:
        raise ValueError(f"eps0 must lie in [{MIN_EPS0:g}, {MAX_EPS0:g}], got {eps0:g} (C_delta/eps0 must stay finite)")
    return eps0


def _check_q(name: str, q) -> float:
    q = check_real(name, q, minimum=0.0, maximum=1.0, min_open=True)
    if q < MIN_Q:
        raise ValueError(f"{name} must lie in [{MIN_Q:g}, 1], got {q:g} (one target hit alone needs about "
                         f"ln(1/delta)/{name} private draws; docs/ranges.md)")
    return q


def _size(value) -> str:
    """A count or a float size for a message: exact up to ``10^15``, else three digits (``inf`` in words)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 10**15:
            return str(value)
        return f"{float(value):.3g}" if value < 10**300 else f"about 1e{len(str(value)) - 1}"
    return f"{value:.3g}" if math.isfinite(value) else "more than 1e308"


def _check_count(name: str, value, minimum: int, maximum: int, why: str) -> int:
    """An integer in ``[minimum, maximum]``; the message names the range and ``why``."""
    value = check_int(name, value, minimum=minimum)
    if value > maximum:
        raise ValueError(f"{name} must lie in [{minimum}, {maximum}], got {_size(value)} ({why}; docs/ranges.md)")
    return value


def _gdp_delta(epsilon: float, mu: float) -> float:
    """The tight delta at ``epsilon`` of the Gaussian (mu-GDP) privacy loss ``N(mu^2/2, mu^2)``."""
    with np.errstate(all="ignore"):
        return float(ndtr(-epsilon / mu + mu / 2.0) - math.exp(epsilon + float(log_ndtr(-epsilon / mu - mu / 2.0))))


def estimated_steps(epsilon: float, delta: float, eps0: float) -> float:
    """About how many ``eps0``-DP steps compose within ``(epsilon, delta)`` under exact optimal composition: the
    central-limit (Gaussian DP) approximation ``(mu / eps0)^2``, ``mu`` the largest GDP parameter whose delta at
    ``epsilon`` is at most ``delta``, and at least ``epsilon / eps0`` (basic composition).  An estimate, not a
    bound (within 10% of the exact plain query limit for ``eps0 <= 0.1``; ``tests/test_robustness.py``): the
    planners refuse a search whose estimate exceeds :data:`MAX_SEARCH_STEPS` before it starts.  ``inf`` when
    it does not fit a float."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    eps0 = check_real("eps0", eps0, minimum=0.0, min_open=True)
    lo, hi = 0.0, 1.0
    while _gdp_delta(epsilon, hi) <= delta:  # delta -> 1 as mu grows: this stops
        lo, hi = hi, 2.0 * hi
    if lo == 0.0:
        lo = hi / 2.0
        while lo > 1e-300 and _gdp_delta(epsilon, lo) > delta:
            hi, lo = lo, lo / 2.0
        if lo <= 1e-300:
            lo = 0.0
    for _ in range(80):
        middle = (lo + hi) / 2.0
        if _gdp_delta(epsilon, middle) <= delta:
            lo = middle
        else:
            hi = middle
    ratio = hi / eps0
    return max(ratio * ratio, epsilon / eps0)


def _check_search(epsilon: float, delta: float, eps0: float, name: str = "epsilon") -> None:
    """Refuse, before it starts, a search over the hits or queries ``(epsilon, delta)`` buys at level ``eps0``
    when it would compose more than :data:`MAX_SEARCH_STEPS` steps (:func:`estimated_steps`)."""
    steps = estimated_steps(epsilon, delta, eps0)
    if steps > MAX_SEARCH_STEPS:
        raise ValueError(
            f"eps0 = {eps0:g} with {name} = {epsilon:g} (delta {delta:g}) lets {_size(steps)} eps0-DP steps "
            f"compose within the budget, above the planning limit of {MAX_SEARCH_STEPS:.0e}: the plan would evaluate "
            f"exact compositions of that many steps (about half a minute at the limit); choose a larger eps0 or a "
            f"smaller {name} (docs/ranges.md)"
        )


def _check_bound_draws(num_queries: int, rate: float, hits: int, q: float, q_name: str, what: str) -> None:
    """Refuse one TCT bound evaluation whose private draws (about ``hits / q``) exceed :data:`MAX_BOUND_DRAWS`."""
    if hits / q > MAX_BOUND_DRAWS:
        raise ValueError(
            f"num_queries = {num_queries} at target_rate {rate:g} gives {what} {hits} target hits; at {q_name} = "
            f"{q:.4g} the TCT bound composes about {hits / q:.3g} private draws, above the limit "
            f"{MAX_BOUND_DRAWS:.0e} (exact compositions of that many steps); plan fewer queries or a lower target "
            "rate (docs/ranges.md)"
        )


def _check_delta0(delta0, delta) -> float:
    """``delta0`` as a per-query delta of plain composition: ``0 <= delta0 < delta``."""
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0, max_open=True)
    if delta0 >= delta:
        raise ValueError(f"delta0 must be < delta (the per-step delta adds up inside the total), got {delta0} >= {delta}")
    return delta0


def _check_share(share) -> float:
    return check_real("query_delta_share", share, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


def _check_inner_delta(delta0, delta, share) -> float:
    """``delta0`` as the ``delta_A`` of a wrapped approximate inner: at least one query must fit the reserve."""
    delta0 = _check_delta0(delta0, delta)
    if delta0 > 0.0:
        w = wrapped_query_delta(delta0)
        if math.floor(share * delta / w) < 1:
            raise ValueError(
                f"delta0 = {delta0:g} leaves no query: every query of a wrapped (eps_A, delta_A = delta0) inner pays "
                f"w = 1 - (1 - delta0)^2 = {w:.3g} in delta, more than the {share:g} share of delta = {delta:g} "
                f"reserved for the per-query deltas ({share * delta:.3g}); choose delta0 <= about "
                f"{share * delta / 2:.3g}"
            )
    return delta0
