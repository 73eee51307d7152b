"""The Target-Charging Technique accountant (paper, "Privacy analysis considerations"; Cohen and Lyu's TCT).

``TargetChargingAccountant`` charges the *target hits* of q-target queries: the ``target`` outcome of a
boundary-wrapped query (``BoundaryWrapperEvent``) and the ``between`` outcome of a BetweenThresholds query
(``BetweenThresholdsEvent``).  ``docs/tct_and_individual.md`` (section 1) proves the bound it reports.

What is charged:

* a release whose outcome is ``"target"`` is one hit;
* any other outcome (a token, ``fail``, BetweenThresholds' ``below``/``above``) is not a hit.  It is not
  free: a query answered after the last hit is a private draw towards the next hit, so the epsilon reported
  is that of ``tau = hits + 1`` hits as soon as a query ran after the last hit (and of ``tau = hits`` when the
  last query was a hit).  This costs at most one hit, whatever the number of non-target queries;
* **every query** of an approximate-DP class pays its mixture weight ``w`` in delta, hit or not.  A
  boundary-wrapped ``(eps_A, delta_A)`` inner (wrapped ``DPArgMax`` or ``DPWeightedSampling``) is a q-target
  query only after removing a mixture weight ``w = 1 - (1 - delta_A)^2 <= 2 delta_A``
  (:func:`pate_accountant.tct.wrapped_query_delta`): on neighbouring histograms at the release boundary one
  world never leaves ``fail`` and the other does with probability about ``delta_A``, and on such a pair no
  q-target decomposition exists.  The total ``Delta = sum of w`` over all queries adds
  ``(ln(1/(1 - Delta)), Delta)`` to the pure TCT bound, so the budget bounds the number of queries too;
* ``compose(event, count)`` (no release, so no outcome) is ``count`` hits and ``count`` queries.

Query classes.  A class is ``(eps0, q, w, relation)``: the target's level ``eps0 = event.epsilon``,
``q = event.q``, the per-query weight ``w`` (``0`` for BetweenThresholds and for wrapped pure inners).  A
``q``-target at level ``eps0`` is also a ``q'``-target at level ``eps0'`` for ``q' <= q`` and ``eps0' >= eps0``.

* With a budget the accountant's class is fixed by its **first query** (chosen before any data is seen);
  a later query must be *dominated* by it (``eps0 <= eps0_1``, ``q >= q_1``, ``w <= w_1``, same relation),
  otherwise it is refused with ``UnsupportedEventError``.  The budget ``(epsilon, delta)`` is split once, at
  that first query: for an approximate class a share ``query_delta_share`` of ``delta`` (default one half)
  goes to the per-query weights, ``Delta_max = share delta``, at most ``floor(Delta_max / w_1)`` queries run,
  and the TCT part gets ``(epsilon - ln(1/(1 - Delta_max)), delta - Delta_max)``; a pure class keeps the whole
  budget for the TCT part.  ``max_hits`` is the TCT hit limit at that budget.  A query runs only while
  ``hits < max_hits`` and ``queries < max_queries``: the interaction halts within the theorem's setting,
  and ``can_afford``/``register`` refuse in time.
* Without a budget the accountant reports, as an odometer, the bound for the conservative combination of
  every class queried (``max eps0``, ``min q``) at ``target_delta`` plus the actual ``Delta``.

Queries stated under different neighbouring relations are never mixed (``UnsupportedEventError``): the
relation rule is the one every accountant applies, :func:`~pate_accountant.accountants.event_checks.relation_after`
(fixed by ``neighboring_relation=`` or by the first query; an inner event of dp-accounting's, which states
none, is read under the accountant's relation, ``"replace-one"`` when nothing fixed it), and under
replace-one :func:`~pate_accountant.accountants.event_checks.check_native_relation` refuses a boundary wrapper
around dp-accounting's Laplace or discrete Laplace noise, as the composition accountants do: that noise is
calibrated to add/remove-one, and reading ``eps_A = 1/b`` under replace-one would halve ``eps0``.

Claims are checked (:func:`target_class`).  An event states its own ``(eps0, q)``; it is accepted only when a
mechanism of its kind can truthfully have that target: a ``BetweenThresholdsEvent`` needs
``q <= 1/(1 + e^{eps0})`` (:func:`~pate_accountant.tct.between_thresholds_q_limit`), a ``BoundaryWrapperEvent``
a level of at least ``2 eps_A`` and ``q <= boundary_wrapper_q(eps_A)``.  Anything more is refused with
``UnsupportedEventError`` naming the claimed value, before anything changes.

The in-memory ``record`` has a fast path (two integer comparisons against precomputed limits), and
:meth:`TargetChargingAccountant.record_outcomes` / :meth:`~TargetChargingAccountant.record_batch` charge
whole vectors of outcomes at once.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import dp_accounting
import numpy as np

from pate_accountant.accountants.base import Accountant, Charge, _check_budget
from pate_accountant.accountants.event_checks import check_native_relation, check_relation
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    WeightedSamplingEvent,
)
from pate_accountant.release import OUTCOMES, TARGET, Release, batch_outcome_classes, batch_outcomes
from pate_accountant.tct import (
    check_composition,
    NO_LIMIT,
    QUERY_DELTA_ROUNDING,
    TargetChargingSplit,
    between_thresholds_q_limit,
    boundary_wrapper_q,
    query_delta_epsilon,
    target_charging_split,
    tct_epsilon,
    wrapped_query_delta,
)
from pate_accountant.validation import check_real

__all__ = ["TargetChargingAccountant", "TargetClass", "combine_classes", "target_class"]

# NO_LIMIT (imported from pate_accountant.tct, re-exported for individual.py): the "no limit" value of the hit
# and query limits when no budget is given, and the query limit of a pure class (keeps the check one comparison).
#: Relative slack by which a wrapper event's claimed level may fall short of ``2 eps_A`` (float rounding only).
_ROUNDING = 1e-12


class TargetClass(NamedTuple):
    """The parameters of a q-target query that the bound needs (module docstring): the target's level
    ``epsilon0``, ``q``, the per-query mixture weight ``query_delta`` and the neighbouring relation."""

    epsilon0: float
    q: float
    query_delta: float
    relation: str | None


def _wrapper_class(event: BoundaryWrapperEvent) -> TargetClass:
    try:
        terms = epsilon_delta_terms(event.inner)
    except UnsupportedEventError as err:
        raise UnsupportedEventError(f"cannot account for event {event!r}: its inner event: {err}") from err
    eps_a = math.fsum(e * m for e, _, m in terms)
    delta_a = min(1.0, math.fsum(d * m for _, d, m in terms))
    if eps_a <= 0.0:
        raise UnsupportedEventError(f"cannot account for event {event!r}: its inner event has epsilon 0")
    if event.epsilon < 2.0 * eps_a * (1.0 - _ROUNDING):
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: a boundary wrapper's target is a q-target at level 2 eps_A = "
            f"{2.0 * eps_a:.6g} at best, but the event claims level {event.epsilon:.6g}"
        )
    q_max = boundary_wrapper_q(eps_a)
    if event.q > q_max * (1.0 + _ROUNDING):
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: a boundary wrapper around an eps_A = {eps_a:.6g} inner has a "
            f"q-target with q = {q_max:.6g} at most, but the event claims q = {event.q:.6g}"
        )
    return TargetClass(event.epsilon, event.q, wrapped_query_delta(delta_a), getattr(event.inner, "relation", None))


def _between_class(event: BetweenThresholdsEvent) -> TargetClass:
    q_max = between_thresholds_q_limit(event.epsilon)
    if not event.q <= q_max:
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: a BetweenThresholds query's between target at level eps0 = "
            f"{event.epsilon:.6g} has q < 1/(1 + e^eps0) = {q_max:.6g}, but the event claims q = {event.q:.6g}"
        )
    return TargetClass(event.epsilon, event.q, 0.0, event.relation)


def target_class(event) -> TargetClass:
    """The :class:`TargetClass` of a ``BoundaryWrapperEvent`` or ``BetweenThresholdsEvent``, once its claim is
    checked against what a mechanism of its kind can truthfully claim (docs/tct_and_individual.md, section 1,
    "Claims are checked"; the one check target charging and individual charging share).

    Raises ``UnsupportedEventError`` naming the event for anything else (an event without a q-target), for a
    boundary wrapper whose inner event has no (epsilon, delta) form, for a wrapper event that claims more
    than the wrapper gives (a level below ``2 eps_A`` or a ``q`` above :func:`~pate_accountant.tct.boundary_wrapper_q`),
    and for a BetweenThresholds event whose ``q`` is above ``1/(1 + e^{eps0})``, the limit that no
    BetweenThresholds query reaches (:func:`~pate_accountant.tct.between_thresholds_q_limit`;
    docs/mechanisms/between_thresholds.md, "The q-target: derivation").
    """
    if isinstance(event, BetweenThresholdsEvent):
        return _between_class(event)
    if isinstance(event, BoundaryWrapperEvent):
        return _wrapper_class(event)
    if isinstance(event, dp_accounting.DpEvent):
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: the target-charging accountant charges only q-target "
            f"queries (BoundaryWrapperEvent, BetweenThresholdsEvent)"
        )
    raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")


def combine_classes(first, second) -> tuple[float, float, float]:
    """The conservative common class ``(max eps0, min q, max query_delta)`` of two classes (either may be a
    :class:`TargetClass` or an ``(eps0, q, query_delta)`` triple; ``None`` is the empty combination)."""
    if first is None:
        return (second[0], second[1], second[2])
    if second is None:
        return (first[0], first[1], first[2])
    return (max(first[0], second[0]), min(first[1], second[1]), max(first[2], second[2]))


def _dominates(anchor: TargetClass, cls: TargetClass) -> bool:
    """Whether every query of class ``cls`` is also a query of class ``anchor`` (module docstring)."""
    return cls.epsilon0 <= anchor.epsilon0 and cls.q >= anchor.q and cls.query_delta <= anchor.query_delta


#: Inner event types whose (epsilon, delta) form is their own two fields (``translate.epsilon_delta_terms``).
_PLAIN_INNER = (EpsilonDeltaEvent, NoisyArgMaxEvent, WeightedSamplingEvent)


def _same_plain_inner(a, b) -> bool:
    """Whether two inner events give the same target class: equal plain type, epsilon, delta, relation."""
    if a is b:
        return True
    return (
        type(a) is type(b)
        and type(a) in _PLAIN_INNER
        and a.epsilon == b.epsilon
        and a.delta == b.delta
        and a.relation == b.relation
    )


class EventMemo:
    """Memoises a pure function of an event, keyed by value (mechanisms build a fresh but equal event for
    every release, so identity would not help).  A ``BetweenThresholdsEvent`` is keyed by the tuple of its
    fields (hashing an attrs event runs Python code; a tuple of floats does not), a ``BoundaryWrapperEvent``
    around a plain (epsilon, delta) inner event by its level, ``q`` and the inner type, epsilon, delta and
    relation (all that its class depends on), anything else by the event itself.  The table is bounded and
    cleared when full.  Exceptions of ``compute`` propagate and are not memoised; an unhashable event (one
    holding a list) is computed every time."""

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
            inner = event.inner
            key = (1, event.epsilon, event.q, type(inner), inner.epsilon, inner.delta, inner.relation)
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


def _check_target_delta(target_delta) -> float:
    return check_real("target_delta", target_delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


def _check_share(share) -> float:
    return check_real("query_delta_share", share, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


#: What the accountant splits a budget into for its anchor class (module docstring): max_hits, max_queries,
#: epsilon_tct, delta_tct and reserved (``Delta_max``), from :func:`pate_accountant.tct.target_charging_split`.
_Plan = TargetChargingSplit


class TargetChargingAccountant(Accountant):
    """The Target-Charging Technique: only target hits of q-target queries are charged, plus the per-query
    delta of approximate-DP queries (module docstring; proof in ``docs/tct_and_individual.md``).

    ``TargetChargingAccountant(*, budget=None, ledger=None, target_delta=1e-6, composition="optimal",
    query_delta_share=0.5, neighboring_relation=None)``.

    * Supported events: ``BoundaryWrapperEvent`` and ``BetweenThresholdsEvent`` whose claims a mechanism of
      their kind can make (:func:`target_class`); anything else raises ``UnsupportedEventError``.
    * ``neighboring_relation``: the relation of every query (``None``: fixed by the first query, see the
      module docstring); dp-accounting's inner events are read under it.
    * ``record(release)``: a release with ``target_hit`` is one hit, any other outcome is a query without a
      hit; every query pays its class's per-query delta; ``compose(event, count)`` is ``count`` hits.
    * ``spent()``: ``(tct_epsilon(tau, q, eps0, delta_tct) + ln(1/(1 - Delta), delta_tct + Delta)`` with
      ``tau = hits`` (``+ 1`` if queries ran after the last hit), ``Delta`` the sum of the per-query deltas
      so far, ``delta_tct`` the TCT part's delta (``delta - Delta_max`` of the budget, or ``target_delta``
      without one); ``(0, 0)`` before any query.
    * ``budget=(epsilon, delta)`` (``delta > 0``): the class is fixed by the first query; queries run only
      while ``hits < max_hits`` and ``queries < max_queries``.
    * ``composition``: the composition bound inside the TCT bound, ``"optimal"`` or ``"drv"``.
    * ``query_delta_share``: the share of a budget's delta reserved for per-query deltas when the first
      query's class has them (ignored for pure classes).

    Reporting: :attr:`hits`, :attr:`queries`, :attr:`query_delta`, :attr:`max_hits`, :attr:`max_queries`
    (``None`` without a budget or before the first query), :meth:`classes`, :meth:`max_hits_for`.
    """

    kind = "target-charging"
    parallel_composition = "hits"  # docs/groups.md

    def __init__(
        self,
        *,
        budget=None,
        ledger=None,
        target_delta=1e-6,
        composition="optimal",
        query_delta_share=0.5,
        neighboring_relation=None,
    ):
        neighboring_relation = check_relation("neighboring_relation", neighboring_relation)
        self._target_delta = _check_target_delta(target_delta)
        self._composition = check_composition(composition)
        self._share = _check_share(query_delta_share)
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
        self._plans: dict = {}
        self._last_event, self._last_cid = None, None  # one-entry identity cache in front of _class_of
        # Mutable accounting state (see _get_state).
        self._hits = 0
        self._queries = 0
        self._pending = False  # queries ran after the last hit
        self._slots: dict = {}  # class id -> [queries, hits]
        self._combo = None  # (eps0, q, query_delta) of everything queried
        self._anchor = None  # the class of the first query
        self._limit = NO_LIMIT  # max_hits of the anchor under the budget
        self._query_limit = NO_LIMIT  # max_queries of the anchor under the budget
        # The relation (base class: ``_current_relation``) is set by the base constructor, before a ledger replays.
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=neighboring_relation)

    # -- configuration ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        config = {
            "target_delta": self._target_delta, "composition": self._composition, "query_delta_share": self._share
        }
        if self._configured_relation is not None:
            config["neighboring_relation"] = self._configured_relation
        return config

    # -- class bookkeeping ------------------------------------------------------------------------------
    def _register_class(self, event) -> int:
        cls = target_class(event)  # raises UnsupportedEventError
        cid = self._class_ids.get(cls)
        if cid is None:
            cid = self._class_ids[cls] = len(self._class_list)
            self._class_list.append(cls)
        return cid

    def _plan_for(self, anchor: TargetClass | None) -> _Plan | None:
        """The budget split for an anchor class (memoised; ``None`` without a budget or an anchor)."""
        if self._budget is None or anchor is None:
            return None
        key = (anchor, self._budget)
        plan = self._plans.get(key)
        if plan is None:
            epsilon, delta = self._budget
            plan = self._plans[key] = target_charging_split(
                epsilon, delta, anchor.epsilon0, anchor.q, anchor.query_delta,
                share=self._share, composition=self._composition,
            )
        return plan

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
    def query_delta(self) -> float:
        """``Delta``: the per-query deltas paid so far (``0`` for pure queries), rounded up."""
        return self._query_delta(self._slots)

    def _query_delta(self, slots) -> float:
        total = math.fsum(slot[0] * self._class_list[cid].query_delta for cid, slot in slots.items())
        return min(1.0, total * (1.0 + QUERY_DELTA_ROUNDING)) if total > 0.0 else 0.0

    @property
    def max_hits(self) -> int | None:
        """The largest number of hits the budget allows for this accountant's class (``None`` without a
        budget, or before the first query: it depends on the first query's class; see :meth:`max_hits_for`)."""
        plan = self._plan_for(self._anchor)
        return None if plan is None else plan.max_hits

    @property
    def max_queries(self) -> int | None:
        """The largest number of queries the budget allows (``None`` without a budget or before the first
        query; a very large number for a pure class)."""
        plan = self._plan_for(self._anchor)
        return None if plan is None else plan.max_queries

    def max_hits_for(self, event) -> int | None:
        """The hit limit for ``event``'s class: that of the accountant's class once fixed, else the limit the
        budget would give if ``event`` were the first query (``None`` without a budget)."""
        if self._budget is None:
            return None
        cls = self._class_list[self._class_of(event)]
        return self._plan_for(self._anchor if self._anchor is not None else cls).max_hits

    @property
    def composition(self) -> str:
        return self._composition

    @property
    def query_delta_share(self) -> float:
        return self._share

    @property
    def target_delta(self) -> float:
        """The delta of the TCT part: the budget's delta less the per-query reserve, or ``target_delta``
        without a budget."""
        plan = self._plan_for(self._anchor)
        if plan is not None:
            return plan.delta_tct
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
        """``(eps0_max, q_min, query_delta_max)`` over the classes queried (``None`` before any query)."""
        return self._combo

    # -- the bound ---------------------------------------------------------------------------------------
    def _bound(self, tau: int, query_delta: float, delta_tct: float, cls) -> float:
        """``tct_epsilon(tau) + ln(1/(1 - Delta))`` for a class ``(eps0, q, ...)``."""
        if tau == 0:
            return query_delta_epsilon(query_delta)
        if delta_tct <= 0.0:
            return math.inf
        return tct_epsilon(tau, cls[1], cls[0], delta_tct, composition=self._composition) + query_delta_epsilon(
            query_delta
        )

    def _charging_class(self):
        """The class the bound is evaluated for: the first query's with a budget, else the combination."""
        return self._anchor if self._budget is not None else self._combo

    # -- the accountant hooks ----------------------------------------------------------------------------
    def _worst_case(self, event, count: int = 1) -> Charge:
        """A not-yet-run query can hit its target: ``count`` hits."""
        return Charge(event, count, TARGET)

    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        cid = self._class_of(charge.event)  # UnsupportedEventError: no q-target, or a claim beyond its kind
        cls = self._class_list[cid]
        # The relation rule of every accountant: UnsupportedEventError naming both relations, and under
        # replace-one a dp-accounting Laplace inner is refused (calibrated to add/remove-one).
        relation = self._relation_after(charge.event)
        check_native_relation(charge.event, relation, who=type(self).__name__)
        anchor = self._anchor if self._anchor is not None else cls
        if enforce_budget and self._budget is not None and not _dominates(anchor, cls):
            raise UnsupportedEventError(
                f"cannot account for event {charge.event!r}: a budgeted target-charging accountant keeps the class "
                f"of its first query (eps0={anchor.epsilon0:.6g}, q={anchor.q:.6g}, per-query delta "
                f"{anchor.query_delta:.3g}), and this query (eps0={cls.epsilon0:.6g}, q={cls.q:.6g}, per-query delta "
                f"{cls.query_delta:.3g}) is not covered by it"
            )
        hit = charge.outcome is None or charge.outcome == TARGET
        count = charge.count
        need = self._hits + count if hit else self._hits + 1  # the tau reported after this charge
        combo = self._combo if cid in self._slots else combine_classes(self._combo, cls)
        plan = self._plan_for(anchor) if enforce_budget else None
        if plan is not None and (need > plan.max_hits or self._queries + count > plan.max_queries):
            slots = {k: list(v) for k, v in self._slots.items()}
            slots.setdefault(cid, [0, 0])[0] += count
            delta_q = self._query_delta(slots)
            eps = self._bound(need, delta_q, plan.delta_tct, anchor)
            what = f"{count} target hit(s)" if hit else "a query after the last hit"
            self._refuse(
                f"charging {what} of {charge.event!r} (hits so far {self._hits} of at most {plan.max_hits}, "
                f"queries so far {self._queries} of at most {plan.max_queries})",
                eps,
                plan.delta_tct + delta_q,
            )
        if not do_compose:
            return
        slot = self._slots.get(cid)
        if slot is None:
            slot = self._slots[cid] = [0, 0]
            self._combo = combo
        if self._anchor is None:
            self._anchor = anchor
            limits = self._plan_for(anchor)
            if limits is not None:
                self._limit, self._query_limit = limits.max_hits, limits.max_queries
        slot[0] += count
        self._queries += count
        if hit:
            slot[1] += count
            self._hits += count
            self._pending = False
        else:
            self._pending = True
        self._set_relation(relation)

    def _epsilon(self, delta: float) -> float:
        tau = self.charged_tau
        if (tau == 0 and self._queries == 0) or delta >= 1.0:
            return 0.0
        query_delta = self.query_delta
        return self._bound(tau, query_delta, delta - query_delta, self._charging_class())

    def spent(self) -> tuple[float, float]:
        if self._queries == 0:
            return 0.0, 0.0
        query_delta = self.query_delta
        delta_tct = self.target_delta
        eps = self._bound(self.charged_tau, query_delta, delta_tct, self._charging_class())
        return eps, min(1.0, delta_tct + query_delta)

    def _get_state(self):
        return (self._hits, self._queries, self._pending, {cid: tuple(slot) for cid, slot in self._slots.items()},
                self._combo, self._anchor, self._limit, self._query_limit, self._current_relation)

    def _set_state(self, data) -> None:
        (self._hits, self._queries, self._pending, slots, self._combo, self._anchor, self._limit, self._query_limit,
         self._current_relation) = data
        self._slots = {cid: list(slot) for cid, slot in slots.items()}

    # -- fast paths --------------------------------------------------------------------------------------
    def record(self, release: Release) -> None:
        """Charge one release: a target hit, or a query without a hit (see the class docstring).

        In memory (no ledger) a release of an already-charged query class takes a fast path: one memo
        lookup and two integer comparisons against the precomputed limits.  Everything else (a new class,
        a refusal, a ledger) goes through the contract's check-then-commit path; both give the same state.
        """
        self._afforded = None
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
                if hits < self._limit and self._queries < self._query_limit:
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

    def record_outcomes(self, event, target_hit, failed=None, *, outcomes=None) -> None:
        """Charge a vector of queries of one ``event`` at once: ``target_hit[i]`` says whether query ``i`` hit
        its target, ``failed[i]`` (optional) whether a non-hit query failed, or ``outcomes[i]`` (optional,
        instead of ``failed``) the outcome class of each query (:data:`pate_accountant.release.OUTCOMES`,
        ``"target"`` exactly where ``target_hit``).  Only the ledger's outcome classes use them; without
        either, non-hit queries are recorded as ``"token"``.

        All or nothing, with exactly the budget decision of recording the queries one by one in order (a
        query may run only while ``hits < max_hits``).  The charge is a handful of ``Charge`` rows (hits,
        fails, tokens, ordered so the sequential check is reproduced), so a ledger stores a few rows, not one
        per query.  Check ``can_afford(event, len(target_hit))`` *before* running a batch: that guarantees the
        batch's record cannot be refused.
        """
        self._charge_many(self._outcome_charges(event, target_hit, failed, outcomes))

    def _outcome_charges(self, event, target_hit, failed=None, outcomes=None) -> list:
        """The charges of :meth:`record_outcomes` (a group's accountant records them as its own)."""
        hit = np.asarray(target_hit)
        if hit.dtype != np.bool_ or hit.ndim != 1:
            raise TypeError(f"target_hit must be a 1-d boolean array, got dtype {hit.dtype} and shape {hit.shape}")
        size = int(hit.size)
        if size == 0:
            return []
        hits = int(np.count_nonzero(hit))
        classes = batch_outcome_classes(hit, failed, outcomes)
        others = [Charge(event, n, outcome) for outcome in OUTCOMES if outcome != TARGET
                  for n in [int(np.count_nonzero(classes == outcome))] if n]
        targets = [Charge(event, hits, TARGET)] if hits else []
        # Sequential semantics: query i needs hits_before_i < max_hits; the binding query is the last one, so
        # the non-hits go first when the last query hit, and last otherwise.
        return others + targets if bool(hit[-1]) else targets + others

    def record_batch(self, batch) -> None:
        """:meth:`record_outcomes` for a mechanism's ``BatchRelease`` (anything with ``event``, a boolean
        ``target_hit`` array and optionally ``outcomes`` or a ``failed`` array)."""
        target_hit = getattr(batch, "target_hit", None)
        if target_hit is None:
            raise UnsupportedEventError(
                f"cannot account for a batch of {getattr(batch, 'event', None)!r} without target outcomes"
            )
        self.record_outcomes(batch.event, target_hit, outcomes=batch_outcomes(batch))
