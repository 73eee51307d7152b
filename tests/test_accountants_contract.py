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


#: dp-accounting's Laplace (and its RDP Gaussian) noise is defined under add/remove-one: the cases charging
#: them are built under that relation, with our events stated under it too.
AR = "add-remove-one"

ACCOUNTANT_CASES = [
    AccountantCase(
        "basic",
        lambda budget=None, ledger=None: BasicCompositionAccountant(budget=budget, ledger=ledger, neighboring_relation=AR),
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
    AccountantCase(
        "advanced",
        lambda budget=None, ledger=None: AdvancedCompositionAccountant(budget=budget, ledger=ledger),
        (EpsilonDeltaEvent(0.1), EpsilonDeltaEvent(0.05, 1e-9), BetweenThresholdsEvent(0.2, 0.3),
         WeightedSamplingEvent(0.1, 1e-10), BoundaryWrapperEvent(EpsilonDeltaEvent(0.05), 0.1, 1 / 3)),
        ThresholdPrivacyEvent(5),
    ),
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
        (BetweenThresholdsEvent(0.01, 0.47, "add-remove-one"), BetweenThresholdsEvent(0.005, 0.48, "add-remove-one")),
        BoundaryWrapperEvent(EpsilonDeltaEvent(0.005, relation="add-remove-one"), 0.01, 1 / 3),
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
