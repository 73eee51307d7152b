"""A data set's identity survives cleaning and growth (issue 31, item 4; docs/ledger.md, "One budget per data set").

The audit found 7 of 15 trivial variants of one data set opening a fresh budget (a trailing space, a doubled space,
NFD Unicode, a duplicated record, one record added or removed, the same texts read with ``--label-field``).  Here
every one of those variants, and the 8 that were caught already, is charged to the first one's ledger; records
spread over two registered data sets are refused; a data set that grew registers its new records; and the Python
API (``LedgerHome.open_ledger``, ``synthesize``) obeys the same rule, with ``ledger_home=False`` the explicit
opt-out.
"""

from __future__ import annotations

import csv
import json
import sqlite3
import unicodedata

import pytest

from ensembles.data import load_records
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.ledger_home import (
    DataSetIdentity,
    DataSetLedgerError,
    LedgerHome,
    _legacy_fingerprint,
    dataset_fingerprint,
    fingerprint_key,
    normalise_text,
    record_identities,
)
from pate_app import run
from pate_app.spec import RunSpec

TEXTS = [f"Café order {i}: my parcel to Zürich is late" for i in range(8)]
LABELS = ["shipping", "billing"] * 4


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PATE_ACCOUNTANT_CONFIG", str(tmp_path / "config"))
    return LedgerHome(tmp_path / "home")


def test_normalised_texts():
    assert normalise_text("  Hello \t  World\n") == "hello world"
    assert normalise_text(unicodedata.normalize("NFD", "Café")) == normalise_text("Café") == "café"
    assert normalise_text("ＡＢＣ") == "abc"  # full-width letters (NFKC)
    assert normalise_text("ﬁne") == "fine"  # a ligature


def test_identities_are_keyed_and_ignore_labels_and_layout(tmp_path):
    key = fingerprint_key(tmp_path / "config")
    plain = [{"text": t} for t in TEXTS]
    labelled = [{"text": t, "label": label} for t, label in zip(TEXTS, LABELS)]
    assert record_identities(plain, key) == record_identities(labelled, key) == record_identities(TEXTS, key)
    assert record_identities(plain, bytes(32)) != record_identities(plain, key)
    identities = record_identities(plain, key)
    assert len(identities) == 8 and all(len(i) == 32 and "zürich" not in i for i in identities)
    dolly = [{"instruction": t, "context": "", "response": "r", "category": "c"} for t in TEXTS]
    assert record_identities(dolly, key) == identities
    assert record_identities([{"message": t} for t in TEXTS], key, text_key="message") == identities
    identity = DataSetIdentity.of(plain, key)
    assert identity.fingerprint == dataset_fingerprint(labelled, key)
    assert "Zürich" not in repr(identity) and "8 records" in repr(identity)


def _write(path, rows, fmt):
    if fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _variants(tmp_path) -> dict:
    """The 15 variants of the audit, as the records a run loads (the first is the original)."""
    rows = [{"text": t, "label": label} for t, label in zip(TEXTS, LABELS)]

    def load(name, rows, fmt="jsonl", **kwargs):
        path = tmp_path / f"{name}.{fmt}"
        _write(path, rows, fmt)
        return load_records(path, **kwargs).records

    def texts(change):
        return [{"text": change(i, r["text"]), "label": r["label"]} for i, r in enumerate(rows)]

    return {
        "original": load("original", rows),
        "reordered": load("reordered", rows[::-1]),
        "csv": load("csv", rows, "csv"),
        "json array": load("array", rows, "json"),
        "other field name": load("field", [{"body": r["text"]} for r in rows], text_field="body"),
        "labels read": load("labelled", rows, label_field="label"),
        "trailing space": load("trailing", texts(lambda i, t: t + " ")),
        "leading space": load("leading", texts(lambda i, t: "  " + t)),
        "doubled space": load("doubled", texts(lambda i, t: t.replace(" ", "  "))),
        "tab": load("tab", texts(lambda i, t: t.replace(" ", "\t", 1))),
        "NFD": load("nfd", texts(lambda i, t: unicodedata.normalize("NFD", t))),
        "case": load("case", texts(lambda i, t: t.upper() if i == 0 else t)),
        "duplicated record": load("dup", rows + rows[:1]),
        "one record added": load("added", rows + [{"text": "a new record", "label": "billing"}]),
        "one record removed": load("removed", rows[1:]),
    }


def test_fifteen_variants_of_one_data_set_share_one_ledger(home, tmp_path):
    variants = _variants(tmp_path)
    assert len(variants) == 15
    first = run._dataset_ledger(home, variants["original"], "support", None)
    first.register()
    for name, records in variants.items():
        place = run._dataset_ledger(home, records, "support", None)
        assert place.location == first.location, name
        place.register()  # a grown data set registers its new record to the same ledger
        with pytest.raises(run.RunInputError, match="already charged to the ledger .* registered for the data set "
                                                     "'support' on 20"):
            run._dataset_ledger(home, records, "support", tmp_path / f"other-{name}.sqlite")
    # the record added above now belongs to that ledger: a data set of it alone is charged there too
    alone = run._dataset_ledger(home, [{"text": "A NEW   record"}], "just-one", None)
    assert alone.location == first.location


def test_records_spread_over_two_data_sets_are_refused_naming_both(home, tmp_path):
    a = [{"text": f"first data set {i}"} for i in range(4)]
    b = [{"text": f"second data set {i}"} for i in range(4)]
    for name, records in (("a", a), ("b", b)):
        run._dataset_ledger(home, records, name, None).register()
    with pytest.raises(run.RunInputError) as caught:
        run._dataset_ledger(home, a[:2] + b[:1], "mixed", None)
    message = str(caught.value)
    assert "charged to 2 ledgers" in message and "'a'" in message and "'b'" in message
    assert "2 of these 3 records" in message and "1 of these 3 records" in message
    assert "first data set" not in message and "\n" not in message
    # registering them is refused too, and writes nothing
    identity = home.identify(a[:2] + b[:1])
    with pytest.raises(DataSetLedgerError):
        home.register(identity, "mixed", tmp_path / "mixed.sqlite")
    with sqlite3.connect(home.index_path) as conn:
        assert conn.execute("SELECT count(*) FROM datasets WHERE dataset = 'mixed'").fetchone() == (0,)


def test_an_index_from_before_record_identities_keeps_its_data_sets(home, tmp_path):
    """A data set registered by an earlier version (its exact-records fingerprint, no record identities) is still
    found, and its first run here registers its records."""
    records = [{"text": t} for t in TEXTS]
    old = _legacy_fingerprint(records, fingerprint_key())
    home.prepare()
    with sqlite3.connect(home.index_path) as conn:
        conn.execute("CREATE TABLE datasets (fingerprint TEXT PRIMARY KEY, ledger TEXT NOT NULL, dataset TEXT NOT "
                     "NULL, registered REAL NOT NULL)")
        conn.execute("INSERT INTO datasets VALUES (?, ?, 'old', 0)", (old, str(tmp_path / "old.sqlite")))
    place = run._dataset_ledger(home, records, "old", None)
    assert place.location == tmp_path / "old.sqlite"
    place.register()
    grown = run._dataset_ledger(home, records[:3] + [{"text": "new"}], "old", None)
    assert grown.location == tmp_path / "old.sqlite"


def test_three_ledgers_through_the_python_api_are_one_budget(home, tmp_path):
    """The audit's API attack: three ledgers for the same records, each with a budget of 10, spent 30.  Through
    ``LedgerHome.open_ledger`` the same records always get the same ledger, and another location is refused."""
    records = [{"text": t} for t in TEXTS]
    step = EpsilonDeltaEvent(1.0)
    spent = 0.0
    for attempt in range(3):
        with home.open_ledger(records, "support") as ledger:
            accountant = BasicCompositionAccountant(budget=(10.0, 1e-6), ledger=ledger)
            try:
                while True:
                    accountant.compose(step)
                    spent += 1.0
            except BudgetExhaustedError:
                pass
    assert spent == 10.0
    with pytest.raises(DataSetLedgerError, match="already charged to the ledger"):
        home.open_ledger(records[1:] + [{"text": "more"}], "support", location=tmp_path / "second.sqlite")


def test_synthesize_obeys_the_home_and_ledger_home_false_is_the_opt_out(home, tmp_path):
    records = [{"text": t} for t in TEXTS]
    run._dataset_ledger(home, records, "support", None).register()
    with pytest.raises(run.RunInputError, match="already charged to the ledger"):
        run._dataset_ledger(home, records, "support", tmp_path / "mine.sqlite")
    mine = run._dataset_ledger(False, records, "support", tmp_path / "mine.sqlite")
    assert mine.location == tmp_path / "mine.sqlite"
    spec = RunSpec(data="records", budget_epsilon=10.0, budget_delta=1e-6, template="records")
    with pytest.raises(run.RunInputError, match="ledger_home=False .* needs the ledger"):
        run._dataset_ledger(False, records, "support", spec.ledger)
