"""The PostgreSQL store (:class:`~.store.LedgerStore`): one ledger kept in a PostgreSQL database through psycopg 3.

``Ledger.open("postgresql://USER@HOST:PORT/DB?ledger=NAME")`` keeps the ledger ``NAME`` (default ``ledger``) in two
schemas of database ``DB``: the **shareable** part in schema ``NAME`` (tables ``meta``, ``charges``, ``runs``,
``head``) and the **confidential** part in schema ``NAME_confidential`` (``meta``, ``charges``, ``totals``,
``head``), with the columns of the SQLite files (``bigint``, ``double precision``, ``text``: psycopg returns
``int``, ``float`` and ``str`` exactly as stored, which the hashes need).  So an operator can grant an auditor's
role ``USAGE`` on the shareable schema and ``SELECT`` on its tables, and nothing on the confidential one.

Credentials.  Only the URL, libpq's ``PG*`` environment variables and its service and password files say how to
connect.  The ``ledger`` query parameter is removed before connecting; the password (in the URL's user part or a
``password`` parameter) appears in no error message, no :attr:`PostgresStore.location`, no ``repr`` and nothing
stored in the ledger.

Creating.  A new ledger is both its schema and its tables, made in one transaction (PostgreSQL's DDL is
transactional): another connection sees all of it or none.  Creators of the same name are serialised by a
transaction-level advisory lock (``pg_advisory_xact_lock(h, 1)``, ``h`` a hash of the name), so one creates and
the others open what it made.  A schema that exists is one of our ledgers only when it has our tables and
the ``schema_version`` we write; anything else is refused and left as it is.

Transactions.  One connection per :class:`PostgresStore`, in autocommit mode, with explicit transactions:

* :meth:`PostgresStore.write` is one ``READ COMMITTED`` transaction that first locks the head row
  (``SELECT ... FROM NAME.head WHERE id = 1 FOR UPDATE``; with ``confidential`` then the confidential head row,
  always in that order).  Every writer on every host takes that row lock first, so writers serialise and every
  statement after it (a new snapshot each, under ``READ COMMITTED``) reads the head the new rows extend.  The
  wait is bounded by ``lock_timeout`` (the ``timeout`` given, ``LedgerError`` past it).
* Both parts are written in **that one transaction** on one connection, not two.  The contract asks that the
  confidential part be committed first, so that no shareable row ever names a confidential row that is not
  committed; one atomic commit of both schemas gives that and more: there is no moment at which either part is
  committed without the other, so a writer stopped at any point (``between_commits()`` is called just before
  the single ``COMMIT``) leaves no orphan confidential rows at all (:meth:`drop_confidential_orphans` still
  works, for a ledger copied in from elsewhere).  Two connections would need a two-phase commit to be as strong.
* :meth:`PostgresStore.read` is one ``REPEATABLE READ, READ ONLY`` transaction: a single snapshot of both
  schemas, which is what "the shareable snapshot first, then the confidential one" is there to approximate.

Long reads.  :meth:`PostgresStore.rows`, ``runs``, ``confidential_rows``, ``confidential_teachers`` and
``confidential_totals`` inside a :meth:`~PostgresStore.read` or :meth:`~PostgresStore.write` transaction take a
first page of :data:`ITERSIZE` rows in one statement (a writer's catch-up on a few rows: one round trip) and,
only when it comes back full, declare a server-side (named) cursor and fetch :data:`ITERSIZE` rows a round trip,
so verifying or catching up on a long ledger never holds it all in memory; the iterator is valid until the
transaction ends.  Outside a transaction
(autocommit: a cursor without ``WITH HOLD`` ends with its statement) they are one statement fetched whole.

Deadlines (issue 32, items 1-2).  A connection that goes silent but stays open (a stalled proxy or pooler: TCP
keepalives and ``tcp_user_timeout`` see nothing wrong) would block a statement for ever, and a host stalled inside
a write transaction would hold the head-row lock that every writer needs.  So every statement runs under a
client-side deadline (:data:`STATEMENT_DEADLINE_S`; the head-row lock statement: the lock wait plus that): a
watchdog thread shuts the connection's socket down when a statement outlives it, the statement fails at once, and
the error says that the server did not answer in time.  :meth:`PostgresStore.interrupt` (a run's first Ctrl-C)
cuts the deadline of a statement under way to one second.  And every session sets
``idle_in_transaction_session_timeout`` (:data:`IDLE_IN_TRANSACTION_S`): the server ends a session that stays idle
inside a transaction that long (its transaction is rolled back), so a stalled writer releases the head-row lock
before the others' lock wait (60 s by default) runs out, and a writer that times out waiting names that cause.

Errors.  Every statement goes through one helper (:meth:`PostgresStore._execute`) and no psycopg exception leaves
the store: a driver error becomes :class:`~.errors.LedgerStorageError`, one line naming the ledger by its shown
location and the driver's error class, never the password, with no driver exception chained.  The few that mean
something specific keep their own handling first (the lock timeout is ``LedgerError`` "cannot start a write
transaction", as SQLite's; a role that may not read the confidential schema opens it as absent).  A lost
connection (server stopped or restarted, backend terminated, network cut) is not re-established: the transaction
under way is the server's to roll back (nothing half-written: both schemas commit in one ``COMMIT``), and every
later call raises ``LedgerStorageError`` at once until :meth:`~PostgresStore.close` (which still works).  A
connection lost *during* ``COMMIT`` says that the outcome is unknown: reopen the ledger to see.  Errors that are
not about the connection (a table dropped under the ledger) are a private subclass in the store's ``errors``, so
``verify()`` reports them as an unreadable ledger; a lost connection raises from ``verify()``.

In use, and discarding.  A :class:`PostgresStore` holds a session-level *shared* advisory lock
(``pg_advisory_lock_shared(h, 2)``) from before it first looks at the ledger until its connection closes: that is
what "another connection uses the ledger" means here.  :meth:`PostgresStore.discard_if_unused` gives its own
shared lock up and asks for the exclusive one without waiting (granted only when no other store has the ledger
open, on any host), checks under the head row lock that there is no row and no run, and drops the schemas in the
same transaction.  An opener that arrives meanwhile waits for the shared lock, then finds no schema and creates
the ledger afresh; it can never see a half-removed one, so no "discarded" mark is needed (a mark found in the
metadata is refused).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from pate_accountant._ledger.errors import LedgerError, LedgerIntegrityError, LedgerStorageError, _Discarded
from pate_accountant._ledger.sqlite_files import DEFAULT_TIMEOUT, DISCARDED_KEY
from pate_accountant._ledger.store import (
    CONFIDENTIAL_SCHEMA_VERSION,
    LEDGER_TABLES,
    SCHEMA_VERSION,
    StoreIdentity,
)

#: URL schemes routed to this store by :meth:`Ledger.open`.
URL_SCHEMES = ("postgresql://", "postgres://")
#: The ledger name when the URL has no ``ledger`` parameter.
DEFAULT_LEDGER_NAME = "ledger"
#: A ledger name: a lower-case SQL identifier short enough for ``NAME_confidential`` (PostgreSQL: 63 bytes).
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,49}")
_CONF_SUFFIX = "_confidential"
CONFIDENTIAL_TABLES = frozenset({"meta", "charges", "totals", "head"})

_ROW_COLUMNS = ("id, prev_hash, hash, event, count, outcome, commitment, spent_epsilon, spent_delta, created, "
                "writer, run, grp")
_RUN_COLUMNS = "id, prev_hash, hash, first_row, metadata, created, writer"
_CONF_COLUMNS = "id, prev_hash, hash, share_row, share_hash, salt, charged_teachers"

# Trigger functions of each schema: refuse a change (TG_ARGV[0] says which), and freeze the metadata once rows
# exist (the head is read from the schema of the table the trigger fires on).
_FUNCTIONS = """
CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$;
CREATE FUNCTION {s}.meta_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  EXECUTE format('SELECT row_count FROM %I.head WHERE id = 1', TG_TABLE_SCHEMA) INTO n;
  IF n > 0 THEN RAISE EXCEPTION 'ledger metadata is frozen once rows exist'; END IF;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END $$;
CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL);
"""

_SCHEMA = _FUNCTIONS + """
CREATE TABLE {s}.charges (
    id            bigint PRIMARY KEY,
    prev_hash     text NOT NULL,
    hash          text NOT NULL,
    event         text NOT NULL,
    count         bigint NOT NULL,
    outcome       text,
    commitment    text,
    spent_epsilon double precision,
    spent_delta   double precision,
    created       double precision NOT NULL,
    writer        text NOT NULL,
    run           bigint,
    grp           bigint
);
CREATE TABLE {s}.runs (
    id        bigint PRIMARY KEY,
    prev_hash text NOT NULL,
    hash      text NOT NULL,
    first_row bigint NOT NULL,
    metadata  text NOT NULL,
    created   double precision NOT NULL,
    writer    text NOT NULL
);
CREATE TABLE {s}.head (
    id            bigint PRIMARY KEY CHECK (id = 1),
    row_count     bigint NOT NULL,
    last_hash     text,
    run_count     bigint NOT NULL,
    run_last_hash text
);
INSERT INTO {s}.head (id, row_count, last_hash, run_count, run_last_hash) VALUES (1, 0, NULL, 0, NULL);
CREATE TRIGGER charges_append_only BEFORE UPDATE OR DELETE ON {s}.charges
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('ledger rows are append-only');
CREATE TRIGGER charges_no_truncate BEFORE TRUNCATE ON {s}.charges
FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse('ledger rows are append-only');
CREATE TRIGGER runs_append_only BEFORE UPDATE OR DELETE ON {s}.runs
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('ledger runs are append-only');
CREATE TRIGGER runs_no_truncate BEFORE TRUNCATE ON {s}.runs
FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse('ledger runs are append-only');
CREATE TRIGGER meta_frozen BEFORE UPDATE OR DELETE ON {s}.meta
FOR EACH ROW EXECUTE FUNCTION {s}.meta_frozen();
"""

_CONFIDENTIAL_SCHEMA = _FUNCTIONS + """
CREATE TABLE {s}.charges (
    id               bigint PRIMARY KEY,
    prev_hash        text NOT NULL,
    hash             text NOT NULL,
    share_row        bigint NOT NULL,
    share_hash       text NOT NULL,
    salt             text NOT NULL,
    charged_teachers text NOT NULL
);
CREATE TABLE {s}.totals (
    share_row     bigint PRIMARY KEY,
    share_hash    text NOT NULL,
    spent_epsilon double precision NOT NULL,
    spent_delta   double precision NOT NULL
);
CREATE TABLE {s}.head (
    id        bigint PRIMARY KEY CHECK (id = 1),
    row_count bigint NOT NULL,
    last_hash text
);
INSERT INTO {s}.head (id, row_count, last_hash) VALUES (1, 0, NULL);
CREATE TRIGGER charges_append_only BEFORE UPDATE ON {s}.charges
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('confidential rows are append-only');
CREATE TRIGGER totals_append_only BEFORE UPDATE ON {s}.totals
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('confidential totals are append-only');
"""

#: Rows fetched per round trip from a server-side cursor (:meth:`PostgresStore.rows` and the other long reads).
ITERSIZE = 2000

#: ``synchronous`` of :meth:`Ledger.open` as PostgreSQL's ``synchronous_commit``.
_SYNCHRONOUS_COMMIT = {"FULL": "on", "EXTRA": "on", "NORMAL": "off"}


def is_postgres_url(location) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


def url_secrets(url: str) -> tuple:
    """What of ``url`` must never be shown: its password (the user part's, raw and decoded, and a ``password``
    parameter's), longest first."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL (an unbalanced IPv6 bracket): whatever follows "//" up to "@" may be a password
        userinfo = url.split("://", 1)[-1].rpartition("@")[0]
        password = userinfo.partition(":")[2]
        return tuple(sorted({p for p in (password, unquote(password)) if p}, key=len, reverse=True))
    secrets = [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if key == "password"]
    if "@" in parts.netloc:
        _user, colon, password = parts.netloc.rsplit("@", 1)[0].partition(":")
        if colon:
            secrets += [password, unquote(password)]
    return tuple(sorted({s for s in secrets if s}, key=len, reverse=True))


def scrub_secrets(text, secrets) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    text = str(text)
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def parse_url(url: str) -> tuple[str, str, str, tuple]:
    """``(conninfo, ledger name, shown location, secrets)``: the URL to connect with (the ``ledger`` parameter
    removed), the ledger's name, the URL as messages show it (no password anywhere) and the secrets that must
    never be shown (the password, raw and decoded)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced IPv6 bracket
        raise LedgerError(f"not a valid PostgreSQL ledger URL ({exc}; an IPv6 host goes in brackets: "
                          "postgresql://USER@[::1]:5432/DB)") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = [value for key, value in query if key == "ledger"]
    netloc = parts.netloc
    shown_netloc = netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        shown_netloc = f"{userinfo.partition(':')[0]}@{hosts}"
    secrets = url_secrets(url)
    if len(names) > 1:
        raise LedgerError("a PostgreSQL ledger URL names one ledger: give the ledger parameter once")
    name = names[0] if names else DEFAULT_LEDGER_NAME
    if not _NAME.fullmatch(name) or name.startswith("pg_") or name.endswith(_CONF_SUFFIX):
        raise LedgerError(f"invalid ledger name {name!r} in a PostgreSQL ledger URL: use 1 to 50 lower-case letters, "
                          "digits and underscores, starting with a letter or underscore (and not with 'pg_'; not "
                          f"ending with '{_CONF_SUFFIX}', the suffix of every ledger's confidential schema)")
    rest = [(key, value) for key, value in query if key != "ledger"]
    conninfo = _join(parts.scheme, netloc, parts.path, urlencode(rest))
    shown_query = urlencode([(key, value) for key, value in rest if key != "password"] + [("ledger", name)])
    shown = _join(parts.scheme, shown_netloc, parts.path, shown_query)
    return conninfo, name, shown, secrets


def _join(scheme: str, netloc: str, path: str, query: str) -> str:
    """A URL from its parts, keeping the ``//`` of an empty host (``postgresql:///?service=NAME``: libpq's service
    file names the server), which :func:`urllib.parse.urlunsplit` drops and libpq then cannot read."""
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


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
    import os

    given = pg.conninfo.conninfo_to_dict(conninfo)
    extra = {key: value for key, value in CONNECTION_DEFAULTS.items()
             if key not in given and not os.environ.get(_ENVIRONMENT.get(key, ""))}
    return pg.connect(conninfo, autocommit=True, **extra)


#: Seconds a statement may go unanswered before its connection is given up (the head-row lock statement gets the
#: lock wait on top); far above what a statement of a healthy ledger takes.
STATEMENT_DEADLINE_S = 15.0
#: Seconds a session may stay idle inside a transaction before the server ends it (and releases its locks).
IDLE_IN_TRANSACTION_S = 30


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


class _Snapshot:
    """The open read transaction of :meth:`PostgresStore.read`: one snapshot of both schemas."""

    def __init__(self, store: PostgresStore):
        self._store = store

    def add_confidential(self) -> None:
        """Nothing to start: the ``REPEATABLE READ`` snapshot already covers the confidential schema."""


class _ServerRows:
    """The rows of a server-side (named) cursor declared inside the open transaction, fetched :data:`ITERSIZE` at
    a time; an iterator of tuples, as a client-side cursor is.  Exhausted, it closes the cursor on the server at
    once; left unfinished it only forgets it (no statement from a finaliser, which may run at any moment): the
    server closes it with the transaction."""

    def __init__(self, store: PostgresStore, cursor):
        self._store = store
        self._cursor = cursor
        self._page: list = []
        self._at = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self._at >= len(self._page):
            cursor = self._cursor
            if cursor is None:
                raise StopIteration
            store = self._store
            failure = None
            try:
                with store._deadline():
                    self._page = cursor.fetchmany(ITERSIZE)
            except store._pg.Error as exc:
                failure = store._storage_error(exc)
            if failure is not None:
                self._forget()
                raise failure
            self._at = 0
            if len(self._page) < ITERSIZE:  # the last page: close the cursor on the server now
                self._cursor = None
                try:
                    cursor.close()
                except store._pg.Error:  # the connection's trouble shows on its next statement
                    store._pg.Cursor.close(cursor)
            if not self._page:
                raise StopIteration
        row = self._page[self._at]
        self._at += 1
        return row

    def _forget(self) -> None:
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            self._store._pg.Cursor.close(cursor)  # the client side only: no statement

    def __del__(self):
        self._forget()


class PostgresStore(StoreIdentity):
    """A ledger kept in PostgreSQL (see the module docstring).  ``PostgresStore(url, ...)`` parses the URL and
    checks the arguments; :meth:`open` connects (creating the ledger where its schema does not exist).  One store
    is one connection: use it from one thread, in one process.

    Every driver error of every method (and of the statements inside :meth:`read` and :meth:`write`) is raised as
    :class:`LedgerStorageError`, one line naming the ledger by :attr:`location` and the driver's error class,
    never the password, and chained to nothing (the driver's text is scrubbed; its exception is not kept).  A lost
    connection is not re-established: every later call raises :class:`LedgerStorageError` at once, and
    :meth:`close` still works."""

    def __init__(self, url: str, *, read_only: bool = False, synchronous: str = "FULL",
                 timeout: float = DEFAULT_TIMEOUT):
        self._conninfo, self._name, self._location, self._secrets = parse_url(url)
        self._pg = _import_psycopg()
        self.errors = (_UnreadableLedger,)
        self._read_only = read_only
        self._synchronous_commit = _SYNCHRONOUS_COMMIT.get(str(synchronous).upper(), "on")
        self._timeout = timeout
        self._schema = f'"{self._name}"'
        self._conf_schema = f'"{self._name}{_CONF_SUFFIX}"'
        self._conn = None
        self._created_here = False
        self._creating = False  # inside the transaction that creates the ledger: check_layout lays it out
        self._laid_out = False  # the layout was checked: the tables exist
        self._conf_open = False
        self._conf_created_here = False
        self._busy = False
        self._doing_what = None  # (template, where) of the operation under way, for its error messages
        self._cursors = 0  # server-side cursors declared on this connection (their names)
        self._watchdog = None  # gives up a statement the server leaves unanswered (open)

    # -- identity ----------------------------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return self._location

    @property
    def confidential_location(self) -> str:
        return f"{self._location} (schema {self._name}{_CONF_SUFFIX})"

    @property
    def has_confidential(self) -> bool:
        return self._conf_open

    @property
    def name(self) -> str:
        """The ledger's name: its shareable schema."""
        return self._name

    def __repr__(self):
        return f"PostgresStore({self._location!r}{', read-only' if self._read_only else ''})"

    def _scrub(self, text) -> str:
        return scrub_secrets(text, self._secrets)

    def _fail(self, what: str, exc, cls=LedgerError) -> LedgerError:
        return cls(f"{what} {self._location!r}: {self._driver_text(exc)}")

    # -- driver errors ------------------------------------------------------------------------------------------
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
        """The :class:`LedgerStorageError` a driver error ``exc`` is raised as (see the class docstring)."""
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

    def _live(self):
        conn = self._conn
        if conn is None:
            raise LedgerStorageError(f"the PostgreSQL ledger {self._location!r} is closed")
        return conn

    @contextlib.contextmanager
    def _deadline(self, seconds: float | None = None):
        """The watchdog's deadline around one statement (module docstring, "Deadlines"; default
        :data:`STATEMENT_DEADLINE_S`)."""
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        watchdog.arm(STATEMENT_DEADLINE_S if seconds is None else seconds)
        try:
            yield
        finally:
            watchdog.disarm()

    def interrupt(self) -> None:
        """Give a statement under way one more second (a run's first Ctrl-C): a healthy one ends well before, one
        the server leaves unanswered fails then instead of at its deadline.  Safe from a signal handler."""
        if self._watchdog is not None:
            self._watchdog.hurry(1.0)

    def _execute(self, query, params=None, *, keep=(), deadline: float | None = None):
        """Every statement goes through here: a client-side cursor with the result fetched, or
        :class:`LedgerStorageError` for a driver error (those of the classes in ``keep`` excepted: the caller
        handles them), under a client-side ``deadline`` in seconds."""
        conn = self._live()
        try:
            with self._deadline(deadline):
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

    def _stream(self, query, params=None):
        """The rows of a long read.  Inside a transaction (:meth:`read`, :meth:`write`): one page when the rows fit
        in it, else a server-side cursor, :data:`ITERSIZE` rows a round trip (it lives until the transaction ends, so iterate it inside).  Outside
        one (autocommit: a cursor without ``WITH HOLD`` would not outlive its statement): one statement, fetched
        whole, as before."""
        conn = self._live()
        if conn.info.transaction_status != self._pg.pq.TransactionStatus.INTRANS:
            return self._execute(query, params)
        # Most reads are short (a writer catching up on the few rows other writers added): one page, fetched in
        # one round trip, answers them; a server-side cursor (three round trips: DECLARE, FETCH, CLOSE) is
        # declared only when the first page comes back full.  Every query here ends in ORDER BY.
        first = list(self._execute(f"{query} LIMIT {ITERSIZE}", params))
        if len(first) < ITERSIZE:
            return iter(first)
        self._cursors += 1
        cursor = conn.cursor(name=f"pate_ledger_{self._cursors}")
        try:
            with self._deadline():
                cursor.execute(query, params)  # DECLARE: the rows are those of the snapshot at this point
            return _ServerRows(self, cursor)
        except self._pg.Error as exc:
            self._pg.Cursor.close(cursor)
            failure = self._storage_error(exc)
        raise failure

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self, layout) -> None:
        """Connect, take the shared "in use" lock, and create the ledger when its schema does not exist (schema,
        tables and first metadata in one transaction); then check the layout."""
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
        try:
            with self._doing("cannot open the PostgreSQL ledger {where}"):
                wait_ms = max(1, int(self._timeout * 1000))
                self._execute(f"SET lock_timeout = {wait_ms}")
                self._execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_S * 1000}")
                self._execute(f"SET synchronous_commit = {self._synchronous_commit}")
                self._execute("SELECT pg_advisory_lock_shared(hashtext(%s), 2)", (self._lock_key(),))
                self._created_here = False
                if not self._read_only:
                    self._create_if_missing(layout)
                elif not self._schema_exists(self._name):
                    raise FileNotFoundError(f"no ledger at {self._location!r} (no schema {self._name!r})")
                layout(create=False)
                if not self._read_only:
                    layout(create=True)
        except _Discarded:
            self.close()
            raise LedgerError(f"{self._location!r} is an empty ledger marked discarded; drop its schemas and "
                              "start again") from None
        except BaseException:
            self.close()
            raise

    def _lock_key(self) -> str:
        return f"pate-accountant ledger {self._name}"

    def _schema_exists(self, schema: str) -> bool:
        return self._execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None

    def _create_if_missing(self, layout) -> None:
        if self._schema_exists(self._name):
            return
        self._execute("BEGIN")
        try:
            self._execute("SELECT pg_advisory_xact_lock(hashtext(%s), 1)", (self._lock_key(),))
            if self._schema_exists(self._name):  # another creator was first: open what it made
                self._execute("ROLLBACK")
                return
            self._execute(f"CREATE SCHEMA {self._schema}")
            self._creating = True
            layout(create=True)
            self._execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        finally:
            self._creating = False
        self._created_here = True

    # -- layout -----------------------------------------------------------------------------------------------
    def check_layout(self, *, create: bool, initial_meta) -> None:
        """Inside the creation transaction (``create``): lay the tables out and store ``initial_meta()``.
        Otherwise check that the schema is one of our ledgers of :data:`SCHEMA_VERSION`."""
        if self._creating:
            if create:
                self._run_script(_SCHEMA, self._schema)
                for key, text in initial_meta().items():
                    self._execute(f"INSERT INTO {self._schema}.meta (key, value) VALUES (%s, %s) "
                                  "ON CONFLICT (key) DO NOTHING", (key, text))
            return
        if self._laid_out and create:
            return
        with self._doing("cannot read the PostgreSQL ledger {where}"):
            tables = self.tables()
            if not tables:
                raise LedgerError(f"{self._location!r}: schema {self._name!r} has no tables, so it is not a "
                                  "pate-accountant ledger; it was left unchanged")
            if not LEDGER_TABLES <= tables:
                raise LedgerError(f"{self._location!r}: schema {self._name!r} is not a pate-accountant ledger "
                                  f"(tables {sorted(LEDGER_TABLES - tables)} missing); it was left unchanged")
            meta = dict(self._execute(f"SELECT key, value FROM {self._schema}.meta"))
        if meta.get(DISCARDED_KEY):
            raise _Discarded()
        version = meta.get("schema_version")
        try:
            version_value = json.loads(version) if version is not None else None
        except ValueError:
            version_value = version
        if version_value != SCHEMA_VERSION:
            raise LedgerError(f"{self._location!r}: schema {self._name!r} is not a pate-accountant ledger of schema "
                              f"version {SCHEMA_VERSION} (found {version}); it was left unchanged")
        self._laid_out = True

    def _run_script(self, script: str, schema: str) -> None:
        # Without parameters psycopg sends the script as one simple query: all its statements, in the open transaction.
        self._execute(script.format(s=schema))

    def tables(self) -> set:
        return self._tables_of(self._name)

    def _tables_of(self, schema: str) -> set:
        return {row[0] for row in self._execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')", (schema,))}

    # -- the confidential schema ------------------------------------------------------------------------------
    def open_confidential(self, *, create: bool, initial_meta) -> bool:
        """Open the confidential schema (creating it, in one transaction, when ``create`` and the store is
        writable); ``False`` when it does not exist and is not to be created, or when this role may not read it
        (an auditor granted the shareable schema only reads the confidential part as absent)."""
        if self._conf_open:
            return True
        pg = self._pg
        schema = self._name + _CONF_SUFFIX
        where = self.confidential_location
        ledger_id = self.meta().get("ledger_id")
        with self._doing("{where} is not a usable confidential ledger part", where):
            if not self._schema_exists(schema):
                if not create or self._read_only:
                    return False
                self._execute("BEGIN")
                try:
                    self._execute("SELECT pg_advisory_xact_lock(hashtext(%s), 1)", (self._lock_key(),))
                    if not self._schema_exists(schema):
                        self._execute(f"CREATE SCHEMA {self._conf_schema}")
                        self._run_script(_CONFIDENTIAL_SCHEMA, self._conf_schema)
                        for key, text in initial_meta(ledger_id).items():
                            self._execute(f"INSERT INTO {self._conf_schema}.meta (key, value) VALUES (%s, %s)",
                                          (key, text))
                        self._conf_created_here = True
                    self._execute("COMMIT")
                except BaseException:
                    self._conf_created_here = False
                    self._rollback()
                    raise
            if not self._execute("SELECT has_schema_privilege(%s, 'USAGE')", (schema,)).fetchone()[0]:
                return False
            tables = self._tables_of(schema)
            if not CONFIDENTIAL_TABLES <= tables:
                raise LedgerError(f"{where!r} is not a confidential ledger part (tables "
                                  f"{sorted(CONFIDENTIAL_TABLES - tables)} missing)")
            try:
                meta = dict(self._execute(f"SELECT key, value FROM {self._conf_schema}.meta",
                                          keep=(pg.errors.InsufficientPrivilege,)))
            except pg.errors.InsufficientPrivilege:
                return False
        version = meta.get("schema_version")
        if version is None or json.loads(version) != CONFIDENTIAL_SCHEMA_VERSION:
            raise LedgerError(f"{where!r} is not a confidential ledger part of schema version "
                              f"{CONFIDENTIAL_SCHEMA_VERSION} (found {version})")
        if meta.get("ledger_id") != ledger_id:
            raise LedgerIntegrityError(f"the confidential part {where!r} belongs to another ledger (ledger ids differ)")
        self._conf_open = True
        return True

    def confidential_meta(self) -> dict:
        return dict(self._execute(f"SELECT key, value FROM {self._conf_schema}.meta"))

    def confidential_head(self):
        row = self._execute(f"SELECT row_count, last_hash FROM {self._conf_schema}.head WHERE id = 1").fetchone()
        return None if row is None else (row[0], row[1])

    def confidential_rows(self, after, up_to: int):
        return self._stream(f"SELECT {_CONF_COLUMNS} FROM {self._conf_schema}.charges "
                            "WHERE id > %s AND share_row <= %s ORDER BY id", (after or 0, up_to))

    def confidential_teachers(self):
        return self._stream(f"SELECT share_row, charged_teachers FROM {self._conf_schema}.charges ORDER BY id")

    def confidential_totals(self, up_to: int):
        return self._stream(f"SELECT share_row, share_hash, spent_epsilon, spent_delta "
                            f"FROM {self._conf_schema}.totals WHERE share_row <= %s ORDER BY share_row", (up_to,))

    def confidential_row_totals(self, share_row: int):
        return self._execute(f"SELECT share_hash, spent_epsilon, spent_delta FROM {self._conf_schema}.totals "
                             "WHERE share_row = %s", (share_row,)).fetchone()

    def confidential_orphans(self, head_rows: int) -> int:
        return self._execute(f"SELECT count(*) FROM {self._conf_schema}.charges WHERE share_row > %s",
                             (head_rows,)).fetchone()[0]

    def drop_confidential_orphans(self, head_rows: int):
        c = self._conf_schema
        dropped = self._execute(f"DELETE FROM {c}.charges WHERE share_row > %s", (head_rows,)).rowcount
        dropped += self._execute(f"DELETE FROM {c}.totals WHERE share_row > %s", (head_rows,)).rowcount
        if dropped:
            last = self._execute(f"SELECT id, hash FROM {c}.charges ORDER BY id DESC LIMIT 1").fetchone()
            head = (last[0], last[1]) if last else (0, None)
            self._execute(f"UPDATE {c}.head SET row_count = %s, last_hash = %s WHERE id = 1", head)
            return head
        return self.confidential_head()

    def append_confidential(self, rows, totals, row_count: int, last_hash) -> None:
        c = self._conf_schema
        self._executemany(f"INSERT INTO {c}.charges ({_CONF_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s)", list(rows))
        self._executemany(f"INSERT INTO {c}.totals (share_row, share_hash, spent_epsilon, spent_delta) "
                          "VALUES (%s,%s,%s,%s)", list(totals))
        self._execute(f"UPDATE {c}.head SET row_count = %s, last_hash = %s WHERE id = 1", (row_count, last_hash))

    # -- transactions ---------------------------------------------------------------------------------------
    def _rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return  # a lost connection: the server rolled the transaction back when it lost it
        if conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(self._pg.Error), self._deadline():
                conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def read(self, *, confidential: bool = False):
        if self._busy:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        self._execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._busy = True
        failure = None
        try:
            yield _Snapshot(self)
        except self._pg.Error as exc:  # a driver error from a statement made on this connection some other way
            failure = self._storage_error(exc)
        finally:
            self._busy = False
            self._rollback()
        if failure is not None:
            raise failure from None

    @contextlib.contextmanager
    def write(self, *, confidential: bool = False, between_commits=None):
        if self._read_only:
            raise LedgerError(f"ledger {self._location!r} is open read-only")
        if self._busy:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        pg = self._pg
        self._busy = True
        failure = None
        try:
            try:
                self._execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                keep = (pg.errors.LockNotAvailable,)
                wait = self._timeout + STATEMENT_DEADLINE_S  # the lock wait is the server's; then the deadline
                self._execute(f"SELECT row_count FROM {self._schema}.head WHERE id = 1 FOR UPDATE",
                              keep=keep, deadline=wait)  # the write lock
                if confidential and self._conf_open:
                    self._execute(f"SELECT row_count FROM {self._conf_schema}.head WHERE id = 1 FOR UPDATE",
                                  keep=keep, deadline=wait)
            except pg.errors.LockNotAvailable as exc:
                failure = self._fail(
                    f"cannot start a write transaction: another writer held the ledger's write lock for the whole "
                    f"{self._timeout:g} s wait (a writer stalled inside a charge keeps it until the server ends its "
                    f"session, after {IDLE_IN_TRANSACTION_S} s idle in its transaction: run again; "
                    "pg_stat_activity shows the blocking session) on", exc)
            if failure is None:
                yield
                if between_commits is not None:
                    between_commits()  # one transaction: both parts commit together, below
                self._commit()
        except pg.Error as exc:  # a driver error from a statement made on this connection some other way
            failure = self._storage_error(exc)
        except BaseException:
            self._rollback()
            raise
        finally:
            self._busy = False
        if failure is not None:
            self._rollback()
            raise failure from None

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

    # -- the shareable schema -------------------------------------------------------------------------------
    def meta(self) -> dict:
        if not self._laid_out and "meta" not in self.tables():
            return {}
        return dict(self._execute(f"SELECT key, value FROM {self._schema}.meta"))

    def head(self):
        return self._execute(
            f"SELECT row_count, last_hash, run_count, run_last_hash FROM {self._schema}.head WHERE id = 1").fetchone()

    def rows(self, after=None):
        return self._stream(f"SELECT {_ROW_COLUMNS} FROM {self._schema}.charges WHERE id > %s ORDER BY id",
                            (after or 0,))

    def runs(self):
        return self._stream(f"SELECT {_RUN_COLUMNS} FROM {self._schema}.runs ORDER BY id")

    def row_hash(self, row_id: int):
        found = self._execute(f"SELECT hash FROM {self._schema}.charges WHERE id = %s", (int(row_id),)).fetchone()
        return None if found is None else found[0]

    def run_hash(self, run_id: int):
        found = self._execute(f"SELECT hash FROM {self._schema}.runs WHERE id = %s", (int(run_id),)).fetchone()
        return None if found is None else found[0]

    def row_totals(self, row_id: int):
        stored = self._execute(f"SELECT spent_epsilon, spent_delta FROM {self._schema}.charges WHERE id = %s",
                               (int(row_id),)).fetchone()
        return None if stored is None or stored[0] is None else stored

    def set_meta(self, key: str, text: str) -> None:
        self._execute(f"INSERT INTO {self._schema}.meta (key, value) VALUES (%s, %s) "
                      "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (key, text))

    def append_rows(self, rows, row_count: int, last_hash) -> None:
        self._executemany(f"INSERT INTO {self._schema}.charges ({_ROW_COLUMNS}) "
                          "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", list(rows))
        self._execute(f"UPDATE {self._schema}.head SET row_count = %s, last_hash = %s WHERE id = 1",
                      (row_count, last_hash))

    def append_run(self, run, run_count: int, run_last_hash) -> None:
        self._execute(f"INSERT INTO {self._schema}.runs ({_RUN_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s)", run)
        self._execute(f"UPDATE {self._schema}.head SET run_count = %s, run_last_hash = %s WHERE id = 1",
                      (run_count, run_last_hash))

    # -- life cycle ------------------------------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Nothing to do: a committed transaction is the server's to keep."""
        return True

    def close(self) -> None:
        """Roll back what is open and close the connection (also after it was lost); idempotent."""
        conn = self._conn
        if conn is not None:
            self._rollback()
            self._conn = None
            with contextlib.suppress(self._pg.Error):
                conn.close()  # also releases the session's advisory locks
        if self._watchdog is not None:
            self._watchdog.close()
        self._conf_open = False

    def discard_if_unused(self) -> bool:
        """Drop the ledger's schemas (the confidential one only when this store created it) when no other store
        has the ledger open (the exclusive "in use" lock is granted without waiting) and it has no row and no
        run; one transaction, so nobody sees a half-removed ledger.  Closes the store either way."""
        if self._conn is None or self._read_only:
            self.close()
            return False
        key = self._lock_key()
        try:
            self._execute("BEGIN")
            self._execute("SELECT pg_advisory_unlock_shared(hashtext(%s), 2)", (key,))
            if not self._execute("SELECT pg_try_advisory_xact_lock(hashtext(%s), 2)", (key,)).fetchone()[0]:
                return False
            counts = self._execute(f"SELECT row_count, run_count FROM {self._schema}.head WHERE id = 1 FOR UPDATE"
                                   ).fetchone()
            if counts is None or counts[0] or counts[1]:
                return False
            self._execute(f"DROP SCHEMA {self._schema} CASCADE")
            if self._conf_created_here:
                self._execute(f"DROP SCHEMA IF EXISTS {self._conf_schema} CASCADE")
            self._execute("COMMIT")
            return True
        except LedgerStorageError:
            return False
        finally:
            self.close()
