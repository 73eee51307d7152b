"""The connection under a PostgreSQL ledger: its policy (timeouts, keepalives, deadlines) and the one place every
statement goes through (:class:`PostgresConnection`, the base of :class:`~.postgres_store.PostgresStore`).

Connecting.  :func:`connect` opens a connection in autocommit mode with :data:`CONNECTION_DEFAULTS` for whatever
the URL and libpq's ``PG*`` variables leave unset, so a server that does not answer or a peer gone silent is
given up in seconds, not the operating system's many minutes.  Each session then sets ``lock_timeout`` (the
ledger's ``timeout``), ``idle_in_transaction_session_timeout`` and ``synchronous_commit``.

Deadlines (issue 32, items 1-2).  A connection that goes silent but stays open (a stalled proxy or pooler: TCP
keepalives and ``tcp_user_timeout`` see nothing wrong) would block a statement for ever, and a host stalled inside
a write transaction would hold the head-row lock that every writer needs.  So every statement runs under a
client-side deadline (:data:`STATEMENT_DEADLINE_S`; a statement that waits for a lock: the lock wait plus that): a
watchdog thread shuts the connection's socket down when a statement outlives it, the statement fails at once, and
the error says that the server did not answer in time.  :meth:`PostgresConnection.interrupt` (a run's first
Ctrl-C) cuts the deadline of a statement under way to one second.  And every session sets
``idle_in_transaction_session_timeout`` (:data:`IDLE_IN_TRANSACTION_S`): the server ends a session that stays idle
inside a transaction that long (its transaction is rolled back), so a stalled writer releases the head-row lock
before the others' lock wait (60 s by default) runs out, and a writer that times out waiting names that cause.

Errors.  Every statement goes through one helper (:meth:`PostgresConnection._execute`) and no psycopg exception
leaves the store: a driver error becomes :class:`~.errors.LedgerStorageError`, one line naming the ledger by its
shown location and the driver's error class, never the password, with no driver exception chained.  The few that
mean something specific keep their own handling first (the caller names them in ``keep``).  A lost connection
(server stopped or restarted, backend terminated, network cut) is not re-established: the transaction under way
is the server's to roll back, and every later call raises ``LedgerStorageError`` at once until the store is
closed.  A connection lost *during* ``COMMIT`` says that the outcome is unknown: reopen the ledger to see.  Errors
that are not about the connection (a table dropped under the ledger) are :class:`_UnreadableLedger`, the store's
``errors``, so ``verify()`` reports them as an unreadable ledger; a lost connection raises from ``verify()``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

from pate_accountant._ledger.errors import LedgerError, LedgerStorageError
from pate_accountant._ledger.postgres_url import parse_url, scrub_secrets

#: libpq settings a ledger connection gets unless its URL or ``PG*`` variables say otherwise: a server that does not
#: answer is given up after ``connect_timeout`` seconds, and a peer gone silent (a network cut that sends no reset)
#: is noticed by TCP keepalives on an idle connection and by ``tcp_user_timeout`` (milliseconds) on one that waits
#: for an acknowledgement, instead of the operating system's default of many minutes.
CONNECTION_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                       "keepalives_interval": "10", "keepalives_count": "3", "tcp_user_timeout": "60000"}
_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}  # the one of them libpq also reads from a variable


def connect(pg, conninfo: str):
    """A connection in autocommit mode, with :data:`CONNECTION_DEFAULTS` for whatever ``conninfo`` (a URL) and
    the ``PG*`` variables leave unset."""
    given = pg.conninfo.conninfo_to_dict(conninfo)
    extra = {key: value for key, value in CONNECTION_DEFAULTS.items()
             if key not in given and not os.environ.get(_ENVIRONMENT.get(key, ""))}
    return pg.connect(conninfo, autocommit=True, **extra)


#: Seconds a statement may go unanswered before its connection is given up (the head-row lock statement gets the
#: lock wait on top); far above what a statement of a healthy ledger takes.
STATEMENT_DEADLINE_S = 15.0
#: Seconds a session may stay idle inside a transaction before the server ends it (and releases its locks).
IDLE_IN_TRANSACTION_S = 30

#: ``synchronous`` of :meth:`Ledger.open` as PostgreSQL's ``synchronous_commit``.
_SYNCHRONOUS_COMMIT = {"FULL": "on", "EXTRA": "on", "NORMAL": "off"}


class _Watchdog:
    """Gives up a connection whose statement outlives its deadline: one daemon thread per store, which shuts the
    connection's socket down (the blocked statement then fails at once, as on a lost connection) and records the
    deadline that ran out in :attr:`fired`.  :meth:`arm` before a statement, :meth:`disarm` after it; two attribute
    writes, so a statement pays nothing noticeable."""

    def __init__(self, conn):
        self._conn = conn
        self._deadline = None
        self._seconds = None
        self.fired = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pate-ledger-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float) -> None:
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds

    def disarm(self) -> None:
        self._deadline = None

    def hurry(self, seconds: float = 1.0) -> None:
        """Cut the deadline of a statement under way to ``seconds`` from now (a healthy one ends well before)."""
        deadline = self._deadline
        if deadline is not None and deadline > time.monotonic() + seconds:
            self._seconds = seconds
            self._deadline = time.monotonic() + seconds

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self.fired = self._seconds
                self._cut()
                return

    def _cut(self) -> None:
        with contextlib.suppress(Exception):  # already closed: nothing to cut
            dup = socket.socket(fileno=os.dup(self._conn.pgconn.socket))
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()

    def close(self) -> None:
        self._stop.set()


def _import_psycopg():
    try:
        import psycopg
    except ImportError:
        raise LedgerError("a PostgreSQL ledger needs psycopg 3: install pate-accountant with the 'postgresql' extra "
                          "(pip install 'pate-accountant[postgresql]')") from None
    return psycopg


class _UnreadableLedger(LedgerStorageError):
    """A driver error that is not about the connection (a table dropped or altered under the ledger, a privilege
    missing, a value the layout refuses): :meth:`Ledger.verify` reports such a ledger as not readable (the
    store's ``errors``) where a lost connection raises."""



class PostgresConnection:
    """One connection to the server of a PostgreSQL ledger, and every statement made on it (see the module
    docstring): the base of :class:`~.postgres_store.PostgresStore`, which adds the ledger's layout and tables.
    ``PostgresConnection(url, ...)`` parses the URL (never showing its password) and imports psycopg; nothing
    connects before :meth:`_connect`."""

    def __init__(self, url: str, *, synchronous: str, timeout: float):
        self._conninfo, self._name, self._location, self._secrets = parse_url(url)
        self._pg = _import_psycopg()
        self._synchronous_commit = _SYNCHRONOUS_COMMIT.get(str(synchronous).upper(), "on")
        self._timeout = timeout
        self._conn = None
        self._doing_what = None  # (template, where) of the operation under way, for its error messages
        self._watchdog = None  # gives up a statement the server leaves unanswered (_connect)

    # -- connecting --------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Connect (:func:`connect`) and start the watchdog; :class:`LedgerStorageError` when the server cannot
        be reached."""
        pg = self._pg
        failure = None
        try:
            conn = connect(pg, self._conninfo)
        except pg.Error as exc:
            failure = self._fail("cannot connect to the PostgreSQL ledger", exc, LedgerStorageError)
        if failure is not None:
            raise failure
        self._conn = conn
        self._watchdog = _Watchdog(conn)

    def _set_limits(self) -> None:
        """The session's limits: how long a lock is waited for (``timeout``), how long the session may stay idle
        inside a transaction (:data:`IDLE_IN_TRANSACTION_S`), and ``synchronous_commit``."""
        wait_ms = max(1, int(self._timeout * 1000))
        self._execute(f"SET lock_timeout = {wait_ms}")
        self._execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_S * 1000}")
        self._execute(f"SET synchronous_commit = {self._synchronous_commit}")

    def _disconnect(self) -> None:
        """Roll back what is open, close the connection (also after it was lost) and stop the watchdog."""
        conn = self._conn
        if conn is not None:
            self._rollback()
            self._conn = None
            with contextlib.suppress(self._pg.Error):
                conn.close()  # also releases the session's advisory locks
        if self._watchdog is not None:
            self._watchdog.close()

    # -- driver errors ------------------------------------------------------------------------------------------
    def _scrub(self, text) -> str:
        return scrub_secrets(text, self._secrets)

    def _fail(self, what: str, exc, cls=LedgerError) -> LedgerError:
        return cls(f"{what} {self._location!r}: {self._driver_text(exc)}")

    def _driver_text(self, exc) -> str:
        """A driver error's message on one line, without the password: the server's primary message when it sent
        one (no statement text, no ``LINE 1:`` context), else the first line of the driver's own."""
        primary = getattr(getattr(exc, "diag", None), "message_primary", None)
        text = primary or (str(exc).strip().splitlines() or [""])[0]
        return " ".join(self._scrub(text).split()) or type(exc).__name__

    def _lost(self) -> bool:
        conn = self._conn
        return conn is None or conn.closed

    def _storage_error(self, exc) -> LedgerStorageError:
        """The :class:`LedgerStorageError` a driver error ``exc`` is raised as (module docstring, "Errors")."""
        pg = self._pg
        lost = self._lost()
        cls = LedgerStorageError if lost or isinstance(exc, (pg.OperationalError, pg.InterfaceError)) \
            else _UnreadableLedger
        text = self._driver_text(exc)
        fired = None if self._watchdog is None else self._watchdog.fired
        if fired is not None:
            cls = LedgerStorageError
            text = (f"the server did not answer within {fired:g} s (a silent connection: a stalled network, proxy "
                    "or pooler), so the connection was given up")
        if self._doing_what is not None:
            template, where = self._doing_what
            return cls(f"{template.format(where=repr(where))}: {text}")
        if lost:
            return cls(f"lost the connection to the PostgreSQL ledger {self._location!r} ({text}); it does not "
                       "reconnect: close the ledger and open it again")
        return cls(f"the PostgreSQL ledger {self._location!r} failed ({text})")

    @contextlib.contextmanager
    def _doing(self, template: str, where: str | None = None):
        """Name what is under way in the errors raised meanwhile (``template`` with ``{where}``, the location)."""
        before, self._doing_what = self._doing_what, (template, self._location if where is None else where)
        try:
            yield
        finally:
            self._doing_what = before

    # -- statements ---------------------------------------------------------------------------------------------
    def _live(self):
        conn = self._conn
        if conn is None:
            raise LedgerStorageError(f"the PostgreSQL ledger {self._location!r} is closed")
        return conn

    @contextlib.contextmanager
    def _deadline(self, lock_wait: float = 0.0):
        """The watchdog's deadline around one statement (module docstring, "Deadlines"): :data:`STATEMENT_DEADLINE_S`,
        plus ``lock_wait`` seconds for a statement that may wait that long for a lock (the server's wait)."""
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        watchdog.arm(lock_wait + STATEMENT_DEADLINE_S)
        try:
            yield
        finally:
            watchdog.disarm()

    def interrupt(self) -> None:
        """Give a statement under way one more second (a run's first Ctrl-C): a healthy one ends well before, one
        the server leaves unanswered fails then instead of at its deadline.  Safe from a signal handler."""
        if self._watchdog is not None:
            self._watchdog.hurry(1.0)

    def _execute(self, query, params=None, *, keep=(), lock_wait: float = 0.0):
        """Every statement goes through here: a client-side cursor with the result fetched, or
        :class:`LedgerStorageError` for a driver error (those of the classes in ``keep`` excepted: the caller
        handles them), under the client-side deadline (:meth:`_deadline`; ``lock_wait``: the seconds the server
        may wait for a lock on top)."""
        conn = self._live()
        try:
            with self._deadline(lock_wait):
                return conn.execute(query, params)
        except keep:
            raise
        except self._pg.Error as exc:
            failure = self._storage_error(exc)
        raise failure  # outside the except block: the driver's exception is not chained

    def _executemany(self, query, rows) -> None:
        conn = self._live()
        try:
            with self._deadline(), conn.cursor() as cursor:
                cursor.executemany(query, rows)
            return
        except self._pg.Error as exc:
            failure = self._storage_error(exc)
        raise failure

    # -- transactions ---------------------------------------------------------------------------------------
    def _rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return  # a lost connection: the server rolled the transaction back when it lost it
        if conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(self._pg.Error), self._deadline():
                conn.execute("ROLLBACK")

    def _commit(self) -> None:
        conn = self._live()
        try:
            with self._deadline():
                conn.execute("COMMIT")
            return
        except self._pg.Error as exc:
            text = self._driver_text(exc)
            if self._lost():
                failure = LedgerStorageError(
                    f"lost the connection to the PostgreSQL ledger {self._location!r} during COMMIT ({text}): "
                    "whether the transaction committed is unknown (it does not reconnect: open the ledger again "
                    "to see; the ledger, not the accountant that raised, is the truth)")
            else:  # the server refused the commit: it rolled the transaction back
                failure = LedgerStorageError(f"the PostgreSQL ledger {self._location!r} refused the commit ({text}): "
                                             "nothing of the transaction is stored")
        raise failure
