"""One budget per data set (issue 22, item 3): the keyed fingerprint of a data set's records and the ledger home's
index, which refuses a second ledger for records it already knows.  The runs through the command line are in
tests/test_run.py (``test_one_data_set_one_ledger...``)."""

from __future__ import annotations

import os
import stat

import pytest

from pate_accountant.errors import PateAccountantError
from pate_accountant.ledger_home import (
    DataSetLedgerError,
    LedgerHome,
    config_dir,
    dataset_fingerprint,
    fingerprint_key,
    home_dir,
)

RECORDS = [{"instruction": f"write a poem about zanzibar {i}", "context": "", "response": "ok",
            "category": "creative_writing"} for i in range(5)]


def test_the_fingerprint_is_keyed_and_ignores_the_order_of_the_records(tmp_path):
    key = fingerprint_key(tmp_path / "config")
    fp = dataset_fingerprint(RECORDS, key)
    assert fp.startswith("hmac-sha256:") and len(fp) == len("hmac-sha256:") + 64
    assert dataset_fingerprint(list(reversed(RECORDS)), key) == fp
    changed = [dict(RECORDS[0], instruction="write a poem about zanzibar 0!")] + RECORDS[1:]
    assert dataset_fingerprint(changed, key) != fp
    # only the text counts (a Dolly record's instruction): another response is the same record
    assert dataset_fingerprint([dict(RECORDS[0], response="ok!")] + RECORDS[1:], key) == fp
    assert dataset_fingerprint(RECORDS[:-1], key) != fp
    assert dataset_fingerprint(RECORDS, bytes(32)) != fp  # another installation's key: another fingerprint
    assert "zanzibar" not in fp
    with pytest.raises(ValueError, match="records: a data set without records has no fingerprint"):
        dataset_fingerprint([], key)


def test_the_key_is_made_once_readable_by_its_owner_only(tmp_path):
    folder = tmp_path / "config"
    key = fingerprint_key(folder)
    assert len(key) == 32 and fingerprint_key(folder) == key
    path = folder / "fingerprint.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(PateAccountantError, match=r"open to other users \(mode 0644\): chmod 600 it"):
        fingerprint_key(folder)
    os.chmod(path, 0o600)
    path.write_text("not a key\n")
    with pytest.raises(PateAccountantError, match="does not hold a key"):
        fingerprint_key(folder)
    other = tmp_path / "fifo-config"
    other.mkdir()
    os.mkfifo(other / "fingerprint.key", 0o600)
    with pytest.raises(PateAccountantError, match="is not a regular file"):  # refused before it is opened
        fingerprint_key(other)


def test_the_folders_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("PATE_ACCOUNTANT_CONFIG", str(tmp_path / "c"))
    assert home_dir() == tmp_path / "h" and config_dir() == tmp_path / "c"
    monkeypatch.delenv("PATE_ACCOUNTANT_HOME")
    monkeypatch.delenv("PATE_ACCOUNTANT_CONFIG")
    assert home_dir().name == "pate-accountant" and config_dir().name == "pate-accountant"


def test_the_index_keeps_one_ledger_per_fingerprint(tmp_path):
    home = LedgerHome(tmp_path / "home")
    fp = dataset_fingerprint(RECORDS, fingerprint_key(tmp_path / "config"))
    assert home.lookup(fp) is None and not home.index_path.exists()  # a look-up creates nothing
    first = tmp_path / "a.sqlite"
    assert home.check(fp, first) is None
    assert home.register(fp, "poems", first) == first
    assert home.lookup(fp) == first and home.check(fp, first) == first
    assert stat.S_IMODE(home.index_path.stat().st_mode) == 0o600
    (tmp_path / "link").symlink_to(tmp_path)
    assert home.register(fp, "poems", tmp_path / "link" / "a.sqlite") == first  # the same file by another name
    second = tmp_path / "b.sqlite"
    for attempt in (lambda: home.check(fp, second), lambda: home.register(fp, "poems", second)):
        with pytest.raises(DataSetLedgerError, match="already charged to the ledger .*a.sqlite.*give --ledger"):
            attempt()
    assert home.lookup(fp) == first
    other = dataset_fingerprint(RECORDS[:2], fingerprint_key(tmp_path / "config"))
    assert home.register(other, "poems-2", second) == second  # another data set: its own ledger
    default = home.default_path("my poems / v2", fp)
    assert default.parent == home.root / "ledgers" and default.name == f"my-poems-v2-{fp[12:24]}.sqlite"


def test_a_database_ledgers_default_name_is_an_sql_identifier_of_the_data_set():
    """``DatabaseIndex.default_name``: what a run with a URL and no ledger name creates; always a name the
    PostgreSQL store accepts (lower-case identifier, at most 50 characters, not starting with pg_)."""
    from pate_accountant._ledger.postgres_url import parse_url
    from pate_accountant.ledger_home import DatabaseIndex, with_ledger_name

    fingerprint = "hmac-sha256:" + "0123456789abcdef" * 4
    names = {dataset: DatabaseIndex.default_name(dataset, fingerprint)
             for dataset in ("Clinic Notes 2026", "9lives", "pg_stats", "x" * 200, "--", "Ünïcode")}
    assert names["Clinic Notes 2026"] == "clinic_notes_2026_0123456789ab"
    assert names["9lives"] == "d_9lives_0123456789ab"
    assert names["pg_stats"] == "d_pg_stats_0123456789ab"
    assert names["--"] == "dataset_0123456789ab"
    for dataset, name in names.items():
        assert parse_url(with_ledger_name("postgresql://h/db", name))[1] == name, dataset


def test_a_ledger_url_keeps_its_credentials_and_parts_when_named():
    from pate_accountant.ledger_home import ledger_name_of, ledger_url_names_ledger, with_ledger_name

    assert with_ledger_name("postgresql://u:p@h:5/db?sslmode=require&ledger=a", "b") == \
        "postgresql://u:p@h:5/db?sslmode=require&ledger=b"
    assert with_ledger_name("postgresql:///?service=budgets", "b") == "postgresql:///?service=budgets&ledger=b"
    assert ledger_name_of("postgresql://h/db") is None and not ledger_url_names_ledger("postgresql://h/db")
    assert ledger_name_of("postgresql://h/db?ledger=budget") == "budget"
    with pytest.raises(Exception, match="invalid ledger name"):
        ledger_name_of("postgresql://h/db?ledger=Bad-Name")
