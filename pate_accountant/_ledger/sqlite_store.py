"""The SQLite store (:class:`~.store.LedgerStore`): the shareable file ``PATH`` and the confidential file
``PATH.confidential.sqlite``, each one SQLite database in WAL mode with one connection per :class:`SQLiteStore`.

Writers are serialised by SQLite's file write lock (``BEGIN IMMEDIATE``, waiting up to ``timeout`` seconds
through SQLite's busy handler), which holds across processes; readers take WAL snapshots and never block
writers.  A new ledger is built under a hidden temporary name and linked into place complete; an existing file
is looked at read-only before anything writes to it (:mod:`.sqlite_files`).  An unused ledger is removed under
an exclusive lock after marking it discarded (:meth:`SQLiteStore.discard_if_unused`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

from pate_accountant._ledger.errors import LedgerError, _Discarded
from pate_accountant._ledger.sqlite_files import (
    _CONF_COLUMNS,
    _CONFIDENTIAL_SCHEMA,
    _NO_HARD_LINKS,
    _ROW_COLUMNS,
    _ROW_COLUMNS_BEFORE_GROUPS,
    _RUN_COLUMNS,
    _SCHEMA,
    CHECKPOINT_WAIT_MS,
    DEFAULT_TIMEOUT,
    DISCARDED_KEY,
    DISCARDED_WAIT_S,
    _check_ours,
    _connect_read_only,
    _create_private,
    _decode_text,
    _refuse_empty_file,
    _rollback,
    _set_wal,
    _split_sql,
    confidential_path,
)
from pate_accountant._ledger.store import LEDGER_TABLES, SCHEMA_VERSION, StoreIdentity, check_confidential_meta

_ROW_INSERT = f"INSERT INTO charges ({_ROW_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
_CONF_INSERT = f"INSERT INTO charges ({_CONF_COLUMNS}) VALUES (?,?,?,?,?,?,?)"


class _Snapshot:
    """The open read transaction of :meth:`SQLiteStore.read`: the shareable snapshot, and the confidential one
    once :meth:`add_confidential` started it (always after the shareable one)."""

    def __init__(self, store: SQLiteStore):
        self._store = store
        self.conf = None

    def add_confidential(self) -> None:
        store = self._store
        if self.conf is not None or store._conf is None:
            return
        store._conn.execute("SELECT row_count FROM head WHERE id = 1").fetchone()  # starts the shareable snapshot
        store._conf.execute("BEGIN")
        self.conf = store._conf
        self.conf.execute("SELECT row_count FROM head WHERE id = 1").fetchone()


class SQLiteStore(StoreIdentity):
    """A ledger kept in SQLite files (or, :meth:`in_memory`, in two in-memory databases).

    ``SQLiteStore(path, ...)`` names the files and checks the arguments; :meth:`open` opens them (creating the
    ledger where nothing exists), calling ``layout(create=...)`` wherever the ledger's layout is checked or
    completed.  One store is one connection per file: use it from one thread, in one process."""

    errors = (sqlite3.Error,)

    def __init__(self, path, *, read_only: bool = False, synchronous: str = "FULL", timeout: float = DEFAULT_TIMEOUT,
                 confidential=None):
        path = Path(os.fspath(path))
        if confidential is not None:
            confidential = os.fspath(confidential)
            if Path(confidential).resolve() == path.resolve():
                raise ValueError(f"confidential must be another file than the ledger, got {confidential!r}")
        if path.is_dir():
            raise LedgerError(f"ledger path {str(path)!r} is a folder, not a ledger file")
        if not read_only and not path.parent.is_dir():
            raise FileNotFoundError(f"cannot create a ledger at {str(path)!r}: no folder {str(path.parent)!r}")
        self._file = path
        self._setup(str(path), read_only, synchronous, timeout,
                    confidential if confidential is not None else confidential_path(path))

    def _setup(self, path, read_only, synchronous, timeout, conf_path) -> None:
        self._path = path
        self._read_only = read_only
        self._synchronous = synchronous
        self._timeout = timeout
        self._conf_path = conf_path
        self._conn: sqlite3.Connection | None = None
        self._conf: sqlite3.Connection | None = None
        self._columns = None  # the row columns to select (_row_columns)
        self._created_here = False
        self.new_file = False  # this store made the file (or the in-memory database): it may have no tables yet
        self._conf_created_here = False
        self._busy = False  # a read or write transaction is open (they do not nest)

    @classmethod
    def in_memory(cls) -> SQLiteStore:
        """Two in-memory databases (the confidential one made when first needed); nothing persists."""
        store = cls.__new__(cls)
        store._setup(None, False, "FULL", DEFAULT_TIMEOUT, None)
        store._use(sqlite3.connect(":memory:", isolation_level=None))
        store.new_file = True
        return store

    def _use(self, conn: sqlite3.Connection) -> None:
        # Text the ledger wrote is valid UTF-8 and decodes exactly; damaged bytes decode to U+FFFD, so the
        # row's hash no longer matches and verify names the row instead of failing with a decode error.
        conn.text_factory = _decode_text
        self._conn = conn
        self._columns = None

    # -- identity ----------------------------------------------------------------------------------------------
    @property
    def location(self) -> str | None:
        return self._path

    @property
    def confidential_location(self) -> str | None:
        return self._conf_path

    @property
    def has_confidential(self) -> bool:
        return self._conf is not None

    def __repr__(self):
        return f"SQLiteStore({self._path or ':memory:'!r}{', read-only' if self._read_only else ''})"

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self, layout) -> None:
        """Open the files, creating the ledger when nothing is at the path.  An empty ledger that its creator
        discards (:meth:`discard_if_unused`) may vanish, or be seen marked, while this opens it: open what is at
        the path then, until the deadline."""
        path, read_only = self._file, self._read_only
        deadline = time.monotonic() + DISCARDED_WAIT_S
        while True:
            try:
                return self._open_once(layout)
            except _Discarded:
                self._path = str(path)
                if read_only and path.exists():
                    raise FileNotFoundError(f"no ledger at {str(path)!r}: the file there is an empty ledger marked for "
                                            "removal by the run that created it (it holds no charge and no run)"
                                            ) from None
                if read_only or time.monotonic() >= deadline:
                    if not path.exists():
                        raise FileNotFoundError(f"no ledger at {str(path)!r} (an empty one there was just removed "
                                                "by the run that created it)") from None
                    raise LedgerError(
                        f"{str(path)!r} is an empty ledger that the run which created it was removing when it "
                        "stopped (it holds no charge and no run); delete the file and start again") from None
                time.sleep(0.01)

    def _open_once(self, layout) -> None:
        path, timeout = self._file, self._timeout
        self._created_here = self.new_file = False
        created = False
        if self._read_only:
            if not path.is_file():
                raise FileNotFoundError(f"no ledger at {str(path)!r}")
            _refuse_empty_file(path)  # a 0-byte file is no ledger (SQLite would read it as an empty database)
            conn = _connect_read_only(path, timeout)
        else:
            # Only a path where nothing exists is created.  Anything already there must be one of our ledgers: it is
            # looked at read-only first, and a file that is not a ledger (empty, a database with no tables, another
            # application's, not SQLite, not a regular file) is refused and never written.
            if path.is_symlink() and not path.exists():
                raise LedgerError(f"ledger path {str(path)!r} is a symbolic link to a missing file: nothing created")
            if not path.exists():
                created = self._create_atomically(layout)
                if not created and not path.exists():  # no hard links here: this call makes it in place
                    created = _create_private(path)
            if not created:
                _check_ours(path, timeout, empty_ok=False)
            try:
                conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open a ledger at {str(path)!r}: {exc}") from None
        self._use(conn)
        self._created_here = self.new_file = created
        try:
            if self._read_only:
                layout(create=False)
            else:
                # Read the file once before WAL mode: a discarded one (marked by its creator, who removed it after this
                # connection opened it) must never get a log beside the path.  In WAL mode the read also takes the
                # shared lock every WAL connection keeps, so from here on nobody can discard the file under this one.
                layout(create=False)
                _set_wal(conn, self._path)
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                layout(create=True)
                self._add_group_column()
        except sqlite3.OperationalError as exc:  # a read-only file or folder, a full disk, ...
            conn.close()
            raise LedgerError(f"cannot write the ledger at {str(path)!r}: {exc} (open it with read_only=True "
                              "to read it)") from None
        except BaseException:
            conn.close()
            raise

    def _create_atomically(self, layout) -> bool:
        """Build a new, empty ledger beside the path under a temporary name and link it into place, so that the
        path holds it complete or not at all: a kill during the creation leaves no ledger (only a hidden
        ``.creating`` file, which nothing reads), never a half-made one.  When another process links its own
        first, that one is kept.  On a file system without hard links the ledger is made in place, as before;
        any other failure (a full disk, a read-only folder) is a :class:`LedgerError` and leaves nothing at
        the path (issue 22, item 15).  ``True`` when this call put the ledger at the path.  While ``layout``
        runs, this store is connected to the temporary file."""
        path = self._file
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.creating")
        try:
            _create_private(temporary)
            conn = sqlite3.connect(str(temporary), timeout=self._timeout, isolation_level=None)
            try:
                self._use(conn)
                self._path = str(temporary)
                self.new_file = True
                _set_wal(conn, str(temporary))
                layout(create=True)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
                self._conn, self._path, self._columns, self.new_file = None, str(path), None, False
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False  # another process created the ledger first: it is used
            except OSError as exc:
                if exc.errno in _NO_HARD_LINKS:
                    return False  # no hard links here: the caller creates the ledger in place
                raise LedgerError(f"cannot create a ledger at {str(path)!r}: {exc.strerror or exc}") from None
            return True
        except sqlite3.Error as exc:  # a full disk, a read-only folder: nothing is made, in place or otherwise
            raise LedgerError(f"cannot create a ledger at {str(path)!r}: {exc}") from None
        except OSError as exc:
            raise LedgerError(f"cannot create a ledger at {str(path)!r}: {exc.strerror or exc}") from None
        finally:
            for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()

    # -- layout -------------------------------------------------------------------------------------------------
    def check_layout(self, *, create: bool, initial_meta) -> None:
        """Check (and with ``create``, complete) the layout.  A database with no tables is expected only in a file
        this store made (``new_file``); any other is not a ledger and is refused."""
        conn = self._conn
        if create:  # an existing, complete ledger needs no write lock
            self.check_layout(create=False, initial_meta=initial_meta)
            if LEDGER_TABLES <= self.tables() and self.meta().get("schema_version"):
                return
        try:
            conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
            try:
                tables = self.tables()
                if not tables and not self.new_file:
                    raise LedgerError(f"{self._path!r} is an SQLite database with no tables, not a pate-accountant "
                                      "ledger; it was left unchanged")
                if tables and "meta" not in tables:
                    raise LedgerError(f"{self._path!r} is an SQLite database but not a pate-accountant ledger")
                if tables and self.meta().get(DISCARDED_KEY):
                    raise _Discarded()
                if tables or create:
                    version = self.meta().get("schema_version")
                    if version is not None and json.loads(version) != SCHEMA_VERSION:
                        raise LedgerError(f"ledger schema version {version} is not supported "
                                          f"(expected {SCHEMA_VERSION})")
                if create:
                    for statement in _split_sql(_SCHEMA):
                        conn.execute(statement)
                    conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", initial_meta().items())
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a damaged schema can fail either way
            raise LedgerError(f"{self._path or ':memory:'!r} is not a usable pate-accountant ledger: {exc}") from None

    def _charge_columns(self) -> set:
        """The names of the ``charges`` table's columns (empty before the table exists)."""
        return {row[1] for row in self._conn.execute("PRAGMA table_info(charges)")}

    def _row_columns(self) -> str:
        """The row columns to select: a ledger written before groups existed has no ``grp`` column (opened for
        writing it gets one, :meth:`_add_group_column`; read-only, its rows are read as ungrouped)."""
        columns = self._columns
        if columns is None:
            names = self._charge_columns()
            columns = _ROW_COLUMNS if "grp" in names or not names else _ROW_COLUMNS_BEFORE_GROUPS
            if names:
                self._columns = columns
        return columns

    def _add_group_column(self) -> None:
        """Give a ledger written before groups existed the nullable ``grp`` column (no stored value changes, so
        every hash stays valid); a no-op on any other ledger."""
        conn = self._conn
        if "grp" in self._charge_columns():
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            if "grp" not in self._charge_columns():  # another writer may have added it meanwhile
                conn.execute("ALTER TABLE charges ADD COLUMN grp INTEGER")
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        self._columns = None

    def tables(self, conn=None) -> set:
        conn = self._conn if conn is None else conn
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    # -- the confidential file --------------------------------------------------------------------------------
    def open_confidential(self, *, create: bool, initial_meta) -> bool:
        """Open the confidential file (creating it when ``create`` and the ledger is writable); ``False``
        when it does not exist and is not to be created.  Refuses a file that belongs to another ledger."""
        if self._conf is not None:
            return True
        read_only = self._read_only
        if self._path is None:
            if not create:
                return False
            conn = sqlite3.connect(":memory:", isolation_level=None)
        else:
            path = Path(self._conf_path)
            exists = path.is_file()
            if not exists and not (create and not read_only):
                return False
            if read_only:
                conn = _connect_read_only(path, self._timeout)
            else:
                if exists and path.stat().st_size > 0:
                    _check_ours(path, self._timeout, "confidential ledger file")
                self._conf_created_here = _create_private(path)
                conn = sqlite3.connect(str(path), timeout=self._timeout, isolation_level=None)
        conn.text_factory = _decode_text
        try:
            if not read_only and self._path is not None:
                _set_wal(conn, self._conf_path)
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
            self._check_confidential_layout(conn, create=not read_only, initial_meta=initial_meta)
        except BaseException:
            conn.close()
            raise
        self._conf = conn
        return True

    def _check_confidential_layout(self, conn, *, create: bool, initial_meta) -> None:
        where = self._conf_path or ":memory:"
        ledger_id = self.meta().get("ledger_id")
        try:
            conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
            try:
                tables = self.tables(conn)
                if tables and "meta" not in tables:
                    raise LedgerError(f"{where!r} is an SQLite database but not a confidential ledger file")
                if create:
                    for statement in _split_sql(_CONFIDENTIAL_SCHEMA):
                        conn.execute(statement)
                    conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                                     initial_meta(ledger_id).items())
                meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in self.tables(conn) else {}
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise LedgerError(f"{where!r} is not a usable confidential ledger file: {exc}") from None
        check_confidential_meta(meta, ledger_id, where, "file")

    def confidential_meta(self) -> dict:
        return dict(self._conf.execute("SELECT key, value FROM meta"))

    def confidential_head(self):
        row = self._conf.execute("SELECT row_count, last_hash FROM head WHERE id = 1").fetchone()
        return None if row is None else (row[0], row[1])

    def confidential_rows(self, after, up_to: int):
        if after is None:
            return self._conf.execute(f"SELECT {_CONF_COLUMNS} FROM charges WHERE share_row <= ? ORDER BY id",
                                      (up_to,))
        return self._conf.execute(f"SELECT {_CONF_COLUMNS} FROM charges WHERE id > ? AND share_row <= ? ORDER BY id",
                                  (after, up_to))

    def confidential_teachers(self):
        return self._conf.execute("SELECT share_row, charged_teachers FROM charges")

    def confidential_totals(self, up_to: int):
        return self._conf.execute(
            "SELECT share_row, share_hash, spent_epsilon, spent_delta FROM totals WHERE share_row <= ?", (up_to,))

    def confidential_row_totals(self, share_row: int):
        return self._conf.execute("SELECT share_hash, spent_epsilon, spent_delta FROM totals WHERE share_row = ?",
                                  (share_row,)).fetchone()

    def confidential_orphans(self, head_rows: int) -> int:
        return self._conf.execute("SELECT COUNT(*) FROM charges WHERE share_row > ?", (head_rows,)).fetchone()[0]

    def drop_confidential_orphans(self, head_rows: int):
        conf = self._conf
        dropped = conf.execute("DELETE FROM charges WHERE share_row > ?", (head_rows,)).rowcount
        dropped += conf.execute("DELETE FROM totals WHERE share_row > ?", (head_rows,)).rowcount
        if dropped:
            last = conf.execute("SELECT id, hash FROM charges ORDER BY id DESC LIMIT 1").fetchone()
            head = (last[0], last[1]) if last else (0, None)
            conf.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", head)
            return head
        return self.confidential_head()

    def append_confidential(self, rows, totals, row_count: int, last_hash) -> None:
        conf = self._conf
        conf.executemany(_CONF_INSERT, rows)
        conf.executemany("INSERT INTO totals (share_row, share_hash, spent_epsilon, spent_delta) VALUES (?,?,?,?)",
                         totals)
        conf.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", (row_count, last_hash))

    # -- transactions ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def read(self, *, confidential: bool = False):
        self._check_can_begin(write=False)
        snapshot = _Snapshot(self)
        self._conn.execute("BEGIN")
        self._busy = True
        try:
            if confidential:
                snapshot.add_confidential()
            yield snapshot
        finally:
            self._busy = False
            if snapshot.conf is not None:
                _rollback(snapshot.conf)
            _rollback(self._conn)

    @contextlib.contextmanager
    def write(self, *, confidential: bool = False, between_commits=None):
        self._check_can_begin(write=True)
        try:
            self._conn.execute("BEGIN IMMEDIATE")  # the write lock, waiting up to `timeout` for other writers
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"cannot start a write transaction on {self._path!r}: {exc}") from None
        self._busy = True
        conf = self._conf if confidential else None
        try:
            if conf is not None:
                try:
                    conf.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:
                    raise LedgerError(f"cannot start a write transaction on {self._conf_path!r}: {exc}") from None
            yield
            if conf is not None:
                conf.execute("COMMIT")
                if between_commits is not None:
                    between_commits()
            self._conn.execute("COMMIT")
        except BaseException:
            if conf is not None:
                _rollback(conf)
            _rollback(self._conn)
            raise
        finally:
            self._busy = False

    # -- the shareable file -------------------------------------------------------------------------------
    def meta(self) -> dict:
        try:
            return dict(self._conn.execute("SELECT key, value FROM meta"))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}
            raise

    def head(self):
        return self._conn.execute(
            "SELECT row_count, last_hash, run_count, run_last_hash FROM head WHERE id = 1").fetchone()

    def rows(self, after=None):
        if after is None:
            return self._conn.execute(f"SELECT {self._row_columns()} FROM charges ORDER BY id")
        return self._conn.execute(f"SELECT {self._row_columns()} FROM charges WHERE id > ? ORDER BY id", (after,))

    def runs(self):
        return self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id")

    def row_hash(self, row_id: int):
        found = self._conn.execute("SELECT hash FROM charges WHERE id = ?", (int(row_id),)).fetchone()
        return None if found is None else found[0]

    def run_hash(self, run_id: int):
        found = self._conn.execute("SELECT hash FROM runs WHERE id = ?", (int(run_id),)).fetchone()
        return None if found is None else found[0]

    def row_totals(self, row_id: int):
        stored = self._conn.execute("SELECT spent_epsilon, spent_delta FROM charges WHERE id = ?", (row_id,)).fetchone()
        return None if stored is None or stored[0] is None else stored

    def set_meta(self, key: str, text: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, text))

    def append_rows(self, rows, row_count: int, last_hash) -> None:
        conn = self._conn
        conn.executemany(_ROW_INSERT, rows)
        conn.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", (row_count, last_hash))

    def append_run(self, run, run_count: int, run_last_hash) -> None:
        self._conn.execute(f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?)", run)
        self._conn.execute("UPDATE head SET run_count = ?, run_last_hash = ? WHERE id = 1", (run_count, run_last_hash))

    # -- life cycle ------------------------------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Copy the write-ahead logs into the main files and empty them (``wal_checkpoint(TRUNCATE)``)."""
        if self._read_only or self._path is None:
            return True
        done = True
        for conn in (self._conn, self._conf):
            if conn is None:
                continue
            # A reader or writer in another process keeps the log from being emptied; wait for it only briefly
            # (a run's end must not hang on someone else's audit), and leave the rest to the next checkpoint.
            waited = conn.execute("PRAGMA busy_timeout").fetchone()[0]
            try:
                conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error:
                busy = 1
            finally:
                conn.execute(f"PRAGMA busy_timeout={int(waited)}")
            done = done and not busy
        return done

    def close(self) -> None:
        try:
            self.checkpoint()
        except sqlite3.ProgrammingError:  # already closed
            pass
        if self._conf is not None:
            self._conf.close()
        if self._conn is not None:
            self._conn.close()

    def discard_if_unused(self) -> bool:
        conn = self._conn
        if not self._claim_exclusively():
            conn.execute("PRAGMA locking_mode=NORMAL")
            self.close()  # kept for whoever has joined or charged: checkpointed and closed as usual
            return False
        try:  # the exclusive lock is held until the connection closes (exclusive locking mode)
            if self._conf is not None:
                self._conf.close()  # nobody else has the shareable file open, so nobody has this one
                self._conf = None
                if self._conf_created_here:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._conf_path)
            # Fold the log in and remove -wal and -shm while the lock is held: once the path is free, a new ledger
            # there has its own -wal and -shm of the same names, which this connection must never touch.
            conn.execute("PRAGMA journal_mode=OFF")
            try:
                os.unlink(self._path)
            except OSError:  # the folder does not let us remove it: take the mark back, the ledger stays usable
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("DELETE FROM meta WHERE key = ?", (DISCARDED_KEY,))
                return False
        finally:
            conn.close()
        return True

    def _claim_exclusively(self) -> bool:
        """Take the write lock in exclusive locking mode without waiting (granted only when no other connection
        has the file open) and, when the ledger has no row and no run, mark it discarded.  ``False`` (and no lock
        kept past the transaction) otherwise."""
        conn = self._conn
        try:
            conn.execute("PRAGMA busy_timeout=0")
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError:
            _rollback(conn)
            return False
        try:
            rows, runs = conn.execute("SELECT row_count, run_count FROM head WHERE id = 1").fetchone()
            if rows or runs:
                _rollback(conn)
                return False
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 'true')", (DISCARDED_KEY,))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return True

