"""Signed checkpoints (pate_accountant/checkpoints.py; ``keygen``, ``sign``, ``audit --public-key``): issue 14,
item 2.  Each forgery of a ledger is an attack transcript through the real ``audit``: what it says with nothing
pinned, with a head and row count pinned, and with the operator's signed checkpoints."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from test_ledger import _edit_event_epsilon, _raw, _rehash

import pate_accountant.ledger as ledger_module
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.checkpoints import (
    CheckpointError,
    append_checkpoint,
    check_checkpoints,
    default_checkpoints_path,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    read_checkpoints,
    sign_checkpoint,
    verify_signature,
)
from pate_accountant.cli import main
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.ledger import Ledger
from pate_accountant.release import Release

BUDGET = (10.0, 1e-3)
EPSILONS = (0.5, 0.1, 0.3, 0.05, 0.2, 0.4)  # six rows: run 1 holds rows 1-3, run 2 rows 4-6


def _build(path, epsilons=EPSILONS):
    with Ledger.open(path) as ledger:
        ledger.set_dataset("sample")
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for run, part in enumerate((epsilons[:3], epsilons[3:]), start=1):
            ledger.begin_run({"run": run, "mechanism": "dp-argmax"})
            for eps in part:
                accountant.record(Release("tok", EpsilonDeltaEvent(eps, 1e-8)))
        return ledger.head_record


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    operator = generate_key(folder / "operator.key")
    intruder = generate_key(folder / "intruder.key")
    return {"operator": operator, "intruder": intruder}


def _sign(path, key_file):
    code = main(["sign", str(path), "--key", str(key_file), "--json"])
    assert code == 0
    return code


def _audit(capsys, path, *extra):
    code = main(["audit", str(path), "--json", *map(str, extra)])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


# -- keys -----------------------------------------------------------------------------------------------------
def test_keygen_writes_a_private_key_for_its_owner_only_and_a_public_key(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert main(["keygen", str(tmp_path / "op.key")]) == 0
    finally:
        os.umask(old)
    out = capsys.readouterr().out
    private, public = tmp_path / "op.key", tmp_path / "op.key.pub"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert key_id(load_public_key(public)) in out
    assert key_id(load_private_key(private).public_key()) == key_id(load_public_key(public))
    before = private.read_bytes()
    assert main(["keygen", str(private)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err and private.read_bytes() == before


def test_a_file_that_is_not_a_key_is_a_one_line_usage_error(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    _build(path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    assert main(["sign", str(path), "--key", str(junk)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--key" in err and "junk.pem" in err and "PEM private key" in err
    assert main(["audit", str(path), "--public-key", str(junk)]) == 2
    assert "--public-key" in capsys.readouterr().err
    assert not os.path.exists(default_checkpoints_path(path))


def test_without_the_cryptography_package_the_error_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography", None)
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)
    assert main(["keygen", str(tmp_path / "k")]) == 2
    assert "pate-accountant[signing]" in capsys.readouterr().err
    assert not (tmp_path / "k").exists()


# -- signing and checking -------------------------------------------------------------------------------------
def test_sign_then_audit_with_the_public_key(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    head = _build(path)
    _sign(path, keys["operator"][0])
    checkpoint = json.loads(capsys.readouterr().out)
    assert {k: checkpoint[k] for k in head} == head and checkpoint["dataset"] == "sample"
    assert read_checkpoints(default_checkpoints_path(path)) == [checkpoint]
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 0 and report["signed"]["ok"] and report["signed"]["covered_rows"] == 6
    assert main(["audit", str(path), "--public-key", str(keys["operator"][1])]) == 0
    text = capsys.readouterr().out
    assert "signed      : OK: 1 signed checkpoint(s)" in text


def test_a_checkpoint_holds_nothing_the_shareable_file_does_not(tmp_path, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    with Ledger.open(path, read_only=True) as ledger:
        checkpoint = sign_checkpoint(ledger, load_private_key(keys["operator"][0]))
        shareable = path.read_bytes()
    for key in ("ledger_id", "head_hash", "run_head_hash", "dataset"):
        assert checkpoint[key].encode() in shareable  # stored as is in the shareable file
    assert set(checkpoint) - {"signature"} == {"format", "version", "ledger_id", "dataset", "config", "rows",
                                               "head_hash", "runs", "run_head_hash", "signed_at",
                                               "software_version", "key_id"}


def test_a_ledger_that_does_not_verify_is_not_signed(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    conn = _raw(path)
    _edit_event_epsilon(conn, 2, 0.01)  # without recomputing the hashes: the chain breaks
    conn.close()
    assert main(["sign", str(path), "--key", str(keys["operator"][0])]) == 1
    assert "does not verify" in capsys.readouterr().err
    assert not os.path.exists(default_checkpoints_path(path))
    with Ledger.open(path, read_only=True) as ledger, pytest.raises(CheckpointError, match="does not verify"):
        sign_checkpoint(ledger, load_private_key(keys["operator"][0]))


def test_honest_rows_after_a_checkpoint_extend_it_and_are_reported_uncovered(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    with Ledger.open(path) as ledger:  # a later run appends
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        ledger.begin_run({"run": 3})
        accountant.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
    capsys.readouterr()
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 0 and report["signed"]["covered_rows"] == 6 and report["signed"]["rows"] == 7
    assert "rows 7 to 7 are not covered" in report["signed"]["message"]


# -- forgeries: attack transcripts through the real audit -----------------------------------------------------
def _rehash_runs(conn) -> None:
    """Recompute the runs chain and its head as a forger would."""
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    prev = ledger_module._runs_genesis_hash(meta)
    runs = conn.execute(f"SELECT {ledger_module._RUN_COLUMNS} FROM runs ORDER BY id").fetchall()
    for run_id, _prev, _hash, first_row, metadata, created, writer in runs:
        digest = ledger_module._run_hash(prev, run_id, first_row, metadata, created, writer)
        conn.execute("UPDATE runs SET prev_hash = ?, hash = ? WHERE id = ?", (prev, digest, run_id))
        prev = digest
    conn.execute("UPDATE head SET run_count = ?, run_last_hash = ? WHERE id = 1", (len(runs), prev if runs else None))


def _swap_events(conn, a, b) -> None:
    events = dict(conn.execute("SELECT id, event FROM charges WHERE id IN (?, ?)", (a, b)))
    conn.execute("UPDATE charges SET event = ? WHERE id = ?", (events[b], a))
    conn.execute("UPDATE charges SET event = ? WHERE id = ?", (events[a], b))


def _drop_row(conn, row) -> None:
    conn.execute("DELETE FROM charges WHERE id = ?", (row,))
    last = conn.execute("SELECT MAX(id) FROM charges").fetchone()[0]
    for later in range(row + 1, last + 1):
        conn.execute("UPDATE charges SET id = ? WHERE id = ?", (later - 1, later))
    conn.execute("UPDATE runs SET first_row = first_row - 1 WHERE first_row >= ?", (row,))


def _raise_budget(conn) -> None:
    config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    config["budget"] = [1000.0, 1e-3]
    conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps(config, separators=(",", ":")),))


FORGERIES = {
    # name: (edit of a raw connection, or None to replace the file), each leaving a ledger that verifies alone
    "lowered epsilon": lambda conn: _edit_event_epsilon(conn, 1, 0.05),
    "dropped last rows": lambda conn: conn.execute("DELETE FROM charges WHERE id > 4"),
    "dropped a middle row": lambda conn: _drop_row(conn, 2),
    "reordered rows": lambda conn: _swap_events(conn, 1, 5),
    "raised budget": _raise_budget,
    "emptied": lambda conn: conn.execute("DELETE FROM charges"),
    "edited run metadata": lambda conn: conn.execute("UPDATE runs SET metadata = ? WHERE id = 1",
                                                      ('{"mechanism":"none","run":1}',)),
    "replaced file": None,
}
#: What a pinned head and row count cannot see: the runs' metadata is not in the row chain (a pinned run head is).
PIN_BLIND = {"edited run metadata"}


def _forge(path, name) -> None:
    edit = FORGERIES[name]
    if edit is None:
        os.unlink(path)
        _build(path)  # a fresh ledger of the same shape and content
        return
    conn = _raw(path)
    edit(conn)
    _rehash(conn, respend=True)  # every hash and stored total recomputed: consistent
    _rehash_runs(conn)
    conn.close()


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_each_forgery_verifies_alone_and_is_caught_by_a_signed_checkpoint(tmp_path, capsys, keys, name):
    path = tmp_path / "l.sqlite"
    head = _build(path)
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    _forge(path, name)

    code, report, _ = _audit(capsys, path)
    assert code == 0 and report["ok"], report["message"]  # the keyless chain alone cannot tell

    code, report, _ = _audit(capsys, path, "--expect-head", head["head_hash"], "--expect-rows", head["rows"])
    assert (code == 0) == (name in PIN_BLIND), report["message"]
    code, report, _ = _audit(capsys, path, "--expect-head", head["head_hash"], "--expect-rows", head["rows"],
                             "--expect-run-head", head["run_head_hash"], "--expect-runs", head["runs"])
    assert code == 1 and not report["pinned"]["extends"], report["message"]  # the whole pin a run prints

    code, report, err = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and not report["ok"] and not report["signed"]["ok"]
    assert "does not extend signed checkpoint 1" in report["signed"]["message"] and "does not verify" in err


def test_an_edited_checkpoint_fails_its_signature(tmp_path, capsys, keys):
    """The forger rewrites the history and edits the checkpoint to match it, without the key."""
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    _forge(path, "dropped last rows")
    file = default_checkpoints_path(path)
    [checkpoint] = read_checkpoints(file)
    with Ledger.open(path, read_only=True) as ledger:
        checkpoint.update(ledger.head_record)
    os.unlink(file)
    append_checkpoint(file, checkpoint)
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and report["signed"]["first_bad"] == 1
    assert "signature does not match its content" in report["signed"]["message"]


def test_a_checkpoint_signed_by_another_key_or_none_at_all_fails(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["intruder"][0])  # the forger signs with a key of their own
    capsys.readouterr()
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and "not by the given key" in report["signed"]["message"]
    os.unlink(default_checkpoints_path(path))  # or deletes the checkpoints
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and "no signed checkpoint" in report["signed"]["message"]


def test_the_key_holder_can_still_forge_a_history(tmp_path, capsys, keys):
    """What docs/ledger.md states: a signature binds the history to the key, not to the truth.  Whoever holds
    the private key rewrites the ledger, replaces the checkpoints by new ones and passes the audit."""
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    _forge(path, "lowered epsilon")
    os.unlink(default_checkpoints_path(path))
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 0 and report["signed"]["ok"]  # only a checkpoint kept elsewhere (or a pin) shows the rewrite


def test_the_signature_covers_every_field_of_the_statement(tmp_path, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    public = load_public_key(keys["operator"][1])
    with Ledger.open(path, read_only=True) as ledger:
        checkpoint = sign_checkpoint(ledger, load_private_key(keys["operator"][0]))
        assert check_checkpoints(ledger, [checkpoint], public).ok
    verify_signature(checkpoint, public)
    changes = {"ledger_id": "0" * 32, "dataset": "other", "config": {"kind": "basic", "budget": [99.0, 0.1]},
               "rows": 5, "head_hash": "0" * 64, "runs": 1, "run_head_hash": "1" * 64, "signed_at": 1.0,
               "software_version": "9.9", "key_id": "0" * 16, "format": "other", "version": 2}
    for key, value in changes.items():
        with pytest.raises(CheckpointError):
            verify_signature({**checkpoint, key: value}, public)
    with pytest.raises(CheckpointError, match="unknown"):
        verify_signature({**checkpoint, "note": "added"}, public)


def test_dropping_the_newest_checkpoints_hides_a_rewrite_after_the_older_ones(tmp_path, capsys, keys):
    """The limit docs/ledger.md states: checkpoints kept only beside the ledger can be thinned by a forger.  The
    rows after the older checkpoint are rewritten, the newer checkpoint is dropped, and the audit passes, saying
    which rows no signature covers; the auditor's own copy of the newer checkpoint catches it."""
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        ledger.begin_run({"run": 3})
        for eps in (0.9, 0.8):
            accountant.record(Release("tok", EpsilonDeltaEvent(eps, 1e-8)))
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    file = default_checkpoints_path(path)
    older, newer = read_checkpoints(file)
    conn = _raw(path)
    _edit_event_epsilon(conn, 7, 0.01)  # a row after the older checkpoint
    _rehash(conn, respend=True)
    conn.close()
    os.unlink(file)
    append_checkpoint(file, older)
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 0 and report["signed"]["covered_rows"] == 6
    assert "rows 7 to 8 are not covered" in report["signed"]["message"]
    kept = tmp_path / "auditor-copy.jsonl"
    append_checkpoint(kept, older)
    append_checkpoint(kept, newer)
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1], "--checkpoints", kept)
    assert code == 1 and "signed checkpoint 2" in report["signed"]["message"]


def test_keys_made_by_openssl_sign_and_check(tmp_path, capsys):
    """The key files are the standard PEM formats: an OpenSSL Ed25519 key pair works as one from keygen."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command on this machine (an interoperability check only)")
    private, public = tmp_path / "ossl.pem", tmp_path / "ossl.pub"
    subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True,
                   capture_output=True)
    subprocess.run([openssl, "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True,
                   capture_output=True)
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, private)
    capsys.readouterr()
    code, report, _ = _audit(capsys, path, "--public-key", public)
    assert code == 0 and report["signed"]["key_id"] == key_id(load_public_key(public))


def test_an_audit_without_the_key_says_the_checkpoints_were_not_checked(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    assert main(["audit", str(path)]) == 0
    assert "signed      :" not in capsys.readouterr().out  # no checkpoints: nothing to say
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    assert main(["audit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "signed      : not checked" in out and "--public-key" in out
