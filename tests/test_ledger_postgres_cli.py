"""The command line on a PostgreSQL ledger (issue 25, item 2): ``audit URL`` with pins and signed checkpoints,
``sign URL``, and ``ledger copy SRC DST`` between SQLite and PostgreSQL, against a real PostgreSQL 18 server
(tests/pg_server.py); no password of a URL in any output."""

from __future__ import annotations

import json

import pytest
from test_checkpoints import _build  # two runs of three rows each; the head record

from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.checkpoints import generate_key
from pate_accountant.cli import main
from pate_accountant.events import BetweenThresholdsEvent
from pate_accountant.ledger import Ledger
from pate_accountant.release import Release

psycopg = pytest.importorskip("psycopg")

SECRET = "pw-s3cr3t-9"


def _password_url(postgres_server, postgres_database, name="budget") -> str:
    """A URL with a password (trust authentication accepts it) for a superuser role made for the test."""
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'cli_writer'").fetchone():  # roles are per server
            conn.execute(f"CREATE ROLE cli_writer LOGIN PASSWORD '{SECRET}' SUPERUSER")
    dbname = postgres_database.rsplit("/", 1)[1]
    return postgres_server.url(user="cli_writer", dbname=dbname, password=SECRET) + f"?ledger={name}"


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert SECRET not in captured.out and SECRET not in captured.err, (captured.out, captured.err)
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return generate_key(tmp_path_factory.mktemp("keys") / "operator.key")


def test_audit_a_postgres_url_with_pins_and_no_password_shown(postgres_server, postgres_database, capsys):
    url = _password_url(postgres_server, postgres_database)
    head = _build(url)
    code, out, _ = _run(capsys, "audit", url, "--json", "--expect-head", head["head_hash"], "--expect-rows",
                        head["rows"], "--expect-run-head", head["run_head_hash"], "--expect-runs", head["runs"])
    assert code == 0, out
    payload = json.loads(out)
    assert payload["ok"] and payload["pinned"]["extends"] and payload["rows"] == 6
    assert payload["path"].endswith("?ledger=budget") and "cli_writer@" in payload["path"]
    code, out, _ = _run(capsys, "audit", url)
    assert code == 0 and "verdict     : OK" in out and head["head_hash"] in out
    in_query = url.replace(f"cli_writer:{SECRET}@", "cli_writer@") + f"&password={SECRET}"
    code, out, _ = _run(capsys, "audit", in_query, "--expect-rows", 6)
    assert code == 0 and "password" not in out
    # A pin the ledger does not extend, a ledger that is not there, a refused connection: exit 1, 3, 3.
    code, out, err = _run(capsys, "audit", url, "--expect-head", "ab" * 32)
    assert code == 1 and "NOT extended" in out
    code, out, err = _run(capsys, "audit", url.replace("ledger=budget", "ledger=absent"))
    assert code == 3 and "CANNOT CHECK" in out
    code, out, err = _run(capsys, "audit", url.replace(f":{postgres_server.port}/", ":1/"), "--json")
    assert code == 3 and not json.loads(out)["ok"]
    code, out, err = _run(capsys, "audit", url, "--confidential", "x.sqlite")
    assert code == 2 and "--confidential" in err


def test_sign_and_audit_signed_checkpoints_on_a_postgres_url(postgres_server, postgres_database, capsys, key,
                                                              tmp_path):
    url = _password_url(postgres_server, postgres_database)
    _build(url)
    checkpoints = tmp_path / "budget.checkpoints.jsonl"
    code, _, err = _run(capsys, "sign", url, "--key", key[0])  # no file beside a URL to default to
    assert code == 2 and "--checkpoints" in err
    code, out, _ = _run(capsys, "sign", url, "--key", key[0], "--checkpoints", checkpoints)
    assert code == 0 and "6 rows, 2 runs" in out and checkpoints.is_file()
    assert SECRET not in checkpoints.read_text()
    code, _, err = _run(capsys, "audit", url, "--public-key", key[1])
    assert code == 2 and "--checkpoints" in err
    code, out, _ = _run(capsys, "audit", url, "--json", "--public-key", key[1], "--checkpoints", checkpoints)
    assert code == 0, out
    assert json.loads(out)["signed"]["ok"]
    # Another key, or a ledger that no longer extends the checkpoint (a forged row): exit 1.
    other = generate_key(tmp_path / "intruder.key")
    code, out, _ = _run(capsys, "audit", url, "--public-key", other[1], "--checkpoints", checkpoints)
    assert code == 1 and "signed      : FAILED" in out
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE budget.charges DISABLE TRIGGER charges_append_only")
        conn.execute("UPDATE budget.charges SET count = 2 WHERE id = 2")
    code, out, err = _run(capsys, "audit", url, "--public-key", key[1], "--checkpoints", checkpoints)
    assert code == 1 and "FAILED" in out


def _copy(capsys, src, dst):
    code, out, err = _run(capsys, "ledger", "copy", src, dst, "--json")
    return code, json.loads(out) if out.strip() else None, err


def test_copy_sqlite_to_postgres_and_back_keeps_every_head(postgres_server, postgres_database, capsys, tmp_path,
                                                           key):
    first, back = tmp_path / "first.sqlite", tmp_path / "back.sqlite"
    head = _build(first)
    checkpoints = tmp_path / "first.checkpoints.jsonl"
    assert _run(capsys, "sign", first, "--key", key[0], "--checkpoints", checkpoints)[0] == 0
    url = _password_url(postgres_server, postgres_database, "copied")
    code, payload, err = _copy(capsys, first, url)
    assert code == 0, (payload, err)
    assert payload["ok"] and payload["same_heads"] and not payload["confidential_copied"]
    for end in payload["ends"].values():
        assert {k: end[k] for k in head} == head and end["ok"]
    code, payload, err = _copy(capsys, url, back)
    assert code == 0, (payload, err)
    for location in (first, url, back):
        with Ledger.open(location, read_only=True) as ledger:
            result = ledger.verify()
            assert result.ok, result.message
            assert ledger.head_record == head and result.rows == 6 and len(result.runs) == 2
    with Ledger.open(first, read_only=True) as a, Ledger.open(url, read_only=True) as b, \
            Ledger.open(back, read_only=True) as c:
        rows = [list(x._store.rows()) for x in (a, b, c)]
        assert [tuple(r) for r in rows[0]] == [tuple(r) for r in rows[1]] == [tuple(r) for r in rows[2]]
        assert a._store.meta() == b._store.meta() == c._store.meta()
        assert [tuple(r) for r in a._store.runs()] == [tuple(r) for r in c._store.runs()]
    # The copies are the same ledger: the checkpoint signed on the first verifies on both.
    for location in (url, back):
        code, out, _ = _run(capsys, "audit", location, "--public-key", key[1], "--checkpoints", checkpoints)
        assert code == 0, out
    code, out, _ = _run(capsys, "ledger", "copy", first, tmp_path / "text.sqlite")
    assert code == 0 and "heads       : identical" in out and head["head_hash"] in out


def test_copy_refuses_a_destination_with_rows(postgres_server, postgres_database, capsys, tmp_path):
    src, other = tmp_path / "src.sqlite", tmp_path / "other.sqlite"
    _build(src)
    _build(other, epsilons=(0.1,) * 6)
    url = _password_url(postgres_server, postgres_database, "taken")
    _build(url, epsilons=(0.2,) * 6)
    with Ledger.open(url, read_only=True) as ledger:
        before = ledger.head_record
    for dst in (url, other):
        with Ledger.open(dst, read_only=True) as ledger:
            before = ledger.head_record
        code, payload, err = _copy(capsys, src, dst)
        assert code == 1 and not payload["copied"] and "not overwritten" in err
        with Ledger.open(dst, read_only=True) as ledger:
            assert ledger.head_record == before and ledger.verify().ok
    code, _, err = _run(capsys, "ledger", "copy", tmp_path / "missing.sqlite", url)
    assert code == 2 and "SRC" in err
    code, payload, err = _copy(capsys, url, url)  # a ledger onto itself
    assert code == 1 and not payload["copied"]


def test_copy_a_ledger_with_a_confidential_part(postgres_server, postgres_database, capsys, tmp_path):
    src, back = tmp_path / "teachers.sqlite", tmp_path / "back.sqlite"
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(src) as ledger:
        acc = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
        for i in range(6):
            acc.record(Release("between", event, target_hit=i % 3 != 2, charged_teachers={i, i + 1}))
        counters = acc.counters.tolist()
        head = ledger.head_record
    url = _password_url(postgres_server, postgres_database, "teachers")
    for a, b in ((src, url), (url, back)):
        code, payload, err = _copy(capsys, a, b)
        assert code == 0, (payload, err)
        assert payload["confidential_copied"]
        assert all(end["confidential"] == "verified" for end in payload["ends"].values())
    with psycopg.connect(postgres_database) as conn:
        assert conn.execute("SELECT count(*) FROM teachers_confidential.charges").fetchone()[0] == 4
    for location in (url, back):
        with Ledger.open(location, read_only=True) as ledger:
            result = ledger.verify()
            assert result.ok and result.confidential == "verified" and ledger.head_record == head
            again = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
            assert again.counters.tolist() == counters


def _charged(location, dataset: str, charges: int) -> None:
    """A ledger of ``dataset`` with ``charges`` rows under a basic accountant of budget (10, 1e-5)."""
    from pate_accountant.accountants import BasicCompositionAccountant
    from pate_accountant.events import EpsilonDeltaEvent

    with Ledger.open(location) as ledger:
        ledger.set_dataset(dataset)
        accountant = BasicCompositionAccountant(budget=(10.0, 1e-5), ledger=ledger)
        for _ in range(charges):
            accountant.compose(EpsilonDeltaEvent(0.5))


def test_ledger_list_shows_a_databases_data_sets_without_a_password(postgres_server, postgres_database, capsys):
    from pate_accountant.ledger_home import INDEX_SCHEMA, DatabaseIndex, with_ledger_name
    from pg_server import sql

    url = _password_url(postgres_server, postgres_database)
    database = url.split("?", 1)[0]
    code, out, _ = _run(capsys, "ledger", "list", database)  # no index yet: nothing listed, nothing created
    assert code == 0 and "(0 data sets)" in out
    assert not sql(postgres_database, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (INDEX_SCHEMA,))
    index = DatabaseIndex(database)
    try:
        for name, dataset, charges in (("clinic", "clinic notes", 3), ("support", "support tickets", 1)):
            _charged(with_ledger_name(database, name), dataset, charges)
            index.register(index.fingerprint([{"text": dataset}]), dataset, name)
        index.register(index.fingerprint([{"text": "gone"}]), "gone", "refused_run")  # registered, never made
    finally:
        index.close()
    code, out, _ = _run(capsys, "ledger", "list", database, "--json")
    assert code == 0
    listed = {item["ledger"]: item for item in json.loads(out)["ledgers"]}
    assert set(listed) == {"clinic", "support", "refused_run"}
    assert listed["clinic"]["dataset"] == "clinic notes" and listed["clinic"]["rows"] == 3
    assert listed["clinic"]["budget"] == {"epsilon": 10.0, "delta": 1e-5} and listed["clinic"]["accountant"] == "basic"
    assert listed["support"]["rows"] == 1 and listed["support"]["runs"] == 0
    assert not listed["refused_run"]["readable"] and "no ledger there" in listed["refused_run"]["problem"]
    assert "hmac-sha256" not in out  # no fingerprint is shown
    code, out, _ = _run(capsys, "ledger", "list", database)
    assert code == 0 and "(3 data sets)" in out and "'clinic notes'" in out and "3 rows, 0 runs" in out


def test_ledger_list_shows_this_installations_data_sets(tmp_path, capsys):
    from pate_accountant.ledger_home import LedgerHome

    home = LedgerHome()  # the test's own (tests/conftest.py)
    kept, removed = tmp_path / "kept.sqlite", tmp_path / "removed.sqlite"
    _charged(kept, "kept", 2)
    home.register("hmac-sha256:" + "1" * 64, "kept", kept)
    home.register("hmac-sha256:" + "2" * 64, "removed", removed)
    code, out, _ = _run(capsys, "ledger", "list", "--json")
    assert code == 0
    listed = {item["dataset"]: item for item in json.loads(out)["ledgers"]}
    assert listed["kept"]["rows"] == 2 and listed["kept"]["location"] == str(kept.resolve())
    assert not listed["removed"]["readable"]
    code, out, err = _run(capsys, "ledger", "list", str(kept))
    assert code == 2 and "not a postgresql:// URL" in err


def test_copying_a_ledger_moves_its_data_sets_in_this_installations_index(postgres_server, postgres_database,
                                                                            tmp_path, capsys):
    """A ledger moved to PostgreSQL (or back) continues the same budget: the installation's index sends the
    records' next runs to the copy, and a run naming the old file for them is refused (one budget per data set)."""
    from pate_accountant.ledger_home import DataSetLedgerError, LedgerHome, ledger_identity

    home, fingerprint = LedgerHome(), "hmac-sha256:" + "3" * 64
    source = tmp_path / "moving.sqlite"
    _charged(source, "moving", 2)
    home.register(fingerprint, "moving", source)
    home.register("hmac-sha256:" + "4" * 64, "other", tmp_path / "other.sqlite")
    url = _password_url(postgres_server, postgres_database, name="moved")
    code, out, _ = _run(capsys, "ledger", "copy", source, url, "--json")
    assert code == 0 and json.loads(out)["reindexed"] == 1
    assert home.lookup(fingerprint) == ledger_identity(url) == f"postgresql://{url.split('@', 1)[1]}"  # no user
    with pytest.raises(DataSetLedgerError, match="moved"):
        home.check(fingerprint, source)  # the old file: refused for these records
    assert home.lookup("hmac-sha256:" + "4" * 64) == (tmp_path / "other.sqlite").resolve()  # others untouched
    back = tmp_path / "back.sqlite"
    code, out, _ = _run(capsys, "ledger", "copy", url, back)
    assert code == 0 and "1 data set(s) this installation charged to the source now charge the destination" in out
    assert home.lookup(fingerprint) == back.resolve()


def test_the_remaining_budget_is_told_one_way_on_a_postgres_ledger(postgres_server, postgres_database, capsys):
    """Issue 32, item 3, on the database store: a PLD ledger after a partial spend; the accountant, ``audit URL``
    and ``ledger list URL`` tell the same remaining epsilon at the budget's delta (``audit`` said "no budget left"
    while the next run was accepted)."""
    from pate_accountant.accountants import PldAccountant
    from pate_accountant.events import EpsilonDeltaEvent
    from pate_accountant.ledger_home import DatabaseIndex

    url = _password_url(postgres_server, postgres_database, "left")
    with Ledger.open(url) as ledger:
        ledger.set_dataset("left")
        accountant = PldAccountant(budget=(10.0, 1e-6), ledger=ledger)
        accountant.compose(EpsilonDeltaEvent(2.0, 1e-8), 3)
        left = accountant.remaining_budget()
        assert accountant.can_afford(EpsilonDeltaEvent(2.0, 1e-8))
    assert left.delta is None and left.at_delta == 1e-6 and 3.0 < left.epsilon < 4.01
    code, out, _ = _run(capsys, "audit", url)
    assert code == 0 and f"remaining   : {left.words()}" in out and "none:" not in out
    database = url.split("?", 1)[0]
    index = DatabaseIndex(database)
    try:
        index.register(index.fingerprint([{"text": "left"}]), "left", "left")
    finally:
        index.close()
    code, out, _ = _run(capsys, "ledger", "list", database)
    assert code == 0 and f"remaining : {left.words()} (as stored" in out
