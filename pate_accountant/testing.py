"""Contract checks for accountants, as plain functions: unit-test your own accountant the way ours are tested.

Every check builds fresh accountants from a ``factory(budget=None, ledger=None)`` (``budget`` ``None`` or an
``(epsilon, delta)`` pair) and uses the public accountant API only (``compose``, ``record``, ``register``,
``can_afford``, ``get_epsilon``, ``spent``).  A broken property raises ``AssertionError`` saying which; none
of the checks needs pytest.

* :func:`check_empty_is_zero` -- a fresh accountant has spent nothing, at every delta.
* :func:`check_monotone` -- the spent epsilon never decreases as events are charged.
* :func:`check_count_equivalence` -- ``compose(e, count=k)`` spends what ``k`` times ``compose(e)`` spends.
* :func:`check_unsupported_rejected_atomically` -- an event the accountant cannot account for is refused
  with ``UnsupportedEventError`` naming it, by every entry point, and nothing changes.
* :func:`check_budget_refusal_atomic` -- with a budget, charges are admitted until the next one would exceed
  it, ``can_afford`` agrees, and a refused charge (``compose``, ``record``, several at once) changes nothing.
* :func:`check_register_refuses_before_running` -- ``register(mechanism)`` runs and records while the budget
  lasts, and refuses before running the mechanism once it does not.
* :func:`check_record_in_two_groups` -- the record-level case: in a block of groups where one record can change
  two groups (``parallel_groups(G, touches=2)``: a replaced record that moves between two label groups), the
  spend is at least that of the two costliest groups' charges composed.

:class:`AccountantCase` bundles what the checks need to know about one accountant, and
:func:`check_accountant` runs them all; :func:`default_accountant_case` describes an accountant that charges
plain ``(epsilon, delta)`` events and is built as ``cls(budget=..., ledger=...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import dp_accounting
from dp_accounting import dp_event

from pate_accountant.errors import BudgetExhaustedError, UnsupportedEventError
from pate_accountant.events import EpsilonDeltaEvent, ThresholdPrivacyEvent
from pate_accountant.release import Release
from pate_accountant.validation import check_int

__all__ = [
    "REL",
    "AccountantCase",
    "CountingMechanism",
    "budget_allowing",
    "check_accountant",
    "check_budget_refusal_atomic",
    "check_count_equivalence",
    "check_empty_is_zero",
    "check_monotone",
    "check_record_in_two_groups",
    "check_register_refuses_before_running",
    "check_unsupported_rejected_atomically",
    "default_accountant_case",
    "plain_release",
]

#: Relative slack for comparing epsilons computed along different composition orders (a PLD accountant
#: merges its losses in an order that depends on how they were charged).
REL = 1e-9


def plain_release(event: dp_accounting.DpEvent) -> Release:
    """What a mechanism announcing ``event`` returns when it releases a token."""
    return Release("token", event)


@dataclasses.dataclass(frozen=True)
class AccountantCase:
    """One accountant under the contract: ``factory(budget=None, ledger=None)`` builds a fresh one,
    ``supported`` lists events it charges (the first is used where one event is needed; it must cost
    something), ``unsupported`` is an event it must refuse with ``UnsupportedEventError``, ``release(event)``
    is what a mechanism announcing ``event`` returns (for accountants that charge by outcome, e.g. a target
    hit), and ``budget_delta`` is the delta of the budgets the checks set."""

    name: str
    factory: Callable[..., object]
    supported: tuple
    unsupported: dp_accounting.DpEvent
    release: Callable[[dp_accounting.DpEvent], Release] = plain_release
    budget_delta: float = 1e-6

    def __str__(self):
        return self.name

    @property
    def event(self) -> dp_accounting.DpEvent:
        return self.supported[0]


def default_accountant_case(cls, name: str | None = None) -> AccountantCase:
    """The case of an accountant class that charges ``(epsilon, delta)`` events under replace-one, refuses
    threshold privacy, and is built as ``cls(budget=..., ledger=...)`` (what ``runs=True`` registration
    requires)."""
    return AccountantCase(
        name or getattr(cls, "kind", "") or cls.__name__,
        lambda budget=None, ledger=None: cls(budget=budget, ledger=ledger),
        (EpsilonDeltaEvent(0.1), EpsilonDeltaEvent(0.05, 1e-9)),
        ThresholdPrivacyEvent(5),
    )


class CountingMechanism:
    """A stand-in mechanism: announces ``event``, counts its runs and returns ``release(event)`` (or raises
    ``RuntimeError`` with ``fail=True``)."""

    def __init__(self, event, release=plain_release, fail: bool = False):
        self.event = event
        self.calls = 0
        self._release = release
        self._fail = fail

    def __call__(self, histogram=None, rng=None):
        self.calls += 1
        if self._fail:
            raise RuntimeError("mechanism failed")
        return self._release(self.event)


def _close(a: float, b: float, rel: float = REL) -> bool:
    return a == b or abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def _refused(error: type, call: Callable, what: str, names: str | None = None) -> BaseException:
    """Run ``call``; it must raise ``error`` (whose message contains ``names`` when given)."""
    try:
        call()
    except error as exc:
        if names is not None and names not in str(exc):
            raise AssertionError(f"{what}: the {error.__name__} does not name {names}: {exc}") from exc
        return exc
    raise AssertionError(f"{what}: expected {error.__name__}, nothing was raised")


def budget_allowing(factory: Callable, event, k: int, delta: float = 1e-6) -> tuple[float, float]:
    """A budget ``(epsilon, delta)`` that admits exactly ``k`` charges of ``event``: epsilon halfway between
    the spend after ``k`` and after ``k + 1`` charges, at ``delta``."""
    k = check_int("k", k, minimum=1)
    acc = factory(None)
    acc.compose(event, count=k)
    eps_k = acc.get_epsilon(delta)
    acc.compose(event)
    eps_next = acc.get_epsilon(delta)
    if not eps_next > eps_k:
        raise AssertionError(f"{event!r} costs nothing at delta {delta}: the budget checks need an event that does")
    return ((eps_k + eps_next) / 2, delta)


def check_empty_is_zero(factory: Callable, deltas: Iterable[float] = (0.0, 1e-9, 1e-6, 0.1, 0.5, 1.0)) -> None:
    """A fresh accountant (with and without a budget) has spent epsilon 0, and ``get_epsilon`` is 0 at
    every delta."""
    acc = factory(None)
    if acc.spent()[0] != 0.0:
        raise AssertionError(f"a fresh accountant has spent {acc.spent()}")
    for delta in deltas:
        if acc.get_epsilon(delta) != 0.0:
            raise AssertionError(f"a fresh accountant reports epsilon {acc.get_epsilon(delta)} at delta {delta}")
    budgeted = factory((1.0, 1e-6))
    if budgeted.spent()[0] != 0.0:
        raise AssertionError(f"a fresh accountant with a budget has spent {budgeted.spent()}")


def check_monotone(factory: Callable, steps: Iterable) -> None:
    """Charge ``steps`` (``(event, count)`` pairs) one after another on a fresh accountant: the spent
    epsilon never decreases (up to :data:`REL`)."""
    acc = factory(None)
    previous = acc.spent()[0]
    for event, count in steps:
        acc.compose(event, count=count)
        epsilon = acc.spent()[0]
        if not (epsilon >= previous or _close(epsilon, previous)):
            raise AssertionError(f"charging {event!r} x {count} lowered the spent epsilon from {previous} to {epsilon}")
        previous = epsilon


def check_count_equivalence(factory: Callable, event, count: int) -> None:
    """``compose(event, count=count)`` spends what ``count`` separate ``compose(event)`` calls spend (epsilon
    and delta, up to :data:`REL`)."""
    count = check_int("count", count, minimum=1)
    at_once, one_by_one = factory(None), factory(None)
    at_once.compose(event, count=count)
    for _ in range(count):
        one_by_one.compose(event)
    a, b = at_once.spent(), one_by_one.spent()
    if not (_close(a[0], b[0]) and _close(a[1], b[1])):
        raise AssertionError(f"{event!r}: count={count} at once spends {a}, one by one {b}")


def check_unsupported_rejected_atomically(factory: Callable, supported, unsupported,
                                          release: Callable = plain_release) -> None:
    """An accountant that has charged ``supported`` twice refuses ``unsupported`` -- through ``compose`` (also
    with a count and inside a ``ComposedDpEvent``), ``record``, ``record_many`` (beside a good release),
    ``can_afford`` and ``register`` (without running the mechanism) -- with an ``UnsupportedEventError`` naming
    the event's class, and its spend is unchanged; it stays usable."""
    acc = factory(None)
    acc.compose(supported, count=2)
    before = acc.spent()
    name = type(unsupported).__name__
    attempts = {
        "compose": lambda: acc.compose(unsupported),
        "compose with a count": lambda: acc.compose(unsupported, count=5),
        "record": lambda: acc.record(Release("token", unsupported)),
        "record_many": lambda: acc.record_many([release(supported), Release("token", unsupported)]),
        "can_afford": lambda: acc.can_afford(unsupported),
        "compose of a ComposedDpEvent": lambda: acc.compose(dp_event.ComposedDpEvent([supported, unsupported])),
    }
    for what, attempt in attempts.items():
        _refused(UnsupportedEventError, attempt, f"{what} of {name}", names=name)
        if acc.spent() != before:
            raise AssertionError(f"the refused {what} of {name} changed the spend from {before} to {acc.spent()}")
    mechanism = CountingMechanism(unsupported)
    _refused(UnsupportedEventError, lambda: acc.register(mechanism), f"register of {name}", names=name)
    if mechanism.calls or acc.spent() != before:
        raise AssertionError(f"register refused {name} but ran the mechanism or changed the spend")
    acc.compose(supported)
    if acc.spent()[0] < before[0]:
        raise AssertionError("after a refusal, charging a supported event lowered the spend")


def check_budget_refusal_atomic(factory: Callable, event, release: Callable = plain_release, *, steps: int = 6,
                                budget_delta: float = 1e-6) -> None:
    """With a budget admitting ``steps`` charges of ``event`` (:func:`budget_allowing`): each is affordable
    and admitted and the spend stays within the budget; then ``can_afford`` says no and ``compose``,
    ``record`` and ``compose(count=3)`` raise ``BudgetExhaustedError`` without changing the spend.  A fresh
    accountant with the same budget refuses ``steps + 1`` charges at once and admits ``steps`` at once."""
    budget = budget_allowing(factory, event, steps, budget_delta)
    acc = factory(budget)
    for i in range(steps):
        if not acc.can_afford(event):
            raise AssertionError(f"charge {i + 1} of {steps} fits the budget {budget} but can_afford says no")
        acc.compose(event)
        if acc.spent()[0] > budget[0] + 1e-12:
            raise AssertionError(f"the spend {acc.spent()} exceeds the budget {budget}")
    before = acc.spent()
    if acc.can_afford(event):
        raise AssertionError(f"can_afford admits a charge beyond the budget {budget}")
    for what, attempt in (("compose", lambda: acc.compose(event)), ("record", lambda: acc.record(release(event))),
                          ("compose(count=3)", lambda: acc.compose(event, count=3))):
        _refused(BudgetExhaustedError, attempt, f"{what} beyond the budget")
        if acc.spent() != before:
            raise AssertionError(f"the refused {what} changed the spend from {before} to {acc.spent()}")
    if acc.can_afford(event, count=3):
        raise AssertionError("can_afford(count=3) admits charges beyond the budget")
    fresh = factory(budget)
    if fresh.can_afford(event, count=steps + 1):
        raise AssertionError(f"can_afford admits {steps + 1} charges at once within a budget for {steps}")
    _refused(BudgetExhaustedError, lambda: fresh.compose(event, count=steps + 1), "compose of too many at once")
    if fresh.spent()[0] != 0.0:
        raise AssertionError("a refused compose(count=...) spent something")
    if not fresh.can_afford(event, count=steps):
        raise AssertionError(f"can_afford refuses {steps} charges at once within a budget for {steps}")
    fresh.compose(event, count=steps)
    if not 0.0 < fresh.spent()[0] <= budget[0] + 1e-12:
        raise AssertionError(f"{steps} charges at once spent {fresh.spent()} within the budget {budget}")


def check_register_refuses_before_running(factory: Callable, event, release: Callable = plain_release, *,
                                          steps: int = 3, budget_delta: float = 1e-6) -> None:
    """``register(mechanism)`` runs nothing when registering; each call of the returned function runs the
    mechanism once and spends more, while the budget (admitting ``steps`` runs) lasts; the next call raises
    ``BudgetExhaustedError`` before running the mechanism and spends nothing."""
    budget = budget_allowing(factory, event, steps, budget_delta)
    acc = factory(budget)
    mechanism = CountingMechanism(event, release)
    run = acc.register(mechanism)
    if mechanism.calls or acc.spent()[0] != 0.0:
        raise AssertionError("register ran the mechanism or charged something before being called")
    previous = 0.0
    for i in range(steps):
        released = run(None, rng=None)
        if not isinstance(released, Release) or mechanism.calls != i + 1:
            raise AssertionError(f"run {i + 1} returned {released!r} after {mechanism.calls} mechanism calls")
        if not acc.spent()[0] > previous:
            raise AssertionError(f"run {i + 1} was not charged (spend {acc.spent()})")
        previous = acc.spent()[0]
    before = acc.spent()
    _refused(BudgetExhaustedError, lambda: run(None), "a run beyond the budget")
    if mechanism.calls != steps or acc.spent() != before:
        raise AssertionError("a run refused for budget still ran the mechanism or changed the spend")


def check_record_in_two_groups(factory: Callable, event, release: Callable = plain_release, *,
                               counts: tuple = (2, 5, 3), deltas: Iterable[float] = (1e-9, 1e-6, 1e-3)) -> None:
    """A record that can change two groups of a block (docs/privacy_unit.md): the groups of
    ``parallel_groups(len(counts), touches=2)`` record ``counts[g]`` releases of ``event`` each, interleaved;
    whichever two groups the record is in, its loss is those two groups' releases composed, so the spend must be
    at least what a fresh accountant reports for the two largest counts' releases recorded one after the other."""
    accountant = factory()
    groups = accountant.parallel_groups(len(counts), touches=2)
    left = list(counts)
    while any(left):
        for g, remaining in enumerate(left):
            if remaining:
                groups[g].record(release(event))
                left[g] -= 1
    largest = sorted(counts)[-2:]
    reference = factory()
    for _ in range(sum(largest)):
        reference.record(release(event))
    for delta in deltas:
        spent, alone = accountant.get_epsilon(delta), reference.get_epsilon(delta)
        assert spent >= alone * (1 - REL), (
            f"a record in two groups of {list(counts)} releases: spend epsilon {spent:.6g} at delta {delta:g} is less "
            f"than the two costliest groups composed, {alone:.6g}")


def check_accountant(case: AccountantCase, *, counts: Iterable[int] = (1, 3, 7)) -> None:
    """Every check above on one accountant: empty is zero; monotone over the supported events; count
    equivalence of each supported event at each of ``counts``; the unsupported event refused atomically;
    budget refusal atomic and ``register`` refusing before running (with the default event); a record in two
    groups charged for both."""
    check_empty_is_zero(case.factory)
    steps = [(case.supported[i % len(case.supported)], 1 + i % 3) for i in range(2 * len(case.supported) + 3)]
    check_monotone(case.factory, steps)
    for event in case.supported:
        for count in counts:
            check_count_equivalence(case.factory, event, count)
    check_unsupported_rejected_atomically(case.factory, case.event, case.unsupported, case.release)
    check_budget_refusal_atomic(case.factory, case.event, case.release, budget_delta=case.budget_delta)
    check_register_refuses_before_running(case.factory, case.event, case.release, budget_delta=case.budget_delta)
    check_record_in_two_groups(case.factory, case.event, case.release)
