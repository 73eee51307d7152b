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


# -- issue 22, item 14: every field of the statement is checked against the ledger -----------------------------
def _open_budget(path, budget, dataset="sample"):
    """A ledger with its data set and accountant stored and no row yet (what a run's claim leaves)."""
    with Ledger.open(path) as ledger:
        ledger.set_dataset(dataset)
        BasicCompositionAccountant(budget=budget, ledger=ledger)


def test_a_checkpoint_at_zero_rows_pins_the_budget_the_forger_raises(tmp_path, capsys, keys):
    """Attack transcript.  The operator signs a ledger at 0 rows with its budget (epsilon 10).  Someone who can
    write the file raises the budget to 1000 (the metadata is not frozen before the first row, and no row hash
    covers it yet) and spends epsilon 50.  The chain alone verifies; the signed checkpoint now fails, naming the
    field (config) and the key (budget)."""
    path = tmp_path / "l.sqlite"
    _open_budget(path, (10.0, 1e-3))
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    conn = _raw(path)
    _raise_budget(conn)  # budget [1000, 1e-3]
    conn.close()
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=(1000.0, 1e-3), ledger=ledger)
        ledger.begin_run({"run": 1})
        for _ in range(5):
            accountant.record(Release("tok", EpsilonDeltaEvent(10.0, 1e-8)))
    code, report, _ = _audit(capsys, path)
    assert code == 0 and report["spent"]["epsilon"] == 50.0  # the keyless chain cannot tell
    code, report, err = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and not report["ok"] and report["signed"]["first_bad"] == 1
    message = report["signed"]["message"]
    assert "signed checkpoint 1" in message and "its config is not the signed one" in message
    assert "budget: the ledger has (epsilon 1000, delta 0.001), the checkpoint has (epsilon 10, delta 0.001)" in message
    assert "its config is not the signed one" in err and len(err.strip().splitlines()) == 1
    assert main(["audit", str(path), "--public-key", str(keys["operator"][1])]) == 1
    assert "signed      : FAILED" in capsys.readouterr().out


def test_a_checkpoint_at_zero_rows_pins_the_data_set_name(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _open_budget(path, BUDGET, dataset="dolly")
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    conn = _raw(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'dataset'", ('"another-data-set"',))
    conn.close()
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 1 and "its dataset is not the signed one" in report["signed"]["message"]
    assert '"another-data-set"' in report["signed"]["message"]


def test_a_data_set_or_accountant_not_yet_set_when_signed_may_be_set_later(tmp_path, capsys, keys):
    """What the ledger allows stays allowed: a checkpoint of a ledger with no data set or accountant yet (null in
    the statement) is extended by the ledger once both are set (each can be set once, before the first row)."""
    path = tmp_path / "l.sqlite"
    Ledger.open(path).close()
    _sign(path, keys["operator"][0])
    checkpoint = json.loads(capsys.readouterr().out)
    assert checkpoint["dataset"] is None and checkpoint["config"] is None
    _build(path)
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1])
    assert code == 0 and report["signed"]["ok"], report["signed"]["message"]


def _resign(checkpoint, key_file, **changes):
    """``checkpoint`` with ``changes``, signed again by the key in ``key_file`` (what only the key holder can do)."""
    import pate_accountant.checkpoints as checkpoints_module

    statement = {key: value for key, value in {**checkpoint, **changes}.items() if key != "signature"}
    signature = load_private_key(key_file).sign(checkpoints_module._signed_bytes(statement))
    return {**statement, "signature": signature.hex()}


def test_every_field_of_the_statement_is_checked_against_the_ledger(tmp_path, keys):
    """A validly signed statement that does not describe this ledger fails, naming its field: the signature alone
    is not enough (each case is signed by the operator's own key)."""
    path = tmp_path / "l.sqlite"
    head = _build(path)
    public = load_public_key(keys["operator"][1])
    private = keys["operator"][0]
    with Ledger.open(path, read_only=True) as ledger:
        checkpoint = sign_checkpoint(ledger, load_private_key(private))
        assert check_checkpoints(ledger, [checkpoint], public).ok
        cases = {  # field: (the change, what the reason says)
            "ledger_id": ({"ledger_id": "0" * 32}, "another ledger id"),
            "dataset": ({"dataset": "other"}, "its dataset is not the signed one"),
            "config": ({"config": {**ledger.config, "budget": [99.0, 0.1]}}, "its config is not the signed one"),
            "rows": ({"rows": head["rows"] + 1}, f"fewer than the {head['rows'] + 1} recorded"),
            "head_hash": ({"head_hash": "0" * 64}, f"row {head['rows']} does not have the recorded head hash"),
            "runs": ({"runs": head["runs"] + 1}, f"fewer than the {head['runs'] + 1} recorded"),
            "run_head_hash": ({"run_head_hash": "1" * 64}, f"run {head['runs']} does not have the recorded hash"),
            "signed_at": ({"signed_at": ledger.created - 10 * 86400.0}, "its signed_at"),  # before the ledger
            "software_version": ({"software_version": ""}, "its software_version is malformed"),
            "rows (malformed)": ({"rows": "6"}, "its rows is malformed"),
            "head_hash (malformed)": ({"rows": 0}, "its head_hash is malformed"),  # 0 rows with a head hash
        }
        for name, (change, reason) in cases.items():
            result = check_checkpoints(ledger, [_resign(checkpoint, private, **change)], public)
            assert not result.ok and result.first_bad == 1, name
            assert reason in result.message, (name, result.message)


def test_a_checkpoint_cannot_say_it_was_signed_before_the_run_it_covers_began(tmp_path, monkeypatch, keys):
    import time

    from test_ledger import _Clock, _use_clock

    clock = _Clock()
    clock.now = time.time() - 7200.0  # the ledger is made two hours ago ...
    _use_clock(monkeypatch, clock)
    path = tmp_path / "l.sqlite"
    with Ledger.open(path) as ledger:
        ledger.set_dataset("sample")
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        ledger.begin_run({"run": 1})
        accountant.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
        clock.now = time.time() - 60.0  # ... and its second run began a minute ago
        ledger.begin_run({"run": 2})
        accountant.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
    monkeypatch.undo()
    public, private = load_public_key(keys["operator"][1]), keys["operator"][0]
    with Ledger.open(path, read_only=True) as ledger:
        checkpoint = sign_checkpoint(ledger, load_private_key(private))
        assert check_checkpoints(ledger, [checkpoint], public).ok
        an_hour_ago = _resign(checkpoint, private, signed_at=time.time() - 3600.0)
        result = check_checkpoints(ledger, [an_hour_ago], public)
        assert not result.ok and "its signed_at" in result.message and "before run 2 began" in result.message


# -- issue 22, item 13: key and checkpoint files are read within limits ---------------------------------------
@pytest.fixture
def no_hang():
    """Fail instead of blocking forever (a FIFO with no writer blocks an ordinary open)."""
    import signal

    def hung(*_):
        pytest.fail("blocked on a file instead of refusing it")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _last_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


def test_a_device_a_fifo_or_a_huge_file_as_a_key_is_refused_in_one_line(tmp_path, capsys, keys, no_hang):
    """Attack transcript: ``audit --public-key /dev/zero`` used to end in a MemoryError traceback and a FIFO hung
    forever.  Now each is a usage error (exit 2) in one line naming the option and the file; a FIFO is refused
    before it is opened, and at most a few kilobytes of a regular file are read."""
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.pem"
    with open(huge, "wb") as handle:  # a sparse 64 MiB file of zeros: never read in full
        handle.truncate(1 << 26)
    for key, words in (("/dev/zero", "a character device"), (str(fifo), "a named pipe (FIFO)"),
                       (str(huge), "larger than 8192 bytes")):
        assert main(["audit", str(path), "--public-key", key]) == 2
        line = _last_error_line(capsys)
        assert "--public-key" in line and key in line and words in line
        assert main(["sign", str(path), "--key", key]) == 2
        line = _last_error_line(capsys)
        assert "--key" in line and key in line and words in line
        with pytest.raises(CheckpointError, match="not a regular file|larger than"):
            load_public_key(key)
    assert len(read_checkpoints(default_checkpoints_path(path))) == 1  # nothing signed meanwhile


def test_a_checkpoints_file_that_is_a_fifo_or_has_an_overlong_line_is_refused(tmp_path, capsys, keys, no_hang):
    path = tmp_path / "l.sqlite"
    _build(path)
    _sign(path, keys["operator"][0])
    capsys.readouterr()
    fifo = tmp_path / "checkpoints.fifo"
    os.mkfifo(fifo)
    code, report, err = _audit(capsys, path, "--public-key", keys["operator"][1], "--checkpoints", fifo)
    assert code == 1 and "named pipe (FIFO), not a regular file" in report["signed"]["message"]
    assert str(fifo) in err and len(err.strip().splitlines()) == 1
    with pytest.raises(CheckpointError, match="not a regular file"):
        append_checkpoint(fifo, {"format": "x"})  # a writer is refused without blocking too
    long_line = tmp_path / "long.jsonl"
    [checkpoint] = read_checkpoints(default_checkpoints_path(path))
    long_line.write_text(json.dumps(checkpoint) + "\n" + '{"pad": "' + "x" * 200_000 + '"}\n')
    with pytest.raises(CheckpointError, match="line 2: longer than 65536 bytes"):
        read_checkpoints(long_line)
    code, report, _ = _audit(capsys, path, "--public-key", keys["operator"][1], "--checkpoints", long_line)
    assert code == 1 and "line 2: longer than" in report["signed"]["message"]
    no_newline = tmp_path / "zeros.jsonl"
    with open(no_newline, "wb") as handle:  # 64 MiB with no line end: refused after the first 64 KiB
        handle.truncate(1 << 26)
    with pytest.raises(CheckpointError, match="line 1: longer than"):
        read_checkpoints(no_newline)


# -- issue 22, item 15: keygen and sign refuse in one line ------------------------------------------------------
def test_keygen_with_one_file_for_both_keys_is_refused_and_leaves_nothing(tmp_path, capsys):
    key = tmp_path / "k"
    assert main(["keygen", str(key), "--public-key", str(key)]) == 2
    line = _last_error_line(capsys)
    assert "public key file" in line and str(key) in line and "is the private key file" in line
    assert list(tmp_path.iterdir()) == []  # no private key left behind
    os.symlink(tmp_path / "k", tmp_path / "alias.pub")  # the same file under another name
    assert main(["keygen", str(key), "--public-key", str(tmp_path / "alias.pub")]) == 2
    assert "alias.pub" in _last_error_line(capsys) and not key.exists()
    assert main(["keygen", str(key)]) == 0 and key.exists() and (tmp_path / "k.pub").exists()


def test_sign_refuses_a_missing_confidential_file_as_audit_does(tmp_path, capsys, keys):
    path = tmp_path / "l.sqlite"
    _build(path)
    missing = tmp_path / "nofile"
    assert main(["audit", str(path), "--confidential", str(missing)]) == 2
    audit_line = _last_error_line(capsys)
    assert main(["sign", str(path), "--key", str(keys["operator"][0]), "--confidential", str(missing)]) == 2
    line = _last_error_line(capsys)
    assert "--confidential" in line and str(missing) in line and "no file" in line and "no file" in audit_line
    assert not os.path.exists(default_checkpoints_path(path))  # nothing signed


def test_keygen_warns_when_the_private_key_lands_in_a_git_working_tree(tmp_path, capsys):
    """Issue 32, item 8: the tutorial's key landed in the repository's working tree, where `git add .` commits it."""
    repository = tmp_path / "repo"
    (repository / ".git").mkdir(parents=True)
    (repository / "sub").mkdir()
    assert main(["keygen", str(repository / "sub" / "operator.key")]) == 0
    err = capsys.readouterr().err
    assert "is inside the git working tree" in err and str(repository) in err and "git add ." in err
    assert main(["keygen", str(tmp_path / "elsewhere.key")]) == 0
    assert capsys.readouterr().err == ""
