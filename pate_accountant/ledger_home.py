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

A PostgreSQL ledger's database keeps an index of its own (:class:`DatabaseIndex`), with a key of its own, so
runs on any host that write to that database find one ledger per data set; such a run is also entered in the
installation's index (under the installation's key, naming the database ledger by its :meth:`DatabaseIndex.identity`),
so that the same records are not charged to a file on this installation as well.

What this cannot catch: a modified copy of the records (another fingerprint); another machine or another user
account that charges the records to a file (another key and index) rather than to the shared database.

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
from contextlib import suppress as _suppress
from pathlib import Path

from pate_accountant._ledger.postgres_store import _import_psycopg, connect, is_postgres_url, parse_url, scrub_secrets
from pate_accountant.errors import PateAccountantError
from pate_accountant.serialization import canonical_json

__all__ = [
    "CONFIG_ENV",
    "DataSetLedgerError",
    "DatabaseIndex",
    "HOME_ENV",
    "LedgerHome",
    "config_dir",
    "dataset_fingerprint",
    "fingerprint_key",
    "home_dir",
    "ledger_identity",
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


def _real(location) -> Path | str:
    """A ledger's identity in the index: a file's real path, or a database ledger's :meth:`DatabaseIndex.identity`."""
    return location if is_postgres_url(location) else Path(os.path.realpath(os.fspath(location)))


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

    def lookup(self, fingerprint: str) -> Path | str | None:
        """The ledger registered for ``fingerprint`` (a path, or a PostgreSQL ledger's identity URL), or ``None``
        (nothing is created)."""
        rows = self._read("SELECT ledger FROM datasets WHERE fingerprint = ?", (fingerprint,))
        return _stored(rows[0][0]) if rows else None

    def _read(self, sql: str, params=()) -> list:
        """The rows of one query on the index; none when there is no index yet (nothing is created)."""
        conn = self._connect(write=False)
        if conn is None:
            return []
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        finally:
            conn.close()

    def entries(self) -> list[dict]:
        """Every registration, oldest first: ``{"ledger", "dataset", "registered"}`` (a path, or a PostgreSQL
        ledger's identity URL; the data set's name; seconds since the epoch).  Fingerprints are left out."""
        rows = self._read("SELECT ledger, dataset, registered FROM datasets ORDER BY registered, ledger")
        return [{"ledger": _stored(ledger), "dataset": dataset, "registered": registered}
                for ledger, dataset, registered in rows]

    def check(self, fingerprint: str, ledger_path) -> Path | str | None:
        """The registered ledger of ``fingerprint`` when it is ``ledger_path`` or none is registered (``None``);
        :class:`DataSetLedgerError` naming the registered ledger when ``ledger_path`` is another one (a file, or a
        PostgreSQL ledger's :meth:`DatabaseIndex.identity`)."""
        registered = self.lookup(fingerprint)
        if registered is not None and ledger_path is not None and not _same(registered, ledger_path):
            raise DataSetLedgerError(_split_message(registered, self))
        return registered

    def moved(self, old, new) -> int:
        """The data sets registered to the ledger ``old`` are registered to ``new`` instead (a path or a
        PostgreSQL ledger's :meth:`DatabaseIndex.identity`, as :func:`ledger_identity` gives them): what
        ``ledger copy`` does once a copy verifies with the same heads, so that the records' next runs charge the
        copy, which continues the same budget, and a run naming the old ledger is refused.  Returns how many data
        sets were re-registered (``0`` when the index names ``old`` for none, or there is no index)."""
        if not self.index_path.is_file():
            return 0
        conn = self._connect(write=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            changed = conn.execute("UPDATE datasets SET ledger = ? WHERE ledger = ?",
                                   (str(new), str(old))).rowcount
            conn.execute("COMMIT")
        finally:
            conn.close()
        return changed

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
        registered = _stored(row[0])
        if not _same(registered, path):
            raise DataSetLedgerError(_split_message(registered, self))
        return registered


def ledger_identity(location) -> Path | str:
    """How the installation's index names the ledger at ``location``: a file's real path, or for a PostgreSQL
    URL its :meth:`DatabaseIndex.identity` (server, port, database and ledger as the connection reports them;
    this connects)."""
    if not is_postgres_url(location):
        return _real(location)
    index = DatabaseIndex(location)
    try:
        return index.identity(parse_url(location)[1])
    finally:
        index.close()


def _stored(text: str) -> Path | str:
    return text if is_postgres_url(text) else Path(text)


def _split_message(registered: Path | str, home: LedgerHome) -> str:
    return (f"these records are already charged to the ledger {str(registered)!r} on this installation (index "
            f"{str(home.index_path)!r}): give --ledger {str(registered)!r}, or leave --ledger out, so that one "
            "budget covers them")


# -- the index of a PostgreSQL database (issue 25: one budget per data set across hosts) -------------------------

#: The schema of a database's data-set index, and the schema of its fingerprint key (kept apart so that an
#: auditor's role can be granted the index without the key).
INDEX_SCHEMA = "pate_accountant_index"
INDEX_KEY_SCHEMA = "pate_accountant_index_key"

_INDEX_DDL = f"""
CREATE SCHEMA {INDEX_SCHEMA};
CREATE SCHEMA {INDEX_KEY_SCHEMA};
CREATE FUNCTION {INDEX_SCHEMA}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'a data set''s registration is permanent'; END $$;
CREATE TABLE {INDEX_SCHEMA}.datasets (
    fingerprint text PRIMARY KEY,
    ledger      text NOT NULL,
    dataset     text NOT NULL,
    registered  double precision NOT NULL
);
CREATE TRIGGER datasets_permanent BEFORE UPDATE OR DELETE ON {INDEX_SCHEMA}.datasets
FOR EACH ROW EXECUTE FUNCTION {INDEX_SCHEMA}.refuse();
CREATE TRIGGER datasets_no_truncate BEFORE TRUNCATE ON {INDEX_SCHEMA}.datasets
FOR EACH STATEMENT EXECUTE FUNCTION {INDEX_SCHEMA}.refuse();
CREATE TABLE {INDEX_KEY_SCHEMA}.fingerprint_key (
    id  integer PRIMARY KEY CHECK (id = 1),
    key text NOT NULL
);
CREATE TRIGGER key_permanent BEFORE UPDATE OR DELETE ON {INDEX_KEY_SCHEMA}.fingerprint_key
FOR EACH ROW EXECUTE FUNCTION {INDEX_SCHEMA}.refuse();
CREATE TRIGGER key_no_truncate BEFORE TRUNCATE ON {INDEX_KEY_SCHEMA}.fingerprint_key
FOR EACH STATEMENT EXECUTE FUNCTION {INDEX_SCHEMA}.refuse();
"""


def ledger_url_names_ledger(url: str) -> bool:
    """Whether a ``postgresql://`` ledger URL has a ``ledger`` parameter (else the data set's index picks one)."""
    from urllib.parse import parse_qsl, urlsplit

    return any(key == "ledger" for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True))


def with_ledger_name(url: str, name: str) -> str:
    """``url`` with its ``ledger`` parameter set to ``name`` (every other part, credentials included, kept)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key != "ledger"]
    # written out by hand: urlunsplit drops the "//" of an empty host ("postgresql:///?service=..."), which libpq
    # then cannot read
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query + [('ledger', name)])}"


class DatabaseIndex:
    """The data-set index of one PostgreSQL database: which ledger of that database keeps each data set's budget,
    so that runs on any number of hosts find one ledger per data set (docs/ledger.md, "One budget per data set").

    It plays the part :class:`LedgerHome` plays on one installation, with two differences.  The fingerprint key
    is the database's (schema ``pate_accountant_index_key``, made at first use), not a user's file: every host
    that writes to the database computes the same fingerprint of the same records, which a per-host key would
    not.  And the index names ledgers of this database by name (their schema), registered once and for good
    (triggers refuse to change or remove a registration).

    ``DatabaseIndex(url)`` takes a ledger URL (its ``ledger`` parameter is ignored); it connects at the first
    call and keeps one connection until :meth:`close`.  Its errors are :class:`PateAccountantError` (a
    :class:`DataSetLedgerError` for a split budget), none of which shows a password.
    """

    def __init__(self, url: str):
        conninfo, _name, shown, self._secrets = parse_url(with_ledger_name(url, "ledger"))
        self._conninfo = conninfo
        self.location = shown.split("?", 1)[0]  # the database, as messages show it
        self._pg = _import_psycopg()
        self._conn = None
        self._ready = False
        self._key = None

    def _fail(self, exc) -> PateAccountantError:
        text = scrub_secrets(" ".join(str(exc).split()), self._secrets)
        return PateAccountantError(f"the data-set index of {self.location!r}: {text}")

    def _connection(self, create: bool = True):
        """The index's connection; with ``create``, the index is laid out first when the database has none."""
        if self._conn is None:
            pg = self._pg
            try:
                self._conn = connect(pg, self._conninfo)
            except pg.Error as exc:
                raise self._fail(exc) from None
            self._ready = False
        if create and not self._ready:
            try:
                self._create_if_missing()
            except BaseException:
                self.close()
                raise
            self._ready = True
        return self._conn

    def _create_if_missing(self) -> None:
        conn, pg = self._conn, self._pg
        try:
            if self._laid_out():
                return
            # Creators serialise on a session lock taken *before* their transaction begins: a transaction that
            # began before another creator committed can keep seeing the catalogue without its schema (cached
            # lookups), and its CREATE SCHEMA would then fail.  The first lays the index out, the others find it.
            conn.execute("SELECT pg_advisory_lock(hashtext('pate-accountant data-set index'), 1)")
            try:
                conn.execute("BEGIN")
                try:
                    if not self._laid_out():
                        conn.execute(_INDEX_DDL)
                        conn.execute(f"INSERT INTO {INDEX_KEY_SCHEMA}.fingerprint_key (id, key) VALUES (1, %s)",
                                     (secrets.token_hex(32),))
                    conn.execute("COMMIT")
                except BaseException:
                    with _suppress(pg.Error):
                        conn.execute("ROLLBACK")
                    raise
            finally:
                with _suppress(pg.Error):
                    conn.execute("SELECT pg_advisory_unlock(hashtext('pate-accountant data-set index'), 1)")
        except pg.Error as exc:
            raise self._fail(exc) from None

    def _laid_out(self) -> bool:
        found = self._conn.execute("SELECT to_regclass(%s), to_regclass(%s)",
                                   (f"{INDEX_SCHEMA}.datasets", f"{INDEX_KEY_SCHEMA}.fingerprint_key")).fetchone()
        return found[0] is not None and found[1] is not None

    def _query(self, sql: str, params=()):
        conn = self._connection()
        try:
            return conn.execute(sql, params).fetchone()
        except self._pg.Error as exc:
            raise self._fail(exc) from None

    def fingerprint_key(self) -> bytes:
        """The database's fingerprint key (32 bytes)."""
        if self._key is None:
            row = self._query(f"SELECT key FROM {INDEX_KEY_SCHEMA}.fingerprint_key WHERE id = 1")
            if row is None or not re.fullmatch(r"[0-9a-f]{64}", row[0] or ""):
                raise PateAccountantError(f"the data-set index of {self.location!r} holds no fingerprint key")
            self._key = bytes.fromhex(row[0])
        return self._key

    def fingerprint(self, records: Iterable) -> str:
        """The records' fingerprint under the database's key (:func:`dataset_fingerprint`)."""
        return dataset_fingerprint(records, key=self.fingerprint_key())

    def identity(self, name: str) -> str:
        """The ledger ``name`` of this database as the installation's own index records it: the server's address,
        port, database and ledger, no user and no password (the same whichever way the URL or ``PG*`` said it)."""
        info = self._connection(create=False).info
        # the address connected to (so "localhost" and "127.0.0.1" name one server); a Unix socket has none
        host = info.hostaddr or ("localhost" if info.host.startswith("/") else info.host)
        return f"postgresql://{host}:{info.port}/{info.dbname}?ledger={name}"

    def lookup(self, fingerprint: str) -> str | None:
        """The name of the ledger registered for ``fingerprint``, or ``None``."""
        row = self._query(f"SELECT ledger FROM {INDEX_SCHEMA}.datasets WHERE fingerprint = %s", (fingerprint,))
        return None if row is None else row[0]

    def check(self, fingerprint: str, name: str | None) -> str | None:
        """The registered ledger's name (or ``None``); :class:`DataSetLedgerError` when ``name`` is another."""
        registered = self.lookup(fingerprint)
        if registered is not None and name is not None and registered != name:
            raise DataSetLedgerError(self._split_message(registered))
        return registered

    def register(self, fingerprint: str, dataset: str, name: str) -> str:
        """Register ``name`` as the ledger of ``fingerprint`` unless one is registered (of two hosts racing, the
        first wins); :class:`DataSetLedgerError` when the registered one is another."""
        self._query(f"INSERT INTO {INDEX_SCHEMA}.datasets (fingerprint, ledger, dataset, registered) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (fingerprint) DO NOTHING RETURNING ledger",
                    (fingerprint, name, dataset, time.time()))
        registered = self.lookup(fingerprint)
        if registered != name:
            raise DataSetLedgerError(self._split_message(registered))
        return registered

    def entries(self) -> list[dict]:
        """Every registration, oldest first: ``{"ledger", "dataset", "registered"}`` (the ledger's name in this
        database); ``[]`` when the database has no index.  Read-only: nothing is created, and the key is not read."""
        conn = self._connection(create=False)
        try:
            if not self._laid_out():
                return []
            rows = conn.execute(f"SELECT ledger, dataset, registered FROM {INDEX_SCHEMA}.datasets "
                                "ORDER BY registered, ledger").fetchall()
        except self._pg.Error as exc:
            raise self._fail(exc) from None
        return [{"ledger": ledger, "dataset": dataset, "registered": registered}
                for ledger, dataset, registered in rows]

    @staticmethod
    def default_name(dataset: str, fingerprint: str) -> str:
        """The ledger name a data set gets when the URL names none: ``<name>_<12 hex of its fingerprint>``."""
        slug = re.sub(r"[^a-z0-9_]+", "_", dataset.lower()).strip("_")[:37] or "dataset"
        if not re.match(r"[a-z_]", slug) or slug.startswith("pg_"):
            slug = "d_" + slug[:35]
        return f"{slug}_{fingerprint.removeprefix(_PREFIX)[:12]}"

    def _split_message(self, registered: str) -> str:
        return (f"these records are already charged to the ledger {registered!r} of {self.location!r} (its data-set "
                f"index): give ledger={registered} in the URL, or leave the ledger parameter out, so that one budget "
                "covers them")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with _suppress(Exception):
                conn.close()


def ledger_name_of(url: str) -> str | None:
    """The ledger a ``postgresql://`` URL names by its ``ledger`` parameter, or ``None`` when it has none (then
    :class:`DatabaseIndex` picks the data set's); a :class:`PateAccountantError` for an invalid name."""
    if not ledger_url_names_ledger(url):
        return None
    return parse_url(url)[1]
