"""The accountant contract shared by every accountant.

* ``compose(event, count=1)`` charges an event; ``record(release)`` charges a mechanism's release
  (its event, its outcome class, its charged teachers); ``register(mechanism)`` returns a callable that
  checks the budget, runs the mechanism and records the release.
* ``can_afford(event)``, ``get_epsilon(delta)``, ``spent() -> (epsilon, delta)``.
* **The accountant owns its state.**  ``state()`` returns an immutable :class:`AccountantState` (equal
  states compare equal), ``restore(state)`` puts one back (refused while a ledger is attached: the state
  then follows the ledger's rows), and ``replay(charges)`` applies charges a ledger already holds, all of
  them or none.  A ledger stores and verifies rows and calls only these public methods (and ``config()``,
  ``spent()``); it never reaches into an accountant.
* **Check-then-commit.**  Every charge goes through one hook, ``_maybe_compose(charge, do_compose)``, in
  the spirit of dp-accounting's ``PrivacyAccountant._maybe_compose``: it validates the charge and its cost
  against the budget, raising (``UnsupportedEventError``, ``BudgetExhaustedError``, ``ValueError``) before
  anything changes; only when ``do_compose`` is true and every check passed does it apply the charge.
  ``can_afford`` and ``register``'s pre-run check call it with ``do_compose=False``.  With a ledger, a charge
  runs inside the ledger's single write transaction: the ledger catches the accountant up on rows other
  writers appended (``replay``), the hook checks and applies the charge, the ledger appends the row with
  the new ``spent()`` and commits; if anything fails before the commit, the transaction rolls back and the
  accountant takes its state back.  So a charge that raises leaves state and ledger as they were, and a
  budget given at construction is never exceeded: ``BudgetExhaustedError`` is raised before anything is
  charged, and ``register``'s callable raises it before the mechanism runs.

Subclasses implement ``_maybe_compose(charge, do_compose, *, enforce_budget=True)`` (``enforce_budget=False``
is a replay: the charge was already accepted under the shared budget, so only its validity is checked),
``_epsilon(delta)`` and ``spent()``; they may override ``_worst_case(event)`` (the charge ``can_afford``
and ``register`` test before running), ``_config()``, and ``_get_state()`` / ``_set_state(data)`` (the
mutable state as plain data; the default deep-copies the instance's attributes).

* **Valid events only.**  Every ``Charge`` checks its event when it is built
  (:func:`~pate_accountant.accountants.event_checks.check_event`): a non-finite, zero or negative noise
  parameter, count or sampling rate anywhere inside the event is refused with a one-line ``ValueError`` /
  ``TypeError`` naming the parameter and the value, before any accountant sees it.
* **One relation.**  An accountant composes events stated under one neighbouring relation only.  The
  keyword ``neighboring_relation`` fixes it at construction; left ``None``, the first charged event that
  states a relation fixes it (a dp-accounting event, which states none, is read under ``"replace-one"``).
  ``self._relation_after(event)`` (in the check) returns the relation the accountant holds after the
  charge, or raises ``UnsupportedEventError`` naming both relations; ``self._set_relation(relation)`` (when
  composing) records it.  Accountants that keep their own relation can call
  :func:`~pate_accountant.accountants.event_checks.relation_after` directly.
"""

from __future__ import annotations

import abc
import copy
import math

import attr
import dp_accounting
import numpy as np

from pate_accountant.accountants.event_checks import check_event, check_relation, relation_after
from pate_accountant.errors import BudgetExhaustedError, UnsupportedEventError
from pate_accountant.release import FAIL, OUTCOMES, Release
from pate_accountant.validation import check_int, check_real

__all__ = ["Accountant", "AccountantState", "Charge", "Remaining", "relation_after"]


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
    #: ``(scope, index)`` for a charge of one of a run's disjoint groups of records (parallel composition,
    #: :mod:`pate_accountant.accountants.parallel`): ``scope`` names the block of groups (a ledger's run id; a
    #: negative number without a ledger), ``index`` the group; ``None`` for an ordinary charge.
    group: tuple | None = attr.ib(default=None)

    @event.validator
    def _check_event(self, attribute, value):
        if not isinstance(value, dp_accounting.DpEvent):
            raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(value).__name__}")
        check_event(value)  # parameters valid all the way down (ValueError / TypeError naming them)

    @count.validator
    def _check_count(self, attribute, value):
        check_int("count", value, minimum=1)

    @group.validator
    def _check_group(self, attribute, value):
        if value is None:
            return
        if not isinstance(value, tuple) or len(value) != 2:
            raise TypeError(f"group must be a (scope, index) pair of integers or None, got {value!r}")
        check_int("group scope", value[0])
        check_int("group index", value[1], minimum=0)
        if value[0] == 0:
            raise ValueError("group scope must be a non-zero integer (a run id, or negative without a ledger), got 0")

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


def _same(a, b) -> bool:
    """Equality of state data: containers element by element, numpy arrays by value, anything else by
    ``==`` (objects without an equality of their own, such as composed PLDs, by identity)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


@attr.s(frozen=True, slots=True, eq=False, repr=False)
class AccountantState:
    """An accountant's state at one moment: what :meth:`Accountant.state` returns and
    :meth:`Accountant.restore` takes back.

    Immutable: the accountant copies its mutable parts into it and out of it again, so one state can be
    restored any number of times and the accountant never changes it.  Two states of the same accountant
    class compare equal when their contents are equal (``acc.state() == before`` checks that a refused
    charge changed nothing).  ``kind`` is the accountant's kind; the contents are the class's own business.
    """

    owner: type = attr.ib()
    data: object = attr.ib()

    @property
    def kind(self) -> str:
        return self.owner.kind

    def __eq__(self, other):
        if not isinstance(other, AccountantState):
            return NotImplemented
        return self.owner is other.owner and _same(self.data, other.data)

    def __hash__(self):
        return hash(self.owner)

    def __repr__(self):
        return f"AccountantState(kind={self.kind!r})"


#: The most groups one block of parallel groups may have (a run's teachers are at most 10^6).
MAX_GROUPS = 10 ** 6

#: What counts as nothing left of a budget: at most this fraction of it (float dust after a subtraction).
_DUST = 1e-12


def _pair(name: str, value) -> tuple[float, float]:
    """An ``(epsilon, delta)`` pair of non-negative reals, or a ``ValueError``/``TypeError`` naming ``name``."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be an (epsilon, delta) pair, got {value!r}")
    return (check_real(f"{name} epsilon", value[0], minimum=0.0), check_real(f"{name} delta", value[1], minimum=0.0))


@attr.s(frozen=True, auto_attribs=True)
class Remaining:
    """What is left of a budget, told one way by ``generate``, ``audit``, ``ledger list`` and the Python API
    (:meth:`Accountant.remaining_budget`, :meth:`Remaining.of`).

    Two kinds of accountant spend a budget differently:

    * ``delta_adds_up`` (basic composition): every step spends its own ``(epsilon, delta)``, and the totals add
      up, so both ``epsilon`` and ``delta`` are left;
    * the others (PLD, RDP, advanced composition, target and individual charging) state their whole spend as one
      epsilon **at a fixed delta** (the budget's, or target charging's own split of it): delta is not used up
      run by run, so only ``epsilon`` is left, read at ``at_delta``, and ``delta`` is ``None``.

    ``spent``: nothing is left (epsilon, or under basic composition delta, down to float dust)."""

    epsilon: float
    delta: float | None
    at_delta: float | None
    budget: tuple
    spent: bool

    @classmethod
    def of(cls, spent, budget, *, delta_adds_up: bool) -> Remaining:
        """What ``budget`` has left after ``spent`` (both ``(epsilon, delta)``) for an accountant whose deltas
        add up (``delta_adds_up``) or not."""
        budget, spent = _pair("budget", budget), _pair("spent", spent)
        epsilon = max(0.0, budget[0] - spent[0])
        if delta_adds_up:
            delta = max(0.0, budget[1] - spent[1])
            out = epsilon <= _DUST * budget[0] or delta <= _DUST * budget[1]
            return cls(epsilon, delta, None, budget, out)
        at_delta = spent[1] or budget[1]
        return cls(epsilon, None, at_delta, budget, epsilon <= _DUST * budget[0])

    def words(self) -> str:
        """One line for a person: ``epsilon 60, delta 5.5e-05 of the budget (epsilon 150, delta 0.0001)``, or
        ``epsilon 3.05 of 10, at delta 1e-06 (...)``, or ``none: the budget ... is spent``."""
        budget = f"(epsilon {self.budget[0]:g}, delta {self.budget[1]:g})"
        if self.spent:
            return f"none: the budget {budget} is spent"
        if self.delta is not None:
            return f"epsilon {self.epsilon:.6g}, delta {self.delta:.3g} of the budget {budget}"
        return (f"epsilon {self.epsilon:.6g} of {self.budget[0]:g}, at delta {self.at_delta:.3g} (this accountant "
                "states its whole spend at a fixed delta, so delta is not used up run by run)")

    def as_dict(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta, "at_delta": self.at_delta,
                "budget": {"epsilon": self.budget[0], "delta": self.budget[1]}, "spent": self.spent,
                "text": self.words()}


class Accountant(abc.ABC):
    """Base class: budget, ledger, state, and the check-then-commit protocol."""

    #: Short name stored in a ledger's metadata (``pate-accountant audit`` rebuilds the accountant by it).
    kind: str = ""
    #: Whether the state depends on which teachers a release charged (``Release.charged_teachers``): then the
    #: ledger keeps those sets in its confidential file only (individual charging sets this).
    confidential_charges: bool = False

    #: How charges of disjoint groups of records combine (:mod:`pate_accountant.accountants.parallel`):
    #: ``"event"``: the state is a multiset of events whose bound grows with it, whatever the order and the
    #: outcomes, so a run's groups together are charged, event by event, the largest count any one group was
    #: charged; ``"hits"`` (target charging): the same for target hits, while every other query is charged as
    #: it comes; ``None``: every grouped charge is charged as it comes (no saving, always sound).
    parallel_composition: str | None = None

    #: Whether every charge spends its own delta and the deltas add up (basic composition), rather than the whole
    #: spend being stated at a fixed delta (:class:`Remaining`).
    delta_adds_up: bool = False

    #: The block of group views :meth:`parallel_groups` hands out
    #: (:class:`~pate_accountant.accountants.parallel.ParallelGroups`).  Its views subclass this class, so this
    #: module does not import it: the parallel module sets it here when it is imported, which the package's
    #: ``__init__`` always does.
    _group_block = None

    #: Attributes that are configuration or machinery, not state (left out of the default ``_get_state``).
    _NOT_STATE = frozenset({"_ledger", "_budget", "_configured_relation", "_afforded", "_parallel", "_scopes_given"})

    def __init__(self, *, budget=None, ledger=None, neighboring_relation=None):
        self._budget = _check_budget(budget)
        # The relation given at construction (None: fixed by the first charge), and the one held now.
        self._configured_relation = check_relation("neighboring_relation", neighboring_relation)
        self._current_relation = self._configured_relation
        self._ledger = None
        self._afforded = None  # (event, count, group) that can_afford accepted, while nothing has changed since
        self._parallel = ParallelCounts()  # what each group of each block of groups was charged (state)
        self._scopes_given = set()  # blocks of groups handed out by this object (machinery)
        if ledger is not None:
            ledger.attach(self)  # replays the rows already in the ledger (through replay), then keeps us in step
            self._ledger = ledger

    @classmethod
    def for_run(cls, *, budget, ledger=None, mechanism=None, num_teachers=None) -> Accountant:
        """The accountant a private run (``generate``/``demo``) uses for ``budget``: the plain constructor,
        unless the accountant needs more of the run (its ``mechanism``, its configured ``num_teachers``), as
        individual charging does."""
        return cls(budget=budget, ledger=ledger)

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

    # -- the hook subclasses implement ----------------------------------------------------------------
    @abc.abstractmethod
    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        """Check ``charge``; when ``do_compose``, apply it.

        Every check comes first and raises without changing anything: ``UnsupportedEventError`` for an
        event the accountant cannot account for (or one stated under another relation),
        ``BudgetExhaustedError`` when the charge would take the accountant beyond its budget (only when
        ``enforce_budget``; a replayed ledger row was already accepted under the shared budget).  Applying
        the charge, once every check passed, must not fail."""

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float:
        """Epsilon of everything charged so far, at total ``delta``."""

    @abc.abstractmethod
    def spent(self) -> tuple[float, float]:
        """``(epsilon, delta)`` spent so far."""

    def _worst_case(self, event, count: int = 1) -> Charge:
        """The charge a not-yet-run mechanism with ``event`` could cost (default: the event itself)."""
        return Charge(event, count)

    def _get_state(self):
        """The mutable state as data that later changes of the accountant cannot touch (default: a deep copy
        of the instance's attributes, configuration and ledger left out).  Override with something cheaper."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k not in self._NOT_STATE}

    def _set_state(self, data) -> None:
        """Put back what :meth:`_get_state` returned (copying its mutable parts: ``data`` stays unchanged)."""
        vars(self).update(copy.deepcopy(data))

    # -- state, public ----------------------------------------------------------------------------------
    def state(self) -> AccountantState:
        """The accountant's state now, as an immutable :class:`AccountantState` (everything it has charged;
        not its configuration, budget or ledger)."""
        return AccountantState(type(self), self._full_state())

    def restore(self, state: AccountantState) -> None:
        """Put back a state taken by :meth:`state` (of this accountant, or one of the same class and config).

        Refused (``RuntimeError``) while a ledger is attached: the state of such an accountant is the
        replay of the ledger's rows, and going back would let it spend again what the ledger holds."""
        if not isinstance(state, AccountantState):
            raise TypeError(f"state must be an AccountantState, got {type(state).__name__}")
        if state.owner is not type(self):
            raise ValueError(f"a state of {state.owner.__name__} cannot be restored into {type(self).__name__}")
        if self._ledger is not None:
            raise RuntimeError(
                "an accountant attached to a ledger cannot be restored: its state is the replay of the ledger's "
                "rows (attach a fresh accountant to the ledger instead)")
        self._afforded = None
        self._set_full_state(state.data)

    def replay(self, charges, *, enforce_budget: bool = False) -> None:
        """Apply ``charges`` (``Charge`` objects, in order) read from a ledger: all of them or none.

        By default without the budget check (some writer already accepted them under the shared budget);
        events that the accountant cannot account for are still refused.  ``enforce_budget=True`` checks
        each charge against the budget as a live charge would (what an auditor's replay does), raising
        ``BudgetExhaustedError`` at the first one beyond it."""
        charges = list(charges)
        for charge in charges:
            if not isinstance(charge, Charge):
                raise TypeError(f"charges must be Charge objects, got {type(charge).__name__}")
        self._afforded = None
        self._compose_all(charges, enforce_budget=enforce_budget)

    # -- the contract -----------------------------------------------------------------------------------
    def compose(self, event, count: int = 1) -> None:
        """Charge ``event`` ``count`` times."""
        self._charge(Charge(event, count))

    def record(self, release: Release) -> None:
        """Charge what a mechanism run released (its event, outcome class and charged teachers)."""
        self._charge(_release_charge(release))

    def record_many(self, releases) -> None:
        """Charge several releases at once: all of them or none (one ledger transaction)."""
        self._charge_many([_release_charge(release, "releases") for release in releases])

    def can_afford(self, event, count: int = 1) -> bool:
        """Whether charging ``event`` (its worst case) ``count`` times now would stay within the budget.

        With a ledger it first catches up on what other writers sharing the ledger have spent (one read
        transaction)."""
        return self._can_afford(event, count, None)

    def remaining_budget(self) -> Remaining | None:
        """What is left of the budget (:class:`Remaining`; ``None`` without a budget).  With a ledger it reflects
        what this accountant has caught up on (``can_afford`` catches up first)."""
        if self._budget is None:
            return None
        return Remaining.of(self.spent(), self._budget, delta_adds_up=self.delta_adds_up)

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far, at total ``delta``."""
        delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
        return self._epsilon(delta)

    def register(self, mechanism):
        """Wrap ``mechanism`` so each call checks the budget first, runs it, then records the release.

        The pre-run check catches up on the ledger (if any) and checks the mechanism's worst case; right
        after ``can_afford(mechanism.event)`` accepted it, with nothing charged since, it is not repeated."""
        return self._register(mechanism, None)

    def parallel_groups(self, num_groups: int, *, touches: int = 1):
        """``num_groups`` accountants, one for each of a run's disjoint groups of records, that charge this one
        (:class:`~pate_accountant.accountants.parallel.ParallelGroups`): parallel composition, docs/groups.md.

        ``touches``: how many groups one record can change (1: the groups are disjoint in the records; 2: a
        replaced record may leave one group and join another, as a private label does, docs/privacy_unit.md).
        Each of a group's charges that the envelope shares is then counted ``touches`` times, so the envelope
        covers the sum of any ``touches`` groups' charges.

        With a ledger the block of groups is the ledger's current run (:meth:`Ledger.begin_run` first), and a
        run has at most one block."""
        num_groups = check_int("num_groups", num_groups, minimum=1, maximum=MAX_GROUPS)
        touches = check_int("touches", touches, minimum=1, maximum=num_groups)
        if self._ledger is not None:
            scope = self._ledger.current_run
            if scope is None:
                raise ValueError("parallel groups on a ledger need a run: call ledger.begin_run(metadata) first")
        else:
            used = self._scopes_given | self._parallel.scopes()
            scope = min([0, *used]) - 1
        if scope in self._scopes_given or scope in self._parallel.scopes():
            raise ValueError(f"run {scope} already has its groups: a run splits its records once (begin a new run)")
        self._scopes_given.add(scope)
        return Accountant._group_block(self, scope, num_groups, touches)

    # -- machinery ----------------------------------------------------------------------------------------
    def _can_afford(self, event, count: int, group, touches: int = 1) -> bool:
        if self._ledger is not None:
            self._ledger.sync(self)
        try:
            self._check_worst(event, count, group, touches)
        except BudgetExhaustedError:
            return False
        self._afforded = (event, count, group)  # register's pre-run check of this event needs no second look
        return True

    def _register(self, mechanism, group, touches: int = 1):
        event = getattr(mechanism, "event", None)
        if not isinstance(event, dp_accounting.DpEvent) or not callable(mechanism):
            raise TypeError(f"mechanism must be callable and announce a DpEvent as .event, got {type(mechanism).__name__}")
        # unsupported events are refused at registration, and a budget that cannot pay for one run
        self._maybe_compose(self._worst_case(event), False, enforce_budget=False)
        self._check_worst(event, 1, group, touches)

        def run(*args, **kwargs) -> Release:
            self._check_before_run(mechanism.event, group, touches)  # BudgetExhaustedError before running
            release = mechanism(*args, **kwargs)
            self._charge(self._scaled(_release_charge(release, group=group), touches))
            return release

        run.mechanism = mechanism
        run.__name__ = f"accounted_{type(mechanism).__name__}"
        return run

    def _check_before_run(self, event, group=None, touches: int = 1) -> None:
        afforded = self._afforded
        if (afforded is not None and afforded[1] == 1 and afforded[2] == group
                and (afforded[0] is event or afforded[0] == event)):
            return  # can_afford(event) accepted it and nothing changed since
        if self._ledger is not None:
            self._ledger.sync(self)
        self._check_worst(event, 1, group, touches)

    def _check_worst(self, event, count: int, group, touches: int = 1) -> None:
        """Check, changing nothing, the costliest charge a not-yet-run mechanism with ``event`` could make.  For
        an ordinary charge that is :meth:`_worst_case`.  For a group's charge, a worst case that the envelope
        makes free may be cheaper than an outcome charged as it comes (under target charging a miss is charged
        as it comes, a hit only past the envelope): every outcome class the accountant tells apart is checked,
        so no outcome can be refused after the mechanism ran.  ``touches``: :meth:`_scaled`."""
        worst = self._worst_case(event, count)
        self._step(self._scaled(_with_group(worst, group), touches), False)
        if group is not None and self.parallel_composition == "hits":
            self._step(Charge(worst.event, worst.count, FAIL, worst.charged_teachers, group), False)

    def _scaled(self, charge: Charge, touches: int) -> Charge:
        """A group's ``charge`` as a block whose records can each change ``touches`` groups pays it: a charge the
        envelope shares (:meth:`_parallel_key`) counts ``touches`` times, so that the envelope (the largest count
        of any group) is at least the sum of any ``touches`` groups' counts; a charge paid as it comes is summed
        over every group already.  The scaled count is what the ledger stores, so a replay needs nothing more."""
        if touches == 1 or charge.group is None or self._parallel_key(charge) is None:
            return charge
        return attr.evolve(charge, count=charge.count * touches)

    def _parallel_key(self, charge: Charge):
        """The key under which a grouped charge is paid once per block (the largest count any group reached),
        or ``None``: charged as it comes (see :attr:`parallel_composition`)."""
        mode = self.parallel_composition
        if mode == "hits" and not (charge.outcome is None or charge.target_hit):
            return None
        if mode not in ("event", "hits"):
            return None
        try:
            hash(charge.event)
        except TypeError:  # an event holding a list (a ComposedDpEvent): charged as it comes
            return None
        return charge.event

    def _step(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        """``_maybe_compose`` for any charge: an ordinary one goes straight to the hook; a grouped one is
        charged for what it adds to its block's envelope (:mod:`pate_accountant.accountants.parallel`)."""
        if charge.group is None:
            self._maybe_compose(charge, do_compose, enforce_budget=enforce_budget)
            return
        key = self._parallel_key(charge)
        extra = charge.count if key is None else self._parallel.extra(charge.group, key, charge.count)
        if extra:
            self._maybe_compose(attr.evolve(charge, count=extra, group=None), do_compose,
                                enforce_budget=enforce_budget)
        if do_compose and key is not None:
            self._parallel.add(charge.group, key, charge.count)

    def _full_state(self):
        return self._get_state(), self._parallel.copy()

    def _set_full_state(self, data) -> None:
        state, parallel = data
        self._set_state(state)
        self._parallel = parallel.copy()

    def _charge(self, charge: Charge) -> None:
        self._charge_many([charge])

    def _compose_all(self, charges, *, enforce_budget: bool = True) -> None:
        """Check and apply ``charges`` in order, all or none (in memory)."""
        if len(charges) == 1 and charges[0].group is None:  # the hook leaves everything unchanged when it raises
            self._maybe_compose(charges[0], True, enforce_budget=enforce_budget)
            return
        before = self._full_state()
        try:
            for charge in charges:
                self._step(charge, True, enforce_budget=enforce_budget)
        except BaseException:
            self._set_full_state(before)
            raise

    def _charge_many(self, charges) -> None:
        self._afforded = None
        if self._ledger is None:
            self._compose_all(charges)
            return
        before = transaction = None
        try:
            # One write transaction: the ledger takes the write lock and replays rows other writers appended
            # (through replay), then each charge is checked and applied and its row appended; the ledger
            # stores spent() with the rows and commits when the block ends.
            with self._ledger.transaction(self) as transaction:
                before = self._full_state()
                for charge in charges:
                    self._step(charge, True)
                    transaction.append(charge)
        except BaseException:
            # Not committed (refused, failed, or interrupted before the ledger moved our position past the
            # rows): take the charges back.  Rows replayed from other writers stay: they were committed.
            if before is not None and not getattr(transaction, "committed", False):
                self._set_full_state(before)
            raise

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


class ReportsAtOneDelta:
    """``spent()`` of an accountant that composes everything into one bound and states it at one delta,
    :attr:`report_delta` (advanced, PLD and RDP composition): a mixin before :class:`Accountant`, for a class that
    keeps its ``target_delta`` in ``_target_delta`` and implements ``_epsilon(delta)``."""

    @property
    def report_delta(self) -> float:
        """The total delta ``spent()`` reports at: the budget's delta, else ``target_delta``."""
        return self._budget[1] if self._budget is not None else self._target_delta

    def spent(self) -> tuple[float, float]:
        delta = self.report_delta
        return self._epsilon(delta), delta


def _release_charge(release, what: str = "release", group=None) -> Charge:
    """The charge of one mechanism release (``what`` names the argument in the ``TypeError``)."""
    if not isinstance(release, Release):
        wanted = "a Release" if what == "release" else "Release objects"
        raise TypeError(f"{what} must {'be' if what == 'release' else 'hold'} {wanted}, got {type(release).__name__}")
    return Charge(release.event, 1, release.outcome, release.charged_teachers, group)


def _with_group(charge: Charge, group) -> Charge:
    return charge if group is None else attr.evolve(charge, group=group)


class ParallelCounts:
    """What each group of each block of disjoint groups was charged, by parallel key, and what the block has
    paid for each key: the largest count of any of its groups (the envelope)."""

    __slots__ = ("_groups", "_paid")

    def __init__(self, groups=None, paid=None):
        self._groups = dict(groups or {})  # (scope, index, key) -> count
        self._paid = dict(paid or {})  # (scope, key) -> count

    def extra(self, group, key, count: int) -> int:
        """How many more times the block must pay for ``key`` if ``group`` is charged it ``count`` times."""
        scope, index = group
        have = self._groups.get((scope, index, key), 0) + count
        return max(0, have - self._paid.get((scope, key), 0))

    def add(self, group, key, count: int) -> None:
        scope, index = group
        have = self._groups.get((scope, index, key), 0) + count
        self._groups[(scope, index, key)] = have
        if have > self._paid.get((scope, key), 0):
            self._paid[(scope, key)] = have

    def scopes(self) -> set:
        return {scope for scope, _ in self._paid}

    def copy(self) -> ParallelCounts:
        return ParallelCounts(self._groups, self._paid)

    def __eq__(self, other):
        if not isinstance(other, ParallelCounts):
            return NotImplemented
        return self._groups == other._groups and self._paid == other._paid

    __hash__ = None


def _is_finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))
