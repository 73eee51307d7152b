"""TargetChargingAccountant: the TCT bound through the accountant (spec 4, 10), the budget refused before a
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
from pate_accountant.tct import tct_epsilon, tct_max_hits

DELTA = 1e-6


def bt(eps0, q, relation="replace-one"):
    return BetweenThresholdsEvent(eps0, q, relation)


def wrapper_event(eps0, q, delta0=0.0):
    """A boundary-wrapper event at level ``eps0`` around an ``(eps0 / 2, delta0)`` inner step."""
    return BoundaryWrapperEvent(EpsilonDeltaEvent(eps0 / 2, delta0), epsilon=eps0, q=q)


def state(acc):
    return (acc.hits, acc.queries, acc.charged_tau, acc.spent(), acc.classes(), acc.max_hits)


# -- spec 10: the TCT vectors through the accountant ---------------------------------------------------------
@pytest.mark.parametrize(
    "tau, q, eps0, expected",
    [(10, 0.5, 0.1, 3.395175), (100, 1 / 3, 0.01, 0.889968), (100, 0.4, 0.01, 0.798431)],
)
@pytest.mark.parametrize("make", [bt, wrapper_event])
def test_spec_tct_vectors(make, tau, q, eps0, expected):
    acc = TargetChargingAccountant()
    acc.compose(make(eps0, q), tau)
    assert acc.hits == tau and acc.queries == tau
    assert acc.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-6)
    eps, delta = acc.spent()
    assert delta == DELTA and eps == pytest.approx(expected, rel=1e-6)


TAU_MAX = {  # spec 10, tau_max at (1, 1e-6): {composition: {eps0: (q=1/3, q=0.4, q=0.5)}}
    "optimal": {0.02: (20, 28, 41), 0.01: (130, 164, 218), 0.005: (627, 771, 990), 0.002: (4356, 5276, 6666)},
    "drv": {0.02: (8, 12, 19), 0.01: (69, 89, 120), 0.005: (359, 444, 575), 0.002: (2577, 3128, 3965)},
}


@pytest.mark.parametrize("composition", ["optimal", "drv"])
@pytest.mark.parametrize("eps0", [0.02, 0.01, 0.005, 0.002])
def test_spec_tau_max_table(composition, eps0):
    acc = TargetChargingAccountant(budget=(1.0, DELTA), composition=composition)
    for q, expected in zip((1 / 3, 0.4, 0.5), TAU_MAX[composition][eps0]):
        assert abs(acc.max_hits_for(bt(eps0, q)) - expected) <= 1


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
    spec 4.2 TCT bound with optimal composition, for the boundary wrapper's default charge q = 1/3 (a real
    BoundaryWrapper around a pure eps0/2 inner mechanism); spec 4.4 asks for a ratio in [0.7, 2.7]."""
    wrapper = BoundaryWrapper(BetweenThresholds(eps0 / 2, 0, int(math.ceil(4 / eps0))))
    assert wrapper.event.epsilon == pytest.approx(eps0) and wrapper.event.q == pytest.approx(1 / 3)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    ratio = acc.max_hits_for(wrapper.event) / (10 * eps0) ** -2
    assert 0.7 <= ratio <= 2.7


def test_paper_yields_relation():
    """Spec 4.4: with n = C_delta / eps0 teachers (C_delta = 2 ln(1/delta0)) and tau = (10 eps0)^-2 hits at
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


def test_delta0_of_approximate_inner_is_charged():
    """Spec 4.2: k private draws add k delta0.  The wrapper's delta0 is its inner event's delta."""
    event = BoundaryWrapperEvent(NoisyArgMaxEvent(0.005, 1e-9), epsilon=0.01, q=1 / 3)
    assert target_class(event).delta0 == 1e-9
    acc = TargetChargingAccountant()
    acc.compose(event, 100)
    assert acc.spent()[0] == pytest.approx(tct_epsilon(100, 1 / 3, 0.01, DELTA, delta0=1e-9), rel=1e-12)
    assert acc.spent()[0] > tct_epsilon(100, 1 / 3, 0.01, DELTA)


def test_several_classes_use_the_conservative_combination():
    a, b = bt(0.01, 0.45), wrapper_event(0.008, 1 / 3, delta0=1e-10)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    acc.compose(a, 10)
    acc.record(Release("below", b, target_hit=False))
    acc.compose(b, 5)
    assert acc.combined_class == (0.01, 1 / 3, 1e-10)
    assert acc.spent()[0] == tct_epsilon(15, 1 / 3, 0.01, DELTA, delta0=1e-10)
    assert acc.max_hits == tct_max_hits(1 / 3, 0.01, 1.0, DELTA, delta0=1e-10)
    assert [c["hits"] for c in acc.classes()] == [10, 5] and [c["queries"] for c in acc.classes()] == [10, 6]


def test_a_worse_class_can_be_refused_even_without_a_hit():
    good, bad = bt(0.01, 0.5), bt(0.02, 1 / 3)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    acc.compose(good, 100)  # fine for q = 0.5 at eps0 = 0.01 (limit 218) but not for (0.02, 1/3) (limit 20)
    before = state(acc)
    assert not acc.can_afford(bad)
    with pytest.raises(BudgetExhaustedError):
        acc.record(Release("below", bad, target_hit=False))
    assert state(acc) == before and acc.can_afford(good)


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
    assert config == {"kind": "target-charging", "budget": [2.0, 1e-5], "target_delta": 1e-7, "composition": "drv"}
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
    assert limit == tct_max_hits(1 / 3, 0.01, 1.0, DELTA, delta0=1e-12) and 100 < limit < 140
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
DOMINANT = {0: 15_146, 1: N_TEACHERS - 15_146}  # P[yield] = 0.99983: one token agrees strongly
FAILING = {token: 1_000 for token in range(20)}  # top count far below n/2: always fails


@pytest.mark.parametrize("histogram, name", [(DOMINANT, "dominant"), (FAILING, "failing")])
def test_failing_or_agreeing_queries_cost_almost_nothing(histogram, name):
    wrapper = BoundaryWrapper(INNER)
    p = wrapper.output_distribution(histogram).target  # exact P[target]
    queries = 100_000
    rng = np.random.default_rng(11)
    batch = as_batch(np.tile(np.array([list(histogram.values())]), (queries, 1)))
    acc = TargetChargingAccountant()
    assert acc.can_afford(wrapper.event, queries)
    released = wrapper.run_batch(batch, rng=rng)
    acc.record_batch(released)
    basic = BasicCompositionAccountant()
    basic.compose(wrapper.event, queries)  # the same queries under basic composition: (0.02, 1e-10) each
    eps_tct, eps_basic = acc.spent()[0], basic.spent()[0]
    assert acc.queries == queries and eps_basic == pytest.approx(0.02 * queries)
    # Hits: Binomial(queries, p) with p exact; the epsilon bound follows from the upper end of the interval.
    z = z_bound(2)
    sd = math.sqrt(queries * p * (1 - p))
    assert abs(acc.hits - queries * p) <= z * sd + 1e-9
    worst_tau = math.floor(queries * p + z * sd) + 1
    eps_bound = tct_epsilon(worst_tau, 1 / 3, 0.02, DELTA, delta0=1e-10)
    assert eps_tct <= eps_bound
    if name == "failing":
        assert p == 0.0 and acc.hits == 0 and eps_tct == tct_epsilon(1, 1 / 3, 0.02, DELTA, delta0=1e-10)
        assert released.failed.all()
    else:
        assert 1e-4 < p < 2e-4
        assert np.mean(~released.failed & ~released.target_hit) > 0.999  # almost every query yields a token
    # The derived guarantee: at least eps_basic / eps_bound times cheaper than basic composition.
    assert eps_basic / eps_tct >= eps_basic / eps_bound > 1000


def test_per_call_queries_through_register_cost_almost_nothing():
    """The same claim through ``register`` (one query per call), 2000 queries of each kind."""
    rng = np.random.default_rng(12)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    run = acc.register(BoundaryWrapper(INNER))
    for histogram in (FAILING, DOMINANT):
        for _ in range(2000):
            run(histogram, rng=rng)
    p = BoundaryWrapper(INNER).output_distribution(DOMINANT).target
    assert acc.queries == 4000 and acc.hits <= 3  # expected 2000 p = 0.34
    assert 2000 * p < 0.5
    bound = tct_epsilon(4, 1 / 3, 0.02, DELTA, delta0=1e-10)  # at most 3 hits, plus the pending one
    assert acc.spent()[0] <= bound and 4000 * 0.02 / bound > 100  # basic composition: 4000 x 0.02


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
    releases = [
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
        for _ in range(200):
            acc.record(Release(None, events[int(local.integers(2))], target_hit=bool(local.random() < 0.1)))
        acc.record_outcomes(events[0], local.random(1000) < 0.01, local.random(1000) < 0.5)
        acc.compose(events[1], 2)
    assert state(with_ledger) == state(plain)
    assert 200 + 1 + 1 <= len(ledger.rows) <= 200 + 3 + 1  # record_outcomes writes at most three rows
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
