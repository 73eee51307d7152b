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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import math
import os
import sqlite3
import stat
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import attr

from pate_accountant import __version__, registry
from pate_accountant.errors import BudgetExhaustedError, PateAccountantError
from pate_accountant.release import OUTCOMES, TARGET
from pate_accountant.serialization import canonical_json, describe_difference, event_from_data, event_to_data

__all__ = [
    "CONFIDENTIAL_SUFFIX",
    "Ledger",
    "InterruptedWriteError",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerRow",
    "PRIVATE_FILE_MODE",
    "VerificationResult",
    "accountant_class",
    "accountant_from_config",
    "confidential_path",
    "describe_mechanism",
    "describe_seed",
]

#: Version of the shareable table layout below; a ledger with another version is refused.
SCHEMA_VERSION = 2
#: Version of the confidential file's layout.
CONFIDENTIAL_SCHEMA_VERSION = 1
#: The confidential file of the ledger at ``PATH`` is ``PATH + CONFIDENTIAL_SUFFIX`` unless given.
CONFIDENTIAL_SUFFIX = ".confidential.sqlite"
#: Metadata keys that the first row's ``prev_hash`` (the genesis hash) covers.
GENESIS_KEYS = ("schema_version", "ledger_id", "created", "software_version", "config", "run_metadata", "dataset")
#: Metadata keys of the confidential file that its first row's ``prev_hash`` covers.
CONFIDENTIAL_GENESIS_KEYS = ("schema_version", "ledger_id", "created")
#: Outcome classes that charge teachers (``None``: a plain ``compose``, charged as a hit).
HIT_OUTCOMES = (None, TARGET)
#: Relative tolerance when comparing replayed totals with the stored ones (they are normally identical).
TOTALS_RTOL = 1e-9
TOTALS_ATOL = 1e-12
#: Seconds a writer waits for another process's write transaction before giving up.
DEFAULT_TIMEOUT = 60.0
SYNCHRONOUS_MODES = ("FULL", "EXTRA", "NORMAL")
#: When a writer stores the spent totals: after the last row of each transaction (the other rows of a
#: batch store NULL; the default: one ``spent()`` per batch), or after every row.
TOTALS_MODES = ("transaction", "row")
#: Longest data set name accepted.
MAX_DATASET_NAME = 200
#: Run-metadata keys that may never hold a number: a seed lets anyone re-run both neighbouring data sets.
SEED_KEYS = ("seed", "seeds", "random_seed", "rng_seed")

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
    """One decoded ledger row (what :meth:`Ledger.rows` yields).  ``charged_teachers`` comes from the
    confidential file (empty when the ledger keeps none or the file is not open); ``commitment`` is the
    shareable commitment to it (``None`` on rows that charge no teacher set); ``run`` the run id."""

    id: int
    event: Any
    count: int
    outcome: str | None
    charged_teachers: frozenset
    spent: tuple | None
    created: float
    writer: str
    hash: str
    commitment: str | None = None
    run: int | None = None
    group: int | None = None

    def charge(self):
        from pate_accountant.accountants.base import Charge

        return Charge(self.event, self.count, self.outcome, self.charged_teachers,
                      None if self.group is None else (self.run, self.group))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class VerificationResult:
    """What :meth:`Ledger.verify` found.  ``ok`` is true when the chains, the heads and the replayed totals
    all agree and the budget was never exceeded; otherwise ``first_bad_row`` names the first offending
    row (``None`` when no single row is to blame, e.g. a damaged metadata table) and ``message`` says
    what is wrong.

    ``confidential`` says what was checked of the confidential part: ``"verified"`` (present and checked:
    teacher sets, links, per-teacher limits and totals), ``"absent"`` (the accountant keeps one but it was
    not found: only the shareable part was checked, and ``spent`` is ``None`` because it is a function of
    the confidential data) or ``"none"`` (the accountant keeps no confidential data).  ``runs`` lists each
    run's metadata; ``queries`` and ``hits`` count the charged queries and their hits (outcome classes
    are DP outputs)."""

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
    dataset: str | None = None
    runs: tuple = ()
    confidential: str = "none"
    confidential_path: str | None = None
    queries: int | None = None
    hits: int | None = None

    def as_dict(self) -> dict:
        data = attr.asdict(self, recurse=False)
        data["spent"] = None if self.spent is None else {"epsilon": self.spent[0], "delta": self.spent[1]}
        data["budget"] = None if self.budget is None else {"epsilon": self.budget[0], "delta": self.budget[1]}
        data["runs"] = [dict(run) for run in self.runs]
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


def _row_hash(prev_hash, row_id, event_text, count, outcome, commitment, spent_epsilon, spent_delta,
              created, writer, run, group=None) -> str:
    """``sha256(prev_hash | id | event | count | outcome | commitment | spent | created | writer | run)``, with
    ``| group`` appended for a row of one of a run's groups (so rows without a group hash as they always did)."""
    fields = (prev_hash, row_id, event_text, count, outcome, commitment, spent_epsilon, spent_delta, created, writer,
              run) + (() if group is None else (group,))
    content = "|".join(map(_field, fields))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _run_hash(prev_hash, run_id, first_row, metadata_text, created, writer) -> str:
    """``sha256("run" | prev_hash | id | first_row | metadata | created | writer)``."""
    content = "|".join(map(_field, ("run", prev_hash, run_id, first_row, metadata_text, created, writer)))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _confidential_row_hash(prev_hash, row_id, share_row, share_hash, salt, teachers_text) -> str:
    """``sha256("confidential" | prev_hash | id | share_row | share_hash | salt | charged_teachers)``."""
    content = "|".join(map(_field, ("confidential", prev_hash, row_id, share_row, share_hash, salt, teachers_text)))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _commitment(salt: str, share_row: int, teachers_text: str) -> str:
    """``HMAC-SHA256(key = salt, message = "pate-accountant teachers|<row id>|<sorted JSON list>")``: hiding
    (the 256-bit salt is random and lives only in the confidential file) and binding (to the row and set)."""
    message = f"pate-accountant teachers|{share_row}|{teachers_text}".encode()
    return hmac.new(bytes.fromhex(salt), message, hashlib.sha256).hexdigest()


def _teachers_text(teachers) -> str:
    return "[" + ",".join(map(str, sorted(map(int, teachers)))) + "]" if teachers else "[]"


def _genesis_hash(meta: dict) -> str:
    """The first row's ``prev_hash``: a hash of the stored metadata texts (configuration included)."""
    return _sha256("pate-accountant ledger genesis\n" + canonical_json({key: meta.get(key) for key in GENESIS_KEYS}))


def _runs_genesis_hash(meta: dict) -> str:
    """The first run's ``prev_hash``: anchored at the ledger id, which never changes (the other metadata may
    change until the first charge, and a run may begin before it)."""
    return _sha256("pate-accountant runs genesis\n" + _field(meta.get("ledger_id")))


def _confidential_genesis_hash(meta: dict) -> str:
    return _sha256("pate-accountant confidential genesis\n"
                   + canonical_json({key: meta.get(key) for key in CONFIDENTIAL_GENESIS_KEYS}))


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


def _check_no_seed(name: str, value) -> None:
    """Refuse a number under a seed-like key anywhere in ``value`` (the message never shows the number)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.lower() in SEED_KEYS:
                numbers = [item] if not isinstance(item, (list, tuple)) else list(item)
                if any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
                    raise ValueError(
                        f"{name}[{key!r}] holds a seed: a shareable ledger never stores seeds (anyone who knows "
                        "the seed can re-run both neighbouring data sets); record whether the run was seeded "
                        "(\"seeded\": true/false) instead")
            _check_no_seed(f"{name}[{key!r}]", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_no_seed(f"{name}[{i}]", item)


def _config_difference(stored: dict, given: dict) -> str:
    return describe_difference(stored, given, me="the ledger", them="this accountant")


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


@attr.s(frozen=True, slots=True, auto_attribs=True)
class _CheckedRow:
    charge: Any
    spent: tuple | None
    hash: str
    commitment: str | None
    run: int | None


def _check_row(codec: _Codec, row, expected_id: int, prev_hash: str) -> _CheckedRow:
    """Check one raw shareable row against the chain and decode it; raise ``_RowError`` naming the row."""
    from pate_accountant.accountants.base import Charge

    (row_id, stored_prev, stored_hash, event_text, count, outcome, commitment, spent_epsilon,
     spent_delta, created, writer, run, group) = row
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
    recomputed = _row_hash(stored_prev, row_id, event_text, count, outcome, commitment, spent_epsilon,
                           spent_delta, created, writer, run, group)
    if recomputed != stored_hash:
        raise _RowError(row_id, f"row {row_id} was edited (its hash does not match its content)")
    try:
        if not isinstance(event_text, str):
            raise TypeError("event must be JSON text")
        event = codec.decode(event_text)
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an integer, got {count!r}")
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES} or NULL, got {outcome!r}")
        if commitment is not None and not (isinstance(commitment, str) and len(commitment) == 64):
            raise TypeError("commitment must be a hex digest or NULL")
        if run is not None and (isinstance(run, bool) or not isinstance(run, int) or run < 1):
            raise TypeError(f"run must be a positive integer or NULL, got {run!r}")
        if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 0 or run is None):
            raise TypeError(f"group must be NULL or a non-negative integer on a row of a run, got {group!r}")
        if not (spent_epsilon is None and spent_delta is None) and not (
                isinstance(spent_epsilon, float) and isinstance(spent_delta, float)):
            raise TypeError("spent_epsilon and spent_delta must both be reals, or both NULL")
        charge = Charge(event, count, outcome, group=None if group is None else (run, group))
    except Exception as exc:  # tampered data may fail in any way: report the row, never crash the audit
        raise _RowError(row_id, f"row {row_id} cannot be decoded: {type(exc).__name__}: {exc}") from None
    spent = None if spent_epsilon is None else (spent_epsilon, spent_delta)
    return _CheckedRow(charge, spent, stored_hash, commitment, run)


def _check_confidential_row(raw, expected_id: int, prev_hash: str, share_row: int, share_hash: str,
                            commitment: str) -> tuple[frozenset, str]:
    """Check the confidential row that belongs to shareable hit row ``share_row``: its own chain, its link
    (the shareable row's hash) and the shareable row's commitment.  Returns ``(teachers, hash)``."""
    if raw is None:
        raise _RowError(share_row, f"row {share_row} is a hit but the confidential file has no row for it "
                                   "(confidential rows were dropped)")
    row_id, stored_prev, stored_hash, linked_row, linked_hash, salt, teachers_text = raw
    where = f"confidential row {row_id!r} (for row {share_row})"
    if row_id != expected_id:
        raise _RowError(share_row, f"{where}: expected confidential row {expected_id}: confidential rows were "
                                   "dropped or renumbered")
    if stored_prev != prev_hash:
        raise _RowError(share_row, f"{where} does not follow the previous confidential row (prev_hash mismatch): "
                                   "confidential rows were dropped, reordered or inserted")
    if _confidential_row_hash(stored_prev, row_id, linked_row, linked_hash, salt, teachers_text) != stored_hash:
        raise _RowError(share_row, f"{where} was edited (its hash does not match its content)")
    if linked_row != share_row or linked_hash != share_hash:
        raise _RowError(share_row, f"{where} names shareable row {linked_row!r}, not row {share_row} with its hash: "
                                   "the confidential file does not belong to these rows")
    try:
        if not isinstance(salt, str) or len(salt) != 64:
            raise TypeError("salt must be 64 hex digits")
        if not isinstance(teachers_text, str):
            raise TypeError("charged_teachers must be JSON text")
        teachers = json.loads(teachers_text)
        if not isinstance(teachers, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                                 for t in teachers):
            raise TypeError("charged_teachers must be a list of non-negative integers")
        expected = _commitment(salt, share_row, teachers_text)
    except Exception as exc:
        raise _RowError(share_row, f"{where} cannot be decoded: {type(exc).__name__}: {exc}") from None
    if not hmac.compare_digest(expected, commitment):
        raise _RowError(share_row, f"{where} does not open row {share_row}'s commitment: its teacher set or salt "
                                   "was changed")
    return frozenset(teachers), stored_hash


# -- the accountant registry ------------------------------------------------------------------------------


def accountant_class(kind: str):
    """The accountant class registered under ``kind`` (:mod:`pate_accountant.registry`); a
    ``LedgerError`` for a kind nobody registered."""
    try:
        return registry.accountant_class(kind)
    except KeyError as exc:
        raise LedgerError(exc.args[0]) from None


def accountant_from_config(config: dict):
    """A fresh accountant (no ledger) equivalent to the one whose ``config()`` is ``config``."""
    if not isinstance(config, dict) or "kind" not in config:
        raise LedgerError(f"an accountant config must be a mapping with a 'kind', got {config!r}")
    cls = accountant_class(config["kind"])
    kwargs = {key: value for key, value in config.items() if key != "kind"}
    if kwargs.get("budget") is not None:
        kwargs["budget"] = tuple(kwargs["budget"])
    return cls(**kwargs)


def _keeps_confidential(accountant_or_class) -> bool:
    """Whether an accountant's state depends on charged teacher sets (``confidential_charges``)."""
    return bool(getattr(accountant_or_class, "confidential_charges", False))


def confidential_path(path) -> str:
    """The default confidential file of the ledger at ``path``: ``path + CONFIDENTIAL_SUFFIX``."""
    return os.fspath(path) + CONFIDENTIAL_SUFFIX


# -- run metadata helpers --------------------------------------------------------------------------------


def describe_seed(seed) -> str:
    """What run metadata may say about a seed: ``"seeded"`` or ``"OS entropy"`` (for ``None``), never the
    seed itself (a seed lets anyone who knows it re-run both neighbouring data sets and tell them apart)."""
    if seed is None:
        return "OS entropy"
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got a value of type {type(seed).__name__}")
    return "seeded"


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


def _check_dataset(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"dataset must be a string, got a value of type {type(name).__name__}")
    if not name.strip() or len(name) > MAX_DATASET_NAME or not name.isprintable():
        raise ValueError(f"dataset must be a printable name of 1 to {MAX_DATASET_NAME} characters, got {name!r}")
    return name


# -- the ledger ---------------------------------------------------------------------------------------------


class _Position:
    """What one attached accountant has seen: ``mark = (last row id, its hash, last confidential row id, its
    hash)``, replaced as a whole (one attribute store), so that it never names a half-updated position."""

    __slots__ = ("ref", "mark", "confidential")

    def __init__(self, accountant, confidential: bool = False):
        try:
            self.ref = weakref.ref(accountant)
        except TypeError:  # no weak references (a class with __slots__): hold it
            self.ref = lambda: accountant
        self.mark = (0, None, 0, None)
        self.confidential = confidential

    @property
    def last_id(self) -> int:
        return self.mark[0]

    @property
    def last_hash(self) -> str | None:
        return self.mark[1]

    @property
    def conf_id(self) -> int:
        return self.mark[2]

    @property
    def conf_hash(self) -> str | None:
        return self.mark[3]


class _Transaction:
    """What ``Ledger.transaction(accountant)`` yields: the accountant appends each charge it has checked and
    applied with ``append(charge)``; the ledger writes the rows, with the accountant's ``spent()``, when
    the block ends, then commits.  ``committed`` says whether the rows are in the ledger *and* the
    accountant's position has moved past them (so the accountant keeps the charges)."""

    def __init__(self, ledger: Ledger, accountant, position: _Position, head_rows: int, head_hash: str | None,
                 conf_head: tuple | None = None):
        self._ledger = ledger
        self._accountant = accountant
        self._position = position
        self._head_rows = head_rows
        self._head_hash = head_hash
        self._conf_head = conf_head  # (row_count, last_hash) of the confidential file, or None
        self._charges: list = []
        self._totals: list = []
        self._new_mark = None  # the position after the rows, once written
        self._closed = False

    @property
    def committed(self) -> bool:
        return self._new_mark is not None and self._position.mark is self._new_mark

    def append(self, charge) -> None:
        """Add the row of ``charge``, which the accountant has just checked and applied (its ``spent()`` now
        includes it).  With ``totals="row"`` the ledger reads ``spent()`` for this row now; otherwise once,
        for the transaction's last row, when the block ends."""
        from pate_accountant.accountants.base import Charge

        if self._closed:
            raise RuntimeError("the transaction is over: append inside its block")
        if not isinstance(charge, Charge):
            raise TypeError(f"append takes one Charge, got {type(charge).__name__}")
        if charge.group is not None and charge.group[0] != self._ledger._run:
            raise ValueError(f"a charge of group {charge.group[1]} of run {charge.group[0]} cannot be written by this "
                             f"ledger object, whose run is {self._ledger._run}")
        self._charges.append(charge)
        self._totals.append(self._spent(charge) if self._ledger._totals == "row" else None)

    def _spent(self, charge) -> tuple[float, float]:
        epsilon, delta = self._accountant.spent()
        epsilon, delta = float(epsilon), float(delta)
        if math.isnan(epsilon) or math.isnan(delta):
            raise ValueError(f"accountant reports a NaN spent total after {charge!r}")
        return epsilon, delta

    def _write(self) -> None:
        """Write the appended rows (inside the write transaction, before its commit); compute the new mark.

        With a confidential file, each hit charge's teacher set goes there (with its salt), the shareable row
        gets the commitment, and the totals go to the confidential file only; other teacher sets are dropped.
        """
        self._closed = True
        charges, spent = self._charges, self._totals
        confidential = self._conf_head is not None
        conf_id, conf_prev = self._conf_head if confidential else (0, None)
        if not charges:
            self._new_mark = (self._head_rows, self._head_hash, conf_id, conf_prev)
            return
        if spent[-1] is None:
            spent[-1] = self._spent(charges[-1])
        ledger = self._ledger
        prev = self._head_hash if self._head_rows else ledger._genesis()
        conf_genesis = ledger._confidential_genesis() if confidential and not conf_id else None
        row_id = self._head_rows
        created = ledger._row_time()  # the run's start, never the charge's own (data-dependent) time
        run = ledger._run
        rows, conf_rows, totals_rows = [], [], []
        for charge, totals in zip(charges, spent):
            row_id += 1
            group = None if charge.group is None else charge.group[1]
            event_text = ledger._codec.encode(charge.event)
            commitment = salt = teachers_text = None
            if confidential and charge.outcome in HIT_OUTCOMES:
                teachers_text = _teachers_text(charge.charged_teachers)
                salt = os.urandom(32).hex()
                commitment = _commitment(salt, row_id, teachers_text)
            stored = (None, None) if (totals is None or confidential) else totals
            digest = _row_hash(prev, row_id, event_text, charge.count, charge.outcome, commitment, stored[0],
                               stored[1], created, ledger._writer, run, group)
            rows.append((row_id, prev, digest, event_text, charge.count, charge.outcome, commitment, stored[0],
                         stored[1], created, ledger._writer, run, group))
            if commitment is not None:
                conf_id += 1
                link_prev = conf_prev if conf_prev is not None else conf_genesis
                conf_digest = _confidential_row_hash(link_prev, conf_id, row_id, digest, salt, teachers_text)
                conf_rows.append((conf_id, link_prev, conf_digest, row_id, digest, salt, teachers_text))
                conf_prev = conf_digest
            if confidential and totals is not None:
                totals_rows.append((row_id, digest, totals[0], totals[1]))
            prev = digest
        if confidential:  # committed first (see Ledger._write_transaction)
            conf = ledger._conf
            conf.executemany(f"INSERT INTO charges ({_CONF_COLUMNS}) VALUES (?,?,?,?,?,?,?)", conf_rows)
            conf.executemany("INSERT INTO totals (share_row, share_hash, spent_epsilon, spent_delta) VALUES (?,?,?,?)",
                             totals_rows)
            conf.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", (conf_id, conf_prev))
        conn = ledger._conn
        conn.executemany(f"INSERT INTO charges ({_ROW_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", (row_id, prev))
        self._new_mark = (row_id, prev, conf_id, conf_prev)


class _ReadSnapshot:
    """The open read transaction of ``Ledger._read_transaction``: the shareable snapshot, and the
    confidential one once ``add_confidential()`` started it (always after the shareable one)."""

    def __init__(self, ledger: Ledger):
        self._ledger = ledger
        self.conf = None

    def add_confidential(self) -> None:
        ledger = self._ledger
        if self.conf is not None or ledger._conf is None:
            return
        ledger._conn.execute("SELECT row_count FROM head WHERE id = 1").fetchone()  # starts the shareable snapshot
        ledger._conf.execute("BEGIN")
        self.conf = ledger._conf
        self.conf.execute("SELECT row_count FROM head WHERE id = 1").fetchone()


class Ledger:
    """An append-only, hash-chained SQLite ledger of privacy charges (see the module docstring).

    Create one with :meth:`open` or :meth:`in_memory`; pass it to an accountant as ``ledger=``.  One
    ``Ledger`` object wraps one SQLite connection per file: use it from one thread, and open a new one in
    each process (never share one across ``fork``).  Many processes may open the same files.
    """

    def __init__(self, connection: sqlite3.Connection, *, path: str | None, read_only: bool,
                 totals: str = "transaction", confidential: str | None = None, synchronous: str = "FULL",
                 timeout: float = DEFAULT_TIMEOUT):
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        self._totals = totals
        # Text the ledger wrote is valid UTF-8 and decodes exactly; damaged bytes decode to U+FFFD, so the
        # row's hash no longer matches and verify names the row instead of failing with a decode error.
        connection.text_factory = _decode_text
        self._conn = connection
        self._columns = None  # the row columns to select (_row_columns)
        self._path = path
        self._read_only = read_only
        self._conf: sqlite3.Connection | None = None
        if confidential is None and path is not None:
            confidential = confidential_path(path)
        self._conf_path = confidential
        self._synchronous = synchronous
        self._timeout = timeout
        self._positions: dict[int, _Position] = {}
        self._codec = _Codec()
        self._writer = uuid.uuid4().hex[:16]
        self._in_transaction = False
        self._run: int | None = None
        self._run_created: float | None = None  # the start time of ``_run``: the time on every row it writes
        self._created_here = False
        self._new_file = False  # this object made the file (or the in-memory database): it may have no tables yet
        self._conf_created_here = False

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
        """
        path = Path(os.fspath(path))
        synchronous = str(synchronous).upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        if confidential is not None:
            confidential = os.fspath(confidential)
            if Path(confidential).resolve() == path.resolve():
                raise ValueError(f"confidential must be another file than the ledger, got {confidential!r}")
        if path.is_dir():
            raise LedgerError(f"ledger path {str(path)!r} is a folder, not a ledger file")
        if not read_only and not path.parent.is_dir():
            raise FileNotFoundError(f"cannot create a ledger at {str(path)!r}: no folder {str(path.parent)!r}")
        # An empty ledger that its creator discards (:meth:`discard_if_unused`) may vanish, or be seen marked, while
        # this opens it: open what is at the path then, until the deadline.
        deadline = time.monotonic() + DISCARDED_WAIT_S
        while True:
            try:
                return cls._open_once(path, read_only=read_only, synchronous=synchronous, timeout=timeout,
                                      totals=totals, confidential=confidential)
            except _Discarded:
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

    @classmethod
    def _open_once(cls, path: Path, *, read_only: bool, synchronous: str, timeout: float, totals: str,
                   confidential) -> Ledger:
        created = False
        if read_only:
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
                created = cls._create_atomically(path, timeout)
                if not created and not path.exists():  # no hard links here: this call makes it in place
                    created = _create_private(path)
            if not created:
                _check_ours(path, timeout, empty_ok=False)
            try:
                conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open a ledger at {str(path)!r}: {exc}") from None
        ledger = cls(conn, path=str(path), read_only=read_only, totals=totals, confidential=confidential,
                     synchronous=synchronous, timeout=timeout)
        ledger._created_here = ledger._new_file = created
        try:
            if read_only:
                ledger._check_layout(create=False)
            else:
                # Read the file once before WAL mode: a discarded one (marked by its creator, who removed it after this
                # connection opened it) must never get a log beside the path.  In WAL mode the read also takes the
                # shared lock every WAL connection keeps, so from here on nobody can discard the file under this one.
                ledger._check_layout(create=False)
                _set_wal(conn, ledger._path)
                conn.execute(f"PRAGMA synchronous={synchronous}")
                ledger._check_layout(create=True)
                ledger._add_group_column()
        except sqlite3.OperationalError as exc:  # a read-only file or folder, a full disk, ...
            conn.close()
            raise LedgerError(f"cannot write the ledger at {str(path)!r}: {exc} (open it with read_only=True "
                              "to read it)") from None
        except BaseException:
            conn.close()
            raise
        return ledger

    @classmethod
    def _create_atomically(cls, path: Path, timeout: float) -> bool:
        """Build a new, empty ledger beside ``path`` under a temporary name and link it into place, so that
        ``path`` appears complete or not at all: a kill during the creation leaves no ledger (only a hidden
        ``.creating`` file, which nothing reads), never a half-made one.  When another process links its own
        first, that one is kept.  On a file system without hard links the ledger is made in place, as before;
        any other failure (a full disk, a read-only folder) is a :class:`LedgerError` and leaves nothing at
        ``path`` (issue 22, item 15).  ``True`` when this call put the ledger at ``path``."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.creating")
        try:
            _create_private(temporary)
            conn = sqlite3.connect(str(temporary), timeout=timeout, isolation_level=None)
            try:
                ledger = cls(conn, path=str(temporary), read_only=False, timeout=timeout)
                ledger._new_file = True
                _set_wal(conn, str(temporary))
                ledger._check_layout(create=True)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
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

    @classmethod
    def in_memory(cls, *, totals: str = "transaction") -> Ledger:
        """A ledger in memory (for tests and dry runs: nothing persists, nothing is shared); its confidential
        part, when an accountant needs one, is a second in-memory database."""
        if totals not in TOTALS_MODES:
            raise ValueError(f"totals must be one of {TOTALS_MODES}, got {totals!r}")
        conn = sqlite3.connect(":memory:", isolation_level=None)
        ledger = cls(conn, path=None, read_only=False, totals=totals)
        ledger._new_file = True
        ledger._check_layout(create=True)
        return ledger

    def _check_layout(self, *, create: bool) -> None:
        """Check (and with ``create``, complete) the layout.  A database with no tables is expected only in a file
        this object made (``_new_file``); any other is not a ledger and is refused."""
        conn = self._conn
        if create:  # an existing, complete ledger needs no write lock
            self._check_layout(create=False)
            if {"meta", "charges", "head", "runs"} <= self._tables() and self._meta().get("schema_version"):
                return
        try:
            conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
            try:
                tables = self._tables()
                if not tables and not self._new_file:
                    raise LedgerError(f"{self._path!r} is an SQLite database with no tables, not a pate-accountant "
                                      "ledger; it was left unchanged")
                if tables and "meta" not in tables:
                    raise LedgerError(f"{self._path!r} is an SQLite database but not a pate-accountant ledger")
                if tables and self._meta().get(DISCARDED_KEY):
                    raise _Discarded()
                if tables or create:
                    version = self._meta().get("schema_version")
                    if version is not None and json.loads(version) != SCHEMA_VERSION:
                        raise LedgerError(f"ledger schema version {version} is not supported "
                                          f"(expected {SCHEMA_VERSION})")
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

    def _tables(self, conn=None) -> set:
        conn = self._conn if conn is None else conn
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    # -- the confidential file ------------------------------------------------------------------------------
    @property
    def confidential_path(self) -> str | None:
        """Where the confidential file is (or would be) kept (``None`` in memory)."""
        return self._conf_path

    @property
    def has_confidential(self) -> bool:
        """Whether the confidential part is open on this ``Ledger``."""
        return self._conf is not None

    def _open_confidential(self, *, create: bool) -> bool:
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
            self._check_confidential_layout(conn, create=not read_only)
        except BaseException:
            conn.close()
            raise
        self._conf = conn
        return True

    def _check_confidential_layout(self, conn, *, create: bool) -> None:
        where = self._conf_path or ":memory:"
        ledger_id = self._meta().get("ledger_id")
        try:
            conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
            try:
                tables = self._tables(conn)
                if tables and "meta" not in tables:
                    raise LedgerError(f"{where!r} is an SQLite database but not a confidential ledger file")
                if create:
                    for statement in _split_sql(_CONFIDENTIAL_SCHEMA):
                        conn.execute(statement)
                    defaults = {
                        "schema_version": canonical_json(CONFIDENTIAL_SCHEMA_VERSION),
                        "ledger_id": ledger_id,
                        "created": canonical_json(time.time()),
                    }
                    conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", defaults.items())
                meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in self._tables(conn) else {}
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise LedgerError(f"{where!r} is not a usable confidential ledger file: {exc}") from None
        version = meta.get("schema_version")
        if version is None or json.loads(version) != CONFIDENTIAL_SCHEMA_VERSION:
            raise LedgerError(f"{where!r} is not a confidential ledger file of schema version "
                              f"{CONFIDENTIAL_SCHEMA_VERSION} (found {version})")
        if meta.get("ledger_id") != ledger_id:
            raise LedgerIntegrityError(f"the confidential file {where!r} belongs to another ledger (ledger ids differ)")

    def _require_confidential(self, accountant) -> None:
        rows = self._head()[0]
        if self._open_confidential(create=rows == 0 and not self._read_only):
            return
        raise LedgerError(
            f"a {accountant.kind} accountant keeps confidential charges (the teachers charged on each hit): "
            f"replaying this ledger needs its confidential file {self._conf_path!r}, which is missing"
            + ("" if rows else " (and the ledger is open read-only)"))

    def _confidential_genesis(self) -> str:
        return _confidential_genesis_hash(dict(self._conf.execute("SELECT key, value FROM meta")))

    def _confidential_head(self) -> tuple[int, str | None]:
        row = self._conf.execute("SELECT row_count, last_hash FROM head WHERE id = 1").fetchone()
        if row is None:
            raise LedgerIntegrityError("the confidential file's head row is missing")
        return row[0], row[1]

    def _drop_orphans(self, head_rows: int) -> tuple[int, str | None]:
        """Inside a write transaction: remove confidential rows and totals of shareable rows that were never
        committed (a writer stopped between the two commits), and return the confidential head."""
        conf = self._conf
        dropped = conf.execute("DELETE FROM charges WHERE share_row > ?", (head_rows,)).rowcount
        dropped += conf.execute("DELETE FROM totals WHERE share_row > ?", (head_rows,)).rowcount
        if dropped:
            last = conf.execute("SELECT id, hash FROM charges ORDER BY id DESC LIMIT 1").fetchone()
            head = (last[0], last[1]) if last else (0, None)
            conf.execute("UPDATE head SET row_count = ?, last_hash = ? WHERE id = 1", head)
            return head
        return self._confidential_head()

    # -- context manager ----------------------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the main file and empty the log (SQLite's ``wal_checkpoint(TRUNCATE)``),
        so that the ``.sqlite`` file alone holds every committed row: a copy of it is complete, and an audit
        opens it without creating files beside it.  ``True`` when the log was emptied (another process
        reading or writing the ledger can keep it from being; :meth:`close` tries again).  A read-only or
        in-memory ledger has nothing to checkpoint."""
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
        """Checkpoint a writable ledger (:meth:`checkpoint`), then close the connections (idempotent)."""
        try:
            self.checkpoint()
        except sqlite3.ProgrammingError:  # already closed
            pass
        if self._conf is not None:
            self._conf.close()
        self._conn.close()

    @property
    def created_here(self) -> bool:
        """Whether the :meth:`open` that made this object created the file (it was not at the path before)."""
        return self._created_here

    def discard_if_unused(self) -> bool:
        """Close the ledger and, when this object created its file and the ledger is still unused, remove it.

        Unused: no run began and no row was written (a data set name and an accountant configuration may have
        been stored: that is the claim a run makes before its slow start), and no other connection has the file
        open.  The last is decided by SQLite's own lock: in exclusive locking mode the write lock is granted only
        when no other connection holds the file, and it is kept until the file is gone.  Under that lock the
        ledger is marked discarded (a process that opened the path just before reads the mark and opens what
        is at the path instead), its log is folded into the file, a confidential file this object created
        empty is removed, and the path is unlinked.  Returns whether the files were removed; otherwise
        (another process has joined, or charged) they stay as they are and are only closed."""
        conn = self._conn
        if self._read_only or self._path is None or not self._created_here or self._run is not None:
            self.close()
            return False
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
        """For :meth:`discard_if_unused`: take the write lock in exclusive locking mode without waiting (granted
        only when no other connection has the file open) and, when the ledger has no row and no run, mark it
        discarded.  ``False`` (and no lock kept past the transaction) otherwise."""
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
        """Ledger-wide metadata set by :meth:`set_run_metadata` (each run's own metadata: :attr:`runs`)."""
        return self._meta_value("run_metadata")

    @property
    def dataset(self) -> str | None:
        """The name of the data set this ledger belongs to (``None`` when not named)."""
        return self._meta_value("dataset")

    def _set_meta_once(self, key: str, text: str, what: str) -> None:
        with self._write_transaction():
            stored = self._meta().get(key)
            if stored == text:
                return
            if self._head()[0] > 0:
                raise ValueError(f"{what} can only be set before the first charge (it is covered by the genesis "
                                 f"hash); the ledger has {stored if stored is not None else 'none'}")
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, text))

    def set_run_metadata(self, metadata: dict) -> None:
        """Store ledger-wide metadata as JSON data: mechanism parameters, model name, ...  Allowed until the
        first row is written (it is covered by the genesis hash); afterwards only an equal value is accepted
        (a process joining the run).  Per-run metadata, kept for every run: :meth:`begin_run`.

        **Never put private data or seeds here** (prompts, records, teacher data): the file is meant to be
        shown to auditors.  A number under a seed-like key (``"seed"``, ``"seeds"``, ...) is refused; the
        ledger cannot tell a prompt from a parameter, so the rest is the caller's duty.
        """
        if not isinstance(metadata, dict):
            raise TypeError(f"run metadata must be a dict, got {type(metadata).__name__}")
        text = _json_data("run metadata", metadata)
        _check_no_seed("run metadata", metadata)
        self._set_meta_once("run_metadata", text, "run metadata")

    def set_dataset(self, name: str) -> None:
        """Name the data set this ledger belongs to (every run charged here spends that data set's budget).
        Allowed until the first row is written; afterwards only the same name is accepted.  The name is
        shareable: choose one that reveals nothing private."""
        name = _check_dataset(name)
        stored = self.dataset
        if stored is not None and stored != name:
            raise ValueError(f"this ledger belongs to the data set {stored!r}, not {name!r}")
        self._set_meta_once("dataset", canonical_json(name), "the data set name")

    # -- runs ------------------------------------------------------------------------------------------------
    def begin_run(self, metadata: dict) -> int:
        """Record the start of a run with its metadata (JSON data: mechanism, accountant, parameters,
        ``"seeded": true/false``, software version; never a seed, never private data) and return its id.
        Every row this ``Ledger`` object writes afterwards names the run.  Runs are hash-chained and never
        overwritten: each run keeps its own metadata."""
        if not isinstance(metadata, dict):
            raise TypeError(f"run metadata must be a dict, got {type(metadata).__name__}")
        text = _json_data("run metadata", metadata)
        _check_no_seed("run metadata", metadata)
        with self._write_transaction():
            row = self._conn.execute("SELECT row_count, run_count, run_last_hash FROM head WHERE id = 1").fetchone()
            if row is None:
                raise LedgerIntegrityError("the ledger's head row is missing")
            first_row, run_count, run_hash = row
            prev = run_hash if run_count else _runs_genesis_hash(self._meta())
            run_id, created = run_count + 1, float(time.time())
            digest = _run_hash(prev, run_id, first_row, text, created, self._writer)
            self._conn.execute(f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                               (run_id, prev, digest, first_row, text, created, self._writer))
            self._conn.execute("UPDATE head SET run_count = ?, run_last_hash = ? WHERE id = 1", (run_id, digest))
        self._run, self._run_created = run_id, created
        return run_id

    def _row_time(self) -> float:
        """The time stored on the rows this object writes: the start of its run (:meth:`begin_run`), or without a
        run the ledger's creation time.  A charge's own wall-clock time would depend on the data (prompt lengths;
        under individual charging, how many teachers remain), so it is stored nowhere (docs/ledger.md)."""
        if self._run_created is not None:
            return self._run_created
        created = self._meta_value("created")
        return float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else 0.0

    @property
    def current_run(self) -> int | None:
        """The run this ``Ledger`` object's rows belong to (``None`` before :meth:`begin_run`)."""
        return self._run

    @property
    def runs(self) -> list:
        """Every run's ``{"id", "first_row", "created", "metadata"}``, in order (no verification)."""
        out = []
        for run_id, _prev, _hash, first_row, text, created, _writer in self._conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id"):
            out.append({"id": run_id, "first_row": first_row, "created": created, "metadata": json.loads(text)})
        return out

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

    @property
    def head_record(self) -> dict:
        """``{"rows", "head_hash", "runs", "run_head_hash"}``: the heads of the row and run chains, read in one
        statement (so together, even while another process writes).  What a signed checkpoint
        (:mod:`pate_accountant.checkpoints`) or a pin written down elsewhere records."""
        row = self._conn.execute(
            "SELECT row_count, last_hash, run_count, run_last_hash FROM head WHERE id = 1").fetchone()
        if row is None:
            raise LedgerIntegrityError("the ledger's head row is missing")
        return {"rows": row[0], "head_hash": row[1], "runs": row[2], "run_head_hash": row[3]}

    def row_hash(self, row_id: int) -> str | None:
        """The stored hash of row ``row_id`` (``None`` when there is no such row); no verification."""
        found = self._conn.execute("SELECT hash FROM charges WHERE id = ?", (int(row_id),)).fetchone()
        return None if found is None else found[0]

    def run_hash(self, run_id: int) -> str | None:
        """The stored hash of run ``run_id`` (``None`` when there is no such run); no verification."""
        found = self._conn.execute("SELECT hash FROM runs WHERE id = ?", (int(run_id),)).fetchone()
        return None if found is None else found[0]

    def rows(self):
        """Decode every row, in order (no verification; use :meth:`verify` for that).  Teacher sets are
        filled in from the confidential file when it is open on this ``Ledger``."""
        codec = _Codec()
        teachers = {}
        if self._conf is not None:
            for share_row, text in self._conf.execute("SELECT share_row, charged_teachers FROM charges"):
                teachers[share_row] = frozenset(json.loads(text))
        for raw in self._conn.execute(f"SELECT {self._row_columns()} FROM charges ORDER BY id"):
            (row_id, _prev, digest, event_text, count, outcome, commitment, eps, delta, created, writer, run,
             group) = raw
            yield LedgerRow(row_id, codec.decode(event_text), count, outcome, teachers.get(row_id, frozenset()),
                            None if eps is None else (eps, delta), created, writer, digest, commitment, run, group)

    # -- transactions -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write_transaction(self, *, confidential: bool = False):
        """Write locks on the shareable file (and the confidential one); on exit the confidential
        transaction commits first, then the shareable one (see the module docstring)."""
        if self._read_only:
            raise LedgerError(f"ledger {self._path!r} is open read-only")
        if self._in_transaction:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        try:
            self._conn.execute("BEGIN IMMEDIATE")  # the write lock, waiting up to `timeout` for other writers
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"cannot start a write transaction on {self._path!r}: {exc}") from None
        self._in_transaction = True
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
                self._between_commits()
            self._conn.execute("COMMIT")
        except BaseException:
            if conf is not None:
                _rollback(conf)
            _rollback(self._conn)
            raise
        finally:
            self._in_transaction = False

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

    @contextlib.contextmanager
    def _read_transaction(self, *, confidential: bool = False):
        """Read snapshots: the shareable file's first, then (with ``confidential``, or later through the
        yielded object's ``add_confidential()``) the confidential file's, so that every confidential row a
        shareable row names is in the second snapshot (it was committed first)."""
        if self._in_transaction:
            raise RuntimeError("a ledger transaction is already open on this Ledger")
        snapshot = _ReadSnapshot(self)
        self._conn.execute("BEGIN")
        self._in_transaction = True
        try:
            if confidential:
                snapshot.add_confidential()
            yield snapshot
        finally:
            self._in_transaction = False
            if snapshot.conf is not None:
                _rollback(snapshot.conf)
            _rollback(self._conn)

    def _stored_totals(self, position: _Position, row_id: int, row_hash: str | None):
        """The totals stored after row ``row_id`` (from the confidential file for a confidential accountant)."""
        if position.confidential:
            stored = self._conf.execute("SELECT share_hash, spent_epsilon, spent_delta FROM totals WHERE share_row = ?",
                                        (row_id,)).fetchone()
            if stored is None or stored[0] != row_hash:
                return None
            return stored[1], stored[2]
        stored = self._conn.execute("SELECT spent_epsilon, spent_delta FROM charges WHERE id = ?", (row_id,)).fetchone()
        return None if stored is None or stored[0] is None else stored

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
                links = self._conf.execute(
                    f"SELECT {_CONF_COLUMNS} FROM charges WHERE id > ? AND share_row <= ? ORDER BY id",
                    (conf_id, head_rows))
                if not conf_id:
                    conf_prev = self._confidential_genesis()
            cursor = self._conn.execute(f"SELECT {self._row_columns()} FROM charges WHERE id > ? ORDER BY id",
                                        (last_id,))
            batch: list = []
            while True:
                raws = cursor.fetchmany(self._REPLAY_BATCH)
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
            kind_class = None
            config = self._meta_value("config") if "meta" in self._tables() else None
            if isinstance(config, dict):
                with contextlib.suppress(Exception):
                    kind_class = accountant_class(config.get("kind"))
            confidential = kind_class is not None and _keeps_confidential(kind_class)
            if confidential and self._conf is None:
                try:
                    self._open_confidential(create=False)
                except LedgerError as exc:
                    return VerificationResult(False, 0, None, None, str(exc), confidential="unusable",
                                              confidential_path=self._conf_path)
            with self._read_transaction(confidential=confidential):
                return self._verify()
        except (sqlite3.Error, UnicodeDecodeError, ValueError) as exc:  # damaged pages or schema
            return VerificationResult(False, 0, None, None, f"the file is not a readable ledger: {exc}")

    def _verify_runs(self, meta, run_count, run_last_hash):
        """Check the runs' chain and head; returns ``(runs, None)`` or ``(None, message)``."""
        prev, expected, runs = _runs_genesis_hash(meta), 1, []
        for run_id, stored_prev, stored_hash, first_row, text, created, writer in self._conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id"):
            if run_id != expected:
                return None, f"run {expected} is missing (the runs jump to {run_id!r}): runs were dropped or renumbered"
            if stored_prev != prev:
                return None, f"run {run_id} does not follow run {run_id - 1} (prev_hash mismatch): runs were reordered"
            if _run_hash(stored_prev, run_id, first_row, text, created, writer) != stored_hash:
                return None, f"run {run_id}'s metadata was edited (its hash does not match its content)"
            if isinstance(first_row, bool) or not isinstance(first_row, int) or first_row < 0 or (
                    runs and first_row < runs[-1]["first_row"]):
                return None, f"run {run_id} has an invalid first row {first_row!r}"
            try:
                metadata = json.loads(text)
            except ValueError as exc:
                return None, f"run {run_id}'s metadata cannot be decoded: {exc}"
            runs.append({"id": run_id, "first_row": first_row, "rows": 0, "created": created, "metadata": metadata})
            prev, expected = stored_hash, expected + 1
        if run_count != len(runs) or run_last_hash != (prev if runs else None):
            return None, (f"the head records {run_count!r} runs but the table has {len(runs)}, or its last run hash "
                          "differs: runs were dropped or the head was edited")
        return runs, None

    def _verify(self) -> VerificationResult:
        conn = self._conn
        tables = self._tables()
        if not tables:
            return VerificationResult(False, 0, None, None, "not a pate-accountant ledger: the database has no tables")
        missing = {"meta", "charges", "head", "runs"} - tables
        if missing:
            return VerificationResult(False, 0, None, None, f"not a pate-accountant ledger: tables {sorted(missing)} missing")
        meta = self._meta()
        info: dict[str, Any] = {}
        try:
            for key in ("ledger_id", "software_version", "config", "run_metadata", "dataset"):
                info[key] = None if meta.get(key) is None else json.loads(meta[key])
            version = json.loads(meta["schema_version"])
        except (KeyError, ValueError) as exc:
            return VerificationResult(False, 0, None, None, f"the ledger metadata is damaged: {exc}")
        if version != SCHEMA_VERSION:
            return VerificationResult(False, 0, None, None, f"unsupported ledger schema version {version!r}")
        config = info["config"]
        extra = {"config": config, "run_metadata": info["run_metadata"], "software_version": info["software_version"],
                 "ledger_id": info["ledger_id"], "dataset": info["dataset"]}
        head = conn.execute("SELECT row_count, last_hash, run_count, run_last_hash FROM head WHERE id = 1").fetchone()
        if head is None:
            return VerificationResult(False, 0, None, None, "the ledger's head row is missing", **extra)
        head_rows, head_hash, run_count, run_last_hash = head
        extra["head_hash"] = head_hash
        runs, problem = self._verify_runs(meta, run_count, run_last_hash)
        if problem is not None:
            return VerificationResult(False, 0, None, None, problem, **extra)

        accountant = None
        confidential = False
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
            confidential = _keeps_confidential(accountant)
        full = not confidential or self._conf is not None  # can the budget be replayed?
        if confidential:
            extra["confidential"] = "verified" if full else "absent"
            extra["confidential_path"] = self._conf_path
        runs_by_id = {run["id"]: run for run in runs}

        def result(ok, row, message, rows, spent=None, queries=None, hits=None):
            return VerificationResult(ok, rows, spent, row, message, runs=tuple(runs), queries=queries, hits=hits,
                                      **extra)

        links = totals = None
        conf_id, conf_prev = 0, None
        group_charges: dict = {}  # (run, group) -> that group's own charges, for each group's spend alone
        if confidential and full:
            conf = self._conf
            links = conf.execute(f"SELECT {_CONF_COLUMNS} FROM charges WHERE share_row <= ? ORDER BY id",
                                 (head_rows,))
            conf_prev = self._confidential_genesis()
            totals = {share_row: (share_hash, eps, delta) for share_row, share_hash, eps, delta in conf.execute(
                "SELECT share_row, share_hash, spent_epsilon, spent_delta FROM totals WHERE share_row <= ?",
                (head_rows,))}
        genesis = _genesis_hash(meta)
        prev, expected = genesis, 1
        queries = hits = 0
        # Rows carry their run's start time (or, without a run, the ledger's creation time); rows written by earlier
        # versions carry their own commit time, which can depend on the data: counted and reported, not refused.
        ledger_created = None
        with contextlib.suppress(TypeError, ValueError):
            ledger_created = json.loads(meta.get("created") or "null")
        own_times = 0
        spent = (0.0, 0.0) if accountant is None or not full else tuple(float(x) for x in accountant.spent())
        for raw in conn.execute(f"SELECT {self._row_columns()} FROM charges ORDER BY id"):
            rows = expected - 1
            if accountant is None:
                return result(False, expected, "the ledger has rows but no accountant config", rows)
            try:
                row = _check_row(self._codec, raw, expected, prev)
                charge = row.charge
                if row.run is not None:
                    run = runs_by_id.get(row.run)
                    if run is None or run["first_row"] >= expected:
                        raise _RowError(expected, f"row {expected} names run {row.run}, which does not exist or began "
                                                  "after it")
                    run["rows"] += 1
                if confidential and row.spent is not None:
                    raise _RowError(expected, f"row {expected} stores spent totals in the shareable file, but a "
                                              f"{accountant.kind} accountant's totals are confidential")
                if links is not None:
                    charge, conf_step = _link(row, expected, links, conf_id, conf_prev)
                    if conf_step is not None:
                        conf_id, conf_prev = conf_step
                elif confidential:
                    if (charge.outcome in HIT_OUTCOMES) != (row.commitment is not None):
                        raise _RowError(expected, f"row {expected}: a hit must carry a teacher-set commitment and "
                                                  "any other row none")
                elif row.commitment is not None:
                    raise _RowError(expected, f"row {expected} carries a teacher-set commitment but a "
                                              f"{accountant.kind} accountant keeps no confidential charges")
            except _RowError as exc:
                return result(False, exc.row, exc.message, rows, spent if full else None)
            queries += charge.count if charge.outcome is not None else 0
            hits += charge.count if charge.outcome == TARGET else 0
            if charge.group is not None:
                group_charges.setdefault((row.run, charge.group[1]), []).append(attr.evolve(charge, group=None))
            if raw[9] != (runs_by_id[row.run]["created"] if row.run is not None else ledger_created):
                own_times += 1
            prev = row.hash
            if not full:  # shareable part only: check the event is one this accountant accounts for
                try:
                    accountant.replay([charge])
                except Exception as exc:
                    return result(False, expected, f"row {expected} cannot be replayed: {type(exc).__name__}: {exc}",
                                  rows)
                expected += 1
                continue
            try:
                accountant.replay([charge], enforce_budget=True)  # checked against the budget, as a live charge
            except BudgetExhaustedError as exc:
                return result(False, expected, f"row {expected} exceeds the budget: {exc}", rows, spent)
            except Exception as exc:  # an event this accountant cannot account for, ...
                return result(False, expected, f"row {expected} cannot be replayed: {type(exc).__name__}: {exc}",
                              rows, spent)
            stored = row.spent
            if totals is not None:
                entry = totals.pop(expected, None)
                if entry is not None:
                    if entry[0] != row.hash:
                        return result(False, expected, f"the confidential totals for row {expected} name another "
                                                       "row hash: they do not belong to this ledger", expected, spent)
                    stored = (entry[1], entry[2])
            spent = None
            if stored is None:
                expected += 1
                continue
            spent = tuple(float(x) for x in accountant.spent())
            if not (_totals_close(spent[0], stored[0]) and _totals_close(spent[1], stored[1])):
                return result(False, expected, f"totals disagree at row {expected}: the ledger stores spent "
                                               f"(epsilon={stored[0]!r}, delta={stored[1]!r}) but replaying gives "
                                               f"(epsilon={spent[0]!r}, delta={spent[1]!r})", expected, spent)
            expected += 1
        rows = expected - 1
        final = None
        if full and accountant is not None:
            final = spent if spent is not None else tuple(float(x) for x in accountant.spent())
        elif accountant is None:
            final = (0.0, 0.0)
        if head_rows != rows:
            if isinstance(head_rows, int) and head_rows > rows:
                missing = f"row {rows + 1}" if head_rows == rows + 1 else f"rows {rows + 1}-{head_rows}"
                return result(False, rows + 1, f"{missing} missing: the head records {head_rows} rows but the table "
                                               f"ends at row {rows} (the last rows were dropped)", rows, final)
            return result(False, rows, f"the head records {head_rows!r} rows but the table has {rows}: the head was "
                                       "edited", rows, final)
        if head_hash != (prev if rows else None):
            return result(False, rows or None, f"the head hash does not match row {rows}'s hash: the head or the "
                                               "last row was edited", rows, final)
        if full and rows and spent is None:  # every transaction stores totals on its last row
            where = "the confidential file stores" if confidential else "stores"
            return result(False, rows, f"row {rows}, the last row, has no spent totals ({where} them for the last "
                                       "row of every transaction): the rows of a transaction were dropped", rows, final)
        notes = []
        if links is not None:
            extra_rows = links.fetchall()
            if extra_rows:
                return result(False, rows, f"the confidential file has {len(extra_rows)} row(s) that no hit row names "
                                           "(rows were added to it)", rows, final)
            if totals:
                return result(False, min(totals), "the confidential file stores totals for a row that is not the last "
                                                  "of its transaction", rows, final)
            conf_head = self._confidential_head()
            orphans = self._conf.execute("SELECT COUNT(*) FROM charges WHERE share_row > ?", (head_rows,)).fetchone()[0]
            if orphans:
                notes.append(f"{orphans} confidential row(s) of an interrupted, uncommitted charge ignored")
            elif conf_head != ((conf_id, conf_prev) if conf_id else (0, None)):
                return result(False, rows, f"the confidential file's head (row {conf_head[0]}) does not match its rows "
                                           f"(last row {conf_id}): confidential rows were dropped", rows, final)
        if own_times:
            notes.append(f"{own_times} row(s) carry their own commit time instead of their run's start (written by an "
                         "earlier version: such times can depend on the data, see docs/ledger.md)")
        if not full:
            message = (f"shareable part verified: {rows} rows, {len(runs)} runs, hash chains and heads intact, every "
                       f"event accounted by {accountant.kind}; the confidential file {self._conf_path!r} was not "
                       "found, so the per-teacher charges and the spent budget were not checked")
            if notes:
                message += "; " + "; ".join(notes)
            return result(True, None, message, rows, None, queries, hits)
        _group_spends(runs_by_id, group_charges, config)
        what = "shareable and confidential parts" if confidential else "shareable part (no confidential part)"
        message = (f"verified: {rows} rows, {len(runs)} runs, {what}: hash chains and heads intact, totals agree, "
                   "within budget")
        if notes:
            message += "; " + "; ".join(notes)
        return result(True, None, message, rows, final, queries, hits)


def _group_spends(runs_by_id: dict, group_charges: dict, config) -> None:
    """Add to each run with groups ``"groups": [{"group", "rows", "spent"}]``: each group's own charges replayed
    alone into a fresh accountant of the ledger's configuration (what that group's records would have spent in a
    run of their own; the data set's spend takes the largest per event, docs/groups.md)."""
    for (run_id, group), charges in sorted(group_charges.items()):
        alone = accountant_from_config(config)
        alone.replay(charges)
        spent = [float(x) for x in alone.spent()]
        runs_by_id[run_id].setdefault("groups", []).append({"group": group, "rows": len(charges), "spent": spent})


def _link(row: _CheckedRow, row_id: int, links, conf_id: int, conf_prev: str):
    """The charge of shareable row ``row`` with its teacher set read from the confidential file (hit rows),
    and the new confidential position (``None`` for a row that has no confidential row)."""
    charge = row.charge
    if charge.outcome not in HIT_OUTCOMES:
        if row.commitment is not None:
            raise _RowError(row_id, f"row {row_id} is not a hit but carries a teacher-set commitment")
        return charge, None
    if row.commitment is None:
        raise _RowError(row_id, f"row {row_id} is a hit but carries no commitment to its charged teachers")
    teachers, digest = _check_confidential_row(links.fetchone(), conf_id + 1, conf_prev, row_id, row.hash,
                                               row.commitment)
    return attr.evolve(charge, charged_teachers=teachers), (conf_id + 1, digest)


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


class _Discarded(Exception):
    """The file opened was removed (or is being removed) by :meth:`Ledger.discard_if_unused`."""


class InterruptedWriteError(LedgerError):
    """A ledger file with a rollback journal beside it: a write (the creation, most likely) was interrupted and
    has not been rolled back, so the file cannot be read as it is without writing to it."""


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
