"""The storage interface: what a ledger store keeps, and the few operations :class:`~pate_accountant.ledger.Ledger`
and its rooms ask of it.

A store keeps two parts of one ledger: the **shareable** part (metadata, the chained rows, the chained runs and
a head) and, for accountants with confidential charges, the **confidential** part (teacher sets, salts, totals;
:mod:`.confidential`).  It owns everything about *where and how* they are kept: connections, SQL and its
placeholders, the table layout and its creation, locks, the check that something found at a location is one of
our ledgers, and the removal of an unused ledger.  It knows nothing about hashing, events or accountants: the
rows it is given are already chained (:mod:`.chain`), and the rows it returns are checked by the caller.  So the
hashing, verification and replay code never touches a database module; a second store (PostgreSQL through
psycopg 3) implements :class:`LedgerStore` and the rest is unchanged.

Values.  Stores return raw tuples in the column orders of :mod:`.codec` (``ROW_FIELDS``, ``RUN_FIELDS``,
``CONF_FIELDS``) with Python ``str`` / ``int`` / ``float`` / ``None`` exactly as stored: the hashes cover the
stored values' types (``_field``), so a store must neither coerce nor round (a REAL stays a ``float``, TEXT a
``str``; PostgreSQL: ``double precision``, ``bigint``, ``text``).  Metadata values are canonical JSON texts.

Transactions.  Every read method runs inside the transaction that is open on the store (a :meth:`read` snapshot
or a :meth:`write` transaction) when there is one, else as one statement of its own.  The iterators of the long
reads (``rows``, ``runs``, ``confidential_rows``, ``confidential_teachers``, ``confidential_totals``) returned
inside a transaction are valid until it ends (a server store streams them through a server-side cursor): iterate
them inside it.
``read(confidential=...)`` is one consistent snapshot: of the shareable part first, then of the confidential
part (the confidential part is committed first, so every confidential row a shareable row in the first snapshot
names is in the second).  ``write(confidential=...)`` serialises writers of the ledger across processes and
hosts: once it is entered no other writer can commit to this ledger until it ends, so the head read inside it is
the head the new rows extend.  SQLite takes its file write lock (``BEGIN IMMEDIATE``); a server store would lock
the ledger's head row (``SELECT ... FOR UPDATE``), which every writer reads first.  On leaving the block
without an exception it commits the confidential part first, calls ``between_commits()``, then commits the
shareable part; an exception rolls both back.  Transactions do not nest: opening one while one is open on the
store is a ``RuntimeError``, and ``write`` on a read-only store is a ``LedgerError``.

Opening.  How a store is opened depends on where it lives (a path; a connection string and a ledger name), so
the constructors are the implementation's own (:class:`.sqlite_store.SQLiteStore`).  What they share: a location
where nothing exists is created with the whole layout or not at all; anything else at the location must be one
of our ledgers (``LedgerError`` otherwise, and the thing is left unchanged); a ledger marked discarded
(:meth:`LedgerStore.discard_if_unused`) is never used (``_Discarded``, and the opener looks again).  The facade
passes a ``layout(create=...)`` callable that the opener calls wherever the layout is checked or completed; it
calls :meth:`LedgerStore.check_layout` with the metadata a new ledger starts with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from pate_accountant._ledger.errors import LedgerError, LedgerIntegrityError

#: Version of the shareable layout; a ledger with another version is refused.
SCHEMA_VERSION = 2
#: Version of the confidential layout.
CONFIDENTIAL_SCHEMA_VERSION = 1
#: The tables every shareable part has (a store that is not laid out in tables names its parts the same way).
LEDGER_TABLES = frozenset({"meta", "charges", "head", "runs"})


def check_confidential_meta(meta: dict, ledger_id: str | None, where: str, part: str) -> None:
    """Refuse a confidential part whose metadata ``meta`` is not of :data:`CONFIDENTIAL_SCHEMA_VERSION`
    (``LedgerError``) or names another ledger id than ``ledger_id`` (``LedgerIntegrityError``): what every store's
    :meth:`LedgerStore.open_confidential` checks.  ``where`` and ``part`` (``"file"``, ``"part"``) name it."""
    version = meta.get("schema_version")
    if version is None or json.loads(version) != CONFIDENTIAL_SCHEMA_VERSION:
        raise LedgerError(f"{where!r} is not a confidential ledger {part} of schema version "
                          f"{CONFIDENTIAL_SCHEMA_VERSION} (found {version})")
    if meta.get("ledger_id") != ledger_id:
        raise LedgerIntegrityError(f"the confidential {part} {where!r} belongs to another ledger (ledger ids differ)")


class StoreIdentity:
    """The identity properties every store answers the same way, and the check every transaction starts with (a
    small base under both stores; :class:`LedgerStore` stays the contract): the store sets ``_read_only`` when it
    is made, ``_created_here`` when its opener created the ledger, and ``_busy`` while a transaction is open."""

    _read_only: bool = False
    _created_here: bool = False
    _busy: bool = False

    def _check_can_begin(self, *, write: bool) -> None:
        """Before :meth:`LedgerStore.read` or :meth:`~LedgerStore.write` begins: a read-only store writes nothing
        (``LedgerError``), and transactions do not nest (``RuntimeError``)."""
        if write and self._read_only:
            raise LedgerError(f"ledger {self.location!r} is open read-only")
        if self._busy:
            raise RuntimeError("a ledger transaction is already open on this Ledger")

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def created_here(self) -> bool:
        return self._created_here


@runtime_checkable
class ReadSnapshot(Protocol):
    """What :meth:`LedgerStore.read` yields."""

    def add_confidential(self) -> None:
        """Start the confidential snapshot now (after the shareable one), if the confidential part is open and
        its snapshot is not started yet."""


@runtime_checkable
class LedgerStore(Protocol):
    """Where one ledger's two parts are kept (see the module docstring for the rules every method follows)."""

    #: What the store raises when its data cannot be read at all (damaged pages, a broken layout): the
    #: verification turns these into a failed verdict instead of a crash.  (A lost database connection is not
    #: among them: it raises, as :class:`~.errors.LedgerStorageError` from a server store.)
    errors: tuple

    # -- identity ----------------------------------------------------------------------------------------------
    @property
    def location(self) -> str | None:
        """Where the shareable part is, as error messages name it (a path; ``None`` in memory)."""

    @property
    def confidential_location(self) -> str | None:
        """Where the confidential part is or would be (``None`` in memory)."""

    @property
    def read_only(self) -> bool:
        """Opened for reading only: every write method refuses."""

    @property
    def created_here(self) -> bool:
        """Whether this store's opener created the ledger (it was not there before)."""

    @property
    def has_confidential(self) -> bool:
        """Whether the confidential part is open."""

    # -- layout ------------------------------------------------------------------------------------------------
    def check_layout(self, *, create: bool, initial_meta: Callable[[], dict]) -> None:
        """Check that the store holds one of our ledgers, of :data:`SCHEMA_VERSION` (``LedgerError`` naming the
        location otherwise; ``_Discarded`` when it is marked discarded).  With ``create``, complete a missing
        layout under the write lock and store ``initial_meta()`` (the texts of a new ledger's metadata) for the
        keys not yet set.  An empty layout is accepted only where this store created the ledger."""

    def open_confidential(self, *, create: bool, initial_meta: Callable[[str | None], dict]) -> bool:
        """Open the confidential part, creating it when ``create`` and the store is writable
        (``initial_meta(ledger_id_text)`` gives its first metadata); ``False`` when it does not exist and is not
        to be created.  Refuses a part of :data:`CONFIDENTIAL_SCHEMA_VERSION`'s layout that is not ours
        (``LedgerError``) or that names another ledger id (``LedgerIntegrityError``)."""

    # -- transactions ------------------------------------------------------------------------------------------
    def read(self, *, confidential: bool = False) -> AbstractContextManager[ReadSnapshot]:
        """One read snapshot (no lock that stops writers); with ``confidential`` of both parts."""

    def write(self, *, confidential: bool = False,
              between_commits: Callable[[], None] | None = None) -> AbstractContextManager[None]:
        """The write transaction (see the module docstring); ``LedgerError`` when the lock cannot be had in
        time."""

    # -- the shareable part: reads ---------------------------------------------------------------------------
    def tables(self) -> set:
        """Which of the ledger's tables (:data:`LEDGER_TABLES`) exist (empty: nothing laid out)."""

    def meta(self) -> dict:
        """Every metadata key and its canonical JSON text (``{}`` before the layout exists)."""

    def head(self) -> tuple | None:
        """``(row_count, last_hash, run_count, run_last_hash)`` read together; ``None`` when the head is missing."""

    def rows(self, after: int | None = None) -> Iterator[tuple]:
        """The rows with an id above ``after`` (every row for ``None``), in id order, as raw ``ROW_FIELDS``
        tuples (``grp`` ``None`` on a ledger written before groups existed)."""

    def runs(self) -> Iterator[tuple]:
        """Every run, in id order, as raw ``RUN_FIELDS`` tuples."""

    def row_hash(self, row_id: int) -> str | None:
        """The stored hash of row ``row_id`` (``None``: no such row)."""

    def run_hash(self, run_id: int) -> str | None:
        """The stored hash of run ``run_id`` (``None``: no such run)."""

    def row_totals(self, row_id: int) -> tuple | None:
        """``(spent_epsilon, spent_delta)`` stored on row ``row_id``; ``None`` when the row stores none."""

    # -- the shareable part: writes (inside write()) ---------------------------------------------------------
    def set_meta(self, key: str, text: str) -> None:
        """Store metadata ``key`` (a canonical JSON text), replacing it (the layout refuses a change once rows
        exist)."""

    def append_rows(self, rows: Iterable[tuple], row_count: int, last_hash: str | None) -> None:
        """Insert chained rows (``ROW_FIELDS`` tuples) and move the row head to ``(row_count, last_hash)``."""

    def append_run(self, run: tuple, run_count: int, run_last_hash: str) -> None:
        """Insert one chained run (a ``RUN_FIELDS`` tuple) and move the run head."""

    # -- the confidential part ----------------------------------------------------------------------------------
    def confidential_meta(self) -> dict:
        """The confidential part's metadata texts."""

    def confidential_head(self) -> tuple | None:
        """``(row_count, last_hash)`` of the confidential chain; ``None`` when its head is missing."""

    def confidential_rows(self, after: int | None, up_to: int) -> Iterator[tuple]:
        """Confidential rows with an id above ``after`` (all for ``None``) that name a shareable row up to
        ``up_to``, in id order, as raw ``CONF_FIELDS`` tuples."""

    def confidential_teachers(self) -> Iterator[tuple]:
        """``(share_row, charged_teachers text)`` of every confidential row (no checks: :meth:`Ledger.rows`)."""

    def confidential_totals(self, up_to: int) -> Iterator[tuple]:
        """``(share_row, share_hash, spent_epsilon, spent_delta)`` stored for shareable rows up to ``up_to``."""

    def confidential_row_totals(self, share_row: int) -> tuple | None:
        """``(share_hash, spent_epsilon, spent_delta)`` stored for shareable row ``share_row``, or ``None``."""

    def confidential_orphans(self, head_rows: int) -> int:
        """How many confidential rows name a shareable row beyond ``head_rows`` (an interrupted charge)."""

    def drop_confidential_orphans(self, head_rows: int) -> tuple | None:
        """Inside a confidential write: delete the confidential rows and totals of shareable rows beyond
        ``head_rows`` (a writer stopped between its two commits) and return the confidential head after it."""

    def append_confidential(self, rows: Iterable[tuple], totals: Iterable[tuple], row_count: int,
                            last_hash: str | None) -> None:
        """Inside a confidential write: insert chained confidential rows (``CONF_FIELDS``) and totals
        ``(share_row, share_hash, spent_epsilon, spent_delta)``, and move the confidential head."""

    # -- life cycle ------------------------------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Make the store's own durable copy complete (SQLite: fold the write-ahead log into the file);
        ``True`` when done (a server store: always)."""

    def close(self) -> None:
        """Checkpoint (when writable), then release every connection; idempotent."""

    def discard_if_unused(self) -> bool:
        """The claim protocol's way back: when no other connection uses the ledger and it has no row and no
        run, mark it discarded (so a process that found it an instant before looks again) and remove it, with
        a confidential part this store created; return whether it was removed.  Otherwise leave it as it is.
        Closes the store either way.  The facade decides first whether this ledger may be discarded at all."""
