"""One budget per data set on an installation: the data set's fingerprint and the ledger home (docs/ledger.md,
"One budget per data set").

A ledger keeps a budget, but nothing in a ledger file ties it to the records it protects: three ledgers for one
data set would spend three budgets while each reports its own.  This module ties them on one installation:

* Each record has an **identity** (:func:`record_identities`): a keyed hash (HMAC-SHA256, 128 bits kept) of its
  text after normalisation (:func:`normalise_text`: Unicode NFKC, case folded, every run of whitespace one
  space, none at either end), under a secret key of this installation (:func:`fingerprint_key`, a file of the
  user's configuration folder readable by its owner only).  Only the text counts, never a label or the file's
  format, so the same texts read with or without ``--label-field``, from JSON lines or CSV, with a trailing
  space or in another Unicode form, are the same records.
* :func:`dataset_fingerprint` is a keyed hash of the set of its records' identities (so neither the order of
  the records nor a duplicated record changes it).  Without the key neither says anything about the records (no
  one can test a guess), so the fingerprint may be stored in the shareable ledger.
* :class:`LedgerHome` is a folder of the user's data folder with an index (SQLite) from fingerprints and from
  record identities to the ledger that keeps each data set's budget, and the default place of those ledgers.  A
  run looks its records up there: a data set that shares **any** record with a registered one is charged to that
  one's ledger (and its new records are registered to it: the data set grew), a run that names another ledger
  for it is refused, and records spread over two ledgers' data sets are refused (one run cannot be charged to two
  budgets).

A PostgreSQL ledger's database keeps an index of its own (:class:`DatabaseIndex`), with a key of its own, so
runs on any host that write to that database find one ledger per data set; such a run is also entered in the
installation's index (under the installation's key, naming the database ledger by its :meth:`DatabaseIndex.identity`),
so that the same records are not charged to a file on this installation as well.

What this cannot catch: a data set none of whose records' normalised texts was seen before (every record
edited beyond whitespace, case and Unicode form: a paraphrase is another record); another machine or another user
account that charges the records to a file (another key and index) rather than to the shared database; a
program that opens :class:`~pate_accountant.ledger.Ledger` files itself, without :meth:`LedgerHome.open_ledger`
(the documented way for people who manage budgets themselves).

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
import unicodedata
from collections.abc import Iterable, Mapping
from contextlib import suppress as _suppress
from pathlib import Path

import attr

from pate_accountant._ledger.postgres_store import _import_psycopg, connect, is_postgres_url, parse_url, scrub_secrets
from pate_accountant.errors import PateAccountantError
from pate_accountant.ledger import Ledger
from pate_accountant.serialization import canonical_json

__all__ = [
    "CONFIG_ENV",
    "DataSetIdentity",
    "DataSetLedgerError",
    "DatabaseIndex",
    "HOME_ENV",
    "LedgerHome",
    "config_dir",
    "dataset_fingerprint",
    "fingerprint_key",
    "home_dir",
    "ledger_identity",
    "normalise_text",
    "record_identities",
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


_WHITESPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """A record's text as its identity reads it: Unicode NFKC (so composed and decomposed accents, full-width
    letters and ligatures are one), case folded, every run of whitespace one space, none at either end."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


#: The record fields tried, in order, for a record's text when no ``text_key`` is given.
_TEXT_KEYS = ("text", "instruction")


def record_text(record, text_key: str | None = None) -> str:
    """The text a record is known by: a string record itself; a mapping's ``text_key`` field (else ``text``, else
    Dolly's ``instruction``); any other record its canonical JSON."""
    if isinstance(record, str):
        return record
    if isinstance(record, Mapping):
        for name in (text_key, *_TEXT_KEYS):
            if name is not None and isinstance(record.get(name), str):
                return record[name]
    return canonical_json(record)


def _record_identity(key: bytes, text: str) -> str:
    digest = hmac.new(key, b"pate-accountant record\n" + normalise_text(text).encode("utf-8"), hashlib.sha256)
    return digest.hexdigest()[:32]


def record_identities(records: Iterable, key: bytes | None = None, *, text_key: str | None = None) -> frozenset:
    """The set of the records' identities (32 hex digits each: 128 bits of HMAC-SHA256 of the normalised text,
    :func:`normalise_text`, under ``key``, default :func:`fingerprint_key`).  Equal texts up to whitespace, case
    and Unicode form have one identity; a label or any other field never counts (:func:`record_text`)."""
    key = fingerprint_key() if key is None else key
    return frozenset(_record_identity(key, record_text(record, text_key)) for record in records)


def dataset_fingerprint(records: Iterable, key: bytes | None = None, *, text_key: str | None = None) -> str:
    """``"hmac-sha256:<64 hex digits>"``: the keyed hash of the set of the records' identities
    (:func:`record_identities`), the same for the same records in any order, duplicated or not, with or without
    their labels.  ``key`` defaults to :func:`fingerprint_key`."""
    key = fingerprint_key() if key is None else key
    return _fingerprint_of(record_identities(records, key, text_key=text_key), key)


def _fingerprint_of(identities: frozenset, key: bytes) -> str:
    if not identities:
        raise ValueError("records: a data set without records has no fingerprint")
    digest = hmac.new(key, b"pate-accountant data set\n" + "\n".join(sorted(identities)).encode("ascii"),
                      hashlib.sha256)
    return _PREFIX + digest.hexdigest()


def _legacy_fingerprint(records: list, key: bytes) -> str:
    """The fingerprint versions before record identities gave a data set (the exact canonical records, sorted):
    looked up too, so that a data set registered then keeps its ledger."""
    lines = sorted(canonical_json(record) for record in records)
    digest = hmac.new(key, b"pate-accountant data set\n" + "\n".join(lines).encode("utf-8"), hashlib.sha256)
    return _PREFIX + digest.hexdigest()


def _fingerprints(identity) -> list[str]:
    """The fingerprints an index looks ``identity`` up by: a bare fingerprint, or a :class:`DataSetIdentity`'s own
    and the legacy one (when there is one)."""
    return [identity] if isinstance(identity, str) else [f for f in (identity.fingerprint, identity.legacy) if f]


def _one_ledger(owners: dict, identity, index: str, describe=lambda ledger: ""):
    """The one ledger of ``owners`` (``{ledger: records it shares}``), or ``None``; :class:`DataSetLedgerError`
    naming each ledger (``describe(ledger)`` before its count) when the records are spread over two or more:
    one run cannot be charged to two budgets.  ``index`` says which index (for the message)."""
    if len(owners) > 1:
        total = 0 if isinstance(identity, str) else len(identity.records)
        listed = "; ".join(f"{ledger!r} ({describe(ledger)}{count} of these {total} records)"
                           for ledger, count in sorted(owners.items()))
        raise DataSetLedgerError(f"these records are charged to {len(owners)} ledgers {index}: {listed}; one run "
                                 "cannot be charged to two budgets (run on the records of one data set)")
    return next(iter(owners), None)


@attr.s(frozen=True, repr=False)
class DataSetIdentity:
    """What an index knows a data set by, under one key: its ``fingerprint`` (:func:`dataset_fingerprint`), the
    ``records``' identities (:func:`record_identities`) and the fingerprint earlier versions gave it (``legacy``).
    ``repr`` shows the fingerprint and the number of records only."""

    fingerprint: str = attr.ib()
    records: frozenset = attr.ib()
    legacy: str | None = attr.ib(default=None)

    @classmethod
    def of(cls, records: Iterable, key: bytes, *, text_key: str | None = None) -> DataSetIdentity:
        records = list(records)
        identities = record_identities(records, key, text_key=text_key)
        return cls(_fingerprint_of(identities, key), identities, _legacy_fingerprint(records, key))

    def __repr__(self):
        return f"DataSetIdentity({self.fingerprint}, {len(self.records)} records)"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:60] or "dataset"


def _real(location) -> Path | str:
    """A ledger's identity in the index: a file's real path, or a database ledger's :meth:`DatabaseIndex.identity`."""
    return location if is_postgres_url(location) else Path(os.path.realpath(os.fspath(location)))


def _same(a, b) -> bool:
    return _real(a) == _real(b)


class LedgerHome:
    """The index of this installation's data sets (fingerprints and record identities -> the ledger keeping their
    budget) and the default folder of their ledgers, in ``root`` (default :func:`home_dir`).

    The look-ups take a :class:`DataSetIdentity` (:meth:`identify`: the fingerprint and every record's identity)
    or, as before record identities existed, a bare fingerprint string (matched exactly)."""

    def __init__(self, root=None, key_folder=None):
        self.root = Path(root) if root is not None else home_dir()
        self._key_folder = key_folder

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_FILE

    def prepare(self) -> None:
        """Create the home and its ``ledgers`` folder (mode 0700) when missing."""
        _private_folder(self.root / "ledgers")

    def identify(self, records: Iterable, *, text_key: str | None = None) -> DataSetIdentity:
        """The records' :class:`DataSetIdentity` under this installation's key (:func:`fingerprint_key`)."""
        return DataSetIdentity.of(records, fingerprint_key(self._key_folder), text_key=text_key)

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
            conn.execute("CREATE TABLE IF NOT EXISTS records (identity TEXT PRIMARY KEY, ledger TEXT NOT NULL) "
                         "WITHOUT ROWID")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(datasets)")}
            if "reach" not in columns:  # an index from before database ledgers were reached by their URL
                conn.execute("ALTER TABLE datasets ADD COLUMN reach TEXT")
        return conn

    @staticmethod
    def _owners(conn: sqlite3.Connection, identity) -> dict:
        """``{ledger as stored: records it shares}`` of every ledger that ``identity`` (a :class:`DataSetIdentity`
        or a fingerprint) is registered to: by its fingerprint (or the legacy one), or by any of its records."""
        found: dict = {}
        for fingerprint in _fingerprints(identity):
            for (ledger,) in _tolerant(conn, "SELECT ledger FROM datasets WHERE fingerprint = ?", (fingerprint,)):
                found.setdefault(ledger, 0)
        if not isinstance(identity, str):
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS probe (identity TEXT PRIMARY KEY) WITHOUT ROWID")
            conn.execute("DELETE FROM probe")
            conn.executemany("INSERT INTO probe (identity) VALUES (?)", ((i,) for i in sorted(identity.records)))
            for ledger, count in _tolerant(conn, "SELECT r.ledger, COUNT(*) FROM records r JOIN probe p "
                                                 "ON r.identity = p.identity GROUP BY r.ledger"):
                found[ledger] = found.get(ledger, 0) + count
        return found

    def _names(self, conn: sqlite3.Connection, ledger: str) -> str:
        rows = _tolerant(conn, "SELECT dataset FROM datasets WHERE ledger = ? ORDER BY registered", (ledger,))
        return ", ".join(dict.fromkeys(repr(name) for (name,) in rows)) or "(no name)"

    def _single(self, conn, identity):
        """The one ledger ``identity`` belongs to (stored text), or ``None``; :class:`DataSetLedgerError` when its
        records are spread over the data sets of two or more ledgers."""
        return _one_ledger(self._owners(conn, identity), identity,
                           f"on this installation (index {str(self.index_path)!r})",
                           lambda ledger: f"data set {self._names(conn, ledger)}: ")

    def lookup(self, identity) -> Path | str | None:
        """The ledger registered for ``identity`` (a :class:`DataSetIdentity` or a fingerprint; a path, or a
        PostgreSQL ledger's identity URL), or ``None``; nothing is created.  :class:`DataSetLedgerError` when the
        records are spread over two ledgers' data sets."""
        conn = self._connect(write=False)
        if conn is None:
            return None
        try:
            found = self._single(conn, identity)
        finally:
            conn.close()
        return None if found is None else _stored(found)

    def _read(self, sql: str, params=()) -> list:
        """The rows of one query on the index; none when there is no index yet (nothing is created)."""
        conn = self._connect(write=False)
        if conn is None:
            return []
        try:
            return _tolerant(conn, sql, params)
        finally:
            conn.close()

    def entries(self) -> list[dict]:
        """Every registration, oldest first: ``{"ledger", "dataset", "registered"}`` (a path, or a PostgreSQL
        ledger's identity URL; the data set's name; seconds since the epoch).  Fingerprints are left out."""
        rows = self._read("SELECT ledger, dataset, registered FROM datasets ORDER BY registered, ledger")
        return [{"ledger": _stored(ledger), "dataset": dataset, "registered": registered}
                for ledger, dataset, registered in rows]

    def check(self, identity, ledger_path) -> Path | str | None:
        """The registered ledger of ``identity`` when it is ``ledger_path`` or none is registered (``None``);
        :class:`DataSetLedgerError` naming the registered ledger when ``ledger_path`` is another one (a file, or a
        PostgreSQL ledger's :meth:`DatabaseIndex.identity`), and when the records are spread over two."""
        registered = self.lookup(identity)
        if registered is not None and ledger_path is not None and not _same(registered, ledger_path):
            raise DataSetLedgerError(self._split_message(registered, identity))
        return registered

    def moved(self, old, new, *, reach: str | None = None) -> int:
        """The data sets registered to the ledger ``old`` are registered to ``new`` instead (a path or a
        PostgreSQL ledger's :meth:`DatabaseIndex.identity`, as :func:`ledger_identity` gives them): what
        ``ledger copy`` does once a copy verifies with the same heads, so that the records' next runs charge the
        copy, which continues the same budget, and a run naming the old ledger is refused.  Returns how many data
        sets were re-registered (``0`` when the index names ``old`` for none, or there is no index).  ``reach``:
        for a database ledger ``new``, the URL without its password that reaches it (:meth:`reach`)."""
        if not self.index_path.is_file():
            return 0
        conn = self._connect(write=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            changed = conn.execute("UPDATE datasets SET ledger = ?, reach = ? WHERE ledger = ?",
                                   (str(new), reach, str(old))).rowcount
            conn.execute("UPDATE records SET ledger = ? WHERE ledger = ?", (str(new), str(old)))
            conn.execute("COMMIT")
        finally:
            conn.close()
        return changed

    def reach(self, registered) -> str | None:
        """How this installation reaches the database ledger ``registered`` (its identity URL): the URL a run
        gave when it registered it, user, host and parameters included and no password (libpq's password file,
        ``PGPASSWORD`` or a service file supply that), or ``None`` when none was recorded (registered by an
        earlier version)."""
        rows = self._read("SELECT reach FROM datasets WHERE ledger = ? AND reach IS NOT NULL ORDER BY registered DESC "
                          "LIMIT 1", (str(registered),))
        return rows[0][0] if rows else None

    def register(self, identity, dataset: str, ledger_path, *, reach: str | None = None) -> Path:
        """Record ``ledger_path`` as the ledger of ``identity`` (its fingerprint and every record's identity: a
        data set that grew registers its new records to the ledger that already had its others) unless its records
        belong to another ledger already (one write transaction, so of two runs racing the first wins); returns
        the registered ledger.  :class:`DataSetLedgerError` when that is another one; nothing is written then.
        ``reach``: for a database ledger, the URL (without its password) that reaches it (:meth:`reach`)."""
        path = _real(ledger_path)
        fingerprint = identity if isinstance(identity, str) else identity.fingerprint
        conn = self._connect(write=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                registered = self._single(conn, identity)
                if registered is not None and not _same(_stored(registered), path):
                    raise DataSetLedgerError(self._split_message(_stored(registered), identity))
                conn.execute("INSERT OR IGNORE INTO datasets (fingerprint, ledger, dataset, registered, reach) "
                             "VALUES (?, ?, ?, ?, ?)", (fingerprint, str(path), dataset, time.time(), reach))
                if reach is not None:
                    conn.execute("UPDATE datasets SET reach = ? WHERE ledger = ?", (reach, str(path)))
                if not isinstance(identity, str):
                    conn.executemany("INSERT OR IGNORE INTO records (identity, ledger) VALUES (?, ?)",
                                     ((i, str(path)) for i in sorted(identity.records)))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return path

    def open_ledger(self, records: Iterable, dataset: str, *, location=None, text_key: str | None = None):
        """The one ledger of ``records`` on this installation, opened for writing and registered: the ledger
        their data set (or any data set sharing a record with them) is registered to, else ``location`` (a file;
        default :meth:`default_path`), created if missing and named ``dataset``.  What ``generate`` does, for
        Python code that charges an accountant itself (docs/ledger.md, "One budget per data set").
        :class:`DataSetLedgerError` when ``location`` names another ledger than the registered one."""
        identity = self.identify(records, text_key=text_key)
        registered = self.check(identity, location)
        if is_postgres_url(registered or ""):
            raise DataSetLedgerError(f"these records are charged to the database ledger {registered!r}: open it with "
                                     "Ledger.open(URL) and register through its database's index")
        self.prepare()
        path = Path(location if location is not None else registered or self.default_path(dataset, identity.fingerprint))
        ledger = Ledger.open(path)
        try:
            ledger.set_dataset(dataset)
            self.register(identity, dataset, path)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def _split_message(self, registered: Path | str, identity) -> str:
        """Which ledger holds these records and how it was registered (its data sets' names and dates)."""
        held = [e for e in self.entries() if _same(e["ledger"], registered)]
        how = "; ".join(f"registered for the data set {e['dataset']!r} on "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(e['registered']))}" for e in held[:3])
        return _split_message(registered, self, how)


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


def _tolerant(conn: sqlite3.Connection, sql: str, params=()) -> list:
    """The rows of ``sql``; none when its table does not exist (an index written before it had the table)."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc) or "no such column" in str(exc):
            return []
        raise


def _split_message(registered: Path | str, home: LedgerHome, how: str = "") -> str:
    how = f"; {how}" if how else ""
    return (f"these records (or some of them) are already charged to the ledger {str(registered)!r} on this "
            f"installation (index {str(home.index_path)!r}{how}): give --ledger {str(registered)!r}, or leave "
            "--ledger out, so that one budget covers them")


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

#: The records' identities (issue 31: a data set sharing records with a registered one is charged to its ledger);
#: added to an index laid out before it existed.
_RECORDS_DDL = f"""
CREATE TABLE {INDEX_SCHEMA}.records (
    identity text PRIMARY KEY,
    ledger   text NOT NULL
);
CREATE TRIGGER records_permanent BEFORE UPDATE OR DELETE ON {INDEX_SCHEMA}.records
FOR EACH ROW EXECUTE FUNCTION {INDEX_SCHEMA}.refuse();
CREATE TRIGGER records_no_truncate BEFORE TRUNCATE ON {INDEX_SCHEMA}.records
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
            if self._laid_out() and self._has_records():
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
                    if not self._has_records():
                        conn.execute(_RECORDS_DDL)
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

    def _has_records(self) -> bool:
        return self._conn.execute("SELECT to_regclass(%s)", (f"{INDEX_SCHEMA}.records",)).fetchone()[0] is not None

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

    def fingerprint(self, records: Iterable, *, text_key: str | None = None) -> str:
        """The records' fingerprint under the database's key (:func:`dataset_fingerprint`)."""
        return dataset_fingerprint(records, key=self.fingerprint_key(), text_key=text_key)

    def identify(self, records: Iterable, *, text_key: str | None = None) -> DataSetIdentity:
        """The records' :class:`DataSetIdentity` under the database's key."""
        return DataSetIdentity.of(records, self.fingerprint_key(), text_key=text_key)

    def _owners(self, identity) -> dict:
        """``{ledger name: records it shares}`` of every ledger ``identity`` (a :class:`DataSetIdentity` or a
        fingerprint) is registered to in this database, by fingerprint (or the legacy one) or by any record."""
        conn = self._connection()
        found: dict = {}
        try:
            for fingerprint in _fingerprints(identity):
                for (ledger,) in conn.execute(f"SELECT ledger FROM {INDEX_SCHEMA}.datasets WHERE fingerprint = %s",
                                              (fingerprint,)).fetchall():
                    found.setdefault(ledger, 0)
            if not isinstance(identity, str):
                rows = conn.execute(f"SELECT ledger, count(*) FROM {INDEX_SCHEMA}.records WHERE identity = ANY(%s) "
                                    "GROUP BY ledger", (sorted(identity.records),)).fetchall()
                for ledger, count in rows:
                    found[ledger] = found.get(ledger, 0) + int(count)
        except self._pg.Error as exc:
            raise self._fail(exc) from None
        return found

    def _single(self, identity) -> str | None:
        return _one_ledger(self._owners(identity), identity, f"of {self.location!r} (its data-set index)")

    def identity(self, name: str) -> str:
        """The ledger ``name`` of this database as the installation's own index records it: the server's address,
        port, database and ledger, no user and no password (the same whichever way the URL or ``PG*`` said it)."""
        info = self._connection(create=False).info
        # the address connected to (so "localhost" and "127.0.0.1" name one server); a Unix socket has none
        host = info.hostaddr or ("localhost" if info.host.startswith("/") else info.host)
        return f"postgresql://{host}:{info.port}/{info.dbname}?ledger={name}"

    def lookup(self, identity) -> str | None:
        """The name of the ledger registered for ``identity`` (a :class:`DataSetIdentity` or a fingerprint), or
        ``None``; :class:`DataSetLedgerError` when the records are spread over two ledgers' data sets."""
        return self._single(identity)

    def check(self, identity, name: str | None) -> str | None:
        """The registered ledger's name (or ``None``); :class:`DataSetLedgerError` when ``name`` is another."""
        registered = self.lookup(identity)
        if registered is not None and name is not None and registered != name:
            raise DataSetLedgerError(self._split_message(registered))
        return registered

    def register(self, identity, dataset: str, name: str) -> str:
        """Register ``name`` as the ledger of ``identity`` (its fingerprint and every record's identity) unless its
        records belong to another ledger (one transaction, serialised across hosts by an advisory lock, so of two
        hosts racing the first wins and nothing of the second is written); :class:`DataSetLedgerError` when the
        registered one is another."""
        conn, pg = self._connection(), self._pg
        fingerprint = identity if isinstance(identity, str) else identity.fingerprint
        try:
            conn.execute("BEGIN")
            try:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('pate-accountant data-set index'), 2)")
                registered = self._single(identity)
                if registered is not None and registered != name:
                    raise DataSetLedgerError(self._split_message(registered))
                conn.execute(f"INSERT INTO {INDEX_SCHEMA}.datasets (fingerprint, ledger, dataset, registered) "
                             "VALUES (%s, %s, %s, %s) ON CONFLICT (fingerprint) DO NOTHING",
                             (fingerprint, name, dataset, time.time()))
                if not isinstance(identity, str):
                    conn.execute(f"INSERT INTO {INDEX_SCHEMA}.records (identity, ledger) SELECT unnest(%s::text[]), %s "
                                 "ON CONFLICT (identity) DO NOTHING", (sorted(identity.records), name))
                conn.execute("COMMIT")
            except BaseException:
                with _suppress(pg.Error):
                    conn.execute("ROLLBACK")
                raise
        except pg.Error as exc:
            raise self._fail(exc) from None
        return name

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
