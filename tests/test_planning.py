"""Budget planning (pate_accountant/planning/), the Section 6 figures (pate_app/experiments/section6.py) and
``pate-accountant plan`` (docs/planning.md).  Known values are our own computations of the formulas (docs/planning.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pate_accountant import (
    BoundaryWrapperEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    Release,
    planning,
)
from pate_accountant.accountants.target_charging import (
    TargetChargingAccountant,
    target_class,
)
from pate_accountant.cli import main
from pate_accountant.composition import kov
from pate_accountant.tct import (
    NO_LIMIT,
    query_delta_epsilon,
    target_charging_split,
    tct_epsilon,
    tct_max_hits,
    wrapped_query_delta,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- target hits: the known tau_max table -----------------------------------------------------------------

TAU_TABLE = {  # eps0: (opt q=1/3, opt q=0.4, opt q=0.5, drv q=1/3, drv q=0.4, drv q=0.5), total (1, 1e-6)
    0.02: (20, 28, 41, 8, 12, 19),
    0.01: (130, 164, 218, 69, 89, 120),
    0.005: (627, 771, 990, 359, 444, 575),
    0.002: (4356, 5276, 6666, 2577, 3128, 3965),
}
QS = (1 / 3, 0.4, 0.5)


@pytest.mark.parametrize("eps0", sorted(TAU_TABLE))
def test_target_hits_reproduce_the_known_tau_max_table(eps0):
    expected = TAU_TABLE[eps0]
    for i, (composition, q) in enumerate([(c, q) for c in ("optimal", "drv") for q in QS]):
        plan = planning.target_hits(1.0, 1e-6, eps0, q=q, composition=composition)
        assert plan.hits == expected[i], (eps0, composition, q)
        assert plan.epsilon_spent <= 1.0 < plan.epsilon_next_hit
        assert plan.paper_hits == pytest.approx((10 * eps0) ** -2)


def test_target_hits_result_fields_and_plain_composition():
    plan = planning.target_hits(1.0, 1e-6, 0.01)
    d = plan.as_dict()
    assert d["hits"] == 130 and d["composition"] == "optimal" and d["q"] == pytest.approx(1 / 3)
    # delta0 = 0 (a pure inner): no per-query delta, no reserve, no query limit, the pure bound itself
    assert d["max_queries"] is None and d["per_query_delta"] == 0.0 and d["reserved_delta"] == 0.0
    assert plan.epsilon_spent == tct_epsilon(130, 1 / 3, 0.01, 1e-6)
    assert plan.epsilon_next_hit == tct_epsilon(131, 1 / 3, 0.01, 1e-6)
    # known values: k_max for total (1, 1e-6) under exact optimal composition: eps0 = 0.01 -> 562
    assert d["plain_queries"]["optimal"] == 562
    assert d["plain_queries"]["basic"] == 100
    assert d["plain_queries"]["kov"] <= d["plain_queries"]["optimal"]
    assert d["plain_queries"]["drv"] <= d["plain_queries"]["optimal"]
    assert d["private_draws"] >= d["hits"]
    assert all(isinstance(a, str) and a for a in d["assumptions"])
    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize("eps0, k_max", [(0.1, 10), (0.05, 26), (0.01, 562)])
def test_plain_max_queries_known_values(eps0, k_max):
    assert planning.plain_max_queries(eps0, 1.0, 1e-6) == k_max
    assert planning.plain_epsilon(k_max, eps0, 1e-6) <= 1.0 < planning.plain_epsilon(k_max + 1, eps0, 1e-6)


@pytest.mark.parametrize(
    "k, eps0, delta, drv, kov33, optimal",
    [
        (100, 0.1, 1e-6, 6.308231, 4.8, 4.774568),
        (100, 0.1, 1e-5, 5.850235, 4.4, 4.306791),
        (1000, 0.01, 1e-6, 1.762760, 1.38, 1.365447),
        (10000, 0.01, 1e-6, 6.261538, None, 4.885516),
        (50, 0.5, 1e-6, 34.802643, 21.0, 20.301001),
    ],
)
def test_plain_epsilon_composition_table(k, eps0, delta, drv, kov33, optimal):
    assert planning.plain_epsilon(k, eps0, delta, method="basic") == pytest.approx(k * eps0)
    assert planning.plain_epsilon(k, eps0, delta, method="drv") == pytest.approx(drv, abs=1e-6)
    assert planning.plain_epsilon(k, eps0, delta, method="optimal") == pytest.approx(optimal, abs=1e-6)
    if kov33 is not None:
        assert planning.plain_epsilon(k, eps0, delta, method="kov") == pytest.approx(kov33, abs=1e-9)


@pytest.mark.parametrize("k, eps0, delta0, delta", [(7, 0.3, 0.0, 1e-3), (40, 0.1, 1e-7, 1e-5), (200, 0.05, 0.0, 1e-6)])
def test_kov_grid_matches_dp_accounting(k, eps0, delta0, delta):
    ours = planning.plain_epsilon(k, eps0, delta, delta0=delta0, method="kov")
    assert ours == pytest.approx(kov(eps0, delta0, k, delta), abs=1e-9)


def test_plain_composition_with_per_step_delta():
    assert planning.plain_epsilon(10, 0.1, 1e-6, delta0=2e-7, method="basic") == math.inf
    assert planning.plain_epsilon(10, 0.1, 1e-6, delta0=2e-7, method="drv") == math.inf
    assert planning.plain_max_queries(0.1, 10.0, 1e-6, delta0=2e-7, method="basic") == 5


# -- the Section 6 curve ------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps0", [0.01, 0.005, 0.002])
def test_section6_curve_within_factor_of_paper(eps0):
    """With exact optimal composition inside and q = 1/3 (the charge of a
    BoundaryWrapper event), our target hits for total (1, 1e-6) lie within [0.7, 2.7] x (10 eps0)^-2.
    (DRV inside with q = 1/3 gives 69 at eps0 = 0.01, just below 0.7; DRV with q = 0.4 is within.)"""
    plan = planning.target_hits(1.0, 1e-6, eps0)
    assert 0.7 <= plan.hits / plan.paper_hits <= 2.7
    drv = planning.target_hits(1.0, 1e-6, eps0, q=0.4, composition="drv")
    assert 0.7 <= drv.hits / drv.paper_hits <= 2.7


# -- yields and teachers ----------------------------------------------------------------------------------


def test_teachers_and_yields_paper_relation():
    # eps0 = 0.01, delta0 = 1e-6: n = 2763.1 and about 1381.6 yields for eps = 1
    assert planning.c_delta(1e-6) == pytest.approx(2 * math.log(1e6))
    assert planning.teachers_for(0.01, 1e-6) == pytest.approx(2763.1, abs=0.05)
    y = planning.yields(1.0, 1e-6, 0.01)
    assert y.num_teachers == pytest.approx(2763.1, abs=0.05)
    assert y.num_teachers_needed == 2764
    assert y.paper_yields == pytest.approx(1381.6, abs=0.05)
    assert y.paper_formula_yields == pytest.approx(1381.6, abs=0.05)  # 0.005 n^2 / C_delta
    assert y.yields_per_hit == pytest.approx(0.01 * 2763.102 / 2, rel=1e-5)
    assert y.hits == 130
    assert y.yields == pytest.approx(130 * y.yields_per_hit)
    assert y.yields / y.paper_yields == pytest.approx(1.3)
    assert not any(a.startswith("WARNING") for a in y.assumptions)


def test_yields_with_given_teachers():
    y = planning.yields(1.0, 1e-6, 0.01, num_teachers=5000)
    assert y.yields_per_hit == pytest.approx(25.0)
    assert y.paper_formula_yields == pytest.approx(0.005 * 5000**2 / planning.c_delta(1e-6))
    few = planning.yields(1.0, 1e-6, 0.01, num_teachers=1000)
    assert any(a.startswith("WARNING") for a in few.assumptions)


# -- plan for tokens ----------------------------------------------------------------------------------------


def test_plan_for_tokens_example():
    plan = planning.plan_for_tokens(1000, 1.0, 1e-6)
    cd = planning.c_delta(1e-6)
    assert plan.hits_needed == math.ceil(2000 / cd) == 73
    assert plan.hits >= plan.hits_needed
    assert plan.epsilon_spent <= 1.0 < plan.epsilon_next_hit
    assert plan.num_teachers == math.ceil(cd / plan.eps0)
    assert plan.expected_yields >= 1000
    assert plan.paper_eps0 == pytest.approx(math.sqrt(0.005 * cd / 1000))
    # the paper's eps0 for 1000 tokens and ours are close (ours is the TCT bound's)
    assert 0.5 < plan.eps0 / plan.paper_eps0 < 2.0


@FAST
@given(
    tokens=st.integers(1, 3000),
    epsilon=st.floats(0.5, 2.0),
    delta=st.sampled_from([1e-6, 1e-5]),
    q=st.sampled_from([1 / 3, 0.4]),
    composition=st.sampled_from(["optimal", "drv"]),
)
def test_plan_for_tokens_never_overshoots_and_is_maximal(tokens, epsilon, delta, q, composition):
    plan = planning.plan_for_tokens(tokens, epsilon, delta, q=q, composition=composition)
    spent = tct_epsilon(plan.hits, q, plan.eps0, delta, composition=composition)
    assert spent <= epsilon
    assert plan.epsilon_spent == spent
    assert tct_epsilon(plan.hits + 1, q, plan.eps0, delta, composition=composition) > epsilon
    assert plan.hits == tct_max_hits(q, plan.eps0, epsilon, delta, composition=composition)
    assert plan.hits >= plan.hits_needed
    assert plan.expected_yields >= tokens
    # eps0 is maximal: a slightly larger level cannot afford the hits needed
    assert tct_epsilon(plan.hits_needed, q, plan.eps0 * (1 + 1e-6), delta, composition=composition) > epsilon
    assert plan.num_teachers >= plan.num_teachers_exact


@FAST
@given(
    eps0=st.floats(0.01, 0.2),
    epsilon=st.floats(0.2, 3.0),
    q=st.floats(0.1, 1.0),
)
def test_target_hits_are_calibrated(eps0, epsilon, q):
    hits = tct_max_hits(q, eps0, epsilon, 1e-6)
    assert tct_epsilon(hits + 1, q, eps0, 1e-6) > epsilon
    if hits:
        assert tct_epsilon(hits, q, eps0, 1e-6) <= epsilon


@FAST
@given(eps0=st.floats(0.01, 0.1), e1=st.floats(0.1, 3.0), e2=st.floats(0.1, 3.0))
def test_target_hits_monotone_in_epsilon(eps0, e1, e2):
    lo, hi = sorted((e1, e2))
    assert tct_max_hits(1 / 3, eps0, lo, 1e-6) <= tct_max_hits(1 / 3, eps0, hi, 1e-6)
    assert planning.plain_max_queries(eps0, lo, 1e-6) <= planning.plain_max_queries(eps0, hi, 1e-6)


# -- compare accounting -------------------------------------------------------------------------------------


def test_compare_accounting_known_values():
    r = planning.compare_accounting(10000, 0.01, 1e-6, 20000, target_rate=0.01, budget_epsilon=1.0)
    assert r.hits == 100
    assert r.plain["drv"] == pytest.approx(6.261538, abs=1e-6)
    assert r.plain["optimal"] == pytest.approx(4.885516, abs=1e-6)
    assert r.plain["best"] == min(r.plain[m] for m in planning.PLAIN_METHODS)
    assert r.target_charging == pytest.approx(0.889968, abs=1e-6)  # tau = 100, q = 1/3, eps0 = 0.01
    assert r.charged_per_hit == math.ceil(planning.c_delta(1e-6) / 0.01)
    assert r.charges_per_teacher == math.ceil(100 * r.charged_per_hit / 20000)
    assert r.individual_charging <= r.target_charging < r.plain["best"]
    mq = r.max_queries
    assert mq["plain"] == 562
    assert mq["target_charging"] == 13000  # 130 hits at rate 0.01
    assert mq["individual_charging"] >= mq["target_charging"] > mq["plain"]
    json.dumps(r.as_dict(), allow_nan=False)


def test_compare_accounting_every_teacher_charged_equals_target_charging():
    r = planning.compare_accounting(3000, 0.01, 1e-6, 500, target_rate=0.02, charged_per_hit=500)
    assert r.charges_per_teacher == r.hits == 60
    assert r.individual_charging == r.target_charging
    zero = planning.compare_accounting(1000, 0.01, 1e-6, 100, target_rate=0.0, budget_epsilon=1.0)
    assert zero.hits == 0 and zero.target_charging == 0.0
    assert zero.max_queries["target_charging"] is None


def test_compare_accounting_long_runs_do_not_warn():
    """k eps0 far above 350: the exact optimal composition's expm1 overflows harmlessly (filterwarnings=error)."""
    r = planning.compare_accounting(50000, 0.01, 1e-6, 20000, target_rate=0.005)
    assert r.plain["optimal"] == pytest.approx(12.594447, abs=1e-5)
    assert r.plain["kov"] == pytest.approx(12.6, abs=1e-9)
    assert r.target_charging < r.plain["best"]


# -- delta0: the delta_A of a boundary-wrapped approximate inner (every query pays) --------------------------


def wrapped(eps_a: float, delta_a: float, q: float = 1 / 3) -> BoundaryWrapperEvent:
    """A boundary-wrapper event at level ``2 eps_A`` around an ``(eps_A, delta_A)`` inner step."""
    return BoundaryWrapperEvent(EpsilonDeltaEvent(eps_a, delta_a), epsilon=2 * eps_a, q=q)


#: (epsilon, delta, eps_A, delta_A, composition); 1e-12 and 1e-13 put floor(reserve / w) at the edge of the
#: accountant's rounding of Delta (see test_budgeted_transcript_of_non_hits_stays_within_budget).
WRAPPED_CASES = [
    (1.0, 1e-6, 0.01, 1e-10, "optimal"),
    (1.0, 1e-6, 0.005, 1e-11, "optimal"),
    (2.0, 1e-5, 0.01, 1e-9, "optimal"),
    (1.0, 1e-6, 0.005, 1e-12, "drv"),
    (1.0, 1e-6, 0.01, 1e-13, "optimal"),
    (0.5, 1e-6, 0.002, 2.5e-10, "optimal"),
]


@pytest.mark.parametrize("epsilon, delta, eps_a, delta_a, composition", WRAPPED_CASES)
def test_target_hits_of_wrapped_approximate_inner_match_the_budgeted_accountant(
    epsilon, delta, eps_a, delta_a, composition
):
    """planning.target_hits and a budgeted TargetChargingAccountant split the budget the same way (one
    function, target_charging_split): the same hit limit and the same query limit."""
    plan = planning.target_hits(epsilon, delta, 2 * eps_a, q=1 / 3, delta0=delta_a, composition=composition)
    event = wrapped(eps_a, delta_a)
    acc = TargetChargingAccountant(budget=(epsilon, delta), composition=composition)
    assert plan.hits == acc.max_hits_for(event)
    acc.compose(event)  # the first query fixes the class; now max_queries is known
    assert plan.max_queries == acc.max_queries
    w = wrapped_query_delta(delta_a)
    assert plan.per_query_delta == w == target_class(event).query_delta == pytest.approx(2 * delta_a, rel=1e-9)
    assert plan.reserved_delta == delta / 2
    assert plan.max_queries in (math.floor(delta / 2 / w), math.floor(delta / 2 / w) - 1)
    # the bound at those hits with the reserve fully used stays within the budget; one more hit does not
    assert plan.epsilon_spent == (
        tct_epsilon(plan.hits, 1 / 3, 2 * eps_a, delta / 2, composition=composition) - math.log1p(-delta / 2)
    )
    assert plan.epsilon_spent <= epsilon < plan.epsilon_next_hit
    # the reserve costs hits: never more than the pure inner's
    pure = planning.target_hits(epsilon, delta, 2 * eps_a, q=1 / 3, composition=composition)
    assert plan.hits <= pure.hits and pure.max_queries is None
    assert any("every query, hit or not, pays" in a for a in plan.assumptions)
    json.dumps(plan.as_dict(), allow_nan=False)


@pytest.mark.parametrize("epsilon, delta, eps_a, delta_a, composition", WRAPPED_CASES)
def test_budgeted_transcript_of_non_hits_stays_within_budget(epsilon, delta, eps_a, delta_a, composition):
    """An explicit transcript: max_queries queries that never hit run, the next one is refused, and what was
    spent is within the budget (the per-query deltas included, float rounding included)."""
    plan = planning.target_hits(epsilon, delta, 2 * eps_a, q=1 / 3, delta0=delta_a, composition=composition)
    event = wrapped(eps_a, delta_a)
    acc = TargetChargingAccountant(budget=(epsilon, delta), composition=composition)
    acc.record_outcomes(event, np.zeros(plan.max_queries, dtype=bool))
    assert acc.queries == plan.max_queries == acc.max_queries and acc.hits == 0
    assert not acc.can_afford(event)
    with pytest.raises(BudgetExhaustedError):
        acc.record(Release(None, event, target_hit=False))
    with pytest.raises(BudgetExhaustedError):
        acc.compose(event)
    eps, spent_delta = acc.spent()
    assert eps <= epsilon and spent_delta <= delta
    assert acc.query_delta <= plan.reserved_delta
    # every query paid: Delta is max_queries * w, and tau = 1 (queries ran after the last, absent, hit)
    assert acc.query_delta == pytest.approx(plan.max_queries * plan.per_query_delta, rel=1e-9)
    assert eps == pytest.approx(
        tct_epsilon(1, 1 / 3, 2 * eps_a, delta / 2, composition=composition) + query_delta_epsilon(acc.query_delta)
    )


def test_budgeted_transcript_of_hits_stops_at_the_planned_hits():
    epsilon, delta, eps_a, delta_a = 1.0, 1e-6, 0.01, 1e-11
    plan = planning.target_hits(epsilon, delta, 2 * eps_a, delta0=delta_a)
    assert 0 < plan.hits < plan.max_queries
    event = wrapped(eps_a, delta_a)
    acc = TargetChargingAccountant(budget=(epsilon, delta))
    acc.record_outcomes(event, np.arange(3 * plan.hits) % 3 == 2)  # hit every third query, last one a hit
    assert acc.hits == plan.hits and acc.queries == 3 * plan.hits
    assert not acc.can_afford(event)
    with pytest.raises(BudgetExhaustedError):
        acc.record(Release(None, event, target_hit=False))
    eps, spent_delta = acc.spent()
    assert eps <= plan.epsilon_spent <= epsilon and spent_delta <= delta


def test_target_charging_split_is_the_accountants_split():
    w = wrapped_query_delta(1e-10)
    split = target_charging_split(1.0, 1e-6, 0.02, 1 / 3, w)
    assert split.reserved == 5e-7 and split.delta_tct == 5e-7 and split.max_queries == 2500
    assert split.epsilon_tct == pytest.approx(1.0 + math.log1p(-5e-7), rel=1e-15)
    assert split.max_hits == tct_max_hits(1 / 3, 0.02, split.epsilon_tct, 5e-7)
    pure = target_charging_split(1.0, 1e-6, 0.01, 1 / 3)
    assert pure == (130, NO_LIMIT, 1.0, 1e-6, 0.0)
    custom = target_charging_split(1.0, 1e-6, 0.02, 1 / 3, w, share=0.2)
    acc = TargetChargingAccountant(budget=(1.0, 1e-6), query_delta_share=0.2)
    acc.compose(wrapped(0.01, 1e-10))
    assert (custom.max_hits, custom.max_queries) == (acc.max_hits, acc.max_queries) == (custom.max_hits, 1000)
    assert planning.target_hits(1.0, 1e-6, 0.02, delta0=1e-10, query_delta_share=0.2).max_queries == 1000


def test_tct_bound_has_no_per_draw_delta_any_more():
    """The per-private-draw delta0 of earlier versions under-counted approximate inners (every query pays, not
    only the private draws); the TCT functions now state only the pure bound."""
    with pytest.raises(TypeError):
        tct_epsilon(10, 1 / 3, 0.01, 1e-6, delta0=1e-10)
    with pytest.raises(TypeError):
        tct_max_hits(1 / 3, 0.01, 1.0, 1e-6, delta0=1e-10)


def test_delta0_too_large_for_one_query_is_refused():
    # w = 1 - (1 - 4e-7)^2 ~ 8e-7 > the reserve 5e-7: no query at all fits
    with pytest.raises(ValueError, match=r"^delta0 = 4e-07 leaves no query"):
        planning.target_hits(1.0, 1e-6, 0.01, delta0=4e-7)
    with pytest.raises(ValueError, match=r"^delta0\b"):
        planning.plan_for_tokens(100, 1.0, 1e-6, delta0=4e-7)
    # 2.5e-7 is still one query (w is a hair below 5e-7)
    assert planning.target_hits(1.0, 1e-6, 0.01, delta0=2.5e-7).max_queries == 1


def test_yields_and_plan_for_tokens_with_wrapped_approximate_inner():
    y = planning.yields(1.0, 1e-6, 0.01, delta0=1e-10)
    th = planning.target_hits(1.0, 1e-6, 0.01, delta0=1e-10)
    assert (y.hits, y.max_queries, y.epsilon_spent) == (th.hits, 2500, th.epsilon_spent)
    assert y.hits < planning.yields(1.0, 1e-6, 0.01).hits == 130
    # about eps0 n = C_delta = 27.6 queries per hit: 119 hits need ~3300 queries > 2500, and the plan says so
    assert any(a.startswith("WARNING: max_queries = 2500") for a in y.assumptions)
    assert planning.yields(1.0, 1e-6, 0.01).max_queries is None
    assert not any(a.startswith("WARNING") for a in planning.yields(1.0, 1e-6, 0.01, delta0=1e-12).assumptions)

    t = planning.plan_for_tokens(1000, 1.0, 1e-6, delta0=1e-10)
    assert t.hits >= t.hits_needed and t.expected_yields >= 1000
    assert t.epsilon_spent <= 1.0 < t.epsilon_next_hit
    again = planning.target_hits(1.0, 1e-6, t.eps0, delta0=1e-10)
    assert (t.hits, t.max_queries, t.epsilon_spent) == (again.hits, again.max_queries, again.epsilon_spent)
    # the reserve costs epsilon and delta: a smaller eps0 (more teachers) than for a pure inner
    assert t.eps0 < planning.plan_for_tokens(1000, 1.0, 1e-6).eps0
    # eps0 is maximal for the TCT part of the split
    split = target_charging_split(1.0, 1e-6, t.eps0, 1 / 3, wrapped_query_delta(1e-10))
    assert tct_epsilon(t.hits_needed, 1 / 3, t.eps0 * (1 + 1e-6), split.delta_tct) > split.epsilon_tct


def test_compare_accounting_charges_every_query_of_an_approximate_inner():
    w = wrapped_query_delta(1e-10)
    r = planning.compare_accounting(1000, 0.01, 1e-6, 20000, target_rate=0.01, delta0=1e-10, budget_epsilon=1.0)
    assert r.hits == 10 and r.per_query_delta == w and r.total_query_delta == 1000 * w
    assert r.target_charging == tct_epsilon(10, 1 / 3, 0.01, 1e-6 - 1000 * w) - math.log1p(-1000 * w)
    assert r.individual_charging == tct_epsilon(r.charges_per_teacher, 1 / 3, 0.01, 1e-6 - 1000 * w) - math.log1p(
        -1000 * w
    )
    pure = planning.compare_accounting(1000, 0.01, 1e-6, 20000, target_rate=0.01, budget_epsilon=1.0)
    assert r.target_charging > pure.target_charging and pure.total_query_delta == 0.0
    # plain composition keeps its (eps0, delta0)-per-query meaning
    assert r.plain["optimal"] == planning.plain_epsilon(1000, 0.01, 1e-6, delta0=1e-10)
    # the budget: the hit limit would allow 13000 queries at rate 0.01, the query limit only 2500
    assert pure.max_queries["target_charging"] == 13000
    assert r.max_queries["target_charging"] == r.max_queries["individual_charging"] == 2500
    # Delta >= delta: no guarantee at all
    big = planning.compare_accounting(10000, 0.01, 1e-6, 20000, target_rate=0.01, delta0=1e-10)
    assert big.target_charging == math.inf and big.individual_charging == math.inf
    assert big.as_dict()["target_charging"] is None
    # no hits, but every query still pays
    zero = planning.compare_accounting(1000, 0.01, 1e-6, 100, target_rate=0.0, delta0=1e-10, budget_epsilon=1.0)
    assert zero.target_charging == -math.log1p(-1000 * w) > 0.0
    assert zero.max_queries["target_charging"] == 2500


# -- BassilyTT ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "eta, eps, delta, m, n",
    [(0.4, 1, 1e-6, 1e3, 9527.93), (0.4, 1, 1e-6, 1e6, 12504.77), (0.4, 0.5, 1e-6, 1e3, 19055.87), (0.2, 1, 1e-5, 100, 13837.89)],
)
def test_bassily_tt_teachers_known_values(eta, eps, delta, m, n):
    r = planning.bassily_tt_teachers(eta, eps, delta, int(m))
    assert r.n_required == pytest.approx(n, abs=0.005)
    assert r.num_teachers == math.ceil(r.n_required)


@pytest.mark.parametrize("n, m_max", [(10000, 2990), (12000, 309955), (15000, 327068772)])
def test_bassily_tt_tokens_known_values(n, m_max):
    assert planning.bassily_tt_tokens(0.4, 1.0, 1e-6, n).m_max == m_max


def test_bassily_tt_tokens_no_overflow():
    r = planning.bassily_tt_tokens(0.4, 1.0, 1e-6, 1_000_000)
    assert r.m_max is None and r.log10_m_max == pytest.approx(1001.18, abs=0.01)
    json.dumps(r.as_dict(), allow_nan=False)
    assert planning.bassily_tt_tokens(0.4, 1.0, 1e-6, 100).m_max == 0


@FAST
@given(n=st.integers(9000, 40000), eta=st.floats(0.1, 1.0), eps=st.floats(0.5, 2.0))
def test_bassily_tt_functions_are_inverse(n, eta, eps):
    m = planning.bassily_tt_tokens(eta, eps, 1e-6, n).m_max
    if m is None or m < 1 or m > 1e12:
        return
    assert planning.bassily_tt_teachers(eta, eps, 1e-6, m).n_required <= n * (1 + 1e-9)
    assert planning.bassily_tt_teachers(eta, eps, 1e-6, m + 1).n_required > n * (1 - 1e-9)


# -- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: planning.target_hits(0.0, 1e-6, 0.01), "epsilon"),
        (lambda: planning.target_hits(1.0, 1.5, 0.01), "delta"),
        (lambda: planning.target_hits(1.0, 1e-6, -0.01), "eps0"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, q=0.0), "q"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, delta0=1e-6), "delta0"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, delta0=4e-7), "delta0"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, query_delta_share=1.0), "query_delta_share"),
        (lambda: planning.target_hits(1.0, 1e-6, 0.01, composition="rdp"), "composition"),
        (lambda: planning.yields(1.0, 1e-6, 0.01, num_teachers=0), "num_teachers"),
        (lambda: planning.yields(1.0, 1e-6, 0.01, aggregator_delta=0.0), "aggregator_delta"),
        (lambda: planning.teachers_for(0.0), "eps0"),
        (lambda: planning.plan_for_tokens(0, 1.0, 1e-6), "tokens"),
        (lambda: planning.compare_accounting(10, 0.01, 1e-6, 100, target_rate=1.5), "target_rate"),
        (lambda: planning.compare_accounting(10, 0.01, 1e-6, 100, target_rate=0.1, charged_per_hit=101), "charged_per_hit"),
        (lambda: planning.compare_accounting(-1, 0.01, 1e-6, 100, target_rate=0.1), "num_queries"),
        (lambda: planning.bassily_tt_teachers(0.0, 1.0, 1e-6, 10), "eta"),
        (lambda: planning.bassily_tt_tokens(0.4, 1.0, 1e-6, -5), "num_teachers"),
        (lambda: planning.plain_epsilon(10, 0.1, 1e-6, method="zcdp"), "method"),
    ],
)
def test_invalid_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


def test_wrong_types_are_refused():
    with pytest.raises(TypeError, match="tokens"):
        planning.plan_for_tokens(10.5, 1.0, 1e-6)
    with pytest.raises(TypeError, match="epsilon"):
        planning.target_hits("1", 1e-6, 0.01)


def test_planning_imports_stay_in_their_layer():
    code = (
        "import sys, pate_accountant.planning, pate_accountant.cli; "
        "print(','.join(m for m in ('mechanisms', 'ensembles', 'matplotlib', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- figures' data ------------------------------------------------------------------------------------------


def test_wrapper_certified_q_known_values():
    from pate_app.experiments.section6 import wrapper_certified_q

    assert wrapper_certified_q(0.02) == pytest.approx(0.3980, abs=1e-4)  # eps_A = 0.01
    assert wrapper_certified_q(0.2) == pytest.approx(0.3794, abs=1e-4)  # eps_A = 0.1


def test_target_hits_curve_data():
    from pate_app.experiments.section6 import target_hits_curve

    data = target_hits_curve([0.01, 0.05])
    assert data["tct"]["optimal q=1/3"] == [130, tct_max_hits(1 / 3, 0.05, 1.0, 1e-6)]
    assert data["tct"]["drv q=1/3"][0] == 69
    assert data["tct"]["optimal q=wrapper"][0] >= data["tct"]["optimal q=1/3"][0]
    assert data["plain"]["optimal"][0] == 562
    assert data["paper"] == pytest.approx([100.0, 4.0])
    json.dumps(data, allow_nan=False)


def test_alpha_sweep_quick_data():
    from pate_app.experiments.section6 import ALPHA_QUICK, alpha_sweep

    data = alpha_sweep(quick=True, seed=1)
    assert data["alphas"] == ALPHA_QUICK["alphas"]
    token, fail, target = (np.asarray(data[k]) for k in ("token", "fail", "target"))
    np.testing.assert_allclose(token + fail + target, 1.0, atol=1e-12)
    assert (target >= 0).all() and (target <= 1 / 3 + 1e-12).all()
    assert (token >= 0).all() and (fail >= 0).all()
    # The yield grows with alpha: each step up is at worst a small dip within the sampling error ...
    se = np.asarray(data["token_se"])
    for i in range(len(token) - 1):
        assert token[i + 1] >= token[i] - 4 * math.hypot(se[i], se[i + 1]) - 1e-12
    # ... and overall it goes from almost nothing to everything (alpha = 1: identical teachers).
    assert token[0] < 0.05 and token[-1] == pytest.approx(1.0)
    assert target[-1] == pytest.approx(0.0, abs=1e-12)
    # 1 / P[target] >= 3 always; the paper's "at least about eps0 n" queries per hit, with a margin.
    qph = [q for q in data["queries_per_hit"] if q is not None]
    assert min(qph) >= 3
    assert data["summary"]["min_queries_per_hit"] >= 0.5 * data["paper_queries_per_hit"]
    json.dumps(data, allow_nan=False)


# -- CLI -------------------------------------------------------------------------------------------------


def run_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_subcommands_json(capsys):
    d = run_json(capsys, "hits", "--eps0", "0.01", "--step-delta", "1e-10")
    assert d["command"] == "plan hits" and d["hits"] == 119 and d["plain_queries"]["optimal"] == 560
    assert d["q"] == pytest.approx(1 / 3) and d["composition"] == "optimal" and d["delta0"] == 1e-10
    # One step delta (issue 23, item 4): the run's is also the delta0 of C_delta, so n = C_delta/eps0 rounded up.
    d = run_json(capsys, "yields", "--eps0", "0.01", "--step-delta", "1e-10")
    assert d["aggregator_delta"] == d["delta0"] == d["run"]["step_delta"] == 1e-10
    assert d["c_delta"] == pytest.approx(2 * math.log(1e10)) and d["num_teachers"] == 4606 == d["run"]["num_teachers"]
    assert d["yields"] == pytest.approx(119 * 0.01 * 4606 / 2)
    # The paper's reference n = 2763.1 is that of delta0 = 1e-6 (a step delta that needs budget delta above 2e-6).
    d = run_json(capsys, "yields", "--eps0", "0.01", "--step-delta", "1e-6", "--budget-delta", "1e-5")
    assert d["num_teachers"] == 2764 and d["min_teachers"] == pytest.approx(2763.1, abs=0.05)
    assert d["paper_yields"] == pytest.approx(1382.0) and d["yields"] == pytest.approx(d["hits"] * 0.01 * 2764 / 2)
    d = run_json(capsys, "yields", "--eps0", "0.01", "--teachers", "5000", "--step-delta", "1e-10")
    assert d["yields_per_hit"] == pytest.approx(25.0)
    d = run_json(capsys, "for-tokens", "--tokens", "1000", "--step-delta", "1e-12")
    assert d["expected_yields"] >= 1000 and d["epsilon_spent"] <= 1.0
    d = run_json(capsys, "compare", "--queries", "10000", "--target-rate", "0.01", "--eps0", "0.01",
                 "--teachers", "20000", "--budget-epsilon", "1", "--step-delta", "1e-15")
    assert d["hits"] == 100 and d["max_queries"]["plain"] == 562
    d = run_json(capsys, "margin", "--tokens", "1000")
    assert d["n_required"] == pytest.approx(9527.93, abs=0.005)
    d = run_json(capsys, "margin", "--teachers", "15000")
    assert d["m_max"] == 327068772
    d = run_json(capsys, "margin", "--tokens", "100", "--eta", "0.2", "--budget-delta", "1e-5")
    assert d["n_required"] == pytest.approx(13837.89, abs=0.005)


def test_cli_delta0_is_the_wrapped_inner_delta(capsys):
    d = run_json(capsys, "hits", "--eps0", "0.02", "--step-delta", "1e-10")
    assert d["max_queries"] == 2500 and d["hits"] == planning.target_hits(1.0, 1e-6, 0.02, delta0=1e-10).hits
    assert d["per_query_delta"] == pytest.approx(2e-10)
    d = run_json(capsys, "yields", "--eps0", "0.01", "--step-delta", "1e-10")
    assert d["max_queries"] == 2500
    d = run_json(capsys, "for-tokens", "--tokens", "1000", "--step-delta", "1e-10")
    assert d["max_queries"] == 2500 and d["epsilon_spent"] <= 1.0
    d = run_json(capsys, "compare", "--queries", "1000", "--target-rate", "0.01", "--eps0", "0.01", "--teachers",
                 "20000", "--budget-epsilon", "1", "--step-delta", "1e-10")
    assert d["max_queries"]["target_charging"] == 2500 and d["total_query_delta"] == pytest.approx(2e-7)
    assert main(["plan", "hits", "--eps0", "0.02", "--step-delta", "1e-10"]) == 0
    out = capsys.readouterr().out
    assert "queries, hit or not  : at most 2500" in out and "every query, hit or not, pays" in out
    assert main(["plan", "hits", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "delta of one run of the boundary-wrapped inner mechanism, delta_A" in text
    assert "Default: the largest value on the 1-2-5 grid" in text and "--q" not in text and "--composition" not in text


def test_cli_text_output(capsys):
    assert main(["plan", "hits", "--eps0", "0.01", "--step-delta", "1e-10"]) == 0
    out = capsys.readouterr().out
    assert "target hits          : 119 " in out and "its budget affords 119 target hits" in out
    assert "assumptions:" in out
    assert main(["plan", "margin", "--teachers", "1000000"]) == 0
    assert "10^1001.2" in capsys.readouterr().out


# -- a plan's headline is the figure of the run it prints ---------------------------------------------------


def _accountants_hits(run: dict) -> int:
    """The target hits the printed run's own accountant, as ``generate`` builds it, lets its mechanism make:
    its hit limit, or 0 when it cannot pay for one query."""
    from mechanisms import registry as mechanisms_registry
    from pate_accountant import registry

    mechanism = mechanisms_registry.build_mechanism(run["mechanism"], run["step_epsilon"], run["step_delta"],
                                                    run["relation"])
    budget = (run["budget"]["epsilon"], run["budget"]["delta"])
    accountant = registry.accountant_class(run["accountant"])(budget=budget)
    return accountant.max_hits_for(mechanism.event) if accountant.can_afford(mechanism.event) else 0


@pytest.mark.parametrize(
    ("removed", "value"),
    [("--q", "0.45"), ("--composition", "drv")],
)
def test_options_that_moved_only_the_headline_are_usage_errors(capsys, removed, value):
    # They changed the headline (31 hits with --q 0.45, 7 with --composition drv) but never the printed run
    # (18 hits): the run's q is its wrapper's, and its accountant composes optimally.
    argv = ["plan", "hits", "--eps0", "0.02", "--step-delta", "1e-10"]
    assert main([*argv, removed, value, "--json"]) == 2
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert captured.out == "" and f"argument {removed}: no longer taken (got {value})" in line
    for sub in (["yields", "--eps0", "0.01"], ["for-tokens", "--tokens", "10"],
                ["compare", "--queries", "10", "--target-rate", "0.1", "--eps0", "0.1", "--teachers", "50"]):
        assert main(["plan", *sub, removed, value]) == 2
        assert f"argument {removed}: no longer taken (got {value})" in capsys.readouterr().err
    d = run_json(capsys, *argv[1:])
    assert d["hits"] == d["run"]["hits"] == _accountants_hits(d["run"]) == 18
    assert d["q"] == d["run"]["q"] and d["composition"] == d["run"]["composition"] == "optimal"


@pytest.mark.parametrize(
    "argv",
    [
        # yields: the headline's n is the run's (C_delta/eps0 rounded up), its level eps0 rounded down to six digits
        ["yields", "--eps0", "0.0123456789", "--step-delta", "1e-10"],
        # for-tokens above eps0 0.62: the run's q is below 1/3, and the plan is made with it
        ["for-tokens", "--tokens", "20", "--budget-epsilon", "40", "--step-delta", "1e-10"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_plan_headline_hits_are_the_printed_runs(capsys, argv):
    d = run_json(capsys, *argv)
    run = d["run"]
    assert run["refused"] is None
    assert d["hits"] == run["hits"] == _accountants_hits(run)
    assert d["q"] == run["q"] and d["max_queries"] == run["max_queries"]
    assert d["num_teachers"] == run["num_teachers"]
    if argv[0] == "yields":
        assert d["eps0"] == run["target_level"] == 0.01234566 and d["delta0"] == run["step_delta"]
        assert d["yields"] == pytest.approx(d["hits"] * 0.01234566 * run["num_teachers"] / 2)
    if argv[0] == "for-tokens":
        assert run["q"] < 1 / 3
        assert d["hits"] >= d["hits_needed"]
        assert d["expected_yields"] == pytest.approx(d["hits"] * run["target_level"] * run["num_teachers"] / 2)
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    label = {"hits": "target hits          :", "yields": "target hits (ours)      :",
             "for-tokens": "budgeted hits        :"}[argv[0]]
    assert f"{label} {run['hits']}" in out and f"its budget affords {run['hits']} target hits" in out


def test_the_default_step_delta_pays_for_the_plans_queries(capsys):
    """Issue 23, item 4: without --step-delta a plan's run gets the largest per-query delta (1-2-5 grid, at most the
    aggregator delta) that pays for four times the private draws its hits take in expectation, instead of a fixed
    value that paid for none (1e-6 at budget delta 1e-6) or capped the run (1e-10: 2,500 queries)."""
    from pate_accountant import planning

    for argv in (["hits", "--eps0", "0.02"], ["yields", "--eps0", "0.01"], ["hits", "--eps0", "3"],
                 ["hits", "--eps0", "0.01", "--budget-delta", "3e-6"], ["for-tokens", "--tokens", "1000"]):
        d = run_json(capsys, *argv)
        run = d["run"]
        assert run["refused"] is None and run["hits"] == d["hits"] and d["max_queries"] == run["max_queries"] >= 1
        assert _accountants_hits(run) == d["hits"]
        needed = max(1, math.ceil(planning.QUERY_MARGIN * planning.target_hits(
            run["budget"]["epsilon"], run["budget"]["delta"], run["target_level"], q=run["q"],
            delta0=planning.MIN_STEP_DELTA).private_draws))
        assert run["max_queries"] >= needed
        larger = {5: 1.0, 2: 5.0, 1: 2.0}  # the next value up the 1-2-5 grid pays for fewer queries
        mantissa, exponent = (int(x) for x in f"{run['step_delta']:.0e}".split("e"))
        up = larger[mantissa] * 10.0 ** (exponent + (1 if mantissa == 5 else 0))
        if up <= planning.DEFAULT_AGGREGATOR_DELTA:
            w = 1.0 - (1.0 - up) ** 2
            assert math.floor(0.5 * run["budget"]["delta"] / w) < needed
    assert run_json(capsys, "hits", "--eps0", "0.02")["run"]["step_delta"] == 2e-10  # 18 hits, 129 draws: 516 queries
    # A step delta the user chose that pays for no query is a usage error naming it and its value.
    assert main(["plan", "hits", "--eps0", "0.01", "--step-delta", "1e-6"]) == 2
    assert "argument --step-delta: delta0 must be < delta" in capsys.readouterr().err
    assert main(["plan", "compare", "--queries", "10", "--target-rate", "0.1", "--eps0", "0.1", "--teachers", "50",
                 "--step-delta", "1e-6"]) == 2
    assert "argument --step-delta" in capsys.readouterr().err
    d = run_json(capsys, "compare", "--queries", "10", "--target-rate", "0.1", "--eps0", "0.1", "--teachers", "50")
    assert d["run"]["max_queries"] >= 10  # compare's default pays for the queries it compares
    # A pure run (step delta 0) does not exist: the printed run's DPArgMax needs a delta.
    assert main(["plan", "hits", "--eps0", "0.01", "--step-delta", "0"]) == 2
    assert "argument --step-delta: must be a number in [1e-300, 1)" in capsys.readouterr().err


def test_compare_says_when_its_run_does_not_pay_for_the_compared_shape(capsys):
    argv = ["compare", "--queries", "48", "--teachers", "64", "--eps0", "2", "--target-rate", "0.05",
            "--step-delta", "1e-6", "--budget-delta", "1e-4"]
    d = run_json(capsys, *argv)
    assert d["run"]["compared"] == {"hits": 3, "queries": 48} and d["run"]["max_queries"] == 25
    assert main(["plan", *argv]) == 0
    assert "WARNING: that budget does not pay for the 48 queries and 3 hits compared above" in capsys.readouterr().out
    argv = ["compare", "--queries", "1000", "--target-rate", "0.01", "--eps0", "0.01", "--teachers", "20000",
            "--budget-epsilon", "1", "--step-delta", "1e-10"]
    assert main(["plan", *argv]) == 0
    assert "does not pay for" not in capsys.readouterr().out


@pytest.fixture
def tiny_figures(monkeypatch):
    """``plan figures`` runs the ``tct-budget`` and ``alpha-sweep`` experiments: shrink their quick sizes."""
    from pate_app.experiments import alpha_sweep, tct_budget

    monkeypatch.setitem(tct_budget.SIZES, "quick", {"eps0": [0.01, 0.05]})
    monkeypatch.setitem(alpha_sweep.SIZES, "quick",
                        {"teachers": 120, "samples": 200, "alphas": [0.05, 0.5, 1.0], "eps0": [0.01]})


@pytest.mark.parametrize("argv", [["plan", "--plot", "--quick"], ["plan", "figures", "--plot", "--quick"]])
def test_cli_plot_runs_the_section_6_experiments(tmp_path, capsys, tiny_figures, argv):
    out = tmp_path / "figs"
    flags = ["--out", str(out), "--no-progress", "--json"]
    assert main([*argv, *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["command"] == "plan figures" and result["quick"] is True
    assert sorted(result["experiments"]) == ["alpha-sweep", "tct-budget"]
    written = sorted(p.name for p in out.iterdir())
    assert written == ["alpha-sweep.json", "alpha_sweep_max_counts.png", "alpha_sweep_outcomes.png",
                       "alpha_sweep_yields.png", "tct-budget.json", "tct_budget_hits.png", "tct_budget_ratios.png"]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    saved = json.loads((out / "tct-budget.json").read_text())
    assert saved == result["experiments"]["tct-budget"]
    assert saved["curve"]["tct"]["optimal q=1/3"][0] == 130  # eps0 = 0.01, as `plan hits` says
    assert json.loads((out / "alpha-sweep.json").read_text())["sweep"]["parameters"]["num_teachers"] == 120


def test_cli_figures_without_plot_writes_the_results_but_no_figures(tmp_path, capsys, tiny_figures):
    assert main(["plan", "figures", "--quick", "--no-progress", "--out", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "claims:" in out and "wrote" in out
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["alpha-sweep.json", "tct-budget.json"]


@pytest.mark.parametrize(
    "argv, option",
    [
        (["plan"], "--plot"),
        (["plan", "hits"], "--eps0"),
        (["plan", "hits", "--eps0", "0"], "--eps0"),
        (["plan", "hits", "--eps0", "abc"], "--eps0"),
        (["plan", "hits", "--eps0", "0.01", "--q", "1.5"], "--q"),
        (["plan", "hits", "--eps0", "0.01", "--budget-delta", "1"], "--budget-delta"),
        (["plan", "hits", "--eps0", "0.01", "--step-delta", "2e-6"], "--step-delta"),
        (["plan", "hits", "--eps0", "0.01", "--step-delta", "4e-7"], "--step-delta"),  # w > the reserve: no query fits
        (["plan", "hits", "--eps0", "0.01", "--composition", "rdp"], "--composition"),
        (["plan", "yields", "--eps0", "0.01", "--teachers", "0"], "--teachers"),
        (["plan", "for-tokens"], "--tokens"),
        (["plan", "for-tokens", "--tokens", "2.5"], "--tokens"),
        (["plan", "compare", "--queries", "10", "--target-rate", "2", "--eps0", "0.01", "--teachers", "5"], "--target-rate"),
        (["plan", "compare", "--queries", "10", "--target-rate", "0.1", "--eps0", "0.01", "--teachers", "5",
          "--charged-per-hit", "6"], "--charged-per-hit"),
        (["plan", "margin"], "--tokens"),
        (["plan", "margin", "--tokens", "5", "--teachers", "4"], "--teachers"),
        (["plan", "margin", "--tokens", "5", "--eta", "0"], "--eta"),
        (["plan", "--plot", "hits", "--eps0", "0.01"], "--plot"),
        (["plan", "figures", "--seed", "-1"], "--seed"),
    ],
)
def test_cli_bad_arguments_exit_2_naming_the_option(capsys, argv, option):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert option in err, err


# -- one home per formula: planning and the TCT bound call pate_accountant.composition -------------------------------


@pytest.mark.parametrize("k, eps0, delta0, delta", [(100, 0.1, 0.0, 1e-6), (1000, 0.01, 1e-10, 1e-6), (40, 0.3, 1e-8, 1e-5)])
def test_plain_epsilon_is_the_composition_functions(k, eps0, delta0, delta):
    from pate_accountant import composition

    assert planning.plain_epsilon(k, eps0, delta, delta0=delta0, method="drv") == composition.drv_epsilon(
        k, eps0, delta - k * delta0
    )
    assert planning.plain_epsilon(k, eps0, delta, delta0=delta0, method="optimal") == composition.optimal_epsilon(
        k, eps0, delta0, delta
    )
    assert planning.plain_epsilon(k, eps0, delta, delta0=delta0, method="kov") == composition.kov(eps0, delta0, k, delta)


@pytest.mark.parametrize("composition_name", ["optimal", "drv"])
def test_tct_epsilon_is_the_best_split_of_the_composition_functions(composition_name):
    from pate_accountant import composition
    from pate_accountant.tct import tct_splits

    hits, q, eps0, delta = 130, 1 / 3, 0.01, 1e-6
    one = composition.pure_optimal_epsilon if composition_name == "optimal" else composition.drv_epsilon
    expected = min(one(k, eps0, slack) for _, k, slack in tct_splits(hits, q, delta))
    assert tct_epsilon(hits, q, eps0, delta, composition=composition_name) == expected


@pytest.mark.parametrize("hits, q, beta", [(1, 1 / 3, 1e-6), (5, 0.1, 1e-3), (40, 0.5, 1e-8), (130, 1 / 3, 0.5)])
def test_private_draws_needed_is_the_smallest_k(hits, q, beta):
    from pate_accountant.tct import negative_binomial_tail, private_draws_needed

    k = private_draws_needed(hits, q, beta)
    assert negative_binomial_tail(hits, q, k) <= beta
    assert k == hits or negative_binomial_tail(hits, q, k - 1) > beta


def test_largest_fitting_gallops_from_any_step():
    from pate_accountant.tct import largest_fitting

    for step in (1, 2, 7, 1000):
        assert largest_fitting(lambda k: k <= 37, step=step) == 37
        assert largest_fitting(lambda k: k <= 37, start=37, step=step) == 37
    assert largest_fitting(lambda k: k * 0.1 <= 10.0) == 100
    with pytest.raises(ValueError, match="step"):
        largest_fitting(lambda k: True, step=0)
