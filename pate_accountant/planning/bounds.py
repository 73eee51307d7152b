"""What a budget buys in target hits, and in plain queries for comparison (docs/planning.md).

* :func:`target_hits`: how many target hits a budget ``(epsilon, delta)`` buys for ``q``-target queries at
  level ``eps0`` (the TCT bound of docs/tct_and_individual.md section 1, split as
  :func:`pate_accountant.tct.target_charging_split` splits it), next to the number of plain ``eps0``-DP queries
  basic / DRV / KOV / exact optimal composition allows (:func:`plain_max_queries`, :func:`plain_epsilon`);
* :func:`teachers_for`, :func:`c_delta`, :func:`paper_target_hits`: the paper's relations, the ensemble size
  ``n = C_delta / eps0`` with ``C_delta = 2 ln(1/delta0)`` (Section "Privacy analysis considerations") and the
  Section 6 figure of ``(10 eps0)^-2`` target hits;
* the budget split for a boundary-wrapped approximate inner and the assumptions every TCT plan states, which
  the other planners share.
"""

from __future__ import annotations

import dataclasses
import math

from pate_accountant.composition import (
    drv_epsilon,
    kov,
    optimal_epsilon,
    pure_optimal_delta,
    pure_part_delta,
)
from pate_accountant.planning.ranges import (
    DEFAULT_AGGREGATOR_DELTA,
    DEFAULT_QUERY_DELTA_SHARE,
    MAX_PLAN_QUERIES,
    _check_budget,
    _check_count,
    _check_eps0,
    _check_inner_delta,
    _check_q,
    _check_search,
    _check_share,
    _Result,
)
from pate_accountant.tct import (
    TargetChargingSplit,
    check_composition,
    largest_fitting,
    query_delta_epsilon,
    target_charging_split,
    tct_details,
    tct_epsilon,
    wrapped_query_delta,
)
from pate_accountant.validation import check_delta, check_real

#: Plain composition bounds for ``k`` identical ``(eps0, delta0)`` steps (docs/planning.md, docs/accountants.md).
PLAIN_METHODS = ("basic", "drv", "kov", "optimal")

_TCT_ASSUMPTION = (
    "TCT bound (ours, docs/tct_and_individual.md section 1): the interaction stops at the tau-th target hit; each query is eps0-DP in "
    "the part that depends on the data and has a q-target (after removing its per-query mixture weight w when "
    "delta0 > 0); the number of private draws for tau hits is bounded by a negative-binomial tail, paid for in "
    "delta; the draws compose by {composition} composition."
)
_EPS0_ASSUMPTION = (
    "eps0 is the privacy level of the target (the TCT level). A BoundaryWrapper around an eps_A-DP inner "
    "aggregator is charged at eps0 = 2 eps_A with q = min(1/3, (E+1)/(2E^2+E+2)), E = e^eps_A (docs/mechanisms/"
    "boundary_wrapper.md)."
)


@dataclasses.dataclass(frozen=True)
class TargetHitsPlan(_Result):
    """What :func:`target_hits` returns.

    The budget is split as :func:`pate_accountant.tct.target_charging_split` (and a budgeted
    ``TargetChargingAccountant``) splits it.  ``per_query_delta = w = 1 - (1 - delta0)^2`` is what every
    query pays (``0`` for a pure inner, ``delta0 = 0``); ``reserved_delta`` is the share of ``delta`` reserved
    for those weights; ``max_queries = floor(reserved_delta / w)`` is how many queries, hits or not, the
    budget allows (``None`` for a pure inner: no limit).  ``hits`` is the split's hit limit; ``epsilon_spent
    = tct_epsilon(hits, delta - reserved_delta) + ln(1/(1 - reserved_delta)) <= epsilon`` is the bound at
    those hits with the reserve fully used (``0`` when no hit fits); ``epsilon_next_hit`` is the same for one
    hit more (``> epsilon``).  ``private_draws`` is the truncation ``k`` of the TCT bound at ``hits``;
    ``paper_hits = (10 eps0)^-2`` is the paper's Section 6 figure (meant for total epsilon 1 and
    ``eps0 <= 0.01``); ``plain_queries`` maps each plain composition method to the largest number of
    ``(eps0, delta0)``-DP queries it allows for the same budget.
    """

    epsilon: float
    delta: float
    eps0: float
    q: float
    delta0: float
    composition: str
    hits: int
    epsilon_spent: float
    epsilon_next_hit: float
    private_draws: int
    per_query_delta: float
    reserved_delta: float
    max_queries: int | None
    paper_hits: float
    plain_queries: dict
    assumptions: tuple


# -- the budget split of a wrapped inner, and what a TCT plan assumes ------------------------------------


def _split(epsilon: float, delta: float, eps0: float, q: float, delta0: float, share: float,
           composition: str) -> tuple[TargetChargingSplit, float]:
    """The budget split for a wrapped inner with ``delta_A = delta0`` and its per-query weight ``w``."""
    w = wrapped_query_delta(delta0)
    return target_charging_split(epsilon, delta, eps0, q, w, share=share, composition=composition), w


def _query_limit(split: TargetChargingSplit, w: float) -> int | None:
    """``max_queries`` as planning reports it: ``None`` for a pure inner (no limit)."""
    return split.max_queries if w > 0.0 else None


def _bound_at(hits: int, q: float, eps0: float, split: TargetChargingSplit, composition: str) -> float:
    """The bound after ``hits`` hits with the reserve fully used (``0`` before any hit: no query runs)."""
    if hits == 0:
        return 0.0
    return tct_epsilon(hits, q, eps0, split.delta_tct, composition=composition) + query_delta_epsilon(split.reserved)


def _charging_assumptions(delta0: float, w: float, split: TargetChargingSplit, share: float) -> list[str]:
    """What the per-query deltas cost (docs/tct_and_individual.md, section 1), in the plan's numbers."""
    if delta0 == 0.0:
        return [
            ("delta0 = 0 (a pure inner, the paper's figure): only target hits are charged; queries that do not hit "
            "the target are free, however many (max_queries = None). With delta0 = delta_A > 0 (a boundary-wrapped "
            "approximate inner) every query, hit or not, would pay w = 1-(1-delta0)^2 in delta and a share "
            "query_delta_share of delta would be reserved for them (docs/tct_and_individual.md, section 1).")
        ]
    out = [
        (f"delta0 = {delta0:g} is the delta_A of a boundary-wrapped approximate inner: every query, hit or not, pays "
        f"the mixture weight w = 1-(1-delta0)^2 = {w:.4g} in delta (docs/tct_and_individual.md, section 1). "
        f"query_delta_share = {share:g} of delta, {split.reserved:.4g}, is reserved for them: at most "
        f"max_queries = floor(reserved/w) = {split.max_queries} queries; the TCT part gets epsilon - "
        f"ln(1/(1 - reserved)) = {split.epsilon_tct:.9g} and delta - reserved = {split.delta_tct:.4g}, the split "
        "of a budgeted TargetChargingAccountant."),
    ]
    if split.max_queries < split.max_hits:
        out.append(
            f"WARNING: max_queries = {split.max_queries} < hits = {split.max_hits}: every hit is a query, so the query "
            "limit binds first (choose a smaller delta0)."
        )
    return out


def _tct_assumptions(composition: str) -> list[str]:
    return [_TCT_ASSUMPTION.format(composition="exact optimal" if composition == "optimal" else "DRV advanced"),
            _EPS0_ASSUMPTION]


# -- the paper's relations -------------------------------------------------------------------------------


def c_delta(delta0: float) -> float:
    """``C_delta = 2 ln(1/delta0)`` (paper, "Privacy analysis considerations")."""
    delta0 = check_delta("delta0", delta0)
    return 2.0 * math.log(1.0 / delta0)


def teachers_for(eps0: float, delta0: float = DEFAULT_AGGREGATOR_DELTA) -> float:
    """The paper's ensemble size ``n = C_delta / eps0`` (a real number; round up for an ensemble).

    With the paper's ``L = ln(1/delta0) / eps0`` this is ``n = 2L``: the smallest ``n`` whose release
    threshold ``n/2 + L`` is at most ``n``.  ``teachers_for(0.01, 1e-6) = 2763.1``.
    """
    eps0 = _check_eps0(eps0)
    return c_delta(delta0) / eps0


def paper_target_hits(eps0: float) -> float:
    """The paper's Section 6 figure: about ``(10 eps0)^-2`` target hits for total epsilon 1, ``eps0 <= 0.01``."""
    eps0 = _check_eps0(eps0)
    return 1.0 / (100.0 * eps0 * eps0)


# -- plain composition -----------------------------------------------------------------------------------


def plain_epsilon(num_queries: int, eps0: float, delta: float, *, delta0: float = 0.0, method: str = "optimal") -> float:
    """The epsilon (at total ``delta``) of ``num_queries`` adaptive ``(eps0, delta0)``-DP queries (docs/accountants.md).

    ``method``: ``"basic"`` (``k eps0``, needs ``k delta0 <= delta``), ``"drv"`` (``eps0 sqrt(2k ln(1/d'))
    + k eps0 (e^eps0 - 1)`` with ``d' = delta - k delta0``, :func:`pate_accountant.composition.drv_epsilon`),
    ``"kov"`` (KOV Thm 3.3, grid of step ``2 eps0``, :func:`pate_accountant.composition.kov`), ``"optimal"``
    (exact optimal composition, continuous, :func:`pate_accountant.composition.optimal_epsilon`).  ``inf``
    when ``delta`` cannot cover the per-step deltas.
    """
    k = _check_count("num_queries", num_queries, 0, MAX_PLAN_QUERIES,
                     "exact composition holds a law of num_queries + 1 weights")
    eps0 = _check_eps0(eps0)
    delta = check_delta("delta", delta)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0, max_open=True)
    if method not in PLAIN_METHODS:
        raise ValueError(f"method must be one of {PLAIN_METHODS}, got {method!r}")
    if k == 0:
        return 0.0
    if method == "basic":
        return k * eps0 if k * delta0 <= delta else math.inf
    if method == "drv":
        slack = delta - k * delta0
        if slack <= 0:
            return math.inf
        return drv_epsilon(k, eps0, slack)
    if method == "optimal":
        return optimal_epsilon(k, eps0, delta0, delta)
    return kov(eps0, delta0, k, delta)


def _plain_fits(k: int, eps0: float, epsilon: float, delta: float, delta0: float, method: str) -> bool:
    if k == 0:
        return True
    if method in ("basic", "drv"):
        return plain_epsilon(k, eps0, delta, delta0=delta0, method=method) <= epsilon
    target = pure_part_delta(k, delta0, delta)
    if target <= 0:
        return False
    if method == "optimal":
        return pure_optimal_delta(k, eps0, epsilon) <= target
    # kov: the largest grid point eps0 (k - 2i) <= epsilon must reach the target delta.
    if k * eps0 <= epsilon * (1 + 1e-12):
        return True
    i = math.ceil((k - epsilon / eps0) / 2.0 - 1e-9)
    if i > k // 2:
        return False
    return pure_optimal_delta(k, eps0, eps0 * (k - 2 * i)) <= target


def plain_max_queries(eps0: float, epsilon: float, delta: float, *, delta0: float = 0.0, method: str = "optimal") -> int:
    """The largest number of ``(eps0, delta0)``-DP queries whose ``method`` composition stays within
    ``(epsilon, delta)`` (known values at ``(1, 1e-6)``, optimal: ``eps0 = 0.1 -> 10``, ``0.01 -> 562``)."""
    eps0 = _check_eps0(eps0)
    epsilon, delta = _check_budget(epsilon, delta)
    delta0 = check_real("delta0", delta0, minimum=0.0, maximum=1.0, max_open=True)
    if method not in PLAIN_METHODS:
        raise ValueError(f"method must be one of {PLAIN_METHODS}, got {method!r}")
    _check_search(epsilon, delta, eps0)
    return largest_fitting(lambda k: _plain_fits(k, eps0, epsilon, delta, delta0, method))


# -- target hits -----------------------------------------------------------------------------------------


def target_hits(
    epsilon: float,
    delta: float,
    eps0: float,
    q: float = 1.0 / 3.0,
    delta0: float = 0.0,
    composition: str = "optimal",
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
) -> TargetHitsPlan:
    """How many target hits ``(epsilon, delta)`` buys for ``q``-target queries at level ``eps0``, and, for a
    boundary-wrapped approximate inner (``delta0 = delta_A > 0``), how many queries.

    The budget is split by :func:`pate_accountant.tct.target_charging_split` with the per-query weight
    ``w = 1 - (1 - delta0)^2``, exactly as ``TargetChargingAccountant(budget=(epsilon, delta),
    query_delta_share=query_delta_share)`` splits it for ``BoundaryWrapperEvent(EpsilonDeltaEvent(eps0/2,
    delta0), eps0, q)``: ``hits`` is its ``max_hits_for`` and ``max_queries`` its ``max_queries``.  With
    ``delta0 = 0`` there is no reserve: ``hits = tct_max_hits(q, eps0, epsilon, delta)`` (reference
    value: ``(1, 1e-6)``, ``q = 1/3``, optimal: ``eps0 = 0.01 -> 130``) and ``max_queries = None``.  For
    comparison the result lists the plain ``(eps0, delta0)``-DP queries each composition bound allows
    (:func:`plain_max_queries`) and the paper's ``(10 eps0)^-2``.
    """
    epsilon, delta = _check_budget(epsilon, delta)
    eps0 = _check_eps0(eps0)
    _check_search(epsilon, delta, eps0)  # before delta0: a level past the planning limit is named as such
    q = _check_q("q", q)
    share = _check_share(query_delta_share)
    delta0 = _check_inner_delta(delta0, delta, share)
    composition = check_composition(composition)
    split, w = _split(epsilon, delta, eps0, q, delta0, share, composition)
    hits = split.max_hits
    details = tct_details(hits, q, eps0, split.delta_tct, composition=composition)
    nxt = _bound_at(hits + 1, q, eps0, split, composition)
    plain = {m: plain_max_queries(eps0, epsilon, delta, delta0=delta0, method=m) for m in PLAIN_METHODS}
    assumptions = [
        *_tct_assumptions(composition),
        *_charging_assumptions(delta0, w, split, share),
        ("plain_queries: the number of (eps0, delta0)-DP queries (every query charged) that basic, DRV, KOV and "
        "exact optimal composition allow for the same (epsilon, delta)."),
        ("paper_hits = (10 eps0)^-2 is the paper's Section 6 figure for total epsilon 1 and eps0 <= 0.01; "
        "a sanity check (our own check: within a factor [0.7, 2.7] of our bound), not an equality."),
    ]
    return TargetHitsPlan(
        epsilon=epsilon, delta=delta, eps0=eps0, q=q, delta0=delta0, composition=composition,
        hits=hits, epsilon_spent=_bound_at(hits, q, eps0, split, composition), epsilon_next_hit=nxt,
        private_draws=details["private_draws"], per_query_delta=w, reserved_delta=split.reserved,
        max_queries=_query_limit(split, w), paper_hits=paper_target_hits(eps0),
        plain_queries=plain, assumptions=tuple(assumptions),
    )
