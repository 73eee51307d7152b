"""The accountant contract shared by every accountant.

* ``compose(event, count=1)`` charges an event; ``record(release)`` charges a mechanism's release
  (its event, its outcome class, its charged teachers); ``register(mechanism)`` returns a callable that
  checks the budget, runs the mechanism and records the release.
* ``can_afford(event)``, ``get_epsilon(delta)``, ``spent() -> (epsilon, delta)``.
* **Check-then-commit.**  Every charge is first *prepared* (validated, its cost computed against the
  budget; nothing changes), then written to the ledger (if any) in one SQLite transaction, then
  *committed* to the in-memory state (which cannot fail).  A charge that raises leaves state and ledger
  as they were.  A budget given at construction is never exceeded: ``BudgetExhaustedError`` is raised
  before anything is charged, and ``register``'s callable raises it before the mechanism runs.

Subclasses implement ``_prepare(charge) -> plan`` (raise ``UnsupportedEventError`` for an event they
cannot account, ``BudgetExhaustedError`` when the plan would exceed the budget), ``_commit(plan)``,
``_epsilon(delta)`` and ``spent()``; they may override ``_worst_case(event)`` (the charge ``can_afford``
and ``register`` test before running).

* **Valid events only.**  Every ``Charge`` checks its event when it is built
  (:func:`~pate_accountant.accountants.event_checks.check_event`): a non-finite, zero or negative noise
  parameter, count or sampling rate anywhere inside the event is refused with a one-line ``ValueError`` /
  ``TypeError`` naming the parameter and the value, before any accountant sees it.
* **One relation.**  An accountant composes events stated under one neighbouring relation only.  The
  keyword ``neighboring_relation`` fixes it at construction; left ``None``, the first charged event that
  states a relation fixes it (a dp-accounting event, which states none, is read under ``"replace-one"``).
  ``self._relation_after(event)`` (in ``_prepare``) returns the relation the accountant holds after the
  charge, or raises ``UnsupportedEventError`` naming both relations; ``self._set_relation(relation)`` (in
  ``_commit``) records it.  Accountants that keep their own relation can call
  :func:`~pate_accountant.accountants.event_checks.relation_after` directly.
"""

from __future__ import annotations

import abc
import copy
import math

import attr
import dp_accounting

from pate_accountant.accountants.event_checks import check_event, check_relation, relation_after
from pate_accountant.errors import BudgetExhaustedError, UnsupportedEventError
from pate_accountant.release import OUTCOMES, Release
from pate_accountant.validation import check_int, check_real

__all__ = ["Accountant", "Charge", "relation_after"]



def _check_outcome(instance, attribute, value):
    if value is not None and value not in OUTCOMES:
        raise ValueError(f"{attribute.name} must be one of {OUTCOMES} or None, got {value!r}")


@attr.s(frozen=True, slots=True)
class Charge:
    """One accounting step, exactly what a ledger row stores: the event, how many times it ran, the
    outcome class (``None`` for a plain ``compose``) and the charged teachers.  No data, no tokens."""

    event: dp_accounting.DpEvent = attr.ib()
    count: int = attr.ib(default=1)
    outcome: str | None = attr.ib(default=None, validator=_check_outcome)
    charged_teachers: frozenset = attr.ib(default=frozenset(), converter=frozenset)

    @event.validator
    def _check_event(self, attribute, value):
        if not isinstance(value, dp_accounting.DpEvent):
            raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(value).__name__}")
        check_event(value)  # parameters valid all the way down (ValueError / TypeError naming them)

    @count.validator
    def _check_count(self, attribute, value):
        check_int("count", value, minimum=1)

    @property
    def target_hit(self) -> bool:
        return self.outcome == "target"


def _check_budget(budget):
    if budget is None:
        return None
    if not isinstance(budget, (tuple, list)) or len(budget) != 2:
        raise TypeError(f"budget must be an (epsilon, delta) pair, got {budget!r}")
    epsilon = check_real("budget epsilon", budget[0], minimum=0.0)
    delta = check_real("budget delta", budget[1], minimum=0.0, maximum=1.0, max_open=True)
    return (epsilon, delta)


class Accountant(abc.ABC):
    """Base class: budget, ledger, and the check-then-commit protocol."""

    #: Short name stored in a ledger's metadata (``pate-accountant audit`` rebuilds the accountant by it).
    kind: str = ""
    #: Whether the state depends on which teachers a release charged (``Release.charged_teachers``): then the
    #: ledger keeps those sets in its confidential file only (individual charging sets this).
    confidential_charges: bool = False

    def __init__(self, *, budget=None, ledger=None, neighboring_relation=None):
        self._budget = _check_budget(budget)
        # The relation given at construction (None: fixed by the first charge), and the one held now.
        self._configured_relation = check_relation("neighboring_relation", neighboring_relation)
        self._current_relation = self._configured_relation
        self._ledger = None
        if ledger is not None:
            ledger.attach(self)  # replays the rows already in the ledger, then keeps us in step
            self._ledger = ledger

    # -- configuration, for ledgers ---------------------------------------------------------------
    def config(self) -> dict:
        """Everything needed to rebuild an equivalent fresh accountant (JSON data)."""
        return {"kind": self.kind, "budget": list(self._budget) if self._budget else None, **self._config()}

    def _config(self) -> dict:
        return {}

    @property
    def budget(self):
        return self._budget

    @property
    def ledger(self):
        return self._ledger

    @property
    def neighboring_relation(self) -> str | None:
        """The relation everything charged is read under: the one given at construction, else the one the
        first charge fixed (``None`` while nothing has fixed it)."""
        return getattr(self, "_current_relation", None)

    def _relation_after(self, event) -> str | None:
        """The relation held after charging ``event`` (``UnsupportedEventError`` naming both relations if it
        would mix two); changes nothing."""
        return relation_after(self._current_relation, event)

    def _set_relation(self, relation: str | None) -> None:
        self._current_relation = relation

    # -- subclass hooks -----------------------------------------------------------------------------
    @abc.abstractmethod
    def _prepare(self, charge: Charge):
        """Validate ``charge`` and return a plan to commit; raise without changing anything."""

    @abc.abstractmethod
    def _commit(self, plan) -> None:
        """Apply a prepared plan to the in-memory state (must not fail)."""

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float:
        """Epsilon of everything charged so far, at total ``delta``."""

    @abc.abstractmethod
    def spent(self) -> tuple[float, float]:
        """``(epsilon, delta)`` spent so far."""

    def _worst_case(self, event, count: int = 1) -> Charge:
        """The charge a not-yet-run mechanism with ``event`` could cost (default: the event itself)."""
        return Charge(event, count)

    # -- the contract -----------------------------------------------------------------------------------
    def compose(self, event, count: int = 1) -> None:
        """Charge ``event`` ``count`` times."""
        self._charge(Charge(event, count))

    def record(self, release: Release) -> None:
        """Charge what a mechanism run released (its event, outcome class and charged teachers)."""
        if not isinstance(release, Release):
            raise TypeError(f"release must be a Release, got {type(release).__name__}")
        self._charge(Charge(release.event, 1, release.outcome, release.charged_teachers))

    def record_many(self, releases) -> None:
        """Charge several releases at once: all of them or none (one ledger transaction)."""
        charges = []
        for release in releases:
            if not isinstance(release, Release):
                raise TypeError(f"releases must hold Release objects, got {type(release).__name__}")
            charges.append(Charge(release.event, 1, release.outcome, release.charged_teachers))
        self._charge_many(charges)

    def can_afford(self, event, count: int = 1) -> bool:
        """Whether charging ``event`` (its worst case) ``count`` times now would stay within the budget."""
        if self._ledger is not None:
            self._ledger.sync(self)  # include what other processes sharing the ledger have spent
        try:
            self._prepare(self._worst_case(event, count))
        except BudgetExhaustedError:
            return False
        return True

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far, at total ``delta``."""
        delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
        return self._epsilon(delta)

    def register(self, mechanism):
        """Wrap ``mechanism`` so each call checks the budget first, runs it, then records the release."""
        event = getattr(mechanism, "event", None)
        if not isinstance(event, dp_accounting.DpEvent) or not callable(mechanism):
            raise TypeError(f"mechanism must be callable and announce a DpEvent as .event, got {type(mechanism).__name__}")
        self._prepare(self._worst_case(event))  # unsupported events are refused at registration

        def run(*args, **kwargs) -> Release:
            if self._ledger is not None:
                self._ledger.sync(self)
            self._prepare(self._worst_case(mechanism.event))  # BudgetExhaustedError before running
            release = mechanism(*args, **kwargs)
            self.record(release)
            return release

        run.mechanism = mechanism
        run.__name__ = f"accounted_{type(mechanism).__name__}"
        return run

    # -- machinery ----------------------------------------------------------------------------------------
    def _charge(self, charge: Charge) -> None:
        self._charge_many([charge])

    def _charge_many(self, charges) -> None:
        if self._ledger is None:
            plans = self._prepare_sequence(charges)
            for plan in plans:
                self._commit(plan)
            return
        with self._ledger.transaction(self) as transaction:  # syncs rows other writers added first
            plans = self._prepare_sequence(charges)
            transaction.append(charges, plans)  # the ledger reuses the plans for the stored totals
        for plan in plans:
            self._commit(plan)

    def _prepare_sequence(self, charges):
        """Prepare several charges as if committed one after another, without committing any."""
        if len(charges) == 1:
            return [self._prepare(charges[0])]
        snapshot = self._snapshot()
        plans = []
        try:
            for charge in charges:
                plan = self._prepare(charge)
                self._commit(plan)
                plans.append(plan)
        finally:
            self._restore(snapshot)
        return plans

    def _snapshot(self) -> dict:
        """A deep copy of the mutable state (used to prepare a batch of charges); subclasses with large
        state may override it with something cheaper."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k not in ("_ledger", "_budget")}

    def _restore(self, snapshot: dict) -> None:
        vars(self).update(snapshot)

    def _replay(self, charge: Charge) -> None:
        """Apply a charge read from the ledger: some writer already accepted it under the shared budget."""
        self._commit(self._prepare_unbudgeted(charge))

    def _prepare_unbudgeted(self, charge: Charge):
        budget, self._budget = self._budget, None
        try:
            return self._prepare(charge)
        finally:
            self._budget = budget

    def _within_budget(self, epsilon: float, delta: float) -> bool:
        if self._budget is None:
            return True
        # No tolerance: a charge whose bound exceeds the budget by any amount, float rounding included, is
        # refused (an absolute slack of 1e-12 would be 1% of a delta budget of 1e-10).
        return epsilon <= self._budget[0] and delta <= self._budget[1]

    def _refuse(self, what: str, epsilon: float, delta: float):
        raise BudgetExhaustedError(
            f"{what} would spend (epsilon={epsilon:.6g}, delta={delta:.3g}), beyond the budget "
            f"(epsilon={self._budget[0]:.6g}, delta={self._budget[1]:.3g})"
        )

    @staticmethod
    def _unsupported(event) -> UnsupportedEventError:
        return UnsupportedEventError(f"cannot account for event {event!r}")

    def __repr__(self):
        eps, delta = self.spent()
        budget = "" if self._budget is None else f", budget={self._budget}"
        return f"{type(self).__name__}(spent=({eps:.6g}, {delta:.3g}){budget})"


def _is_finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))
