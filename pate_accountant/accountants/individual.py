"""Individual (per-teacher) privacy charging (the Hot PATE paper, "DP methods for heterogeneous ensembles").

The paper's second heterogeneous method asks BetweenThresholds questions about the count ``c'_v`` of a
random subsample of teachers that vote for a random token ``v``.  Only the ``between`` outcome (the
query's q-target) is charged, and it is charged only to the teachers that were counted: the sampled
teachers with ``y_i = v`` (about ``2L`` of them), whose indices the caller puts in
``Release.charged_teachers``.  Every teacher has a charge counter; a teacher whose counter reaches the
per-teacher limit is *removed*: it may not take part in any later query.

Why this is private (our reconstruction, through the target-charging (TCT) bound; see
docs/tct_and_individual.md).  Fix teacher ``i`` and compare the ensemble with and without it
(add/remove-one-teacher).  The query's randomness (the rate ``nu ~ U[1/n, 1]`` with ``n`` the *fixed*
ensemble size, the candidate ``v``, the other teachers' inclusion draws) has the same law in both worlds,
so a query depends on ``i`` only if ``i`` is counted (sensitivity one); every other query is the same in
both worlds.  (Drawing ``nu`` from ``U[1/n_active, 1]`` would break this: the count of active teachers
changes when ``i`` is removed.)  The queries that depend on ``i`` are ``eps0``-DP with a ``q``-target at
level ``eps0``, and ``i`` is charged exactly on their target hits, so teacher ``i``'s view is a TCT
interaction that halts at its ``tau``-th hit (removal).  With ``tau_ind = tct_max_hits(q, eps0, epsilon,
delta)`` each teacher, hence the whole run, is ``(epsilon, delta)``-DP.  For ``(1, 1e-6)``:
``(eps0, g) = (0.02, 150) -> 37``, ``(0.01, 300) -> 203``, ``(0.005, 600) -> 932`` with the continuous
``q = (1 - e^{-eps0 g}) / (1 + e^{eps0})`` (the tests check these values).

Replace-one (the project's default relation).  Replacing teacher ``i`` moves its vote from one token to
another, so *two* kinds of query depend on it, and it is charged on one kind only in each world.  The
guarantee then follows by group privacy from add/remove (replace = remove + add):
``(2 eps_a, (1 + e^{eps_a}) delta_a)``.  The limit for a replace-one budget ``(epsilon, delta)`` is
therefore ``tct_max_hits(q, eps0, epsilon / 2, delta / (1 + e^{epsilon / 2}))`` (twice the budget's
worth of charges per teacher under add/remove).  Pass ``relation="add-remove-one"`` for the add/remove
numbers above.

The discrete q.  Our ``mechanisms.BetweenThresholds`` adds discrete Laplace noise to an integer count, and
its ``between`` target has ``q = (1 - e^{-eps0 (g + 1)}) / (1 + e^{eps0})`` (the continuous formula at gap
``g + 1``; docs/mechanisms/between_thresholds.md).  ``gap=`` uses that discrete formula, rounded down by
``1e-9`` relative so that the mechanism's certified ``q`` (equal to it up to float rounding) dominates it;
for the continuous values pass ``q=`` explicitly (:func:`between_thresholds_q` gives both).

Removal protocol for the generation loop (``ensembles.PrivateGenerator``): before each step read
``accountant.active_teachers()`` (a sorted array of original teacher indices), run the step on
``teachers.subset(active)``, draw ``nu`` with the fixed ``n = num_teachers`` (removed teachers abstain),
and on a hit map the subset positions of the counted teachers back to original indices
(``active[positions]``) for ``Release.charged_teachers``; a non-hit names nobody.  A charge naming a
removed teacher is refused (``BudgetExhaustedError``), atomically; ``can_afford(event)`` is ``False``
once no teacher is active.

What is confidential.  The counters, the removed set, :attr:`~IndividualChargingAccountant.num_active` and
:meth:`~IndividualChargingAccountant.spent` are functions of the charged teacher sets, i.e. of the votes:
raw data, not DP outputs.  A ledger therefore keeps the charged sets (hits only) and the spent totals in
its confidential file (``confidential_charges = True``); the shareable file holds the events and outcome
classes only, and the run's public guarantee is the budget, which the per-teacher limit enforces.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pate_accountant.accountants.base import Accountant, Charge, _check_budget
from pate_accountant.accountants.event_checks import check_native_relation
from pate_accountant.accountants.target_charging import NO_LIMIT, EventMemo, _check_target_delta, target_class
from pate_accountant.bisection import switch_point
from pate_accountant.errors import BudgetExhaustedError, UnsupportedEventError
from pate_accountant.events import ADD_REMOVE_ONE, NEIGHBOURING_RELATIONS, REPLACE_ONE, BetweenThresholdsEvent
from pate_accountant.release import TARGET, Release, batch_outcome_classes, batch_outcomes
from pate_accountant.tct import between_thresholds_q_limit, check_composition, tct_epsilon, tct_max_hits
from pate_accountant.validation import check_int, check_real

__all__ = [
    "IndividualChargingAccountant",
    "between_thresholds_q",
    "individual_epsilon",
    "individual_limit",
]

#: Relative rounding-down of the discrete ``q`` computed from a gap (see the module docstring).
Q_ROUNDING = 1e-9


def between_thresholds_q(epsilon0: float, gap: float, *, discrete: bool = True) -> float:
    """The ``q`` of BetweenThresholds' ``between`` target at level ``epsilon0``.

    ``discrete=True``: ``(1 - e^{-eps0 (g + 1)}) / (1 + e^{eps0})``, our integer mechanism (``g`` an integer);
    ``discrete=False``: the continuous-Laplace ``(1 - e^{-eps0 g}) / (1 + e^{eps0})``.
    (``pate_accountant`` does not import ``mechanisms``; the tests check this against the mechanism.)
    """
    epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0, min_open=True)
    if discrete:
        gap = check_int("gap", gap, minimum=1) + 1
    else:
        gap = check_real("gap", gap, minimum=0.0, min_open=True)
    return -math.expm1(-epsilon0 * gap) / (1.0 + math.exp(epsilon0))


def _check_relation(relation) -> str:
    if relation not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {relation!r}")
    return relation


def individual_limit(
    epsilon0: float,
    q: float,
    epsilon: float,
    delta: float,
    *,
    relation: str = REPLACE_ONE,
    composition: str = "optimal",
) -> int:
    """The per-teacher limit ``tau_ind`` for a target ``(epsilon, delta)`` (module docstring).

    Add/remove-one: ``tct_max_hits(q, eps0, epsilon, delta)``.  Replace-one: the add/remove limit for
    ``(epsilon / 2, delta / (1 + e^{epsilon / 2}))`` (group privacy of two add/remove steps).
    """
    relation = _check_relation(relation)
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    if relation == REPLACE_ONE:
        epsilon, delta = epsilon / 2.0, delta / (1.0 + math.exp(epsilon / 2.0))
    return tct_max_hits(q, epsilon0, epsilon, delta, composition=check_composition(composition))


def individual_epsilon(
    tau: int, epsilon0: float, q: float, delta: float, *, relation: str = REPLACE_ONE, composition: str = "optimal"
) -> float:
    """One teacher's epsilon (at total ``delta``) after ``tau`` charges (its TCT interaction halting at the
    ``tau``-th hit).  Add/remove-one: ``tct_epsilon(tau, q, eps0, delta)``.  Replace-one: ``2 x`` for the
    smallest ``x`` (found by bisection to ``1e-6`` relative, from above) with
    ``eps_a(x) = tct_epsilon(tau, q, eps0, delta / (1 + e^x)) <= x``: the add/remove guarantee
    ``(eps_a(x), delta / (1 + e^x))`` gives, by group privacy, ``(2 eps_a(x), (1 + e^{eps_a(x)}) delta / (1 + e^x))``,
    at most ``(2 x, delta)``."""
    relation = _check_relation(relation)
    tau = check_int("tau", tau, minimum=0)
    composition = check_composition(composition)
    if tau == 0:
        return 0.0
    if relation == ADD_REMOVE_ONE:
        return tct_epsilon(tau, q, epsilon0, delta, composition=composition)

    def eps_a(x):
        # delta / (1 + e^x), written so that it cannot overflow; once it underflows no epsilon fits.
        delta_a = delta * math.exp(-x) / (1.0 + math.exp(-x))
        if delta_a <= 0.0:
            return math.inf
        return tct_epsilon(tau, q, epsilon0, delta_a, composition=composition)

    # eps_a increases with x (a smaller delta_a), so every x < eps_a(0) <= eps_a(x) is infeasible and the
    # feasible x form a half-line [x*, inf) (eps_a grows like sqrt(ln(1/delta_a)), far slower than x).
    lo = eps_a(0.0)
    if not math.isfinite(lo):
        return math.inf
    _, hi = switch_point(lambda x: eps_a(x) <= x, lo, max(2.0 * lo, 1e-12), rel_tol=1e-6, limit=1e6)
    return 2.0 * hi  # certificate: eps_a(hi) <= hi, so (2 hi, (1 + e^hi) delta / (1 + e^hi) = delta) holds


class IndividualChargingAccountant(Accountant):
    """Per-teacher charge counters with removal at a per-teacher limit (module docstring).

    ``IndividualChargingAccountant(num_teachers, *, per_teacher_limit=None, budget=None, epsilon0=None,
    q=None, gap=None, relation="replace-one", composition="optimal", target_delta=1e-6, ledger=None)``.

    * **The limit**: ``per_teacher_limit``, or :func:`individual_limit` for ``budget=(epsilon, delta)`` with
      the queries' level ``epsilon0`` and ``q`` (or ``gap``, for our discrete BetweenThresholds).  With both,
      the given limit may not exceed the derived one.  With neither, counters are kept and nobody is removed.
    * **Supported events**: ``BetweenThresholdsEvent`` whose ``q`` a BetweenThresholds query can have
      (``q <= 1/(1 + e^{epsilon})``, checked by :func:`~pate_accountant.accountants.target_charging.target_class`,
      the check target charging applies); anything else raises ``UnsupportedEventError``, and so does, under
      replace-one, an event holding dp-accounting's Laplace noise (the relation rule of every accountant,
      :func:`~pate_accountant.accountants.event_checks.check_native_relation`).  When ``epsilon0``/``q`` are
      declared, an event with a larger epsilon or a smaller q than declared is refused too (the limit would
      not cover it); with a budget the declared ``q`` is checked like an event's, since the limit is derived
      from it.
    * **What is charged**: a release with ``target_hit`` (``between``) adds one to each teacher in
      ``release.charged_teachers``; any other outcome charges nobody (its ``charged_teachers``, if any, are
      the participants: checked to be active, not charged).  ``compose(event, count)`` (no release, so no
      charged set) charges *every active teacher* ``count`` times: the worst case.
    * **Removal**: a teacher whose counter reaches the limit is removed; charging it again, or listing it
      as a participant, is refused with ``BudgetExhaustedError``, atomically (nothing changes); indices
      outside ``[0, num_teachers)`` raise ``ValueError``.  ``can_afford(event)`` is ``True`` iff at least one
      teacher is active (every active teacher can take one more charge).
    * **spent()**: the worst teacher's individual guarantee: :func:`individual_epsilon` at
      ``tau = max counter``, plus one once a non-target query has run (an active teacher may have been
      counted in it: a private draw towards its next charge) unless that teacher is at its limit (removed
      teachers take part in nothing more), at the budget's delta (or ``target_delta``).  Every teacher's
      guarantee is at most this, so the run is ``spent()``-DP under ``relation``.

    Reporting and the generation loop: :meth:`active_teachers`, :attr:`removed_teachers`, :meth:`is_active`,
    :meth:`remaining`, :attr:`counters`, :attr:`num_active`, :attr:`per_teacher_limit`, :attr:`queries`, :attr:`misses`,
    :attr:`hits`, :attr:`charges` (the module docstring gives the removal protocol).
    """

    kind = "individual-charging"
    #: The state (per-teacher counters, removals, hence :meth:`spent`) is a function of the charged teacher
    #: sets, which are private: a ledger keeps those sets (on hits only) and the spent totals in its
    #: confidential file, never in the shareable one.
    confidential_charges = True

    def __init__(
        self,
        num_teachers,
        *,
        per_teacher_limit=None,
        budget=None,
        epsilon0=None,
        q=None,
        gap=None,
        relation=REPLACE_ONE,
        composition="optimal",
        target_delta=1e-6,
        ledger=None,
    ):
        self._n = check_int("num_teachers", num_teachers, minimum=1)
        self._relation = _check_relation(relation)
        self._composition = check_composition(composition)
        self._target_delta = _check_target_delta(target_delta)
        if per_teacher_limit is not None:
            per_teacher_limit = check_int("per_teacher_limit", per_teacher_limit, minimum=1)
        if gap is not None:
            gap = check_int("gap", gap, minimum=1)
        if epsilon0 is not None:
            epsilon0 = check_real("epsilon0", epsilon0, minimum=0.0, min_open=True)
        if q is not None and gap is not None:
            raise ValueError("give q or gap, not both")
        if q is not None:
            q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        self._given = {"per_teacher_limit": per_teacher_limit, "epsilon0": epsilon0, "q": q, "gap": gap}
        if gap is not None:
            if epsilon0 is None:
                raise ValueError("gap needs epsilon0 (q is computed from both)")
            q = between_thresholds_q(epsilon0, gap) * (1.0 - Q_ROUNDING)
        if (epsilon0 is None) != (q is None):
            raise ValueError("give epsilon0 together with q (or gap), or neither")
        self._epsilon0, self._q = epsilon0, q
        self._declared = epsilon0 is not None
        # Resolve the limit (the budget is validated again by the base class; check it here first).
        checked_budget = _check_budget(budget)
        if checked_budget is not None and not self._declared:
            raise ValueError(
                "a budget needs epsilon0 and q (or gap): the per-teacher limit is checked against it"
            )
        derived = None
        if checked_budget is not None and self._declared:
            if checked_budget[1] == 0.0:
                raise ValueError(f"an individual-charging budget needs delta > 0 (got {checked_budget})")
            q_max = between_thresholds_q_limit(epsilon0)
            if not q <= q_max:  # a limit derived from a q no BetweenThresholds query has would over-admit
                raise ValueError(
                    f"q must be <= 1/(1 + e^epsilon0) = {q_max:.6g} (a BetweenThresholds query's q stays below it) at "
                    f"epsilon0={epsilon0:.6g}, got {q!r}"
                )
            derived = individual_limit(
                epsilon0, q, checked_budget[0], checked_budget[1], relation=relation, composition=composition
            )
        if per_teacher_limit is not None:
            limit = check_int("per_teacher_limit", per_teacher_limit, minimum=1)
            if derived is not None and limit > derived:
                raise ValueError(
                    f"per_teacher_limit={limit} exceeds the limit {derived} that the budget {checked_budget} allows "
                    f"for epsilon0={epsilon0}, q={q:.6g} ({relation})"
                )
        elif checked_budget is not None:
            if derived == 0:
                raise ValueError(
                    f"the budget {checked_budget} does not allow a single charge per teacher at epsilon0={epsilon0}"
                )
            limit = derived
        else:
            limit = None
        self._limit_value = limit
        self._limit = NO_LIMIT if limit is None else limit
        self._class_of = EventMemo(self._event_class)
        self._last_event = None  # an event whose class is covered (see record)
        self._eps_memo: dict = {}
        # Mutable state (see _get_state).
        self._counts = [0] * self._n
        self._removed: set = set()
        self._num_active = self._n
        self._misses = 0  # non-target queries (queries = hits + misses)
        self._hits = 0
        # The worst (epsilon0, q) charged so far; the declared one when declared (events are checked against it).
        self._obs_eps, self._obs_q = (epsilon0, q) if self._declared else (0.0, 1.0)
        self._active_cache = None
        self._removed_cache = None
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=self._relation)

    # -- configuration ----------------------------------------------------------------------------------
    @classmethod
    def for_run(cls, *, budget, ledger=None, mechanism=None, num_teachers=None) -> IndividualChargingAccountant:
        """A run's accountant: one counter per configured teacher (``num_teachers``), the limit derived from
        ``budget`` for the run's BetweenThresholds ``mechanism`` (its ``epsilon``, its gap, its relation)."""
        epsilon0, gap = getattr(mechanism, "epsilon", None), getattr(mechanism, "gap", None)
        relation = getattr(mechanism, "relation", REPLACE_ONE)
        if num_teachers is None or not isinstance(gap, int) or epsilon0 is None:
            raise UnsupportedEventError("individual charging needs a BetweenThresholds mechanism (the paper's "
                                        "individual-charging scheme) and the number of teachers")
        return cls(num_teachers, budget=budget, epsilon0=epsilon0, gap=gap, relation=relation, ledger=ledger)

    def _config(self) -> dict:
        return {
            "num_teachers": self._n,
            **self._given,
            "relation": self._relation,
            "composition": self._composition,
            "target_delta": self._target_delta,
        }

    def _event_class(self, event):
        # The relation rule of every accountant: stated under the other relation, UnsupportedEventError naming
        # both; under replace-one, dp-accounting's Laplace noise is refused (calibrated to add/remove-one).
        check_native_relation(event, self._relation_after(event), who=type(self).__name__, keyword="relation")
        if not isinstance(event, BetweenThresholdsEvent):
            raise UnsupportedEventError(
                f"cannot account for event {event!r}: individual charging accounts for BetweenThresholds "
                f"queries (BetweenThresholdsEvent) only"
            )
        target_class(event)  # a q no BetweenThresholds query has: UnsupportedEventError (target charging's check)
        if self._declared and (event.epsilon > self._epsilon0 or event.q < self._q):
            raise UnsupportedEventError(
                f"cannot account for event {event!r}: its target (epsilon={event.epsilon:.6g}, q={event.q:.6g}) is "
                f"weaker than the one the per-teacher limit assumes (epsilon0={self._epsilon0:.6g}, q={self._q:.6g})"
            )
        return (event.epsilon, event.q)

    # -- reporting ---------------------------------------------------------------------------------------
    @property
    def num_teachers(self) -> int:
        return self._n

    @property
    def per_teacher_limit(self) -> int | None:
        """Charges a teacher may take before it is removed (``None``: no limit)."""
        return self._limit_value

    @property
    def relation(self) -> str:
        return self._relation

    @property
    def epsilon0(self) -> float | None:
        """The declared level of the queries (``None`` when not declared)."""
        return self._epsilon0

    @property
    def q(self) -> float | None:
        """The declared ``q`` of the queries' target (``None`` when not declared)."""
        return self._q

    @property
    def target_delta(self) -> float:
        """The delta ``spent()`` reports at: the budget's delta, or ``target_delta`` without a budget."""
        return self._budget[1] if self._budget is not None else self._target_delta

    @property
    def counters(self) -> np.ndarray:
        """A copy of the per-teacher charge counters (``int64``).  Confidential (raw data), like
        :attr:`num_active`, :meth:`active_teachers`, :attr:`removed_teachers` and :meth:`spent`."""
        return np.array(self._counts, dtype=np.int64)

    @property
    def num_active(self) -> int:
        """Teachers not yet removed.  Confidential: removals follow from the charged teacher sets."""
        return self._num_active

    @property
    def queries(self) -> int:
        """Queries charged so far (every outcome)."""
        return self._hits + self._misses

    @property
    def misses(self) -> int:
        """Non-target outcomes charged so far (they charge nobody)."""
        return self._misses

    @property
    def hits(self) -> int:
        """Target (``between``) outcomes charged so far (``compose`` counts as hits)."""
        return self._hits

    @property
    def charges(self) -> int:
        """Total increments over all teachers (a hit charging three teachers adds three)."""
        return sum(self._counts)

    def active_teachers(self) -> np.ndarray:
        """The teachers still in the ensemble, as a sorted read-only ``int64`` array of original indices."""
        if self._active_cache is None:
            if self._removed:
                active = np.setdiff1d(np.arange(self._n, dtype=np.int64), np.fromiter(self._removed, np.int64))
            else:
                active = np.arange(self._n, dtype=np.int64)
            active.setflags(write=False)
            self._active_cache = active
        return self._active_cache

    @property
    def removed_teachers(self) -> frozenset:
        """The teachers removed at their limit."""
        if self._removed_cache is None:
            self._removed_cache = frozenset(self._removed)
        return self._removed_cache

    def _index(self, teacher) -> int:
        teacher = check_int("teacher", teacher, minimum=0)
        if teacher >= self._n:
            raise ValueError(f"teacher index {teacher} is outside [0, {self._n})")
        return teacher

    def is_active(self, teacher) -> bool:
        return self._index(teacher) not in self._removed

    def remaining(self, teacher) -> int | None:
        """Charges teacher ``teacher`` can still take (``None`` without a limit)."""
        count = self._counts[self._index(teacher)]
        return None if self._limit_value is None else max(0, self._limit_value - count)

    def teacher_epsilon(self, teacher, delta: float | None = None) -> float:
        """Teacher ``teacher``'s individual epsilon at ``delta`` (default: :attr:`target_delta`)."""
        tau = self._tau(self._counts[self._index(teacher)])
        return 0.0 if tau == 0 else self._tau_epsilon(tau, self.target_delta if delta is None else delta)

    # -- the accountant hooks ----------------------------------------------------------------------------
    def _teacher_list(self, teachers) -> list:
        out = []
        for teacher in teachers:
            if isinstance(teacher, (bool, np.bool_)) or not isinstance(teacher, (int, np.integer)):
                raise TypeError(f"charged teachers must be integer indices, got {teacher!r}")
            teacher = int(teacher)
            if not 0 <= teacher < self._n:
                raise ValueError(f"teacher index {teacher} is outside [0, {self._n})")
            out.append(teacher)
        out.sort()
        return out

    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        cls = self._class_of(charge.event)
        teachers = self._teacher_list(charge.charged_teachers)
        enforce = enforce_budget  # a replayed ledger row was accepted already: no limit checks
        if enforce and self._num_active == 0:
            raise BudgetExhaustedError(
                f"charging {charge.event!r}: no teacher is active (all {self._n} reached the limit {self._limit_value})"
            )
        outcome, count = charge.outcome, charge.count
        hit = outcome is None or outcome == TARGET
        if outcome is None and not teachers:
            charged = [i for i in range(self._n) if i not in self._removed]  # compose: every active teacher
        elif hit:
            charged = teachers
        else:
            charged = []
        if enforce:
            counts, limit = self._counts, self._limit
            for i in charged:
                if counts[i] + count > limit:
                    state = "was removed at" if counts[i] >= limit else f"has {counts[i]} charges of"
                    raise BudgetExhaustedError(
                        f"charging teacher {i} {count} time(s) for {charge.event!r}: it {state} its limit {limit}"
                    )
            if not hit:
                for i in teachers:
                    if counts[i] >= limit:
                        raise BudgetExhaustedError(
                            f"teacher {i} was removed at its limit {limit} and may not take part in {charge.event!r}"
                        )
        obs = (max(self._obs_eps, cls[0]), min(self._obs_q, cls[1]))
        if not do_compose:
            return
        counts, limit, removed = self._counts, self._limit, self._removed
        for i in charged:
            c = counts[i] + count
            counts[i] = c
            if c >= limit and i not in removed:
                self._remove(i)
        if hit:
            self._hits += count
        else:
            self._misses += count
        self._obs_eps, self._obs_q = obs

    def _remove(self, teacher: int) -> None:
        self._removed.add(teacher)
        self._num_active -= 1
        self._active_cache = None
        self._removed_cache = None

    def _worst_case(self, event, count: int = 1) -> Charge:
        """A not-yet-run query charges an unknown set of active teachers: with no set given, every active
        teacher (``compose``'s rule); for one query this is affordable iff some teacher is active."""
        return Charge(event, count)

    def _tau(self, count: int) -> int:
        """The ``tau`` of a teacher with ``count`` charges: ``count``, plus one if a non-target query ran (the
        teacher may have been counted in it: a private draw towards its next charge) unless the teacher is
        at its limit (removed: it takes part in nothing more)."""
        if self._misses == 0 or (self._limit_value is not None and count >= self._limit_value):
            return count
        return count + 1

    def _tau_epsilon(self, tau: int, delta: float) -> float:
        if delta >= 1.0:
            return 0.0
        if delta <= 0.0:
            return math.inf
        eps0, q = self._obs_eps, self._obs_q
        key = (tau, delta, eps0, q)
        eps = self._eps_memo.get(key)
        if eps is None:
            eps = individual_epsilon(tau, eps0, q, delta, relation=self._relation, composition=self._composition)
            self._eps_memo[key] = eps
        return eps

    def _epsilon(self, delta: float) -> float:
        tau = self._tau(max(self._counts))
        return 0.0 if tau == 0 else self._tau_epsilon(tau, delta)

    def spent(self) -> tuple[float, float]:
        """The worst teacher's guarantee so far (class docstring).  **Confidential**: it is a function of
        the per-teacher counters, i.e. of which teachers voted for the candidates (raw data, not a DP
        output).  Keep it out of shareable output (results, logs, the shareable ledger); the run's public
        guarantee is the budget, which the per-teacher limit enforces."""
        if self._tau(max(self._counts)) == 0:
            return 0.0, 0.0
        delta = self.target_delta
        return self._epsilon(delta), delta

    def _get_state(self):
        return (self._counts.copy(), frozenset(self._removed), self._num_active, self._misses, self._hits,
                self._obs_eps, self._obs_q)

    def _set_state(self, data) -> None:
        counts, removed, self._num_active, self._misses, self._hits, self._obs_eps, self._obs_q = data
        self._counts, self._removed = list(counts), set(removed)
        self._active_cache = self._removed_cache = None

    # -- fast paths --------------------------------------------------------------------------------------
    def record(self, release: Release) -> None:
        """Charge one release (class docstring).  In memory (no ledger), a release of a known event class
        whose teachers are all in range and below their limit takes a fast path (a loop over its few charged
        teachers); anything else (a refusal, a new class, a ledger) goes through the contract's
        check-then-commit path, with the same result."""
        self._afforded = None
        if self._ledger is None and type(release) is Release and self._num_active:
            event, last = release.event, self._last_event
            # ``_last_event`` is only set to an event whose class is already covered (within the worst
            # (epsilon, q) charged, or the declared one), so a release of the same class needs no check.
            # Mechanisms build a fresh equal event per release: compare the fields that make the class.
            known = event is last or (
                type(event) is BetweenThresholdsEvent
                and type(last) is BetweenThresholdsEvent
                and event.epsilon == last.epsilon
                and event.q == last.q
                and event.relation == last.relation
            )
            if not known:
                cls = self._class_of(event)
                if cls[0] <= self._obs_eps and cls[1] >= self._obs_q:
                    self._last_event = event
                    known = True
            if known:
                teachers = release.charged_teachers
                counts = self._counts
                n = self._n
                limit = self._limit
                if release.target_hit:
                    # One optimistic pass: increment, and undo (then take the contract path) on a refusal.
                    reached = False
                    for i in teachers:
                        if i >= n or counts[i] >= limit:
                            for j in teachers:
                                if j == i:
                                    break
                                counts[j] -= 1
                            break
                        c = counts[i] + 1
                        counts[i] = c
                        if c >= limit:
                            reached = True
                    else:
                        if reached:
                            for i in teachers:
                                if counts[i] >= limit and i not in self._removed:
                                    self._remove(i)
                        self._hits += 1
                        return
                else:
                    for i in teachers:
                        if i >= n or counts[i] >= limit:
                            break
                    else:
                        self._misses += 1
                        return
        super().record(release)

    def record_outcomes(self, event, target_hit, charged, failed=None, *, outcomes=None) -> None:
        """Charge a vector of ``m`` queries of one ``event`` at once, all or nothing, with exactly the decision
        of recording them one by one in order.

        ``target_hit``: a 1-d boolean array; ``charged``: the charged teachers of each query, either a
        sequence of ``m`` collections of indices or a CSR pair ``(indptr, indices)`` (``indptr`` of length
        ``m + 1``; row ``j`` is ``indices[indptr[j]:indptr[j + 1]]``, without repeats).  Rows of hits are
        charged; other rows list participants (checked active at their position, not charged).  ``failed``
        or ``outcomes`` (optional, as in :meth:`TargetChargingAccountant.record_outcomes`) only set the
        outcome class of non-hit rows in a ledger.  In memory this is vectorised
        (numpy over all rows); with a ledger it writes one row per query (merged runs of empty non-hit rows).
        """
        hit = np.asarray(target_hit)
        if hit.dtype != np.bool_ or hit.ndim != 1:
            raise TypeError(f"target_hit must be a 1-d boolean array, got dtype {hit.dtype} and shape {hit.shape}")
        m = int(hit.size)
        indptr, indices = self._csr(charged, m)
        classes = batch_outcome_classes(hit, failed, outcomes)
        if m == 0:
            return
        self._afforded = None
        if self._ledger is not None:
            self._charge_many(self._batch_charges(event, indptr, indices, classes))
            return
        cls = self._class_of(event)
        n, limit = self._n, self._limit
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            bad = indices[(indices < 0) | (indices >= n)][0]
            raise ValueError(f"teacher index {int(bad)} is outside [0, {n})")
        rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(indptr))
        if indices.size > 1 and not np.all(np.diff(np.sort(rows * n + indices))):
            raise ValueError("a query's charged teachers must not repeat")
        is_hit = hit[rows]
        t_rows, t_idx = rows[is_hit], indices[is_hit]
        counts = np.array(self._counts, dtype=np.int64)
        total = np.bincount(t_idx, minlength=n)
        new = counts + total
        if limit != NO_LIMIT:
            over = np.flatnonzero(new > limit)
            if over.size:
                i = int(over[0])
                raise BudgetExhaustedError(
                    f"charging teacher {i} {int(total[i])} more time(s) for {event!r}: it has {int(counts[i])} of its "
                    f"limit {limit}"
                )
            # When does each teacher that reaches its limit in this batch leave (the row of its last charge)?
            removed_at = np.full(n, m + 1, dtype=np.int64)
            if self._removed:
                removed_at[np.fromiter(self._removed, np.int64)] = -1
            reach = np.flatnonzero((counts < limit) & (new >= limit))
            if reach.size:
                order = np.lexsort((t_rows, t_idx))
                sorted_idx, sorted_rows = t_idx[order], t_rows[order]
                first = np.searchsorted(sorted_idx, reach)
                removed_at[reach] = sorted_rows[first + (limit - counts[reach]) - 1]
            p_rows, p_idx = rows[~is_hit], indices[~is_hit]
            late = removed_at[p_idx] < p_rows
            if late.any():
                j = int(np.flatnonzero(late)[0])
                raise BudgetExhaustedError(
                    f"teacher {int(p_idx[j])} was removed at its limit {limit} and may not take part in query "
                    f"{int(p_rows[j])} of the batch ({event!r})"
                )
            gone = int(np.count_nonzero(removed_at[reach] < m - 1))
            if self._num_active == 0 or self._num_active - gone < 1:
                raise BudgetExhaustedError(f"charging {event!r}: no teacher would be active for the whole batch")
        # Commit (nothing below can fail).
        self._counts = new.tolist()
        for i in np.flatnonzero((new >= limit) & (counts < limit)).tolist() if limit != NO_LIMIT else ():
            if i not in self._removed:
                self._remove(i)
        hits = int(np.count_nonzero(hit))
        self._hits += hits
        self._misses += m - hits
        self._obs_eps, self._obs_q = max(self._obs_eps, cls[0]), min(self._obs_q, cls[1])

    def record_batch(self, batch, charged) -> None:
        """:meth:`record_outcomes` for a mechanism's ``BatchRelease`` (``event``, boolean ``target_hit``,
        optional ``outcomes`` or ``failed``) and the charged teachers of each of its queries."""
        target_hit = getattr(batch, "target_hit", None)
        if target_hit is None:
            raise UnsupportedEventError(
                f"cannot account for a batch of {getattr(batch, 'event', None)!r} without target outcomes"
            )
        self.record_outcomes(batch.event, target_hit, charged, outcomes=batch_outcomes(batch))

    @staticmethod
    def _csr(charged, m: int) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(charged, tuple) and len(charged) == 2 and all(isinstance(a, np.ndarray) for a in charged):
            indptr, indices = (np.asarray(a) for a in charged)
            if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
                raise TypeError("a CSR charged set needs integer indptr and indices")
            indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
            if indptr.shape != (m + 1,) or indptr[0] != 0 or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0):
                raise ValueError(f"indptr must be a non-decreasing array of length {m + 1} from 0 to len(indices)")
            return indptr, indices
        rows = list(charged)
        if len(rows) != m:
            raise ValueError(f"charged must list the charged teachers of each of the {m} queries, got {len(rows)}")
        lengths = np.fromiter((len(r) for r in rows), np.int64, count=m)
        indptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        flat = list(itertools.chain.from_iterable(rows))
        for teacher in flat:
            if isinstance(teacher, (bool, np.bool_)) or not isinstance(teacher, (int, np.integer)):
                raise TypeError(f"charged teachers must be integer indices, got {teacher!r}")
        indices = np.array(flat, dtype=np.int64) if flat else np.zeros(0, dtype=np.int64)
        return indptr, indices

    @staticmethod
    def _batch_charges(event, indptr, indices, classes) -> list:
        charges, run, run_outcome = [], 0, None

        def flush():
            if run:
                charges.append(Charge(event, run, run_outcome))

        for j in range(classes.size):
            teachers = indices[indptr[j] : indptr[j + 1]].tolist()
            outcome = str(classes[j])
            if outcome != TARGET and not teachers:
                if outcome != run_outcome:
                    flush()
                    run, run_outcome = 0, outcome
                run += 1
                continue
            flush()
            run, run_outcome = 0, None
            charges.append(Charge(event, 1, outcome, teachers))
        flush()
        return charges
