"""One contract suite, parametrized over every accountant (DESIGN.md, Test style; base.py).

To add an accountant, append an :class:`AccountantCase` to ``ACCOUNTANT_CASES``: a factory taking
``budget=None | (epsilon, delta)`` and ``ledger=None``, the events it supports (one or more; the first is the default), one
event it rejects, and how to make a ``Release`` of a supported event (for accountants that charge by
outcome, e.g. a target hit).  Properties checked for each:

* empty is zero; ``get_epsilon`` at the delta ``spent()`` reports equals the spent epsilon;
* monotone: the spent epsilon never decreases as events are added (hypothesis);
* count equivalence: ``compose(e, count=k)`` equals ``k`` times ``compose(e)``;
* unsupported events are rejected atomically (``compose``, ``record``, ``record_many``, ``can_afford``,
  ``register``), with an error naming the event;
* budget refusal is atomic, ``can_afford`` agrees with whether ``compose`` succeeds;
* ``register(mechanism)`` refuses before running and records after running; ``record_many`` is
  all-or-nothing; ``config()`` is JSON data naming the accountant's ``kind``;
* with an in-memory ledger: refused and rejected charges add no row, the ledger verifies, and a second
  accountant attached to it replays to the same spent budget.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

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

#: Relative slack for comparing epsilons computed along different composition orders (PLD merges).
REL = 1e-9


def _plain_release(event: dp_accounting.DpEvent) -> Release:
    return Release("token", event)


def _target_release(event: dp_accounting.DpEvent) -> Release:
    """A q-target mechanism's worst outcome: a target hit."""
    return Release(None, event, target_hit=True)


def _all_teachers_release(event: dp_accounting.DpEvent) -> Release:
    """A BetweenThresholds "between" charging all 4 teachers, so a budget of k charges allows k runs."""
    return Release("between", event, target_hit=True, charged_teachers=frozenset(range(4)))


@dataclasses.dataclass(frozen=True)
class AccountantCase:
    """One accountant under the contract."""

    name: str
    #: ``factory(budget, ledger=None)`` with ``budget`` ``None`` or ``(epsilon, delta)`` returns a fresh accountant.
    factory: Callable[..., object]
    #: Events the accountant charges (the first one is used where a single event is needed).
    supported: tuple
    #: An event it must reject with ``UnsupportedEventError`` naming it.
    unsupported: dp_accounting.DpEvent
    #: ``release(event) -> Release``: what a mechanism announcing ``event`` returns when it runs.
    release: Callable[[dp_accounting.DpEvent], Release] = _plain_release
    #: The delta of the budgets the suite sets.
    budget_delta: float = 1e-6

    def __str__(self):
        return self.name

    @property
    def event(self):
        return self.supported[0]


ACCOUNTANT_CASES = [
    AccountantCase(
        "basic",
        lambda budget=None, ledger=None: BasicCompositionAccountant(budget=budget, ledger=ledger),
        (EpsilonDeltaEvent(0.1), BetweenThresholdsEvent(0.05, 0.3), NoisyArgMaxEvent(0.2, 1e-9),
         dp_event.LaplaceDpEvent(8.0)),
        ThresholdPrivacyEvent(5),
    ),
    AccountantCase(
        "advanced",
        lambda budget=None, ledger=None: AdvancedCompositionAccountant(budget=budget, ledger=ledger),
        (EpsilonDeltaEvent(0.1), EpsilonDeltaEvent(0.05, 1e-9), BetweenThresholdsEvent(0.2, 0.3),
         WeightedSamplingEvent(0.1, 1e-10), BoundaryWrapperEvent(EpsilonDeltaEvent(0.05), 0.1, 1 / 3)),
        ThresholdPrivacyEvent(5),
    ),
    AccountantCase(
        "rdp",
        lambda budget=None, ledger=None: RdpAccountant(budget=budget, ledger=ledger),
        (EpsilonDeltaEvent(0.1), dp_event.GaussianDpEvent(5.0), BetweenThresholdsEvent(0.05, 0.3),
         dp_event.LaplaceDpEvent(8.0)),
        ThresholdPrivacyEvent(5),
    ),
    AccountantCase(
        "rdp-approximate-rejected",
        lambda budget=None, ledger=None: RdpAccountant(budget=budget, ledger=ledger),
        (dp_event.GaussianDpEvent(3.0),),
        NoisyArgMaxEvent(0.5, 1e-7),
    ),
    AccountantCase(
        "pld",
        lambda budget=None, ledger=None: PldAccountant(budget=budget, ledger=ledger),
        (BetweenThresholdsEvent(0.1, 0.3), EpsilonDeltaEvent(0.05, 1e-9), dp_event.LaplaceDpEvent(8.0),
         dp_event.GaussianDpEvent(5.0), NoisyArgMaxEvent(0.2, 1e-10)),
        ThresholdPrivacyEvent(5),
    ),
    AccountantCase(
        "target-charging",
        lambda budget=None, ledger=None: TargetChargingAccountant(budget=budget, ledger=ledger),
        # A budgeted target-charging accountant keeps the class of its first query: the first one covers the
        # rest (wrapped approximate-DP queries, which pay their delta on every query, have their own tests).
        (BoundaryWrapperEvent(EpsilonDeltaEvent(0.005), 0.01, 1 / 3), BetweenThresholdsEvent(0.01, 0.4)),
        EpsilonDeltaEvent(0.1),
        release=_target_release,
    ),
    AccountantCase(
        "individual-charging",
        lambda budget=None, ledger=None: IndividualChargingAccountant(
            4, budget=budget, ledger=ledger, epsilon0=0.01, q=0.47, relation="add-remove-one"
        ),
        (BetweenThresholdsEvent(0.01, 0.47), BetweenThresholdsEvent(0.005, 0.48)),
        BoundaryWrapperEvent(EpsilonDeltaEvent(0.005), 0.01, 1 / 3),
        release=_all_teachers_release,
    ),
]


@pytest.fixture(params=ACCOUNTANT_CASES, ids=str)
def case(request) -> AccountantCase:
    return request.param


class CountingMechanism:
    """A fake mechanism: announces ``event``, counts its runs, returns ``release(event)``."""

    def __init__(self, event, release=_plain_release, fail: bool = False):
        self.event = event
        self.calls = 0
        self._release = release
        self._fail = fail

    def __call__(self, histogram=None, rng=None):
        self.calls += 1
        if self._fail:
            raise RuntimeError("mechanism failed")
        return self._release(self.event)


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def _budget_allowing(case: AccountantCase, k: int):
    """A budget that admits exactly ``k`` charges of ``case.event`` (halfway between k and k + 1)."""
    acc = case.factory(None)
    acc.compose(case.event, count=k)
    eps_k = acc.get_epsilon(case.budget_delta)
    acc.compose(case.event)
    eps_next = acc.get_epsilon(case.budget_delta)
    assert eps_next > eps_k, "the default supported event must cost something"
    return ((eps_k + eps_next) / 2, case.budget_delta)


# -- empty, config ---------------------------------------------------------------------------------------------
def test_empty_is_zero(case):
    acc = case.factory(None)
    assert acc.spent()[0] == 0.0
    for delta in (0.0, 1e-9, 1e-6, 0.1, 0.5, 1.0):
        assert acc.get_epsilon(delta) == 0.0
    assert case.factory((1.0, 1e-6)).spent()[0] == 0.0


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
    acc = case.factory(None)
    previous = acc.spent()[0]
    for index, count in steps:
        acc.compose(case.supported[index % len(case.supported)], count=count)
        eps = acc.spent()[0]
        assert eps >= previous or _close(eps, previous)
        previous = eps


# -- count equivalence -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_count_equivalence(case, k):
    for event in case.supported:
        at_once, one_by_one = case.factory(None), case.factory(None)
        at_once.compose(event, count=k)
        for _ in range(k):
            one_by_one.compose(event)
        a, b = at_once.spent(), one_by_one.spent()
        assert _close(a[0], b[0]) and _close(a[1], b[1]), (event, a, b)


# -- unsupported events ----------------------------------------------------------------------------------------
def _named(event) -> str:
    return type(event).__name__


def test_unsupported_event_rejected_atomically(case):
    acc = case.factory(None)
    acc.compose(case.event, count=2)
    before = acc.spent()
    bad = case.unsupported
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.compose(bad)
    assert acc.spent() == before
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.compose(bad, count=5)
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.record(Release("token", bad))
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.record_many([case.release(case.event), Release("token", bad)])
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.can_afford(bad)
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.compose(dp_event.ComposedDpEvent([case.event, bad]))
    mechanism = CountingMechanism(bad)
    with pytest.raises(UnsupportedEventError, match=_named(bad)):
        acc.register(mechanism)
    assert mechanism.calls == 0
    assert acc.spent() == before
    acc.compose(case.event)  # still usable
    assert acc.spent()[0] >= before[0]


def test_not_an_event_is_a_type_error(case):
    acc = case.factory(None)
    with pytest.raises(TypeError):
        acc.compose("not an event")
    with pytest.raises(TypeError):
        acc.record("not a release")
    assert acc.spent()[0] == 0.0


# -- budget ----------------------------------------------------------------------------------------------------
def test_budget_refusal_is_atomic_and_can_afford_agrees(case):
    k = 6
    budget = _budget_allowing(case, k)
    acc = case.factory(budget)
    for _ in range(k):
        assert acc.can_afford(case.event)
        acc.compose(case.event)
        assert acc.spent()[0] <= budget[0] + 1e-12
    before = acc.spent()
    assert not acc.can_afford(case.event)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(case.event)
    assert acc.spent() == before
    with pytest.raises(BudgetExhaustedError):
        acc.record(case.release(case.event))
    assert acc.spent() == before
    assert not acc.can_afford(case.event, count=3)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(case.event, count=3)
    assert acc.spent() == before


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


def test_budget_at_count_k_at_once(case):
    budget = _budget_allowing(case, 5)
    acc = case.factory(budget)
    assert not acc.can_afford(case.event, count=6)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(case.event, count=6)
    assert acc.spent()[0] == 0.0
    assert acc.can_afford(case.event, count=5)
    acc.compose(case.event, count=5)
    assert 0.0 < acc.spent()[0] <= budget[0] + 1e-12


# -- register ---------------------------------------------------------------------------------------------------
def test_register_refuses_before_running_and_records_after(case):
    k = 3
    budget = _budget_allowing(case, k)
    acc = case.factory(budget)
    mechanism = CountingMechanism(case.event, case.release)
    run = acc.register(mechanism)
    assert mechanism.calls == 0 and acc.spent()[0] == 0.0
    previous = 0.0
    for i in range(k):
        release = run(None, rng=None)
        assert isinstance(release, Release)
        assert mechanism.calls == i + 1
        eps = acc.spent()[0]
        assert eps > previous
        previous = eps
    before = acc.spent()
    with pytest.raises(BudgetExhaustedError):
        run(None)
    assert mechanism.calls == k  # refused before running
    assert acc.spent() == before


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
