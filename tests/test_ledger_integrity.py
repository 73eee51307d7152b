"""A ledger you can hand to an auditor (issue 14): private files, a complete main file after every session,
audits that never write and say honestly whether they could check, and a head pinned outside the file that
catches a history rewritten consistently.  Everything through the public API and the real command line."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat

import pytest

from pate_accountant.accountants import BasicCompositionAccountant, IndividualChargingAccountant
from pate_accountant.cli import main
from pate_accountant.events import BetweenThresholdsEvent, EpsilonDeltaEvent
from pate_accountant.ledger import PRIVATE_FILE_MODE, InterruptedWriteError, Ledger
from pate_accountant.release import Release
from test_ledger import _edit_event_epsilon, _raw, _rehash

BUDGET = (10.0, 1e-3)


def _fill(path, rows, *, epsilon=0.05):
    """A basic-composition ledger at ``path`` with ``rows`` charged releases (appended when it exists)."""
    event = EpsilonDeltaEvent(epsilon, 1e-8)
    with Ledger.open(path) as ledger:
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
        for i in range(rows):
            accountant.record(Release("tok" if i % 2 else None, event))
        return ledger.head_hash


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _audit(capsys, *argv):
    code = main(["audit", *map(str, argv), "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


@pytest.fixture
def loose_umask():
    old = os.umask(0o022)  # the usual default: new files readable by everyone
    yield
    os.umask(old)


# -- 4. private files -----------------------------------------------------------------------------------------
def test_new_ledger_files_are_readable_by_their_owner_only(tmp_path, loose_umask):
    path = tmp_path / "private.sqlite"
    event = BetweenThresholdsEvent(0.1, q=0.3)
    with Ledger.open(path) as ledger:
        accountant = IndividualChargingAccountant(20, per_teacher_limit=50, ledger=ledger)
        accountant.record(Release("between", event, target_hit=True, charged_teachers={1, 2}))
        beside = sorted(p.name for p in tmp_path.iterdir())
        assert "private.sqlite.confidential.sqlite" in beside and "private.sqlite-wal" in beside
        for name in beside:  # the ledger, its confidential file and their -wal/-shm files
            assert _mode(tmp_path / name) == PRIVATE_FILE_MODE, name
    assert _mode(path) == _mode(tmp_path / "private.sqlite.confidential.sqlite") == 0o600


def test_an_existing_files_permissions_are_left_alone(tmp_path, loose_umask):
    path = tmp_path / "shared.sqlite"
    _fill(path, 2)
    os.chmod(path, 0o640)  # its owner chose to share it with a group
    _fill(path, 1)
    assert _mode(path) == 0o640


# -- 2. the main file is complete after every session ------------------------------------------------------
def test_closing_checkpoints_so_a_copy_of_the_main_file_alone_is_complete(tmp_path):
    path = tmp_path / "live.sqlite"
    head = _fill(path, 40)
    wal = tmp_path / "live.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)  # without any -wal: the main file holds every row
    with Ledger.open(copy, read_only=True) as ledger:
        assert ledger.row_count == 40 and ledger.head_hash == head and ledger.verify().ok


def test_checkpoint_reports_a_log_it_could_not_empty(tmp_path):
    path = tmp_path / "busy.sqlite"
    _fill(path, 3)
    with Ledger.open(path) as writer:
        reader = sqlite3.connect(str(path))
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM charges").fetchone()  # a read transaction pins the log
        BasicCompositionAccountant(budget=BUDGET, ledger=writer).record(Release(None, EpsilonDeltaEvent(0.05, 1e-8)))
        assert writer.checkpoint() is False
        reader.rollback()
        reader.close()
        assert writer.checkpoint() is True


# -- 3. honest verdicts -----------------------------------------------------------------------------------
def test_an_audit_writes_nothing_and_creates_nothing_beside_the_ledger(tmp_path, capsys):
    path = tmp_path / "ledger.sqlite"
    _fill(path, 5)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, report, _ = _audit(capsys, path)
    assert code == 0 and report["ok"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("kind", ["not sqlite", "another database"])
def test_a_file_that_cannot_be_checked_is_not_a_failed_verification(tmp_path, capsys, kind):
    path = tmp_path / "other.sqlite"
    if kind == "not sqlite":
        path.write_bytes(b"just some bytes " * 100)
    else:
        conn = sqlite3.connect(str(path))
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.commit()
        conn.close()
    before = path.read_bytes()
    code, report, err = _audit(capsys, path)
    assert code == 3 and report["verdict"] == "cannot check" and not report["ok"]
    assert "cannot check" in err and err.count("\n") == 1
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]


def test_an_interrupted_write_is_reported_as_such(tmp_path, capsys):
    path = tmp_path / "half.sqlite"
    _fill(path, 2)
    (tmp_path / "half.sqlite-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\0" * 504)
    with pytest.raises(InterruptedWriteError, match="interrupted"):
        Ledger.open(path, read_only=True)
    code, report, err = _audit(capsys, path)
    assert code == 3 and "interrupted" in report["message"] and "interrupted" in err


def test_a_tampered_row_still_fails_with_status_1(tmp_path, capsys):
    path = tmp_path / "edited.sqlite"
    _fill(path, 4)
    conn = _raw(path)  # the append-only triggers dropped, as a tamperer would
    _edit_event_epsilon(conn, 2, 0.01)
    conn.close()
    code, report, _ = _audit(capsys, path)
    assert code == 1 and report["first_bad_row"] == 2


# -- 2. a head pinned outside the file ---------------------------------------------------------------------
def test_a_consistently_rewritten_history_verifies_alone_but_not_against_its_pinned_head(tmp_path, capsys):
    path = tmp_path / "history.sqlite"
    head = _fill(path, 6, epsilon=0.5)
    code, report, _ = _audit(capsys, path, "--expect-head", head, "--expect-rows", 6)
    assert code == 0 and report["pinned"] == {"head": head, "rows": 6, "run_head": None, "runs": None, "extends": True}

    # The forger lowers an epsilon in place and recomputes every hash and total: a consistent history.
    conn = _raw(path)
    _edit_event_epsilon(conn, 3, 0.05)
    _rehash(conn, respend=True)
    forged_head = conn.execute("SELECT last_hash FROM head").fetchone()[0]
    conn.close()
    code, report, _ = _audit(capsys, path)
    assert code == 0 and report["ok"]  # the chain alone cannot tell
    code, report, err = _audit(capsys, path, "--expect-head", head, "--expect-rows", 6)
    assert code == 1 and not report["pinned"]["extends"] and "pinned head" in report["message"]
    assert forged_head != head and "does not verify" in err

    # Or replaces the file with a fresh ledger of the same shape.
    path.unlink()
    _fill(path, 6, epsilon=0.05)
    assert _audit(capsys, path)[0] == 0
    assert _audit(capsys, path, "--expect-head", head, "--expect-rows", 6)[0] == 1


def test_a_history_that_grew_extends_its_pin_and_a_shorter_one_does_not(tmp_path, capsys):
    path = tmp_path / "grows.sqlite"
    head = _fill(path, 4)
    _fill(path, 3)  # a later run appends
    assert _audit(capsys, path, "--expect-head", head, "--expect-rows", 4)[0] == 0
    assert _audit(capsys, path, "--expect-head", head)[0] == 0  # some row carries the pinned head
    code, report, _ = _audit(capsys, path, "--expect-rows", 8)
    assert code == 1 and "fewer than the 8 pinned" in report["message"]


def test_a_bad_pin_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "x.sqlite"
    _fill(path, 1)
    assert main(["audit", str(path), "--expect-head", "abc"]) == 2
    assert "64 hexadecimal digits" in capsys.readouterr().err


def test_a_raised_budget_with_recomputed_hashes_is_caught_by_the_pin(tmp_path, capsys):
    path = tmp_path / "budget.sqlite"
    head = _fill(path, 5)
    conn = _raw(path)
    config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    config["budget"] = [1000.0, 1e-3]
    conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps(config, separators=(",", ":")),))
    _rehash(conn)  # the genesis hash covers the configuration: every row hash changes
    conn.close()
    code, report, _ = _audit(capsys, path)
    assert code == 0 and report["budget"] == {"epsilon": 1000.0, "delta": 1e-3}
    assert _audit(capsys, path, "--expect-head", head, "--expect-rows", 5)[0] == 1


# -- 3. a kill during creation leaves no ledger or a complete one ------------------------------------------
def test_a_ledger_appears_complete_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "new.sqlite"

    def interrupted(self, *, create):
        raise KeyboardInterrupt  # as if the process were stopped while it builds the ledger

    original = Ledger._check_layout
    monkeypatch.setattr(Ledger, "_check_layout", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Ledger.open(path)
    assert list(tmp_path.iterdir()) == []  # no ledger, no half-made file, no temporary left
    monkeypatch.setattr(Ledger, "_check_layout", original)
    _fill(path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.sqlite"]
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok and ledger.row_count == 2


def test_without_hard_links_the_ledger_is_made_in_place(tmp_path, monkeypatch):
    import errno

    def no_links(source, target):  # what a file system without hard links (FAT, some network shares) answers
        raise OSError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "inplace.sqlite"
    _fill(path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inplace.sqlite"]
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok and ledger.row_count == 3


def test_a_pin_mismatch_is_reported_as_such_in_text(tmp_path, capsys):
    path = tmp_path / "text.sqlite"
    head = _fill(path, 3)
    _fill(path, 1)
    other = tmp_path / "other.sqlite"
    _fill(other, 3, epsilon=0.1)
    assert main(["audit", str(other), "--expect-head", head, "--expect-rows", "3"]) == 1
    out = capsys.readouterr().out
    assert "rows        : 3\n" in out and "verified before the failure" not in out
    assert "pinned      : head " in out and "NOT extended" in out and "verdict     : FAILED" in out
    assert main(["audit", str(path), "--expect-head", head, "--expect-rows", "3"]) == 0
    assert "pinned      : head " in capsys.readouterr().out


# -- 1. a claimed ledger that nobody used is removed, and only then ----------------------------------------
def _claim(path, individual=False):
    """What a run does before its slow start: open (creating), name the data set, attach the accountant."""
    ledger = Ledger.open(path)
    ledger.set_dataset("sample")
    if individual:
        IndividualChargingAccountant(8, per_teacher_limit=50, ledger=ledger)
    else:
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger)
    return ledger


def test_an_unused_ledger_its_creator_discards_leaves_no_file(tmp_path):
    path = tmp_path / "claimed.sqlite"
    ledger = _claim(path)
    assert ledger.created_here and path.exists()
    assert ledger.discard_if_unused() is True
    assert list(tmp_path.iterdir()) == []  # nor -wal, -shm or -journal


def test_an_unused_confidential_ledger_is_discarded_with_its_confidential_file(tmp_path):
    path = tmp_path / "individual.sqlite"
    ledger = _claim(path, individual=True)
    assert ledger.has_confidential and os.path.exists(ledger.confidential_path)
    assert ledger.discard_if_unused() is True
    assert list(tmp_path.iterdir()) == []


def test_a_ledger_another_connection_has_open_is_kept(tmp_path):
    path = tmp_path / "joined.sqlite"
    first = _claim(path)
    second = _claim(path)  # another run joined during the first one's slow start
    assert not second.created_here
    assert first.discard_if_unused() is False
    assert path.exists()
    _charge = BasicCompositionAccountant(budget=BUDGET, ledger=second)
    second.begin_run({"run": 2})
    _charge.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
    second.close()
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok and ledger.row_count == 1 and len(ledger.runs) == 1


@pytest.mark.parametrize("use", ["run", "row", "not created here"])
def test_a_ledger_with_a_run_or_a_row_or_made_by_another_is_kept(tmp_path, use):
    path = tmp_path / "used.sqlite"
    if use == "not created here":
        _claim(path).close()
    ledger = _claim(path)
    if use == "run":
        ledger.begin_run({"run": 1})
    elif use == "row":
        BasicCompositionAccountant(budget=BUDGET, ledger=ledger).compose(EpsilonDeltaEvent(0.1, 1e-8))
    assert ledger.discard_if_unused() is False
    with Ledger.open(path, read_only=True) as reopened:
        assert reopened.verify().ok and reopened.dataset == "sample"


def test_a_process_that_opened_the_file_just_before_it_was_discarded_opens_the_new_one(tmp_path, monkeypatch):
    """The interleaving the discard mark exists for: B's connection reaches the file, then A removes it, then B
    reads.  B must not use the removed file (its charges would be lost with it): it sees the mark and opens
    what is at the path, a new ledger, whose rows are on disk."""
    path = tmp_path / "raced.sqlite"
    first = _claim(path)
    first_id = first.ledger_id
    connect = sqlite3.connect
    calls = []

    def connect_then_discard(database, *args, **kwargs):
        conn = connect(database, *args, **kwargs)
        if database == str(path) and not calls:
            calls.append(database)
            assert first.discard_if_unused() is True  # after B connected, before B reads
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect_then_discard)
    second = _claim(path)
    monkeypatch.setattr(sqlite3, "connect", connect)
    second_id = second.ledger_id
    assert calls and second_id != first_id and second.created_here
    accountant = BasicCompositionAccountant(budget=BUDGET, ledger=second)
    second.begin_run({"run": 1})
    accountant.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
    second.close()
    with Ledger.open(path, read_only=True) as reopened:
        assert reopened.ledger_id == second_id and reopened.row_count == 1 and reopened.verify().ok


def test_a_discard_mark_left_at_the_path_is_reported(tmp_path, monkeypatch, capsys):
    """A run stopped between marking its empty ledger and unlinking it (a kill in that instant) leaves a file
    that nobody may use: reading it says there is no ledger, writing it names the file to delete."""
    import pate_accountant.ledger as ledger_module
    from pate_accountant._ledger import sqlite_store

    path = tmp_path / "abandoned.sqlite"
    _claim(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO meta (key, value) VALUES ('discarded', 'true')")
    conn.commit()
    conn.close()
    with pytest.raises(FileNotFoundError, match="no ledger at"):
        Ledger.open(path, read_only=True)
    monkeypatch.setattr(sqlite_store, "DISCARDED_WAIT_S", 0.05)
    with pytest.raises(ledger_module.LedgerError, match="delete the file"):
        Ledger.open(path)
    assert main(["audit", str(path)]) == 3  # the file is there but holds no ledger to check
    assert "marked for removal" in capsys.readouterr().err


def test_a_ledger_that_cannot_be_removed_stays_usable(tmp_path, monkeypatch):
    path = tmp_path / "stuck.sqlite"
    ledger = _claim(path)
    unlink = os.unlink

    def refuse(target, *args, **kwargs):
        if os.fspath(target) == str(path):
            raise PermissionError("not allowed here")
        return unlink(target, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    assert ledger.discard_if_unused() is False
    monkeypatch.setattr(os, "unlink", unlink)
    with Ledger.open(path) as reopened:  # no discard mark left behind: a later run uses it
        accountant = BasicCompositionAccountant(budget=BUDGET, ledger=reopened)
        reopened.begin_run({"run": 1})
        accountant.record(Release("tok", EpsilonDeltaEvent(0.1, 1e-8)))
    with Ledger.open(path, read_only=True) as reopened:
        assert reopened.verify().ok and reopened.row_count == 1 and reopened.dataset == "sample"


@pytest.mark.parametrize("failure", ["disk-full-while-building", "disk-full-at-the-link", "read-only-folder"])
def test_a_new_ledger_on_a_full_disk_is_made_whole_or_not_at_all(tmp_path, monkeypatch, failure):
    """Issue 22, item 15: a ledger whose creation fails (a full disk while its tables are written, or when it is
    linked into place; a folder that refuses the link) is not made in place instead: one ``LedgerError`` naming
    the path, nothing at the path, no temporary file left beside it.  Only a file system without hard links makes
    a ledger in place (``test_without_hard_links_the_ledger_is_made_in_place`` above covers that)."""
    import errno

    import pate_accountant.ledger as ledger_module
    from pate_accountant._ledger import sqlite_store

    path = tmp_path / "new.sqlite"
    if failure == "disk-full-while-building":
        def full(conn, where):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(sqlite_store, "_set_wal", full)
        message = "database or disk is full"
    else:
        code = errno.ENOSPC if failure == "disk-full-at-the-link" else errno.EACCES

        def link(src, dst):
            raise OSError(code, os.strerror(code), str(dst))

        monkeypatch.setattr(sqlite_store.os, "link", link)
        message = os.strerror(code)
    with pytest.raises(ledger_module.LedgerError, match=f"cannot create a ledger at .*new.sqlite.*{message}"):
        Ledger.open(str(path))
    assert list(tmp_path.iterdir()) == []
