"""A PostgreSQL ledger's layout: its two schemas, their tables and triggers, and how a ledger is created and
recognised (:class:`PostgresLayout`, a part of :class:`~.postgres_store.PostgresStore`).

A ledger ``NAME`` keeps its **shareable** part in schema ``NAME`` (tables ``meta``, ``charges``, ``runs``,
``head``) and its **confidential** part in schema ``NAME_confidential`` (``meta``, ``charges``, ``totals``,
``head``), with the columns of the SQLite files (``bigint``, ``double precision``, ``text``: psycopg returns
``int``, ``float`` and ``str`` exactly as stored, which the hashes need).  So an operator can grant an auditor's
role ``USAGE`` on the shareable schema and ``SELECT`` on its tables, and nothing on the confidential one.
Triggers keep the rows and runs append-only and freeze the metadata once rows exist.

Creating.  A new ledger is both its schema and its tables, made in one transaction (PostgreSQL's DDL is
transactional): another connection sees all of it or none.  Creators of the same name are serialised by a
transaction-level advisory lock (``pg_advisory_xact_lock(h, 1)``, ``h`` a hash of the name), so one creates and
the others open what it made.  A schema that exists is one of our ledgers only when it has our tables and
the ``schema_version`` we write; anything else is refused and left as it is.

:class:`PostgresLayout` is a mixin of the store: it makes its statements through the store's connection
(:class:`~.postgres_connection.PostgresConnection`: ``_execute``, ``_doing``, ``_rollback``), reads the shareable
metadata through ``meta()`` and keeps the store's flags (``_creating``, ``_laid_out``, ``_conf_open``,
``_conf_created_here``, ``_created_here``).
"""

from __future__ import annotations

import json

from pate_accountant._ledger.errors import LedgerError, _Discarded
from pate_accountant._ledger.postgres_url import _CONF_SUFFIX
from pate_accountant._ledger.sqlite_files import DISCARDED_KEY
from pate_accountant._ledger.store import LEDGER_TABLES, SCHEMA_VERSION, check_confidential_meta

#: The tables every confidential schema has.
CONFIDENTIAL_TABLES = frozenset({"meta", "charges", "totals", "head"})

# The columns of the rows, runs and confidential rows, in the orders of the codec (ROW_FIELDS, RUN_FIELDS,
# CONF_FIELDS).
_ROW_COLUMNS = ("id, prev_hash, hash, event, count, outcome, commitment, spent_epsilon, spent_delta, created, "
                "writer, run, grp")
_RUN_COLUMNS = "id, prev_hash, hash, first_row, metadata, created, writer"
_CONF_COLUMNS = "id, prev_hash, hash, share_row, share_hash, salt, charged_teachers"

# Trigger functions of each schema: refuse a change (TG_ARGV[0] says which), and freeze the metadata once rows
# exist (the head is read from the schema of the table the trigger fires on).
_FUNCTIONS = """
CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$;
CREATE FUNCTION {s}.meta_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  EXECUTE format('SELECT row_count FROM %I.head WHERE id = 1', TG_TABLE_SCHEMA) INTO n;
  IF n > 0 THEN RAISE EXCEPTION 'ledger metadata is frozen once rows exist'; END IF;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END $$;
CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL);
"""

_SCHEMA = _FUNCTIONS + """
CREATE TABLE {s}.charges (
    id            bigint PRIMARY KEY,
    prev_hash     text NOT NULL,
    hash          text NOT NULL,
    event         text NOT NULL,
    count         bigint NOT NULL,
    outcome       text,
    commitment    text,
    spent_epsilon double precision,
    spent_delta   double precision,
    created       double precision NOT NULL,
    writer        text NOT NULL,
    run           bigint,
    grp           bigint
);
CREATE TABLE {s}.runs (
    id        bigint PRIMARY KEY,
    prev_hash text NOT NULL,
    hash      text NOT NULL,
    first_row bigint NOT NULL,
    metadata  text NOT NULL,
    created   double precision NOT NULL,
    writer    text NOT NULL
);
CREATE TABLE {s}.head (
    id            bigint PRIMARY KEY CHECK (id = 1),
    row_count     bigint NOT NULL,
    last_hash     text,
    run_count     bigint NOT NULL,
    run_last_hash text
);
INSERT INTO {s}.head (id, row_count, last_hash, run_count, run_last_hash) VALUES (1, 0, NULL, 0, NULL);
CREATE TRIGGER charges_append_only BEFORE UPDATE OR DELETE ON {s}.charges
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('ledger rows are append-only');
CREATE TRIGGER charges_no_truncate BEFORE TRUNCATE ON {s}.charges
FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse('ledger rows are append-only');
CREATE TRIGGER runs_append_only BEFORE UPDATE OR DELETE ON {s}.runs
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('ledger runs are append-only');
CREATE TRIGGER runs_no_truncate BEFORE TRUNCATE ON {s}.runs
FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse('ledger runs are append-only');
CREATE TRIGGER meta_frozen BEFORE UPDATE OR DELETE ON {s}.meta
FOR EACH ROW EXECUTE FUNCTION {s}.meta_frozen();
"""

_CONFIDENTIAL_SCHEMA = _FUNCTIONS + """
CREATE TABLE {s}.charges (
    id               bigint PRIMARY KEY,
    prev_hash        text NOT NULL,
    hash             text NOT NULL,
    share_row        bigint NOT NULL,
    share_hash       text NOT NULL,
    salt             text NOT NULL,
    charged_teachers text NOT NULL
);
CREATE TABLE {s}.totals (
    share_row     bigint PRIMARY KEY,
    share_hash    text NOT NULL,
    spent_epsilon double precision NOT NULL,
    spent_delta   double precision NOT NULL
);
CREATE TABLE {s}.head (
    id        bigint PRIMARY KEY CHECK (id = 1),
    row_count bigint NOT NULL,
    last_hash text
);
INSERT INTO {s}.head (id, row_count, last_hash) VALUES (1, 0, NULL);
CREATE TRIGGER charges_append_only BEFORE UPDATE ON {s}.charges
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('confidential rows are append-only');
CREATE TRIGGER totals_append_only BEFORE UPDATE ON {s}.totals
FOR EACH ROW EXECUTE FUNCTION {s}.refuse('confidential totals are append-only');
"""


class PostgresLayout:
    """The layout half of :class:`~.postgres_store.PostgresStore` (see the module docstring)."""

    # -- creating -----------------------------------------------------------------------------------------------
    def _lock_key(self) -> str:
        return f"pate-accountant ledger {self._name}"

    def _schema_exists(self, schema: str) -> bool:
        return self._execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None

    def _create_if_missing(self, layout) -> None:
        if self._schema_exists(self._name):
            return
        self._execute("BEGIN")
        try:
            self._execute("SELECT pg_advisory_xact_lock(hashtext(%s), 1)", (self._lock_key(),))
            if self._schema_exists(self._name):  # another creator was first: open what it made
                self._execute("ROLLBACK")
                return
            self._execute(f"CREATE SCHEMA {self._schema}")
            self._creating = True
            layout(create=True)
            self._execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        finally:
            self._creating = False
        self._created_here = True

    # -- layout -----------------------------------------------------------------------------------------------
    def check_layout(self, *, create: bool, initial_meta) -> None:
        """Inside the creation transaction (``create``): lay the tables out and store ``initial_meta()``.
        Otherwise check that the schema is one of our ledgers of :data:`SCHEMA_VERSION`."""
        if self._creating:
            if create:
                self._run_script(_SCHEMA, self._schema)
                for key, text in initial_meta().items():
                    self._execute(f"INSERT INTO {self._schema}.meta (key, value) VALUES (%s, %s) "
                                  "ON CONFLICT (key) DO NOTHING", (key, text))
            return
        if self._laid_out and create:
            return
        with self._doing("cannot read the PostgreSQL ledger {where}"):
            tables = self.tables()
            if not tables:
                raise LedgerError(f"{self._location!r}: schema {self._name!r} has no tables, so it is not a "
                                  "pate-accountant ledger; it was left unchanged")
            if not LEDGER_TABLES <= tables:
                raise LedgerError(f"{self._location!r}: schema {self._name!r} is not a pate-accountant ledger "
                                  f"(tables {sorted(LEDGER_TABLES - tables)} missing); it was left unchanged")
            meta = dict(self._execute(f"SELECT key, value FROM {self._schema}.meta"))
        if meta.get(DISCARDED_KEY):
            raise _Discarded()
        version = meta.get("schema_version")
        try:
            version_value = json.loads(version) if version is not None else None
        except ValueError:
            version_value = version
        if version_value != SCHEMA_VERSION:
            raise LedgerError(f"{self._location!r}: schema {self._name!r} is not a pate-accountant ledger of schema "
                              f"version {SCHEMA_VERSION} (found {version}); it was left unchanged")
        self._laid_out = True

    def _run_script(self, script: str, schema: str) -> None:
        # Without parameters psycopg sends the script as one simple query: all its statements, in the open transaction.
        self._execute(script.format(s=schema))

    def tables(self) -> set:
        return self._tables_of(self._name)

    def _tables_of(self, schema: str) -> set:
        return {row[0] for row in self._execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')", (schema,))}

    # -- the confidential schema ------------------------------------------------------------------------------
    def open_confidential(self, *, create: bool, initial_meta) -> bool:
        """Open the confidential schema (creating it, in one transaction, when ``create`` and the store is
        writable); ``False`` when it does not exist and is not to be created, or when this role may not read it
        (an auditor granted the shareable schema only reads the confidential part as absent)."""
        if self._conf_open:
            return True
        pg = self._pg
        schema = self._name + _CONF_SUFFIX
        where = self.confidential_location
        ledger_id = self.meta().get("ledger_id")
        with self._doing("{where} is not a usable confidential ledger part", where):
            if not self._schema_exists(schema):
                if not create or self._read_only:
                    return False
                self._execute("BEGIN")
                try:
                    self._execute("SELECT pg_advisory_xact_lock(hashtext(%s), 1)", (self._lock_key(),))
                    if not self._schema_exists(schema):
                        self._execute(f"CREATE SCHEMA {self._conf_schema}")
                        self._run_script(_CONFIDENTIAL_SCHEMA, self._conf_schema)
                        for key, text in initial_meta(ledger_id).items():
                            self._execute(f"INSERT INTO {self._conf_schema}.meta (key, value) VALUES (%s, %s)",
                                          (key, text))
                        self._conf_created_here = True
                    self._execute("COMMIT")
                except BaseException:
                    self._conf_created_here = False
                    self._rollback()
                    raise
            if not self._execute("SELECT has_schema_privilege(%s, 'USAGE')", (schema,)).fetchone()[0]:
                return False
            tables = self._tables_of(schema)
            if not CONFIDENTIAL_TABLES <= tables:
                raise LedgerError(f"{where!r} is not a confidential ledger part (tables "
                                  f"{sorted(CONFIDENTIAL_TABLES - tables)} missing)")
            try:
                meta = dict(self._execute(f"SELECT key, value FROM {self._conf_schema}.meta",
                                          keep=(pg.errors.InsufficientPrivilege,)))
            except pg.errors.InsufficientPrivilege:
                return False
        check_confidential_meta(meta, ledger_id, where, "part")
        self._conf_open = True
        return True

