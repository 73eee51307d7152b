"""``generate --ledger postgresql://...`` end to end against a real server (issue 25): a run charges a database
ledger, the database's data-set index keeps one ledger per data set whichever host runs, the installation's own
index keeps a file and a database ledger from both taking the same records, a run whose database goes away stops
cleanly, and no password reaches a result, a message or the ledger."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("psycopg")

from pg_server import ledger_url, sql  # noqa: E402
import test_run  # noqa: E402
from test_run import _records, _run  # noqa: E402

from pate_accountant.ledger import Ledger  # noqa: E402
from pate_accountant.ledger_home import INDEX_KEY_SCHEMA, INDEX_SCHEMA, DatabaseIndex, dataset_fingerprint  # noqa: E402
from pate_app.run import RunInputError  # noqa: E402
from pate_app.spec import RunSpec, SpecError  # noqa: E402

pytestmark = pytest.mark.slow

#: test_run's tiny model, as a fixture of this module too (built once for it).
model_dir = test_run.model_dir

SECRET = "s3cret-Pass_word"


def _with_password(url: str) -> str:
    """``url`` with a password in its user part (the test server trusts the loopback address and ignores it)."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def _schemas(database: str) -> set:
    return {row[0] for row in sql(database, "SELECT nspname FROM pg_namespace")}


def _host(tmp_path, monkeypatch, name: str):
    """Another host: its own configuration (fingerprint key) and ledger home."""
    monkeypatch.setenv("PATE_ACCOUNTANT_CONFIG", str(tmp_path / name / "config"))
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / name / "home"))
    return tmp_path / name / "home"


def test_a_run_charges_a_database_ledger_and_shows_no_password(model_dir, postgres_database, tmp_path):
    url = _with_password(ledger_url(postgres_database, "budget"))
    result = _run(model_dir, url)
    assert result["audit"]["ok"], result["audit"]
    assert result["within_budget"]
    text = json.dumps(result)
    assert SECRET not in text
    assert result["ledger"]["path"] == ledger_url(postgres_database, "budget")  # the user part, no password
    assert result["spec"]["output"]["ledger"].endswith("/" + postgres_database.rsplit("/", 1)[1] + "?ledger=budget")
    assert "postgres@" not in result["spec"]["output"]["ledger"]  # the shareable description names no user
    with Ledger.open(url, read_only=True) as ledger:
        verdict = ledger.verify()
        assert verdict.ok, verdict.message
        assert verdict.rows == result["ledger"]["rows"] == result["charged_runs"] > 0
        assert ledger.dataset == result["parameters"]["dataset"]
        stored = json.dumps(ledger.runs)
    assert SECRET not in stored
    # the fingerprint recorded is the database's, which every host computes alike
    index = DatabaseIndex(url)
    try:
        assert result["parameters"]["dataset_fingerprint"] == index.fingerprint(_records(12))
        assert index.lookup(index.fingerprint(_records(12))) == "budget"
    finally:
        index.close()
    # a second run appends to the same budget
    again = _run(model_dir, url, seed=1)
    assert again["ledger"]["runs"] == 2 and again["ledger"]["appended"]
    assert again["spent_before"] == result["spent"]


def test_a_url_without_a_ledger_name_takes_the_data_sets_ledger(model_dir, postgres_database):
    first = _run(model_dir, postgres_database)
    name = first["ledger"]["path"].rsplit("ledger=", 1)[1]
    assert name.startswith("records_") and len(name) == len("records_") + 12  # the data set's name and fingerprint
    assert name in _schemas(postgres_database)
    second = _run(model_dir, postgres_database, seed=1)
    assert second["ledger"]["path"] == first["ledger"]["path"]
    assert second["ledger"]["runs"] == 2


def _fresh_records(count: int) -> list[dict]:
    """Records that share none with ``_records``."""
    return [{"instruction": f"another one number {i}", "context": "", "response": "x", "category": "open_qa"}
            for i in range(count)]


def test_two_hosts_cannot_open_two_budgets_for_one_data_set(model_dir, postgres_database, tmp_path, monkeypatch):
    home_a = _host(tmp_path, monkeypatch, "host-a")
    first = _run(model_dir, ledger_url(postgres_database, "first"), ledger_home=home_a)
    assert first["audit"]["ok"]
    # host B: another fingerprint key and ledger home, the same records, the same database
    home_b = _host(tmp_path, monkeypatch, "host-b")
    with pytest.raises(RunInputError) as refused:
        _run(model_dir, ledger_url(postgres_database, "second"), ledger_home=home_b)
    message = str(refused.value)
    assert "already charged to the ledger 'first'" in message and "\n" not in message
    assert "second" not in _schemas(postgres_database)  # refused before anything was created
    # without a name, host B's run joins the data set's one budget
    joined = _run(model_dir, postgres_database, ledger_home=home_b, seed=1)
    assert joined["ledger"]["path"].endswith("?ledger=first")
    assert joined["ledger"]["runs"] == 2
    assert joined["spent_before"] == first["spent"]
    # records sharing any one with the data set are charged to its ledger (issue 31) ...
    with pytest.raises(RunInputError, match="already charged to the ledger 'first'"):
        _run(model_dir, ledger_url(postgres_database, "second"), ledger_home=home_b,
             records=_records(12)[1:] + [{"instruction": "another one", "context": "", "response": "x",
                                          "category": "open_qa"}])
    # ... and other records are another data set: their own ledger
    other = _run(model_dir, ledger_url(postgres_database, "second"), ledger_home=home_b, records=_fresh_records(12))
    assert other["ledger"]["runs"] == 1


def test_a_database_index_charges_shared_records_to_one_ledger(postgres_database):
    """Issue 31, item 4, in the database's index: records are known by their identities, a data set sharing any
    with a registered one belongs to its ledger, records spread over two ledgers are refused naming both, and
    record registrations are permanent like data sets'.  An index laid out before the records table existed
    gains it at its next use."""
    from pate_accountant.ledger_home import _INDEX_DDL, DataSetLedgerError

    sql(postgres_database, _INDEX_DDL)
    sql(postgres_database, f"INSERT INTO {INDEX_KEY_SCHEMA}.fingerprint_key (id, key) VALUES (1, '{'ab' * 32}')")
    index = DatabaseIndex(postgres_database)
    try:
        first, second = _records(6), _fresh_records(6)
        assert index.register(index.identify(first), "first", "one") == "one"  # lays the records table out
        assert index.register(index.identify(second), "second", "two") == "two"
        grown = index.identify(first[1:] + [{"instruction": "  A NEW one", "context": "", "response": "",
                                            "category": "x"}])
        assert index.lookup(grown) == "one" and index.register(grown, "first", "one") == "one"
        assert index.lookup(index.identify([{"instruction": "a new ONE"}])) == "one"
        with pytest.raises(DataSetLedgerError, match=r"charged to 2 ledgers .*'one' \(2 of these 3 records\); "
                                                     r"'two' \(1 of these 3 records\)"):
            index.lookup(index.identify(first[:2] + second[:1]))
        with pytest.raises(DataSetLedgerError, match="already charged to the ledger 'one'"):
            index.register(index.identify(first[:1] + _fresh_records(12)[8:]), "mixed", "three")
        assert index.lookup(index.identify(_fresh_records(12)[8:])) is None  # the refused registration wrote nothing
    finally:
        index.close()
    for statement in (f"DELETE FROM {INDEX_SCHEMA}.records", f"UPDATE {INDEX_SCHEMA}.records SET ledger = 'two'",
                      f"TRUNCATE {INDEX_SCHEMA}.records"):
        with pytest.raises(Exception, match="registration is permanent"):
            sql(postgres_database, statement)


def test_hosts_racing_to_register_one_data_set_keep_one_ledger(postgres_database):
    indexes = [DatabaseIndex(postgres_database) for _ in range(2)]
    try:
        fingerprints = {index.fingerprint(_records(12)) for index in indexes}
        assert len(fingerprints) == 1  # one key per database, whichever connection reads it
        fingerprint = fingerprints.pop()
        assert indexes[0].register(fingerprint, "records", "one") == "one"
        with pytest.raises(Exception, match="already charged to the ledger 'one'"):
            indexes[1].register(fingerprint, "records", "two")
        assert indexes[1].register(fingerprint, "records", "one") == "one"  # registering again is harmless
    finally:
        for index in indexes:
            index.close()
    # a registration is permanent, and the key cannot be changed
    for statement in (f"DELETE FROM {INDEX_SCHEMA}.datasets", f"UPDATE {INDEX_SCHEMA}.datasets SET ledger = 'two'",
                      f"TRUNCATE {INDEX_SCHEMA}.datasets", f"UPDATE {INDEX_KEY_SCHEMA}.fingerprint_key SET key = 'x'"):
        with pytest.raises(Exception, match="registration is permanent"):
            sql(postgres_database, statement)
    assert sql(postgres_database, f"SELECT ledger FROM {INDEX_SCHEMA}.datasets") == [("one",)]


def test_one_installation_charges_records_to_a_file_or_a_database_not_both(model_dir, postgres_database, tmp_path,
                                                                           monkeypatch):
    home = tmp_path / "home"
    _run(model_dir, _with_password(ledger_url(postgres_database, "budget")), ledger_home=home)
    with pytest.raises(RunInputError) as refused:
        _run(model_dir, tmp_path / "local.sqlite", ledger_home=home)
    assert "?ledger=budget" in str(refused.value) and not (tmp_path / "local.sqlite").exists()
    # without --ledger the installation's index sends the run to the database, reached as the first run reached it
    # (its user: issue 32, item 4, where the OS user was tried and refused), never with a stored password
    monkeypatch.delenv("PGUSER", raising=False)
    joined = _run(model_dir, None, ledger_home=home, seed=1)
    assert joined["ledger"]["path"].endswith("?ledger=budget") and joined["ledger"]["runs"] == 2
    assert joined["ledger"]["path"].startswith("postgresql://postgres@")
    assert SECRET.encode() not in (home / "index.sqlite").read_bytes()
    # and the other way round: records charged to a file first are refused a database ledger
    # (records that share none with the database's data set: sharing one would charge them to it, issue 31)
    other_home = tmp_path / "other-home"
    _run(model_dir, tmp_path / "first.sqlite", ledger_home=other_home, records=_fresh_records(10))
    with pytest.raises(RunInputError, match="first.sqlite"):
        _run(model_dir, ledger_url(postgres_database, "late"), ledger_home=other_home, records=_fresh_records(10))
    assert "late" not in _schemas(postgres_database)


def test_signing_a_database_ledger_needs_a_checkpoints_file():
    url = f"postgresql://postgres:{SECRET}@db.example:5432/budgets?ledger=budget"
    with pytest.raises(SpecError, match="--checkpoints FILE") as refused:
        RunSpec(ledger=url, signing_key="key.pem", data="records", budget_epsilon=1.0, budget_delta=1e-6)
    assert SECRET not in str(refused.value)
    spec = RunSpec(ledger=url, signing_key="key.pem", checkpoints="c.jsonl", data="records", budget_epsilon=1.0,
                   budget_delta=1e-6)
    assert spec.shareable()["output"]["ledger"] == "postgresql://db.example:5432/budgets?ledger=budget"


def test_a_run_whose_database_goes_away_stops_cleanly(model_dir, postgres_database, tmp_path, monkeypatch):
    """The server ends the run's connection after its second charged step: the next charge fails, the run stops
    keeping what it finished, says so without a password, and the ledger audits with every committed charge."""
    import pate_app.run as run_module

    url = _with_password(ledger_url(postgres_database, "budget"))
    steps = []
    real_step = run_module.RunProgress.step

    def step(self, outcome):
        real_step(self, outcome)
        steps.append(outcome)
        if len(steps) == 2:  # an operator (or a failover) ends every other session on the database
            sql(postgres_database, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid()")

    monkeypatch.setattr(run_module.RunProgress, "step", step)
    result = _run(model_dir, url, num_records=3, max_tokens=6)
    error = result["ledger"]["write_error"]
    assert error is not None and "could not be written" in error
    assert SECRET not in json.dumps(result)
    assert len(steps) == 2  # the third step's charge failed: nothing released after it
    # read afresh after the failure: the two committed charges, audited
    assert result["ledger"]["rows"] == 2 and result["audit"]["ok"], result["audit"]
    with Ledger.open(url, read_only=True) as ledger:
        verdict = ledger.verify()
        assert verdict.ok and verdict.rows == 2


def test_the_local_fingerprint_and_the_database_fingerprint_differ(postgres_database):
    """Why a database keeps its own key: the installation's key would give each host another fingerprint."""
    index = DatabaseIndex(postgres_database)
    try:
        assert index.fingerprint(_records(12)) != dataset_fingerprint(_records(12))
    finally:
        index.close()


def test_the_two_roles_of_the_docs_run_and_audit_without_a_superuser(model_dir, postgres_server, postgres_database,
                                                                     capsys):
    """docs/ledger.md, "Roles": a writer with CREATE on the database only runs; an auditor granted the ledger's
    schema audits it, and can read neither the confidential schema nor the index's key."""
    import os

    from pate_app.cli import main

    suffix = f"{os.getpid()}_{abs(hash(postgres_database)) % 10_000}"
    writer, auditor = f"pate_writer_{suffix}", f"pate_auditor_{suffix}"
    database = postgres_database.rsplit("/", 1)[1]
    postgres_server.execute(f'CREATE ROLE {writer} LOGIN; GRANT CREATE ON DATABASE "{database}" TO {writer}; '
                            f"CREATE ROLE {auditor} LOGIN")
    as_writer = postgres_database.replace("postgresql://postgres@", f"postgresql://{writer}@", 1)
    as_auditor = postgres_database.replace("postgresql://postgres@", f"postgresql://{auditor}@", 1)
    result = _run(model_dir, ledger_url(as_writer, "budget"), mechanism="between-thresholds",
                  accountant="individual-charging", step_epsilon=0.2, relation="replace-one", epsilon=30.0,
                  delta=1e-5, num_records=1, max_tokens=6)
    assert result["audit"]["ok"], result["audit"]
    # before its grants the auditor is refused in words: no internal class name, no SQL (issue 32, item 5)
    assert main(["audit", ledger_url(as_auditor, "budget")]) == 3
    refused = capsys.readouterr().out
    assert "permission denied" in refused and "SELECT" not in refused and "Error" not in refused, refused
    sql(postgres_database, f"GRANT USAGE ON SCHEMA budget TO {auditor}; "
                           f"GRANT SELECT ON ALL TABLES IN SCHEMA budget TO {auditor}")
    assert main(["audit", ledger_url(as_auditor, "budget")]) == 0
    out = capsys.readouterr().out
    assert "was not found" in out  # the confidential part: not readable to the auditor, so reported absent
    for table in ("budget_confidential.charges", f"{INDEX_KEY_SCHEMA}.fingerprint_key"):
        with pytest.raises(Exception, match="permission denied"):
            sql(as_auditor, f"SELECT * FROM {table}")


def test_credentials_from_a_service_file(model_dir, postgres_server, postgres_database, tmp_path, monkeypatch):
    """libpq's service file names the server, the database and the user: the URL names only the service."""
    from urllib.parse import urlsplit

    parts = urlsplit(postgres_database)
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[budgets]\nhost={parts.hostname}\nport={parts.port}\ndbname={parts.path[1:]}\n"
                       "user=postgres\n", encoding="utf-8")
    monkeypatch.setenv("PGSERVICEFILE", str(service))
    result = _run(model_dir, "postgresql:///?service=budgets&ledger=served")
    assert result["audit"]["ok"], result["audit"]
    assert "served" in _schemas(postgres_database)
    with Ledger.open(ledger_url(postgres_database, "served"), read_only=True) as ledger:
        assert ledger.verify().rows == result["ledger"]["rows"] > 0


def _index_key(url: str) -> str:
    """In a new process: the database's fingerprint key, creating the index if it is the first."""
    index = DatabaseIndex(url)
    try:
        return index.fingerprint_key().hex()
    finally:
        index.close()


def test_hosts_creating_the_index_at_once_agree_on_one_key(postgres_database):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        keys = list(pool.map(_index_key, [postgres_database] * 8))
    assert len(set(keys)) == 1 and len(keys[0]) == 64
    assert sql(postgres_database, f"SELECT count(*) FROM {INDEX_KEY_SCHEMA}.fingerprint_key") == [(1,)]


def test_a_database_ledger_has_one_identity_however_the_url_names_its_server(postgres_database):
    """The installation's index names a database ledger by the address connected to: "localhost" and
    "127.0.0.1" are one server, so one ledger, not two budgets (nor a refusal of the same ledger)."""
    from pate_accountant.ledger_home import ledger_identity

    by_address = ledger_url(postgres_database)
    by_name = by_address.replace("@127.0.0.1:", "@localhost:", 1)
    assert ledger_identity(by_name) == ledger_identity(by_address) == "postgresql://" + by_address.split("@", 1)[1]


def test_a_signed_run_on_a_database_ledger_audits_with_its_checkpoints(model_dir, postgres_database, tmp_path,
                                                                      capsys):
    from pate_accountant.checkpoints import generate_key
    from pate_app.cli import main

    private, public = generate_key(tmp_path / "operator.key")
    checkpoints = tmp_path / "budget.checkpoints.jsonl"
    url = _with_password(ledger_url(postgres_database, "budget"))
    result = _run(model_dir, url, signing_key=str(private), checkpoints=str(checkpoints))
    signed = result["ledger"]["checkpoint"]
    assert signed is not None and signed["rows"] == result["ledger"]["rows"] and signed["file"] == str(checkpoints)
    assert SECRET not in checkpoints.read_text(encoding="utf-8")
    assert main(["audit", url, "--public-key", str(public), "--checkpoints", str(checkpoints)]) == 0
    out = capsys.readouterr().out
    assert "signed      : OK" in out and SECRET not in out


def test_the_tutorials_database_section_runs_as_written(postgres_server, postgres_database, tmp_path, monkeypatch,
                                                        capsys):
    """docs/tutorial.md, section 6: its console block run against the test server (the example host and database
    replaced by the server's, the ledger's `<12 hex>` by the name the run printed), with the roles the text
    names, made as docs/ledger.md says; the embedded model, as a reader would run it."""
    import os
    import shlex

    from test_tutorial import _blocks

    from pate_accountant.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    topics = ("refund", "delivery", "password", "invoice", "account", "parcel", "subscription", "address")
    (tmp_path / "tickets.csv").write_text("text\n" + "".join(
        f"Ticket {i} asks about my {topics[i % len(topics)]} and needs help.\n" for i in range(96)),
        encoding="utf-8")
    database = postgres_database.rsplit("/", 1)[1]
    postgres_server.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pate_writer') THEN "
                            "CREATE ROLE pate_writer LOGIN; END IF; IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE "
                            "rolname = 'pate_auditor') THEN CREATE ROLE pate_auditor LOGIN; END IF; END $$")
    postgres_server.execute(f'GRANT CREATE ON DATABASE "{database}" TO pate_writer')
    server = f"127.0.0.1:{postgres_server.port}/{database}"
    lines = [line for line in _blocks("console")[0].splitlines() if line.startswith("pate-accountant ")]
    assert [shlex.split(line)[1] for line in lines] == ["generate", "ledger", "audit"]
    name = None
    for line in lines:
        line = line.replace("db.example.org/budgets", server)
        if name is not None:
            line = line.replace("tickets_csv_<12 hex>", name)
        argv = shlex.split(line)[1:]
        assert main(argv) == 0, line
        out = capsys.readouterr().out
        if argv[0] == "generate":
            name = next(l for l in out.splitlines() if l.startswith("ledger ")).split("?ledger=", 1)[1].split()[0]
            assert name.startswith("tickets_csv_") and len(name) == len("tickets_csv_") + 12
            assert (tmp_path / "tickets-synthetic.jsonl").is_file()
            sql(postgres_database, f"GRANT USAGE ON SCHEMA {name} TO pate_auditor; "
                                   f"GRANT SELECT ON ALL TABLES IN SCHEMA {name} TO pate_auditor")
        elif argv[0] == "ledger":
            assert name in out and "'tickets.csv'" in out
        else:
            assert "verdict     : OK" in out
    assert os.environ.get("PGPASSWORD") is None  # nothing here needed a password (trust on the loopback)


def test_a_generate_on_a_silent_database_stops_within_its_bound(model_dir, postgres_server, postgres_database,
                                                                 tmp_path, monkeypatch, capsys):
    """Issue 32, item 1, where a user meets it: ``generate`` on a PostgreSQL ledger behind a proxy that goes silent
    after the run's second charge (the connection stays open: keepalives see nothing wrong).  The next charge is
    given up at the statement deadline, the run stops with one line saying why, keeps what it finished, tries to
    read the ledger afresh (which the silent proxy refuses within its connect timeout) and exits 1, all within the
    stated bound (the deadline, 2 s here, plus the connect timeout, 2 s here, plus the model's own time)."""
    import time

    import pate_accountant._ledger.postgres_connection as connection_module
    import pate_app.run as run_module
    from pate_accountant.cli import main
    from pg_proxy import StallingProxy

    monkeypatch.setattr(connection_module, "STATEMENT_DEADLINE_S", 2.0)
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "home"))
    data = tmp_path / "data.jsonl"
    test_run._write_jsonl(data, _records(8))
    with StallingProxy(postgres_server.port) as proxy:
        port = postgres_database.split("@127.0.0.1:", 1)[1].split("/", 1)[0]
        url = ledger_url(postgres_database.replace(f":{port}/", f":{proxy.port}/"), "budget") + "&connect_timeout=2"
        stalled = []
        real_step = run_module.RunProgress.step

        def step(self, outcome):
            real_step(self, outcome)
            if not stalled and self.charged == 2:
                proxy.stall()
                time.sleep(0.3)
                stalled.append(time.monotonic())

        monkeypatch.setattr(run_module.RunProgress, "step", step)
        argv = test_run._generate_argv(model_dir, data, url, "--records", "3", "--max-tokens", "6", "--no-progress")
        assert main(argv) == 1
        elapsed = time.monotonic() - stalled[0]
    out = capsys.readouterr().out
    assert elapsed < 15.0, elapsed
    stopped = [line for line in out.splitlines() if line.startswith("stopped     :")]
    assert len(stopped) == 1 and "did not answer within 2 s" in stopped[0] and "could not be written" in stopped[0]
    with Ledger.open(ledger_url(postgres_database, "budget"), read_only=True) as ledger:
        verdict = ledger.verify()
        assert verdict.ok and verdict.rows == 2
