"""One run shape accounted three ways: plain composition of every query, target charging (TCT) and individual
(per-teacher) charging (docs/planning.md, docs/tct_and_individual.md).
"""

from __future__ import annotations

import dataclasses
import math

from pate_accountant.planning.bounds import PLAIN_METHODS, _tct_assumptions, c_delta, plain_epsilon, plain_max_queries
from pate_accountant.planning.ranges import (
    DEFAULT_AGGREGATOR_DELTA,
    DEFAULT_QUERY_DELTA_SHARE,
    MAX_PLAN_QUERIES,
    MIN_TARGET_RATE,
    _check_bound_draws,
    _check_budget,
    _check_count,
    _check_delta0,
    _check_eps0,
    _check_q,
    _check_search,
    _check_share,
    _Result,
)
from pate_accountant.tct import (
    check_composition,
    largest_fitting,
    query_delta_epsilon,
    target_charging_split,
    tct_epsilon,
    wrapped_query_delta,
)
from pate_accountant.validation import MAX_COUNT, check_delta, check_int, check_real


@dataclasses.dataclass(frozen=True)
class AccountingComparison(_Result):
    """What :func:`compare_accounting` returns.

    ``plain`` maps each plain composition method (and ``"best"``) to the epsilon of ``num_queries``
    ``(eps0, delta0)``-DP steps; ``target_charging`` is the TCT epsilon of ``hits`` target hits plus the
    per-query deltas: with ``Delta = total_query_delta = num_queries * per_query_delta``,
    ``tct_epsilon(hits, delta - Delta) + ln(1/(1 - Delta))`` (``inf`` when ``Delta >= delta``);
    ``individual_charging`` is the same for the worst teacher's ``charges_per_teacher``.  With a
    ``budget_epsilon``, ``max_queries`` maps ``"plain"``, ``"target_charging"`` and
    ``"individual_charging"`` to the number of queries of the same shape each accounting affords (the
    charging ones under :func:`pate_accountant.tct.target_charging_split`'s limits; ``None`` = unlimited).
    """

    num_queries: int
    eps0: float
    delta: float
    num_teachers: int
    target_rate: float
    charged_per_hit: int
    q: float
    individual_q: float
    delta0: float
    composition: str
    hits: int
    charges_per_teacher: int
    per_query_delta: float
    total_query_delta: float
    plain: dict
    target_charging: float
    individual_charging: float
    budget_epsilon: float | None
    max_queries: dict | None
    assumptions: tuple


# -- plain vs target vs individual charging --------------------------------------------------------------


def _hits(rate: float, num_queries: int) -> int:
    """Expected target hits of ``num_queries`` queries, rounded up (``1e-12`` forgives float noise)."""
    return math.ceil(rate * num_queries * (1 - 1e-12))


def _per_teacher(hits: int, charged_per_hit: int, num_teachers: int) -> int:
    """The worst teacher's charges when ``hits * charged_per_hit`` charges are spread evenly."""
    return min(hits, math.ceil(hits * charged_per_hit / num_teachers * (1 - 1e-12)))


def _charged_epsilon(hits: int, q: float, eps0: float, delta: float, query_delta: float, composition: str) -> float:
    """``tct_epsilon(hits, delta - Delta) + ln(1/(1 - Delta))`` with ``Delta = query_delta`` (``inf`` when
    ``Delta >= delta``; docs/tct_and_individual.md, section 1)."""
    if query_delta >= delta:
        return math.inf
    return tct_epsilon(hits, q, eps0, delta - query_delta, composition=composition) + query_delta_epsilon(query_delta)


def compare_accounting(
    num_queries: int,
    eps0: float,
    delta: float,
    num_teachers: int,
    target_rate: float,
    charged_per_hit: int | None = None,
    q: float = 1.0 / 3.0,
    individual_q: float | None = None,
    delta0: float = 0.0,
    composition: str = "optimal",
    aggregator_delta: float = DEFAULT_AGGREGATOR_DELTA,
    budget_epsilon: float | None = None,
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
) -> AccountingComparison:
    """One run shape accounted three ways, all at total ``delta``.

    * **plain**: every one of the ``num_queries`` queries is an ``(eps0, delta0)``-DP step; basic, DRV,
      KOV and exact optimal composition (:func:`plain_epsilon`), and the best of them.
    * **target charging**: ``hits = ceil(target_rate * num_queries)`` target hits (the expected number,
      rounded up) and :func:`pate_accountant.tct.tct_epsilon`.  With ``delta0 = delta_A > 0`` (a
      boundary-wrapped approximate inner) every query pays ``w = 1 - (1 - delta0)^2``: with
      ``Delta = num_queries * w`` the epsilon is ``tct_epsilon(hits, delta - Delta) + ln(1/(1 - Delta))``
      (``inf`` when ``Delta >= delta``).
    * **individual charging**: each hit charges ``charged_per_hit`` teachers (default
      ``min(num_teachers, ceil(C_delta / eps0))``, the paper's "about 2L teachers" with
      ``L = ln(1/delta0)/eps0``); assuming the charges are spread evenly, the worst teacher carries
      ``ceil(hits * charged_per_hit / num_teachers)`` (at most ``hits``) and its TCT epsilon (with
      ``individual_q``, default ``q``) is the per-teacher guarantee; every query pays the same ``w`` for
      every teacher, so the same ``Delta`` is added.

    ``budget_epsilon`` (optional) adds ``max_queries``: how many queries of this shape each accounting
    affords within ``(budget_epsilon, delta)``; the charging ones split that budget as a budgeted accountant
    does (:func:`pate_accountant.tct.target_charging_split`, ``query_delta_share`` of ``delta`` reserved for
    the per-query weights) and take the smaller of its hit and query limits.
    """
    k = _check_count("num_queries", num_queries, 0, MAX_PLAN_QUERIES,
                     "exact composition holds a law of num_queries + 1 weights")
    eps0 = _check_eps0(eps0)
    delta = check_delta("delta", delta)
    n = _check_count("num_teachers", num_teachers, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    rate = check_real("target_rate", target_rate, minimum=0.0, maximum=1.0)
    if 0.0 < rate < MIN_TARGET_RATE:
        raise ValueError(f"target_rate must be 0 or lie in [{MIN_TARGET_RATE:g}, 1], got {rate:g} (docs/ranges.md)")
    q = _check_q("q", q)
    individual_q = q if individual_q is None else _check_q("individual_q", individual_q)
    share = _check_share(query_delta_share)
    composition = check_composition(composition)
    aggregator_delta = check_delta("aggregator_delta", aggregator_delta)
    cd = c_delta(aggregator_delta)
    if charged_per_hit is None:
        g = min(n, math.ceil(cd / eps0 * (1 - 1e-12)))
    else:
        g = check_int("charged_per_hit", charged_per_hit, minimum=1, maximum=n)
    if budget_epsilon is not None:
        budget_epsilon, _ = _check_budget(budget_epsilon, delta, name="budget_epsilon")
        _check_search(budget_epsilon, delta, eps0, name="budget_epsilon")

    hits = _hits(rate, k)
    per_teacher = _per_teacher(hits, g, n)
    _check_bound_draws(k, rate, hits, q, "q", "target charging")
    _check_bound_draws(k, rate, per_teacher, individual_q, "individual_q", "individual charging (worst teacher)")
    delta0 = _check_delta0(delta0, delta)  # after the sizes: a comparison too large is refused as such
    plain = {m: plain_epsilon(k, eps0, delta, delta0=delta0, method=m) for m in PLAIN_METHODS}
    plain["best"] = min(plain.values())
    w = wrapped_query_delta(delta0)
    total_w = k * w  # Delta: every query pays w, hit or not
    target = _charged_epsilon(hits, q, eps0, delta, total_w, composition)
    individual = _charged_epsilon(per_teacher, individual_q, eps0, delta, total_w, composition)

    max_queries = None
    if budget_epsilon is not None:
        plain_k = max(plain_max_queries(eps0, budget_epsilon, delta, delta0=delta0, method=m) for m in PLAIN_METHODS)
        split = target_charging_split(budget_epsilon, delta, eps0, q, w, share=share, composition=composition)
        split_ind = target_charging_split(budget_epsilon, delta, eps0, individual_q, w, share=share,
                                          composition=composition)
        tau, tau_ind = split.max_hits, split_ind.max_hits
        if rate == 0.0:
            target_k = individual_k = None  # no query is ever charged for a hit: unlimited
        else:
            # Both predicates hold at K = 0 (no query, no hit) and are monotone in K.
            target_k = largest_fitting(lambda K: _hits(rate, K) <= tau)
            individual_k = largest_fitting(lambda K: _per_teacher(_hits(rate, K), g, n) <= tau_ind)
        if w > 0.0:  # ... but every query pays its weight: the split's query limit
            target_k = split.max_queries if target_k is None else min(target_k, split.max_queries)
            individual_k = split_ind.max_queries if individual_k is None else min(individual_k, split_ind.max_queries)
        max_queries = {"plain": plain_k, "target_charging": target_k, "individual_charging": individual_k}

    assumptions = [
        *_tct_assumptions(composition),
        ("plain: every query is charged as one (eps0, delta0)-DP step; 'best' is the smallest of the bounds. "
        "(As a plain step, a boundary wrapper around an (eps_A, delta_A) inner is (2 eps_A, 2 delta_A)-DP: "
        "pass that step's delta as delta0 for a like-for-like plain number.)"),
        (f"target charging: hits = ceil(target_rate * num_queries) = {hits}, the expected number of target "
        "hits rounded up (the realised number is random; the TCT accountant stops at the budgeted hit)."),
        f"individual charging: each hit charges charged_per_hit = {g} teachers"
        + (" (default min(n, ceil(C_delta/eps0)): the paper's 'about 2L teachers')" if charged_per_hit is None else "")
        + f"; charges spread evenly over the {n} teachers, so the worst teacher carries "
        f"ceil(hits g / n) = {per_teacher} charges (never more than hits). Teachers charged more often "
        "(skewed charges) would be removed earlier by an individual-charging accountant.",
        ("individual charging is stated under add/remove-one-teacher (docs/tct_and_individual.md section 4); under replace-one use eps0/2 "
        "per query or budget twice."),
    ]
    if delta0 == 0.0:
        assumptions.append(
            "delta0 = 0 (a pure inner): target and individual charging charge only hits; queries that do not hit "
            "are free."
        )
    else:
        assumptions.append(
            f"delta0 = {delta0:g} > 0 (the delta_A of a boundary-wrapped approximate inner): every query, hit or "
            f"not, pays w = 1-(1-delta0)^2 = {w:.4g} in delta for target and individual charging alike "
            f"(docs/tct_and_individual.md, section 1): Delta = num_queries * w = {total_w:.4g} adds "
            "ln(1/(1 - Delta)) to epsilon, and the TCT part gets delta - Delta (inf when Delta >= delta)."
            + (f" max_queries: query_delta_share = {share:g} of delta is reserved for the weights, as a budgeted "
               "accountant does, which also limits the number of queries." if budget_epsilon is not None else "")
        )
    return AccountingComparison(
        num_queries=k, eps0=eps0, delta=delta, num_teachers=n, target_rate=rate, charged_per_hit=g, q=q,
        individual_q=individual_q, delta0=delta0, composition=composition, hits=hits,
        charges_per_teacher=per_teacher, per_query_delta=w, total_query_delta=total_w, plain=plain,
        target_charging=target, individual_charging=individual,
        budget_epsilon=budget_epsilon, max_queries=max_queries, assumptions=tuple(assumptions),
    )
