"""The PostgreSQL store (:class:`~.store.LedgerStore`): one ledger kept in a PostgreSQL database through psycopg 3.

``Ledger.open("postgresql://USER@HOST:PORT/DB?ledger=NAME")`` keeps the ledger ``NAME`` (default ``ledger``) in two
schemas of database ``DB``: the **shareable** part in schema ``NAME`` and the **confidential** part in schema
``NAME_confidential``.  The store is three rooms:

* :mod:`.postgres_url`: the URL, the ledger's name, and the password that is never shown (credentials: only the
  URL, libpq's ``PG*`` environment variables and its service and password files say how to connect);
* :mod:`.postgres_connection`: the connection and its policy (connect and keepalive timeouts, the client-side
  deadline of every statement, the idle-in-transaction timeout), and the one helper every statement goes through,
  which turns every driver error into :class:`~.errors.LedgerStorageError` (:class:`PostgresConnection`);
* :mod:`.postgres_schema`: the two schemas' tables and triggers, how a ledger is created (one transaction) and how
  one of ours is recognised (:class:`PostgresLayout`);

and this module, the store itself: its transactions, the reads and writes of the ledger's rows, and its life
cycle.

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
transaction ends.  Outside a transaction (autocommit: a cursor without ``WITH HOLD`` ends with its statement) they
are one statement fetched whole.

Errors.  Every driver error leaves the store as :class:`~.errors.LedgerStorageError` (:mod:`.postgres_connection`,
"Errors"), but for the few that mean something specific: the lock timeout is ``LedgerError`` "cannot start a
write transaction", as SQLite's, and a role that may not read the confidential schema opens it as absent.

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

from pate_accountant._ledger.errors import LedgerError, LedgerStorageError, _Discarded
from pate_accountant._ledger.postgres_connection import IDLE_IN_TRANSACTION_S, PostgresConnection, _UnreadableLedger
from pate_accountant._ledger.postgres_connection import _import_psycopg, connect  # noqa: F401  (re-exported)
from pate_accountant._ledger.postgres_schema import _CONF_COLUMNS, _ROW_COLUMNS, _RUN_COLUMNS, PostgresLayout
from pate_accountant._ledger.postgres_url import _CONF_SUFFIX
from pate_accountant._ledger.postgres_url import is_postgres_url, parse_url, scrub_secrets  # noqa: F401  (re-exported)
from pate_accountant._ledger.sqlite_files import DEFAULT_TIMEOUT
from pate_accountant._ledger.store import StoreIdentity

#: Rows fetched per round trip from a server-side cursor (:meth:`PostgresStore.rows` and the other long reads).
ITERSIZE = 2000


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



class PostgresStore(PostgresLayout, PostgresConnection, StoreIdentity):
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
        super().__init__(url, synchronous=synchronous, timeout=timeout)
        self.errors = (_UnreadableLedger,)
        self._read_only = read_only
        self._schema = f'"{self._name}"'
        self._conf_schema = f'"{self._name}{_CONF_SUFFIX}"'
        self._created_here = False
        self._creating = False  # inside the transaction that creates the ledger: check_layout lays it out
        self._laid_out = False  # the layout was checked: the tables exist
        self._conf_open = False
        self._conf_created_here = False
        self._busy = False
        self._cursors = 0  # server-side cursors declared on this connection (their names)

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

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self, layout) -> None:
        """Connect, take the shared "in use" lock, and create the ledger when its schema does not exist (schema,
        tables and first metadata in one transaction); then check the layout."""
        self._connect()
        try:
            with self._doing("cannot open the PostgreSQL ledger {where}"):
                self._set_limits()
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

    # -- long reads -------------------------------------------------------------------------------------------
    def _stream(self, query, params=None):
        """The rows of a long read.  Inside a transaction (:meth:`read`, :meth:`write`): one page when the rows fit
        in it, else a server-side cursor, :data:`ITERSIZE` rows a round trip (it lives until the transaction ends,
        so iterate it inside).  Outside one (autocommit: a cursor without ``WITH HOLD`` would not outlive its
        statement): one statement, fetched whole, as before."""
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

    # -- the confidential schema ------------------------------------------------------------------------------
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
    @contextlib.contextmanager
    def read(self, *, confidential: bool = False):
        self._check_can_begin(write=False)
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
        self._check_can_begin(write=True)
        pg = self._pg
        self._busy = True
        failure = None
        try:
            try:
                self._execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                keep = (pg.errors.LockNotAvailable,)
                wait = self._timeout  # the lock wait is the server's; then the statement's deadline
                self._execute(f"SELECT row_count FROM {self._schema}.head WHERE id = 1 FOR UPDATE",
                              keep=keep, lock_wait=wait)  # the write lock
                if confidential and self._conf_open:
                    self._execute(f"SELECT row_count FROM {self._conf_schema}.head WHERE id = 1 FOR UPDATE",
                                  keep=keep, lock_wait=wait)
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
        self._disconnect()
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
