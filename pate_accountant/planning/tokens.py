"""What a budget buys in tokens, and the ensemble that buys a wanted number of them (docs/planning.md).

* :func:`yields`, :func:`yields_for_hits`: the expected number of yields (tokens) the budget buys, by the paper's
  relation "yields per target hit ~ eps0 n / 2" (Section "Privacy analysis considerations"; regime
  ``alpha <= T/n``, the worst case over alpha);
* :func:`plan_for_tokens`: the largest ``eps0`` (fewest teachers ``n = C_delta / eps0``) that buys at least a
  wanted number of yields, calibrated so the plan never overshoots the budget (:func:`max_plannable_tokens`: the
  largest number it plans).
"""

from __future__ import annotations

import dataclasses
import math

from pate_accountant.bisection import switch_point
from pate_accountant.composition import drv_epsilon, pure_optimal_delta
from pate_accountant.planning.bounds import (
    TargetHitsPlan,
    _bound_at,
    _charging_assumptions,
    _query_limit,
    _split,
    _tct_assumptions,
    c_delta,
    paper_target_hits,
    target_hits,
)
from pate_accountant.planning.ranges import (
    DEFAULT_AGGREGATOR_DELTA,
    DEFAULT_QUERY_DELTA_SHARE,
    MAX_SEARCH_STEPS,
    _check_budget,
    _check_inner_delta,
    _check_q,
    _check_share,
    _Result,
    _size,
)
from pate_accountant.tct import check_composition, query_delta_epsilon, tct_epsilon, tct_splits, wrapped_query_delta
from pate_accountant.validation import MAX_COUNT, check_delta, check_int, check_real


@dataclasses.dataclass(frozen=True)
class YieldsPlan(_Result):
    """What :func:`yields` returns.

    ``hits`` (ours, :func:`target_hits`) times ``yields_per_hit = eps0 n / 2`` gives ``yields``;
    ``paper_hits = (10 eps0)^-2`` times the same gives ``paper_yields``; ``paper_formula_yields`` is the
    paper's ``0.005 n^2 / C_delta`` (equal to ``paper_yields`` when ``n = C_delta / eps0``).
    ``min_teachers = C_delta / eps0`` (:func:`teachers_for`); ``num_teachers_needed`` is its ceiling.
    ``max_queries`` (``None`` for a pure inner) is :func:`target_hits`'s query limit: each query yields at
    most one token.
    """

    epsilon: float
    delta: float
    eps0: float
    q: float
    delta0: float
    composition: str
    aggregator_delta: float
    c_delta: float
    num_teachers: float
    min_teachers: float
    num_teachers_needed: int
    hits: int
    epsilon_spent: float
    max_queries: int | None
    yields_per_hit: float
    yields: float
    paper_hits: float
    paper_yields: float
    paper_formula_yields: float
    assumptions: tuple


@dataclasses.dataclass(frozen=True)
class TokensPlan(_Result):
    """What :func:`plan_for_tokens` returns.

    ``hits_needed = ceil(2 tokens / C_delta)``; ``eps0`` is the largest level whose TCT bound affords that
    many hits within ``epsilon`` (to a relative ``1e-9``); ``num_teachers = ceil(C_delta / eps0)``
    (``num_teachers_exact`` unrounded); ``hits`` is the calibrated maximum at that ``eps0``
    (``epsilon_spent <= epsilon < epsilon_next_hit``) and ``expected_yields = hits eps0 num_teachers / 2
    >= tokens``.  ``paper_eps0 = sqrt(0.005 C_delta / tokens)`` and ``paper_num_teachers`` come from the
    paper's "0.005 n^2 / C_delta yields" (``tau = (10 eps0)^-2``) for comparison.  ``per_query_delta``,
    ``reserved_delta`` and ``max_queries`` are those of :class:`TargetHitsPlan` (the budget split does not
    depend on ``eps0``); ``epsilon_spent`` includes the reserve.
    """

    tokens: int
    epsilon: float
    delta: float
    q: float
    delta0: float
    composition: str
    aggregator_delta: float
    c_delta: float
    hits_needed: int
    eps0: float
    num_teachers: int
    num_teachers_exact: float
    hits: int
    epsilon_spent: float
    epsilon_next_hit: float
    per_query_delta: float
    reserved_delta: float
    max_queries: int | None
    expected_yields: float
    paper_eps0: float
    paper_num_teachers: float
    assumptions: tuple


def _query_limit_warning(max_queries: int | None, hits: int, eps0: float, n: float, regime: str = "") -> list[str]:
    """The warning (a list of at most one) when the query limit binds before the hits: a target hit comes with about
    ``eps0 n`` queries (the paper's relation), so at most ``max_queries`` yields are possible."""
    if max_queries is not None and max_queries < hits * eps0 * n:
        return [
            f"WARNING: max_queries = {max_queries} < hits * eps0 n = {hits * eps0 * n:.0f}: {regime}a target hit comes "
            "with about eps0 n queries (the paper's relation), so the per-query deltas run out first and at most "
            f"{max_queries} yields are possible (choose a smaller delta0)."
        ]
    return []


def yields(
    epsilon: float,
    delta: float,
    eps0: float,
    num_teachers: float | None = None,
    q: float = 1.0 / 3.0,
    delta0: float = 0.0,
    composition: str = "optimal",
    aggregator_delta: float = DEFAULT_AGGREGATOR_DELTA,
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
) -> YieldsPlan:
    """Expected yields (released tokens) the budget buys, by the paper's relation.

    ``yields = hits * eps0 n / 2`` with ``hits`` from :func:`target_hits` and ``n = num_teachers``
    (default ``teachers_for(eps0, aggregator_delta) = C_delta / eps0``, the paper's choice, unrounded).
    The paper's figure ``(10 eps0)^-2`` in place of ``hits`` gives ``paper_yields``, which for
    ``n = C_delta/eps0`` is the paper's ``0.005 n^2 / C_delta`` (``eps0 = 0.01``, ``delta0 = 1e-6``:
    ``n = 2763.1``, ``1381.6`` yields for ``epsilon = 1``).

    ``aggregator_delta`` is the ``delta0`` of the aggregator in ``C_delta = 2 ln(1/delta0)``; ``delta0`` is
    the ``delta_A`` of a boundary-wrapped approximate inner, whose every query pays a per-query delta
    (default 0, a pure inner, as in the paper's figure; see :func:`target_hits`).
    """
    plan = target_hits(epsilon, delta, eps0, q=q, delta0=delta0, composition=composition,
                       query_delta_share=query_delta_share)
    return yields_for_hits(plan, num_teachers, aggregator_delta)


def yields_for_hits(
    plan: TargetHitsPlan,
    num_teachers: float | None = None,
    aggregator_delta: float = DEFAULT_AGGREGATOR_DELTA,
) -> YieldsPlan:
    """The expected yields of the hits of one :func:`target_hits` plan, by the paper's relation (see
    :func:`yields`, which is ``yields_for_hits(target_hits(...), num_teachers, aggregator_delta)``): the hits,
    level, ``q``, ``delta0`` and query limit are the plan's own, so ``pate-accountant plan yields`` can give the
    yields of exactly the run whose hits it planned."""
    if not isinstance(plan, TargetHitsPlan):
        raise TypeError(f"plan must be a TargetHitsPlan (what target_hits returns), got {type(plan).__name__}")
    aggregator_delta = check_delta("aggregator_delta", aggregator_delta)
    cd = c_delta(aggregator_delta)
    min_teachers = cd / plan.eps0
    if num_teachers is None:
        n = min_teachers
    else:
        n = check_real("num_teachers", num_teachers, minimum=0.0, min_open=True, maximum=MAX_COUNT)
    per_hit = plan.eps0 * n / 2.0
    charging = [a for a in plan.assumptions if a.startswith(("delta0 ", "WARNING"))]
    assumptions = [
        *plan.assumptions[:2],
        *charging,
        ("Paper's approximation (Section 'Privacy analysis considerations'): in the regime alpha <= T/n the "
        "yield per target hit is about eps0 n / 2, the worst case over alpha; queries with alpha >> T/n "
        "yield more tokens per hit (they are nearly free). `plan figures` measures the real ratio for "
        "BoundaryWrapper(DPArgMax) on alpha-mixture teachers."),
        (f"n = C_delta / eps0 with C_delta = 2 ln(1/delta0) = {cd:.4f} (delta0 = aggregator_delta = "
        f"{aggregator_delta:g}) unless num_teachers is given; this is n = 2L for the paper's "
        "L = ln(1/delta0)/eps0, the smallest n whose release threshold n/2 + L is at most n."),
        "paper_yields uses the paper's (10 eps0)^-2 hits; yields uses our bound's hits.",
    ]
    if n < min_teachers * (1 - 1e-12):
        assumptions.append(
            f"WARNING: num_teachers = {n:g} < C_delta/eps0 = {min_teachers:.1f}: with the paper's L the "
            "threshold n/2 + L exceeds n and the relation does not apply."
        )
    assumptions += _query_limit_warning(plan.max_queries, plan.hits, plan.eps0, n, "in this regime ")
    paper = paper_target_hits(plan.eps0)
    return YieldsPlan(
        epsilon=plan.epsilon, delta=plan.delta, eps0=plan.eps0, q=plan.q, delta0=plan.delta0,
        composition=plan.composition, aggregator_delta=aggregator_delta, c_delta=cd,
        num_teachers=n, min_teachers=min_teachers, num_teachers_needed=math.ceil(min_teachers * (1 - 1e-12)),
        hits=plan.hits, epsilon_spent=plan.epsilon_spent, max_queries=plan.max_queries, yields_per_hit=per_hit,
        yields=plan.hits * per_hit,
        paper_hits=paper, paper_yields=paper * per_hit, paper_formula_yields=0.005 * n * n / cd,
        assumptions=tuple(assumptions),
    )


# -- plan for a number of tokens -------------------------------------------------------------------------


def _composed(k: int, eps0: float, slack: float, composition: str, epsilon: float) -> bool:
    """Whether ``k`` ``eps0``-DP steps compose to ``<= epsilon`` at delta ``slack``."""
    if composition == "optimal":
        return pure_optimal_delta(k, eps0, epsilon) <= slack
    return drv_epsilon(k, eps0, slack) <= epsilon


def _max_eps0_for_hits(hits: int, q: float, epsilon: float, delta: float, composition: str) -> float:
    """sup{eps0 : tct_epsilon(hits, q, eps0, delta) <= epsilon}, calibrated against ``tct_epsilon`` itself.

    ``tct_epsilon`` is the minimum over the tail splits of a composition bound that increases with ``eps0``
    (the truncation ``k`` does not depend on ``eps0``), so the supremum is the largest of the per-split
    suprema, each found by bisection on ``eps0``.
    """
    best = 0.0
    for _, k, slack in tct_splits(hits, q, delta):
        # The largest eps0 that composes within epsilon: the bracket's lower end, below the first that does not.
        start = epsilon / k
        lo, _ = switch_point(lambda eps0, k=k, slack=slack: not _composed(k, eps0, slack, composition, epsilon),
                             start / 2.0, start,
                             rel_tol=1e-12)
        best = max(best, lo)
    # Calibrate against the function the plan is checked with (its own bisection rounds up by <= 1e-12).
    while tct_epsilon(hits, q, best, delta, composition=composition) > epsilon:
        best *= 1.0 - 1e-10
    return best


def max_plannable_tokens(q: float = 1.0 / 3.0, aggregator_delta: float = DEFAULT_AGGREGATOR_DELTA) -> int:
    """The largest ``tokens`` :func:`plan_for_tokens` plans: ``tokens`` need about ``2 tokens / C_delta`` target
    hits and ``hits / q`` private draws, at most :data:`MAX_SEARCH_STEPS` (1381551 at the defaults)."""
    q = _check_q("q", q)
    return math.floor(MAX_SEARCH_STEPS * q * c_delta(aggregator_delta) / 2.0)


def plan_for_tokens(
    tokens: int,
    epsilon: float,
    delta: float,
    q: float = 1.0 / 3.0,
    delta0: float = 0.0,
    composition: str = "optimal",
    aggregator_delta: float = DEFAULT_AGGREGATOR_DELTA,
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
) -> TokensPlan:
    """The ``eps0`` and number of teachers ``n = C_delta / eps0`` that buy at least ``tokens`` yields.

    With ``n = C_delta / eps0`` each target hit buys ``eps0 n / 2 = C_delta / 2`` yields (paper's
    relation, see :func:`yields`), so ``hits_needed = ceil(2 tokens / C_delta)``.  Fewer teachers means a
    larger ``eps0``, so the plan takes the *largest* ``eps0`` whose TCT bound affords ``hits_needed`` hits
    within ``epsilon`` (bisection, then checked with :func:`pate_accountant.tct.tct_epsilon`: the plan
    never overshoots), rounds the ensemble up to ``ceil(C_delta / eps0)`` teachers, and reports the
    calibrated maximum number of hits at that ``eps0``.  With ``delta0 = delta_A > 0`` (a boundary-wrapped
    approximate inner) the budget is split first (:func:`target_hits`; the split does not depend on
    ``eps0``), the hits are planned within the TCT part, and ``max_queries`` bounds the queries.
    """
    tokens = check_int("tokens", tokens, minimum=1)
    epsilon, delta = _check_budget(epsilon, delta)
    q = _check_q("q", q)
    share = _check_share(query_delta_share)
    composition = check_composition(composition)
    aggregator_delta = check_delta("aggregator_delta", aggregator_delta)
    cd = c_delta(aggregator_delta)
    largest = max_plannable_tokens(q, aggregator_delta)
    if tokens > largest:  # checked on integers, before any float: no overflow for any tokens
        hits = 2.0 * tokens / cd if tokens < 10**300 else math.inf
        raise ValueError(
            f"tokens = {_size(tokens)} needs about 2 tokens / C_delta = {_size(hits)} target hits"
            f" (C_delta = {cd:.4g} at aggregator_delta {aggregator_delta:g}), about hits / q private draws, "
            f"above the planning limit of {MAX_SEARCH_STEPS:.0e} draws: the largest plannable horizon here is "
            f"{largest} tokens (docs/ranges.md)"
        )
    delta0 = _check_inner_delta(delta0, delta, share)  # after the size: a plan too large is refused as such
    needed = math.ceil(2.0 * tokens / cd)
    w = wrapped_query_delta(delta0)
    reserved = share * delta if w > 0.0 else 0.0  # as target_charging_split reserves it, whatever eps0
    if epsilon <= query_delta_epsilon(reserved):
        raise ValueError(
            f"epsilon = {epsilon:g} does not cover the per-query reserve's ln(1/(1 - {reserved:.3g})) "
            f"(delta0 = {delta0:g})"
        )
    eps0 = _max_eps0_for_hits(needed, q, epsilon - query_delta_epsilon(reserved), delta - reserved, composition)
    split, w = _split(epsilon, delta, eps0, q, delta0, share, composition)
    hits = split.max_hits  # >= needed: eps0 is calibrated against the same (epsilon_tct, delta_tct)
    exact_n = cd / eps0
    n = math.ceil(exact_n * (1 - 1e-12))
    spent = _bound_at(hits, q, eps0, split, composition)
    nxt = _bound_at(hits + 1, q, eps0, split, composition)
    paper_eps0 = math.sqrt(0.005 * cd / tokens)
    max_queries = _query_limit(split, w)
    assumptions = [
        *_tct_assumptions(composition),
        *_charging_assumptions(delta0, w, split, share),
        ("Paper's approximation: yields per target hit ~ eps0 n / 2 (regime alpha <= T/n, the worst case over "
        "alpha); with n = C_delta/eps0 that is C_delta/2 yields per hit whatever eps0."),
        f"C_delta = 2 ln(1/delta0) = {cd:.4f} with delta0 = aggregator_delta = {aggregator_delta:g}.",
        ("eps0 is the largest level affording hits_needed hits (more eps0 = fewer teachers); num_teachers is "
        "rounded up, which only adds yields."),
        ("paper_eps0 = sqrt(0.005 C_delta / tokens) solves the paper's 0.005 n^2/C_delta = tokens with "
        "n = C_delta/eps0 (i.e. (10 eps0)^-2 hits); for comparison only."),
    ]
    assumptions += _query_limit_warning(max_queries, hits, eps0, n)
    return TokensPlan(
        tokens=tokens, epsilon=epsilon, delta=delta, q=q, delta0=delta0, composition=composition,
        aggregator_delta=aggregator_delta, c_delta=cd, hits_needed=needed, eps0=eps0, num_teachers=n,
        num_teachers_exact=exact_n, hits=hits, epsilon_spent=spent, epsilon_next_hit=nxt,
        per_query_delta=w, reserved_delta=split.reserved, max_queries=max_queries,
        expected_yields=hits * eps0 * n / 2.0, paper_eps0=paper_eps0, paper_num_teachers=cd / paper_eps0,
        assumptions=tuple(assumptions),
    )
