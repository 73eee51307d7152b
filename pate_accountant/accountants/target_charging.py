"""The Target-Charging Technique accountant (spec 4; paper, "Privacy analysis considerations").

``TargetChargingAccountant`` charges only the *target hits* of q-target queries: the ``target`` outcome of
a boundary-wrapped query (spec 4.3, ``BoundaryWrapperEvent``) and the ``between`` outcome of a
BetweenThresholds query (spec 3.2, ``BetweenThresholdsEvent``).  The number of hits is turned into
``(epsilon, delta)`` by the spec 4.2 bound (:func:`pate_accountant.tct.tct_epsilon`: negative-binomial
tail plus optimal composition of the private draws).  **[RECON]**: the bound is the spec's reconstruction
of the TCT theorem, not the TCT paper's statement; ``docs/tct_and_individual.md`` gives the argument.

What is charged (spec 4.2):

* a release whose outcome is ``"target"`` is one hit;
* any other outcome (a token, ``fail``, BetweenThresholds' ``below``/``above``) is not a hit.  It is *not*
  free in an absolute sense: a query answered after the last hit is a private draw of an interaction that
  has not yet reached its next hit, so the epsilon reported is that of ``tau = hits + 1`` hits as soon as a
  query ran after the last hit (and of ``tau = hits`` when the last query was a hit).  This costs at most one
  hit, whatever the number of non-target queries: that is the point of the technique;
* ``compose(event, count)`` (no release, so no outcome) is charged as ``count`` hits, the worst case;
* the per-query delta ``delta0`` of an approximate-DP inner mechanism (boundary wrapper around
  ``DPArgMax``) enters the bound as ``k * delta0`` for ``k`` private draws (inside ``tct_epsilon``).

Several classes of queries.  A query class is ``(eps0, q, delta0, relation)`` with ``eps0 = event.epsilon``
(the level of the target), ``q = event.q`` and ``delta0`` the inner event's total delta (``0`` for
BetweenThresholds).  A ``q``-target at level ``eps0`` is also a ``q'``-target at level ``eps0'`` for every
``q' <= q`` and ``eps0' >= eps0`` (the same decomposition works: ``eps0``-indistinguishable parts are
``eps0'``-indistinguishable, and ``min_b B_b(T) >= q >= q'``), and an ``(eps0, delta0)`` pair of parts is also
``(eps0, delta0')`` for ``delta0' >= delta0``.  So every query of the sequence is a ``q_min``-target at level
``eps0_max`` with ``delta0_max`` (over every class that was queried, hit or not: a non-hit query's private
draw is a step of the composition too), and the homogeneous bound applied to the *total* number of hits is
a valid upper bound.  Queries stated under different neighbouring relations are not mixed (the guarantee is
stated under one relation): the second relation is refused with ``UnsupportedEventError``.

Budget (DESIGN.md contract).  With ``budget=(epsilon, delta)`` the accountant precomputes, once per class
combination, ``max_hits = tct_max_hits(q_min, eps0_max, epsilon, delta, delta0=delta0_max)``.  Any query
(hit or not) may run only while ``hits < max_hits``: then the interaction halts at the ``max_hits``-th hit at
the latest, exactly the setting of the spec 4.2 theorem, and whatever the next query does, the reported
``tau`` is at most ``max_hits``.  ``can_afford(event)`` and ``register`` test one more hit (``_worst_case``),
so the mechanism never runs once one more hit could exceed the budget.  The check is one integer
comparison; the in-memory ``record`` has a fast path (about 10^6 releases per second) and
:meth:`TargetChargingAccountant.record_outcomes` / :meth:`~TargetChargingAccountant.record_batch` charge
whole vectors of outcomes at once.
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import dp_accounting
import numpy as np

from pate_accountant.accountants.base import Accountant, Charge, _check_budget
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    WeightedSamplingEvent,
)
from pate_accountant.release import FAIL, TARGET, TOKEN, Release
from pate_accountant.tct import COMPOSITIONS, tct_epsilon, tct_max_hits
from pate_accountant.validation import check_real

__all__ = ["TargetChargingAccountant", "TargetClass", "combine_classes", "target_class"]

#: The "no limit" value of the hit limit when no budget is given (keeps the check one comparison).
NO_LIMIT = sys.maxsize


class TargetClass(NamedTuple):
    """The parameters of a q-target query that the TCT bound needs (module docstring)."""

    epsilon0: float
    q: float
    delta0: float
    relation: str | None


def target_class(event) -> TargetClass:
    """The :class:`TargetClass` of a ``BoundaryWrapperEvent`` or ``BetweenThresholdsEvent``.

    Raises ``UnsupportedEventError`` naming the event for anything else (an event without a q-target), and
    for a boundary wrapper whose inner event has no (epsilon, delta) form.
    """
    if isinstance(event, BetweenThresholdsEvent):
        return TargetClass(event.epsilon, event.q, 0.0, event.relation)
    if isinstance(event, BoundaryWrapperEvent):
        try:
            terms = epsilon_delta_terms(event.inner)
        except UnsupportedEventError as err:
            raise UnsupportedEventError(f"cannot account for event {event!r}: its inner event: {err}") from err
        delta0 = min(1.0, sum(d * m for _, d, m in terms))
        return TargetClass(event.epsilon, event.q, delta0, getattr(event.inner, "relation", None))
    if isinstance(event, dp_accounting.DpEvent):
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: the target-charging accountant charges only q-target "
            f"queries (BoundaryWrapperEvent, BetweenThresholdsEvent)"
        )
    raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")


def combine_classes(first, second) -> tuple[float, float, float]:
    """The conservative common class ``(max eps0, min q, max delta0)`` of two classes (either may be a
    :class:`TargetClass` or an ``(eps0, q, delta0)`` triple; ``None`` is the empty combination)."""
    if first is None:
        return (second[0], second[1], second[2])
    if second is None:
        return (first[0], first[1], first[2])
    return (max(first[0], second[0]), min(first[1], second[1]), max(first[2], second[2]))


#: Inner event types whose (epsilon, delta) form is their own two fields (``translate.epsilon_delta_terms``).
_PLAIN_INNER = (EpsilonDeltaEvent, NoisyArgMaxEvent, WeightedSamplingEvent)


def _same_plain_inner(a, b) -> bool:
    """Whether two inner events give the same target class: equal (epsilon, delta) type, delta, relation."""
    if a is b:
        return True
    return type(a) is type(b) and type(a) in _PLAIN_INNER and a.delta == b.delta and a.relation == b.relation


class EventMemo:
    """Memoises a pure function of an event, keyed by value (mechanisms build a fresh but equal event for
    every release, so identity would not help).  A ``BetweenThresholdsEvent`` is keyed by the tuple of its
    fields (hashing an attrs event runs Python code; a tuple of floats does not), a ``BoundaryWrapperEvent``
    around a plain (epsilon, delta) inner event by its level, ``q`` and the inner type, delta and relation
    (all that its class depends on), anything else by the event itself.  The table is bounded and cleared
    when full.  Exceptions of ``compute`` propagate and are not memoised; an unhashable event (one holding a
    list) is computed every time."""

    __slots__ = ("_table", "_compute", "_size")

    def __init__(self, compute, size: int = 4096):
        self._table: dict = {}
        self._compute = compute
        self._size = size

    def __call__(self, event):
        kind = type(event)
        if kind is BetweenThresholdsEvent:
            key = (0, event.epsilon, event.q, event.relation)
        elif kind is BoundaryWrapperEvent and type(event.inner) in _PLAIN_INNER:
            inner = event.inner  # its class needs only its delta and relation (epsilon_delta_terms)
            key = (1, event.epsilon, event.q, type(inner), inner.delta, inner.relation)
        else:
            key = event
        try:
            value = self._table.get(key)
        except TypeError:  # unhashable
            return self._compute(event)
        if value is None:
            value = self._compute(event)
            if len(self._table) >= self._size:
                self._table.clear()
            self._table[key] = value
        return value


def _check_composition(composition) -> str:
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    return composition


def _check_target_delta(target_delta) -> float:
    return check_real("target_delta", target_delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


class TargetChargingAccountant(Accountant):
    """The Target-Charging Technique (spec 4.2, [RECON]): only target hits of q-target queries are charged.

    ``TargetChargingAccountant(*, budget=None, ledger=None, target_delta=1e-6, composition="optimal")``.

    * Supported events: ``BoundaryWrapperEvent`` (spec 4.3) and ``BetweenThresholdsEvent`` (spec 3.2);
      anything else raises ``UnsupportedEventError``.
    * ``record(release)``: a release with ``target_hit`` is one hit, any other outcome is a query without a
      hit; ``compose(event, count)`` is ``count`` hits (no outcome is known: the worst case).
    * ``spent()``: ``(tct_epsilon(tau, q, eps0, delta, delta0), delta)`` for the conservative class of
      everything queried (module docstring), ``delta`` the budget's delta (or ``target_delta`` without a
      budget), ``tau = hits`` (``+ 1`` if queries ran after the last hit); ``(0, 0)`` before any query.
    * ``budget=(epsilon, delta)`` (``delta > 0``): a query runs only while ``hits < max_hits``.
    * ``composition``: the composition bound inside the TCT bound, ``"optimal"`` (spec 6.3) or ``"drv"``.

    Reporting: :attr:`hits`, :attr:`queries`, :attr:`max_hits` (``None`` without a budget or before the
    first query), :meth:`classes`, :meth:`max_hits_for`.
    """

    kind = "target-charging"

    def __init__(self, *, budget=None, ledger=None, target_delta=1e-6, composition="optimal"):
        self._target_delta = _check_target_delta(target_delta)
        self._composition = _check_composition(composition)
        budget = _check_budget(budget)
        if budget is not None and budget[1] == 0.0:
            raise ValueError(
                "a target-charging budget needs delta > 0: the TCT bound is an (epsilon, delta) guarantee "
                f"(got {budget})"
            )
        # Pure memo tables (functions of their keys, never rolled back).
        self._class_ids: dict = {}
        self._class_list: list = []
        self._class_of = EventMemo(self._register_class)
        self._limits: dict = {}
        self._last_event, self._last_cid = None, None  # one-entry identity cache in front of _class_of
        # Mutable accounting state (see _snapshot).
        self._hits = 0
        self._queries = 0
        self._pending = False  # queries ran after the last hit
        self._slots: dict = {}  # class id -> [queries, hits]
        self._combo = None  # (eps0, q, delta0) of everything queried
        self._limit = NO_LIMIT
        self._relation = None
        super().__init__(budget=budget, ledger=ledger)

    # -- configuration ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        return {"target_delta": self._target_delta, "composition": self._composition}

    # -- class bookkeeping ------------------------------------------------------------------------------
    def _register_class(self, event) -> int:
        cls = target_class(event)  # raises UnsupportedEventError
        cid = self._class_ids.get(cls)
        if cid is None:
            cid = self._class_ids[cls] = len(self._class_list)
            self._class_list.append(cls)
        return cid

    def _limit_for(self, combo) -> int:
        """``max_hits`` for the budget and a class combination (memoised; ``NO_LIMIT`` without a budget)."""
        if self._budget is None or combo is None:
            return NO_LIMIT
        key = (combo, self._budget)
        limit = self._limits.get(key)
        if limit is None:
            epsilon, delta = self._budget
            eps0, q, delta0 = combo
            limit = tct_max_hits(q, eps0, epsilon, delta, delta0=delta0, composition=self._composition)
            self._limits[key] = limit
        return limit

    # -- reporting ---------------------------------------------------------------------------------------
    @property
    def hits(self) -> int:
        """Target hits charged so far (``compose`` counts as hits)."""
        return self._hits

    @property
    def queries(self) -> int:
        """Queries charged so far, hits included."""
        return self._queries

    @property
    def max_hits(self) -> int | None:
        """The largest number of hits the budget allows for the classes queried so far (``None`` without a
        budget, or before the first query: it depends on the queries' class; see :meth:`max_hits_for`)."""
        if self._budget is None or self._combo is None:
            return None
        return self._limit

    def max_hits_for(self, event) -> int | None:
        """The hit limit once ``event``'s class joins those already queried (``None`` without a budget)."""
        if self._budget is None:
            return None
        cls = self._class_list[self._class_of(event)]
        return self._limit_for(combine_classes(self._combo, cls))

    @property
    def composition(self) -> str:
        return self._composition

    @property
    def target_delta(self) -> float:
        """The delta ``spent()`` reports at: the budget's delta, or ``target_delta`` without a budget."""
        return self._budget[1] if self._budget is not None else self._target_delta

    @property
    def charged_tau(self) -> int:
        """The ``tau`` the bound is evaluated at: ``hits``, plus one if queries ran after the last hit."""
        return self._hits + (1 if self._pending else 0)

    def classes(self) -> list[dict]:
        """One entry per query class charged: its parameters, queries and hits."""
        out = []
        for cid, (queries, hits) in sorted(self._slots.items()):
            cls = self._class_list[cid]
            out.append({**cls._asdict(), "queries": queries, "hits": hits})
        return out

    @property
    def combined_class(self) -> tuple[float, float, float] | None:
        """``(eps0_max, q_min, delta0_max)`` over the classes queried (``None`` before any query)."""
        return self._combo

    # -- the accountant hooks ----------------------------------------------------------------------------
    def _worst_case(self, event, count: int = 1) -> Charge:
        """A not-yet-run query can hit its target: ``count`` hits."""
        return Charge(event, count, TARGET)

    def _prepare(self, charge: Charge):
        cid = self._class_of(charge.event)
        cls = self._class_list[cid]
        relation = self._relation
        if cls.relation is not None:
            if relation is not None and cls.relation != relation:
                raise UnsupportedEventError(
                    f"cannot account for event {charge.event!r}: it is stated under the {cls.relation!r} relation, "
                    f"but this accountant already charged {relation!r} queries (one guarantee, one relation)"
                )
            relation = cls.relation
        hit = charge.outcome is None or charge.outcome == TARGET
        count = charge.count
        need = self._hits + count if hit else self._hits + 1  # the tau reported after this charge
        if cid in self._slots:
            combo, limit = self._combo, self._limit
        else:
            combo = combine_classes(self._combo, cls)
            limit = self._limit_for(combo)
        if self._budget is not None and need > limit:
            eps0, q, delta0 = combo
            delta = self._budget[1]
            eps = tct_epsilon(need, q, eps0, delta, delta0=delta0, composition=self._composition)
            what = f"{count} target hit(s)" if hit else "a query after the last hit"
            self._refuse(
                f"charging {what} of {charge.event!r} (hits so far {self._hits}, at most {limit} allowed)", eps, delta
            )
        return (cid, count, hit, combo, relation)

    def _commit(self, plan) -> None:
        cid, count, hit, combo, relation = plan
        slot = self._slots.get(cid)
        if slot is None:
            slot = self._slots[cid] = [0, 0]
            self._combo = combo
            self._limit = self._limit_for(combo)
        slot[0] += count
        self._queries += count
        if hit:
            slot[1] += count
            self._hits += count
            self._pending = False
        else:
            self._pending = True
        self._relation = relation

    def _epsilon(self, delta: float) -> float:
        tau = self._hits + (1 if self._pending else 0)
        if tau == 0 or delta >= 1.0:
            return 0.0
        if delta <= 0.0:
            return math.inf
        eps0, q, delta0 = self._combo
        return tct_epsilon(tau, q, eps0, delta, delta0=delta0, composition=self._composition)

    def spent(self) -> tuple[float, float]:
        if self._hits == 0 and not self._pending:
            return 0.0, 0.0
        delta = self.target_delta
        return self._epsilon(delta), delta

    def _snapshot(self) -> dict:
        return {
            "_hits": self._hits,
            "_queries": self._queries,
            "_pending": self._pending,
            "_slots": {cid: list(slot) for cid, slot in self._slots.items()},
            "_combo": self._combo,
            "_limit": self._limit,
            "_relation": self._relation,
        }

    # -- fast paths --------------------------------------------------------------------------------------
    def record(self, release: Release) -> None:
        """Charge one release: a target hit, or a query without a hit (see the class docstring).

        In memory (no ledger) a release of an already-charged query class takes a fast path: one memo
        lookup and one integer comparison against the precomputed hit limit.  Everything else (a new class,
        a refusal, a ledger) goes through the contract's check-then-commit path; both give the same state.
        """
        if self._ledger is None and type(release) is Release:
            event, last = release.event, self._last_event
            kind = type(event)
            if event is last or (  # the same class as the last release (mechanisms build fresh equal events)
                kind is type(last)
                and event.epsilon == last.epsilon
                and event.q == last.q
                and (
                    event.relation == last.relation
                    if kind is BetweenThresholdsEvent
                    else kind is BoundaryWrapperEvent and _same_plain_inner(event.inner, last.inner)
                )
            ):
                cid = self._last_cid
            else:
                cid = self._class_of(event)
                self._last_event, self._last_cid = event, cid
            slot = self._slots.get(cid)
            if slot is not None:
                hits = self._hits
                if hits < self._limit:
                    slot[0] += 1
                    self._queries += 1
                    if release.target_hit:
                        slot[1] += 1
                        self._hits = hits + 1
                        self._pending = False
                    else:
                        self._pending = True
                    return
        super().record(release)

    def record_outcomes(self, event, target_hit, failed=None) -> None:
        """Charge a vector of queries of one ``event`` at once: ``target_hit[i]`` says whether query ``i`` hit
        its target, ``failed[i]`` (optional) whether a non-hit query failed (only the ledger's outcome
        classes use it; without it non-hit queries are recorded as ``"token"``).

        All or nothing, with exactly the budget decision of recording the queries one by one in order (a
        query may run only while ``hits < max_hits``).  The charge is a handful of ``Charge`` rows (hits,
        fails, tokens, ordered so the sequential check is reproduced), so a ledger stores a few rows, not one
        per query.  Check ``can_afford(event, len(target_hit))`` *before* running a batch: that guarantees the
        batch's record cannot be refused.
        """
        hit = np.asarray(target_hit)
        if hit.dtype != np.bool_ or hit.ndim != 1:
            raise TypeError(f"target_hit must be a 1-d boolean array, got dtype {hit.dtype} and shape {hit.shape}")
        size = int(hit.size)
        if size == 0:
            return
        hits = int(np.count_nonzero(hit))
        fails = 0
        if failed is not None:
            fail = np.asarray(failed)
            if fail.dtype != np.bool_ or fail.shape != hit.shape:
                raise TypeError(f"failed must be a boolean array of shape {hit.shape}, got {fail.dtype} {fail.shape}")
            fails = int(np.count_nonzero(fail & ~hit))
        tokens = size - hits - fails
        others = [Charge(event, n, outcome) for n, outcome in ((fails, FAIL), (tokens, TOKEN)) if n]
        targets = [Charge(event, hits, TARGET)] if hits else []
        # Sequential semantics: query i needs hits_before_i < max_hits; the binding query is the last one, so
        # the non-hits go first when the last query hit, and last otherwise.
        self._charge_many(others + targets if bool(hit[-1]) else targets + others)

    def record_batch(self, batch) -> None:
        """:meth:`record_outcomes` for a mechanism's ``BatchRelease`` (anything with ``event``, a boolean
        ``target_hit`` array and optionally a ``failed`` array)."""
        target_hit = getattr(batch, "target_hit", None)
        if target_hit is None:
            raise UnsupportedEventError(
                f"cannot account for a batch of {getattr(batch, 'event', None)!r} without target outcomes"
            )
        self.record_outcomes(batch.event, target_hit, getattr(batch, "failed", None))
