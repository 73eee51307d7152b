"""The ledger kept in PostgreSQL (issue 25, item 2): ``Ledger.open("postgresql://...?ledger=NAME")`` against a real
PostgreSQL 18 server (tests/pg_server.py): round trips, a second connection, racing writer processes on one budget,
a forged row, the shareable/confidential grant split, individual charging, and no password anywhere."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import pytest

from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.events import BetweenThresholdsEvent, EpsilonDeltaEvent
from pate_accountant.ledger import Ledger, LedgerError
from pate_accountant.release import Release

psycopg = pytest.importorskip("psycopg")

from pg_server import ledger_url as _url, sql as _sql  # noqa: E402

BUDGET = (1.0, 1e-5)


def test_create_charge_reopen_and_verify(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        assert ledger.created_here and ledger.path == url
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for eps in (0.1, 0.2, 0.05):
            accountant.compose(EpsilonDeltaEvent(eps, 1e-7))
        accountant.compose(EpsilonDeltaEvent(0.1, 1e-7), count=2)
        with pytest.raises(BudgetExhaustedError):
            accountant.compose(EpsilonDeltaEvent(0.9))
        head = ledger.head_hash
        assert ledger.row_count == 4
    # The two schemas and the tables exist; the head row is the last row's hash.
    schemas = {r[0] for r in _sql(postgres_database, "SELECT nspname FROM pg_namespace")}
    assert "budget" in schemas and "budget_confidential" not in schemas  # a basic accountant keeps nothing private
    assert _sql(postgres_database, "SELECT hash FROM budget.charges ORDER BY id DESC LIMIT 1")[0][0] == head
    with Ledger.open(url) as again:
        assert not again.created_here
        result = again.verify()
        assert result.ok, result.message
        assert result.rows == 4 and result.head_hash == head
        assert result.spent == pytest.approx((0.55, 5e-7))
        resumed = BasicCompositionAccountant(budget=BUDGET, ledger=again)  # replays the stored rows
        assert resumed.spent() == pytest.approx((0.55, 5e-7))
        resumed.compose(EpsilonDeltaEvent(0.45))
        assert again.verify().ok
    with Ledger.open(url, read_only=True) as reader:
        assert reader.verify().ok and reader.row_count == 5
        with pytest.raises(LedgerError, match="read-only"):
            BasicCompositionAccountant(budget=BUDGET, ledger=reader).compose(EpsilonDeltaEvent(0.0))


def test_values_come_back_exactly_as_stored(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1, 1e-7))
        raw = list(ledger._store.rows())
    assert [type(v) for v in raw[0]] == [int, str, str, str, int, type(None), type(None), float, float, float, str,
                                         type(None), type(None)]


def test_a_second_connection_sees_the_rows_through_sync(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as first, Ledger.open(url) as second:
        a = BasicCompositionAccountant(budget=BUDGET, ledger=first)
        b = BasicCompositionAccountant(budget=BUDGET, ledger=second)
        a.compose(EpsilonDeltaEvent(0.6))
        second.sync(b)
        assert b.spent() == pytest.approx((0.6, 0.0))
        assert not b.can_afford(EpsilonDeltaEvent(0.6))
        with pytest.raises(BudgetExhaustedError):
            b.compose(EpsilonDeltaEvent(0.6))
        b.compose(EpsilonDeltaEvent(0.4))
        with pytest.raises(BudgetExhaustedError):
            a.compose(EpsilonDeltaEvent(0.1))
        assert a.spent() == b.spent() == pytest.approx((1.0, 0.0))
        assert first.verify().ok


def test_ledgers_of_different_names_are_separate(postgres_database):
    with Ledger.open(_url(postgres_database, "one")) as one, Ledger.open(_url(postgres_database, "two")) as two:
        BasicCompositionAccountant(budget=BUDGET, ledger=one).compose(EpsilonDeltaEvent(0.7))
        BasicCompositionAccountant(budget=BUDGET, ledger=two).compose(EpsilonDeltaEvent(0.7))
        assert one.ledger_id != two.ledger_id
    with Ledger.open(postgres_database) as default:  # no ledger parameter: the ledger named "ledger"
        assert default.path.endswith("?ledger=ledger") and default.row_count == 0


def test_a_schema_that_is_not_a_ledger_is_refused_and_left_alone(postgres_database):
    _sql(postgres_database, "CREATE SCHEMA other; CREATE TABLE other.t (x integer); INSERT INTO other.t VALUES (1)")
    with pytest.raises(LedgerError, match="not a pate-accountant ledger"):
        Ledger.open(_url(postgres_database, "other"))
    assert _sql(postgres_database, "SELECT x FROM other.t") == [(1,)]
    with pytest.raises(FileNotFoundError):
        Ledger.open(_url(postgres_database, "missing"), read_only=True)
    assert not _sql(postgres_database, "SELECT 1 FROM pg_namespace WHERE nspname = 'missing'")
    with pytest.raises(LedgerError, match="invalid ledger name"):
        Ledger.open(_url(postgres_database, "Bad-Name"))


def test_the_append_only_triggers_refuse_edits(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        ledger.begin_run({"mechanism": "test", "seeded": False})
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1))
    for statement in ("UPDATE budget.charges SET count = 2", "DELETE FROM budget.charges",
                      "TRUNCATE budget.charges", "DELETE FROM budget.runs",
                      "UPDATE budget.meta SET value = '1' WHERE key = 'created'"):
        with pytest.raises(psycopg.errors.RaiseException):
            _sql(postgres_database, statement)


def test_a_forged_row_is_caught_by_verify(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for _ in range(3):
            accountant.compose(EpsilonDeltaEvent(0.2))
    # An adversary with the owner's rights drops the triggers and rewrites a row's epsilon (and appends one).
    _sql(postgres_database, "DROP TRIGGER charges_append_only ON budget.charges")
    event = _sql(postgres_database, "SELECT event FROM budget.charges WHERE id = 2")[0][0]
    _sql(postgres_database, "UPDATE budget.charges SET event = %s WHERE id = 2", (event.replace("0.2", "0.02"),))
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
    assert not result.ok and result.first_bad_row == 2, result.message


def test_a_dropped_trailing_row_is_caught_by_verify(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for _ in range(3):
            accountant.compose(EpsilonDeltaEvent(0.2))
    _sql(postgres_database, "DROP TRIGGER charges_append_only ON budget.charges")
    _sql(postgres_database, "DELETE FROM budget.charges WHERE id = 3")
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
    assert not result.ok, result.message


def test_no_password_in_messages_location_repr_or_metadata(postgres_server, postgres_database):
    secret = "s3cr3t-pw"
    _sql(postgres_database, f"CREATE ROLE writer LOGIN PASSWORD '{secret}' SUPERUSER")
    dbname = postgres_database.rsplit("/", 1)[1]
    url = postgres_server.url(user="writer", dbname=dbname, password=secret) + "?ledger=budget"
    with Ledger.open(url) as ledger:
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1))
        shown = [ledger.path, repr(ledger), repr(ledger._store), ledger.confidential_path, str(ledger.verify())]
        assert all(secret not in text for text in shown), shown
        assert ledger.path == f"postgresql://writer@127.0.0.1:{postgres_server.port}/{dbname}?ledger=budget"
    stored = _sql(postgres_database, "SELECT value FROM budget.meta")
    assert all(secret not in value for (value,) in stored)
    # A refused connection, a wrong database, not a ledger, an unknown URL parameter: no password in the errors.
    _sql(postgres_database, "CREATE SCHEMA other; CREATE TABLE other.t (x integer)")
    query_password = postgres_server.url(user="writer", dbname=dbname) + f"?password={secret}&ledger=other"
    for bad in (url.replace(f":{postgres_server.port}/", ":1/"), url.replace(f"/{dbname}?", "/nowhere?"),
                url.replace("ledger=budget", "ledger=other"), query_password, query_password + "&bogus=1"):
        with pytest.raises(LedgerError) as caught:
            Ledger.open(bad)
        assert secret not in str(caught.value) and secret not in repr(caught.value), str(caught.value)
    with Ledger.open(query_password.replace("ledger=other", "ledger=budget")) as ledger:
        assert secret not in ledger.path and "password=" not in ledger.path and ledger.row_count == 1


def test_psycopg_missing_names_the_extra(postgres_database, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now raises ImportError
    with pytest.raises(LedgerError, match="'postgresql' extra"):
        Ledger.open(_url(postgres_database))


def test_an_auditor_granted_the_shareable_schema_cannot_read_the_confidential_one(postgres_server,
                                                                                  postgres_database):
    url = _url(postgres_database, "teachers")
    with Ledger.open(url) as ledger:
        acc = IndividualChargingAccountant(10, per_teacher_limit=3, ledger=ledger)
        event = BetweenThresholdsEvent(0.1, q=0.3)
        acc.record(Release("between", event, target_hit=True, charged_teachers={1, 2}))
    _sql(postgres_database, "CREATE ROLE auditor LOGIN; GRANT USAGE ON SCHEMA teachers TO auditor; "
                            "GRANT SELECT ON ALL TABLES IN SCHEMA teachers TO auditor")
    auditor = postgres_database.replace("postgresql://postgres@", "postgresql://auditor@")
    with psycopg.connect(auditor) as conn:
        assert conn.execute("SELECT count(*) FROM teachers.charges").fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT charged_teachers FROM teachers_confidential.charges")
    with Ledger.open(_url(auditor, "teachers"), read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message
        assert result.confidential == "absent" and result.spent is None and result.rows == 1
        assert not reader.has_confidential
        assert [sorted(row.charged_teachers) for row in reader.rows()] == [[]]  # no teacher set reaches it


def test_individual_charging_end_to_end(postgres_database):
    url = _url(postgres_database, "teachers")
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(url) as first, Ledger.open(url) as second:
        a = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=first)
        b = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=second)
        for i in range(6):
            acc = (a, b)[i % 2]
            assert acc.can_afford(event)
            acc.record(Release("between", event, target_hit=i % 3 != 2, charged_teachers={i, i + 1}))
        first.sync(a)
        assert a.counters.tolist() == b.counters.tolist()
    hits = _sql(postgres_database, "SELECT count(*) FROM teachers_confidential.charges")[0][0]
    assert hits == 4
    assert _sql(postgres_database, "SELECT count(*) FROM teachers.charges WHERE spent_epsilon IS NOT NULL") == [(0,)]
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message
        assert result.confidential == "verified" and result.rows == 6
        again = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=reader)
        assert again.counters.tolist() == b.counters.tolist()


def test_discard_if_unused_drops_an_unused_ledger_only(postgres_database):
    url = _url(postgres_database)
    ledger = Ledger.open(url)
    assert ledger.created_here
    other = Ledger.open(url)  # another connection has it open: kept
    assert not ledger.discard_if_unused()
    other.close()
    assert _sql(postgres_database, "SELECT 1 FROM pg_namespace WHERE nspname = 'budget'")
    fresh_url = _url(postgres_database, "fresh")
    fresh = Ledger.open(fresh_url)
    BasicCompositionAccountant(budget=BUDGET, ledger=fresh)  # stores its config: still unused
    assert fresh.discard_if_unused()
    assert not _sql(postgres_database, "SELECT 1 FROM pg_namespace WHERE nspname = 'fresh'")
    used = Ledger.open(fresh_url)
    assert used.created_here
    BasicCompositionAccountant(budget=BUDGET, ledger=used).compose(EpsilonDeltaEvent(0.1))
    assert not used.discard_if_unused()  # it has a row
    with Ledger.open(fresh_url) as reopened:
        assert reopened.row_count == 1 and reopened.verify().ok


def charge_until_spent(accountant, step: float, budget: float) -> int:
    """Charge ``step`` until the accountant refuses (its budget spent), never seeing more than ``budget`` spent;
    how many charges it made.  What each writer of a race does, between the other writers' charges."""
    charged = 0
    while True:
        time.sleep(0.001)
        try:
            accountant.compose(EpsilonDeltaEvent(step))
        except BudgetExhaustedError:
            return charged
        charged += 1
        assert accountant.spent()[0] <= budget + 1e-9


def _racer(url: str, budget: float, step: float, queue, start) -> None:
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=(budget, 1e-5), ledger=ledger)
        start.wait(timeout=120)  # every racer connected and attached: go
        queue.put((charge_until_spent(accountant, step, budget), ledger._writer))


def test_eight_writer_processes_never_overspend_one_budget(postgres_database):
    url = _url(postgres_database)
    budget, step, workers = 1.0, 0.01, 8
    with Ledger.open(url) as ledger:
        BasicCompositionAccountant(budget=(budget, 1e-5), ledger=ledger)
    context = multiprocessing.get_context("spawn")
    queue, start = context.Queue(), context.Barrier(workers)
    processes = [context.Process(target=_racer, args=(url, budget, step, queue, start)) for _ in range(workers)]
    for process in processes:
        process.start()
    reports = [queue.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message
        assert result.rows == sum(charged for charged, _ in reports)
        assert result.spent[0] <= budget + 1e-9
        assert result.spent[0] > budget - step - 1e-9  # used up, not wasted
        writers = [row.writer for row in reader.rows()]
    for charged, writer in reports:
        assert writers.count(writer) == charged
    assert sum(1 for charged, _ in reports if charged) >= 2  # they really raced


def test_importing_the_ledger_does_not_import_psycopg():
    code = "import sys, pate_accountant.ledger; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_writer_stopped_between_commits_leaves_neither_part(postgres_database):
    """Both schemas are written in one transaction: stopped where SQLite has committed the confidential file and not
    the shareable one, PostgreSQL has committed neither, so there is nothing to clean up."""
    url = _url(postgres_database, "teachers")
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(url) as ledger:
        acc = IndividualChargingAccountant(10, per_teacher_limit=3, ledger=ledger)
        acc.record(Release("between", event, target_hit=True, charged_teachers={1, 2}))

        def crash():
            raise KeyboardInterrupt("stopped between the commits")

        ledger._between_commits = crash
        with pytest.raises(KeyboardInterrupt):
            acc.record(Release("between", event, target_hit=True, charged_teachers={3, 4}))
        del ledger._between_commits
        assert _sql(postgres_database, "SELECT count(*) FROM teachers_confidential.charges") == [(1,)]
        assert _sql(postgres_database, "SELECT count(*) FROM teachers.charges") == [(1,)]
        assert ledger._store.confidential_orphans(ledger.row_count) == 0
        acc.record(Release("between", event, target_hit=True, charged_teachers={3, 4}))
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok and result.rows == 2 and result.confidential == "verified", result.message


def test_a_writer_waits_for_the_head_row_lock_then_gives_up(postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
    with psycopg.connect(postgres_database) as holder:  # another writer, in the middle of its transaction
        holder.execute("SELECT row_count FROM budget.head WHERE id = 1 FOR UPDATE")
        with Ledger.open(url, timeout=0.3) as ledger:
            accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
            assert accountant.can_afford(EpsilonDeltaEvent(0.1))  # readers are not blocked
            with pytest.raises(LedgerError, match="cannot start a write transaction"):
                accountant.compose(EpsilonDeltaEvent(0.1))
            assert accountant.spent() == (0.0, 0.0)
            holder.rollback()
            accountant.compose(EpsilonDeltaEvent(0.1))
            assert ledger.row_count == 1


def test_racing_creators_make_one_ledger(postgres_database):
    url = _url(postgres_database)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_opener, args=(url, queue)) for _ in range(6)]
    for process in processes:
        process.start()
    reports = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert sum(created for created, _ in reports) == 1
    assert len({ledger_id for _, ledger_id in reports}) == 1


def _opener(url: str, queue) -> None:
    with Ledger.open(url) as ledger:
        queue.put((ledger.created_here, ledger.ledger_id))


# -- server-side cursors for the long reads --------------------------------------------------------------------
def _cursors(store) -> list:
    return [name for (name,) in store._execute("SELECT name FROM pg_cursors ORDER BY name")]


def test_long_reads_use_server_side_cursors_inside_a_transaction(postgres_database, monkeypatch):
    from pate_accountant._ledger import postgres_store

    monkeypatch.setattr(postgres_store, "ITERSIZE", 3)  # several pages from 10 rows
    url = _url(postgres_database, "teachers")
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(url) as ledger:
        acc = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
        for run in (1, 2):
            ledger.begin_run({"mechanism": "test", "run": run})
            for i in range(5):
                acc.record(Release("between", event, target_hit=i % 4 != 3, charged_teachers={i, i + run}))
        store = ledger._store
        outside = list(store.rows())  # autocommit: one statement, fetched whole (no cursor could outlive it)
        assert not isinstance(store.rows(), postgres_store._ServerRows) and len(outside) == 10
        conf_outside = list(store.confidential_rows(None, 10))
        with store.read(confidential=True):
            rows = store.rows()
            assert isinstance(rows, postgres_store._ServerRows)
            first = next(rows)
            assert len(_cursors(store)) == 1  # declared on the server, fetched a page at a time
            rest = list(rows)
            assert [first, *rest] == outside and all(type(row) is tuple for row in rest)
            assert _cursors(store) == []  # exhausted: closed on the server at once
            assert [run[0] for run in store.runs()] == [1, 2]
            assert list(store.confidential_rows(None, 10)) == conf_outside and len(conf_outside) == 8
            assert [t[0] for t in store.confidential_totals(10)] == [row[0] for row in outside]
            assert sorted(r for r, _ in store.confidential_teachers()) == [c[3] for c in conf_outside]
            after = list(store.rows(7))
            assert [row[0] for row in after] == [8, 9, 10]  # exactly one full page, then an empty fetch
            two = store.rows(), store.rows(4)  # two cursors at once, interleaved (catching up does this)
            assert [(a[0], b[0]) for a, b in zip(*two)] == [(1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10)]
            abandoned = store.rows()
            next(abandoned)
            del abandoned, two  # left unfinished: forgotten without a statement (or a warning); the server
            unstarted = store.rows()  # closes them with the transaction
            del unstarted
        assert _cursors(store) == []
        result = ledger.verify()  # verify and a fresh attach read through the cursors, 3 rows a time
        assert result.ok and result.rows == 10 and result.confidential == "verified", result.message
        again = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
        assert again.counters.tolist() == acc.counters.tolist()
        assert [sorted(row.charged_teachers) for row in ledger.rows()][:2] == [[0, 1], [1, 2]]


@pytest.mark.parametrize("to_sqlite", [False, True])
def test_copy_reads_the_source_through_server_side_cursors(postgres_database, monkeypatch, tmp_path, to_sqlite):
    from pate_accountant._ledger import postgres_store
    from pate_accountant.ledger import copy_ledger

    monkeypatch.setattr(postgres_store, "ITERSIZE", 4)
    source = _url(postgres_database, "teachers")
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(source) as ledger:
        acc = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
        for run in (1, 2, 3):
            ledger.begin_run({"mechanism": "test", "run": run})
            for i in range(4):
                acc.record(Release("between", event, target_hit=i != 2, charged_teachers={i, 7}))
        head = ledger.head_record
    destination = str(tmp_path / "copy.sqlite") if to_sqlite else _url(postgres_database, "copied")
    copied = copy_ledger(source, destination, batch=5)  # batches of 5 over pages of 4, into another store
    assert copied["rows"] == 12 and copied["runs"] == 3 and copied["confidential"]
    with Ledger.open(destination, read_only=True) as copy:
        result = copy.verify()
        assert result.ok and result.confidential == "verified", result.message
        assert copy.head_record == head


def test_a_connection_gives_a_silent_server_up_unless_the_url_says_otherwise(postgres_database, monkeypatch):
    """A network cut that sends nothing back must not hang a run for the operating system's many minutes: ledger
    connections get a connect timeout, TCP keepalives and a TCP user timeout, which the URL or PG* variables
    may set otherwise."""
    from pate_accountant._ledger.postgres_connection import CONNECTION_DEFAULTS

    with Ledger.open(_url(postgres_database)) as ledger:
        settings = ledger._store._conn.info.get_parameters()
    for key, value in CONNECTION_DEFAULTS.items():
        assert settings.get(key) == value, key
    url = _url(postgres_database).replace("?", "?connect_timeout=3&keepalives_idle=5&", 1)
    with Ledger.open(url) as ledger:
        settings = ledger._store._conn.info.get_parameters()
    assert settings["connect_timeout"] == "3" and settings["keepalives_idle"] == "5"
    assert settings["keepalives_count"] == "3"  # the rest keep their defaults
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    with Ledger.open(_url(postgres_database)) as ledger:
        assert ledger._store._conn.info.get_parameters()["connect_timeout"] == "7"
