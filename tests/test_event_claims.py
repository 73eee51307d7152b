"""An accountant believes no event on its face (the privacy audit of issue 22, items 1 and 2).

* **Claims are checked.**  A q-target event states its own ``(eps0, q)``; target charging and individual
  charging accept it only when a mechanism of its kind can truthfully have that target
  (``pate_accountant.accountants.target_charging.target_class``, docs/tct_and_individual.md, section 1,
  "Claims are checked").  Every BetweenThresholds query has ``q < 1/(1 + e^{eps0})``
  (docs/mechanisms/between_thresholds.md, "The q-target: derivation"), proven here by exact enumeration;
  the attack transcripts charge a hand-built ``BetweenThresholdsEvent(0.02, q=0.99)`` through the real
  accountants.
* **A foreign event is read under the accountant's relation, by the one rule.**  dp-accounting calibrates
  Laplace noise to add/remove-one; under replace-one a histogram-level Laplace is ``2/b``-DP, not ``1/b``
  (exact enumeration below).  Target charging and individual charging refuse a boundary wrapper around it
  under replace-one through ``event_checks.check_native_relation``, the function the composition accountants
  use (docs/accountants.md, "One relation per accountant").

Every refusal is atomic: ``state()``, ``spent()`` and the ledger rows are unchanged, and a registered
mechanism does not run.  Error messages are one line, naming the parameter and the claimed value.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting import dp_event

from mechanisms import BetweenThresholds
from pate_accountant import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    Release,
    UnsupportedEventError,
)
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.event_checks import check_native_relation
from pate_accountant.accountants.individual import IndividualChargingAccountant, individual_epsilon, individual_limit
from pate_accountant.accountants.pld import PldAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant, target_class
from pate_accountant.ledger import Ledger
from pate_accountant.tct import between_thresholds_q_limit, boundary_wrapper_q, tct_epsilon, tct_max_hits
from pate_accountant.testing import CountingMechanism

DELTA = 1e-6
BUDGET = (1.0, DELTA)
AR, RO = "add-remove-one", "replace-one"
#: The issue's forged event: no BetweenThresholds at level 0.02 has q above 1/(1 + e^0.02) = 0.495.
FORGED = BetweenThresholdsEvent(0.02, q=0.99)


def _rows(ledger) -> list:
    return [(row.id, row.event, row.count, row.outcome, row.charged_teachers, row.spent) for row in ledger.rows()]


def _snapshot(acc, ledger=None):
    return acc.state(), acc.spent(), (None if ledger is None else (_rows(ledger), ledger.head_hash))


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


# -- exact: every BetweenThresholds query has q < 1/(1 + e^eps0) -------------------------------------------------
def _cdf(m: int, r: Fraction) -> Fraction:
    """``P[Z <= m]`` for the discrete Laplace law ``P[Z = z] = (1 - r)/(1 + r) r^|z|``."""
    return r ** (-m) / (1 + r) if m < 0 else 1 - r ** (m + 1) / (1 + r)


def _outcomes(c: int, r: Fraction, low: int, high: int) -> list:
    """The exact law of (below, between, above) for the count ``c`` (docs/mechanisms/between_thresholds.md)."""
    below = _cdf(low - c - 1, r)
    upto_high = _cdf(high - c, r)
    return [below, upto_high - below, 1 - upto_high]


def _q_star(p0: list, p1: list, e: Fraction, t: int) -> Fraction:
    """The best q of one pair (mechanisms/qtarget.py), in exact arithmetic."""
    if any(max(x, y) > e * min(x, y) for x, y in zip(p0, p1)):
        return Fraction(0)
    u = p0[t] + sum(abs(p0[y] - p1[y]) * (e if p0[y] > p1[y] else 1) / (e - 1) for y in range(3) if y != t)
    return min(p0[t], p1[t]) / u


@pytest.mark.parametrize("r", [Fraction(1, 2), Fraction(9, 10), Fraction(49, 50), Fraction(99, 100)])
def test_every_between_thresholds_q_is_below_the_limit_by_exact_enumeration(r):
    """For ``r = e^-eps0`` rational, every gap ``g`` from 1 to 40 and every neighbouring pair ``(c, c + 1)``
    around the interval, the certifier's ``q`` (the best of all decompositions) is computed exactly; the
    worst pair gives ``r (1 - r^{g+1}) / (1 + r)``, strictly below the limit ``r / (1 + r) = 1 / (1 + e^eps0)``
    by exactly ``r^{g+2} / (1 + r)``, and increases to it with the gap: a ``q`` at or above the limit is a
    claim no BetweenThresholds query makes."""
    e, limit, low = 1 / r, r / (1 + r), 10
    previous = Fraction(0)
    for gap in range(1, 41):
        high = low + gap
        q = min(_q_star(_outcomes(c, r, low, high), _outcomes(c + 1, r, low, high), e, 1)
                for c in range(low - 12, high + 12))
        assert q == r * (1 - r ** (gap + 1)) / (1 + r)
        assert limit - q == r ** (gap + 2) / (1 + r) > 0
        assert previous < q < limit
        previous = q


@pytest.mark.parametrize("eps0", [0.005, 0.02, 0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("gap_factor", [2.0, 10.0, 1e3, 1e6])
def test_the_check_accepts_every_event_our_mechanism_certifies(eps0, gap_factor):
    """The check costs an honest mechanism nothing: ``BetweenThresholds(eps0, 0, g).event`` is accepted by
    target charging and individual charging for gaps from the smallest allowed to ones where ``r^{g+1}``
    underflows (there the certified ``q`` is the float limit up to the certifier's rounding, never above it)."""
    gap = int(np.ceil(gap_factor / eps0))
    event = BetweenThresholds(eps0, 0, gap).event
    assert event.q <= between_thresholds_q_limit(eps0)
    if gap_factor >= 1e3:
        assert event.q == pytest.approx(between_thresholds_q_limit(eps0), rel=1e-12)
    assert target_class(event).q == event.q
    TargetChargingAccountant().compose(event)
    IndividualChargingAccountant(3).compose(event)


# -- item 1: a hand-built BetweenThresholdsEvent is not trusted ----------------------------------------------------
def test_attack_transcript_forged_q_target_charging():
    """The transcript of the audit: a ``(1, 1e-6)`` budget and ``BetweenThresholdsEvent(0.02, q=0.99)``.  The
    accountant's hit limit is ``tct_max_hits`` of the event's class: the forged ``q`` would buy 131 hits where
    the largest ``q`` of any BetweenThresholds at level 0.02 buys 40, and 131 hits of any real
    BetweenThresholds cost 1.68 by the same bound, 1.68x the budget.  Every entry point refuses the forged
    event before anything changes; the honest run then stops at exactly 40 hits."""
    eps0 = FORGED.epsilon
    honest = BetweenThresholds(eps0, 0, 10**5).event  # the largest q a BetweenThresholds at 0.02 certifies
    limit = between_thresholds_q_limit(eps0)
    assert honest.q <= limit == pytest.approx(0.4950001666600003, rel=1e-15)
    assert honest.q == pytest.approx(limit, rel=1e-12)
    assert tct_max_hits(FORGED.q, eps0, *BUDGET) == 131  # what the forged claim bought before the check
    assert tct_max_hits(limit, eps0, *BUDGET) == tct_max_hits(honest.q, eps0, *BUDGET) == 40
    assert tct_epsilon(131, limit, eps0, DELTA) == pytest.approx(1.6771463, rel=1e-6)
    with Ledger.in_memory() as ledger:
        acc = TargetChargingAccountant(budget=BUDGET, ledger=ledger)
        acc.compose(honest, 10)
        before = _snapshot(acc, ledger)
        mechanism = CountingMechanism(FORGED, lambda e: Release("between", e, target_hit=True))
        for attempt in (
            lambda: acc.compose(FORGED),
            lambda: acc.compose(FORGED, count=5),
            lambda: acc.record(Release("between", FORGED, target_hit=True)),
            lambda: acc.record(Release("below", FORGED, target_hit=False)),
            lambda: acc.record_many([Release("between", honest, target_hit=True), Release("below", FORGED)]),
            lambda: acc.record_outcomes(FORGED, np.array([True, False])),
            lambda: acc.can_afford(FORGED),
            lambda: acc.register(mechanism),
            lambda: acc.max_hits_for(FORGED),
        ):
            with pytest.raises(UnsupportedEventError) as info:
                attempt()
            message = _one_line(info.value)
            assert "claims q = 0.99" in message and "1/(1 + e^eps0) = 0.495" in message, message
            assert _snapshot(acc, ledger) == before
        assert mechanism.calls == 0
        acc.compose(honest, 30)
        assert acc.hits == acc.max_hits == 40
        with pytest.raises(BudgetExhaustedError):
            acc.compose(honest)
        assert acc.spent()[0] <= BUDGET[0]
        assert ledger.verify().ok


def test_a_forged_q_is_refused_on_the_fast_path_and_without_a_budget():
    """The in-memory fast path (a release whose class differs from the last one in ``q`` only) and the
    odometer without a budget (whose report would use the forged ``q``) refuse it too."""
    honest = BetweenThresholds(0.02, 0, 400).event
    for acc in (TargetChargingAccountant(), TargetChargingAccountant(budget=BUDGET)):
        acc.record(Release("between", honest, target_hit=True))
        before = _snapshot(acc)
        forged = BetweenThresholdsEvent(honest.epsilon, q=0.9, relation=honest.relation)
        with pytest.raises(UnsupportedEventError, match="claims q = 0.9"):
            acc.record(Release("between", forged, target_hit=True))
        assert _snapshot(acc) == before
        acc.record(Release("between", honest, target_hit=True))
        assert acc.hits == 2


def test_attack_transcript_forged_q_individual_charging():
    """Individual charging, three ways in: a budget derived from a declared forged ``q`` (the per-teacher
    limit would be 131 instead of 40 under add/remove-one, 31 instead of 4 under replace-one), a forged event
    charged to an accountant with a given limit (its ``spent()`` would be read at ``q = 0.99``), and a forged
    event stronger than an honest declaration.  Each is refused, atomically."""
    eps0, limit = FORGED.epsilon, between_thresholds_q_limit(FORGED.epsilon)
    assert individual_limit(eps0, FORGED.q, *BUDGET, relation=AR) == 131
    assert individual_limit(eps0, limit, *BUDGET, relation=AR) == 40
    assert (individual_limit(eps0, FORGED.q, *BUDGET), individual_limit(eps0, limit, *BUDGET)) == (31, 4)
    assert individual_epsilon(131, eps0, FORGED.q, DELTA, relation=AR) <= 1.0
    assert individual_epsilon(131, eps0, limit, DELTA, relation=AR) > 1.67
    # 1. A budget from a forged declaration.
    for relation in (AR, RO):
        with pytest.raises(ValueError) as info:
            IndividualChargingAccountant(4, budget=BUDGET, epsilon0=eps0, q=FORGED.q, relation=relation)
        message = _one_line(info.value)
        assert message.startswith("q must be <= 1/(1 + e^epsilon0) = 0.495") and message.endswith("got 0.99"), message
    # 2. A given limit, no declaration; 3. an honest declaration.  Both with a ledger.
    honest = BetweenThresholds(eps0, 0, 10**5).event
    for kwargs in (dict(per_teacher_limit=131), dict(budget=BUDGET, epsilon0=eps0, q=honest.q)):
        with Ledger.in_memory() as ledger:
            acc = IndividualChargingAccountant(4, ledger=ledger, **kwargs)
            acc.record(Release("between", honest, target_hit=True, charged_teachers={0, 1}))
            before = _snapshot(acc, ledger)
            mechanism = CountingMechanism(FORGED, lambda e: Release("between", e, target_hit=True))
            for attempt in (
                lambda: acc.compose(FORGED),
                lambda: acc.record(Release("between", FORGED, target_hit=True, charged_teachers={2})),
                lambda: acc.record_many([Release("between", FORGED, target_hit=True, charged_teachers={2})]),
                lambda: acc.record_outcomes(FORGED, np.array([True]), [[3]]),
                lambda: acc.can_afford(FORGED),
                lambda: acc.register(mechanism),
            ):
                with pytest.raises(UnsupportedEventError) as info:
                    attempt()
                assert "claims q = 0.99" in _one_line(info.value)
                assert _snapshot(acc, ledger) == before
            assert mechanism.calls == 0 and acc.counters.tolist() == [1, 1, 0, 0]
            assert ledger.verify().ok
    # In memory, the vectorised path too.
    acc = IndividualChargingAccountant(4, per_teacher_limit=131)
    with pytest.raises(UnsupportedEventError, match="claims q = 0.99"):
        acc.record_outcomes(FORGED, np.array([True, False]), [[0], []])
    assert acc.queries == 0 and acc.spent() == (0.0, 0.0)


def test_wrapper_and_between_thresholds_claims_share_one_check():
    """Target charging and individual charging refuse a forged BetweenThresholds ``q`` with the same message:
    the one check, ``target_class``."""
    messages = []
    for acc in (TargetChargingAccountant(), IndividualChargingAccountant(2)):
        with pytest.raises(UnsupportedEventError) as info:
            acc.compose(FORGED)
        messages.append(str(info.value))
    with pytest.raises(UnsupportedEventError) as info:
        target_class(FORGED)
    assert messages == [str(info.value)] * 2


# -- item 2: a foreign event's calibration is read under the accountant's relation --------------------------------
def test_histogram_laplace_under_replace_one_is_twice_its_add_remove_level_by_exact_enumeration():
    """Laplace noise of scale ``b`` on each count of a histogram (dp-accounting's ``LaplaceDpEvent(b)``, and
    its discrete ``DiscreteLaplaceDpEvent(a, 1)`` with ``a = 1/b``).  The privacy loss of an output ``x`` is
    ``(sum_i |x_i - c'_i| - |x_i - c_i|) / b``: enumerated exactly (rational outputs on a grid through and
    beyond both counts), its largest value is ``1/b`` when one count moves (add/remove-one) and ``2/b``
    when one vote moves from one count to another (replace-one).  Reading ``eps_A = 1/b`` under replace-one
    halves it."""
    b = Fraction(7, 3)
    grid = [Fraction(k, 4) for k in range(-24, 48)]
    c = (3, 5)
    add_remove, replace = (4, 5), (4, 4)  # one count up; one vote from the second token to the first

    def worst(other):
        return max(sum(abs(x - o) - abs(x - n) for x, o, n in zip(xs, c, other)) / b
                   for xs in itertools.product(grid, repeat=2))

    assert worst(add_remove) == 1 / b
    assert worst(replace) == 2 / b


def _laplace_wrapper(b: float = 100.0):
    """The audit's event: a boundary wrapper around dp-accounting's Laplace noise, at the wrapper's level
    ``2 eps_A`` for the add/remove reading ``eps_A = 1/b``."""
    return BoundaryWrapperEvent(dp_event.LaplaceDpEvent(b), epsilon=2.0 / b, q=1 / 3)


FOREIGN = [
    _laplace_wrapper(),
    BoundaryWrapperEvent(dp_event.DiscreteLaplaceDpEvent(0.01, 1), epsilon=0.02, q=1 / 3),
    BoundaryWrapperEvent(dp_event.ComposedDpEvent([dp_event.LaplaceDpEvent(200.0)] * 2), epsilon=0.02, q=1 / 3),
]


def test_attack_transcript_laplace_wrapper_under_replace_one_is_refused():
    """What the old reading admitted: a ``(1, 1e-6)`` budget gave the wrapped ``LaplaceDpEvent(100)`` (read as
    ``eps_A = 0.01``, level 0.02) 20 hits; under replace-one its level is 0.04, where 20 hits cost more than
    the budget.  Now target charging refuses it under replace-one -- with nothing charged yet (a foreign
    event is read under the default, replace-one), after a replace-one query, and with
    ``neighboring_relation="replace-one"`` -- by every entry point, before anything changes."""
    q = boundary_wrapper_q(0.02)
    assert q == 1 / 3 and tct_max_hits(1 / 3, 0.02, *BUDGET) == 20
    assert tct_epsilon(20, q, 0.04, DELTA) > 1.5 * BUDGET[0]
    for keyword, first_query in ((None, False), (None, True), (RO, False)):
        for event in FOREIGN:
            with Ledger.in_memory() as ledger:
                relation = {} if keyword is None else {"neighboring_relation": keyword}
                acc = TargetChargingAccountant(budget=BUDGET, ledger=ledger, **relation)
                if first_query:
                    acc.compose(BetweenThresholds(0.02, 0, 400).event)
                before = _snapshot(acc, ledger)
                mechanism = CountingMechanism(event, lambda e: Release(None, e, target_hit=True))
                for attempt in (
                    lambda: acc.compose(event),
                    lambda: acc.record(Release(None, event, target_hit=True)),
                    lambda: acc.record_many([Release(None, event, target_hit=False)]),
                    lambda: acc.record_outcomes(event, np.array([True, False])),
                    lambda: acc.can_afford(event),
                    lambda: acc.register(mechanism),
                ):
                    with pytest.raises(UnsupportedEventError) as info:
                        attempt()
                    assert "under the 'replace-one' relation" in _one_line(info.value)
                    assert _snapshot(acc, ledger) == before
                assert mechanism.calls == 0


@pytest.mark.parametrize("event", FOREIGN, ids=["laplace", "discrete-laplace", "composed-laplace"])
def test_the_relation_rule_is_the_composition_accountants_own(event):
    """Target charging, individual charging and the composition accountants refuse the same inner event under
    replace-one with the same message, up to the accountant's name (and individual charging's keyword
    ``relation=``): the message of ``event_checks.check_native_relation``, the one function they call."""

    def refusal(call) -> str:
        with pytest.raises(UnsupportedEventError) as info:
            call()
        return _one_line(info.value)

    def expected(who, keyword="neighboring_relation") -> str:
        return refusal(lambda: check_native_relation(event, RO, who=who, keyword=keyword))

    assert refusal(lambda: TargetChargingAccountant().compose(event)) == expected("TargetChargingAccountant")
    assert refusal(lambda: IndividualChargingAccountant(3).compose(event)) == expected(
        "IndividualChargingAccountant", "relation")
    assert refusal(lambda: BasicCompositionAccountant().compose(event)) == expected("BasicCompositionAccountant")
    assert refusal(lambda: PldAccountant().compose(event)) == expected("PldAccountant")
    # Inside a composed event, for individual charging (which charges BetweenThresholds queries only).
    honest = BetweenThresholds(0.02, 0, 400).event
    composed = dp_event.ComposedDpEvent([honest, event])
    assert "under the 'replace-one' relation" in refusal(lambda: IndividualChargingAccountant(3).compose(composed))


def test_under_add_remove_one_the_laplace_wrapper_is_read_at_its_calibration():
    """Under add/remove-one (the keyword, or a first query stated under it) target charging charges the
    wrapped Laplace at ``eps_A = 1/b``: ``k`` hits cost ``tct_epsilon(k, 1/3, 2/b, delta)``; the keyword is
    part of ``config()`` and a ledger replays to the same state.  Individual charging still refuses it (not
    a BetweenThresholds query)."""
    event = _laplace_wrapper(100.0)
    with Ledger.in_memory() as ledger:
        acc = TargetChargingAccountant(budget=BUDGET, ledger=ledger, neighboring_relation=AR)
        assert acc.config()["neighboring_relation"] == AR and acc.neighboring_relation == AR
        acc.compose(event, 5)
        assert acc.spent() == (tct_epsilon(5, 1 / 3, 0.02, DELTA), DELTA)
        again = TargetChargingAccountant(budget=BUDGET, ledger=ledger, neighboring_relation=AR)
        assert again.state() == acc.state()
        assert ledger.verify().ok
        with pytest.raises(UnsupportedEventError, match="'replace-one' relation, but this accountant composes"):
            acc.compose(BetweenThresholds(0.02, 0, 400).event)  # stated under replace-one: not mixed
    first = TargetChargingAccountant()
    first.compose(BetweenThresholds(0.02, 0, 400, relation=AR).event)
    first.compose(event)
    assert first.neighboring_relation == AR and first.hits == 2
    with pytest.raises(UnsupportedEventError, match="BetweenThresholds queries"):
        IndividualChargingAccountant(3, relation=AR).compose(event)
    assert "neighboring_relation" not in TargetChargingAccountant().config()


def test_replace_one_queries_still_charge_as_before():
    """The rule costs honest replace-one queries nothing: our own events (which state their relation) are
    charged as before, and an unbudgeted accountant is fixed to replace-one by its first query."""
    acc = TargetChargingAccountant()
    acc.compose(BoundaryWrapperEvent(EpsilonDeltaEvent(0.01), epsilon=0.02, q=1 / 3), 3)
    acc.compose(BetweenThresholds(0.02, 0, 400).event, 2)
    assert acc.neighboring_relation == RO and acc.hits == 5
