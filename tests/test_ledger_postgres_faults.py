"""Fault transcripts of the PostgreSQL ledger against a real PostgreSQL 18 server (issue 25, item 3): a writer
killed with SIGKILL while it holds the head-row lock, the server crashed (``pg_ctl stop -m immediate``) and
restarted under a live ledger, a crash in the middle of a write transaction, a connection terminated by the server
(every driver error is a ``LedgerStorageError`` naming the ledger, never its password), and a forged row with a
recomputed hash chain that ``verify()`` alone cannot see but a pin and a signed checkpoint do."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

import pate_accountant.ledger as ledger_module
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.checkpoints import (
    check_checkpoints,
    generate_key,
    history_problem,
    load_private_key,
    load_public_key,
    sign_checkpoint,
)
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.ledger import STORAGE_ERRORS, Ledger, LedgerError, LedgerStorageError
from pate_accountant.release import Release

psycopg = pytest.importorskip("psycopg")

from pg_server import ledger_url as _url, sql as _sql  # noqa: E402

BUDGET = (10.0, 1e-3)


# -- 1. a writer killed with SIGKILL while it holds the head-row lock ------------------------------------------
def _killed_writer(url: str, inside, queue) -> None:
    """Charge once (committed), then charge again and stop just before COMMIT: the rows are inserted and the head
    row is locked; say so and wait to be killed."""
    ledger = Ledger.open(url)
    accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
    accountant.compose(EpsilonDeltaEvent(0.25))
    queue.put((ledger._writer, ledger._store._conn.info.backend_pid))

    def hold():
        inside.set()
        time.sleep(600)

    ledger._between_commits = hold  # this child only: called inside the write transaction, before COMMIT
    accountant.compose(EpsilonDeltaEvent(0.5))


def test_a_writer_killed_while_holding_the_head_row_lock_leaves_no_row_and_no_lock(postgres_server,
                                                                                  postgres_database):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1))
    context = multiprocessing.get_context("spawn")
    inside, queue = context.Event(), context.Queue()
    child = context.Process(target=_killed_writer, args=(url, inside, queue))
    child.start()
    try:
        killed_writer, backend_pid = queue.get(timeout=60)
        assert inside.wait(timeout=60), "the child never entered its second transaction"
        # The child really is in the middle of its transaction: its rows are written, uncommitted, and it holds
        # the head row, so another writer gives up after its lock timeout.
        state = _sql(postgres_database, "SELECT state FROM pg_stat_activity WHERE pid = %s", (backend_pid,))
        assert state == [("idle in transaction",)]
        with Ledger.open(url, timeout=0.3) as blocked:
            accountant = BasicCompositionAccountant(budget=BUDGET, ledger=blocked)
            assert accountant.spent()[0] == pytest.approx(0.35)
            with pytest.raises(LedgerError, match="cannot start a write transaction"):
                accountant.compose(EpsilonDeltaEvent(0.05))
            assert accountant.spent()[0] == pytest.approx(0.35)
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    # The kernel closed the child's socket; its backend rolls back and releases the row lock at once: the next
    # writer charges without waiting for any timeout (a 5 s lock timeout would raise, not wait longer).
    with Ledger.open(url, timeout=5.0) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        began = time.monotonic()
        accountant.compose(EpsilonDeltaEvent(0.05))
        assert time.monotonic() - began < 2.0
        result = ledger.verify()
        assert result.ok, result.message
        assert result.rows == 3 and result.spent[0] == pytest.approx(0.4)  # 0.1 + 0.25 + 0.05: not the 0.5
        assert [row.writer for row in ledger.rows()].count(killed_writer) == 1
    assert _sql(postgres_database, "SELECT count(*) FROM budget.charges") == [(3,)]
    assert _sql(postgres_database, "SELECT row_count FROM budget.head") == [(3,)]
    assert _sql(postgres_database, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend_pid,)) == [(0,)]


# -- 2. the server crashed and restarted under a live ledger -------------------------------------------------
def _server_failure(exc, url: str) -> bool:
    """A driver error as the store raises it: ``LedgerStorageError``, one line naming the ledger, no driver
    exception chained (a psycopg error is no ``LedgerStorageError``, so a raw one fails this)."""
    return (isinstance(exc, LedgerStorageError) and isinstance(exc, STORAGE_ERRORS) and url in str(exc)
            and "\n" not in str(exc) and exc.__cause__ is None
            and (exc.__suppress_context__ or exc.__context__ is None))


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_a_server_stopped_between_charges_is_refused_cleanly_and_nothing_is_lost(postgres_server, postgres_database,
                                                                                mode):
    url = _url(postgres_database)
    ledger = Ledger.open(url)
    try:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for eps in (0.1, 0.2, 0.3):
            accountant.compose(EpsilonDeltaEvent(eps, 1e-7))
        committed = ledger.head_record
        spent = accountant.spent()
        # immediate: a crash (no shutdown checkpoint, clients cut off); fast: a clean stop that disconnects clients
        postgres_server.stop(mode)
        postgres_server.start()  # crash recovery replays the WAL
        with pytest.raises(Exception) as caught:
            accountant.compose(EpsilonDeltaEvent(0.4))
        assert _server_failure(caught.value, url), repr(caught.value)
        assert accountant.spent() == spent  # the accountant charged nothing it could not write
        # The ledger object stays unusable (its connection is gone) and says so every time, at once; it does not
        # reconnect, and a read fails the same way.
        for attempt in (lambda: accountant.compose(EpsilonDeltaEvent(0.4)),
                        lambda: accountant.can_afford(EpsilonDeltaEvent(0.4)), lambda: ledger.head_record):
            began = time.monotonic()
            with pytest.raises(Exception) as again:
                attempt()
            assert _server_failure(again.value, url), repr(again.value)
            assert time.monotonic() - began < 5.0
        assert accountant.spent() == spent
    finally:
        ledger.close()
    with Ledger.open(url) as reopened:
        result = reopened.verify()
        assert result.ok, result.message
        assert reopened.head_record == committed and result.rows == 3
        assert result.spent == pytest.approx((0.6, 3e-7))
        resumed = BasicCompositionAccountant(budget=BUDGET, ledger=reopened)
        assert resumed.spent() == pytest.approx(spent)
        resumed.compose(EpsilonDeltaEvent(0.4))
        assert reopened.verify().ok and reopened.row_count == 4


def test_a_server_crash_inside_a_write_transaction_leaves_nothing_half_written(postgres_server, postgres_database):
    url = _url(postgres_database)
    ledger = Ledger.open(url)
    stopped = []
    try:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(0.1))
        committed, spent = ledger.head_record, accountant.spent()

        def crash():  # the rows are inserted and the head updated, not committed
            postgres_server.stop("immediate")
            stopped.append(True)

        ledger._between_commits = crash
        with pytest.raises(Exception) as caught:
            accountant.record_many([Release("tok", EpsilonDeltaEvent(0.2))] * 3)
        assert stopped and _server_failure(caught.value, url), repr(caught.value)
        assert "during COMMIT" in str(caught.value)  # the connection was lost at the commit: its outcome unknown
        assert accountant.spent() == spent
    finally:
        if stopped:
            postgres_server.start()
        ledger.close()
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message
        assert reader.head_record == committed and result.rows == 1
    assert _sql(postgres_database, "SELECT count(*) FROM budget.charges") == [(1,)]


# -- 3. a connection terminated by the server (an operator, a failover, a cut network) ---------------------------
SECRET = "Tr0ub4dor-s3cret"


def test_a_terminated_connection_raises_a_storage_error_naming_the_ledger_without_its_password(postgres_server,
                                                                                             postgres_database):
    dbname = postgres_database.rsplit("/", 1)[1]
    url = postgres_server.url(dbname=dbname, password=SECRET) + "?ledger=budget"  # trust auth ignores the password
    ledger = Ledger.open(url)
    shown = ledger.path
    assert SECRET not in shown
    try:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for eps in (0.1, 0.2, 0.3, 0.05):
            accountant.compose(EpsilonDeltaEvent(eps, 1e-7))
        committed, spent = ledger.head_record, accountant.spent()
        backend = ledger._store._conn.info.backend_pid
        # From another connection; the call waits (up to 10 s) until the backend is gone.
        assert _sql(postgres_database, "SELECT pg_terminate_backend(%s, 10000)", (backend,)) == [(True,)]
        began = time.monotonic()
        with pytest.raises(LedgerStorageError) as caught:
            accountant.compose(EpsilonDeltaEvent(0.4, 1e-7))
        assert time.monotonic() - began < 5.0
        failure = caught.value
        assert shown in str(failure) and _server_failure(failure, shown), repr(failure)
        for text in (str(failure), repr(failure), repr(failure.__cause__), repr(failure.__context__)):
            assert SECRET not in text, text
        assert not isinstance(failure, psycopg.Error)
        assert accountant.spent() == spent  # an accountant that raises leaves its state unchanged
        # Every later call fails at once the same way (no hang, no AttributeError, no raw psycopg error), reads
        # included; verify() either raises it or returns a failed verdict.
        for attempt in (lambda: accountant.compose(EpsilonDeltaEvent(0.4)), lambda: ledger.head_record,
                        lambda: ledger.row_count, lambda: list(ledger.rows()), lambda: ledger.runs,
                        lambda: ledger.sync(accountant), lambda: ledger.begin_run({"mechanism": "test"})):
            began = time.monotonic()
            with pytest.raises(LedgerStorageError) as again:
                attempt()
            assert time.monotonic() - began < 5.0
            assert _server_failure(again.value, shown) and SECRET not in str(again.value), repr(again.value)
        try:
            verdict = ledger.verify()
        except LedgerStorageError as exc:
            assert SECRET not in str(exc) and shown in str(exc)
        else:
            assert not verdict.ok and SECRET not in verdict.message
        assert accountant.spent() == spent
    finally:
        ledger.close()
    ledger.close()  # idempotent after a lost connection
    with pytest.raises(LedgerStorageError, match="is closed"):
        ledger.row_count  # noqa: B018  (a closed store says so, as an SQLite one raises sqlite3.Error)
    assert _sql(postgres_database, "SELECT count(*) FROM budget.charges") == [(4,)]
    with Ledger.open(url) as reopened:
        result = reopened.verify()
        assert result.ok, result.message
        assert reopened.head_record == committed and result.rows == 4
        assert result.spent == pytest.approx(spent)
        resumed = BasicCompositionAccountant(budget=BUDGET, ledger=reopened)
        assert resumed.spent() == pytest.approx(spent)


def test_a_connection_lost_inside_a_long_read_raises_a_storage_error(postgres_server, postgres_database, monkeypatch):
    """The server-side cursor of a long read (verify's rows, a few at a time) loses its connection midway."""
    from pate_accountant._ledger import postgres_store

    monkeypatch.setattr(postgres_store, "ITERSIZE", 2)
    url = _url(postgres_database)
    with Ledger.open(url) as writer:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=writer)
        for _ in range(7):
            accountant.compose(EpsilonDeltaEvent(0.01))
    reader = Ledger.open(url, read_only=True)
    try:
        store = reader._store
        with store.read():
            rows = store.rows()
            assert isinstance(rows, postgres_store._ServerRows)
            first = [next(rows), next(rows), next(rows)]  # the second page is read
            assert [row[0] for row in first] == [1, 2, 3]
            backend = store._conn.info.backend_pid
            assert _sql(postgres_database, "SELECT pg_terminate_backend(%s, 10000)", (backend,)) == [(True,)]
            next(rows)  # still in the page fetched before
            with pytest.raises(LedgerStorageError) as caught:
                list(rows)
            assert _server_failure(caught.value, url), repr(caught.value)
            assert list(rows) == []  # the cursor is forgotten: nothing more, no other error
    finally:
        reader.close()


# -- 4. a forged row with a recomputed chain: verify() alone passes, a pin and a signed checkpoint do not -------
def _forge_inserted_row(database_url: str, at: int) -> None:
    """What a client with write access does: drop the append-only trigger, insert a well-formed row at ``at``
    (the later rows moved up one), recompute every hash and stored total, and move the head."""
    with psycopg.connect(database_url) as conn:  # one transaction
        conn.execute("DROP TRIGGER charges_append_only ON budget.charges")
        meta = dict(conn.execute("SELECT key, value FROM budget.meta"))
        rows = [list(row) for row in conn.execute(f"SELECT {ledger_module._ROW_COLUMNS} FROM budget.charges "
                                                  "ORDER BY id")]
        rows.insert(at - 1, list(rows[at - 1]))  # a copy of row ``at``: a charge of the same kind, well formed
        conn.execute("DELETE FROM budget.charges")
        prev, replay = ledger_module._genesis_hash(meta), BasicCompositionAccountant()
        for number, row in enumerate(rows, start=1):
            row[0], row[1] = number, prev
            replay.compose(ledger_module._Codec().decode(row[3]), row[4])
            if row[7] is not None:
                row[7], row[8] = replay.spent()
            row[2] = ledger_module._row_hash(prev, *row[0:1], *row[3:])
            conn.execute(f"INSERT INTO budget.charges ({ledger_module._ROW_COLUMNS}) "
                         "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", row)
            prev = row[2]
        conn.execute("UPDATE budget.head SET row_count = %s, last_hash = %s WHERE id = 1", (len(rows), prev))


def test_a_forged_row_with_a_recomputed_chain_passes_verify_but_not_a_pin_or_a_signed_checkpoint(
        postgres_database, tmp_path):
    url = _url(postgres_database)
    private, public = generate_key(tmp_path / "operator.key")
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for eps in (0.5, 0.1, 0.3):
            accountant.compose(EpsilonDeltaEvent(eps, 1e-8))
        pin = ledger.head_record  # written down elsewhere
        checkpoint = sign_checkpoint(ledger, load_private_key(private))
        accountant.compose(EpsilonDeltaEvent(0.05, 1e-8))  # an honest later charge extends both
        assert history_problem(ledger, rows=pin["rows"], head_hash=pin["head_hash"], record="pinned") is None
        assert check_checkpoints(ledger, [checkpoint], load_public_key(public)).ok
    _forge_inserted_row(postgres_database, 2)
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message  # the chain alone cannot tell: every hash and total is consistent
        assert result.rows == 5 and result.spent[0] == pytest.approx(1.05)  # 0.1 more than was charged
        assert reader.head_record != pin and reader.row_hash(pin["rows"]) != pin["head_hash"]
        problem = history_problem(reader, rows=pin["rows"], head_hash=pin["head_hash"], record="pinned")
        assert problem is not None and "does not have the pinned head hash" in problem
        signed = check_checkpoints(reader, [checkpoint], load_public_key(public))
        assert not signed.ok and "does not extend signed checkpoint 1" in signed.message, signed.message


# -- 6. a connection that goes silent, a writer that stalls (issue 32, items 1-2) --------------------------------
def _through(proxy, database_url: str, name: str = "budget") -> str:
    port = database_url.split("@127.0.0.1:", 1)[1].split("/", 1)[0]
    return _url(database_url.replace(f"@127.0.0.1:{port}/", f"@127.0.0.1:{proxy.port}/"), name)


def test_a_silent_connection_is_given_up_at_the_statement_deadline(postgres_server, postgres_database, monkeypatch):
    """A stalled proxy keeps the connection open and answers nothing (keepalives see a healthy peer): the charge
    fails at the client-side deadline with one line saying why, the accountant keeps its state, nothing is half
    written, and the ledger audits through a direct connection."""
    import pate_accountant._ledger.postgres_connection as connection_module
    from pg_proxy import StallingProxy

    monkeypatch.setattr(connection_module, "STATEMENT_DEADLINE_S", 2.0)
    with StallingProxy(postgres_server.port) as proxy:
        url = _through(proxy, postgres_database)
        with Ledger.open(url, timeout=1.0) as ledger:  # the write-lock statement: the lock wait, then 2 s
            accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
            accountant.compose(EpsilonDeltaEvent(0.25))
            proxy.stall()
            time.sleep(0.3)  # what the proxy's pumps had in hand is through
            began = time.monotonic()
            with pytest.raises(LedgerStorageError) as failed:
                accountant.compose(EpsilonDeltaEvent(0.5))
            assert time.monotonic() - began < 5.0
            message = str(failed.value)
            assert "did not answer within" in message and "stalled network, proxy or pooler" in message
            assert _server_failure(failed.value, "budget") and accountant.spent()[0] == pytest.approx(0.25)
    with Ledger.open(_url(postgres_database)) as ledger:
        result = ledger.verify()
        assert result.ok and result.rows == 1


def test_a_first_interrupt_gives_up_an_unanswered_statement_within_a_second(postgres_server, postgres_database):
    """Ctrl-C must act within seconds in every phase: ``Ledger.interrupt()`` (what a run's first Ctrl-C calls)
    cuts the 15 s deadline of a statement the server leaves unanswered to one second."""
    import threading

    from pg_proxy import StallingProxy

    with StallingProxy(postgres_server.port) as proxy:
        with Ledger.open(_through(proxy, postgres_database)) as ledger:
            accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
            accountant.compose(EpsilonDeltaEvent(0.25))
            proxy.stall()
            time.sleep(0.3)
            timer = threading.Timer(0.5, ledger.interrupt)
            timer.start()
            began = time.monotonic()
            with pytest.raises(LedgerStorageError, match="did not answer within 1 s"):
                accountant.compose(EpsilonDeltaEvent(0.5))
            assert time.monotonic() - began < 3.0
            timer.join()


def _stalled_writer(url: str, inside, queue) -> None:
    """Charge once, then stall inside the next charge's transaction (holding the head-row lock) without dying; the
    session's idle-in-transaction limit is the store's (reported), shortened to 2 s here to keep the test short."""
    ledger = Ledger.open(url)
    accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
    accountant.compose(EpsilonDeltaEvent(0.25))
    queue.put(ledger._store._execute("SHOW idle_in_transaction_session_timeout").fetchone()[0])
    ledger._store._execute("SET idle_in_transaction_session_timeout = 2000")

    def hold():
        inside.set()
        time.sleep(600)

    ledger._between_commits = hold
    accountant.compose(EpsilonDeltaEvent(0.5))


def test_a_stalled_writer_does_not_block_the_other_hosts(postgres_server, postgres_database):
    """A host stalled inside a charge (not dead: its socket stays open) held the head-row lock, and every other
    host failed at its lock timeout.  The server now ends a session idle in a transaction (30 s by default), its
    transaction rolls back, and the others charge; a writer that does time out says why."""
    url = _url(postgres_database)
    context = multiprocessing.get_context("spawn")
    inside, queue = context.Event(), context.Queue()
    child = context.Process(target=_stalled_writer, args=(url, inside, queue))
    child.start()
    try:
        assert queue.get(timeout=60) == "30s"
        assert inside.wait(timeout=60), "the child never entered its second transaction"
        with Ledger.open(url, timeout=0.3) as impatient:
            with pytest.raises(LedgerError, match="another writer held the ledger's write lock for the whole 0.3 s "
                                                  "wait .* after 30 s idle in its transaction"):
                BasicCompositionAccountant(budget=BUDGET, ledger=impatient).compose(EpsilonDeltaEvent(0.05))
        with Ledger.open(url, timeout=10.0) as ledger:
            accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
            began = time.monotonic()
            accountant.compose(EpsilonDeltaEvent(0.05))
            assert time.monotonic() - began < 6.0  # the stalled session is ended after 2 s idle
            result = ledger.verify()
            assert result.ok and result.rows == 2 and result.spent[0] == pytest.approx(0.3)
    finally:
        child.kill()
        child.join(timeout=30)
