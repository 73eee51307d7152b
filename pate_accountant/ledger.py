"""The persistent privacy ledger: append-only SQLite, hash-chained, shared by processes (docs/ledger.md).

A ledger is two SQLite files with different readers.

* The **shareable** file ``PATH`` may be shown to anyone (an auditor, the public).  It holds only
  DP outputs and data-independent parameters: one row per charge with the privacy event (JSON data, see
  :mod:`pate_accountant.serialization`), how many times it ran and its outcome class (``token`` /
  ``fail`` / ``target``, or nothing for a plain ``compose``); the accountant configuration; the name of
  the data set the ledger belongs to; one metadata record per run (mechanism, parameters, whether it was
  seeded, never the seed); and, for accountants whose spent budget is a function of those outcomes alone
  (basic, advanced, RDP, PLD, target charging), the budget spent.  It never holds released values,
  prompts, records, votes, counts, teacher sets or seeds.
* The **confidential** file ``PATH.confidential.sqlite`` exists only for an accountant whose state
  depends on private data (``confidential_charges = True``: individual charging, whose counters are fed
  by the sets of teachers counted in ``between`` outcomes).  It holds exactly one row per *hit* row of
  the shareable file (the charged teacher set and a random 256-bit salt) and the spent totals (which are
  functions of those sets).  Non-hit charges leave no teacher set anywhere.  Each confidential row names
  its shareable row's hash, and the shareable row carries the commitment
  ``HMAC-SHA256(salt, row id | teacher set)``, which reveals nothing without the salt (a plain hash of a
  small teacher set could be found by trying every set) but binds the confidential rows to the chain.

Storage, not logic.  The accountant owns its state; the ledger stores and verifies rows and calls only the
accountant's public methods: ``config()``, ``replay(charges)`` (rows other writers appended, or every row
when attaching) and ``spent()`` (the totals stored with the rows).  It never checks a budget itself.

Writing.  ``SomeAccountant(budget=..., ledger=ledger)`` attaches an accountant: the first one writes
its configuration; a later one (another process, a restart) must have an equal configuration and
catches up by replaying the rows already there (an accountant with confidential charges needs the
confidential file for that).  Each charge runs in one write transaction (``BEGIN IMMEDIATE`` on the
shareable file, which serialises writers across processes, see :meth:`Ledger.transaction`): rows other
processes appended since are replayed first (only when the head shows some), then the accountant checks
the charge against its budget and applies it, then the rows are written with its ``spent()`` and
committed.  If anything fails before the commit, it rolls back and the accountant takes its charge back.
A charged generation step is therefore one read transaction (``sync``, for ``can_afford``) and one write
transaction.  With a confidential file its transaction commits first, then the shareable one: a crash
between the two leaves confidential rows that no shareable row names, for a charge whose release was never
returned; readers ignore them and the next writer removes them.

Hashing.  Each shareable row's hash is ``sha256`` of the previous hash and the row's fields (id, run and
commitment included); the first row chains to a genesis hash of the metadata (accountant configuration,
data set, software version).  Runs form a second chain anchored at the ledger id; the confidential rows a
third, anchored at the confidential metadata.  The ``head`` rows (row counts and last hashes) are updated
in the same transactions, so dropped trailing rows show too.

:meth:`Ledger.verify` (and ``pate-accountant audit PATH``) checks the chains and heads, the runs, and
replays every row through a fresh accountant rebuilt from the stored configuration, comparing the totals
and checking the budget was never exceeded.  For an accountant with confidential charges it does that
when the confidential file is present; without it, it checks the shareable part alone (chains, runs,
events) and says so: the spent budget of such an accountant is then not known to the reader.

Rooms.  This module is the facade; the work is done in :mod:`pate_accountant._ledger` (docs/ledger.md,
"Rooms"): :mod:`~pate_accountant._ledger.store` (the storage interface) and its SQLite implementation
(:mod:`~pate_accountant._ledger.sqlite_store`, :mod:`~pate_accountant._ledger.sqlite_files`) and PostgreSQL one
(:mod:`~pate_accountant._ledger.postgres_store` and its rooms), :mod:`~pate_accountant._ledger.chain` (hashes
and pins), :mod:`~pate_accountant._ledger.verify`, :mod:`~pate_accountant._ledger.confidential`,
:mod:`~pate_accountant._ledger.runs` (runs, the data set, the claim), :mod:`~pate_accountant._ledger.codec`
(stored values and their checks) and :mod:`~pate_accountant._ledger.transaction` (what a charge is written
through).  Every name this module had before the split is still importable from here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
import uuid
import weakref

from pate_accountant._ledger import codec as _codec_room
from pate_accountant._ledger.chain import (  # noqa: F401  (re-exported)
    GENESIS_KEYS,
    _check_row,
    _field,
    _genesis_hash,
    _row_hash,
    _run_hash,
    _runs_genesis_hash,
    _sha256,
    initial_meta,
    pin_record,
)
from pate_accountant._ledger.codec import (  # noqa: F401  (re-exported)
    TOTALS_ATOL,
    TOTALS_RTOL,
    LedgerRow,
    _check_json_data,
    _CheckedRow,
    _Codec,
    _config_difference,
    _json_data,
    _totals_close,
    accountant_class,
    accountant_from_config,
    ledger_row,
    meta_value,
)
from pate_accountant._ledger.confidential import (  # noqa: F401  (re-exported)
    CONFIDENTIAL_GENESIS_KEYS,
    HIT_OUTCOMES,
    _check_confidential_row,
    _commitment,
    _confidential_genesis_hash,
    _confidential_row_hash,
    _keeps_confidential,
    _link,
    _teachers_text,
    initial_confidential_meta,
)
from pate_accountant._ledger.errors import (  # noqa: F401  (re-exported)
    InterruptedWriteError,
    LedgerError,
    LedgerIntegrityError,
    LedgerStorageError,
    _Discarded,
    _RowError,
)
from pate_accountant._ledger.runs import (  # noqa: F401  (re-exported)
    MAX_DATASET_NAME,
    SEED_KEYS,
    RunRecords,
    _check_dataset,
    _check_no_seed,
    describe_mechanism,
    describe_seed,
)
from pate_accountant._ledger.postgres_store import PostgresStore
from pate_accountant._ledger.postgres_url import is_postgres_url, scrub_secrets, url_secrets
from pate_accountant._ledger.postgres_url import parse_url as parse_postgres_url
from pate_accountant._ledger.sqlite_files import (  # noqa: F401  (re-exported)
    _CONF_COLUMNS,
    _CONFIDENTIAL_SCHEMA,
    _META_TABLE,
    _NO_HARD_LINKS,
    _ROW_COLUMNS,
    _ROW_COLUMNS_BEFORE_GROUPS,
    _RUN_COLUMNS,
    _SCHEMA,
    CHECKPOINT_WAIT_MS,
    CONFIDENTIAL_SUFFIX,
    DEFAULT_TIMEOUT,
    DISCARDED_KEY,
    DISCARDED_WAIT_S,
    PRIVATE_FILE_MODE,
    SYNCHRONOUS_MODES,
    _check_ours,
    _connect_read_only,
    _create_private,
    _decode_text,
    _refuse_empty_file,
    _rollback,
    _set_wal,
    _split_sql,
    _while_locked,
    confidential_path,
)
from pate_accountant._ledger.sqlite_store import SQLiteStore
from pate_accountant._ledger.sqlite_store import _Snapshot as _ReadSnapshot  # noqa: F401  (re-exported)
from pate_accountant._ledger.store import (  # noqa: F401  (re-exported)
    CONFIDENTIAL_SCHEMA_VERSION,
    SCHEMA_VERSION,
    LedgerStore,
)
from pate_accountant._ledger.transaction import TOTALS_MODES, _Position, _Transaction
from pate_accountant._ledger.verify import (  # noqa: F401  (re-exported)
    VerificationResult,
    _group_spends,
    _verify,
    confidential_head,
    needs_confidential,
)

__all__ = [
    "CONFIDENTIAL_SUFFIX",
    "Ledger",
    "InterruptedWriteError",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerRow",
    "LedgerStorageError",
    "STORAGE_ERRORS",
    "PRIVATE_FILE_MODE",
    "VerificationResult",
    "accountant_class",
    "accountant_from_config",
    "confidential_path",
    "describe_mechanism",
    "describe_seed",
    "hide_passwords",
    "is_ledger_url",
    "shown_location",
]

#: What a ledger's database raises when it fails under a read or a write (SQLite's own errors; the PostgreSQL
#: store turns every driver error into :class:`LedgerStorageError`): catch these to stop a run cleanly.
STORAGE_ERRORS = (sqlite3.Error, LedgerStorageError)


def is_ledger_url(location) -> bool:
    """Whether ``location`` names a PostgreSQL ledger (a ``postgresql://`` or ``postgres://`` URL), not a file."""
    return is_postgres_url(location)


def hide_passwords(text, *locations) -> str:
    """``text`` with the password of every ``postgresql://`` URL among ``locations`` replaced by ``***`` (a path
    has none)."""
    for location in locations:
        if is_postgres_url(location):
            text = scrub_secrets(text, url_secrets(location))
    return str(text)


def shown_location(location) -> str:
    """``location`` as messages and output show it: a URL without any password (its user part or ``password``
    parameter), with its ``ledger`` parameter; a path as it is."""
    if not is_postgres_url(location):
        return os.fspath(location)
    try:
        return parse_postgres_url(location)[2]
    except LedgerError:  # an invalid ledger name: the scheme, host and database only, never the user part
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(location)
        except ValueError:  # not even a URL (an unbalanced IPv6 bracket): its scheme, nothing of the rest
            return location.split("://", 1)[0] + "://..."
        return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"


class Ledger(RunRecords):
    """An append-only, hash-chained ledger of privacy charges (see the module docstring).

    Create one with :meth:`open` or :meth:`in_memory`; pass it to an accountant as ``ledger=``.  One
    ``Ledger`` object wraps one store (:class:`~pate_accountant._ledger.store.LedgerStore`; SQLite: one
    connection per file): use it from one thread, and open a new one in each process (never share one across
    ``fork``).  Many processes may open the same files.  The data set, runs and the claim protocol are
    :class:`~pate_accountant._ledger.runs.RunRecords`'s part of this class.
    """

    def __init__(self, store: LedgerStore, *, totals: str = "transaction"):
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        self._totals = totals
        self._store = store
        self._positions: dict[int, _Position] = {}
        self._codec = _Codec()
        self._writer = uuid.uuid4().hex[:16]
        self._run: int | None = None
        self._run_created: float | None = None  # the start time of ``_run``: the time on every row it writes

    # -- constructors ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path, *, read_only: bool = False, synchronous: str = "FULL",
             timeout: float = DEFAULT_TIMEOUT, totals: str = "transaction", confidential=None) -> Ledger:
        """Open the ledger at ``path``, creating it (in WAL mode) if it does not exist.

        ``read_only=True`` opens an existing file without ever writing to it (what ``audit`` does).
        ``synchronous`` is SQLite's durability level: ``"FULL"`` (default) syncs the write-ahead log at
        every commit, so a charge is on disk before the mechanism's output is returned; ``"NORMAL"`` is
        faster and still never corrupts the ledger, but a power cut (not a process crash) may lose the
        last commits.  ``timeout`` is how long a writer waits for another process's transaction.
        ``totals="transaction"`` (default) stores the spent budget after the last row of each transaction
        (a single ``record`` is a transaction of one row; the other rows of a ``record_many`` batch store
        NULL): one ``spent()`` per batch, which matters for accountants whose ``spent()`` is expensive
        (advanced composition, PLD, RDP).  ``totals="row"`` stores it after every row.
        ``confidential`` is the path of the confidential file (default ``path + ".confidential.sqlite"``);
        it is opened, or created, only when an accountant that keeps confidential charges attaches (or by
        :meth:`verify`, when it exists).

        ``path`` may instead be a ``postgresql://`` (or ``postgres://``) URL: the ledger named by its ``ledger``
        parameter (default ``ledger``) is kept in that database's schemas ``NAME`` and ``NAME_confidential``
        (:mod:`~pate_accountant._ledger.postgres_store`; needs the ``postgresql`` extra).
        """
        path = os.fspath(path)
        synchronous = str(synchronous).upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        if is_postgres_url(path):  # a PostgreSQL ledger (docs/ledger.md, "PostgreSQL")
            if confidential is not None:
                raise ValueError("a PostgreSQL ledger keeps its confidential part in the schema NAME_confidential: "
                                 "confidential= is for SQLite ledgers")
            store = PostgresStore(path, read_only=read_only, synchronous=synchronous, timeout=timeout)
        else:
            store = SQLiteStore(path, read_only=read_only, synchronous=synchronous, timeout=timeout,
                                confidential=confidential)
        ledger = cls(store, totals=totals)
        store.open(ledger._check_layout)
        return ledger

    @classmethod
    def in_memory(cls, *, totals: str = "transaction") -> Ledger:
        """A ledger in memory (for tests and dry runs: nothing persists, nothing is shared); its confidential
        part, when an accountant needs one, is a second in-memory database."""
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        ledger = cls(SQLiteStore.in_memory(), totals=totals)
        ledger._check_layout(create=True)
        return ledger

    def _check_layout(self, *, create: bool) -> None:
        """Check (and with ``create``, complete) the store's layout: the store calls this wherever it opens or
        creates a ledger, so a new ledger starts with the metadata :func:`~pate_accountant._ledger.chain.initial_meta`
        gives (its genesis)."""
        self._store.check_layout(create=create, initial_meta=initial_meta)

    # -- the confidential part ------------------------------------------------------------------------------
    @property
    def confidential_path(self) -> str | None:
        """Where the confidential file is (or would be) kept (``None`` in memory)."""
        return self._store.confidential_location

    @property
    def has_confidential(self) -> bool:
        """Whether the confidential part is open on this ``Ledger``."""
        return self._store.has_confidential

    def _open_confidential(self, *, create: bool) -> bool:
        """Open the confidential part (creating it when ``create`` and the ledger is writable); ``False``
        when it does not exist and is not to be created.  Refuses one that belongs to another ledger."""
        return self._store.open_confidential(create=create, initial_meta=initial_confidential_meta)

    def _require_confidential(self, accountant) -> None:
        rows = self._head()[0]
        if self._open_confidential(create=rows == 0 and not self._read_only):
            return
        raise LedgerError(
            f"a {accountant.kind} accountant keeps confidential charges (the teachers charged on each hit): "
            f"replaying this ledger needs its confidential file {self._conf_path!r}, which is missing"
            + ("" if rows else " (and the ledger is open read-only)"))

    def _confidential_genesis(self) -> str:
        return _confidential_genesis_hash(self._store.confidential_meta())

    def _confidential_head(self) -> tuple[int, str | None]:
        return confidential_head(self._store)

    def _drop_orphans(self, head_rows: int) -> tuple[int, str | None]:
        """Inside a write transaction: remove confidential rows and totals of shareable rows that were never
        committed (a writer stopped between the two commits), and return the confidential head."""
        head = self._store.drop_confidential_orphans(head_rows)
        if head is None:
            raise LedgerIntegrityError("the confidential file's head row is missing")
        return head

    # -- life cycle -------------------------------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the main file and empty the log (SQLite's ``wal_checkpoint(TRUNCATE)``),
        so that the ``.sqlite`` file alone holds every committed row: a copy of it is complete, and an audit
        opens it without creating files beside it.  ``True`` when the log was emptied (another process
        reading or writing the ledger can keep it from being; :meth:`close` tries again).  A read-only or
        in-memory ledger has nothing to checkpoint."""
        return self._store.checkpoint()

    def close(self) -> None:
        """Checkpoint a writable ledger (:meth:`checkpoint`), then close the connections (idempotent)."""
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self):
        where = self._path or ":memory:"
        return f"Ledger({where!r}{', read-only' if self._read_only else ''})"

    # -- metadata -------------------------------------------------------------------------------------------
    @property
    def path(self) -> str | None:
        return self._store.location

    _path = path

    @property
    def read_only(self) -> bool:
        return self._store.read_only

    _read_only = read_only

    @property
    def _conf_path(self) -> str | None:
        return self._store.confidential_location

    def _meta(self) -> dict:
        return self._store.meta()

    def _meta_value(self, key: str):
        return meta_value(self._store.meta(), key)

    @property
    def ledger_id(self) -> str | None:
        return self._meta_value("ledger_id")

    @property
    def software_version(self) -> str | None:
        """The pate-accountant version that created the ledger."""
        return self._meta_value("software_version")

    @property
    def created(self) -> float | None:
        return self._meta_value("created")

    @property
    def config(self) -> dict | None:
        """The configuration of the accountant(s) sharing this ledger (``None`` before the first attach)."""
        return self._meta_value("config")

    def _genesis(self) -> str:
        # Not cached: metadata may change (in another process) until the first row exists.
        return _genesis_hash(self._meta())

    def _head(self) -> tuple[int, str | None]:
        head = self._store.head()
        if head is None:
            raise LedgerIntegrityError("the ledger's head row is missing")
        return head[0], head[1]

    @property
    def row_count(self) -> int:
        """Number of rows, as the head records it."""
        return self._head()[0]

    def interrupt(self) -> None:
        """Ask a statement under way to give up soon (a run's first Ctrl-C): a PostgreSQL ledger cuts the deadline
        of a statement its server leaves unanswered to one second; a file has nothing to cut.  Safe to call from a
        signal handler (it writes two attributes)."""
        hook = getattr(self._store, "interrupt", None)
        if hook is not None:
            hook()

    @property
    def stored_spent(self) -> tuple[float, float] | None:
        """The data set's spend as its writer stored it with the last row, ``(0.0, 0.0)`` with no row, or ``None``
        when the ledger keeps it in its confidential part (individual charging).  Read, not verified:
        :meth:`verify` replays the rows and checks it."""
        rows = self.row_count
        if not rows:
            return 0.0, 0.0
        stored = self._store.row_totals(rows)
        return None if stored is None else (float(stored[0]), float(stored[1]))

    @property
    def head_hash(self) -> str | None:
        """The last row's hash (``None`` when empty): write it down elsewhere to detect a later rollback."""
        return self._head()[1]

    @property
    def head_record(self) -> dict:
        """``{"rows", "head_hash", "runs", "run_head_hash"}``: the heads of the row and run chains, read in one
        statement (so together, even while another process writes).  What a signed checkpoint
        (:mod:`pate_accountant.checkpoints`) or a pin written down elsewhere records."""
        return pin_record(self._store)

    def row_hash(self, row_id: int) -> str | None:
        """The stored hash of row ``row_id`` (``None`` when there is no such row); no verification."""
        return self._store.row_hash(row_id)

    def run_hash(self, run_id: int) -> str | None:
        """The stored hash of run ``run_id`` (``None`` when there is no such run); no verification."""
        return self._store.run_hash(run_id)

    def rows(self):
        """Decode every row, in order (no verification; use :meth:`verify` for that).  Teacher sets are
        filled in from the confidential file when it is open on this ``Ledger``."""
        codec = _Codec()
        teachers = {}
        if self._store.has_confidential:
            for share_row, text in self._store.confidential_teachers():
                teachers[share_row] = frozenset(json.loads(text))
        for raw in self._store.rows():
            yield ledger_row(codec, raw, teachers.get(raw[0], frozenset()))

    # -- transactions -----------------------------------------------------------------------------------
    def _write_transaction(self, *, confidential: bool = False):
        """The store's write transaction (with ``confidential``, on both parts): on exit the confidential part
        commits first, then the shareable one (see the module docstring).  Transactions do not nest."""
        return self._store.write(confidential=confidential, between_commits=self._between_commits)

    def _between_commits(self) -> None:
        """Called after the confidential commit and before the shareable one (tests stop a writer here)."""

    def attach(self, accountant) -> None:
        """Bind ``accountant`` to this ledger (called by ``Accountant.__init__``).

        The first accountant stores its ``config()``; a later one must have an equal configuration
        (``ValueError`` naming the difference otherwise) and replays every stored row through its public
        ``replay`` (under a read snapshot, so other writers are not blocked while it catches up).  An
        accountant with confidential charges opens the confidential file, creating it on a ledger without
        rows; on a ledger with rows a missing confidential file is a ``LedgerError``.
        """
        existing = self._positions.get(id(accountant))
        if existing is not None and existing.ref() is accountant:
            raise ValueError("this accountant is already attached to this ledger")
        config_text = _json_data("accountant config", accountant.config())
        stored = self._meta().get("config")
        if stored is not None and stored != config_text:
            difference = _config_difference(json.loads(stored), json.loads(config_text))
            raise ValueError(f"accountant config does not match the ledger's: {difference or 'encoding differs'}")
        confidential = _keeps_confidential(accountant)
        if confidential:
            self._require_confidential(accountant)
        position = _Position(accountant, confidential)
        with self._read_transaction(confidential=confidential):
            stored = self._meta().get("config")
            if stored is not None or self._read_only:
                self._attach_to(accountant, position, stored, config_text)
        if stored is None and not self._read_only:
            with self._write_transaction(confidential=confidential):  # first attach: store the config
                stored = self._meta().get("config")
                if stored is None and not self._head()[0]:
                    self._store.set_meta("config", config_text)
                else:
                    self._attach_to(accountant, position, stored, config_text)
        self._positions[id(accountant)] = position
        with contextlib.suppress(TypeError):  # no weak references: _Position holds it instead
            weakref.finalize(accountant, self._positions.pop, id(accountant), None)

    def _attach_to(self, accountant, position: _Position, stored: str | None, config_text: str) -> None:
        head_rows, head_hash = self._head()
        if stored is None:
            if head_rows:
                raise LedgerIntegrityError("the ledger has rows but no accountant config", row=1)
            return
        if stored != config_text:
            difference = _config_difference(json.loads(stored), json.loads(config_text))
            raise ValueError(f"accountant config does not match the ledger's: {difference or 'encoding differs'}")
        self._catch_up(accountant, position, head_rows, head_hash)
        if head_rows:
            self._check_last_totals(accountant, position, head_rows, head_hash)

    def sync(self, accountant) -> None:
        """Replay into ``accountant`` the rows other writers committed since it last looked: one read
        transaction, which reads only the head when nothing new was written (no write lock).  Charges catch
        up by themselves, inside their write transaction; ``can_afford`` and ``register``'s pre-run check
        call this to see what other processes spent."""
        position = self._position(accountant)
        with self._read_transaction() as snapshot:
            head_rows, head_hash = self._head()
            if (head_rows, head_hash) == (position.last_id, position.last_hash):
                return
            if position.confidential:
                snapshot.add_confidential()
            self._catch_up(accountant, position, head_rows, head_hash)

    def _read_transaction(self, *, confidential: bool = False):
        """Read snapshots: the shareable part's first, then (with ``confidential``, or later through the
        yielded object's ``add_confidential()``) the confidential part's, so that every confidential row a
        shareable row names is in the second snapshot (it was committed first)."""
        return self._store.read(confidential=confidential)

    def _stored_totals(self, position: _Position, row_id: int, row_hash: str | None):
        """The totals stored after row ``row_id`` (from the confidential file for a confidential accountant)."""
        if position.confidential:
            stored = self._store.confidential_row_totals(row_id)
            if stored is None or stored[0] != row_hash:
                return None
            return stored[1], stored[2]
        return self._store.row_totals(row_id)

    def _check_last_totals(self, accountant, position: _Position, row_id: int, row_hash: str | None) -> None:
        stored = self._stored_totals(position, row_id, row_hash)
        if stored is None:
            if position.confidential:
                raise LedgerIntegrityError(f"the confidential file stores no spent totals for row {row_id}, the last "
                                           "row (the last row of every transaction has them)", row=row_id)
            return  # checked by _catch_up's chain check: the last row of a transaction always has totals
        spent = accountant.spent()
        if not (_totals_close(float(spent[0]), stored[0]) and _totals_close(float(spent[1]), stored[1])):
            raise LedgerIntegrityError(
                f"totals disagree at row {row_id}: the ledger stores spent ({stored[0]!r}, {stored[1]!r}) but "
                f"replaying gives ({spent[0]!r}, {spent[1]!r})", row=row_id)

    def _position(self, accountant) -> _Position:
        position = self._positions.get(id(accountant))
        if position is None or position.ref() is not accountant:
            raise RuntimeError("this accountant is not attached to this ledger")
        return position

    #: Rows decoded and replayed together while catching up (each batch one ``replay`` call).
    _REPLAY_BATCH = 2048

    def _catch_up(self, accountant, position: _Position, head_rows: int, head_hash: str | None) -> None:
        """Replay the rows after ``position`` into ``accountant`` through its public ``replay`` (checking their
        chain, and for a confidential accountant the confidential rows and links), up to the head.  Rows are
        replayed in batches, all of a batch or none, and the position moves after each batch."""
        if head_rows < position.last_id:
            raise LedgerIntegrityError(
                f"the ledger has {head_rows} rows but this accountant has seen {position.last_id}: rows were removed",
                row=head_rows + 1)
        if head_rows > position.last_id:
            last_id, prev, conf_id, conf_prev = position.mark
            if not last_id:
                prev = self._genesis()
            expected = last_id + 1
            links = None
            if position.confidential:
                links = iter(self._store.confidential_rows(conf_id, head_rows))
                if not conf_id:
                    conf_prev = self._confidential_genesis()
            rows = iter(self._store.rows(last_id))
            batch: list = []
            while True:
                raws = list(itertools.islice(rows, self._REPLAY_BATCH))
                if not raws:
                    break
                batch.clear()
                first = expected
                for raw in raws:
                    try:
                        row = _check_row(self._codec, raw, expected, prev)
                        charge = row.charge
                        if links is not None:
                            charge, conf_step = _link(row, expected, links, conf_id, conf_prev)
                            if conf_step is not None:
                                conf_id, conf_prev = conf_step
                        elif row.commitment is not None:
                            raise _RowError(expected, f"row {expected} carries a teacher-set commitment but this "
                                                      f"{accountant.kind} accountant keeps no confidential charges")
                    except _RowError as exc:
                        self._replay_batch(accountant, position, batch, first)  # the good rows before it
                        raise LedgerIntegrityError(exc.message, row=exc.row) from None
                    batch.append((charge, (expected, row.hash, conf_id, conf_prev if conf_id else None)))
                    prev = row.hash
                    expected += 1
                self._replay_batch(accountant, position, batch, first)
        if position.last_id != head_rows or position.last_hash != head_hash:
            raise LedgerIntegrityError(
                f"the ledger's head (row {head_rows}) does not match its rows (last row {position.last_id}): "
                "rows were dropped or edited", row=position.last_id + 1 if position.last_id < head_rows else head_rows)

    @staticmethod
    def _replay_batch(accountant, position: _Position, batch: list, first: int) -> None:
        """``accountant.replay`` of a batch of ``(charge, mark after it)``, moving the position after it.  If
        the accountant refuses the batch (all or nothing), the rows are replayed one at a time to name the
        row it refuses (the rows before it stay replayed)."""
        if not batch:
            return
        try:
            accountant.replay([charge for charge, _ in batch])
            refused = False
        except Exception:  # any refusal: found and named row by row below
            refused = True
        if not refused:
            position.mark = batch[-1][1]
            return
        for i, (charge, mark) in enumerate(batch):
            try:
                accountant.replay([charge])
            except Exception as exc:
                raise LedgerIntegrityError(f"row {first + i} cannot be replayed: {type(exc).__name__}: {exc}",
                                           row=first + i) from exc
            position.mark = mark

    @contextlib.contextmanager
    def transaction(self, accountant):
        """The one write transaction of a charge by ``accountant`` (what ``Accountant`` charges run in).

        Takes SQLite's write lock (``BEGIN IMMEDIATE``, on both files for a confidential accountant),
        removes confidential rows left by a writer that stopped between its two commits, and replays into
        ``accountant`` (its public ``replay``) the rows other writers committed since it last looked -- only
        when the head shows some.  Then it yields an object whose ``append(charge)`` the accountant calls for
        each charge it has checked and applied.  When the block ends the rows are written with the
        accountant's ``spent()`` and committed, and the accountant's position moves past them; an exception
        rolls everything back (the accountant then takes its charges back).  This is storage: the ledger
        never checks a budget; the accountant does, against the caught-up state.
        """
        position = self._position(accountant)
        with self._write_transaction(confidential=position.confidential):
            head_rows, head_hash = self._head()
            conf_head = self._drop_orphans(head_rows) if position.confidential else None
            self._catch_up(accountant, position, head_rows, head_hash)
            if position.confidential and conf_head != ((position.conf_id, position.conf_hash) if position.conf_id
                                                       else (0, None)):
                raise LedgerIntegrityError(
                    f"the confidential file's head (row {conf_head[0]}) does not match its rows "
                    f"(last linked row {position.conf_id}): confidential rows were dropped or added")
            tx = _Transaction(self, accountant, position, head_rows, head_hash, conf_head)
            yield tx
            tx._write()
        position.mark = tx._new_mark  # one store: committed, and the accountant keeps its charges

    # -- verification ------------------------------------------------------------------------------------
    def verify(self) -> VerificationResult:
        """Check the hash chains and heads and the runs, replay every row through a fresh accountant rebuilt
        from the stored configuration, compare the totals and check the budget was never exceeded.

        For an accountant that keeps confidential charges this needs the confidential file (opened
        read-only here when it exists and is not open yet); without it only the shareable part is checked
        (``confidential="absent"``, ``spent=None``).
        """
        try:
            confidential = needs_confidential(self._store)
            if confidential and not self._store.has_confidential:
                try:
                    self._open_confidential(create=False)
                except LedgerError as exc:
                    return VerificationResult(False, 0, None, None, str(exc), confidential="unusable",
                                              confidential_path=self._conf_path)
            with self._read_transaction(confidential=confidential):
                return _verify(self._store, self._codec, self._conf_path)
        except (*self._store.errors, UnicodeDecodeError, ValueError) as exc:  # damaged pages or schema
            return VerificationResult(False, 0, None, None, f"the file is not a readable ledger: {exc}")


def _charge_class():
    """The accountants' ``Charge`` class, imported when the ledger first needs one: the ledger rebuilds and replays
    into accountants, so it imports them inside this one function (installed in the codec room below)."""
    from pate_accountant.accountants.base import Charge

    return Charge


_codec_room.load_charge_class = _charge_class


# -- copying a ledger between stores (issue 25, item 2) ------------------------------------------------------
def copy_ledger(source, destination, *, batch: int = 2000) -> dict:
    """Copy the whole ledger at ``source`` (a path or a ``postgresql://`` URL) to ``destination`` (either kind):
    its metadata, every row and run, and its confidential part when ``source`` has one, **as stored** (the raw
    values the hashes cover: nothing is re-charged or re-hashed), in one write transaction on ``destination``.

    ``destination`` must hold no ledger with a row or a run (``LedgerError`` otherwise, left unchanged); a new one
    that the copy fails to fill is removed again.  Returns ``{"rows", "head_hash", "runs", "run_head_hash",
    "confidential"}`` of the source (``confidential``: whether a confidential part was copied).  The caller verifies
    both ends (``pate-accountant ledger copy`` does, and compares their heads)."""

    with Ledger.open(source, read_only=True) as src:
        src_store = src._store
        dst = Ledger.open(destination)
        done = False
        try:
            dst_store = dst._store
            if dst.path is not None and dst.path == src.path:
                raise LedgerError(f"destination {dst.path!r} is the source")
            if dst_store.head() is None or tuple(dst_store.head())[0] or tuple(dst_store.head())[2]:
                raise LedgerError(f"destination {dst.path!r} already holds a ledger with rows or runs: not "
                                  "overwritten (copy into a new, empty location)")
            has_conf = src._open_confidential(create=False)
            with src_store.read(confidential=has_conf) as snapshot:
                if has_conf:
                    snapshot.add_confidential()
                meta = src_store.meta()
                heads = pin_record(src_store)
                rows, head_hash, runs, run_head_hash = (heads[k] for k in ("rows", "head_hash", "runs", "run_head_hash"))
                conf_meta = src_store.confidential_meta() if has_conf else None
                extra = set(dst_store.meta()) - set(meta)
                if extra:
                    raise LedgerError(f"destination {dst.path!r} has metadata the source lacks ({sorted(extra)})")
                with dst_store.write():
                    now = dst_store.head()
                    if now[0] or now[2]:
                        raise LedgerError(f"destination {dst.path!r} gained rows or runs while being copied into")
                    for key, text in meta.items():
                        dst_store.set_meta(key, text)
                if has_conf:
                    if dst_store.has_confidential or not dst._store.open_confidential(
                            create=True, initial_meta=lambda _ledger_id: dict(conf_meta)):
                        raise LedgerError(f"destination {dst.path!r}: cannot create its confidential part")
                    if dst_store.confidential_meta() != conf_meta:
                        raise LedgerError(f"destination {dst.path!r} already had a confidential part of its own")
                with dst_store.write(confidential=has_conf):
                    copied, last = 0, None
                    source_rows = iter(src_store.rows())
                    while chunk := list(itertools.islice(source_rows, batch)):
                        copied, last = chunk[-1][0], chunk[-1][2]
                        dst_store.append_rows(chunk, copied, last)
                    if (copied, last) != (rows, head_hash):
                        raise LedgerIntegrityError(f"the source's rows end at row {copied} ({last}), its head says "
                                                   f"row {rows} ({head_hash}): not copied")
                    run_count = 0
                    for run in src_store.runs():
                        run_count += 1
                        dst_store.append_run(tuple(run), run[0], run[2])
                    if run_count != runs:
                        raise LedgerIntegrityError(f"the source has {run_count} runs, its head says {runs}: not copied")
                    if has_conf:
                        conf_rows = [tuple(r) for r in src_store.confidential_rows(None, rows)]
                        totals = [tuple(t) for t in src_store.confidential_totals(rows)]
                        conf_head = src_store.confidential_head()
                        dst_store.append_confidential(conf_rows, totals, conf_head[0], conf_head[1])
            done = True
        finally:
            if done:
                dst.close()
            else:
                dst.discard_if_unused()
    return {"rows": rows, "head_hash": head_hash, "runs": runs, "run_head_hash": run_head_hash,
            "confidential": has_conf}
