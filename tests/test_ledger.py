"""The persistent ledger: round trips, tamper detection, atomicity, crashes, concurrent writers, privacy."""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pate_accountant import ledger as ledger_module
from pate_accountant._ledger import chain as ledger_chain
from pate_accountant._ledger import confidential as ledger_confidential
from pate_accountant._ledger import runs as ledger_runs
from pate_accountant._ledger import sqlite_store as ledger_sqlite_store
from pate_accountant.accountants import AdvancedCompositionAccountant, BasicCompositionAccountant
from pate_accountant.accountants.base import Charge
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.cli import main
from pate_accountant.errors import BudgetExhaustedError, UnsupportedEventError
from pate_accountant.events import BetweenThresholdsEvent, EpsilonDeltaEvent, ThresholdPrivacyEvent
from pate_accountant.ledger import (
    Ledger,
    LedgerError,
    LedgerIntegrityError,
    accountant_class,
    accountant_from_config,
    describe_mechanism,
    describe_seed,
)
from pate_accountant.release import Release

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ledger_worker.py")
BUDGET = (1.0, 1e-5)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _releases(n, epsilon=0.05, start=0):
    event = EpsilonDeltaEvent(epsilon, 1e-8)
    outcomes = [("tok", None), (None, None), ("tok", True)]
    out = []
    for i in range(start, start + n):
        value, target = outcomes[i % 3]
        out.append(Release(value, event, target_hit=target, charged_teachers={i % 5, 7}))
    return out


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def filled(path) -> Path:
    """A closed ledger with 6 rows: 3 composes, then a batch of 3 releases (totals stored on every row)."""
    with Ledger.open(path, totals="row") as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for eps in (0.1, 0.05, 0.02):
            accountant.compose(EpsilonDeltaEvent(eps, 1e-7))
        accountant.record_many(_releases(3))
        assert ledger.row_count == 6
    return path


def _verify(path):
    if not Path(path).exists():  # a writer killed before it created the file leaves nothing to check
        return ledger_module.VerificationResult(True, 0, (0.0, 0.0), None, "no file")
    with Ledger.open(path, read_only=True) as ledger:
        return ledger.verify()


def _audit(capsys, path, *extra):
    code = main(["audit", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- raw SQLite tampering ---------------------------------------------------------------------------------


def _raw(path) -> sqlite3.Connection:
    """A plain sqlite3 connection with the append-only triggers dropped (what a tamperer would do)."""
    conn = sqlite3.connect(path, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    return conn


def _rehash(conn, respend=False):
    """Recompute every row's hash (and the head) as a forger would; ``respend`` also recomputes the stored
    spent totals by replaying the rows without a budget."""
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    prev = ledger_module._genesis_hash(meta)
    replay = BasicCompositionAccountant()
    rows = conn.execute(f"SELECT {ledger_module._ROW_COLUMNS} FROM charges ORDER BY id").fetchall()
    for row in rows:
        row = list(row)
        if respend:
            replay.compose(ledger_module._Codec().decode(row[3]), row[4])
            if row[7] is not None:
                row[7], row[8] = replay.spent()
        row[1] = prev
        row[2] = ledger_module._row_hash(prev, row[0], *row[3:])
        conn.execute("UPDATE charges SET prev_hash=?, hash=?, spent_epsilon=?, spent_delta=? WHERE id=?",
                     (row[1], row[2], row[7], row[8], row[0]))
        prev = row[2]
    conn.execute("UPDATE head SET row_count=?, last_hash=? WHERE id=1", (len(rows), prev if rows else None))


def _edit_event_epsilon(conn, row_id, epsilon):
    text = conn.execute("SELECT event FROM charges WHERE id=?", (row_id,)).fetchone()[0]
    data = json.loads(text)
    data["fields"]["epsilon"] = epsilon
    conn.execute("UPDATE charges SET event=? WHERE id=?", (json.dumps(data), row_id))


def _assert_fails_at(capsys, path, row, *words):
    result = _verify(path)
    assert not result.ok
    assert result.first_bad_row == row, result.message
    assert f"row {row}" in result.message
    for word in words:
        assert word in result.message
    code, out, err = _audit(capsys, path)
    assert code == 1
    assert f"row {row}" in err and "FAILED" in out
    code, out, _ = _audit(capsys, path, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["ok"] is False and data["first_bad_row"] == row


# -- round trip -----------------------------------------------------------------------------------------------


def test_round_trip_reopen_replays_the_same_spent(path, capsys):
    with Ledger.open(path) as ledger:
        ledger.set_run_metadata({"mechanism": {"epsilon": 0.05}, "seed": describe_seed(None)})
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1, 1e-7), count=3)
        accountant.record(_releases(1)[0])
        accountant.record_many(_releases(4, start=1))
        spent = accountant.spent()
        assert ledger.row_count == 6
        assert ledger.config == {"kind": "basic", "budget": list(BUDGET)}
    with Ledger.open(path) as ledger:
        fresh = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert fresh.spent() == spent
        rows = list(ledger.rows())
        assert [r.id for r in rows] == list(range(1, 7))
        assert rows[0].count == 3 and rows[0].outcome is None
        assert [r.outcome for r in rows[1:4]] == ["token", "fail", "target"]
        assert all(r.charged_teachers == frozenset() and r.commitment is None for r in rows)  # basic keeps none
        assert rows[-1].spent == spent
        assert ledger.run_metadata == {"mechanism": {"epsilon": 0.05}, "seed": "OS entropy"}
        fresh.compose(EpsilonDeltaEvent(0.01))
        spent = fresh.spent()
    result = _verify(path)
    assert result.ok, result.message
    assert result.rows == 7 and result.spent == spent and result.first_bad_row is None
    assert result.kind == "basic" and result.budget == BUDGET
    assert result.software_version is not None
    code, out, err = _audit(capsys, path)
    assert code == 0 and err == ""
    assert "OK" in out and "basic" in out and "rows        : 7" in out
    code, out, _ = _audit(capsys, path, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True and data["rows"] == 7
    assert data["spent"] == {"epsilon": spent[0], "delta": spent[1]}
    assert data["budget"] == {"epsilon": BUDGET[0], "delta": BUDGET[1]}
    assert data["run_metadata"]["seed"] == "OS entropy"


def test_python_dash_m_audit(filled):
    proc = subprocess.run([sys.executable, "-m", "pate_accountant", "audit", str(filled), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"] == 6


def test_in_memory_ledger_and_accountants_sharing_it():
    with Ledger.in_memory() as ledger:
        a = BasicCompositionAccountant(budget=(0.5, 1e-5), ledger=ledger)
        b = BasicCompositionAccountant(budget=(0.5, 1e-5), ledger=ledger)
        a.compose(EpsilonDeltaEvent(0.3))
        with pytest.raises(BudgetExhaustedError):
            b.compose(EpsilonDeltaEvent(0.3))  # b catches up on a's row first: one budget
        assert b.spent() == (0.3, 0.0)
        b.compose(EpsilonDeltaEvent(0.2))
        a.compose(EpsilonDeltaEvent(0.0))
        assert a.spent() == b.spent() == (0.5, 0.0)
        result = ledger.verify()
        assert result.ok and result.rows == 3


def test_two_connections_in_one_process_share_the_budget(path):
    with Ledger.open(path) as first, Ledger.open(path) as second:
        a = BasicCompositionAccountant(budget=(1.0, 1e-5), ledger=first)
        b = BasicCompositionAccountant(budget=(1.0, 1e-5), ledger=second)
        a.compose(EpsilonDeltaEvent(0.6))
        assert not b.can_afford(EpsilonDeltaEvent(0.6))  # can_afford syncs with the other writer first
        with pytest.raises(BudgetExhaustedError):
            b.compose(EpsilonDeltaEvent(0.6))
        b.compose(EpsilonDeltaEvent(0.4))
        with pytest.raises(BudgetExhaustedError):
            a.compose(EpsilonDeltaEvent(0.1))
        assert a.spent() == b.spent() == (1.0, 0.0)
    assert _verify(path).ok


def test_sync_shows_what_other_writers_spent(path):
    with Ledger.open(path) as first, Ledger.open(path) as second:
        a = BasicCompositionAccountant(budget=(1.0, 1e-5), ledger=first)
        b = BasicCompositionAccountant(budget=(1.0, 1e-5), ledger=second)
        a.compose(EpsilonDeltaEvent(0.7))
        assert b.spent() == (0.0, 0.0)  # stale until it syncs
        second.sync(b)
        assert b.spent() == (0.7, 0.0)
        assert not b.can_afford(EpsilonDeltaEvent(0.5))
        a.compose(EpsilonDeltaEvent(0.2))
        assert not b.can_afford(EpsilonDeltaEvent(0.2))  # can_afford syncs with other writers itself
        assert b.spent() == pytest.approx((0.9, 0.0))
        second.sync(b)  # idempotent
        assert b.spent() == pytest.approx((0.9, 0.0))


def test_attach_requires_an_equal_config(filled):
    with Ledger.open(filled) as ledger:
        with pytest.raises(ValueError, match="budget"):
            BasicCompositionAccountant(budget=(2.0, 1e-5), ledger=ledger)
        with pytest.raises(ValueError, match="budget"):
            BasicCompositionAccountant(ledger=ledger)
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        with pytest.raises(ValueError, match="already attached"):
            ledger.attach(accountant)


def test_read_only_ledger_replays_but_refuses_charges(filled):
    with Ledger.open(filled, read_only=True) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert accountant.spent() == pytest.approx((0.32, 3e-7 + 3e-8))
        with pytest.raises(LedgerError, match="read-only"):
            accountant.compose(EpsilonDeltaEvent(0.01))
        assert ledger.row_count == 6


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Ledger.open(tmp_path / "missing.db", read_only=True)
    with pytest.raises(FileNotFoundError):
        Ledger.open(tmp_path / "no" / "such" / "folder.db")
    with pytest.raises(ValueError, match="synchronous"):
        Ledger.open(tmp_path / "x.db", synchronous="OFF")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an sqlite file at all " * 100)
    with pytest.raises(LedgerError):
        Ledger.open(garbage)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not a pate-accountant ledger"):
        Ledger.open(other)


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


@pytest.mark.parametrize("kind", ["foreign-sqlite", "foreign-meta-table", "not-sqlite"])
def test_a_file_that_is_not_a_ledger_is_never_written(tmp_path, kind):
    """Another application's database (even one with its own ``meta`` table) or a non-SQLite file: refused in
    one line naming the path, before any write: the folder holds the same files with the same bytes after
    (no WAL switch, no journal, no -wal/-shm files), also as the confidential file of a new ledger."""
    folder = tmp_path / "data"
    folder.mkdir()
    other = folder / "app.db"
    if kind == "not-sqlite":
        other.write_bytes(b"name,salary\nalice,100\n" * 50)
    else:
        conn = sqlite3.connect(other)
        conn.execute("CREATE TABLE meta (key, value)" if kind == "foreign-meta-table" else "CREATE TABLE people (x)")
        conn.execute("INSERT INTO " + ("meta VALUES (1, 2)" if kind == "foreign-meta-table" else "people VALUES (1)"))
        conn.commit()
        conn.close()
    before = _files(folder)
    with pytest.raises(LedgerError, match="not a pate-accountant ledger") as caught:
        Ledger.open(other)
    assert str(other) in str(caught.value) and "\n" not in str(caught.value)
    assert _files(folder) == before
    if kind == "not-sqlite":
        return
    ledger = Ledger.open(tmp_path / "new.sqlite", confidential=other)
    with pytest.raises(LedgerError, match="not a confidential ledger file"):
        IndividualChargingAccountant(4, per_teacher_limit=2, epsilon0=0.5, q=0.5, ledger=ledger)
    ledger.close()
    assert _files(folder) == before


def test_a_folder_or_an_unwritable_ledger_gives_one_line_naming_the_path(tmp_path, monkeypatch):
    with pytest.raises(LedgerError, match="is a folder") as caught:
        Ledger.open(tmp_path)
    assert str(tmp_path) in str(caught.value)
    with pytest.raises(LedgerError, match="is a folder"):
        Ledger.open(tmp_path, read_only=True)
    # A read-only file or folder (simulated: the tests may run as root, whom permissions do not stop): SQLite
    # refuses the first write, and the error names the path instead of surfacing an OperationalError.
    path = tmp_path / "ro.sqlite"
    Ledger.open(path).close()

    def refuse(where):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(ledger_sqlite_store, "_set_wal", lambda conn, where: refuse(where))
    with pytest.raises(LedgerError, match="cannot write the ledger at") as caught:
        Ledger.open(path)
    assert str(path) in str(caught.value) and "read_only=True" in str(caught.value)
    monkeypatch.undo()
    with Ledger.open(path, read_only=True) as ledger:  # reading it still works
        assert ledger.row_count == 0


def test_audit_usage_errors(tmp_path, capsys):
    code, _, err = _audit(capsys, tmp_path / "missing.db")
    assert code == 2 and "no ledger file" in err
    assert main(["audit"]) == 2
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an sqlite file at all " * 100)
    code, out, err = _audit(capsys, garbage)
    assert code == 3 and "CANNOT CHECK" in out and "cannot check" in err  # not "does not verify"


def test_empty_ledger_verifies(path, capsys):
    Ledger.open(path).close()
    result = _verify(path)
    assert result.ok and result.rows == 0 and result.kind is None
    code, out, _ = _audit(capsys, path)
    assert code == 0 and "none attached" in out


# -- tampering --------------------------------------------------------------------------------------------


def test_append_only_triggers_refuse_edits(filled):
    conn = sqlite3.connect(filled, isolation_level=None)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE charges SET count = 2 WHERE id = 3")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM charges WHERE id = 6")
    with pytest.raises(sqlite3.DatabaseError, match="frozen"):
        conn.execute("UPDATE meta SET value = '[5.0, 1e-05]' WHERE key = 'config'")
    conn.close()
    assert _verify(filled).ok


def test_edited_event_is_named(filled, capsys):
    with _raw(filled) as conn:
        _edit_event_epsilon(conn, 3, 0.001)
    conn.close()
    _assert_fails_at(capsys, filled, 3, "edited")


def test_edited_count_is_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET count = 2 WHERE id = 2")
    conn.close()
    _assert_fails_at(capsys, filled, 2, "edited")


def test_edited_outcome_is_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET outcome = 'token' WHERE id = 5")
    conn.close()
    _assert_fails_at(capsys, filled, 5, "edited")


def test_dropped_middle_row_is_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("DELETE FROM charges WHERE id = 4")
    conn.close()
    _assert_fails_at(capsys, filled, 4, "missing")


def test_dropped_and_renumbered_rows_are_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("DELETE FROM charges WHERE id = 4")
    conn.execute("UPDATE charges SET id = id - 1 WHERE id > 4")
    conn.close()
    _assert_fails_at(capsys, filled, 4)


def test_swapped_row_contents_are_named(filled, capsys):
    conn = _raw(filled)
    cols = [c for c in ledger_module._ROW_COLUMNS.split(", ") if c != "id"]
    two = conn.execute(f"SELECT {', '.join(cols)} FROM charges WHERE id = 2").fetchone()
    three = conn.execute(f"SELECT {', '.join(cols)} FROM charges WHERE id = 3").fetchone()
    setter = ", ".join(f"{c} = ?" for c in cols)
    conn.execute(f"UPDATE charges SET {setter} WHERE id = 2", three)
    conn.execute(f"UPDATE charges SET {setter} WHERE id = 3", two)
    conn.close()
    _assert_fails_at(capsys, filled, 2, "does not follow")


def test_swapped_row_ids_are_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET id = 100 WHERE id = 2")
    conn.execute("UPDATE charges SET id = 2 WHERE id = 3")
    conn.execute("UPDATE charges SET id = 3 WHERE id = 100")
    conn.close()
    _assert_fails_at(capsys, filled, 2)


def test_truncated_last_row_is_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("DELETE FROM charges WHERE id = 6")
    conn.close()
    _assert_fails_at(capsys, filled, 6, "missing", "head")


def test_edited_head_is_detected(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE head SET row_count = 5")
    conn.close()
    result = _verify(filled)
    assert not result.ok and "head" in result.message
    assert _audit(capsys, filled)[0] == 1


def test_edited_spent_values_are_named(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET spent_epsilon = 0.0 WHERE id = 3")
    conn.close()
    _assert_fails_at(capsys, filled, 3, "edited")


def test_totals_disagree_even_when_the_chain_is_forged(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET spent_epsilon = spent_epsilon - 0.05 WHERE id >= 4")
    _rehash(conn)
    conn.close()
    _assert_fails_at(capsys, filled, 4, "totals disagree")


def test_forged_count_is_caught_by_the_totals(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE charges SET count = 3 WHERE id = 2")
    _rehash(conn)  # hashes recomputed, stored totals left as they were
    conn.close()
    _assert_fails_at(capsys, filled, 2, "totals disagree")


def test_forged_ledger_beyond_the_budget_is_named(filled, capsys):
    conn = _raw(filled)
    _edit_event_epsilon(conn, 5, 2.0)
    _rehash(conn, respend=True)  # a fully consistent forgery: only the budget check can catch it
    conn.close()
    _assert_fails_at(capsys, filled, 5, "exceeds the budget")


def test_edited_metadata_is_caught_at_row_one(filled, capsys):
    conn = _raw(filled)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps({"kind": "basic", "budget": [0.05, 1e-5]}),))
    conn.close()
    _assert_fails_at(capsys, filled, 1, "metadata")


def test_a_writer_refuses_a_tampered_ledger(filled):
    conn = _raw(filled)
    conn.execute("DELETE FROM charges WHERE id = 6")
    conn.close()
    with Ledger.open(filled) as ledger:
        with pytest.raises(LedgerIntegrityError) as info:
            BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert info.value.row == 6
        assert ledger.row_count == 6


def test_totals_once_per_transaction(path, capsys):
    with pytest.raises(ValueError, match="totals"):
        Ledger.in_memory(totals="sometimes")
    with pytest.raises(ValueError, match="totals"):
        Ledger.open(path.with_name("other.db"), totals="sometimes")
    assert not path.with_name("other.db").exists()
    with Ledger.open(path) as ledger:  # the default: totals on each transaction's last row
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.record_many(_releases(4))
        accountant.compose(EpsilonDeltaEvent(0.1))
        accountant.record_many(_releases(3))
        spent = accountant.spent()
        stored = [row.spent for row in ledger.rows()]
    assert [s is not None for s in stored] == [False, False, False, True, True, False, False, True]
    assert stored[-1] == spent
    with Ledger.open(path, totals="row") as ledger:  # a writer storing every row's totals may join
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert accountant.spent() == spent
        accountant.record_many(_releases(2))
    result = _verify(path)
    assert result.ok and result.rows == 10, result.message
    assert _audit(capsys, path)[0] == 0


def test_totals_once_per_transaction_tampering(path, capsys):
    with Ledger.open(path, totals="transaction") as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.record_many(_releases(3))
        accountant.record_many(_releases(3))
    conn = _raw(path)
    conn.execute("UPDATE charges SET count = 2 WHERE id = 2")
    _rehash(conn)
    conn.close()
    _assert_fails_at(capsys, path, 3, "totals disagree")  # named at the transaction's last row
    conn = _raw(path)
    conn.execute("UPDATE charges SET count = 1 WHERE id = 2")
    conn.execute("DELETE FROM charges WHERE id = 6")
    _rehash(conn)  # a forger dropping a transaction's last row and fixing the chain and the head
    conn.close()
    _assert_fails_at(capsys, path, 5, "no spent totals")


# -- atomicity ---------------------------------------------------------------------------------------------


def _state(ledger, accountant):
    return ledger.row_count, ledger.head_hash, accountant.spent()


def test_budget_refusal_changes_nothing(path):
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=(0.25, 1e-5), ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1))
        accountant.compose(EpsilonDeltaEvent(0.1))
        before = _state(ledger, accountant)
        with pytest.raises(BudgetExhaustedError):
            accountant.compose(EpsilonDeltaEvent(0.1))
        assert _state(ledger, accountant) == before
        with pytest.raises(BudgetExhaustedError):
            accountant.record_many(_releases(2, epsilon=0.02) + _releases(1, epsilon=0.1))
        assert _state(ledger, accountant) == before
        with pytest.raises(BudgetExhaustedError):
            accountant.compose(EpsilonDeltaEvent(0.01, 2e-5))
        assert _state(ledger, accountant) == before
        accountant.compose(EpsilonDeltaEvent(0.05))
        assert ledger.row_count == 3
    assert _verify(path).ok


def test_unsupported_event_changes_nothing(path):
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1))
        before = _state(ledger, accountant)
        with pytest.raises(UnsupportedEventError):
            accountant.compose(ThresholdPrivacyEvent(5))
        bad = Release("tok", ThresholdPrivacyEvent(5))
        with pytest.raises(UnsupportedEventError):
            accountant.record_many(_releases(2) + [bad])
        with pytest.raises(TypeError):
            accountant.record_many(_releases(1) + ["not a release"])
        assert _state(ledger, accountant) == before
    assert _verify(path).rows == 1


def test_exception_inside_a_transaction_rolls_back(path):
    """The ledger's write transaction is storage: an exception anywhere inside it leaves no row, and an
    accountant whose charge fails after it was applied (here when its row is written) takes it back."""
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1))
        before, state = _state(ledger, accountant), accountant.state()
        with pytest.raises(RuntimeError, match="boom"):
            with ledger.transaction(accountant) as transaction:
                transaction.append(Charge(EpsilonDeltaEvent(0.2)))
                raise RuntimeError("boom")
        assert _state(ledger, accountant) == before and not transaction.committed
        # append takes one Charge; an empty block writes nothing
        with ledger.transaction(accountant) as transaction, pytest.raises(TypeError, match="one Charge"):
            transaction.append([Charge(EpsilonDeltaEvent(0.2))])
        assert _state(ledger, accountant) == before
        with pytest.raises(RuntimeError, match="over"):
            transaction.append(Charge(EpsilonDeltaEvent(0.2)))
        accountant.spent = lambda: (math.nan, 0.0)  # the total of the new row cannot be stored
        with pytest.raises(ValueError, match="NaN"):
            accountant.compose(EpsilonDeltaEvent(0.2))
        del accountant.spent
        assert _state(ledger, accountant) == before and accountant.state() == state
        accountant.compose(EpsilonDeltaEvent(0.1))
    assert _verify(path).ok


def test_not_attached_and_nested_transactions(path):
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        with pytest.raises(RuntimeError, match="not attached"):
            with ledger.transaction(BasicCompositionAccountant(budget=BUDGET)):
                pass
        with ledger.transaction(accountant):
            with pytest.raises(RuntimeError, match="already open"):
                with ledger.transaction(accountant):
                    pass
        accountant.compose(EpsilonDeltaEvent(0.1))
        assert ledger.row_count == 1


# -- transactions per charged step ---------------------------------------------------------------------------


class _TransactionCounter:
    """Counts the SQLite transactions of every connection opened while installed, per file: ``BEGIN`` (a
    read), ``BEGIN IMMEDIATE`` (a write), and any statement run outside a transaction (an implicit read)."""

    def __init__(self, monkeypatch):
        self.counts = {}
        real = sqlite3.connect

        def connect(database, *args, **kwargs):
            conn = real(database, *args, **kwargs)
            role = "confidential" if str(database).endswith(ledger_module.CONFIDENTIAL_SUFFIX) else "shareable"
            is_open = [False]

            def trace(sql):
                text = sql.strip().upper()
                if not text or text.startswith("--"):
                    return
                if text.startswith("BEGIN"):
                    self._add(role, "write" if "IMMEDIATE" in text else "read")
                    is_open[0] = True
                elif text.startswith(("COMMIT", "ROLLBACK")):
                    is_open[0] = False
                elif not is_open[0]:
                    self._add(role, "read")

            conn.set_trace_callback(trace)
            return conn

        monkeypatch.setattr(sqlite3, "connect", connect)

    def _add(self, role, kind):
        self.counts[role, kind] = self.counts.get((role, kind), 0) + 1

    def take(self) -> dict:
        counts, self.counts = self.counts, {}
        return counts


class _Mechanism:
    def __init__(self, event):
        self.event = event

    def __call__(self, *args, **kwargs):
        return Release("tok", self.event)


def test_a_charged_step_costs_one_read_and_one_write_transaction(path, monkeypatch):
    """A generation step (``can_afford``, then a registered mechanism: its pre-run check, the run, the
    record) reads the ledger once and writes it once, whether or not another writer appended rows since
    (the catch-up then happens inside those two transactions); a plain charge writes once and reads nothing."""
    counter = _TransactionCounter(monkeypatch)
    event = EpsilonDeltaEvent(0.01, 1e-9)
    with Ledger.open(path) as first, Ledger.open(path) as second:
        a = BasicCompositionAccountant(budget=BUDGET, ledger=first)
        b = BasicCompositionAccountant(budget=BUDGET, ledger=second)
        run_a, run_b = a.register(_Mechanism(event)), b.register(_Mechanism(event))
        counter.take()
        for _ in range(5):  # alone
            assert a.can_afford(event)
            run_a()
            assert counter.take() == {("shareable", "read"): 1, ("shareable", "write"): 1}
        for _ in range(5):  # taking turns: each step catches up on the other writer's row
            for acc, run in ((b, run_b), (a, run_a)):
                assert acc.can_afford(event)
                run()
                assert counter.take() == {("shareable", "read"): 1, ("shareable", "write"): 1}
        run_a()  # without can_afford: the pre-run check reads once
        assert counter.take() == {("shareable", "read"): 1, ("shareable", "write"): 1}
        b.compose(event)  # catches up on a's row inside its write transaction
        assert counter.take() == {("shareable", "write"): 1}
        a.record_many([Release("tok", event)] * 5)
        assert counter.take() == {("shareable", "write"): 1}
        second.sync(b)
        assert a.spent() == b.spent() and first.row_count == 22
    assert _verify(path).ok


def test_a_confidential_charged_step_costs_one_transaction_per_file(path, monkeypatch):
    from pate_accountant.accountants import IndividualChargingAccountant

    counter = _TransactionCounter(monkeypatch)
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(path) as first, Ledger.open(path) as second:
        a = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=first)
        b = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=second)
        counter.take()
        for i in range(6):
            acc = (a, b)[i % 2]
            assert acc.can_afford(event)
            acc.record(Release("between", event, target_hit=True, charged_teachers={i, i + 1}))
            counts = counter.take()
            assert counts[("shareable", "read")] == 1 and counts.get(("confidential", "read"), 0) <= 1
            assert counts[("shareable", "write")] == counts[("confidential", "write")] == 1
            assert sum(counts.values()) <= 4
        first.sync(a)
        assert a.counters.tolist() == b.counters.tolist()
    assert _verify(path).ok


# -- run metadata and what is never stored -------------------------------------------------------------


def test_run_metadata_is_json_and_frozen_after_the_first_row(path):
    from mechanisms.threshold import ThresholdWeightedSampling

    with Ledger.open(path) as ledger:
        with pytest.raises(TypeError):
            ledger.set_run_metadata(["not", "a", "dict"])
        with pytest.raises(TypeError):
            ledger.set_run_metadata({"seed": object()})
        with pytest.raises(TypeError):
            ledger.set_run_metadata({1: "non-string key"})
        with pytest.raises(ValueError):
            ledger.set_run_metadata({"epsilon": math.nan})
        metadata = {"mechanism": describe_mechanism(ThresholdWeightedSampling(threshold=3, gamma=2.0)),
                    "seed": describe_seed(1234)}
        assert metadata["mechanism"]["parameters"] == {"threshold": 3, "gamma": 2.0}
        assert metadata["seed"] == "seeded"  # never the value
        for bad in ({"seed": 1}, {"run": {"Seed": 7.0}}, {"seeds": [1, 2]}):  # seeds never reach the file
            with pytest.raises(ValueError, match="never stores seeds") as caught:
                ledger.set_run_metadata(bad)
            assert "7" not in str(caught.value) and ": 1" not in str(caught.value)
        ledger.set_run_metadata({"seeded": True})
        ledger.set_run_metadata(metadata)  # replaceable before the first row
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1))
        ledger.set_run_metadata(metadata)  # a joining process may repeat it
        with pytest.raises(ValueError, match="before the first charge"):
            ledger.set_run_metadata({"seeded": False})
        assert ledger.run_metadata == metadata
    with pytest.raises(TypeError):
        describe_seed("42")
    assert describe_seed(None) == "OS entropy"
    assert _verify(path).ok


def test_no_released_value_or_prompt_reaches_the_file(path):
    token, prompt = "TOKEN-MARKER-8f3e1c", "PROMPT-MARKER-71ab90"
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        event = EpsilonDeltaEvent(0.01)
        releases = [Release(token, event, info={"prompt": prompt, "noisy_count": 12.5}),
                    Release(None, event, info={"context": prompt}),
                    Release(f"{token}-2", event, target_hit=True, charged_teachers={1})]
        accountant.record_many(releases)
        accountant.record(Release(token, event, info={"prompt": prompt}))
        files = sorted(path.parent.glob(path.name + "*"))
        blobs = b"".join(f.read_bytes() for f in files)  # database, WAL and shared-memory files
    blobs += path.read_bytes()
    assert len(blobs) > 0
    for marker in (token, prompt, "noisy_count"):
        assert marker.encode() not in blobs
    with Ledger.open(path, read_only=True) as ledger:
        rows = list(ledger.rows())
    assert [r.outcome for r in rows] == ["token", "fail", "target", "token"]


# -- every accountant kind ---------------------------------------------------------------------------------


def _accountant_classes():
    """Every registered accountant (pate_accountant.registry: the table the ledger rebuilds from)."""
    from pate_accountant import registry

    return [registry.accountant_class(kind) for kind in registry.accountant_names()]


#: Constructor arguments some accountants require, and events to try in turn (the first one accepted is used).
REQUIRED_ARGUMENTS = {"num_teachers": 10}
#: Per-kind constructor arguments and events (individual charging needs eps0 and q with a budget, and
#: accounts only BetweenThresholds events at that eps0).
_Q = -math.expm1(-0.02 * 151) / (1.0 + math.exp(0.02))  # BetweenThresholds' discrete q at eps0 0.02, gap 150
KIND_SETUP = {"individual-charging": ({"epsilon0": 0.02, "gap": 150, "relation": "add-remove-one",
                                       "budget": (1.0, 1e-6)},
                                      (BetweenThresholdsEvent(0.02, q=_Q, relation="add-remove-one"),))}
CANDIDATE_EVENTS = (EpsilonDeltaEvent(0.1, 1e-6), EpsilonDeltaEvent(0.1), BetweenThresholdsEvent(0.1, q=0.1))


def _construct(cls, **kwargs):
    parameters = inspect.signature(cls).parameters
    for name, parameter in parameters.items():
        if parameter.default is inspect.Parameter.empty and parameter.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if name not in REQUIRED_ARGUMENTS:
                pytest.fail(f"{cls.__name__} needs an argument {name!r} this test does not know: add it to "
                            "REQUIRED_ARGUMENTS or KIND_SETUP")
            kwargs.setdefault(name, REQUIRED_ARGUMENTS[name])
    return cls(**kwargs)


@pytest.mark.parametrize("cls", _accountant_classes(), ids=lambda c: c.kind)
def test_every_accountant_kind_round_trips_through_a_ledger(cls, path):
    assert accountant_class(cls.kind) is cls
    with Ledger.open(path) as ledger:
        arguments, events = KIND_SETUP.get(cls.kind, ({}, CANDIDATE_EVENTS))
        accountant = _construct(cls, **{"budget": (8.0, 1e-3), **arguments}, ledger=ledger)
        for event in events:
            try:
                accountant.compose(event, count=2)
                break
            except UnsupportedEventError:
                continue
        else:
            pytest.fail(f"{cls.__name__} accounts none of {events}: give it events in KIND_SETUP")
        releases = [Release(r.value, event, target_hit=r.target_hit, charged_teachers=r.charged_teachers)
                    for r in _releases(4)]
        accountant.record_many(releases[:3])
        accountant.record(releases[3])
        spent = accountant.spent()
        config = accountant.config()
        assert ledger.row_count == 5
    assert accountant_from_config(json.loads(json.dumps(config))).config() == config
    with Ledger.open(path) as ledger:
        fresh = accountant_class(config["kind"])(
            **{k: (tuple(v) if k == "budget" else v) for k, v in config.items() if k != "kind"}, ledger=ledger)
        assert fresh.spent() == pytest.approx(spent)
    result = _verify(path)
    assert result.ok, result.message
    assert result.kind == cls.kind and result.rows == 5
    assert result.spent == pytest.approx(spent)


@pytest.mark.parametrize("cls", _accountant_classes(), ids=lambda c: c.kind)
def test_state_restore_and_replay_are_public_and_all_or_nothing(cls):
    """What a ledger (or a test double) uses: ``state()`` / ``restore(state)`` and ``replay(charges)``."""
    arguments, events = KIND_SETUP.get(cls.kind, ({}, CANDIDATE_EVENTS))
    arguments = {"budget": (8.0, 1e-3), **arguments}
    acc = _construct(cls, **arguments)
    empty = acc.state()
    for event in events:
        try:
            acc.compose(event, count=2)
            break
        except UnsupportedEventError:
            continue
    assert acc.state() != empty and acc.state().kind == cls.kind
    state, spent = acc.state(), acc.spent()
    charges = [Charge(r.event, 1, r.outcome, r.charged_teachers) for r in
               (Release(r.value, event, target_hit=r.target_hit, charged_teachers=r.charged_teachers)
                for r in _releases(4))]
    with pytest.raises(UnsupportedEventError):  # all or nothing: the bad last charge undoes the others
        acc.replay(charges + [Charge(ThresholdPrivacyEvent(5))])
    assert acc.state() == state
    acc.replay(charges)
    after = acc.spent()
    assert acc.state() != state
    twin = _construct(cls, **arguments)
    twin.replay([Charge(event, 2)] + charges)
    assert twin.spent() == pytest.approx(after)
    for _ in range(2):  # a state can be restored again and again: the accountant never changes it
        acc.restore(state)
        assert acc.state() == state and acc.spent() == pytest.approx(spent)
        acc.replay(charges)
        assert acc.spent() == pytest.approx(after)
    acc.restore(empty)
    assert acc.spent() == _construct(cls, **arguments).spent() and acc.state() == empty
    tight = _construct(cls, **{**arguments, "budget": (1e-3, arguments["budget"][1])}) \
        if cls.kind != "individual-charging" else None
    if tight is not None:  # an auditor's replay checks the budget
        unspent = tight.state()
        with pytest.raises(BudgetExhaustedError):
            tight.replay([Charge(event, 2)] + charges, enforce_budget=True)
        assert tight.state() == unspent
        tight.replay([Charge(event, 2)] + charges)  # a ledger replay does not: those charges were accepted
        assert tight.spent() == pytest.approx(after)
    with pytest.raises(TypeError):
        acc.replay(["not a charge"])
    with pytest.raises(TypeError):
        acc.restore("not a state")
    with pytest.raises(ValueError, match="cannot be restored into"):
        acc.restore(BasicCompositionAccountant().state() if cls is not BasicCompositionAccountant
                    else AdvancedCompositionAccountant().state())
    with Ledger.in_memory() as ledger:
        attached = _construct(cls, **arguments, ledger=ledger)
        with pytest.raises(RuntimeError, match="attached to a ledger"):  # it would forget what the ledger holds
            attached.restore(attached.state())


def test_register_checks_again_unless_can_afford_just_did(path):
    """``can_afford(event)`` followed by a registered mechanism of that event checks once; anything charged in
    between makes the pre-run check look again, and refuse before the mechanism runs."""
    from conftest import Counting

    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=(0.5, 1e-5), ledger=ledger)
        mechanism = Counting(_Mechanism(EpsilonDeltaEvent(0.2)))
        run = accountant.register(mechanism)
        assert accountant.can_afford(EpsilonDeltaEvent(0.2))
        accountant.compose(EpsilonDeltaEvent(0.35))
        with pytest.raises(BudgetExhaustedError):
            run()
        assert mechanism.calls == 0 and ledger.row_count == 1
        with Ledger.open(path) as other:  # another writer spends the rest after our check: the record refuses
            assert accountant.can_afford(EpsilonDeltaEvent(0.05))
            BasicCompositionAccountant(budget=(0.5, 1e-5), ledger=other).compose(EpsilonDeltaEvent(0.15))
            small = accountant.register(Counting(_Mechanism(EpsilonDeltaEvent(0.05))))
            with pytest.raises(BudgetExhaustedError):
                small()
        assert accountant.spent() == (0.5, 0.0) and ledger.row_count == 2
    assert _verify(path).ok


def test_unknown_kind_is_reported(path, capsys):
    with Ledger.open(path) as ledger:
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1))
    conn = _raw(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps({"kind": "no-such-kind", "budget": None}),))
    conn.close()
    result = _verify(path)
    assert not result.ok and "no-such-kind" in result.message
    assert _audit(capsys, path)[0] == 1
    with pytest.raises(LedgerError, match="unknown accountant kind"):
        accountant_class("no-such-kind")


# -- crashes and concurrent writers (real processes) ---------------------------------------------------------


class _Server:
    """tests/ledger_worker.py in ``serve`` mode: forks a charging child per ``run``, or racers (``race N``)."""

    def __init__(self, path, budget, step, max_batch=10, pause=0.0, extra=()):
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "serve", str(path), "--budget", str(budget), "--step", str(step),
             "--max-batch", str(max_batch), "--pause", str(pause), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(),
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        assert line, "the ledger worker died"
        return line.strip()

    def start(self, seed: int) -> int:
        self.proc.stdin.write(f"run {seed}\n")
        self.proc.stdin.flush()
        kind, pid = self._line().split()
        assert kind == "pid"
        return int(pid)

    def attached(self) -> bool:
        line = self._line()
        assert line in ("attached", "gone")
        self._seen_attached = True
        return line == "attached"

    def wait(self) -> int:
        if not getattr(self, "_seen_attached", False):
            self.attached()
        self._seen_attached = False
        kind, code = self._line().split()
        assert kind == "exit"
        return int(code)

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


def test_killed_writers_leave_a_ledger_that_verifies(path):
    budget, step, runs = 6.0, 0.004, 25
    rng = random.Random(20261121)
    server = _Server(path, budget, step)
    killed_while_writing = 0
    try:
        for run in range(runs):
            before = _verify(path).rows
            pid = server.start(seed=run)
            if run % 2:  # any moment: while it opens or creates the file, catches up, or writes
                time.sleep(rng.uniform(0.0, 0.04))
            else:  # while it writes (a transaction every ~0.5 ms)
                server.attached()
                time.sleep(rng.uniform(0.0, 0.015))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it already spent the whole budget and exited
                pass
            code = server.wait()
            assert code in (0, -signal.SIGKILL)
            result = _verify(path)
            assert result.ok, f"run {run}: {result.message}"
            assert result.spent[0] <= budget + 1e-9 and result.spent[1] <= 1e-5
            if code == -signal.SIGKILL and result.rows > before:
                killed_while_writing += 1
        server.start(seed=runs)  # a last writer, left alone, spends the rest of the budget
        assert server.wait() == 0
    finally:
        server.close()
    result = _verify(path)
    assert result.ok, result.message
    assert budget - step - 1e-9 < result.spent[0] <= budget + 1e-9
    assert killed_while_writing >= runs // 4  # many kills landed while rows were being written
    with Ledger.open(path) as ledger:  # and the ledger is still writable
        accountant = BasicCompositionAccountant(budget=(budget, 1e-5), ledger=ledger)
        assert accountant.spent() == result.spent
        with pytest.raises(BudgetExhaustedError):
            accountant.compose(EpsilonDeltaEvent(step))


def _race(server, workers: int) -> list:
    """Start ``workers`` racing writers on ``server`` and return their JSON reports."""
    try:
        server.proc.stdin.write(f"race {workers}\n")
        server.proc.stdin.flush()
        reports = [json.loads(server._line()) for _ in range(workers)]
        assert server._line() == "done"
    finally:
        server.close()
    return reports


def test_concurrent_writers_share_one_budget(path):
    budget, step, workers = 1.5, 0.01, 3
    reports = _race(_Server(path, budget, step, pause=0.001, extra=("--runs",)), workers)
    result = _verify(path)
    assert result.ok, result.message
    assert result.spent[0] <= budget + 1e-9
    assert result.spent[0] > budget - step - 1e-9  # the budget was used up, not wasted
    assert sum(r["charged"] for r in reports) == result.rows
    with Ledger.open(path, read_only=True) as ledger:
        writers = [row.writer for row in ledger.rows()]
    for report in reports:
        assert writers.count(report["writer"]) == report["charged"]
        assert report["spent"][0] == pytest.approx(result.spent[0])  # each saw everyone's charges at the end
    assert sum(1 for r in reports if r["charged"] > 0) >= 2  # they really raced
    # Concurrent runs: each racer began its own run; every row names its writer's run, and the runs' rows
    # add up to the one budget (no run has a budget of its own).
    assert sorted(r["run"] for r in reports) == list(range(1, workers + 1))
    assert len(result.runs) == workers
    for report in reports:
        run = result.runs[report["run"] - 1]
        assert run["metadata"] == {"racer": run["metadata"]["racer"], "seeded": False}
        assert run["rows"] == report["charged"]
    with Ledger.open(path, read_only=True) as ledger:
        by_writer = {report["writer"]: report["run"] for report in reports}
        assert all(row.run == by_writer[row.writer] for row in ledger.rows())


def test_concurrent_individual_charging_writers_never_overcharge_a_teacher(path):
    """Three processes charge one individual-charging ledger (shareable + confidential files) at once:
    no teacher is ever charged beyond its limit, the confidential file holds exactly the hit charges, both
    parts verify, and each racer's hits are in the confidential rows."""
    from pate_accountant.accountants import IndividualChargingAccountant

    limit, workers = 5, 3
    server = _Server(path, 1.0, 0.01, pause=0.002, extra=("--kind", "individual", "--limit", str(limit), "--runs"))
    reports = _race(server, workers)
    result = _verify(path)
    assert result.ok, result.message
    assert result.confidential == "verified" and result.rows == sum(r["charged"] for r in reports)
    with Ledger.open(path, read_only=True) as ledger:
        replayed = IndividualChargingAccountant(50, per_teacher_limit=limit, relation="add-remove-one", ledger=ledger)
        assert int(replayed.counters.max()) <= limit
        assert replayed.num_active == 0  # they charged until every teacher reached its limit
        assert int(replayed.counters.sum()) == sum(len(t) for r in reports for t in r["hits"])
        hit_rows = [row for row in ledger.rows() if row.outcome == "target"]
        charged = sorted(sorted(row.charged_teachers) for row in hit_rows)
    assert charged == sorted(t for r in reports for t in r["hits"])
    conn = sqlite3.connect(ledger_module.confidential_path(path))
    assert conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == len(hit_rows)
    conn.close()
    assert sum(1 for r in reports if r["charged"] > 0) >= 2


# -- data sets and runs ----------------------------------------------------------------------------------------


def test_data_set_name_is_checked_and_frozen(path):
    with Ledger.open(path) as ledger:
        assert ledger.dataset is None
        with pytest.raises(TypeError, match="dataset"):
            ledger.set_dataset(7)
        for bad in ("", "   ", "x" * 201, "two\nlines"):
            with pytest.raises(ValueError, match="dataset"):
                ledger.set_dataset(bad)
        ledger.set_dataset("dolly-15k")
        ledger.set_dataset("dolly-15k")  # the same name again is fine
        with pytest.raises(ValueError, match="belongs to the data set 'dolly-15k', not 'other'"):
            ledger.set_dataset("other")
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1))
        assert ledger.dataset == "dolly-15k"
    result = _verify(path)
    assert result.ok and result.dataset == "dolly-15k"
    conn = _raw(path)  # the name is covered by the genesis hash
    conn.execute("UPDATE meta SET value = ? WHERE key = 'dataset'", (json.dumps("renamed"),))
    conn.close()
    result = _verify(path)
    assert not result.ok and result.first_bad_row == 1 and "metadata" in result.message


def _two_runs(path):
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert ledger.begin_run({"mechanism": "a", "seeded": False}) == 1
        accountant.compose(EpsilonDeltaEvent(0.1))
        accountant.compose(EpsilonDeltaEvent(0.1))
    with Ledger.open(path) as ledger:  # a later run, another process: its own metadata, same budget
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        assert accountant.spent()[0] == pytest.approx(0.2)
        assert ledger.begin_run({"mechanism": "b", "seeded": True}) == 2
        assert ledger.current_run == 2
        accountant.compose(EpsilonDeltaEvent(0.3))


def test_runs_keep_their_own_metadata_and_rows(path, capsys):
    _two_runs(path)
    with Ledger.open(path, read_only=True) as ledger:
        assert [(r["id"], r["first_row"], r["metadata"]["mechanism"]) for r in ledger.runs] == [(1, 0, "a"), (2, 2, "b")]
        assert [row.run for row in ledger.rows()] == [1, 1, 2]
    result = _verify(path)
    assert result.ok, result.message
    assert [(r["id"], r["rows"]) for r in result.runs] == [(1, 2), (2, 1)]
    assert result.spent[0] == pytest.approx(0.5)
    code, out, _ = _audit(capsys, path)
    assert code == 0 and "runs        : 2" in out and "    mechanism : b" in out.splitlines()
    with Ledger.open(path) as ledger:
        with pytest.raises(ValueError, match="never stores seeds"):
            ledger.begin_run({"seed": 12345})
        with pytest.raises(TypeError):
            ledger.begin_run(["not", "a", "dict"])
        assert len(ledger.runs) == 2  # refused before anything was written


def _tampered_runs(path, sql, *args, rehash=False):
    """Two runs written to ``path``, then ``sql`` run on the raw file (hashes recomputed if ``rehash``):
    the verification result."""
    _two_runs(path)
    conn = _raw(path)
    conn.execute(sql, args)
    if rehash:
        _rehash(conn)
    conn.close()
    return _verify(path)


def test_edited_dropped_or_forged_runs_are_caught(path):
    result = _tampered_runs(path, "UPDATE runs SET metadata = ? WHERE id = 1",
                            json.dumps({"mechanism": "z", "seeded": False}))
    assert not result.ok and "run 1's metadata was edited" in result.message

    result = _tampered_runs(path.with_name("b.db"), "DELETE FROM runs WHERE id = 2")
    assert not result.ok and "runs" in result.message

    result = _tampered_runs(path.with_name("c.db"), "UPDATE charges SET run = 1 WHERE id = 3")
    assert not result.ok and result.first_bad_row == 3 and "edited" in result.message

    result = _tampered_runs(path.with_name("d.db"), "UPDATE charges SET run = 9 WHERE id = 3", rehash=True)
    assert not result.ok and result.first_bad_row == 3 and "run 9" in result.message


def test_a_ledger_of_an_older_schema_is_refused(path):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE charges (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE head (id INTEGER PRIMARY KEY, row_count INTEGER, last_hash TEXT)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.commit()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(LedgerError, match="schema version 1 is not supported"):
            Ledger.open(path, read_only=read_only)


# -- issue 22, item 16: only a path where nothing exists becomes a ledger ------------------------------------


@pytest.mark.parametrize("kind", ["zero-byte", "no-tables", "fifo"])
def test_an_empty_file_a_table_less_database_or_a_fifo_is_refused_and_left_unchanged(tmp_path, capsys, kind):
    """A 0-byte file, an SQLite database without tables and a FIFO are no ledgers: ``Ledger.open`` refuses each
    (writable and read-only) in one line naming the file, before writing anything (the folder holds the same
    files with the same bytes after), and ``audit`` exits 3 (cannot be checked), never 0.  A FIFO is refused
    before it is opened (an open would block)."""
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "ledger.sqlite"
    if kind == "zero-byte":
        path.write_bytes(b"")
    elif kind == "no-tables":
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 7")  # writes the header: a valid database with no table
        conn.commit()
        conn.close()
        assert path.stat().st_size > 0
    else:
        os.mkfifo(path)
    before = _files(folder)
    names = sorted(p.name for p in folder.iterdir())
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked on the file instead of refusing it"))
    signal.alarm(20)
    try:
        for read_only in (False, True):
            with pytest.raises((LedgerError, FileNotFoundError)) as caught:
                Ledger.open(path, read_only=read_only)
            message = str(caught.value)
            assert str(path) in message and "\n" not in message
            assert sorted(p.name for p in folder.iterdir()) == names and _files(folder) == before
        if kind != "fifo":  # audit refuses a path that is no regular file as missing (exit 2), before opening it
            code, out, err = _audit(capsys, path)
            assert code == 3 and "CANNOT CHECK" in out
            [line] = err.strip().splitlines()
            assert "cannot check" in line and str(path) in line
            assert ("empty file (0 bytes)" if kind == "zero-byte" else "no tables") in line
            code, out, _ = _audit(capsys, path, "--json")
            assert code == 3 and json.loads(out)["verdict"] == "cannot check"
        else:
            code, _, err = _audit(capsys, path)
            assert code == 2 and "no ledger file" in err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert sorted(p.name for p in folder.iterdir()) == names and _files(folder) == before


def test_a_missing_path_is_still_created_and_a_new_ledger_still_opens(tmp_path):
    path = tmp_path / "new.sqlite"
    with Ledger.open(path) as ledger:
        assert ledger.created_here
    with Ledger.open(path) as ledger:  # the empty ledger it made is a ledger: opened, not refused
        assert not ledger.created_here and ledger.row_count == 0
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok
    dangling = tmp_path / "dangling.sqlite"
    dangling.symlink_to(tmp_path / "nowhere.sqlite")
    with pytest.raises(LedgerError, match="symbolic link to a missing file"):
        Ledger.open(dangling)
    assert not (tmp_path / "nowhere.sqlite").exists()


# -- issue 22, item 6: the shareable file's times do not depend on the data ----------------------------------


class _Clock:
    """``time`` for the ledger rooms with a wall clock that moves one second at every reading (as if each step
    took a data-dependent while); everything else is the real module.  :func:`_use_clock` installs it."""

    def __init__(self):
        self.now = 1_700_000_000.0

    def time(self):
        self.now += 1.0
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def _use_clock(monkeypatch, clock):
    """Install ``clock`` as ``time`` in every ledger room that reads the wall clock: the ledger's creation time
    (``chain``), a confidential part's (``confidential``) and a run's start (``runs``)."""
    for room in (ledger_chain, ledger_confidential, ledger_runs):
        monkeypatch.setattr(room, "time", clock)


def test_row_times_are_their_runs_start_not_each_charges_own(path, monkeypatch, capsys):
    """Every row stores its run's start time (without a run: the ledger's creation time), whatever the time of
    the charge; the per-charge time is stored nowhere.  The chain and the audit are unchanged."""
    clock = _Clock()
    _use_clock(monkeypatch, clock)
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.01, 1e-8))  # before any run
        for _ in range(2):
            ledger.begin_run({"seeded": False})
            for size in (1, 3, 2):  # transactions of different sizes, each much later than the last
                clock.now += 100.0 * size
                accountant.record_many(_releases(size, epsilon=0.01))
        created, runs = ledger.created, ledger.runs
    conn = sqlite3.connect(path)
    times = conn.execute("SELECT run, created FROM charges ORDER BY id").fetchall()
    conn.close()
    starts = {run["id"]: run["created"] for run in runs}
    assert len(times) == 13 and len(set(starts.values())) == 2
    assert times[0] == (None, created)
    assert all(stored == starts[run] for run, stored in times[1:])
    code, out, _ = _audit(capsys, path)
    assert code == 0 and "own commit time" not in out


def test_a_ledger_whose_rows_carry_their_own_times_still_audits(path, monkeypatch, capsys):
    """A ledger written before row times were rounded (each row its commit time; simulated by the old rule)
    still verifies and audits with exit 0, the same layout and hashes; the verdict counts those rows."""
    monkeypatch.setattr(Ledger, "_row_time", lambda self: float(time.time()))
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        ledger.begin_run({"seeded": False})
        for _ in range(3):
            time.sleep(0.002)
            accountant.compose(EpsilonDeltaEvent(0.01, 1e-8))
    monkeypatch.undo()
    result = _verify(path)
    assert result.ok and result.rows == 3, result.message
    assert "3 row(s) carry their own commit time" in result.message
    with Ledger.open(path) as ledger:  # a writer of this version appends to it: its rows take the run's start
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        ledger.begin_run({"seeded": False})
        accountant.compose(EpsilonDeltaEvent(0.01, 1e-8))
    code, out, _ = _audit(capsys, path)
    assert code == 0 and "3 row(s) carry their own commit time" in out
