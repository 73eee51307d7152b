"""SQLite files: the table layout (DDL) of both files and the file-level helpers of :mod:`.sqlite_store`.

Private files (mode 0600 whatever the umask), read-only and ``immutable`` connections that never write beside a
ledger, the check that an existing file is one of ours before anything writes to it, WAL mode, and the retry
while another process holds a file locked.  Only the SQLite store uses this module.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from pathlib import Path

from pate_accountant._ledger.errors import (
    InterruptedWriteError,
    LedgerError,
    _Discarded,
)

#: Seconds a writer waits for another process's write transaction before giving up.
DEFAULT_TIMEOUT = 60.0
#: SQLite's durability levels a ledger may be opened with (``PRAGMA synchronous``).
SYNCHRONOUS_MODES = ("FULL", "EXTRA", "NORMAL")

#: The confidential file of the ledger at ``PATH`` is ``PATH + CONFIDENTIAL_SUFFIX`` unless given.
CONFIDENTIAL_SUFFIX = ".confidential.sqlite"


def confidential_path(path) -> str:
    """The default confidential file of the ledger at ``path``: ``path + CONFIDENTIAL_SUFFIX``."""
    return os.fspath(path) + CONFIDENTIAL_SUFFIX


#: Key/value metadata: the same table in the shareable and the confidential file.
_META_TABLE = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

_SCHEMA = _META_TABLE + """
CREATE TABLE IF NOT EXISTS charges (
    id            INTEGER PRIMARY KEY,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL,
    event         TEXT NOT NULL,
    count         INTEGER NOT NULL,
    outcome       TEXT,
    commitment    TEXT,
    spent_epsilon REAL,
    spent_delta   REAL,
    created       REAL NOT NULL,
    writer        TEXT NOT NULL,
    run           INTEGER,
    grp           INTEGER
);
CREATE TABLE IF NOT EXISTS runs (
    id        INTEGER PRIMARY KEY,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL,
    first_row INTEGER NOT NULL,
    metadata  TEXT NOT NULL,
    created   REAL NOT NULL,
    writer    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS head (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    row_count     INTEGER NOT NULL,
    last_hash     TEXT,
    run_count     INTEGER NOT NULL,
    run_last_hash TEXT
);
INSERT OR IGNORE INTO head (id, row_count, last_hash, run_count, run_last_hash) VALUES (1, 0, NULL, 0, NULL);
CREATE TRIGGER IF NOT EXISTS charges_append_only_update BEFORE UPDATE ON charges
BEGIN SELECT RAISE(ABORT, 'ledger rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS charges_append_only_delete BEFORE DELETE ON charges
BEGIN SELECT RAISE(ABORT, 'ledger rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS runs_append_only_update BEFORE UPDATE ON runs
BEGIN SELECT RAISE(ABORT, 'ledger runs are append-only'); END;
CREATE TRIGGER IF NOT EXISTS runs_append_only_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'ledger runs are append-only'); END;
CREATE TRIGGER IF NOT EXISTS meta_frozen_update BEFORE UPDATE ON meta
WHEN (SELECT row_count FROM head WHERE id = 1) > 0
BEGIN SELECT RAISE(ABORT, 'ledger metadata is frozen once rows exist'); END;
CREATE TRIGGER IF NOT EXISTS meta_frozen_delete BEFORE DELETE ON meta
WHEN (SELECT row_count FROM head WHERE id = 1) > 0
BEGIN SELECT RAISE(ABORT, 'ledger metadata is frozen once rows exist'); END;
"""

_CONFIDENTIAL_SCHEMA = _META_TABLE + """
CREATE TABLE IF NOT EXISTS charges (
    id               INTEGER PRIMARY KEY,
    prev_hash        TEXT NOT NULL,
    hash             TEXT NOT NULL,
    share_row        INTEGER NOT NULL,
    share_hash       TEXT NOT NULL,
    salt             TEXT NOT NULL,
    charged_teachers TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS totals (
    share_row     INTEGER PRIMARY KEY,
    share_hash    TEXT NOT NULL,
    spent_epsilon REAL NOT NULL,
    spent_delta   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    row_count INTEGER NOT NULL,
    last_hash TEXT
);
INSERT OR IGNORE INTO head (id, row_count, last_hash) VALUES (1, 0, NULL);
CREATE TRIGGER IF NOT EXISTS charges_append_only_update BEFORE UPDATE ON charges
BEGIN SELECT RAISE(ABORT, 'confidential rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS totals_append_only_update BEFORE UPDATE ON totals
BEGIN SELECT RAISE(ABORT, 'confidential totals are append-only'); END;
"""

_ROW_COLUMNS = ("id, prev_hash, hash, event, count, outcome, commitment, spent_epsilon, spent_delta, created, "
                "writer, run, grp")
#: The same columns from a ledger written before groups existed (no ``grp`` column: every row ungrouped).
_ROW_COLUMNS_BEFORE_GROUPS = _ROW_COLUMNS.replace("grp", "NULL")
_RUN_COLUMNS = "id, prev_hash, hash, first_row, metadata, created, writer"
_CONF_COLUMNS = "id, prev_hash, hash, share_row, share_hash, salt, charged_teachers"


#: How long :meth:`Ledger.checkpoint` waits for another process's reader or writer (milliseconds).
CHECKPOINT_WAIT_MS = 200
#: Permission bits of a ledger file this package creates: read and write for its owner only.  SQLite gives its
#: ``-wal`` and ``-shm`` files the database file's bits, so they are private too.
PRIVATE_FILE_MODE = 0o600


#: ``os.link`` errors that mean "this file system has no hard links" (the one case a new ledger is made in place).
_NO_HARD_LINKS = frozenset(code for code in (getattr(errno, name, None) for name in
                                             ("EPERM", "EOPNOTSUPP", "ENOTSUP", "ENOSYS", "EMLINK", "EXDEV"))
                           if code is not None)


def _create_private(path: Path) -> bool:
    """Create ``path`` empty and readable by its owner only (whatever the umask), unless it exists: a ledger
    holds a data set's privacy history, and its confidential part is a function of the private data.  An
    existing file keeps the permissions its owner gave it.  ``True`` when this call created the file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    os.chmod(path, PRIVATE_FILE_MODE)  # O_CREAT's mode is masked by the umask: state it exactly
    return True


#: The meta key :meth:`Ledger.discard_if_unused` sets, under an exclusive lock, just before it removes an empty
#: ledger: a connection that opened the file before the removal and reads it after sees the mark and opens
#: what is at the path instead.
DISCARDED_KEY = "discarded"
#: How long :meth:`Ledger.open` keeps opening again while the file at the path is being discarded (seconds).
DISCARDED_WAIT_S = 5.0


def _connect_read_only(path: Path, timeout: float, *, audit: bool = True) -> sqlite3.Connection:
    """A connection that never writes to ``path``; with ``audit`` (reading a ledger, not checking a file before
    writing to it) it also creates nothing beside it.  A closed ledger (no
    write-ahead log content and no shared-memory file: every run ends with a checkpoint) is opened
    ``immutable``, so SQLite creates no ``-wal``/``-shm`` files; a live one (its ``-shm`` exists, or its log has
    content) is read through the files its writer already made.  A non-empty rollback journal means an
    interrupted write: :class:`InterruptedWriteError`."""
    if not audit:  # a file about to be written to: SQLite's own locking and journal handling, as a writer sees it
        return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    journal = Path(f"{path}-journal")
    if journal.is_file() and journal.stat().st_size > 0:
        raise InterruptedWriteError(
            f"{str(path)!r} has a rollback journal beside it ({journal.name}): a write was interrupted (a kill while "
            "the ledger was being created, or a crash) and the file cannot be read until it is rolled back; "
            "opening the ledger for writing once rolls it back"
        )
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    live = shm.exists() or (wal.is_file() and wal.stat().st_size > 0)
    query = "?mode=ro" if live else "?mode=ro&immutable=1"
    return sqlite3.connect(path.resolve().as_uri() + query, uri=True, timeout=timeout, isolation_level=None)


def _check_ours(path: Path, timeout: float, what: str = "pate-accountant ledger",
                tables_needed=("meta", "charges", "head"), *, empty_ok: bool = True) -> None:
    """Refuse, before anything is written, an existing non-empty file that is not a pate-accountant ledger
    (another application's SQLite database, or not SQLite at all): it is read through a read-only connection
    and left byte for byte as it was.  With ``empty_ok`` (the confidential file, which another process may be
    creating in place) a database with no tables yet passes: the creation itself checks again under the write
    lock.  Without it (the shareable file, which a creator links into place complete) a file that is not a
    regular file, is empty (0 bytes) or is a database with no tables is refused too."""
    if not empty_ok:
        if not path.exists():
            raise _Discarded()  # removed meanwhile (an empty ledger its creator discarded): open what is there now
        _refuse_empty_file(path)

    def read_tables():
        conn = _connect_read_only(path, timeout, audit=False)
        try:
            return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()

    def fail(exc):
        if not path.exists():
            raise _Discarded()  # an empty ledger removed by its creator meanwhile: open what is at the path now
        if isinstance(exc, sqlite3.OperationalError):
            raise LedgerError(f"cannot read {str(path)!r} to check that it is a ledger: {exc}") from None
        raise LedgerError(f"{str(path)!r} is not a {what} (not an SQLite database); it was left unchanged") from None

    tables = _while_locked(read_tables, fail)
    if not tables and not empty_ok:
        raise LedgerError(f"{str(path)!r} is an SQLite database with no tables, not a {what}; it was left unchanged")
    if tables and not set(tables_needed) <= tables:
        raise LedgerError(f"{str(path)!r} is an SQLite database but not a {what}; it was left unchanged")


def _refuse_empty_file(path: Path) -> None:
    """Refuse a path that is not a regular file, or is an empty (0-byte) one: neither is a ledger.  Checked before
    SQLite opens it (SQLite would read an empty file as an empty database, and a FIFO would block)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise _Discarded() from None
    if not stat.S_ISREG(info.st_mode):
        raise LedgerError(f"{str(path)!r} is not a regular file, so not a pate-accountant ledger; it was left "
                          "unchanged")
    if info.st_size == 0:
        raise LedgerError(f"{str(path)!r} is an empty file (0 bytes), not a pate-accountant ledger; it was left "
                          "unchanged (only a path where nothing exists is made into a new ledger)")


def _set_wal(conn: sqlite3.Connection, where) -> None:
    def fail(exc):
        raise LedgerError(f"{where!r} is not a pate-accountant ledger: {exc}") from None

    mode = _while_locked(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0], fail)
    if str(mode).lower() != "wal":
        raise LedgerError(f"cannot put {where!r} in WAL mode (journal mode is {mode!r})")


def _while_locked(action, fail):
    """``action()``, tried again for up to 10 s while another process holds the file locked (it is creating
    the ledger); any other SQLite error, or a lock past the deadline, goes to ``fail(exc)``, which raises."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc) and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            fail(exc)


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # the connection already rolled back (e.g. after an I/O error)
            pass


def _split_sql(script: str):
    """Split the schema script into statements (triggers contain ``;`` inside ``BEGIN ... END``)."""
    statement = ""
    for line in script.strip().splitlines():
        statement += line + "\n"
        if sqlite3.complete_statement(statement):
            yield statement.strip()
            statement = ""
