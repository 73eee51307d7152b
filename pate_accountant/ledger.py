"""The persistent privacy ledger: append-only SQLite, hash-chained, shared by processes (docs/ledger.md).

A ledger stores what an accountant charged, one row per charge: the privacy event (as JSON data, see
:mod:`pate_accountant.serialization`), how many times it ran, the outcome class (``token`` / ``fail`` /
``target``, or nothing for a plain ``compose``), the charged teachers, and the budget spent after the
row (on the last row of each transaction, or on every row with ``totals="row"``).  It never stores
released values, prompts, records or vote counts.

* ``Ledger.open(path)`` opens (creating if needed) a file in WAL mode; ``Ledger.in_memory()`` a
  throw-away one.  ``SomeAccountant(budget=..., ledger=ledger)`` attaches an accountant: the first
  one writes its configuration; a later one (another process, a restart) must have an equal
  configuration and catches up by replaying the rows already there.
* Each charge runs in one SQLite write transaction (``BEGIN IMMEDIATE``): rows other processes
  appended since are replayed into the accountant first, then the budget is checked, then the rows
  and the ``head`` are written and committed.  So one budget holds across any number of processes.
* Each row's hash is ``sha256`` of the previous hash and the row's fields (id included); the first
  row chains to a genesis hash of the metadata (accountant configuration, run metadata, software
  version).  The ``head`` row (row count and last hash) is updated in the same transaction, so
  dropped trailing rows show too.
* :meth:`Ledger.verify` (and ``pate-accountant audit PATH``) checks the chain and the head, replays
  every row through a fresh accountant rebuilt from the stored configuration, compares the totals
  wherever they are stored and checks the budget was never exceeded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import math
import os
import pkgutil
import sqlite3
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import attr

from pate_accountant import __version__
from pate_accountant.errors import BudgetExhaustedError, PateAccountantError
from pate_accountant.release import OUTCOMES
from pate_accountant.serialization import canonical_json, event_from_data, event_to_data

__all__ = [
    "Ledger",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerRow",
    "VerificationResult",
    "accountant_class",
    "accountant_from_config",
    "describe_mechanism",
    "describe_seed",
]

#: Version of the table layout below; a ledger with another version is refused.
SCHEMA_VERSION = 1
#: Metadata keys that the first row's ``prev_hash`` (the genesis hash) covers.
GENESIS_KEYS = ("schema_version", "ledger_id", "created", "software_version", "config", "run_metadata")
#: Relative tolerance when comparing replayed totals with the stored ones (they are normally identical).
TOTALS_RTOL = 1e-9
TOTALS_ATOL = 1e-12
#: Seconds a writer waits for another process's write transaction before giving up.
DEFAULT_TIMEOUT = 60.0
SYNCHRONOUS_MODES = ("FULL", "EXTRA", "NORMAL")
#: When a writer stores the spent totals: after the last row of each transaction (the other rows of a
#: batch store NULL; the default: one ``spent()`` per batch), or after every row.
TOTALS_MODES = ("transaction", "row")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    id               INTEGER PRIMARY KEY,
    prev_hash        TEXT NOT NULL,
    hash             TEXT NOT NULL,
    event            TEXT NOT NULL,
    count            INTEGER NOT NULL,
    outcome          TEXT,
    charged_teachers TEXT NOT NULL,
    spent_epsilon    REAL,
    spent_delta      REAL,
    created          REAL NOT NULL,
    writer           TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS head (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    row_count INTEGER NOT NULL,
    last_hash TEXT
);
INSERT OR IGNORE INTO head (id, row_count, last_hash) VALUES (1, 0, NULL);
CREATE TRIGGER IF NOT EXISTS charges_append_only_update BEFORE UPDATE ON charges
BEGIN SELECT RAISE(ABORT, 'ledger rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS charges_append_only_delete BEFORE DELETE ON charges
BEGIN SELECT RAISE(ABORT, 'ledger rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS meta_frozen_update BEFORE UPDATE ON meta
WHEN (SELECT row_count FROM head WHERE id = 1) > 0
BEGIN SELECT RAISE(ABORT, 'ledger metadata is frozen once rows exist'); END;
CREATE TRIGGER IF NOT EXISTS meta_frozen_delete BEFORE DELETE ON meta
WHEN (SELECT row_count FROM head WHERE id = 1) > 0
BEGIN SELECT RAISE(ABORT, 'ledger metadata is frozen once rows exist'); END;
"""

_ROW_COLUMNS = "id, prev_hash, hash, event, count, outcome, charged_teachers, spent_epsilon, spent_delta, created, writer"


class LedgerError(PateAccountantError):
    """A ledger cannot be opened or written (not a ledger, read-only, wrong schema, ...)."""


class LedgerIntegrityError(LedgerError):
    """The ledger's rows do not verify (edited, dropped, reordered rows or totals that disagree)."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


class _RowError(Exception):
    def __init__(self, row: int | None, message: str):
        super().__init__(message)
        self.row = row
        self.message = message


# -- public value objects -----------------------------------------------------------------------------


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LedgerRow:
    """One decoded ledger row (what :meth:`Ledger.rows` yields)."""

    id: int
    event: Any
    count: int
    outcome: str | None
    charged_teachers: frozenset
    spent: tuple | None
    created: float
    writer: str
    hash: str

    def charge(self):
        from pate_accountant.accountants.base import Charge

        return Charge(self.event, self.count, self.outcome, self.charged_teachers)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class VerificationResult:
    """What :meth:`Ledger.verify` found.  ``ok`` is true when the chain, the head and the replayed totals
    all agree and the budget was never exceeded; otherwise ``first_bad_row`` names the first offending
    row (``None`` when no single row is to blame, e.g. a damaged metadata table) and ``message`` says
    what is wrong."""

    ok: bool
    rows: int
    spent: tuple | None
    first_bad_row: int | None
    message: str
    kind: str | None = None
    budget: tuple | None = None
    config: dict | None = None
    run_metadata: dict | None = None
    head_hash: str | None = None
    software_version: str | None = None
    ledger_id: str | None = None

    def as_dict(self) -> dict:
        data = attr.asdict(self, recurse=False)
        data["spent"] = None if self.spent is None else {"epsilon": self.spent[0], "delta": self.spent[1]}
        data["budget"] = None if self.budget is None else {"epsilon": self.budget[0], "delta": self.budget[1]}
        return data


# -- hashing and encoding -------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _field(value) -> str:
    """Unambiguous text of one stored value, for hashing: strings are length-prefixed, reals are written
    with ``repr`` (which round-trips doubles), and a value of an unexpected type hashes differently from
    any well-formed one (so a column tampered to another type is caught)."""
    kind = type(value)  # exact types: bool is not int here, and SQLite returns exactly these
    if kind is str:
        return f"s{len(value)}:{value}"
    if kind is float:
        return f"f{value!r}"
    if kind is int:
        return f"i{value}"
    if value is None:
        return "n"
    return f"!{value!r}"


def _row_hash(prev_hash, row_id, event_text, count, outcome, teachers_text, spent_epsilon, spent_delta,
              created, writer) -> str:
    """``sha256(prev_hash | id | event | count | outcome | charged_teachers | spent | created | writer)``."""
    content = "|".join(map(_field, (prev_hash, row_id, event_text, count, outcome, teachers_text, spent_epsilon,
                                    spent_delta, created, writer)))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _genesis_hash(meta: dict) -> str:
    """The first row's ``prev_hash``: a hash of the stored metadata texts (configuration included)."""
    return _sha256("pate-accountant ledger genesis\n" + canonical_json({key: meta.get(key) for key in GENESIS_KEYS}))


def _json_data(name: str, value) -> str:
    """Canonical JSON text of ``value``, which must be plain JSON data (dicts with str keys, lists, str,
    finite numbers, bools, None)."""
    _check_json_data(name, value)
    return canonical_json(value)


def _check_json_data(name: str, value) -> None:
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be JSON data: {value!r} is not a finite number")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_data(f"{name}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{name} must be JSON data: key {key!r} is not a string")
            _check_json_data(f"{name}[{key!r}]", item)
        return
    raise TypeError(f"{name} must be JSON data, got {value!r} of type {type(value).__name__}")


def _config_difference(stored: dict, given: dict) -> str:
    keys = sorted(set(stored) | set(given))
    parts = [
        f"{key}: ledger has {stored.get(key, '<missing>')!r}, accountant has {given.get(key, '<missing>')!r}"
        for key in keys
        if stored.get(key, "<missing>") != given.get(key, "<missing>")
    ]
    return "; ".join(parts)


def _totals_close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=TOTALS_RTOL, abs_tol=TOTALS_ATOL)


class _Codec:
    """Event <-> JSON text, with small caches (a generation run charges the same event over and over)."""

    _LIMIT = 4096

    def __init__(self):
        self._to_text: dict = {}
        self._from_text: dict = {}

    def encode(self, event) -> str:
        try:
            return self._to_text[event]
        except (KeyError, TypeError):
            pass
        text = canonical_json(event_to_data(event))
        try:
            if len(self._to_text) >= self._LIMIT:
                self._to_text.clear()
            self._to_text[event] = text
        except TypeError:  # an unhashable event (e.g. a ComposedDpEvent holding a list)
            pass
        return text

    def decode(self, text: str):
        event = self._from_text.get(text)
        if event is None:
            event = event_from_data(json.loads(text))
            if len(self._from_text) >= self._LIMIT:
                self._from_text.clear()
            self._from_text[text] = event
        return event


def _check_row(codec: _Codec, row, expected_id: int, prev_hash: str):
    """Check one raw row against the chain and decode it; raise ``_RowError`` naming the row.

    Returns ``(charge, (spent_epsilon, spent_delta) or None, hash)``.
    """
    from pate_accountant.accountants.base import Charge

    (row_id, stored_prev, stored_hash, event_text, count, outcome, teachers_text, spent_epsilon,
     spent_delta, created, writer) = row
    if row_id != expected_id:
        if isinstance(row_id, int) and row_id > expected_id:
            missing = f"row {expected_id}" if row_id == expected_id + 1 else f"rows {expected_id}-{row_id - 1}"
            raise _RowError(expected_id, f"{missing} missing (the rows jump from {expected_id - 1} to {row_id}): "
                                         "rows were dropped or renumbered")
        raise _RowError(expected_id, f"row {expected_id}: unexpected id {row_id!r}")
    if stored_prev != prev_hash:
        what = "the ledger metadata" if row_id == 1 else f"row {row_id - 1}"
        raise _RowError(row_id, f"row {row_id} does not follow {what} (prev_hash mismatch): "
                                "rows were dropped, reordered or inserted, or the metadata was edited")
    recomputed = _row_hash(stored_prev, row_id, event_text, count, outcome, teachers_text, spent_epsilon,
                           spent_delta, created, writer)
    if recomputed != stored_hash:
        raise _RowError(row_id, f"row {row_id} was edited (its hash does not match its content)")
    try:
        if not isinstance(event_text, str) or not isinstance(teachers_text, str):
            raise TypeError("event and charged_teachers must be JSON text")
        event = codec.decode(event_text)
        teachers = json.loads(teachers_text)
        if not isinstance(teachers, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in teachers):
            raise TypeError("charged_teachers must be a list of integers")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an integer, got {count!r}")
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES} or NULL, got {outcome!r}")
        if not (spent_epsilon is None and spent_delta is None) and not (
                isinstance(spent_epsilon, float) and isinstance(spent_delta, float)):
            raise TypeError("spent_epsilon and spent_delta must both be reals, or both NULL")
        charge = Charge(event, count, outcome, frozenset(teachers))
    except Exception as exc:  # tampered data may fail in any way: report the row, never crash the audit
        raise _RowError(row_id, f"row {row_id} cannot be decoded: {type(exc).__name__}: {exc}") from None
    return charge, (None if spent_epsilon is None else (spent_epsilon, spent_delta)), stored_hash


# -- the accountant registry ------------------------------------------------------------------------------


def _all_subclasses(cls):
    seen, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop(0)
        if sub not in seen:
            seen.append(sub)
            stack.extend(sub.__subclasses__())
    return seen


def _find_kind(kind: str):
    from pate_accountant.accountants.base import Accountant

    candidates = [c for c in _all_subclasses(Accountant) if c.__dict__.get("kind") == kind and not getattr(c, "__abstractmethods__", None)]
    candidates.sort(key=lambda c: (not c.__module__.startswith("pate_accountant."), c.__module__, c.__qualname__))
    return candidates[0] if candidates else None


def accountant_class(kind: str):
    """The accountant class whose ``kind`` is ``kind`` (looked up among every ``Accountant`` subclass,
    after importing ``pate_accountant.accountants`` and, if needed, each of its modules)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"accountant kind must be a non-empty string, got {kind!r}")
    import pate_accountant.accountants as package

    cls = _find_kind(kind)
    failures = []
    if cls is None:
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            try:
                importlib.import_module(module.name)
            except Exception as exc:  # a broken module must not hide the others; reported below
                failures.append(f"{module.name}: {type(exc).__name__}: {exc}")
        cls = _find_kind(kind)
    if cls is None:
        extra = f" (modules that failed to import: {'; '.join(failures)})" if failures else ""
        raise LedgerError(f"unknown accountant kind {kind!r}{extra}")
    return cls


def accountant_from_config(config: dict):
    """A fresh accountant (no ledger) equivalent to the one whose ``config()`` is ``config``."""
    if not isinstance(config, dict) or "kind" not in config:
        raise LedgerError(f"an accountant config must be a mapping with a 'kind', got {config!r}")
    cls = accountant_class(config["kind"])
    kwargs = {key: value for key, value in config.items() if key != "kind"}
    if kwargs.get("budget") is not None:
        kwargs["budget"] = tuple(kwargs["budget"])
    return cls(**kwargs)


# -- run metadata helpers --------------------------------------------------------------------------------


def describe_seed(seed) -> int | str:
    """What run metadata should say about a seed: the integer, or ``"OS entropy"`` for ``None``."""
    if seed is None:
        return "OS entropy"
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return seed


def describe_mechanism(mechanism) -> dict:
    """``{"class": ..., "parameters": {...}}`` for an attrs mechanism object (its public parameters only)."""
    cls = type(mechanism)
    if not attr.has(cls):
        raise TypeError(f"mechanism must be an attrs object, got {cls.__name__}")
    parameters = {}
    for field in attr.fields(cls):
        if field.name.startswith("_"):
            continue
        value = getattr(mechanism, field.name)
        if attr.has(type(value)):
            value = describe_mechanism(value)
        elif type(value).__module__ == "numpy" and hasattr(value, "item"):  # a numpy scalar
            value = value.item()
        parameters[field.name] = value
    _check_json_data("mechanism parameters", parameters)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "parameters": parameters}


# -- the ledger ---------------------------------------------------------------------------------------------


class _Position:
    __slots__ = ("ref", "last_id", "last_hash")

    def __init__(self, accountant, last_id: int, last_hash: str | None):
        try:
            self.ref = weakref.ref(accountant)
        except TypeError:  # no weak references (a class with __slots__): hold it
            self.ref = lambda: accountant
        self.last_id = last_id
        self.last_hash = last_hash


class _Transaction:
    """What ``Ledger.transaction(accountant)`` yields: ``append(charges)`` once, inside the block."""

    def __init__(self, ledger: Ledger, accountant, head_rows: int, head_hash: str | None):
        self._ledger = ledger
        self._accountant = accountant
        self._head_rows = head_rows
        self._head_hash = head_hash
        self._appended = None

    def append(self, charges, plans=None) -> None:
        """Write ``charges`` (already prepared by the accountant against the synced state) as rows.

        ``plans``, when given, are the accountant's prepared plans for ``charges``; otherwise the charges
        are prepared again (with the budget) to compute the spent totals stored with the rows.
        """
        from pate_accountant.accountants.base import Charge

        if self._appended is not None:
            raise RuntimeError("append may be called once per transaction")
        charges = list(charges)
        for charge in charges:
            if not isinstance(charge, Charge):
                raise TypeError(f"charges must be Charge objects, got {type(charge).__name__}")
        if plans is not None:
            plans = list(plans)
            if len(plans) != len(charges):
                raise ValueError("plans must match charges one to one")
        if not charges:
            self._appended = (self._head_rows, self._head_hash)
            return
        spent = self._ledger._simulate(self._accountant, charges, plans, every_row=self._ledger._totals == "row")
        ledger = self._ledger
        prev = self._head_hash if self._head_rows else ledger._genesis()
        row_id = self._head_rows
        created = float(time.time())
        rows = []
        for charge, totals in zip(charges, spent):
            spent_epsilon, spent_delta = (None, None) if totals is None else totals
            row_id += 1
            event_text = ledger._codec.encode(charge.event)
            teachers = charge.charged_teachers
            teachers_text = "[" + ",".join(map(str, sorted(map(int, teachers)))) + "]" if teachers else "[]"
            digest = _row_hash(prev, row_id, event_text, charge.count, charge.outcome, teachers_text,
                               spent_epsilon, spent_delta, created, ledger._writer)
            rows.append((row_id, prev, digest, event_text, charge.count, charge.outcome, teachers_text,
                         spent_epsilon, spent_delta, created, ledger._writer))
            prev = digest
        conn = ledger._conn
        conn.executemany(f"INSERT INTO charges ({_ROW_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", (row_id, prev))
        self._appended = (row_id, prev)


class Ledger:
    """An append-only, hash-chained SQLite ledger of privacy charges (see the module docstring).

    Create one with :meth:`open` or :meth:`in_memory`; pass it to an accountant as ``ledger=``.  One
    ``Ledger`` object wraps one SQLite connection: use it from one thread, and open a new one in each
    process (never share one across ``fork``).  Many processes may open the same file.
    """

    def __init__(self, connection: sqlite3.Connection, *, path: str | None, read_only: bool, totals: str = "transaction"):
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        self._totals = totals
        # Text the ledger wrote is valid UTF-8 and decodes exactly; damaged bytes decode to U+FFFD, so the
        # row's hash no longer matches and verify names the row instead of failing with a decode error.
        connection.text_factory = _decode_text
        self._conn = connection
        self._path = path
        self._read_only = read_only
        self._positions: dict[int, _Position] = {}
        self._codec = _Codec()
        self._writer = uuid.uuid4().hex[:16]
        self._in_transaction = False

    # -- constructors ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path, *, read_only: bool = False, synchronous: str = "FULL",
             timeout: float = DEFAULT_TIMEOUT, totals: str = "transaction") -> Ledger:
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
        """
        path = Path(os.fspath(path))
        synchronous = str(synchronous).upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        if read_only:
            if not path.is_file():
                raise FileNotFoundError(f"no ledger at {str(path)!r}")
            uri = path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
        else:
            if not path.parent.is_dir():
                raise FileNotFoundError(f"cannot create a ledger at {str(path)!r}: no folder {str(path.parent)!r}")
            conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
        ledger = cls(conn, path=str(path), read_only=read_only, totals=totals)
        try:
            if read_only:
                ledger._check_layout(create=False)
            else:
                ledger._set_wal()
                conn.execute(f"PRAGMA synchronous={synchronous}")
                ledger._check_layout(create=True)
        except BaseException:
            conn.close()
            raise
        return ledger

    @classmethod
    def in_memory(cls, *, totals: str = "transaction") -> Ledger:
        """A ledger in memory (for tests and dry runs: nothing persists, nothing is shared)."""
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        conn = sqlite3.connect(":memory:", isolation_level=None)
        ledger = cls(conn, path=None, read_only=False, totals=totals)
        ledger._check_layout(create=True)
        return ledger

    def _set_wal(self) -> None:
        deadline = time.monotonic() + 10.0
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.DatabaseError as exc:
                if "locked" in str(exc) and time.monotonic() < deadline:  # another process is creating it
                    time.sleep(0.01)
                    continue
                raise LedgerError(f"{self._path!r} is not a pate-accountant ledger: {exc}") from None
        if str(mode).lower() != "wal":
            raise LedgerError(f"cannot put {self._path!r} in WAL mode (journal mode is {mode!r})")

    def _check_layout(self, *, create: bool) -> None:
        conn = self._conn
        if create:  # an existing, complete ledger needs no write lock
            self._check_layout(create=False)
            if {"meta", "charges", "head"} <= self._tables() and self._meta().get("schema_version"):
                return
        try:
            conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
            try:
                tables = self._tables()
                if tables and "meta" not in tables:
                    raise LedgerError(f"{self._path!r} is an SQLite database but not a pate-accountant ledger")
                if create:
                    for statement in _split_sql(_SCHEMA):
                        conn.execute(statement)
                    defaults = {
                        "schema_version": canonical_json(SCHEMA_VERSION),
                        "ledger_id": canonical_json(uuid.uuid4().hex),
                        "created": canonical_json(time.time()),
                        "software_version": canonical_json(__version__),
                    }
                    conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", defaults.items())
                if tables or create:
                    meta = self._meta()
                    version = meta.get("schema_version")
                    if version is not None and json.loads(version) != SCHEMA_VERSION:
                        raise LedgerError(f"ledger schema version {version} is not supported (expected {SCHEMA_VERSION})")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a damaged schema can fail either way
            raise LedgerError(f"{self._path or ':memory:'!r} is not a usable pate-accountant ledger: {exc}") from None

    def _tables(self) -> set:
        return {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    # -- context manager ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._conn.close()

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
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    def _meta(self) -> dict:
        try:
            return dict(self._conn.execute("SELECT key, value FROM meta"))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}
            raise

    def _meta_value(self, key: str):
        text = self._meta().get(key)
        return None if text is None else json.loads(text)

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

    @property
    def run_metadata(self) -> dict | None:
        return self._meta_value("run_metadata")

    def set_run_metadata(self, metadata: dict) -> None:
        """Store run metadata: mechanism parameters, seeds (or ``"OS entropy"``, see :func:`describe_seed`),
        model name, ... as JSON data.  Allowed until the first row is written (it is covered by the
        genesis hash); afterwards only an equal value is accepted (a process joining the run).

        **Never put private data here** (prompts, records, teacher data): the ledger is meant to be shown
        to auditors.  The ledger cannot tell a prompt from a parameter; that is the caller's duty.
        """
        if not isinstance(metadata, dict):
            raise TypeError(f"run metadata must be a dict, got {type(metadata).__name__}")
        text = _json_data("run metadata", metadata)
        with self._write_transaction():
            stored = self._meta().get("run_metadata")
            if stored == text:
                return
            if self._head()[0] > 0:
                raise ValueError("run metadata can only be set before the first charge (it is covered by the "
                                 f"genesis hash); the ledger has {stored if stored is not None else 'none'}")
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('run_metadata', ?)", (text,))

    def _genesis(self) -> str:
        # Not cached: metadata may change (in another process) until the first row exists.
        return _genesis_hash(self._meta())

    def _head(self) -> tuple[int, str | None]:
        row = self._conn.execute("SELECT row_count, last_hash FROM head WHERE id = 1").fetchone()
        if row is None:
            raise LedgerIntegrityError("the ledger's head row is missing")
        return row[0], row[1]

    @property
    def row_count(self) -> int:
        """Number of rows, as the head records it."""
        return self._head()[0]

    @property
    def head_hash(self) -> str | None:
        """The last row's hash (``None`` when empty): write it down elsewhere to detect a later rollback."""
        return self._head()[1]

    def rows(self):
        """Decode every row, in order (no verification; use :meth:`verify` for that)."""
        codec = _Codec()

        for raw in self._conn.execute(f"SELECT {_ROW_COLUMNS} FROM charges ORDER BY id"):
            (row_id, _prev, digest, event_text, count, outcome, teachers_text, eps, delta, created, writer) = raw
            yield LedgerRow(row_id, codec.decode(event_text), count, outcome, frozenset(json.loads(teachers_text)),
                            None if eps is None else (eps, delta), created, writer, digest)

    # -- transactions -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write_transaction(self):
        if self._read_only:
            raise LedgerError(f"ledger {self._path!r} is open read-only")
        if self._in_transaction:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        try:
            self._conn.execute("BEGIN IMMEDIATE")  # the write lock, waiting up to `timeout` for other writers
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"cannot start a write transaction on {self._path!r}: {exc}") from None
        self._in_transaction = True
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            _rollback(self._conn)
            raise
        finally:
            self._in_transaction = False

    def attach(self, accountant) -> None:
        """Bind ``accountant`` to this ledger (called by ``Accountant.__init__``).

        The first accountant stores its ``config()``; a later one must have an equal configuration
        (``ValueError`` naming the difference otherwise) and replays every stored row (under a read
        snapshot, so other writers are not blocked while it catches up).
        """
        existing = self._positions.get(id(accountant))
        if existing is not None and existing.ref() is accountant:
            raise ValueError("this accountant is already attached to this ledger")
        config_text = _json_data("accountant config", accountant.config())
        position = _Position(accountant, 0, None)
        with self._read_transaction():
            stored = self._meta().get("config")
            if stored is not None or self._read_only:
                self._attach_to(accountant, position, stored, config_text)
        if stored is None and not self._read_only:
            with self._write_transaction():  # first attach: store the config (unless a racing process did)
                stored = self._meta().get("config")
                if stored is None and not self._head()[0]:
                    self._conn.execute("INSERT INTO meta (key, value) VALUES ('config', ?)", (config_text,))
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
            self._check_last_totals(accountant, head_rows)

    def sync(self, accountant) -> None:
        """Replay into ``accountant`` the rows other writers committed since it last looked (a read
        snapshot; no write lock).  Charges do this themselves; call it before ``can_afford`` or before
        running a mechanism to see the budget other processes spent."""
        position = self._position(accountant)
        with self._read_transaction():
            head_rows, head_hash = self._head()
            self._catch_up(accountant, position, head_rows, head_hash)

    @contextlib.contextmanager
    def _read_transaction(self):
        if self._in_transaction:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        self._conn.execute("BEGIN")
        self._in_transaction = True
        try:
            yield
        finally:
            self._in_transaction = False
            _rollback(self._conn)

    def _check_last_totals(self, accountant, row_id: int) -> None:
        stored = self._conn.execute("SELECT spent_epsilon, spent_delta FROM charges WHERE id = ?", (row_id,)).fetchone()
        if stored is None or stored[0] is None:
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

    def _catch_up(self, accountant, position: _Position, head_rows: int, head_hash: str | None) -> None:
        """Replay the rows after ``position`` into ``accountant`` (checking their chain), up to the head."""
        if head_rows < position.last_id:
            raise LedgerIntegrityError(
                f"the ledger has {head_rows} rows but this accountant has seen {position.last_id}: rows were removed",
                row=head_rows + 1)
        if head_rows > position.last_id:
            prev = position.last_hash if position.last_id else self._genesis()
            expected = position.last_id + 1
            cursor = self._conn.execute(f"SELECT {_ROW_COLUMNS} FROM charges WHERE id > ? ORDER BY id",
                                        (position.last_id,))
            for raw in cursor:
                try:
                    charge, _spent, prev = _check_row(self._codec, raw, expected, prev)
                except _RowError as exc:
                    raise LedgerIntegrityError(exc.message, row=exc.row) from None
                accountant._replay(charge)
                position.last_id, position.last_hash = expected, prev
                expected += 1
        if position.last_id != head_rows or position.last_hash != head_hash:
            raise LedgerIntegrityError(
                f"the ledger's head (row {head_rows}) does not match its rows (last row {position.last_id}): "
                "rows were dropped or edited", row=position.last_id + 1 if position.last_id < head_rows else head_rows)

    @contextlib.contextmanager
    def transaction(self, accountant):
        """One write transaction for ``accountant`` (used by ``Accountant._charge_many``).

        Takes SQLite's write lock (``BEGIN IMMEDIATE``), replays the rows other writers committed since
        ``accountant`` last looked, then yields an object whose ``append(charges)`` writes the rows;
        commits on normal exit and rolls back on an exception (the accountant then commits nothing).
        """
        position = self._position(accountant)
        with self._write_transaction():
            head_rows, head_hash = self._head()
            self._catch_up(accountant, position, head_rows, head_hash)
            tx = _Transaction(self, accountant, head_rows, head_hash)
            yield tx
        if tx._appended is not None:  # committed: the accountant commits its plans right after
            position.last_id, position.last_hash = tx._appended

    @staticmethod
    def _simulate(accountant, charges, plans, *, every_row: bool):
        """The accountant's spent totals after each charge (after the last one only, ``None`` for the
        others, unless ``every_row``), computed on a snapshot: the accountant's state is left unchanged."""
        snapshot = accountant._snapshot()
        spent = []
        try:
            for i, charge in enumerate(charges):
                plan = accountant._prepare(charge) if plans is None else plans[i]
                accountant._commit(plan)
                if not every_row and i < len(charges) - 1:
                    spent.append(None)
                    continue
                epsilon, delta = accountant.spent()
                epsilon, delta = float(epsilon), float(delta)
                if math.isnan(epsilon) or math.isnan(delta):
                    raise ValueError(f"accountant reports a NaN spent total after {charge!r}")
                spent.append((epsilon, delta))
        finally:
            accountant._restore(snapshot)
        return spent

    # -- verification ------------------------------------------------------------------------------------
    def verify(self) -> VerificationResult:
        """Check the hash chain and the head, replay every row through a fresh accountant rebuilt from the
        stored configuration, compare the totals after each row and check the budget was never exceeded."""
        try:
            with self._read_transaction():
                return self._verify()
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # damaged pages or schema
            return VerificationResult(False, 0, None, None, f"the file is not a readable ledger: {exc}")

    def _verify(self) -> VerificationResult:
        conn = self._conn
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return VerificationResult(True, 0, (0.0, 0.0), None, "empty ledger (never initialised)")
        missing = {"meta", "charges", "head"} - tables
        if missing:
            return VerificationResult(False, 0, None, None, f"not a pate-accountant ledger: tables {sorted(missing)} missing")
        meta = self._meta()
        info: dict[str, Any] = {}
        try:
            for key in ("ledger_id", "software_version", "config", "run_metadata"):
                info[key] = None if meta.get(key) is None else json.loads(meta[key])
            version = json.loads(meta["schema_version"])
        except (KeyError, ValueError) as exc:
            return VerificationResult(False, 0, None, None, f"the ledger metadata is damaged: {exc}")
        if version != SCHEMA_VERSION:
            return VerificationResult(False, 0, None, None, f"unsupported ledger schema version {version!r}")
        config = info["config"]
        extra = {"config": config, "run_metadata": info["run_metadata"], "software_version": info["software_version"],
                 "ledger_id": info["ledger_id"]}
        head = conn.execute("SELECT row_count, last_hash FROM head WHERE id = 1").fetchone()
        if head is None:
            return VerificationResult(False, 0, None, None, "the ledger's head row is missing", **extra)
        head_rows, head_hash = head
        extra["head_hash"] = head_hash

        accountant = None
        if config is not None:
            extra["kind"] = config.get("kind") if isinstance(config, dict) else None
            try:
                accountant = accountant_from_config(config)
                rebuilt = json.loads(canonical_json(accountant.config()))
            except Exception as exc:  # an unknown kind or a config the class refuses
                return VerificationResult(False, 0, None, 1 if head_rows else None,
                                          f"cannot rebuild the accountant from the stored config: {exc}", **extra)
            if rebuilt != config:
                return VerificationResult(False, 0, None, None,
                                          f"the stored config does not round-trip: {_config_difference(config, rebuilt)}",
                                          **extra)
            extra["budget"] = accountant.budget

        def fail(row, message, rows, spent=None):
            return VerificationResult(False, rows, spent, row, message, **extra)

        genesis = _genesis_hash(meta)
        prev, expected = genesis, 1
        spent = (0.0, 0.0) if accountant is None else tuple(float(x) for x in accountant.spent())
        for raw in conn.execute(f"SELECT {_ROW_COLUMNS} FROM charges ORDER BY id"):
            if accountant is None:
                return fail(expected, "the ledger has rows but no accountant config", expected - 1)
            try:
                charge, stored, prev = _check_row(self._codec, raw, expected, prev)
            except _RowError as exc:
                return fail(exc.row, exc.message, expected - 1, spent)
            try:
                plan = accountant._prepare(charge)
            except BudgetExhaustedError as exc:
                return fail(expected, f"row {expected} exceeds the budget: {exc}", expected - 1, spent)
            except Exception as exc:  # an event this accountant cannot account for, ...
                return fail(expected, f"row {expected} cannot be replayed: {type(exc).__name__}: {exc}", expected - 1, spent)
            accountant._commit(plan)
            spent = None
            if stored is None:
                expected += 1
                continue
            spent = tuple(float(x) for x in accountant.spent())
            if not (_totals_close(spent[0], stored[0]) and _totals_close(spent[1], stored[1])):
                return fail(expected, f"totals disagree at row {expected}: the ledger stores spent "
                                      f"(epsilon={stored[0]!r}, delta={stored[1]!r}) but replaying gives "
                                      f"(epsilon={spent[0]!r}, delta={spent[1]!r})", expected, spent)
            expected += 1
        rows = expected - 1
        final = spent if spent is not None else tuple(float(x) for x in accountant.spent())
        if head_rows != rows:
            if isinstance(head_rows, int) and head_rows > rows:
                missing = f"row {rows + 1}" if head_rows == rows + 1 else f"rows {rows + 1}-{head_rows}"
                return fail(rows + 1, f"{missing} missing: the head records {head_rows} rows but the table ends at "
                                      f"row {rows} (the last rows were dropped)", rows, final)
            return fail(rows, f"the head records {head_rows!r} rows but the table has {rows}: the head was edited",
                        rows, final)
        if head_hash != (prev if rows else None):
            return fail(rows or None, f"the head hash does not match row {rows}'s hash: the head or the last row was edited",
                        rows, final)
        if spent is None:  # every transaction stores totals on its last row, so the last row has them
            return fail(rows, f"row {rows}, the last row, stores no spent totals (the last row of every transaction "
                              "does): the rows of a transaction were dropped", rows, final)
        return VerificationResult(True, rows, spent, None,
                                  f"verified: {rows} rows, hash chain and head intact, totals agree, within budget",
                                  **extra)


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
