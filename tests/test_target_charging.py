"""TargetChargingAccountant: the TCT bound through the accountant (docs/tct_and_individual.md), the budget refused before a
mechanism runs, the conservative multi-class rule, and the claim that failing or strongly agreeing queries
cost almost nothing (paper, "Privacy analysis considerations")."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import Counting, FakeLedger, z_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import BetweenThresholds, BoundaryWrapper, DPArgMax, as_batch
from pate_accountant import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    Release,
    ThresholdPrivacyEvent,
    UnsupportedEventError,
)
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant, target_class
from pate_accountant.tct import between_thresholds_q_limit, tct_epsilon, tct_max_hits

DELTA = 1e-6


def bt(eps0, q, relation="replace-one"):
    return BetweenThresholdsEvent(eps0, q, relation)


def wrapper_event(eps0, q=1 / 3, delta0=0.0):
    """A boundary-wrapper event at level ``eps0`` around an ``(eps0 / 2, delta0)`` inner step."""
    return BoundaryWrapperEvent(EpsilonDeltaEvent(eps0 / 2, delta0), epsilon=eps0, q=q)


def claimed_wrapper(eps0, q):
    """A wrapper event that claims a q-target the wrapper does not have for q > 1/3 (built by hand)."""
    return BoundaryWrapperEvent(EpsilonDeltaEvent(eps0 / 2), epsilon=eps0, q=q)


def state(acc):
    return (acc.hits, acc.queries, acc.charged_tau, acc.spent(), acc.classes(), acc.max_hits)


# -- reference TCT vectors through the accountant -------------------------------------------------------------
@pytest.mark.parametrize(
    "tau, q, eps0, expected",
    [(10, 0.5, 0.1, 3.395175), (100, 1 / 3, 0.01, 0.889968), (100, 0.4, 0.01, 0.798431)],
)
def test_reference_tct_vectors(tau, q, eps0, expected):
    """The bound's vectors, and through the accountant where a BetweenThresholds query can have that ``q``:
    ``q = 0.5`` at ``eps0 = 0.1`` is above ``1/(1 + e^0.1) = 0.475``, which no BetweenThresholds reaches, so
    the accountant refuses that event (the vector is the bound's, not a mechanism's)."""
    assert tct_epsilon(tau, q, eps0, DELTA) == pytest.approx(expected, rel=1e-6)
    acc = TargetChargingAccountant()
    if q > between_thresholds_q_limit(eps0):
        with pytest.raises(UnsupportedEventError, match=r"claims q = 0\.5"):
            acc.compose(bt(eps0, q), tau)
        assert acc.spent() == (0.0, 0.0) and acc.queries == 0
        return
    acc.compose(bt(eps0, q), tau)
    assert acc.hits == tau and acc.queries == tau
    assert acc.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-6)
    eps, delta = acc.spent()
    assert delta == DELTA and eps == pytest.approx(expected, rel=1e-6)


TAU_MAX = {  # the reference table of docs/planning.md, tau_max at (1, 1e-6): {composition: {eps0: (q=1/3, q=0.4, q=0.5)}}
    "optimal": {0.02: (20, 28, 41), 0.01: (130, 164, 218), 0.005: (627, 771, 990), 0.002: (4356, 5276, 6666)},
    "drv": {0.02: (8, 12, 19), 0.01: (69, 89, 120), 0.005: (359, 444, 575), 0.002: (2577, 3128, 3965)},
}


@pytest.mark.parametrize("composition", ["optimal", "drv"])
@pytest.mark.parametrize("eps0", [0.02, 0.01, 0.005, 0.002])
def test_reference_tau_max_table(composition, eps0):
    """Through the accountant for ``q = 1/3, 0.4``; ``q = 0.5`` is above ``1/(1 + e^eps0)``, the limit no
    BetweenThresholds query reaches, so there the table is the bound's (``tct_max_hits``, the function the
    accountant's limit is) and the accountant refuses the event."""
    acc = TargetChargingAccountant(budget=(1.0, DELTA), composition=composition)
    for q, expected in zip((1 / 3, 0.4, 0.5), TAU_MAX[composition][eps0]):
        if q <= between_thresholds_q_limit(eps0):
            assert abs(acc.max_hits_for(bt(eps0, q)) - expected) <= 1
        else:
            assert abs(tct_max_hits(q, eps0, 1.0, DELTA, composition=composition) - expected) <= 1
            with pytest.raises(UnsupportedEventError, match="1/\\(1 \\+ e\\^eps0\\)"):
                acc.max_hits_for(bt(eps0, q))


def test_budget_allows_exactly_max_hits():
    event = bt(0.02, 0.4)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    assert acc.max_hits is None  # the limit depends on the class of the queries
    acc.compose(event, 27)
    assert acc.max_hits == 28 and acc.can_afford(event)
    assert not acc.can_afford(event, 2)
    acc.compose(event)
    assert acc.spent()[0] <= 1.0 and tct_epsilon(29, 0.4, 0.02, DELTA) > 1.0
    assert not acc.can_afford(event)
    before = state(acc)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(event)
    with pytest.raises(BudgetExhaustedError):  # even a query that will not hit: it could
        acc.record(Release("below", event, target_hit=False))
    assert state(acc) == before


@pytest.mark.parametrize("eps0", [0.01, 0.005, 0.002])
def test_section6_curve_within_tolerance(eps0):
    """Paper Section 6: about (10 eps0)^-2 target hits for total epsilon 1 (delta 1e-6).  Our bound: the
    TCT bound with optimal composition (docs/tct_and_individual.md), for the boundary wrapper's default charge
    q = 1/3 (a real BoundaryWrapper around a pure eps0/2 inner mechanism); our tolerance: a ratio in [0.7, 2.7]."""
    wrapper = BoundaryWrapper(BetweenThresholds(eps0 / 2, 0, int(math.ceil(4 / eps0))))
    assert wrapper.event.epsilon == pytest.approx(eps0) and wrapper.event.q == pytest.approx(1 / 3)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    ratio = acc.max_hits_for(wrapper.event) / (10 * eps0) ** -2
    assert 0.7 <= ratio <= 2.7


def test_paper_yields_relation():
    """The paper's Section 6 relation: with n = C_delta / eps0 teachers (C_delta = 2 ln(1/delta0)) and tau = (10 eps0)^-2 hits at
    eps0 n / 2 yields per hit, the paper gets 0.005 n^2 / C_delta yields (n = 2763.1, 1381.6 yields at
    eps0 = 0.01, delta0 = 1e-6).  With our tau_max the same relation gives tau_max eps0 n / 2."""
    eps0, delta0 = 0.01, 1e-6
    c_delta = 2 * math.log(1 / delta0)
    n = c_delta / eps0
    assert n == pytest.approx(2763.1, abs=0.05)
    paper = (10 * eps0) ** -2 * eps0 * n / 2
    assert paper == pytest.approx(0.005 * n**2 / c_delta, rel=1e-12)
    assert paper == pytest.approx(1381.6, abs=0.05)
    tau = TargetChargingAccountant(budget=(1.0, DELTA)).max_hits_for(bt(eps0, 1 / 3))
    ours = tau * eps0 * n / 2
    assert ours == pytest.approx(130 * 0.01 * n / 2)
    assert 0.7 <= ours / paper <= 2.7


# -- what is charged -------------------------------------------------------------------------------------------
def test_only_target_hits_are_charged_plus_one_pending():
    event = bt(0.01, 1 / 3)
    acc = TargetChargingAccountant()
    assert acc.spent() == (0.0, 0.0) and acc.charged_tau == 0
    miss = Release("below", event, target_hit=False)
    hit = Release("between", event, target_hit=True)
    acc.record(miss)  # a query without a hit is a private draw towards the next hit: tau = 1
    one = tct_epsilon(1, 1 / 3, 0.01, DELTA)
    assert acc.hits == 0 and acc.queries == 1 and acc.spent() == (one, DELTA)
    for _ in range(10_000):  # many more misses cost nothing more
        acc.record(miss)
    assert acc.spent() == (one, DELTA)
    acc.record(hit)
    assert acc.hits == 1 and acc.charged_tau == 1 and acc.spent()[0] == one
    acc.record(miss)
    assert acc.charged_tau == 2 and acc.spent()[0] == tct_epsilon(2, 1 / 3, 0.01, DELTA)
    assert acc.queries == 10_003


def test_compose_counts_hits_and_count_equivalence():
    event = wrapper_event(0.01, 1 / 3)
    a, b = TargetChargingAccountant(), TargetChargingAccountant()
    a.compose(event, 5)
    for _ in range(5):
        b.compose(event)
    assert state(a) == state(b) and a.hits == 5


def test_unsupported_events_are_refused_atomically():
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    acc.compose(bt(0.01, 0.4), 3)
    before = state(acc)
    for event in (
        EpsilonDeltaEvent(0.1, 0.0),
        NoisyArgMaxEvent(1.0, 1e-6),
        ThresholdPrivacyEvent(10),
        BoundaryWrapperEvent(ThresholdPrivacyEvent(10), epsilon=0.02, q=1 / 3),
    ):
        with pytest.raises(UnsupportedEventError, match=type(event).__name__):
            acc.compose(event)
        with pytest.raises(UnsupportedEventError):
            acc.record(Release(None, event, target_hit=False))
        with pytest.raises(UnsupportedEventError):
            acc.can_afford(event)
    assert state(acc) == before


def test_wrapper_events_that_claim_too_much_are_refused():
    """A wrapper's target is a q-target at level 2 eps_A with q = boundary_wrapper_q(eps_A) at best."""
    acc = TargetChargingAccountant()
    for event in (claimed_wrapper(0.1, 0.5), BoundaryWrapperEvent(EpsilonDeltaEvent(0.05), epsilon=0.09, q=1 / 3)):
        with pytest.raises(UnsupportedEventError, match="at best|at most"):
            acc.compose(event)
    assert acc.spent() == (0.0, 0.0) and acc.queries == 0


def test_per_query_delta_of_approximate_inner_is_charged_on_every_query():
    """Every query of a wrapped (eps_A, delta_A) inner pays w = 1 - (1 - delta_A)^2, hit or not."""
    event = BoundaryWrapperEvent(NoisyArgMaxEvent(0.005, 1e-9), epsilon=0.01, q=1 / 3)
    w = target_class(event).query_delta
    assert w == pytest.approx(2e-9 - 1e-18, rel=1e-12)
    acc = TargetChargingAccountant()
    acc.compose(event, 100)
    for _ in range(1000):
        acc.record(Release(None, event, target_hit=False))
    eps, delta = acc.spent()
    assert delta >= DELTA + 1100 * w and delta == pytest.approx(DELTA + 1100 * w, rel=1e-9)
    expected = tct_epsilon(101, 1 / 3, 0.01, DELTA) - math.log1p(-1100 * w)
    assert eps >= expected and eps == pytest.approx(expected, rel=1e-9)


def test_several_classes_use_the_conservative_combination_without_a_budget():
    a, b = bt(0.01, 0.45), wrapper_event(0.008, 1 / 3, delta0=1e-10)
    acc = TargetChargingAccountant()
    acc.compose(a, 10)
    acc.record(Release("below", b, target_hit=False))
    acc.compose(b, 5)
    w = target_class(b).query_delta
    assert acc.combined_class == (0.01, 1 / 3, w)
    eps, delta = acc.spent()
    assert delta == pytest.approx(DELTA + 6 * w, rel=1e-9)
    assert eps == pytest.approx(tct_epsilon(15, 1 / 3, 0.01, DELTA) - math.log1p(-6 * w), rel=1e-9)
    assert [c["hits"] for c in acc.classes()] == [10, 5] and [c["queries"] for c in acc.classes()] == [10, 6]


def test_a_budget_keeps_the_class_of_the_first_query():
    """With a budget the limits are fixed by the first query; a query it does not cover is refused."""
    good, bad = bt(0.01, 0.45), bt(0.02, 1 / 3)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    acc.compose(good, 100)
    assert acc.max_hits == tct_max_hits(0.45, 0.01, 1.0, DELTA)
    before = state(acc)
    with pytest.raises(UnsupportedEventError, match="first query"):
        acc.can_afford(bad)
    with pytest.raises(UnsupportedEventError, match="first query"):
        acc.record(Release("below", bad, target_hit=False))
    assert state(acc) == before
    acc.compose(bt(0.005, 0.47), 3)  # dominated: accepted, charged at the first class
    assert acc.hits == 103 and acc.spent()[0] == pytest.approx(tct_epsilon(103, 0.45, 0.01, DELTA), rel=1e-12)


def test_relations_are_not_mixed():
    acc = TargetChargingAccountant()
    acc.compose(bt(0.01, 0.4, "replace-one"))
    with pytest.raises(UnsupportedEventError, match="relation"):
        acc.compose(bt(0.01, 0.4, "add-remove-one"))
    assert acc.hits == 1


def test_budget_needs_delta():
    with pytest.raises(ValueError, match="delta > 0"):
        TargetChargingAccountant(budget=(1.0, 0.0))


def test_config_is_json_and_rebuilds():
    acc = TargetChargingAccountant(budget=(2.0, 1e-5), target_delta=1e-7, composition="drv")
    config = json.loads(json.dumps(acc.config()))
    assert config == {
        "kind": "target-charging",
        "budget": [2.0, 1e-5],
        "target_delta": 1e-7,
        "composition": "drv",
        "query_delta_share": 0.5,
    }
    kwargs = {k: v for k, v in config.items() if k not in ("kind", "budget")}
    again = TargetChargingAccountant(budget=tuple(config["budget"]), **kwargs)
    assert again.config() == acc.config()


# -- refused before running ------------------------------------------------------------------------------------
def test_register_refuses_before_the_boundary_wrapper_runs():
    """A real BoundaryWrapper(DPArgMax) on a borderline histogram (P[target] about 1/3): the run that would
    need one more hit than the budget allows never happens."""
    rng = np.random.default_rng(7)
    mechanism = Counting(BoundaryWrapper(DPArgMax(0.005, 1e-12)))
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    run = acc.register(mechanism)
    limit = acc.max_hits_for(mechanism.event)
    reserved = DELTA / 2  # the default share of delta for the per-query deltas w = 2e-12
    assert limit == tct_max_hits(1 / 3, 0.01, 1.0 + math.log1p(-reserved), DELTA - reserved) and 90 < limit < 140
    n = 100_000
    top = n // 2 + mechanism.mechanism.inner.error_bound + 1
    histogram = {0: top, 1: n - top}  # top count at the yield threshold: P[yield] about 1/2
    assert 0.3 < mechanism.mechanism.output_distribution(histogram).target <= 1 / 3
    refused = 0
    for _ in range(2000):
        try:
            run(histogram, rng=rng)
        except BudgetExhaustedError:
            refused += 1
            break
    assert refused == 1
    assert acc.hits == limit and mechanism.calls == acc.queries
    assert acc.spent()[0] <= 1.0 and not acc.can_afford(mechanism.event)
    before = (state(acc), mechanism.calls)
    with pytest.raises(BudgetExhaustedError):
        run(histogram, rng=rng)
    assert (state(acc), mechanism.calls) == before


def test_register_refuses_before_between_thresholds_runs():
    rng = np.random.default_rng(8)
    mechanism = Counting(BetweenThresholds(0.02, 100, 300))  # q about 0.48 at level 0.02
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    run = acc.register(mechanism)
    with pytest.raises(BudgetExhaustedError):
        for _ in range(10_000):
            run(200, rng=rng)  # the count is in the middle: 'between' almost always
    assert acc.hits == acc.max_hits == tct_max_hits(mechanism.event.q, 0.02, 1.0, DELTA)
    assert mechanism.calls == acc.queries


# -- failing and strongly agreeing queries cost almost nothing -------------------------------------------------
N_TEACHERS = 20_000
INNER = DPArgMax(0.01, 1e-10)  # the wrapper: level 0.02, q = 1/3, delta0 = 1e-10
DOMINANT = {0: 12_573, 1: N_TEACHERS - 12_573}  # P[yield] = 0.99983: one token agrees strongly
FAILING = {token: 1_000 for token in range(20)}  # top count far below n/2: always fails


BOUNDARY = ({0: N_TEACHERS // 2, 1: N_TEACHERS // 2}, {0: N_TEACHERS // 2 + 1, 1: N_TEACHERS // 2 - 1})


def attack_delta(queries: int) -> float:
    """A lower bound on the true delta of ``queries`` wrapped DPArgMax queries on the release-boundary pair
    ``BOUNDARY`` (one vote moved): world 0 never leaves fail, world 1 does with probability ``p1`` per
    query, so the event "some query did not fail" has probability 0 against ``1 - (1 - p1)^queries``:
    that is a lower bound on the hockey-stick divergence at every epsilon."""
    wrapper = BoundaryWrapper(INNER)
    law0, law1 = (wrapper.output_distribution(h) for h in BOUNDARY)
    p0 = law0.target + float(law0.probabilities.sum())
    p1 = law1.target + float(law1.probabilities.sum())
    assert p0 == 0.0 and p1 > 0.0
    return -math.expm1(queries * math.log1p(-p1))


def test_attack_on_approximate_inner_is_paid_for():
    """The audit's attack: 10^5 non-hit queries of wrapped DPArgMax(0.01, 1e-10) on 20,000 teachers at the
    release boundary used to be reported as (0.477, 1e-6) while the true delta at any epsilon is at least
    1e-5.  Now the reported delta bounds the true one, and a (1, 1e-6) budget stops the queries in time."""
    queries = 100_000
    true_delta = attack_delta(queries)
    assert true_delta > 0.99e-5
    event = BoundaryWrapper(INNER).event
    odometer = TargetChargingAccountant()
    odometer.record_outcomes(event, np.zeros(queries, dtype=bool), np.ones(queries, dtype=bool))
    eps, delta = odometer.spent()
    assert delta >= true_delta and odometer.hits == 0
    budgeted = TargetChargingAccountant(budget=(1.0, DELTA))
    allowed = budgeted.max_queries if budgeted.max_queries is not None else None
    run = 0
    while budgeted.can_afford(event):
        budgeted.record(Release(None, event, target_hit=False))
        run += 1
        assert run <= queries
    assert run == budgeted.max_queries == math.floor((DELTA / 2) / target_class(event).query_delta) < queries
    assert allowed is None  # the limit is known only once the first query fixed the class
    eps, delta = budgeted.spent()
    assert eps <= 1.0 and delta <= DELTA and delta >= attack_delta(run)
    with pytest.raises(BudgetExhaustedError):
        budgeted.record(Release(None, event, target_hit=False))


def test_agreeing_queries_cost_almost_nothing():
    """Strong agreement (one token far above the threshold) hits the target rarely: TCT charges far less
    than basic composition, per-query deltas included."""
    wrapper = BoundaryWrapper(INNER)
    p = wrapper.output_distribution(DOMINANT).target  # exact P[target]
    queries = 2_000
    rng = np.random.default_rng(11)
    batch = as_batch(np.tile(np.array([list(DOMINANT.values())]), (queries, 1)))
    acc = TargetChargingAccountant()
    released = wrapper.run_batch(batch, rng=rng)
    acc.record_batch(released)
    basic = BasicCompositionAccountant()
    basic.compose(wrapper.event, queries)
    eps_tct, eps_basic = acc.spent()[0], basic.spent()[0]
    assert acc.queries == queries and eps_basic == pytest.approx(0.02 * queries)
    z = z_bound(2)
    sd = math.sqrt(queries * p * (1 - p))
    assert abs(acc.hits - queries * p) <= z * sd + 1e-9
    assert 1e-4 < p < 2e-4
    assert np.mean(~released.failed & ~released.target_hit) > 0.999  # almost every query yields a token
    worst_tau = math.floor(queries * p + z * sd) + 1
    eps_bound = tct_epsilon(worst_tau, 1 / 3, 0.02, DELTA) - math.log1p(-queries * 2e-10)
    assert acc.spent()[1] == pytest.approx(DELTA + queries * 2e-10, rel=1e-9)
    assert eps_tct <= eps_bound * (1 + 1e-9) and eps_basic / eps_bound > 30


# -- fast paths agree with the contract path -------------------------------------------------------------------
def test_fast_record_equals_contract_path():
    rng = np.random.default_rng(3)
    makers = [  # a fresh event object per release, as mechanisms build them (classes differ in one field each)
        lambda: bt(0.01, 0.4),
        lambda: bt(0.01, 0.4, "add-remove-one"),
        lambda: wrapper_event(0.01, 1 / 3, delta0=1e-12),
        lambda: wrapper_event(0.01, 1 / 3, delta0=1e-11),
        lambda: BoundaryWrapperEvent(NoisyArgMaxEvent(0.005, 1e-12), epsilon=0.01, q=1 / 3),
        lambda: bt(0.02, 0.45),
    ]
    # The first release fixes a budgeted accountant's class: one that covers every other class above.
    releases = [Release(None, wrapper_event(0.02, 1 / 3, delta0=1e-11), target_hit=False)] + [
        Release(None, makers[int(rng.integers(len(makers)))](), target_hit=bool(rng.random() < 0.2))
        for _ in range(500)
    ]
    fast, slow = TargetChargingAccountant(budget=(1.5, DELTA)), TargetChargingAccountant(budget=(1.5, DELTA))
    accepted = []
    for release in releases:
        outcomes = []
        for acc, record in ((fast, fast.record), (slow, lambda r: slow.record_many([r]))):
            try:
                record(release)
                outcomes.append(True)
            except (BudgetExhaustedError, UnsupportedEventError) as err:  # relations are not mixed
                outcomes.append(type(err).__name__)
        assert outcomes[0] == outcomes[1]
        assert state(fast) == state(slow)
        accepted.append(outcomes[0])
    assert len(fast.classes()) >= 3
    # Every path was exercised: accepted, refused for the budget, refused for the relation.
    assert {True, "BudgetExhaustedError", "UnsupportedEventError"} <= set(accepted)


@settings(max_examples=60, deadline=None)
@given(
    before=st.integers(0, 20),
    hits=st.lists(st.booleans(), min_size=0, max_size=40),
    failed=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_record_outcomes_equals_sequential_records(before, hits, failed):
    event = bt(0.02, 0.4)  # limit 28 at (1, 1e-6)
    hit = np.array(hits, dtype=bool)
    fail = np.array(failed[: len(hits)], dtype=bool)
    batch, seq = TargetChargingAccountant(budget=(1.0, DELTA)), TargetChargingAccountant(budget=(1.0, DELTA))
    if before:
        batch.compose(event, before)
        seq.compose(event, before)
    snapshot = state(seq)
    try:
        for h in hits:
            seq.record(Release("between" if h else "below", event, target_hit=h))
        ok = True
    except BudgetExhaustedError:
        ok = False
    try:
        batch.record_outcomes(event, hit, fail)
        batch_ok = True
    except BudgetExhaustedError:
        batch_ok = False
    assert batch_ok == ok
    if ok:
        assert state(batch) == state(seq)
    else:
        assert state(batch) == snapshot


def test_record_many_is_all_or_nothing():
    event = bt(0.02, 0.4)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    acc.compose(event, 27)
    before = state(acc)
    releases = [Release("between", event, target_hit=True)] * 2
    with pytest.raises(BudgetExhaustedError):
        acc.record_many(releases)
    assert state(acc) == before
    acc.record_many(releases[:1])
    assert acc.hits == 28


# -- the ledger path (a minimal stand-in for pate_accountant.ledger: rows appended per transaction) -----------
def test_ledger_rows_replay_to_the_same_state():
    ledger = FakeLedger()
    with_ledger = TargetChargingAccountant(budget=(1.0, DELTA), ledger=ledger)
    plain = TargetChargingAccountant(budget=(1.0, DELTA))
    events = [bt(0.01, 0.4), wrapper_event(0.01, 1 / 3, delta0=1e-12)]
    for acc in (with_ledger, plain):
        local = np.random.default_rng(21)
        acc.record(Release(None, events[1], target_hit=False))  # the first query fixes the class
        for _ in range(200):
            acc.record(Release(None, events[int(local.integers(2))], target_hit=bool(local.random() < 0.1)))
        acc.record_outcomes(events[0], local.random(1000) < 0.01, local.random(1000) < 0.5)
        acc.compose(events[1], 2)
    assert state(with_ledger) == state(plain)
    assert 201 + 1 + 1 <= len(ledger.rows) <= 201 + 3 + 1  # record_outcomes writes at most three rows
    replayed = TargetChargingAccountant(budget=(1.0, DELTA), ledger=ledger)
    assert state(replayed) == state(plain)


def test_with_the_sqlite_ledger():
    ledger_module = pytest.importorskip("pate_accountant.ledger")
    ledger = ledger_module.Ledger.in_memory()
    event = BetweenThresholds(0.01, 0, 300).event
    acc = TargetChargingAccountant(budget=(1.0, DELTA), ledger=ledger)
    rng = np.random.default_rng(17)
    for _ in range(50):
        acc.record(Release(None, event, target_hit=bool(rng.random() < 0.2)))
    acc.record_outcomes(event, rng.random(200) < 0.02, rng.random(200) < 0.5)
    acc.compose(event, 2)
    result = ledger.verify()
    assert result.ok, result.message
    assert result.spent == acc.spent()
    again = TargetChargingAccountant(budget=(1.0, DELTA), ledger=ledger)
    assert state(again) == state(acc)
