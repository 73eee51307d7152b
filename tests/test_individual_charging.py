"""IndividualChargingAccountant: per-teacher limits from the TCT bound (docs/tct_and_individual.md), removal at the limit,
atomic refusals, the generation loop's view of the active teachers, and the vectorised path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ensembles import TeacherDistributions
from mechanisms import BetweenThresholds, BoundaryWrapper
from mechanisms.between_thresholds import between_thresholds_q as mechanism_discrete_q
from mechanisms.between_thresholds import continuous_q
from pate_accountant import (
    BetweenThresholdsEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    Release,
    UnsupportedEventError,
)
from pate_accountant.accountants.individual import (
    IndividualChargingAccountant,
    between_thresholds_q,
    individual_epsilon,
    individual_limit,
)
from pate_accountant.tct import tct_epsilon, tct_max_hits
from conftest import Counting, FakeLedger

DELTA = 1e-6
#: The accountants below are built under add/remove-one, so their events state it too (a replace-one event
#: is refused by an add/remove-one accountant: one guarantee, one relation).
AR = "add-remove-one"
EVENT = BetweenThresholdsEvent(0.01, 0.47)
GAP300 = BetweenThresholds(0.01, 0, 300, relation=AR).event  # our mechanism's event: q certified, about 0.47298
REFERENCE_LIMITS = [(0.02, 150, 37), (0.01, 300, 203), (0.005, 600, 932)]  # docs/tct_and_individual.md, total (1, 1e-6)


def state(acc):
    return (
        acc.counters.tolist(),
        acc.removed_teachers,
        acc.active_teachers().tolist(),
        acc.num_active,
        acc.queries,
        acc.hits,
        acc.charges,
    )


def hit(teachers, event=EVENT):
    return Release("between", event, target_hit=True, charged_teachers=teachers)


def miss(teachers=(), event=EVENT, value="below"):
    return Release(value, event, target_hit=False, charged_teachers=teachers)


# -- the reference limits --------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps0, gap, expected", REFERENCE_LIMITS)
def test_reference_individual_limits_with_continuous_q(eps0, gap, expected):
    q = between_thresholds_q(eps0, gap, discrete=False)
    assert q == pytest.approx(continuous_q(eps0, gap), rel=1e-12)
    acc = IndividualChargingAccountant(8, budget=(1.0, DELTA), epsilon0=eps0, q=q, relation="add-remove-one")
    assert acc.per_teacher_limit == expected == individual_limit(eps0, q, 1.0, DELTA, relation="add-remove-one")


@pytest.mark.parametrize("eps0, gap, expected", REFERENCE_LIMITS)
def test_limits_for_our_discrete_between_thresholds(eps0, gap, expected):
    """Our mechanism's q is the continuous formula at gap g + 1 (larger), so its limit is at least the reference one;
    ``gap=`` (rounded down by 1e-9) gives the same limit as the mechanism's certified q and accepts its events."""
    mechanism = BetweenThresholds(eps0, 1000, 1000 + gap, relation=AR)
    assert between_thresholds_q(eps0, gap) == pytest.approx(mechanism_discrete_q(eps0, gap), rel=1e-14)
    assert mechanism.q <= between_thresholds_q(eps0, gap) * (1 + 1e-12)
    acc = IndividualChargingAccountant(8, budget=(1.0, DELTA), epsilon0=eps0, gap=gap, relation="add-remove-one")
    from_mechanism = individual_limit(eps0, mechanism.q, 1.0, DELTA, relation="add-remove-one")
    assert acc.per_teacher_limit == from_mechanism
    assert expected <= acc.per_teacher_limit <= expected + 1
    acc.record(Release("between", mechanism.event, target_hit=True, charged_teachers={0}))
    assert acc.counters[0] == 1


@pytest.mark.parametrize("eps0, gap, _", REFERENCE_LIMITS)
def test_replace_one_uses_group_privacy(eps0, gap, _):
    """Replace-one (the default): the add/remove limit for (eps/2, delta/(1 + e^{eps/2})), and a teacher at
    its limit is within the budget after the group-privacy conversion."""
    q = between_thresholds_q(eps0, gap, discrete=False)
    acc = IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=eps0, q=q)
    assert acc.relation == "replace-one"
    limit = tct_max_hits(q, eps0, 0.5, DELTA / (1 + math.exp(0.5)))
    assert acc.per_teacher_limit == limit < individual_limit(eps0, q, 1.0, DELTA, relation="add-remove-one")
    eps_at_limit = individual_epsilon(limit, eps0, q, DELTA)
    x = eps_at_limit / 2  # the certificate: at delta_a = delta / (1 + e^x) the add/remove epsilon is <= x
    assert eps_at_limit <= 1.0
    assert tct_epsilon(limit, q, eps0, DELTA / (1 + math.exp(x))) <= x
    # ... and it is tight: slightly smaller x is not feasible.
    assert tct_epsilon(limit, q, eps0, DELTA / (1 + math.exp(x * (1 - 1e-4)))) > x * (1 - 1e-4)
    assert individual_epsilon(limit + 1, eps0, q, DELTA) > 1.0


def test_budget_validation():
    with pytest.raises(ValueError, match="epsilon0"):
        IndividualChargingAccountant(4, budget=(1.0, DELTA))
    with pytest.raises(ValueError, match="exceeds"):
        IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=0.01, gap=300, relation="add-remove-one",
                                     per_teacher_limit=300)
    with pytest.raises(ValueError, match="delta > 0"):
        IndividualChargingAccountant(4, budget=(1.0, 0.0), epsilon0=0.01, gap=300)
    with pytest.raises(ValueError, match="q or gap"):
        IndividualChargingAccountant(4, epsilon0=0.01, q=0.4, gap=300)
    with pytest.raises(ValueError):
        IndividualChargingAccountant(0, per_teacher_limit=3)


# -- charging and removal --------------------------------------------------------------------------------------
def test_only_the_charged_teachers_move():
    acc = IndividualChargingAccountant(6, per_teacher_limit=5)
    acc.record(hit({1, 4}))
    acc.record(hit({4}))
    assert acc.counters.tolist() == [0, 1, 0, 0, 2, 0]
    assert acc.hits == 2 and acc.queries == 2 and acc.charges == 3
    assert acc.remaining(4) == 3 and acc.remaining(0) == 5


def test_non_target_outcomes_charge_nobody():
    acc = IndividualChargingAccountant(6, per_teacher_limit=2)
    acc.record(miss())
    acc.record(miss({0, 1, 2}, value="above"))  # participants: checked, not charged
    acc.record(Release(None, EVENT, target_hit=False))
    assert acc.counters.tolist() == [0] * 6 and acc.queries == 3 and acc.hits == 0 and acc.charges == 0


def test_removal_at_the_limit_and_atomic_refusal():
    acc = IndividualChargingAccountant(5, per_teacher_limit=3)
    for _ in range(3):
        acc.record(hit({0, 2}))
    assert acc.removed_teachers == {0, 2} and not acc.is_active(0) and acc.is_active(1)
    assert acc.active_teachers().tolist() == [1, 3, 4] and acc.num_active == 3 and acc.remaining(0) == 0
    acc.record(hit({1}))
    before = state(acc)
    with pytest.raises(BudgetExhaustedError, match="teacher 2"):
        acc.record(hit({1, 2}))  # teacher 1 could take it, teacher 2 cannot: nobody is charged
    with pytest.raises(BudgetExhaustedError, match="teacher 0"):
        acc.record(miss({0, 3}))  # a removed teacher may not even take part
    with pytest.raises(BudgetExhaustedError):
        acc.record_many([hit({1}), hit({1}), hit({1})])  # the third would exceed teacher 1's limit
    assert state(acc) == before


def test_out_of_range_teachers_are_rejected_atomically():
    acc = IndividualChargingAccountant(4, per_teacher_limit=3)
    acc.record(hit({1}))
    before = state(acc)
    with pytest.raises(ValueError, match="outside"):
        acc.record(hit({2, 4}))
    with pytest.raises(ValueError, match="outside"):
        acc.record(miss({7}))
    with pytest.raises(ValueError, match="outside"):
        acc.record_outcomes(EVENT, np.array([True]), [[5]])
    with pytest.raises(ValueError):
        acc.is_active(4)
    assert state(acc) == before


def test_unsupported_and_weaker_events_are_refused():
    acc = IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=0.01, gap=300)
    before = state(acc)
    for event in (EpsilonDeltaEvent(0.01), BoundaryWrapper(BetweenThresholds(0.005, 0, 500)).event):
        with pytest.raises(UnsupportedEventError, match=type(event).__name__):
            acc.record(hit({0}, event))
        with pytest.raises(UnsupportedEventError):
            acc.compose(event)
    with pytest.raises(UnsupportedEventError, match="weaker"):
        acc.record(hit({0}, BetweenThresholdsEvent(0.02, 0.47)))  # larger epsilon than declared
    with pytest.raises(UnsupportedEventError, match="weaker"):
        acc.record(hit({0}, BetweenThresholdsEvent(0.01, 0.3)))  # smaller q than declared
    assert state(acc) == before


def test_compose_charges_every_active_teacher():
    acc = IndividualChargingAccountant(4, per_teacher_limit=2)
    acc.record(hit({3}))
    acc.record(hit({3}))  # teacher 3 removed
    acc.compose(EVENT)
    assert acc.counters.tolist() == [1, 1, 1, 2]
    assert acc.can_afford(EVENT) and not acc.can_afford(EVENT, 2)
    acc.compose(EVENT)
    assert acc.num_active == 0 and acc.active_teachers().size == 0
    assert not acc.can_afford(EVENT)
    before = state(acc)
    with pytest.raises(BudgetExhaustedError, match="no teacher is active"):
        acc.record(miss())
    assert state(acc) == before


def test_register_refuses_before_running_once_no_teacher_is_active():
    rng = np.random.default_rng(5)
    mechanism = Counting(BetweenThresholds(0.01, 0, 300))
    acc = IndividualChargingAccountant(3, per_teacher_limit=2)
    run = acc.register(mechanism)
    for teacher in range(3):
        while acc.is_active(teacher):
            release = run(150, rng=rng)
            if release.target_hit:  # the generation loop names the counted teachers
                acc.record(Release(release.value, release.event, target_hit=True, charged_teachers={teacher}))
    calls = mechanism.calls
    with pytest.raises(BudgetExhaustedError):
        run(150, rng=rng)
    assert mechanism.calls == calls


def test_generation_loop_subsets_the_active_teachers():
    rng = np.random.default_rng(9)
    probs = rng.dirichlet(np.ones(7), size=6)
    teachers = TeacherDistributions.from_dense(probs)
    acc = IndividualChargingAccountant(6, per_teacher_limit=1)
    acc.record(hit({1, 4}))
    active = acc.active_teachers()
    assert active.tolist() == [0, 2, 3, 5] and not active.flags.writeable
    subset = teachers.subset(active)
    assert subset.num_teachers == 4
    # Positions in the subset map back to original indices through ``active``.
    local = [1, 3]
    acc.record(hit(set(active[local].tolist())))
    assert acc.active_teachers().tolist() == [0, 3]
    assert teachers.subset(acc.active_teachers()).num_teachers == 2


# -- the reported guarantee ------------------------------------------------------------------------------------
def test_spent_is_the_worst_teacher():
    acc = IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=0.01, gap=300, relation="add-remove-one")
    assert acc.spent() == (0.0, 0.0)
    q = acc.q
    acc.record(hit({0}, GAP300))
    acc.record(hit({0, 1}, GAP300))
    # Only hits so far: each teacher's interaction stopped at its last charge, tau = counter.
    assert acc.spent() == (tct_epsilon(2, q, 0.01, DELTA), DELTA)
    assert acc.teacher_epsilon(1) == tct_epsilon(1, q, 0.01, DELTA) and acc.teacher_epsilon(3) == 0.0
    acc.record(miss(event=GAP300))
    # A non-target query: any active teacher may have been counted in it (a private draw): tau = counter + 1.
    assert acc.spent() == (tct_epsilon(3, q, 0.01, DELTA), DELTA)
    assert acc.teacher_epsilon(1) == tct_epsilon(2, q, 0.01, DELTA)
    assert acc.teacher_epsilon(3) == tct_epsilon(1, q, 0.01, DELTA)
    for _ in range(acc.per_teacher_limit - 2):
        acc.record(hit({0}, GAP300))
    assert not acc.is_active(0)
    eps, delta = acc.spent()  # the removed teacher is at its limit: tau = limit
    assert eps == tct_epsilon(acc.per_teacher_limit, q, 0.01, DELTA) <= 1.0 and delta == DELTA


def test_spent_within_budget_at_removal_replace_one():
    acc = IndividualChargingAccountant(2, budget=(1.0, DELTA), epsilon0=0.01, gap=300)
    event = BetweenThresholds(0.01, 0, 300).event  # replace-one, like the accountant
    while acc.is_active(0):
        acc.record(hit({0}, event))
    assert acc.spent()[0] <= 1.0 and acc.counters[0] == acc.per_teacher_limit


def test_config_is_json_and_rebuilds():
    acc = IndividualChargingAccountant(5, budget=(1.0, DELTA), epsilon0=0.01, gap=300, relation="add-remove-one")
    config = json.loads(json.dumps(acc.config()))
    assert config["kind"] == "individual-charging" and config["num_teachers"] == 5 and config["gap"] == 300
    kwargs = {k: v for k, v in config.items() if k not in ("kind", "budget")}
    again = IndividualChargingAccountant(budget=tuple(config["budget"]), **kwargs)
    assert again.per_teacher_limit == acc.per_teacher_limit and again.config() == acc.config()


# -- invariants and the vectorised path ------------------------------------------------------------------------
steps = st.lists(
    st.tuples(st.booleans(), st.frozensets(st.integers(0, 5), max_size=4)), min_size=1, max_size=60
)


@settings(max_examples=80, deadline=None)
@given(limit=st.integers(1, 4), sequence=steps)
def test_no_counter_ever_exceeds_its_limit(limit, sequence):
    acc = IndividualChargingAccountant(6, per_teacher_limit=limit)
    for is_hit, teachers in sequence:
        before = state(acc)
        try:
            acc.record(hit(teachers) if is_hit else miss(teachers))
        except BudgetExhaustedError:
            assert state(acc) == before
        counters = acc.counters
        assert counters.max() <= limit
        assert acc.removed_teachers == set(np.flatnonzero(counters == limit).tolist())
        assert acc.num_active == 6 - len(acc.removed_teachers)


@settings(max_examples=80, deadline=None)
@given(limit=st.integers(1, 4), sequence=steps, use_csr=st.booleans())
def test_record_outcomes_equals_sequential_records(limit, sequence, use_csr):
    seq = IndividualChargingAccountant(6, per_teacher_limit=limit)
    batch = IndividualChargingAccountant(6, per_teacher_limit=limit)
    seq.record(hit({0}))
    batch.record(hit({0}))
    snapshot = state(seq)
    try:
        for is_hit, teachers in sequence:
            seq.record(hit(teachers) if is_hit else miss(teachers))
        ok = True
    except BudgetExhaustedError:
        ok = False
    target_hit = np.array([h for h, _ in sequence], dtype=bool)
    rows = [sorted(t) for _, t in sequence]
    if use_csr:
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        indices = np.array([i for r in rows for i in r], dtype=np.int64)
        charged = (indptr, indices)
    else:
        charged = rows
    try:
        batch.record_outcomes(EVENT, target_hit, charged)
        batch_ok = True
    except BudgetExhaustedError:
        batch_ok = False
    assert batch_ok == ok
    assert state(batch) == (state(seq) if ok else snapshot)


def test_record_batch_from_a_mechanism():
    rng = np.random.default_rng(4)
    mechanism = BetweenThresholds(0.01, 50, 350, relation=AR)
    counts = rng.integers(0, 400, size=1000)
    released = mechanism.run_batch(counts, rng=rng)
    charged = [rng.choice(200, size=2, replace=False).tolist() for _ in range(1000)]
    acc = IndividualChargingAccountant(200, budget=(1.0, DELTA), epsilon0=0.01, gap=300, relation="add-remove-one")
    acc.record_batch(released, charged)
    hits = released.target_hit
    expected = np.bincount(np.concatenate([np.array(c) for c, h in zip(charged, hits) if h]), minlength=200)
    assert acc.counters.tolist() == expected.tolist()
    assert acc.queries == 1000 and acc.hits == int(hits.sum())


def test_ledger_rows_replay_to_the_same_state():
    ledger = FakeLedger()
    accountants = [IndividualChargingAccountant(8, per_teacher_limit=3, ledger=ledger),
                   IndividualChargingAccountant(8, per_teacher_limit=3)]
    for acc in accountants:
        rng = np.random.default_rng(31)
        for _ in range(40):
            teachers = set(rng.choice(8, size=int(rng.integers(0, 3)), replace=False).tolist())
            try:
                acc.record(hit(teachers) if rng.random() < 0.5 else miss())
            except BudgetExhaustedError:
                pass
        target_hit = rng.random(6) < 0.5
        rows = [[int(t)] for t in acc.active_teachers()[:6]]
        rows += [[]] * (6 - len(rows))
        try:
            acc.record_outcomes(EVENT, target_hit, rows)
        except BudgetExhaustedError:
            pass
    assert state(accountants[0]) == state(accountants[1])
    replayed = IndividualChargingAccountant(8, per_teacher_limit=3, ledger=ledger)
    assert state(replayed) == state(accountants[1])


def test_with_the_sqlite_ledger():
    ledger_module = pytest.importorskip("pate_accountant.ledger")
    ledger = ledger_module.Ledger.in_memory()
    kwargs = dict(budget=(1.0, DELTA), epsilon0=0.01, gap=300, relation="add-remove-one")
    acc = IndividualChargingAccountant(6, ledger=ledger, **kwargs)
    rng = np.random.default_rng(19)
    for _ in range(40):
        acc.record(hit(set(rng.choice(6, size=2, replace=False).tolist()), GAP300))
    acc.record(miss({1}, GAP300))
    acc.record_outcomes(GAP300, np.array([True, False, True]), [[0, 5], [2], []])
    result = ledger.verify()
    assert result.ok, result.message
    assert result.spent == acc.spent()
    again = IndividualChargingAccountant(6, ledger=ledger, **kwargs)
    assert state(again) == state(acc)


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 3),
    sequence=st.lists(
        st.tuples(st.booleans(), st.frozensets(st.integers(0, 6), max_size=3), st.sampled_from([0.47, 0.46, 0.45])),
        min_size=1,
        max_size=40,
    ),
)
def test_fast_record_equals_contract_path(limit, sequence):
    """``record`` (fast path in memory) and ``record_many([release])`` (the contract path) agree on every
    outcome and state, with fresh event objects and a teacher index out of range (6 of 6 teachers)."""
    fast = IndividualChargingAccountant(6, per_teacher_limit=limit)
    slow = IndividualChargingAccountant(6, per_teacher_limit=limit)
    for is_hit, teachers, q in sequence:
        event = BetweenThresholdsEvent(0.01, q)
        release = hit(teachers, event) if is_hit else miss(teachers, event)
        outcomes = []
        for record in (fast.record, lambda r: slow.record_many([r])):
            try:
                record(release)
                outcomes.append(None)
            except (BudgetExhaustedError, ValueError) as err:
                outcomes.append(type(err).__name__)
        assert outcomes[0] == outcomes[1]
        assert state(fast) == state(slow)
    assert fast.spent() == slow.spent()


def test_individual_epsilon_never_overflows():
    """Large per-charge epsilons under replace-one used to overflow math.exp; now the answer is a number
    (here inf: no finite group-privacy bound fits in floating point) and spent() works."""
    value = individual_epsilon(3, 0.5, 0.3, 1e-6)
    assert value == math.inf or value > 0
    assert individual_epsilon(5, 0.01, 0.4, 1e-6) < 1.0


def test_fast_path_refuses_an_event_under_the_other_relation():
    """The in-memory fast path caches the last event's class; an equal (epsilon, q) stated under the other
    relation is a different guarantee and is refused atomically, hit or not."""
    acc = IndividualChargingAccountant(4, per_teacher_limit=5)  # replace-one
    acc.record(hit({0}, EVENT))
    before = state(acc)
    other = BetweenThresholdsEvent(EVENT.epsilon, EVENT.q, AR)
    for release in (hit({1}, other), miss({1}, other)):
        with pytest.raises(UnsupportedEventError, match="'add-remove-one'.*'replace-one'"):
            acc.record(release)
        assert state(acc) == before


def test_a_batch_records_each_query_under_its_honest_outcome_class():
    """BetweenThresholds' ``below`` answers release nothing: in a batch, as in a single run, the ledger records
    them as ``below``, its ``between`` answers as ``target`` and its ``above`` answers as ``token``; both
    batch-recording accountants write the same classes, and a mismatched class vector is refused untouched."""
    from pate_accountant.accountants import TargetChargingAccountant
    from pate_accountant.ledger import Ledger

    rng = np.random.default_rng(8)
    mechanism = BetweenThresholds(0.5, 3, 9)
    counts = np.array([0, 1, 6, 12, 0, 6, 15, 2])
    released = mechanism.run_batch(counts, rng=rng)
    labels = [("below", "between", "above")[code] for code in released.values]
    expected = [{"below": "below", "between": "target", "above": "token"}[label] for label in labels]
    assert set(expected) == {"below", "target", "token"}  # this seed shows all three
    assert released.outcomes.tolist() == expected
    assert [mechanism(int(c), rng=np.random.default_rng(1)).outcome for c in (0,)] == ["below"]

    ledgers = [Ledger.in_memory(), Ledger.in_memory()]
    individual = IndividualChargingAccountant(20, ledger=ledgers[0], epsilon0=0.5, q=mechanism.q)
    individual.record_batch(released, [[j] if hit else [] for j, hit in enumerate(released.target_hit)])
    target = TargetChargingAccountant(ledger=ledgers[1])
    target.record_batch(released)
    for ledger in ledgers:
        per_query = [row.outcome for row in ledger.rows() for _ in range(row.count)]
        assert sorted(per_query) == sorted(expected)
        assert ledger.verify().ok
    with pytest.raises(ValueError, match="target"):
        target.record_outcomes(mechanism.event, released.target_hit, outcomes=["token"] * counts.size)
    with pytest.raises(ValueError, match="among"):
        target.record_outcomes(mechanism.event, released.target_hit,
                               outcomes=[("target" if h else "maybe") for h in released.target_hit])
    assert target.queries == counts.size  # the refusals left it as it was
