"""One contract suite, parametrized over every registered accountant (``pate_accountant.registry``).

Each registered kind has one or more :class:`pate_accountant.testing.AccountantCase` in ``CASES_BY_KIND``: a
factory taking ``budget=None | (epsilon, delta)`` and ``ledger=None``, the events it supports (the first is
the default), one event it rejects, and how to make a ``Release`` of a supported event (for accountants that
charge by outcome, e.g. a target hit).  A kind registered without cases here (a user's accountant, registered
before this module is collected) is tested with ``default_accountant_case``: plain ``(epsilon, delta)``
events, built as ``cls(budget=..., ledger=...)``.

The contract properties are the public checks of ``pate_accountant.testing``:

* empty is zero; monotone (hypothesis); count equivalence; unsupported events rejected atomically by every
  entry point; budget refusal atomic, ``can_afford`` agreeing; ``register`` refusing before running.

And, for each case: ``get_epsilon`` at the delta ``spent()`` reports equals the spent epsilon;
``record_many`` is all-or-nothing; ``config()`` is JSON data naming the accountant's ``kind``; invalid and
other-relation events are refused atomically; with an in-memory ledger, refused charges add no row, the
ledger verifies, and a second accountant attached to it replays to the same spent budget.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting import dp_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pate_accountant import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    Release,
    ThresholdPrivacyEvent,
    UnsupportedEventError,
    WeightedSamplingEvent,
)
from pate_accountant.accountants.advanced import AdvancedCompositionAccountant
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.accountants.pld import PldAccountant
from pate_accountant.accountants.rdp import RdpAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant
from pate_accountant.ledger import Ledger
from pate_accountant.registry import accountant_class, accountant_names
from pate_accountant.testing import (
    REL,
    AccountantCase,
    CountingMechanism,
    budget_allowing,
    check_budget_refusal_atomic,
    check_count_equivalence,
    check_empty_is_zero,
    check_monotone,
    check_record_in_two_groups,
    check_register_refuses_before_running,
    check_unsupported_rejected_atomically,
    default_accountant_case,
)


def _target_release(event: dp_accounting.DpEvent) -> Release:
    """A q-target mechanism's worst outcome: a target hit."""
    return Release(None, event, target_hit=True)


def _all_teachers_release(event: dp_accounting.DpEvent) -> Release:
    """A BetweenThresholds "between" charging all 4 teachers, so a budget of k charges allows k runs."""
    return Release("between", event, target_hit=True, charged_teachers=frozenset(range(4)))


#: dp-accounting's Laplace (and its RDP Gaussian) noise is defined under add/remove-one: the cases charging
#: them are built under that relation, with our events stated under it too.
AR = "add-remove-one"

CASES_BY_KIND = {
    "basic": (
        AccountantCase(
            "basic",
            lambda budget=None, ledger=None: BasicCompositionAccountant(
                budget=budget, ledger=ledger, neighboring_relation=AR),
            (EpsilonDeltaEvent(0.1, relation=AR), BetweenThresholdsEvent(0.05, 0.3, AR), NoisyArgMaxEvent(0.2, 1e-9, AR),
             dp_event.LaplaceDpEvent(8.0)),
            ThresholdPrivacyEvent(5),
        ),
        AccountantCase(
            "basic-replace-one",
            lambda budget=None, ledger=None: BasicCompositionAccountant(budget=budget, ledger=ledger),
            (EpsilonDeltaEvent(0.1), BetweenThresholdsEvent(0.05, 0.3), NoisyArgMaxEvent(0.2, 1e-9),
             BoundaryWrapperEvent(EpsilonDeltaEvent(0.05), 0.1, 1 / 3)),
            dp_event.GaussianDpEvent(3.0),
        ),
    ),
    "advanced": (
        AccountantCase(
            "advanced",
            lambda budget=None, ledger=None: AdvancedCompositionAccountant(budget=budget, ledger=ledger),
            (EpsilonDeltaEvent(0.1), EpsilonDeltaEvent(0.05, 1e-9), BetweenThresholdsEvent(0.2, 0.3),
             WeightedSamplingEvent(0.1, 1e-10), BoundaryWrapperEvent(EpsilonDeltaEvent(0.05), 0.1, 1 / 3)),
            ThresholdPrivacyEvent(5),
        ),
    ),
    "rdp": (
        AccountantCase(
            "rdp",
            lambda budget=None, ledger=None: RdpAccountant(budget=budget, ledger=ledger, neighboring_relation=AR),
            (EpsilonDeltaEvent(0.1, relation=AR), dp_event.GaussianDpEvent(5.0), BetweenThresholdsEvent(0.05, 0.3, AR),
             dp_event.LaplaceDpEvent(8.0)),
            ThresholdPrivacyEvent(5),
        ),
        AccountantCase(
            "rdp-replace-one",
            lambda budget=None, ledger=None: RdpAccountant(budget=budget, ledger=ledger),
            (EpsilonDeltaEvent(0.1), dp_event.RandomizedResponseDpEvent(0.9, 2), BetweenThresholdsEvent(0.05, 0.3)),
            dp_event.GaussianDpEvent(5.0),
        ),
        AccountantCase(
            "rdp-approximate-rejected",
            lambda budget=None, ledger=None: RdpAccountant(budget=budget, ledger=ledger, neighboring_relation=AR),
            (dp_event.GaussianDpEvent(3.0), EpsilonDeltaEvent(0.05, relation=AR)),
            NoisyArgMaxEvent(0.5, 1e-7, AR),
        ),
    ),
    "pld": (
        AccountantCase(
            "pld",
            lambda budget=None, ledger=None: PldAccountant(budget=budget, ledger=ledger, neighboring_relation=AR),
            (BetweenThresholdsEvent(0.1, 0.3, AR), EpsilonDeltaEvent(0.05, 1e-9, AR), dp_event.LaplaceDpEvent(8.0),
             dp_event.GaussianDpEvent(5.0), NoisyArgMaxEvent(0.2, 1e-10, AR)),
            ThresholdPrivacyEvent(5),
        ),
        AccountantCase(
            "pld-replace-one",
            lambda budget=None, ledger=None: PldAccountant(budget=budget, ledger=ledger),
            (BetweenThresholdsEvent(0.1, 0.3), EpsilonDeltaEvent(0.05, 1e-9), dp_event.GaussianDpEvent(5.0),
             dp_event.RandomizedResponseDpEvent(0.9, 2), WeightedSamplingEvent(0.2, 1e-10)),
            dp_event.LaplaceDpEvent(8.0),
        ),
    ),
    "target-charging": (
        AccountantCase(
            "target-charging",
            lambda budget=None, ledger=None: TargetChargingAccountant(budget=budget, ledger=ledger),
            # A budgeted target-charging accountant keeps the class of its first query: the first one covers
            # the rest (wrapped approximate-DP queries, which pay their delta on every query, have their own
            # tests).
            (BoundaryWrapperEvent(EpsilonDeltaEvent(0.005), 0.01, 1 / 3), BetweenThresholdsEvent(0.01, 0.4)),
            EpsilonDeltaEvent(0.1),
            release=_target_release,
        ),
    ),
    "individual-charging": (
        AccountantCase(
            "individual-charging",
            lambda budget=None, ledger=None: IndividualChargingAccountant(
                4, budget=budget, ledger=ledger, epsilon0=0.01, q=0.47, relation="add-remove-one"
            ),
            (BetweenThresholdsEvent(0.01, 0.47, "add-remove-one"), BetweenThresholdsEvent(0.005, 0.48, "add-remove-one")),
            BoundaryWrapperEvent(EpsilonDeltaEvent(0.005, relation="add-remove-one"), 0.01, 1 / 3),
            release=_all_teachers_release,
        ),
    ),
}

#: The kinds this repository registers (each with its own cases above).
BUILTIN_KINDS = ("advanced", "basic", "individual-charging", "pld", "rdp", "target-charging")


def _registered_cases() -> list:
    out = []
    for kind in accountant_names():
        out.extend(CASES_BY_KIND.get(kind) or (default_accountant_case(accountant_class(kind)),))
    return out


ACCOUNTANT_CASES = _registered_cases()


@pytest.fixture(params=ACCOUNTANT_CASES, ids=str)
def case(request) -> AccountantCase:
    return request.param


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def _budget_allowing(case: AccountantCase, k: int):
    """A budget that admits exactly ``k`` charges of ``case.event``."""
    return budget_allowing(case.factory, case.event, k, case.budget_delta)


# -- the registry --------------------------------------------------------------------------------------------
def test_every_registered_kind_is_under_contract_with_its_own_class():
    assert set(BUILTIN_KINDS) <= set(accountant_names())
    assert set(CASES_BY_KIND) == set(BUILTIN_KINDS)
    for kind, cases in CASES_BY_KIND.items():
        for case in cases:
            assert type(case.factory(None)) is accountant_class(kind), case
    assert {c.name for c in ACCOUNTANT_CASES} >= {c.name for cases in CASES_BY_KIND.values() for c in cases}


# -- empty, config ---------------------------------------------------------------------------------------------
def test_empty_is_zero(case):
    check_empty_is_zero(case.factory)


def test_config_is_json_and_names_the_kind(case):
    acc = case.factory((1.0, 1e-6))
    config = json.loads(json.dumps(acc.config()))
    assert config["kind"] == acc.kind != ""
    assert config["budget"] == [1.0, 1e-6]


def test_get_epsilon_at_the_spent_delta_equals_spent_epsilon(case):
    for budget in (None, _budget_allowing(case, 5)):
        acc = case.factory(budget)
        for count in (1, 2):
            acc.compose(case.event, count=count)
            eps, delta = acc.spent()
            assert acc.get_epsilon(delta) == eps
    acc = case.factory(None)
    for event in case.supported:
        acc.compose(event)
        eps, delta = acc.spent()
        assert acc.get_epsilon(delta) == eps


# -- monotone --------------------------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 100), st.integers(1, 3)), min_size=1, max_size=8))
def test_spent_epsilon_is_monotone(case, steps):
    check_monotone(case.factory, [(case.supported[index % len(case.supported)], count) for index, count in steps])


# -- count equivalence -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_count_equivalence(case, k):
    for event in case.supported:
        check_count_equivalence(case.factory, event, k)


# -- unsupported events ----------------------------------------------------------------------------------------
def _named(event) -> str:
    return type(event).__name__


def test_unsupported_event_rejected_atomically(case):
    check_unsupported_rejected_atomically(case.factory, case.event, case.unsupported, case.release)


def test_not_an_event_is_a_type_error(case):
    acc = case.factory(None)
    with pytest.raises(TypeError):
        acc.compose("not an event")
    with pytest.raises(TypeError):
        acc.record("not a release")
    assert acc.spent()[0] == 0.0


# -- budget ----------------------------------------------------------------------------------------------------
def test_budget_refusal_is_atomic_and_can_afford_agrees(case):
    check_budget_refusal_atomic(case.factory, case.event, case.release, budget_delta=case.budget_delta)


def test_can_afford_agrees_with_compose_for_every_supported_event(case):
    budget = _budget_allowing(case, 4)
    acc = case.factory(budget)
    for step in range(40):
        event = case.supported[step % len(case.supported)]
        affordable = acc.can_afford(event)
        before = acc.spent()
        try:
            acc.compose(event)
        except BudgetExhaustedError:
            assert not affordable
            assert acc.spent() == before
        else:
            assert affordable
            assert acc.spent()[0] <= budget[0] + 1e-12


def _ledger_rows(ledger) -> list:
    return [(row.id, row.event, row.count, row.outcome, row.charged_teachers, row.spent) for row in ledger.rows()]


@pytest.mark.parametrize("with_ledger", [False, True], ids=["in-memory", "ledger"])
def test_charges_landing_exactly_on_the_budget_are_accepted_and_the_next_is_refused(case, with_ledger):
    """A budget is a hard limit that includes its boundary (docs/accountants.md, "A budget is a hard limit"):
    the budget is the spend of ``k`` charges itself, so the ``k``-th charge lands exactly on it and is
    accepted (through ``can_afford``, ``register``'s check before running, and ``record``); the next one is
    refused by every entry point, before a mechanism runs, with state, spend and ledger rows unchanged.
    (A strict comparison in a budget check, ``<`` for ``<=``, refuses the landing charge: this test fails.)"""
    k, delta = 5, case.budget_delta
    probe = case.factory(None)
    for _ in range(k):
        probe.compose(case.event)
    budget = (probe.get_epsilon(delta), delta)
    assert 0.0 < budget[0] < math.inf
    ledger = Ledger.in_memory() if with_ledger else None
    try:
        acc = case.factory(budget, ledger=ledger)
        for i in range(k - 1):
            assert acc.can_afford(case.event), f"charge {i + 1} of {k} fits the budget {budget}"
            acc.compose(case.event)
        assert acc.get_epsilon(delta) < budget[0]
        assert acc.can_afford(case.event), f"the charge that lands exactly on the budget {budget} is refused"
        mechanism = CountingMechanism(case.event, case.release)
        run = acc.register(mechanism)
        run(None)  # the k-th charge: checked before running, then recorded
        assert mechanism.calls == 1
        assert acc.get_epsilon(delta) == budget[0] and acc.spent()[0] == budget[0]  # exactly on the budget
        before = (acc.state(), acc.spent(), _ledger_rows(ledger) if ledger is not None else None)

        def unchanged():
            return (acc.state(), acc.spent(), _ledger_rows(ledger) if ledger is not None else None) == before

        assert not acc.can_afford(case.event)
        for what, attempt in (
            ("compose", lambda: acc.compose(case.event)),
            ("compose(count=2)", lambda: acc.compose(case.event, count=2)),
            ("record", lambda: acc.record(case.release(case.event))),
            ("record_many", lambda: acc.record_many([case.release(case.event)])),
            ("register's run", lambda: run(None)),
        ):
            with pytest.raises(BudgetExhaustedError):
                attempt()
            assert unchanged(), f"the refused {what} changed the accountant or its ledger"
        assert mechanism.calls == 1  # refused before running
        if ledger is not None:
            result = ledger.verify()
            assert result.ok, result.message
    finally:
        if ledger is not None:
            ledger.close()


# -- register ---------------------------------------------------------------------------------------------------
def test_register_refuses_before_running_and_records_after(case):
    check_register_refuses_before_running(case.factory, case.event, case.release, budget_delta=case.budget_delta)


def test_a_record_in_two_groups_is_charged_for_both(case):
    """The record-level case (docs/privacy_unit.md): a replaced record that leaves one label group and joins
    another changes two groups of a block; the accountant charges at least both groups composed."""
    check_record_in_two_groups(case.factory, case.event, case.release)


def test_register_records_nothing_when_the_mechanism_raises(case):
    acc = case.factory(None)
    mechanism = CountingMechanism(case.event, case.release, fail=True)
    run = acc.register(mechanism)
    with pytest.raises(RuntimeError):
        run(None)
    assert mechanism.calls == 1
    assert acc.spent()[0] == 0.0


def test_register_needs_an_event(case):
    acc = case.factory(None)
    with pytest.raises(TypeError):
        acc.register(lambda h: None)


# -- record_many -------------------------------------------------------------------------------------------------
def test_record_many_is_all_or_nothing(case):
    k = 4
    budget = _budget_allowing(case, k)
    acc = case.factory(budget)
    releases = [case.release(case.event) for _ in range(k + 1)]
    with pytest.raises(BudgetExhaustedError):
        acc.record_many(releases)
    assert acc.spent()[0] == 0.0
    acc.record_many(releases[:k])
    reference = case.factory(budget)
    for _ in range(k):
        reference.record(case.release(case.event))
    assert _close(acc.spent()[0], reference.spent()[0])
    before = acc.spent()
    with pytest.raises(BudgetExhaustedError):
        acc.record_many(releases[:1])
    assert acc.spent() == before
    with pytest.raises(TypeError):
        acc.record_many([releases[0], "not a release"])
    assert acc.spent() == before


def test_record_many_unbudgeted_matches_sequential_records(case):
    batch, sequential = case.factory(None), case.factory(None)
    releases = [case.release(e) for e in case.supported] * 2
    batch.record_many(releases)
    for release in releases:
        sequential.record(release)
    assert _close(batch.spent()[0], sequential.spent()[0])


# -- ledger ------------------------------------------------------------------------------------------------------
def test_refusals_leave_the_ledger_unchanged_and_it_replays(case):
    budget = _budget_allowing(case, 3)
    with Ledger.in_memory() as ledger:
        acc = case.factory(budget, ledger=ledger)
        acc.compose(case.event)
        acc.record_many([case.release(case.event), case.release(case.event)])
        rows, before = ledger.row_count, acc.spent()
        with pytest.raises(BudgetExhaustedError):
            acc.compose(case.event)
        with pytest.raises(BudgetExhaustedError):
            acc.record_many([case.release(case.event)])
        with pytest.raises(UnsupportedEventError, match=_named(case.unsupported)):
            acc.compose(case.unsupported)
        assert ledger.row_count == rows and acc.spent() == before
        result = ledger.verify()
        assert result.ok, result.message
        assert result.spent == pytest.approx(before, rel=1e-12)
        again = case.factory(budget, ledger=ledger)  # attaching replays the stored rows
        assert again.spent() == before


# -- invalid events (foreign events must never lower the spend) ------------------------------------------------
def _forced(event, **fields):
    """``event`` with ``fields`` overwritten after construction (bypassing its own validation)."""
    for name, value in fields.items():
        object.__setattr__(event, name, value)
    return event


def _invalid_events(valid) -> list:
    """Events with a non-finite, zero or negative parameter somewhere inside (``valid``: a supported event)."""
    gauss = dp_event.GaussianDpEvent(2.0)
    return [
        dp_event.LaplaceDpEvent(-2),
        dp_event.LaplaceDpEvent(0),
        dp_event.LaplaceDpEvent(float("nan")),
        dp_event.LaplaceDpEvent(float("inf")),
        dp_event.LaplaceDpEvent("8"),
        dp_event.DiscreteLaplaceDpEvent(-1.0, 1),
        dp_event.DiscreteLaplaceDpEvent(1.0, 0),
        dp_event.DiscreteLaplaceDpEvent(1.0, -2),
        dp_event.DiscreteLaplaceDpEvent(1.0, 1.5),
        dp_event.GaussianDpEvent(-1.0),
        dp_event.GaussianDpEvent(0.0),
        dp_event.RandomizedResponseDpEvent(0.0, 2),
        dp_event.RandomizedResponseDpEvent(1.5, 2),
        dp_event.RandomizedResponseDpEvent(0.5, 0),
        dp_event.ZCDpEvent(-1.0),
        dp_event.ZCDpEvent(float("nan")),
        dp_event.PoissonSampledDpEvent(0.0, gauss),
        dp_event.PoissonSampledDpEvent(1.5, gauss),
        dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(-1.0)),
        dp_event.SampledWithoutReplacementDpEvent(10, 20, gauss),
        dp_event.SelfComposedDpEvent(valid, -3),
        dp_event.SelfComposedDpEvent(valid, 0),
        dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(-2), 2),
        dp_event.ComposedDpEvent([valid, dp_event.LaplaceDpEvent(-2)]),
        dp_event.ComposedDpEvent([valid, dp_event.SelfComposedDpEvent(valid, -1)]),
        _forced(EpsilonDeltaEvent(0.1), epsilon=-1.0),
        _forced(EpsilonDeltaEvent(0.1), delta=float("nan")),
        _forced(BetweenThresholdsEvent(0.1, 0.3), epsilon=0.0),
        BoundaryWrapperEvent(dp_event.LaplaceDpEvent(-2), 0.1, 1 / 3),
    ]


def test_invalid_events_are_refused_atomically(case):
    budget = _budget_allowing(case, 4)
    with Ledger.in_memory() as ledger:
        acc = case.factory(budget, ledger=ledger)
        acc.compose(case.event)
        before, rows = acc.spent(), ledger.row_count
        for bad in _invalid_events(case.event):
            for attempt in (
                lambda: acc.compose(bad),
                lambda: acc.compose(bad, count=3),
                lambda: acc.record(Release("token", bad)),
                lambda: acc.record_many([case.release(case.event), Release("token", bad)]),
                lambda: acc.can_afford(bad),
                lambda: acc.register(CountingMechanism(bad)),
            ):
                with pytest.raises((ValueError, TypeError)) as info:
                    attempt()
                message = str(info.value)  # one line naming the parameter and its value
                assert "\n" not in message and " must be " in message and ", got " in message, message
            assert acc.spent() == before and ledger.row_count == rows, bad
        acc.compose(case.event)  # still usable
        assert acc.spent()[0] >= before[0]


@pytest.mark.parametrize(
    "event, words",
    [
        (dp_event.LaplaceDpEvent(-2), "LaplaceDpEvent.noise_multiplier must be > 0.0, got -2.0"),
        (dp_event.LaplaceDpEvent(0), "LaplaceDpEvent.noise_multiplier must be > 0.0, got 0.0"),
        (dp_event.DiscreteLaplaceDpEvent(-1.0, 1), "DiscreteLaplaceDpEvent.noise_parameter must be > 0.0, got -1.0"),
        (dp_event.DiscreteLaplaceDpEvent(1.0, -2), "DiscreteLaplaceDpEvent.sensitivity must be >= 1, got -2"),
        (dp_event.SelfComposedDpEvent(dp_event.NoOpDpEvent(), -3), "SelfComposedDpEvent.count must be >= 1, got -3"),
        (dp_event.PoissonSampledDpEvent(2.0, dp_event.GaussianDpEvent(1.0)),
         "PoissonSampledDpEvent.sampling_probability must be <= 1.0, got 2.0"),
        (dp_event.RandomizedResponseDpEvent(-0.5, 2), "RandomizedResponseDpEvent.noise_parameter must be > 0.0, got -0.5"),
        (dp_event.GaussianDpEvent(float("inf")), "GaussianDpEvent.noise_multiplier must be finite, got inf"),
    ],
)
def test_invalid_event_errors_name_the_parameter_and_value(event, words):
    with pytest.raises(ValueError) as info:
        BasicCompositionAccountant().compose(event)
    assert str(info.value) == words


#: The attacks of the soundness review: before the checks, each of these *lowered* the spent epsilon (or
#: crashed with ZeroDivisionError) and let later charges through beyond the budget.
ATTACKS = [dp_event.LaplaceDpEvent(noise_multiplier=-2), dp_event.DiscreteLaplaceDpEvent(-1.0, 1), dp_event.LaplaceDpEvent(0)]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda e: repr(e))
@pytest.mark.parametrize(
    "factory",
    [
        lambda budget: BasicCompositionAccountant(budget=budget, neighboring_relation=AR),
        lambda budget: AdvancedCompositionAccountant(budget=budget, neighboring_relation=AR),
        lambda budget: RdpAccountant(budget=budget, neighboring_relation=AR),
        lambda budget: PldAccountant(budget=budget, neighboring_relation=AR),
    ],
    ids=["basic", "advanced", "rdp", "pld"],
)
def test_attack_transcript_negative_or_zero_noise(factory, attack):
    """The transcript: spend most of the budget honestly, try the foreign event, then try one more honest
    step that does not fit.  The foreign event is refused (ValueError naming its parameter), nothing moves,
    and the budget still refuses the step that would exceed it."""
    step = EpsilonDeltaEvent(0.4, relation=AR)
    probe = factory(None)
    probe.compose(step, count=2)
    budget = (probe.get_epsilon(1e-6) * 1.001, 1e-6)  # room for two steps, not three
    acc = factory(budget)
    acc.compose(step, count=2)
    before = acc.spent()
    with pytest.raises(ValueError, match="must be > 0.0, got"):
        acc.compose(attack)
    with pytest.raises(ValueError, match="must be > 0.0, got"):
        acc.compose(dp_event.ComposedDpEvent([attack, attack]), count=5)
    assert acc.spent() == before
    assert not acc.can_afford(step)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(step)
    assert acc.spent() == before and acc.spent()[0] <= budget[0]


# -- one relation per accountant -----------------------------------------------------------------------------------
_OTHER = {"replace-one": "add-remove-one", "add-remove-one": "replace-one"}


def _flipped(event):
    """``event`` stated under the other relation (``None`` if it states none)."""
    import attr

    if isinstance(event, BoundaryWrapperEvent):
        inner = _flipped(event.inner)
        return None if inner is None else attr.evolve(event, inner=inner)
    relation = getattr(event, "relation", None)
    return None if relation is None else attr.evolve(event, relation=_OTHER[relation])


def test_events_under_another_relation_are_refused_atomically(case):
    stated = [e for e in case.supported if _flipped(e) is not None]
    assert stated, "each case charges at least one event that states its relation"
    event = stated[0]
    other = _flipped(event)
    with Ledger.in_memory() as ledger:
        acc = case.factory(None, ledger=ledger)
        acc.compose(event)
        before, rows = acc.spent(), ledger.row_count
        for attempt in (
            lambda: acc.compose(other),
            lambda: acc.record(case.release(other)),
            lambda: acc.record_many([case.release(event), case.release(other)]),
            lambda: acc.compose(dp_event.ComposedDpEvent([event, other])),
            lambda: acc.register(CountingMechanism(other)),
        ):
            with pytest.raises(UnsupportedEventError) as info:
                attempt()
            message = str(info.value)  # names both relations
            assert "'replace-one'" in message and "'add-remove-one'" in message, message
        assert acc.spent() == before and ledger.row_count == rows
        acc.compose(event)  # still usable under its relation


# -- random sequences of valid, invalid and mixed-relation events --------------------------------------------------
_STEP_KINDS = ("valid", "invalid", "other-relation", "composed")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(_STEP_KINDS), st.integers(0, 1000), st.integers(1, 3)),
                      min_size=1, max_size=10))
def test_random_sequences_never_lower_the_spend_nor_pass_the_budget(case, steps):
    """Over any sequence of charges, valid or not: an accepted charge never lowers the spent epsilon at the
    budget's delta, an invalid event (bad parameter) is always refused with ValueError/TypeError, an event
    under another relation with UnsupportedEventError, and a refused charge leaves everything as it was;
    the spent epsilon never exceeds the budget."""
    budget = _budget_allowing(case, 5)
    delta = budget[1]
    acc = case.factory(budget)
    acc.compose(case.event)  # fixes the relation
    invalid = _invalid_events(case.event)
    flippable = [e for e in case.supported if _flipped(e) is not None]
    for kind, index, count in steps:
        before, before_eps = acc.spent(), acc.get_epsilon(delta)
        if kind == "valid":
            event, expected = case.supported[index % len(case.supported)], (BudgetExhaustedError,)
        elif kind == "invalid":
            event, expected = invalid[index % len(invalid)], (ValueError, TypeError)
        elif kind == "other-relation":
            event, expected = _flipped(flippable[index % len(flippable)]), (UnsupportedEventError,)
        else:  # a valid event composed with an invalid one
            event = dp_event.ComposedDpEvent([case.supported[index % len(case.supported)], invalid[index % len(invalid)]])
            expected = (ValueError, TypeError)
        try:
            acc.compose(event, count=count)
        except (BudgetExhaustedError, UnsupportedEventError, ValueError, TypeError) as exc:
            assert isinstance(exc, expected), (kind, event, exc)
            assert acc.spent() == before and acc.get_epsilon(delta) == before_eps
        else:
            assert kind == "valid", f"{kind} event {event!r} was accepted"
            after = acc.get_epsilon(delta)
            assert after >= before_eps or _close(after, before_eps), (event, before_eps, after)
        assert acc.spent()[0] <= budget[0] + 1e-12


# -- the public checks have teeth -------------------------------------------------------------------------------
class _Faulty:
    """A basic-composition accountant behind the public API, with one fault switched on."""

    def __init__(self, fault, budget=None, ledger=None):
        self.fault, self.calls = fault, 0
        self.inner = BasicCompositionAccountant(budget=None if fault == "overspends" else budget)
        self.budget = budget

    def compose(self, event, count=1):
        self.calls += 1
        if self.fault == "ignores-count":
            count = 1
        if self.fault == "charges-then-checks":
            self.inner.compose(EpsilonDeltaEvent(0.01))
        return self.inner.compose(event, count=count)

    def record(self, release):
        return self.inner.record(release)

    def record_many(self, releases):
        return self.inner.record_many(releases)

    def can_afford(self, event, count=1):
        return self.inner.can_afford(event, count=count)

    def register(self, mechanism):
        return self.inner.register(mechanism)

    def get_epsilon(self, delta):
        return self.inner.get_epsilon(delta)

    def spent(self):
        eps, delta = self.inner.spent()
        if self.fault == "halves-every-other-charge" and self.calls % 2 == 0:
            eps /= 2
        return (eps + 1.0, delta) if self.fault == "starts-above-zero" else (eps, delta)


def _faulty(fault):
    return lambda budget=None, ledger=None: _Faulty(fault, budget, ledger)


def test_the_public_checks_catch_faulty_accountants():
    event = EpsilonDeltaEvent(0.1)
    for check in (
        lambda f: check_empty_is_zero(f),
        lambda f: check_count_equivalence(f, event, 3),
        lambda f: check_unsupported_rejected_atomically(f, event, ThresholdPrivacyEvent(5)),
        lambda f: check_budget_refusal_atomic(f, event),
        lambda f: check_register_refuses_before_running(f, event),
    ):
        check(_faulty(None))  # the honest accountant passes every check
    with pytest.raises(AssertionError, match="fresh accountant has spent"):
        check_empty_is_zero(_faulty("starts-above-zero"))
    with pytest.raises(AssertionError, match="count=3 at once spends"):
        check_count_equivalence(_faulty("ignores-count"), event, 3)
    with pytest.raises(AssertionError, match="changed the spend"):
        check_unsupported_rejected_atomically(_faulty("charges-then-checks"), event, ThresholdPrivacyEvent(5))
    with pytest.raises(AssertionError, match="beyond the budget"):
        check_budget_refusal_atomic(_faulty("overspends"), event)
    with pytest.raises(AssertionError, match="expected BudgetExhaustedError"):
        check_register_refuses_before_running(_faulty("overspends"), event)
    check_monotone(_faulty(None), [(event, 1)] * 4)
    with pytest.raises(AssertionError, match="lowered the spent epsilon"):
        check_monotone(_faulty("halves-every-other-charge"), [(event, 1)] * 4)


# -- what is left, told one way (issue 32, item 3) ---------------------------------------------------------------
def test_the_remaining_budget_is_told_one_way(case, tmp_path, monkeypatch, capsys):
    """``accountant.remaining_budget()``, ``audit`` and ``ledger list`` tell one remaining budget (one computation,
    ``pate_accountant.accountants.Remaining``): after a partial spend something is left (under PLD the delta is not
    reported as used up, which made ``audit`` say "no budget left" while the next run was accepted), and after a
    budget that admits exactly 5 charges took them, all three tell the same small rest, which pays for no
    further step."""
    from pate_accountant.accountants import remaining_of
    from pate_accountant.cli import main
    from pate_accountant.ledger_home import LedgerHome

    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "home"))
    budget = _budget_allowing(case, 5)
    path = tmp_path / "left.sqlite"
    LedgerHome().register("hmac-sha256:" + "1" * 64, "left", path)
    for charges, another in ((3, True), (2, False)):
        with Ledger.open(path) as ledger:
            ledger.set_dataset("left")
            accountant = case.factory(budget=budget, ledger=ledger)
            for _ in range(charges):
                accountant.record(case.release(case.event))
            left, stored = accountant.remaining_budget(), ledger.stored_spent
            assert accountant.can_afford(case.event) is another
        assert left.budget == tuple(budget) and not (left.spent and another)
        if not accountant.delta_adds_up:
            assert left.delta is None and left.at_delta > 0
        assert main(["audit", str(path)]) in (0, 1)
        assert f"remaining   : {left.words()}" in capsys.readouterr().out
        if stored is not None:  # individual charging keeps its spend in the confidential part
            assert remaining_of(accountant.kind, stored, budget) == left
            assert main(["ledger", "list"]) == 0
            assert f"remaining : {left.words()} (as stored" in capsys.readouterr().out
