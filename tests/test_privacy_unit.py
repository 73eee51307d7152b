"""The record is the unit of privacy (issue 31, docs/privacy_unit.md).

What is proven here, at record level:

* the placement of records in teachers' slots (``ensembles.data.place_records``) can be coupled, for two data sets
  that differ in one record (added, removed or replaced), so that at most one slot, so one teacher, differs:
  checked exactly, with fractions, on every small case, and the sampler is checked against that exact law;
* nothing that shapes a teacher depends on other records: with the same random draw, changing one record (its
  text, its length past the window, its label) changes only the teachers that hold it, on every path of a run
  (plain, ``--groups``, labels, every ``--long-records`` policy), and the per-record token limit is the same;
* the charges: a replaced record that moves between two label groups is charged for both (an attack transcript
  through the real PLD accountant, against the exact loss of the released tokens computed here), and an added
  record changes one teacher's vote only, so the run's one-step law is within the mechanism's one-vote law.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import attr
import numpy as np
import pytest
from scipy import stats

from ensembles import VoteHistogram
from ensembles.data import place_records
from ensembles.templates import RECORDS
from mechanisms import registry as mechanisms_registry
from mechanisms.audit import law_epsilon
from mechanisms.testing import check_counts_match_law
from pate_accountant.accountants import PldAccountant
from pate_accountant.errors import BudgetExhaustedError
from pate_app import run
from pate_app.spec import RunSpec, SpecError, Task


# -- the placement's exact law ------------------------------------------------------------------------------------
def slot_law(n: int, slots: int) -> dict:
    """The law of ``place_records`` over slot contents: a uniformly random ``min(n, slots)``-subset of the records
    ``0 .. n-1``, each in a uniformly random distinct slot; ``{cells: probability}`` with ``cells[s]`` the record
    in slot ``s`` (or ``None``)."""
    m = min(n, slots)
    weight = Fraction(1, math.comb(n, m) * math.perm(slots, m))
    law = {}
    for chosen in itertools.combinations(range(n), m):
        for where in itertools.permutations(range(slots), m):
            cells = [None] * slots
            for record, slot in zip(chosen, where):
                cells[slot] = record
            law[tuple(cells)] = weight
    return law


def add_coupling(cells: tuple, new: int, n: int):
    """The coupling of an added record ``new`` (the data set had ``n`` records): it joins a uniformly drawn free
    slot; when every slot is taken, it takes each slot with probability ``1 / (n + 1)`` and is left out
    otherwise (reservoir sampling).  Yields ``(cells', probability)``."""
    slots = len(cells)
    if n < slots:
        free = [s for s, cell in enumerate(cells) if cell is None]
        for s in free:
            yield cells[:s] + (new,) + cells[s + 1:], Fraction(1, len(free))
        return
    for s in range(slots):
        yield cells[:s] + (new,) + cells[s + 1:], Fraction(1, n + 1)
    yield cells, Fraction(n + 1 - slots, n + 1)


def teachers_of(cells: tuple, per_teacher: int) -> tuple:
    """Each teacher's records in slot order, as ``place_records`` gives them."""
    return tuple(tuple(c for c in cells[t:t + per_teacher] if c is not None) for t in range(0, len(cells), per_teacher))


CASES = [(n, teachers, k) for teachers, k in [(1, 1), (1, 3), (2, 1), (2, 2), (3, 1), (3, 2), (2, 3)]
         for n in range(0, teachers * k + 3) if teachers * k <= 6 and n <= 6]


@pytest.mark.parametrize("n, teachers, k", CASES)
def test_an_added_or_removed_record_changes_one_slot_under_an_exact_coupling(n, teachers, k):
    """Exact: pushing the law of ``n`` records through the coupling gives the law of ``n + 1`` records (so the
    coupling is one, and read backwards it couples a removal), and every step of it changes at most one slot, so
    at most one teacher's records."""
    slots = teachers * k
    pushed: dict = {}
    for cells, p in slot_law(n, slots).items():
        total = Fraction(0)
        for after, q in add_coupling(cells, n, n):
            assert sum(a != b for a, b in zip(cells, after)) <= 1
            changed = [t for t, (x, y) in enumerate(zip(teachers_of(cells, k), teachers_of(after, k))) if x != y]
            assert len(changed) <= 1
            pushed[after] = pushed.get(after, Fraction(0)) + p * q
            total += q
        assert total == 1
    assert pushed == slot_law(n + 1, slots)


@pytest.mark.parametrize("n, teachers, k", [(3, 2, 2), (5, 2, 2), (4, 3, 1)])
def test_a_replaced_record_keeps_every_other_records_slot(n, teachers, k):
    """Replace-one as remove-then-add: the removal read backwards through the coupling, then the addition; composed
    so that the new record takes the slot the old one left (or is left out when the old one was), the law is the
    law of ``n`` records again and exactly the old record's slot changes.  So a replaced record changes one
    teacher, and one changing its label changes one teacher in its old label's group and one in its new one."""
    slots = teachers * k
    law = slot_law(n, slots)
    old, new = 0, n  # record 0 is replaced by a record named n
    relabelled = {tuple(new if c == old else c for c in cells): p for cells, p in law.items()}
    assert sorted(relabelled.values()) == sorted(slot_law(n, slots).values())
    for cells in law:
        after = tuple(new if c == old else c for c in cells)
        assert sum(a != b for a, b in zip(cells, after)) <= 1


@pytest.mark.parametrize("n, teachers, k", [(3, 2, 2), (4, 2, 2), (6, 2, 2), (3, 3, 1)])
def test_the_sampler_draws_the_exact_law(n, teachers, k):
    law: dict = {}
    for cells, p in slot_law(n, teachers * k).items():
        key = teachers_of(cells, k)
        law[key] = law.get(key, 0.0) + float(p)
    rng = np.random.default_rng(31)
    draws = 40 * len(law)
    counts = Counter(place_records(range(n), teachers, k, rng).parts for _ in range(draws))
    check_counts_match_law(counts, law, what="place_records")


def test_placement_counts_and_validation():
    placed = place_records(range(7), 2, 3, np.random.default_rng(0))
    assert placed.num_teachers == 2 and placed.placed == 6 and placed.dropped == 1
    assert all(len(part) <= 3 for part in placed.parts)
    assert "parts" not in repr(placed)
    assert place_records(range(4), 2, 2, np.random.default_rng(1)).dropped == 0
    with pytest.raises(ValueError, match="records_per_teacher"):
        place_records(range(4), 2, 0, np.random.default_rng(1))
    with pytest.raises(TypeError, match="rng"):
        place_records(range(4), 2, 2, 3)


# -- nothing that shapes a teacher depends on other records -------------------------------------------------------
MARKER = "zanzibarquokka"


def _words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def words_model(monkeypatch):
    """The model's tokenizer is a word counter, its window 80 words, its vocabulary 50 tokens."""
    monkeypatch.setattr(run.tb, "token_window", lambda model: (_words, 80, 50))


def _spec(**kwargs) -> RunSpec:
    values = {"data": "records", "teachers": 6, "budget_epsilon": 300.0, "budget_delta": 1e-4, "max_tokens": 10,
              "mechanism": "gaussian-threshold-argmax", "accountant": "pld", "step_epsilon": 50.0, "template": "records"}
    return RunSpec(**{**values, **kwargs})


def _records(count: int, labels=("a", "b", "c"), words: int = 3) -> list[dict]:
    return [{"text": f"record {i} " + " ".join(["w"] * words), "label": labels[i % len(labels)]}
            for i in range(count)]


def _prompts(spec: RunSpec, records: list[dict], seed: int = 7, template=RECORDS) -> list[list[str]]:
    """Every teacher's whole prompt, group by group, for ``records`` under ``spec`` with a fixed draw (no model
    is loaded: the tokenizer is the word counter of ``words_model``)."""
    task = Task(tuple(records), template, "records", "records", "text")
    spec = run.fit_teachers(spec, task)  # as private_run does: teachers left out are fitted to the data
    plan = run._plan_run(spec, task)
    shown = run._fit_to_window(spec, task, plan, "model", announce=False)
    ensembles = run.run_prompts(shown, spec, plan, np.random.default_rng(seed), template)
    return [[prefix + prompt for prompt in prompts] for prefix, prompts in ensembles]


def _changed(before, after) -> list[tuple[int, int]]:
    return [(g, t) for g, (x, y) in enumerate(zip(before, after)) for t, (p, q) in enumerate(zip(x, y)) if p != q]


PATHS = {
    "plain": {},
    "groups": {"groups": 3},
    "labels": {"label_field": "label", "labels": "a,b,c"},
    "labels-public": {"label_field": "label", "labels": "a,b,c", "labels_public": True},
    "truncate": {"long_records": "truncate"},
    "skip": {"long_records": "skip"},
    "add-remove": {"relation": "add-remove-one", "records_per_teacher": 3},
    "labels-add-remove": {"label_field": "label", "labels": "a,b,c", "relation": "add-remove-one",
                          "records_per_teacher": 3},
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("position", [0, 7, 17])
def test_a_changed_text_changes_only_its_own_teacher(words_model, path, position):
    """Replace one record's text (a long one under truncate and skip, where it is cut or left out): with the same
    random draw, exactly the teacher holding it shows something else; every other prompt is byte-identical."""
    spec = _spec(**PATHS[path])
    records = _records(18)
    before = _prompts(spec, records)
    changed = list(records)
    long = path in ("truncate", "skip")
    changed[position] = {**records[position], "text": f"{MARKER} " + " ".join(["z"] * (60 if long else 2))}
    after = _prompts(spec, changed)
    moved = _changed(before, after)
    assert len(moved) == 1, moved
    g, t = moved[0]
    assert f"record {position} " in before[g][t]
    assert (MARKER in after[g][t]) == (path != "skip")


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("change", ["append", "remove last", "append long"])
def test_an_added_or_removed_record_changes_only_its_own_teacher(words_model, path, change):
    """Add/remove-one at record level, with the same random draws: a record appended to the data set (a long one
    too, cut or skipped on its own) or the last one removed changes the records of at most one teacher, in one
    group; every other teacher's prompt is byte-identical.  The number of places a teacher has is given (it must
    not move with the number of records: under add/remove-one that number is private).  Where a record goes is
    drawn record by record (``place_records``), so the records before it keep their draws; for an added or
    removed record anywhere else the coupling holds in law (the exact tests above)."""
    spec = _spec(**{**PATHS[path], "records_per_teacher": 4})
    records = _records(18)
    before = _prompts(spec, records)
    if change == "remove last":
        after = _prompts(spec, records[:-1])
        gone = f"record {len(records) - 1} "
    else:
        words = 60 if change == "append long" and path in ("truncate", "skip") else 2  # else refused up front
        extra = {"text": f"{MARKER} " + " ".join(["z"] * words), "label": "b"}
        after = _prompts(spec, [*records, extra])
        gone = None
    moved = _changed(before, after)
    assert len(moved) <= 1, moved
    if moved:
        g, t = moved[0]
        assert (gone in before[g][t]) if gone else (MARKER in after[g][t])
    if change == "remove last" and path != "skip":  # every record has a place: its teacher did change
        assert len(moved) == 1


@pytest.mark.parametrize("path", sorted(PATHS))
def test_with_the_teachers_fitted_to_the_data_one_record_still_moves_one_teacher(words_model, path):
    """Issue 32, item 6 made ``--teachers`` default to the data (one per record up to 64 under replace-one, where
    the number of records is public; 64 under add-remove-one, never read from the records).  With ``teachers`` left
    out, a record replaced (replace-one paths) or appended and removed (add-remove-one paths) still changes the
    prompt of at most one teacher in one group, every other prompt byte-identical, and the fitted number of teachers
    is the same on both sides of the pair."""
    spec = _spec(**{**PATHS[path], "teachers": None})
    records = _records(70 if spec.relation == "add-remove-one" else 18)  # at least a record a teacher
    before = _prompts(spec, records)
    if spec.relation == "add-remove-one":
        extra = {"text": f"{MARKER} z z", "label": "b"}
        pairs = [(before, _prompts(spec, [*records, extra])), (before, _prompts(spec, records[:-1]))]
    else:
        changed = list(records)
        changed[7] = {**records[7], "text": f"{MARKER} z z"}
        pairs = [(before, _prompts(spec, changed))]
    for one, other in pairs:
        assert [len(group) for group in one] == [len(group) for group in other]  # the same teachers
        assert len(_changed(one, other)) <= 1
    if spec.relation == "replace-one" and path != "skip":
        assert len(_changed(*pairs[0])) == 1  # the replaced record's own teacher did change
    total = sum(len(group) for group in before)
    assert total == (63 if spec.labels and spec.relation == "add-remove-one" else
                     64 if spec.relation == "add-remove-one" else 18)


@pytest.mark.parametrize("path", ["labels", "labels-public", "labels-add-remove"])
def test_a_template_naming_the_label_still_moves_one_teacher_per_record(words_model, path):
    """Issue 34, lever 2: with ``{label}`` in the header (``labelled-records``) each label's teachers share a prefix
    naming their label, a public word of the task.  A record replaced, appended or removed still changes the
    prompt of at most one teacher in one group, every other prompt byte-identical (the labels' prefixes included),
    and a replaced record's own teacher does change."""
    from ensembles.templates import LABELLED_RECORDS

    spec = _spec(**{**PATHS[path], "template": "labelled-records"})
    records = _records(18)
    before = _prompts(spec, records, template=LABELLED_RECORDS)
    for g, label in enumerate("abc"):
        assert all(p.startswith(f'Here are examples of records labelled "{label}"') for p in before[g])
    changed = list(records)
    changed[7] = {**records[7], "text": f"{MARKER} z z"}
    pairs = [(_prompts(spec, changed, template=LABELLED_RECORDS), True)]
    if spec.relation == "add-remove-one":
        pairs += [(_prompts(spec, [*records, {"text": f"{MARKER} z z", "label": "b"}], template=LABELLED_RECORDS),
                   False), (_prompts(spec, records[:-1], template=LABELLED_RECORDS), False)]
    for after, replaced in pairs:
        moved = _changed(before, after)
        assert len(moved) <= 1, moved
        if replaced:
            (g, t), = moved
            assert "record 7 " in before[g][t] and MARKER in after[g][t]


@pytest.mark.parametrize("labels_public", [False, True])
def test_a_changed_label_changes_only_the_two_label_groups(words_model, labels_public):
    """A record that changes label leaves its label's group and joins another: the third label's teachers are
    byte-identical (each label's records are placed from a random stream of their own), and under replace-one
    with private labels the run charges both groups (``groups_a_record_touches`` 2)."""
    spec = _spec(label_field="label", labels="a,b,c", labels_public=labels_public)
    records = _records(18)
    before = _prompts(spec, records)
    changed = list(records)
    changed[0] = {**records[0], "label": "b"}  # record 0 was "a"
    after = _prompts(spec, changed)
    assert before[2] == after[2]  # label c
    assert any(before[0][t] != after[0][t] for t in range(2)) and any(before[1][t] != after[1][t] for t in range(2))
    plan = run._plan_run(spec, Task(tuple(records), RECORDS, "records", "records", "text"))
    assert (plan.touches, plan.relation) == ((1, "replace-one-within-label") if labels_public else (2, "replace-one"))


def test_the_token_limit_does_not_move_with_the_labels(words_model, capsys):
    """The audit's case: 24 records, 3 labels, 2 teachers per label.  One label change used to move the limit
    from 4 to 5 records per teacher and re-fit 12 of the 23 other records in all 3 labels; the limit now comes
    from public numbers (``records_per_teacher``: 24 records over 6 teachers), so every other record is fitted
    exactly as before."""
    spec = _spec(label_field="label", labels="a,b,c", long_records="truncate")
    records = [{"text": f"record {i} " + " ".join(["w"] * 30), "label": "abc"[i % 3]} for i in range(24)]
    changed = list(records)
    changed[0] = {**records[0], "label": "b"}  # label counts 8/8/8 become 7/9/8
    fitted = []
    for data in (records, changed):
        task = Task(tuple(data), RECORDS, "records", "records", "text")
        plan = run._plan_run(spec, task)
        assert plan.per_teacher == 4
        fitted.append(run._fit_to_window(spec, task, plan, "model", announce=False))
    assert [r["text"] for r in fitted[0][1:]] == [r["text"] for r in fitted[1][1:]]
    assert all(_words(r["text"]) < 32 for r in fitted[0])  # the records were cut: the limit bit


def test_records_per_teacher_comes_from_public_numbers_only():
    assert run.records_per_teacher(None, "replace-one", 24, 6) == 4
    assert run.records_per_teacher(None, "replace-one", 25, 6) == 5
    assert run.records_per_teacher(2, "add-remove-one", 25, 6) == 2
    with pytest.raises(run.RunInputError, match="--records-per-teacher"):
        run.records_per_teacher(None, "add-remove-one", 25, 6)
    with pytest.raises(SpecError, match=r"--relation add-remove-one .* needs --records-per-teacher K"):
        _spec(relation="add-remove-one")
    with pytest.raises(SpecError, match="--labels-public .* needs --label-field and --labels"):
        _spec(labels_public=True)


@pytest.mark.parametrize("relation, labelled, public, expected", [
    ("replace-one", False, False, ("replace-one", 1)),
    ("add-remove-one", False, False, ("add-remove-one", 1)),
    ("replace-one", True, False, ("replace-one", 2)),
    ("replace-one", True, True, ("replace-one-within-label", 1)),
    ("add-remove-one", True, False, ("add-remove-one", 1)),
    ("add-remove-one", True, True, ("add-remove-one", 1)),
])
def test_what_one_record_touches(relation, labelled, public, expected):
    assert run.record_relation(relation, labelled, public) == expected


# -- the charges: attack transcripts through the real accountant -------------------------------------------------
def _binary_composition_delta(p: float, steps: int, epsilon: float) -> float:
    """The exact delta at ``epsilon`` of ``steps`` independent releases of a binary output that is ``0`` with
    probability ``p`` on one data set and ``1 - p`` on the other (both ways; the laws are mirror images, so one
    direction is the other's): the sum over the number ``j`` of zeros of ``max(0, P(j) - e^eps Q(j))``."""
    j = np.arange(steps + 1)
    log_p = stats.binom.logpmf(j, steps, p)
    log_q = stats.binom.logpmf(j, steps, 1 - p)
    return float(np.sum(np.maximum(0.0, np.exp(log_p) - np.exp(epsilon + log_q))))


def _label_run(touches: int):
    """The audit's realisable run: 2 labels, 1 teacher each, ``gaussian-argmax`` (1, 1e-7) over a public top-2
    support, a PLD budget (10, 1e-6); the labels take turns until the budget refuses.  Returns the mechanism, the
    releases of each label group and the epsilon the accountant reports at the budget's delta."""
    mech = mechanisms_registry.build_mechanism("gaussian-argmax", 1.0, 1e-7, run.TEACHER_RELATION)
    accountant = PldAccountant(budget=(10.0, 1e-6))
    groups = accountant.parallel_groups(2, touches=touches)
    steps = [0, 0]
    histogram = VoteHistogram.from_votes([0], 2)
    rng = np.random.default_rng(0)
    try:
        while True:
            for g in (0, 1):
                groups[g].register(mech)(histogram, rng=rng)
                steps[g] += 1
    except BudgetExhaustedError:
        pass
    return mech, steps, accountant.get_epsilon(1e-6)


def test_a_record_moving_between_two_label_groups_is_charged_for_both():
    """The worst pair of the audit's label case: the replaced record makes label a's teacher vote token 0 instead
    of 1 and label b's teacher token 0 instead of 1, so every release of both groups is a step on (1, 0) against
    (0, 1).  The exact loss of all the released tokens (a binomial over the number of zeros) at the reported
    epsilon must stay within the budget's delta.  Charging each label group as if the record were in one of them
    (``touches=1``, what the audit found) exceeds it; charging both (``touches=2``) does not."""
    mech, steps, reported = _label_run(touches=2)
    law = mech.output_distribution(VoteHistogram.from_votes([0], 2)).as_dict()
    p = law[0] / (law[0] + law[1])
    assert reported <= 10.0
    assert _binary_composition_delta(p, sum(steps), reported) <= 1e-6

    mech, steps, reported = _label_run(touches=1)  # the envelope alone: the audit's under-count
    assert reported <= 10.0
    assert _binary_composition_delta(p, sum(steps), reported) > 1e-6


def _teacher_votes(cells: tuple, bits: dict, per_teacher: int) -> tuple:
    """Each teacher votes token 1 when it shows a record whose bit is 1, else token 0."""
    return tuple(int(any(bits[r] for r in part)) for part in teachers_of(cells, per_teacher))


def _run_law(mech, bits: dict, teachers: int, per_teacher: int) -> dict:
    """The exact law of one released token of a run over records ``bits`` (record -> its teacher-swaying bit):
    the mixture, over the placement's exact law, of the mechanism's law on the teachers' histogram."""
    law: dict = {}
    for cells, p in slot_law(len(bits), teachers * per_teacher).items():
        histogram = VoteHistogram.from_votes(list(_teacher_votes(cells, bits, per_teacher)), 2)
        for outcome, q in mech.output_distribution(histogram).as_dict().items():
            law[outcome] = law.get(outcome, 0.0) + float(p) * q
    return law


def test_an_added_record_moves_one_vote_at_most():
    """Add/remove-one of records with ``--records-per-teacher``: the run's exact one-step law on ``D`` and on
    ``D`` plus one record is never further apart (in epsilon at delta 0) than the mechanism's own laws on two
    histograms that differ by one moved vote, for every data set of up to 5 records over 2 teachers of 2 places
    and either bit of the added record; the charge (the mechanism's replace-one event) covers that."""
    mech = mechanisms_registry.build_mechanism("gaussian-argmax", 4.0, 1e-7, run.TEACHER_RELATION)
    teachers, per_teacher = 2, 2
    histograms = [VoteHistogram.from_votes([1] * c + [0] * (teachers - c), 2) for c in range(teachers + 1)]
    laws = [mech.output_distribution(h).as_dict() for h in histograms]
    one_vote = max(law_epsilon(laws[c], laws[c + 1]) for c in range(teachers))
    worst = 0.0
    for n in range(0, 5):
        for bits in itertools.product((0, 1), repeat=n):
            base = dict(enumerate(bits))
            first = _run_law(mech, base, teachers, per_teacher)
            for bit in (0, 1):
                second = _run_law(mech, {**base, n: bit}, teachers, per_teacher)
                worst = max(worst, law_epsilon(first, second))
    assert 0.0 < worst <= one_vote * (1 + 1e-9)


def test_the_ledger_records_the_relation_and_audit_prints_it(tmp_path, capsys):
    """The record-level relation is in each run's metadata and ``audit`` prints it, with the groups a record
    can change; a grouped charge under ``touches=2`` is stored twice over, so replay and audit give the same
    spend."""
    from pate_accountant.accountants import BasicCompositionAccountant
    from pate_accountant.cli import main
    from pate_accountant.events import EpsilonDeltaEvent
    from pate_accountant.ledger import Ledger

    path = tmp_path / "labels.sqlite"
    with Ledger.open(path) as ledger:
        ledger.set_dataset("support")
        accountant = BasicCompositionAccountant(budget=(10.0, 1e-6), ledger=ledger)
        ledger.begin_run({"record_relation": "replace-one", "groups_a_record_touches": 2})
        groups = accountant.parallel_groups(2, touches=2)
        groups[0].compose(EpsilonDeltaEvent(1.0))
        groups[1].compose(EpsilonDeltaEvent(1.0))
        assert accountant.spent()[0] == pytest.approx(2.0)
    assert main(["audit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "privacy unit: one record: replace-one (one record replaced by another" in out
    assert "counted 2 times (a record can change 2 groups" in out
    with Ledger.open(path, read_only=True) as ledger:
        assert BasicCompositionAccountant(budget=(10.0, 1e-6), ledger=ledger).spent()[0] == pytest.approx(2.0)


def test_bad_calls_of_the_new_api_are_one_line_errors_naming_the_parameter():
    """Issue 32, item 5 (raw exceptions of the Python API): a huge slot count is refused before anything is
    allocated, a malformed spend or budget is a TypeError naming it, a block of 10^30 groups is refused."""
    from pate_accountant.accountants import BasicCompositionAccountant, remaining_of

    with pytest.raises(ValueError, match="records_per_teacher"):
        place_records([1, 2], 2, 10 ** 30, np.random.default_rng(0))
    with pytest.raises(ValueError, match="slots"):
        place_records([1, 2], 2 ** 40, 2 ** 20, np.random.default_rng(0))
    huge = place_records([1, 2], 3, 2 ** 40, np.random.default_rng(0))  # drawn without listing every slot
    assert huge.placed == 2 and huge.dropped == 0
    with pytest.raises(TypeError, match="spent must be an"):
        remaining_of("pld", [], (1.0, 1e-6))
    with pytest.raises(ValueError, match="budget delta"):
        remaining_of("basic", (0.5, 0.0), (1.0, -1e-6))
    with pytest.raises(ValueError, match="num_groups"):
        BasicCompositionAccountant().parallel_groups(10 ** 30)


def test_a_budget_that_pays_one_step_but_not_a_labelled_one_is_refused_up_front():
    """A private-label run counts each step twice: a budget that pays for one step but not for two is refused
    before anything is written, not accepted to stop at its first step."""
    mech = mechanisms_registry.build_mechanism("dp-argmax", 2.0, 1e-6, run.TEACHER_RELATION)
    records = _records(12)
    run.check_inputs(records, 4, mech, "basic", (3.0, 1e-5), touches=1)
    with pytest.raises(run.RunInputError, match="cannot pay for a single step"):
        run.check_inputs(records, 4, mech, "basic", (3.0, 1e-5), touches=2)


@pytest.mark.parametrize("relation, records, groups, teachers", [
    ("replace-one", 30, 3, 30),    # the newcomer's 30 labelled records: one teacher per record (was 64: refused)
    ("replace-one", 31, 3, 30),    # a multiple of the labels
    ("replace-one", 201, 1, 64),   # at most 64
    ("replace-one", 200, 3, 63),
    ("replace-one", 7, 2, 6),
    ("replace-one", 2, 3, 3),      # at least one teacher a group (check_inputs then says there are too few records)
    ("add-remove-one", 30, 1, 64),  # the number of records is private: never read
    ("add-remove-one", 30, 3, 63),
])
def test_the_default_teachers_fit_the_data(relation, records, groups, teachers):
    """Issue 32, item 6: ``--teachers`` left out is one teacher per record up to 64 under replace-one (the number of
    records is public there), a multiple of the groups; under add-remove-one it never depends on the records."""
    from pate_app.privacy_unit import default_teachers

    assert default_teachers(relation, records, groups) == teachers
    if relation == "add-remove-one":
        assert {default_teachers(relation, r, groups) for r in (1, 30, 10**6)} == {teachers}


def test_a_run_without_teachers_takes_one_per_record(tmp_path):
    """Through the run's own planning: 30 records in 3 labels and no ``--teachers`` plan 3 groups of 10 teachers
    (the refusal "cannot give 64 teachers a record each" is gone), and the fitted number is what the run records."""
    from pate_app import run
    from pate_app.spec import RunSpec, task_from_records

    records = [{"text": f"message {i}", "label": "abc"[i % 3]} for i in range(30)]
    spec = RunSpec(data="records", label_field="label", labels=("a", "b", "c"), budget_epsilon=10.0, template="records",
                   budget_delta=1e-5, mechanism="dp-argmax", step_epsilon=5.0)
    assert spec.teachers is None
    task = task_from_records(spec, records)
    fitted = run.fit_teachers(spec, task)
    assert fitted.teachers == 30 and fitted.shareable()["model"]["teachers"] == 30
    plan = run._plan_run(fitted, task)
    assert (plan.groups, plan.group_teachers, plan.per_teacher) == (3, 10, 1)
    assert run.fit_teachers(attr.evolve(spec, teachers=12), task).teachers == 12  # a given number is kept


# -- teachers that see the public examples (issue 34, levers 1 and 3) ------------------------------------------------
PUBLIC = "publicword"


def _public_examples(labels=("a", "b", "c"), each: int = 2) -> list[dict]:
    return [{"text": f"{PUBLIC} {label} {i}", "label": label} for label in labels for i in range(each)]


def _seen_prompts(spec: RunSpec, records: list[dict], examples: list[dict], seed: int = 7) -> list[list[str]]:
    """:func:`_prompts` with ``--teachers-see-public``: the examples' block in every group's shared prefix."""
    task = Task(tuple(records), RECORDS, "records", "records", "text")
    spec = run.fit_teachers(spec, task)
    plan = run._plan_run(spec, task)
    blocks = run.teacher_public_blocks(spec, RECORDS, examples, plan.labels, plan.groups)
    shown = run._fit_to_window(spec, task, plan, "model", announce=False, public_blocks=blocks)
    ensembles = run.run_prompts(shown, spec, plan, np.random.default_rng(seed), RECORDS, public_blocks=blocks)
    return [[prefix + prompt for prompt in prompts] for prefix, prompts in ensembles]


@pytest.mark.parametrize("path", ["plain", "groups", "labels", "add-remove"])
@pytest.mark.parametrize("position", [0, 11])
def test_teachers_that_see_the_public_examples_still_move_one_teacher_per_record(words_model, path, position):
    """``--teachers-see-public``: every teacher of a group shows the same public block (with labels, its label's
    examples only) after the header and before its records; a replaced record still changes one teacher's prompt,
    and the placement of the records is the one without the block."""
    spec = _spec(**PATHS[path], public_examples="public.jsonl", teachers_see_public=True)
    examples = _public_examples()
    records = _records(18)
    before = _seen_prompts(spec, records, examples)
    plain = _prompts(attr.evolve(spec, teachers_see_public=False), records)
    labelled = "labels" in PATHS[path]
    for g, (seen_group, plain_group) in enumerate(zip(before, plain)):
        for seen, bare in zip(seen_group, plain_group):
            block = run.public_block(RECORDS, examples, "abc"[g] if labelled else None)
            assert block and seen == RECORDS.header + block + bare[len(RECORDS.header):]
            assert labelled == (seen.count(PUBLIC) == 2)
    changed = list(records)
    changed[position] = {**records[position], "text": f"{MARKER} z z"}
    moved = _changed(before, _seen_prompts(spec, changed, examples))
    assert len(moved) == 1, moved


def test_the_public_block_takes_its_tokens_from_the_records_share(words_model):
    """The records' share of the window is what the public block leaves: a record that fits without it is too long
    with it, refused in one line naming the public examples' tokens (counts only)."""
    spec = _spec(public_examples="public.jsonl", teachers_see_public=True, teachers=2)
    records = _records(2, words=30)
    task = Task(tuple(records), RECORDS, "records", "records", "text")
    plan = run._plan_run(spec, task)
    run._fit_to_window(spec, task, plan, "model", announce=False)  # fits without the block
    block = [" ".join([PUBLIC] * 40)]
    with pytest.raises(run.RunInputError, match=r"40 tokens of public examples") as caught:
        run._fit_to_window(spec, task, plan, "model", announce=False, public_blocks=block)
    assert MARKER not in str(caught.value) and PUBLIC not in str(caught.value)


def test_teachers_see_public_needs_public_examples():
    with pytest.raises(SpecError, match=r"--teachers-see-public .* needs --public-examples"):
        _spec(teachers_see_public=True)


@pytest.mark.parametrize("path", ["plain", "groups", "labels", "add-remove"])
@pytest.mark.parametrize("change", ["append", "remove last"])
def test_with_the_public_block_an_added_or_removed_record_changes_only_its_own_teacher(words_model, path, change):
    """Add/remove-one with ``--teachers-see-public``, the same draws and the teachers' places given: a record
    appended or the last one removed changes at most one teacher's prompt, in one group (the one that held it);
    every other prompt, public block included, is byte-identical."""
    spec = _spec(**{**PATHS[path], "records_per_teacher": 4}, public_examples="public.jsonl", teachers_see_public=True)
    examples = _public_examples(each=1)  # the window of 80 words holds the block and 4 records a teacher
    records = _records(18)
    before = _seen_prompts(spec, records, examples)
    if change == "remove last":
        after = _seen_prompts(spec, records[:-1], examples)
    else:
        after = _seen_prompts(spec, [*records, {"text": f"{MARKER} z z", "label": "b"}], examples)
    moved = _changed(before, after)
    assert len(moved) <= 1, moved
    if change == "remove last":
        assert len(moved) == 1 and f"record {len(records) - 1} " in before[moved[0][0]][moved[0][1]]
    elif moved:
        assert MARKER in after[moved[0][0]][moved[0][1]]
