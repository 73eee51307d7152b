"""Parallel composition over disjoint groups of records (pate_accountant.accountants.parallel, docs/groups.md).

The claim under test: for every record, the spend the data set's accountant reports bounds the privacy loss of
the one group that record is in, in every run.  Checked by exact enumeration: every interleaving of small
per-group charge sequences, against a fresh accountant that charges one group's sequence alone; and through a
ledger, replay and audit give back the same totals.
"""

from __future__ import annotations

import itertools
import sqlite3

import pytest
from dp_accounting import GaussianDpEvent

from pate_accountant.accountants import (
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
    Charge,
    IndividualChargingAccountant,
    PldAccountant,
    TargetChargingAccountant,
)
from pate_accountant.accountants.parallel import GroupAccountant
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.events import BetweenThresholdsEvent, BoundaryWrapperEvent, EpsilonDeltaEvent
from pate_accountant.ledger import Ledger
from pate_accountant.release import Release

DELTA = 1e-6
E1 = EpsilonDeltaEvent(0.1, 1e-9)
E2 = EpsilonDeltaEvent(0.25, 0.0)


def _interleavings(sequences):
    """Every order of the items of ``sequences`` (lists) that keeps each list's own order: ``(group, item)``."""
    slots = [g for g, seq in enumerate(sequences) for _ in seq]
    seen = set()
    for order in itertools.permutations(slots):
        if order in seen:
            continue
        seen.add(order)
        positions = [0] * len(sequences)
        out = []
        for g in order:
            out.append((g, sequences[g][positions[g]]))
            positions[g] += 1
        yield out


@pytest.mark.parametrize("cls", [BasicCompositionAccountant, AdvancedCompositionAccountant, PldAccountant])
def test_groups_pay_the_largest_count_of_each_event(cls):
    acc = cls()
    groups = acc.parallel_groups(3)
    for g, (n1, n2) in enumerate([(3, 0), (1, 2), (2, 1)]):
        groups[g].compose(E1, n1) if n1 else None
        groups[g].compose(E2, n2) if n2 else None
    envelope = cls()
    envelope.compose(E1, 3)
    envelope.compose(E2, 2)
    assert acc.spent() == pytest.approx(envelope.spent(), rel=1e-12)
    # a second block (another run) composes with the first: nothing of it is free
    more = acc.parallel_groups(2)
    more[1].compose(E1, 1)
    envelope.compose(E1, 1)
    assert acc.spent() == pytest.approx(envelope.spent(), rel=1e-12)


@pytest.mark.parametrize("cls", [BasicCompositionAccountant, PldAccountant])
def test_every_interleaving_bounds_each_group_alone(cls):
    """Exact enumeration: two groups, every interleaving of their event sequences; the parent's spend is the
    envelope's, which is at least each group's alone (and equal to the group with the most of every event)."""
    sequences = [[E1, E2, E1], [E2, E2]]
    alone = []
    for seq in sequences:
        single = cls()
        for event in seq:
            single.compose(event)
        alone.append(single.get_epsilon(DELTA))
    results = set()
    for order in _interleavings(sequences):
        acc = cls()
        groups = acc.parallel_groups(2)
        for g, event in order:
            groups[g].compose(event)
        eps = acc.get_epsilon(DELTA)
        assert all(eps >= a * (1 - 1e-12) for a in alone)
        results.add(round(eps, 12))
    assert len(results) == 1  # the order of the groups' charges never matters
    envelope = cls()
    envelope.compose(E1, 2)
    envelope.compose(E2, 2)
    assert results.pop() == pytest.approx(envelope.get_epsilon(DELTA), rel=1e-12)


def _tc_spent(charges, budget=None):
    acc = TargetChargingAccountant(budget=budget)
    for release in charges:
        acc.record(release)
    return acc.charged_tau, acc.queries, acc.spent()


def test_target_charging_every_interleaving_bounds_each_group_alone():
    """Target charging's bound depends on the order (a query after the last hit counts as one more hit) and on
    the number of queries: enumerate every interleaving of two groups' hit/miss sequences, including a group
    that ends on a miss at the largest hit count, and check tau, queries and the spend against each group's
    own sequence."""
    event = BetweenThresholdsEvent(0.05, 1 / 3, "replace-one")
    hit = Release("between", event, target_hit=True)
    miss = Release("below", event, target_hit=False)
    patterns = [[hit, hit, miss], [hit, miss, hit], [miss, hit, hit, miss], [hit, hit]]
    for first, second in itertools.combinations(patterns, 2):
        sequences = [first, second]
        alone = [_tc_spent(seq) for seq in sequences]
        for order in _interleavings(sequences):
            acc = TargetChargingAccountant()
            groups = acc.parallel_groups(2)
            for g, release in order:
                groups[g].record(release)
            for tau, queries, spent in alone:
                assert acc.charged_tau >= tau
                assert acc.queries >= queries
                assert acc.spent()[0] >= spent[0] and acc.spent()[1] >= spent[1]
            assert acc.hits == max(sum(r.target_hit for r in seq) for seq in sequences)


def test_target_charging_trailing_miss_at_the_envelope_is_charged():
    """The order that would under-count if misses shared the envelope: group 0 reaches the largest hit count,
    group 1 has more misses, then group 0 misses.  Group 0 alone has tau = hits + 1; so must the parent."""
    event = BetweenThresholdsEvent(0.05, 1 / 3, "replace-one")
    hit = Release("between", event, target_hit=True)
    miss = Release("below", event, target_hit=False)
    acc = TargetChargingAccountant()
    groups = acc.parallel_groups(2)
    for release in (miss, miss, miss):
        groups[1].record(release)
    groups[0].record(hit)
    groups[0].record(hit)
    groups[0].record(miss)
    assert _tc_spent([hit, hit, miss])[0] == 3
    assert acc.charged_tau >= 3


def test_budget_lets_each_group_spend_it_and_never_more():
    budget = (1.0, DELTA)
    single = BasicCompositionAccountant(budget=budget)
    affordable = 0
    while single.can_afford(E1):
        single.compose(E1)
        affordable += 1
    acc = BasicCompositionAccountant(budget=budget)
    groups = acc.parallel_groups(4)
    for group in groups:
        n = 0
        while group.can_afford(E1):
            group.compose(E1)
            n += 1
        assert n == affordable  # each group gets the whole budget: the others' charges are not its record's
        before = acc.state()
        with pytest.raises(BudgetExhaustedError):
            group.compose(E1)
        assert acc.state() == before  # refused atomically
    assert acc.spent() == pytest.approx(single.spent())
    assert acc.spent()[0] <= budget[0]
    # the next run composes: it can afford nothing more
    assert not acc.parallel_groups(2)[0].can_afford(E1)


def test_register_checks_the_group_before_running():
    calls = []

    class Mech:
        event = E1

        def __call__(self, histogram, rng=None):
            calls.append(1)
            return Release(0, E1)

    acc = BasicCompositionAccountant(budget=(0.25, DELTA))
    groups = acc.parallel_groups(2)
    run0, run1 = groups[0].register(Mech()), groups[1].register(Mech())
    run0([1]), run0([1])
    run1([1]), run1([1])  # free: group 0 paid for two already
    assert acc.spent()[0] == pytest.approx(0.2)
    with pytest.raises(BudgetExhaustedError):
        run1([1])
    assert len(calls) == 4  # refused before the mechanism ran


def test_individual_charging_charges_grouped_releases_as_they_come():
    """Individual charging takes no envelope (its teachers are already disjoint across groups): a grouped
    release is charged exactly as the same release without a group."""
    event = BetweenThresholdsEvent(0.01, 1 / 3, "replace-one")
    releases = [Release("between", event, target_hit=True, charged_teachers=frozenset({0, 1})),
                Release("between", event, target_hit=True, charged_teachers=frozenset({2, 3}))]
    acc = IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=0.01, q=1 / 3)
    assert acc.parallel_composition is None
    groups = acc.parallel_groups(2)
    for g, release in enumerate(releases):
        groups[g].record(release)
    plain = IndividualChargingAccountant(4, budget=(1.0, DELTA), epsilon0=0.01, q=1 / 3)
    for release in releases:
        plain.record(release)
    assert acc.spent() == plain.spent()
    assert acc.state().data[0] == plain.state().data[0]


def test_validation_and_views():
    acc = PldAccountant()
    with pytest.raises(ValueError, match="num_groups"):
        acc.parallel_groups(0)
    groups = acc.parallel_groups(2)
    assert len(groups) == 2 and all(isinstance(g, GroupAccountant) for g in groups)
    with pytest.raises(ValueError, match="group"):
        groups[2]
    with pytest.raises(TypeError, match="no state of its own"):
        groups[0].state()
    with pytest.raises(TypeError, match="do not nest"):
        groups[0].parallel_groups(2)
    with pytest.raises(ValueError, match="group scope"):
        Charge(E1, group=(0, 1))
    with pytest.raises(ValueError, match="group index"):
        Charge(E1, group=(1, -1))
    with pytest.raises(TypeError, match="group must be"):
        Charge(E1, group=3)
    assert groups[0].spent() == acc.spent() and groups[1].budget == acc.budget


def test_ledger_stores_each_groups_charges_and_replays_the_envelope(tmp_path):
    path = tmp_path / "groups.sqlite"
    budget = (2.0, DELTA)
    with Ledger.open(path) as ledger:
        acc = PldAccountant(budget=budget, ledger=ledger)
        with pytest.raises(ValueError, match="begin_run"):
            acc.parallel_groups(2)
        ledger.begin_run({"groups": 3})
        groups = acc.parallel_groups(3)
        with pytest.raises(ValueError, match="already has its groups"):
            acc.parallel_groups(3)
        for g, n in enumerate((4, 2, 5)):
            for _ in range(n):
                groups[g].compose(E1)
        spent = acc.spent()
        rows = list(ledger.rows())
        assert [r.group for r in rows] == [0] * 4 + [1] * 2 + [2] * 5 and {r.run for r in rows} == {1}
        assert ledger.verify().ok
    envelope = PldAccountant(budget=budget)
    envelope.compose(E1, 5)
    assert spent == pytest.approx(envelope.spent(), rel=1e-12)
    with Ledger.open(path, read_only=True) as ledger:  # a fresh accountant replays the rows through the envelope
        again = PldAccountant(budget=budget, ledger=ledger)
        assert again.spent() == spent
        verdict = ledger.verify()
        assert verdict.ok and verdict.spent == pytest.approx(spent)
    with Ledger.open(path) as ledger:  # the next run composes with this one
        acc = PldAccountant(budget=budget, ledger=ledger)
        ledger.begin_run({"groups": 2})
        acc.parallel_groups(2)[1].compose(E1)
        envelope.compose(E1)
        assert acc.spent() == pytest.approx(envelope.spent(), rel=1e-12)


def test_a_row_moved_to_another_group_is_caught(tmp_path):
    path = tmp_path / "groups.sqlite"
    with Ledger.open(path) as ledger:
        acc = BasicCompositionAccountant(ledger=ledger)
        ledger.begin_run({"groups": 2})
        groups = acc.parallel_groups(2)
        groups[0].compose(E1)
        groups[1].compose(E1)
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER charges_append_only_update")
    conn.execute("UPDATE charges SET grp = 0 WHERE id = 2")  # would make the second charge look paid for
    conn.commit()
    conn.close()
    with Ledger.open(path, read_only=True) as ledger:
        verdict = ledger.verify()
        assert not verdict.ok and verdict.first_bad_row == 2


def test_a_ledger_from_before_groups_opens_and_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    with Ledger.open(path) as ledger:
        acc = BasicCompositionAccountant(ledger=ledger)
        acc.compose(E1, 2)
        spent = acc.spent()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE charges DROP COLUMN grp")  # the layout an earlier version wrote
    conn.commit()
    conn.close()
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok and [r.group for r in ledger.rows()] == [None]
        assert BasicCompositionAccountant(ledger=ledger).spent() == spent
    with Ledger.open(path) as ledger:  # writable: the column is added, every hash still holds
        acc = BasicCompositionAccountant(ledger=ledger)
        ledger.begin_run({"groups": 2})
        acc.parallel_groups(2)[1].compose(E2)
        assert ledger.verify().ok
        assert [r.group for r in ledger.rows()] == [None, 1]


def test_gaussian_events_key_the_envelope_by_value():
    acc = PldAccountant()
    groups = acc.parallel_groups(2)
    groups[0].compose(GaussianDpEvent(5.0))
    groups[1].compose(GaussianDpEvent(5.0))  # an equal event built anew: already paid for
    single = PldAccountant()
    single.compose(GaussianDpEvent(5.0))
    assert acc.spent() == single.spent()


def test_wrapper_events_under_target_charging():
    event = BoundaryWrapperEvent(EpsilonDeltaEvent(0.01, 1e-10), epsilon=0.02, q=1 / 3)
    acc = TargetChargingAccountant(budget=(1.0, DELTA))
    groups = acc.parallel_groups(2)
    groups[0].record(Release(None, event, target_hit=True))
    groups[1].record(Release(None, event, target_hit=True))
    groups[1].record(Release(7, event, target_hit=False))
    assert acc.hits == 1 and acc.queries == 2 and acc.charged_tau == 2


def test_audit_reports_each_groups_spend_alone(tmp_path, capsys):
    from pate_accountant.cli import main

    path = tmp_path / "groups.sqlite"
    with Ledger.open(path) as ledger:
        acc = BasicCompositionAccountant(budget=(5.0, DELTA), ledger=ledger)
        ledger.begin_run({"groups": 2})
        groups = acc.parallel_groups(2)
        groups[0].compose(E1, 3)
        groups[1].compose(E2, 1)
        spent = acc.spent()
    with Ledger.open(path, read_only=True) as ledger:
        verdict = ledger.verify()
    assert verdict.ok and verdict.spent == pytest.approx(spent)
    assert spent[0] == pytest.approx(0.3 + 0.25)  # the envelope: 3 x E1 and 1 x E2, each from its costliest group
    (run,) = verdict.runs
    assert run["groups"] == [{"group": 0, "rows": 1, "spent": [pytest.approx(0.3), pytest.approx(3e-9)]},
                             {"group": 1, "rows": 1, "spent": [0.25, 0.0]}]
    assert main(["audit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "groups: 2 groups of records" in out and "0.3, 0.25" in out and "largest count" in out


def test_a_group_is_refused_before_running_when_a_miss_could_not_be_paid():
    """Under target charging a group below the envelope's hits gets its hits free, but a miss is charged as it
    comes (one more charged hit after the last one): when the budget cannot pay that, the group's query must be
    refused before its mechanism runs, whatever the outcome would have been."""
    event = BetweenThresholdsEvent(0.05, 1 / 3, "replace-one")
    acc = TargetChargingAccountant(budget=(2.0, DELTA))
    groups = acc.parallel_groups(2)
    hits = 0
    while groups[0].can_afford(event):
        groups[0].record(Release("between", event, target_hit=True))
        hits += 1
    assert hits == acc.max_hits >= 1
    assert not groups[1].can_afford(event)  # a hit would be free, a miss would be beyond the budget
    calls = []

    def mechanism(histogram, rng=None):
        calls.append(1)
        return Release("below", event, target_hit=False)

    mechanism.event = event
    with pytest.raises(BudgetExhaustedError):  # registration itself refuses: not one query is affordable
        groups[1].register(mechanism)
    assert not calls


def test_audit_prints_the_remaining_budget(tmp_path, capsys):
    from pate_accountant.cli import main

    path = tmp_path / "left.sqlite"
    with Ledger.open(path) as ledger:
        BasicCompositionAccountant(budget=(1.0, DELTA), ledger=ledger).compose(E1, 4)
    assert main(["audit", str(path)]) == 0
    assert "remaining   : epsilon 0.6, delta 9.96e-07 of the budget (epsilon 1, delta 1e-06)" in capsys.readouterr().out
    with Ledger.open(path) as ledger:
        BasicCompositionAccountant(budget=(1.0, DELTA), ledger=ledger).compose(E1, 6)
    assert main(["audit", str(path)]) == 0
    assert "remaining   : none: the budget (epsilon 1, delta 1e-06) is spent" in capsys.readouterr().out


def test_a_groups_vector_of_outcomes_is_charged_as_one_by_one_and_never_refused_after_its_check():
    """Target charging's record_outcomes as a group's: the same state as recording the queries one by one in
    order, for every small pattern, and a batch that can_afford accepted is never refused."""
    import numpy as np

    event = BetweenThresholdsEvent(0.05, 1 / 3, "replace-one")
    for pattern in itertools.product([True, False], repeat=4):
        one, batch = TargetChargingAccountant(budget=(2.0, DELTA)), TargetChargingAccountant(budget=(2.0, DELTA))
        for acc in (one, batch):
            acc.parallel_groups(2)[0].record(Release("between", event, target_hit=True))  # a first run charged a hit
        g_one, g_batch = one.parallel_groups(1)[0], batch.parallel_groups(1)[0]
        for hit in pattern:
            g_one.record(Release("between" if hit else "below", event, target_hit=hit))
        assert g_batch.can_afford(event, len(pattern))
        g_batch.record_outcomes(event, np.array(pattern))
        assert (batch.hits, batch.queries) == (one.hits, one.queries)
        assert batch.spent()[0] >= one.spent()[0] * (1 - 1e-12)  # at least: a free last hit may leave it pending
