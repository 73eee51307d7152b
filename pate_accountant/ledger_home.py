"""One budget per data set on an installation: the data set's fingerprint and the ledger home (docs/ledger.md,
"One budget per data set").

A ledger keeps a budget, but nothing in a ledger file ties it to the records it protects: three ledgers for one
data set would spend three budgets while each reports its own.  This module ties them on one installation:

* :func:`dataset_fingerprint` is a keyed hash (HMAC-SHA256) of the data set's canonical records: each record as
  canonical JSON, the lines sorted (so the order of the records does not matter), under a secret key of this
  installation (:func:`fingerprint_key`, a file of the user's configuration folder readable by its owner
  only).  Without the key the fingerprint says nothing about the records (no one can test a guess), so it may
  be stored in the shareable ledger; with the key, equal records give equal fingerprints.
* :class:`LedgerHome` is a folder of the user's data folder with an index (SQLite) from fingerprints to the
  ledger that keeps each data set's budget, and the default place of those ledgers.  A run looks its data set
  up there: a known data set's ledger is used, and a run that names another ledger for it is refused.

What this cannot catch: a modified copy of the records (another fingerprint), another machine or another user
account (another key and index), until a shared ledger gives a shared index.

The folders: ``$PATE_ACCOUNTANT_CONFIG`` (else the platform's user configuration folder of
``pate-accountant``, :mod:`platformdirs`) holds the key; ``$PATE_ACCOUNTANT_HOME`` (else the platform's user
data folder) holds the index and the ledgers.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from pate_accountant.errors import PateAccountantError
from pate_accountant.serialization import canonical_json

__all__ = [
    "CONFIG_ENV",
    "DataSetLedgerError",
    "HOME_ENV",
    "LedgerHome",
    "config_dir",
    "dataset_fingerprint",
    "fingerprint_key",
    "home_dir",
]

APP = "pate-accountant"
CONFIG_ENV = "PATE_ACCOUNTANT_CONFIG"
HOME_ENV = "PATE_ACCOUNTANT_HOME"
KEY_FILE = "fingerprint.key"
INDEX_FILE = "index.sqlite"
#: The key file holds 32 random bytes as 64 hex digits (and a newline); anything longer is not ours.
_KEY_HEX = 64
_PREFIX = "hmac-sha256:"


class DataSetLedgerError(PateAccountantError):
    """A data set's budget would be split: its records are already charged to another ledger here."""


def config_dir() -> Path:
    """The folder of the fingerprint key: ``$PATE_ACCOUNTANT_CONFIG``, else the user configuration folder."""
    root = os.environ.get(CONFIG_ENV)
    if root:
        return Path(root).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def home_dir() -> Path:
    """The ledger home: ``$PATE_ACCOUNTANT_HOME``, else the user data folder of ``pate-accountant``."""
    root = os.environ.get(HOME_ENV)
    if root:
        return Path(root).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def _private_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def fingerprint_key(folder=None) -> bytes:
    """This installation's fingerprint key (32 bytes), created at first use in ``folder`` (default
    :func:`config_dir`) as ``fingerprint.key`` with mode 0600.  Refused (:class:`PateAccountantError`) when the
    file is no regular file, is readable or writable by others, or does not hold a key."""
    folder = _private_folder(Path(folder) if folder is not None else config_dir())
    path = folder / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:  # first use: a fresh key, written before anyone can read the file (it is created empty, then filled)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(secrets.token_hex(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    info = os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        raise PateAccountantError(f"fingerprint key {str(path)!r} is not a regular file")
    if info.st_mode & 0o077:
        raise PateAccountantError(f"fingerprint key {str(path)!r} is open to other users (mode "
                                  f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 it")
    for _ in range(50):  # another process may have created the file an instant ago and be writing the key
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(_KEY_HEX + 2).strip()
        if text:
            break
        time.sleep(0.01)
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise PateAccountantError(f"fingerprint key {str(path)!r} does not hold a key (64 hex digits); remove it "
                                  "to make a new one (the data sets' fingerprints then change)")
    return bytes.fromhex(text)


def dataset_fingerprint(records: Iterable, key: bytes | None = None) -> str:
    """``"hmac-sha256:<64 hex digits>"``: the keyed hash of ``records`` (JSON data, one item per record), the
    same for the same records in any order.  ``key`` defaults to :func:`fingerprint_key`."""
    lines = sorted(canonical_json(record) for record in records)
    if not lines:
        raise ValueError("records: a data set without records has no fingerprint")
    key = fingerprint_key() if key is None else key
    digest = hmac.new(key, b"pate-accountant data set\n" + "\n".join(lines).encode("utf-8"), hashlib.sha256)
    return _PREFIX + digest.hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:60] or "dataset"


def _real(path) -> Path:
    return Path(os.path.realpath(os.fspath(path)))


def _same(a, b) -> bool:
    return _real(a) == _real(b)


class LedgerHome:
    """The index of this installation's data sets (fingerprint -> the ledger keeping its budget) and the default
    folder of their ledgers, in ``root`` (default :func:`home_dir`)."""

    def __init__(self, root=None):
        self.root = Path(root) if root is not None else home_dir()

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_FILE

    def prepare(self) -> None:
        """Create the home and its ``ledgers`` folder (mode 0700) when missing."""
        _private_folder(self.root / "ledgers")

    def default_path(self, dataset: str, fingerprint: str) -> Path:
        """Where a data set's ledger goes when no ``--ledger`` is given: ``ROOT/ledgers/<name>-<12 hex>.sqlite``."""
        return self.root / "ledgers" / f"{_slug(dataset)}-{fingerprint.removeprefix(_PREFIX)[:12]}.sqlite"

    def _connect(self, write: bool) -> sqlite3.Connection | None:
        if not write and not self.index_path.is_file():
            return None
        if write:
            self.prepare()
        conn = sqlite3.connect(self.index_path, timeout=30.0, isolation_level=None)
        if write:
            os.chmod(self.index_path, 0o600)
            conn.execute("CREATE TABLE IF NOT EXISTS datasets (fingerprint TEXT PRIMARY KEY, ledger TEXT NOT NULL, "
                         "dataset TEXT NOT NULL, registered REAL NOT NULL)")
        return conn

    def lookup(self, fingerprint: str) -> Path | None:
        """The ledger registered for ``fingerprint``, or ``None`` (nothing is created)."""
        conn = self._connect(write=False)
        if conn is None:
            return None
        try:
            row = conn.execute("SELECT ledger FROM datasets WHERE fingerprint = ?", (fingerprint,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        finally:
            conn.close()
        return None if row is None else Path(row[0])

    def check(self, fingerprint: str, ledger_path) -> Path | None:
        """The registered ledger of ``fingerprint`` when it is ``ledger_path`` or none is registered (``None``);
        :class:`DataSetLedgerError` naming the registered ledger when ``ledger_path`` is another file."""
        registered = self.lookup(fingerprint)
        if registered is not None and ledger_path is not None and not _same(registered, ledger_path):
            raise DataSetLedgerError(_split_message(registered, self))
        return registered

    def register(self, fingerprint: str, dataset: str, ledger_path) -> Path:
        """Record ``ledger_path`` as the ledger of ``fingerprint`` unless one is registered already (one write
        transaction, so of two runs racing the first wins); returns the registered ledger.
        :class:`DataSetLedgerError` when that is another file."""
        path = _real(ledger_path)
        conn = self._connect(write=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR IGNORE INTO datasets (fingerprint, ledger, dataset, registered) VALUES (?, ?, ?, ?)",
                          (fingerprint, str(path), dataset, time.time()))
            row = conn.execute("SELECT ledger FROM datasets WHERE fingerprint = ?", (fingerprint,)).fetchone()
            conn.execute("COMMIT")
        finally:
            conn.close()
        registered = Path(row[0])
        if not _same(registered, path):
            raise DataSetLedgerError(_split_message(registered, self))
        return registered


def _split_message(registered: Path, home: LedgerHome) -> str:
    return (f"these records are already charged to the ledger {str(registered)!r} on this installation (index "
            f"{str(home.index_path)!r}): give --ledger {str(registered)!r}, or leave --ledger out, so that one "
            "budget covers them")
