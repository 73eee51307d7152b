"""Budget planning: the questions a user asks before a run (docs/planning.md).

Every function validates its arguments (``TypeError`` / ``ValueError`` naming the parameter) and returns
a frozen dataclass holding the numbers *and* the assumptions behind them; ``.as_dict()`` gives a
JSON-able dict (``None`` for an infinite or undefined value).

* :func:`target_hits`: how many target hits a budget ``(epsilon, delta)`` buys for ``q``-target queries at
  level ``eps0`` (the TCT bound of docs/tct_and_individual.md section 1, split as :func:`pate_accountant.tct.target_charging_split`
  splits it), next to the number of plain ``eps0``-DP queries basic / DRV / KOV / exact optimal
  composition allows.
* :func:`teachers_for`, :func:`c_delta`: the paper's ensemble size ``n = C_delta / eps0`` with
  ``C_delta = 2 ln(1/delta0)`` (Section "Privacy analysis considerations").
* :func:`yields`: the expected number of yields (tokens) the budget buys, by the paper's relation
  "yields per target hit ~ eps0 n / 2" (regime ``alpha <= T/n``, the worst case over alpha);
  :func:`yields_for_hits` gives the same for the hits of a :func:`target_hits` plan already made.
* :func:`plan_for_tokens`: the largest ``eps0`` (fewest teachers ``n = C_delta / eps0``) that buys at
  least a wanted number of yields, calibrated so the plan never overshoots the budget.
* :func:`compare_accounting`: one run shape accounted three ways: plain composition of every query,
  target charging (TCT), individual (per-teacher) charging.
* :func:`bassily_tt_teachers`, :func:`bassily_tt_tokens`: the BassilyTT margin condition
  ``eta n >= 32 sqrt(2)/eps ln(4m/delta) sqrt(ln(2/delta))`` of Appendix D (docs/planning.md).
* :func:`agreement_count_pmf`, :func:`step_limits`, :func:`expected_steps_to_hits`, :func:`run_expectation`: what
  ``pate-accountant plan best`` compares runs with: the agreement model's count law (Section 6's alpha mixture),
  the limits a run's own accountant puts on it, and the expected steps and private tokens of a run (the
  mechanisms' per-step laws live in the application wing, ``pate_app.commands.plan``).

``delta0`` (every target-charging function): the ``delta_A`` of a boundary-wrapped approximate-DP inner
aggregator (``0``, the default and the paper's figure, for a pure inner).  Every query of such an inner, hit
or not, pays the mixture weight ``w = 1 - (1 - delta0)^2`` in delta
(:func:`pate_accountant.tct.wrapped_query_delta`; docs/tct_and_individual.md, section 1), so a share
``query_delta_share`` of ``delta`` (default one half) is reserved for them and the budget also limits the
number of queries (``max_queries``), exactly as a budgeted ``TargetChargingAccountant`` does.

Ranges (docs/ranges.md): the budget epsilon lies in ``(0, MAX_BUDGET_EPSILON]``, ``eps0`` in ``[MIN_EPS0, MAX_EPS0]``,
deltas in ``[1e-300, 1)``, ``q`` in ``[MIN_Q, 1]``; the work a plan would do is estimated first and a search past
``MAX_SEARCH_STEPS`` composed steps (or one bound past ``MAX_BOUND_DRAWS`` draws, or ``MAX_PLAN_QUERIES``
queries) is refused with a ``ValueError`` naming the parameter, before it starts.

Neighbouring relation: the one the per-query level ``eps0`` is stated under (by default one teacher's
vote changes, paper Observation 1); planning itself does not change it.  This module imports only the
standard library, numpy, scipy and ``pate_accountant`` (never ``mechanisms`` or ``ensembles``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
from scipy.special import log_ndtr, ndtr

from pate_accountant import registry
from pate_accountant.accountants.target_charging import target_class
from pate_accountant.bisection import switch_point
from pate_accountant.composition import (
    drv_epsilon,
    kov,
    optimal_epsilon,
    pure_optimal_delta,
    pure_part_delta,
)
from pate_accountant.tct import (
    TargetChargingSplit,
    check_composition,
    largest_fitting,
    query_delta_epsilon,
    target_charging_split,
    tct_details,
    tct_epsilon,
    tct_splits,
    wrapped_query_delta,
)
from pate_accountant.validation import (
    MAX_COUNT,
    MAX_STEP_EPSILON,
    check_delta,
    check_epsilon,
    check_int,
    check_real,
)

__all__ = [
    "MAX_BOUND_DRAWS",
    "MAX_BUDGET_EPSILON",
    "MAX_EPS0",
    "MAX_PLAN_QUERIES",
    "MAX_PLAN_STEPS",
    "MAX_PLAN_TEACHERS",
    "MAX_SEARCH_STEPS",
    "MIN_EPS0",
    "MIN_Q",
    "MIN_TARGET_RATE",
    "PLAIN_METHODS",
    "AccountingComparison",
    "BassilyTTTeachers",
    "BassilyTTTokens",
    "RunExpectation",
    "StepLimits",
    "TargetHitsPlan",
    "TokensPlan",
    "YieldsPlan",
    "agreement_count_pmf",
    "bassily_tt_teachers",
    "bassily_tt_tokens",
    "c_delta",
    "compare_accounting",
    "estimated_steps",
    "expected_queries",
    "expected_steps_to_hits",
    "included_count_pmf",
    "individual_charges",
    "individual_charging_hits",
    "max_plannable_tokens",
    "paper_target_hits",
    "plain_epsilon",
    "plain_max_queries",
    "plan_for_tokens",
    "run_expectation",
    "step_delta_for_queries",
    "step_limits",
    "steps_to_hits_quantile",
    "target_hits",
    "teachers_for",
    "yields",
    "yields_for_hits",
]

#: Plain composition bounds for ``k`` identical ``(eps0, delta0)`` steps (docs/planning.md, docs/accountants.md).
PLAIN_METHODS = ("basic", "drv", "kov", "optimal")
#: The BassilyTT constant ``32 sqrt(2)``.
BTT_CONSTANT = 32.0 * math.sqrt(2.0)
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


@dataclasses.dataclass(frozen=True)
class BassilyTTTeachers(_Result):
    """What :func:`bassily_tt_teachers` returns: ``n_required`` (real) and ``num_teachers = ceil``."""

    eta: float
    epsilon: float
    delta: float
    tokens: int
    n_required: float
    num_teachers: int
    assumptions: tuple


@dataclasses.dataclass(frozen=True)
class BassilyTTTokens(_Result):
    """What :func:`bassily_tt_tokens` returns: ``m_max`` (``None`` when above ``1e300``; then read
    ``log10_m_max``) and ``log10_m_max = log10((delta/4) exp(x))``."""

    eta: float
    epsilon: float
    delta: float
    num_teachers: float
    m_max: int | None
    log10_m_max: float
    assumptions: tuple


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


# -- target hits and yields ------------------------------------------------------------------------------


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


#: How many times the expected private draws of a plan's hits the default per-query delta must pay for.
QUERY_MARGIN = 4.0
#: The smallest per-query delta :func:`step_delta_for_queries` offers (its noise bound L grows like ln(1/delta)).
MIN_STEP_DELTA = 1e-30


def expected_queries(
    epsilon: float,
    delta: float,
    eps0: float,
    q: float = 1.0 / 3.0,
    composition: str = "optimal",
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
    margin: float = QUERY_MARGIN,
) -> int:
    """The queries a target-charged run at level ``eps0`` should be able to pay for: ``margin`` times the private
    draws that the hits of ``(epsilon, delta)`` take in expectation (:func:`target_hits`' ``private_draws``,
    about ``hits / q``), at least one.  The hits do not depend on the per-query delta (its reserve is its own
    share of ``delta``), so they are computed with the smallest one on offer."""
    margin = check_real("margin", margin, minimum=1.0)
    plan = target_hits(epsilon, delta, eps0, q=q, delta0=MIN_STEP_DELTA, composition=composition,
                       query_delta_share=query_delta_share)
    return max(1, math.ceil(margin * plan.private_draws))


def step_delta_for_queries(
    delta: float,
    queries: int,
    *,
    query_delta_share: float = DEFAULT_QUERY_DELTA_SHARE,
    ceiling: float = DEFAULT_AGGREGATOR_DELTA,
) -> float:
    """The per-query delta ``delta0 = delta_A`` of a boundary-wrapped approximate inner, chosen from the queries a
    run should pay for instead of fixed (issue 23, item 4): the largest value on the 1-2-5 grid, at most
    ``ceiling``, whose weight ``w = 1 - (1 - delta0)^2`` fits ``queries`` times into the ``query_delta_share`` of
    ``delta``.  A fixed ``delta0 = 1e-10`` caps a run at budget delta ``1e-6`` to 2,500 queries whatever its
    epsilon buys; a larger ``delta0`` keeps the noise bound ``L`` (about ``ln(1/delta0)/eps_A``), and with it the
    release threshold, low.  Plain composition pays ``queries x delta0`` from all of ``delta``, which the
    same value also fits."""
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    queries = check_int("queries", queries, minimum=1)
    share = _check_share(query_delta_share)
    ceiling = check_real("ceiling", ceiling, minimum=MIN_STEP_DELTA, maximum=1.0, max_open=True)
    exponent = math.floor(math.log10(ceiling))
    while 10.0 ** exponent >= MIN_STEP_DELTA:
        for mantissa in (5.0, 2.0, 1.0):
            candidate = float(f"{mantissa:g}e{exponent}")
            if candidate <= ceiling and math.floor(share * delta / wrapped_query_delta(candidate)) >= queries:
                return candidate
        exponent -= 1
    raise ValueError(f"queries: no per-query delta of at least {MIN_STEP_DELTA:g} pays for {queries} queries "
                     f"within the {share:g} share of delta = {delta:g}")


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
    if plan.max_queries is not None and plan.max_queries < plan.hits * plan.eps0 * n:
        assumptions.append(
            f"WARNING: max_queries = {plan.max_queries} < hits * eps0 n = {plan.hits * plan.eps0 * n:.0f}: in this "
            "regime a target hit comes with about eps0 n queries (the paper's relation), so the per-query deltas "
            f"run out first and at most {plan.max_queries} yields are possible (choose a smaller delta0)."
        )
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
    if max_queries is not None and max_queries < hits * eps0 * n:
        assumptions.append(
            f"WARNING: max_queries = {max_queries} < hits * eps0 n = {hits * eps0 * n:.0f}: a target hit comes with "
            "about eps0 n queries (the paper's relation), so the per-query deltas run out first and at most "
            f"{max_queries} yields are possible (choose a smaller delta0)."
        )
    return TokensPlan(
        tokens=tokens, epsilon=epsilon, delta=delta, q=q, delta0=delta0, composition=composition,
        aggregator_delta=aggregator_delta, c_delta=cd, hits_needed=needed, eps0=eps0, num_teachers=n,
        num_teachers_exact=exact_n, hits=hits, epsilon_spent=spent, epsilon_next_hit=nxt,
        per_query_delta=w, reserved_delta=split.reserved, max_queries=max_queries,
        expected_yields=hits * eps0 * n / 2.0, paper_eps0=paper_eps0, paper_num_teachers=cd / paper_eps0,
        assumptions=tuple(assumptions),
    )


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


# -- BassilyTT margin condition (Appendix D) -------------------------------------------------------------


def _check_btt(eta, epsilon, delta) -> tuple[float, float, float]:
    eta = check_real("eta", eta, minimum=0.0, maximum=1.0, min_open=True)
    epsilon, delta = _check_budget(epsilon, delta)
    return eta, epsilon, delta


_BTT_ASSUMPTIONS = (
    ("BassilyTT (NeurIPS 2018) Algorithm 3 as quoted in the paper's Appendix D: every histogram's top-vs-second "
    "margin is at least eta n (the paper observed eta ~ 0.4 with coordinated ensembles)."),
    ("Condition: eta n >= 32 sqrt(2)/eps * ln(4m/delta) * sqrt(ln(2/delta)) for m tokens at (eps, delta)-DP "
    "(constants as the Hot PATE paper's Appendix D quotes them)."),
)


def bassily_tt_teachers(eta: float, epsilon: float, delta: float, tokens: int) -> BassilyTTTeachers:
    """Teachers needed for ``tokens`` tokens: ``n = 32 sqrt(2) / (eps eta) ln(4m/delta) sqrt(ln(2/delta))``.

    Known values: ``eta = 0.4, eps = 1, delta = 1e-6``: ``m = 1e3 -> 9527.93``, ``m = 1e6 -> 12504.77``.
    """
    eta, epsilon, delta = _check_btt(eta, epsilon, delta)
    m = _check_count("tokens", tokens, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    n = BTT_CONSTANT / (epsilon * eta) * math.log(4.0 * m / delta) * math.sqrt(math.log(2.0 / delta))
    return BassilyTTTeachers(eta=eta, epsilon=epsilon, delta=delta, tokens=m, n_required=n,
                             num_teachers=math.ceil(n * (1 - 1e-12)), assumptions=_BTT_ASSUMPTIONS)


def bassily_tt_tokens(eta: float, epsilon: float, delta: float, num_teachers: float) -> BassilyTTTokens:
    """Tokens ``num_teachers`` teachers afford: ``m_max = floor((delta/4) exp(eta n eps / (32 sqrt(2)
    sqrt(ln(2/delta)))))``, exponential in ``n`` (computed in log space; ``m_max`` is ``None`` above
    ``1e300``).  Known values (``eta = 0.4, eps = 1, delta = 1e-6``): ``n = 10000 -> 2990``,
    ``12000 -> 309955``, ``15000 -> 327068772``."""
    eta, epsilon, delta = _check_btt(eta, epsilon, delta)
    n = check_real("num_teachers", num_teachers, minimum=0.0, min_open=True, maximum=MAX_COUNT)
    x = eta * n * epsilon / (BTT_CONSTANT * math.sqrt(math.log(2.0 / delta)))
    log_m = math.log(delta / 4.0) + x
    if log_m < 690.0:
        m_max = math.floor(delta / 4.0 * math.exp(x)) if x < 700 else math.floor(math.exp(log_m))
    else:
        m_max = None
    return BassilyTTTokens(eta=eta, epsilon=epsilon, delta=delta, num_teachers=n, m_max=m_max,
                           log10_m_max=log_m / math.log(10.0), assumptions=_BTT_ASSUMPTIONS)


# -- what a run's budget buys under an agreement assumption (``plan best``) ----------------------------------

#: The most teachers (in all groups together) a run plan takes: the count law is a vector of ``n + 1`` floats
#: per group size, evaluated for every configuration and step parameter compared.
MAX_PLAN_TEACHERS = 10**6
#: The most steps :func:`step_limits` counts for plain composition (the exact composition of that many steps
#: holds a law of about that many weights); a budget that affords more is reported at this limit, ``capped``.
MAX_PLAN_STEPS = MAX_PLAN_QUERIES


def agreement_count_pmf(num_teachers: int, alpha: float) -> np.ndarray:
    """The law of the shared token's vote count ``c`` (index ``0..n``) in one coordinated histogram of the
    paper's alpha-mixture teachers (Section 6: ``p^(i) = alpha s + (1 - alpha) r^(i)``, one shared token and
    one token of each teacher's own).

    Coordinated votes (Algorithm 1) share one ``u_j ~ Exp(1)`` per token; teacher ``i`` votes for the shared
    token when ``alpha / u_s > (1 - alpha) / u_i``.  Given ``y = u_s / alpha`` this happens with probability
    ``exp(-y (1 - alpha))`` independently over teachers, and ``y ~ Exp(alpha)``, so ``c`` is the beta-binomial
    ``BetaBin(n, alpha / (1 - alpha), 1)`` (``c = n`` when ``alpha = 1``).  The other ``n - c`` teachers vote
    for their own tokens, one vote each.  ``scipy.stats.betabinom``; ``n <= MAX_PLAN_TEACHERS``."""
    from scipy.stats import betabinom

    n = _check_count("num_teachers", num_teachers, 1, MAX_PLAN_TEACHERS,
                     "the count law is a vector of num_teachers + 1 floats for every configuration compared")
    alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0, min_open=True)
    if alpha == 1.0:
        pmf = np.zeros(n + 1)
        pmf[n] = 1.0
        return pmf
    pmf = betabinom.pmf(np.arange(n + 1), n, alpha / (1.0 - alpha), 1.0)
    return pmf / math.fsum(pmf)


def expected_steps_to_hits(hits: int, hit_probability: float, max_steps: int) -> float:
    """``E[min(max_steps, T)]``, ``T`` the step of the ``hits``-th target hit when every step hits independently
    with probability ``p = hit_probability``: the expected number of queries a target-charged run makes before
    its accountant stops it (at ``hits`` hits or ``max_steps`` queries, whichever comes first).

    The hits among the first ``min(max_steps, T)`` steps are ``min(hits, X)`` with ``X ~ Bin(max_steps, p)``, and
    that number of steps is a stopping time, so by Wald's identity ``p E[min(max_steps, T)] = E[min(hits, X)] =
    sum_{h < hits} P[X > h]``.  ``p = 0`` gives ``max_steps``; ``hits = 0`` gives 0 (no query runs)."""
    hits = check_int("hits", hits, minimum=0)
    p = check_real("hit_probability", hit_probability, minimum=0.0, maximum=1.0)
    max_steps = check_int("max_steps", max_steps, minimum=0)
    if hits == 0 or max_steps == 0:
        return 0.0
    if p == 0.0:
        return float(max_steps)
    from scipy.stats import binom

    below = float(np.sum(binom.sf(np.arange(hits), max_steps, p)))
    return min(float(max_steps), below / p)


def steps_to_hits_quantile(hits: int, hit_probability: float, level: float, max_steps: int) -> int:
    """The ``level`` quantile of ``min(max_steps, T)`` (:func:`expected_steps_to_hits`): ``T - hits`` is negative
    binomial.  Used to give a run enough records that they rarely end it before its budget does."""
    hits = check_int("hits", hits, minimum=0)
    p = check_real("hit_probability", hit_probability, minimum=0.0, maximum=1.0)
    level = check_real("level", level, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    max_steps = check_int("max_steps", max_steps, minimum=0)
    if hits == 0 or max_steps == 0:
        return 0
    if p == 0.0:
        return max_steps
    from scipy.stats import nbinom

    failures = float(nbinom.ppf(level, hits, p))
    return max_steps if not math.isfinite(failures) or hits + failures >= max_steps else hits + int(failures)


@dataclasses.dataclass(frozen=True)
class StepLimits(_Result):
    """What :func:`step_limits` returns: how far the budget ``(epsilon, delta)`` lets one group of a run go with
    one mechanism under one accountant, as that accountant (built by ``generate``) counts it.

    Plain composition (every step charged): ``max_steps`` (``capped`` when the budget affords at least
    :data:`MAX_PLAN_STEPS`); target charging: ``max_hits`` target hits and ``max_queries`` queries, hits or not.
    """

    accountant: str
    epsilon: float
    delta: float
    max_steps: int | None
    max_hits: int | None
    max_queries: int | None
    capped: bool


def step_limits(accountant: str, event, epsilon: float, delta: float) -> StepLimits:
    """The limits the ``accountant`` registered under that name (:mod:`pate_accountant.registry`, with its
    defaults, as ``generate`` builds it) puts on a run of steps that each announce ``event``, at budget
    ``(epsilon, delta)``.

    * ``"target-charging"``: the split the accountant makes at its first query
      (:func:`pate_accountant.tct.target_charging_split` of the event's class, checked as the accountant checks
      it, :func:`~pate_accountant.accountants.target_charging.target_class`): its ``max_hits`` and
      ``max_queries``.
    * any other accountant: the largest ``k`` such that ``can_afford(event, k)`` on a fresh budgeted accountant
      (doubling, then bisection; the accountant's own composition, so the count is never above what it allows).

    Raises ``UnsupportedEventError`` when the accountant cannot account for the event."""
    epsilon, delta = _check_budget(epsilon, delta)
    cls = registry.accountant_class(accountant)
    if accountant == "target-charging":
        probe = cls()
        target = target_class(event)
        split = target_charging_split(epsilon, delta, target.epsilon0, target.q, target.query_delta,
                                      share=probe.query_delta_share, composition=probe.composition)
        return StepLimits(accountant, epsilon, delta, None, split.max_hits, split.max_queries, False)

    build = getattr(cls, "for_run", cls)  # as generate builds it (Accountant.for_run), where the class has that

    def fits(k: int) -> bool:
        return build(budget=(epsilon, delta)).can_afford(event, k)

    if not fits(1):
        return StepLimits(accountant, epsilon, delta, 0, None, None, False)
    # never probe beyond the cap: an accountant composing that many steps at once needs memory in proportion
    steps = largest_fitting(lambda k: k <= MAX_PLAN_STEPS and fits(k), start=1)
    return StepLimits(accountant, epsilon, delta, steps, None, None, steps == MAX_PLAN_STEPS)


@dataclasses.dataclass(frozen=True)
class RunExpectation(_Result):
    """What :func:`run_expectation` returns: ``steps`` (charged mechanism runs, all groups), ``tokens`` (private
    tokens released) and ``exact``: whether they are expected values under the model, or lower bounds."""

    steps: float
    tokens: float
    exact: bool


def run_expectation(limits: StepLimits, token_probability: float, target_probability: float = 0.0, *,
                    groups: int = 1, steps_per_group: int | None = None) -> RunExpectation:
    """The expected charged steps and private tokens of a run of ``groups`` disjoint groups, each step of which
    independently releases a private token with probability ``token_probability`` (and, under target charging,
    hits the target with probability ``target_probability``).  ``steps_per_group``: the most steps a group's
    records leave it (``None``: no limit but the budget's).

    Groups compose in parallel (docs/groups.md): under plain composition each group may make ``max_steps`` steps;
    under target charging each group may reach ``max_hits`` hits, while the queries of all groups together pay
    the one query reserve (``max_queries`` in all).  With one group the figure is the expected value
    (:func:`expected_steps_to_hits`); with several groups under target charging it is a lower bound, each group
    counted up to ``max_queries // groups`` queries (``min(Q, sum x_g) >= sum min(Q/G, x_g)``), exact when the
    records cap the groups below that."""
    groups = check_int("groups", groups, minimum=1)
    p = check_real("token_probability", token_probability, minimum=0.0, maximum=1.0)
    t = check_real("target_probability", target_probability, minimum=0.0, maximum=1.0)
    cap = None if steps_per_group is None else check_int("steps_per_group", steps_per_group, minimum=0)
    if limits.max_steps is not None:  # plain composition: every step charged, each group its own envelope
        per_group = limits.max_steps if cap is None else min(limits.max_steps, cap)
        return RunExpectation(float(groups * per_group), groups * per_group * p, True)
    share = limits.max_queries // groups
    per_group_cap = share if cap is None else min(share, cap)
    steps = groups * expected_steps_to_hits(limits.max_hits, t, per_group_cap)
    exact = groups == 1 or (cap is not None and groups * cap <= limits.max_queries)
    return RunExpectation(steps, steps * p, exact)


# -- the public-candidate query and individual charging (``plan best``) --------------------------------------


def included_count_pmf(count_pmf, num_teachers: int) -> np.ndarray:
    """The law of ``c'``, the number of teachers counted by one individual-charging query on a candidate token
    whose vote count ``c`` has the law ``count_pmf`` (index ``0..m``), with ``n = num_teachers`` teachers: the
    generator includes each teacher independently with probability ``nu ~ U[1/n, 1]``
    (``ensembles.generation.individual_charging_draws``), so ``c' | c, nu ~ Bin(c, nu)``.

    Integrating over ``nu``: ``P[c' = k | c] = (1 - P[Bin(c + 1, 1/n) >= k + 1]) / ((c + 1)(1 - 1/n))`` for
    ``0 <= k <= c`` (over ``U[0, 1]`` the binomial mixture is uniform on ``0..c``; the part of ``nu`` below ``1/n``
    is taken off through ``I_{1/n}(k + 1, c - k + 1) = P[Bin(c + 1, 1/n) >= k + 1]``).  The binomial of mean at
    most ``(m + 1)/n`` has a short tail, which is summed up to where it is below ``1e-30``.  ``n = 1``: ``nu = 1``,
    ``c' = c``.  Returns an array of ``m + 1`` probabilities."""
    pmf = np.asarray(count_pmf, dtype=np.float64)
    if pmf.ndim != 1 or pmf.size < 1 or not np.all(np.isfinite(pmf)) or (pmf < 0).any():
        raise ValueError("count_pmf must be a non-empty vector of non-negative probabilities")
    n = _check_count("num_teachers", num_teachers, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    if n == 1:
        return pmf.copy()
    m = pmf.size - 1
    c = np.arange(m + 1, dtype=np.float64)
    weight = pmf / ((c + 1.0) * (1.0 - 1.0 / n))
    out = np.cumsum(weight[::-1])[::-1]  # W(k) = sum_{c >= k} w(c)
    # u_k = sum_c w(c) P[Bin(c + 1, x) >= k + 1] = sum_{j > k} v_j with v_j = sum_c w(c) P[Bin(c + 1, x) = j],
    # x = 1/n: the binomials' laws by their ratio recurrence, until past their mode and below 1e-40.
    x = 1.0 / n
    ratio = x / (1.0 - x)
    law = np.exp((c + 1.0) * math.log1p(-x))  # P[Bin(c + 1, x) = 0]
    v = [float(weight @ law)]
    mode = (m + 2) * x
    for j in range(m + 1):
        law = law * np.maximum(c - j + 1.0, 0.0) / (j + 1.0) * ratio  # P[Bin(c + 1, x) = j + 1]
        v.append(float(weight @ law))
        if j + 1 > mode and float(law.max()) < 1e-40:
            break
    tail = np.cumsum(np.asarray(v)[::-1])[::-1]  # tail[j] = sum_{i >= j} v_i
    k = min(m + 1, tail.size - 1)
    out[:k] -= tail[1:k + 1]
    return np.clip(out, 0.0, None)


def individual_charges(hits: int, charged_per_hit: int, num_teachers: int, spread: str = "worst") -> int:
    """The worst teacher's charges after ``hits`` individual-charging hits that each charge
    ``charged_per_hit`` of ``num_teachers`` teachers: ``"worst"``, every hit charges the same teachers (the
    worst teacher is charged on every hit: ``hits``, the sound assumption when nothing is known of who is
    counted); ``"even"``, the charges are spread evenly, :func:`compare_accounting`'s rule
    ``min(hits, ceil(hits g / n))`` (optimistic)."""
    hits = check_int("hits", hits, minimum=0)
    n = _check_count("num_teachers", num_teachers, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    g = check_int("charged_per_hit", charged_per_hit, minimum=1, maximum=n)
    if spread == "worst":
        return hits
    if spread == "even":
        return _per_teacher(hits, g, n)
    raise ValueError(f"spread must be 'worst' or 'even', got {spread!r}")


def individual_charging_hits(per_teacher_limit: int, charged_per_hit: int, num_teachers: int,
                             spread: str = "worst", *, max_hits: int = MAX_PLAN_STEPS) -> int:
    """The most hits a run under individual charging makes before its worst teacher reaches
    ``per_teacher_limit`` charges, under the ``spread`` of :func:`individual_charges` (at most ``max_hits``):
    ``"worst"`` gives the limit itself (a sound plan: whoever is counted, no teacher is charged more often than
    every hit), ``"even"`` about ``limit x n / g`` (what the run could reach if the counted teachers changed
    evenly from hit to hit)."""
    limit = check_int("per_teacher_limit", per_teacher_limit, minimum=0)
    max_hits = check_int("max_hits", max_hits, minimum=0)
    individual_charges(0, charged_per_hit, num_teachers, spread)  # checks the arguments
    if spread == "worst":
        return min(limit, max_hits)
    return largest_fitting(lambda h: h <= max_hits and _per_teacher(h, charged_per_hit, num_teachers) <= limit)
