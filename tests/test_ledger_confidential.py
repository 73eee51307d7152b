"""The ledger's shareable / confidential split for individual charging.

A run with individual charging (the real generator, the real ledger) must leave in the shareable file only
DP outputs and data-independent parameters: no teacher sets, no counts, no data-dependent totals, and no
row of any kind that a non-hit charge could have filled with teachers.  The confidential file holds exactly
the hit charges, hash-linked to the shareable rows and committed to by a salted HMAC there.  Tampering with
either file, or with the link, is caught; ``audit`` checks both files when both are present and the
shareable part alone otherwise, and says which.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ensembles.backends import ToyBackend
from ensembles.generation import PrivateGenerator
from mechanisms import BetweenThresholds
from pate_accountant import ledger as ledger_module
from pate_accountant.accountants import IndividualChargingAccountant
from pate_accountant.cli import main
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.events import BetweenThresholdsEvent
from pate_accountant.ledger import Ledger, LedgerError, confidential_path
from pate_accountant.release import Release
from pate_accountant.serialization import canonical_json, event_to_data

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat", "dog", "ran", "."]
W = {w: i for i, w in enumerate(VOCAB)}
CHAIN = {W["the"]: W["cat"], W["cat"]: W["sat"], W["sat"]: W["on"], W["on"]: W["the"], W["<unk>"]: W["the"]}
TEACHERS = 30
LIMIT = 3
SHAREABLE_TABLES = {"meta", "charges", "runs", "head"}
SHAREABLE_META = {"schema_version", "ledger_id", "created", "software_version", "config", "dataset", "run_metadata"}


def _chain(top):
    def f(teacher, context):
        p = np.full(len(VOCAB), (1 - top) / (len(VOCAB) - 1))
        p[CHAIN.get(context[-1] if context else 0, W["the"])] = top
        return p

    return f


def _accountant(ledger=None):
    bt = BetweenThresholds(0.5, 3, 9)
    return bt, IndividualChargingAccountant(TEACHERS, per_teacher_limit=LIMIT, epsilon0=0.5, q=bt.q, ledger=ledger)


def _generate(path, seed=3):
    """A real individual-charging run: PrivateGenerator + BetweenThresholds + a file ledger.  Returns the
    accountant, the result and every release the accountant recorded."""
    ledger = Ledger.open(path)
    ledger.set_dataset("toy-teachers")
    ledger.begin_run({"mechanism": "between-thresholds", "seeded": True})
    bt, acc = _accountant(ledger)
    recorded = []
    original = acc.record

    def record(release):
        original(release)
        recorded.append(release)

    acc.record = record
    gen = PrivateGenerator(ToyBackend(_chain(0.8), VOCAB), bt, acc, max_tokens=30, fallback="public",
                           public_backend=ToyBackend(_chain(1.0), VOCAB), seed=seed)
    result = gen.generate([f"private prompt {i}" for i in range(TEACHERS)],
                          mechanism_rng=np.random.default_rng(seed))  # a reproducible test run
    return ledger, acc, result, recorded


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("individual-run")
    path = folder / "run.sqlite"
    ledger, acc, result, recorded = _generate(path)
    state = (acc.counters.tolist(), sorted(acc.removed_teachers), acc.spent(), acc.hits, acc.misses)
    ledger.close()
    return {"folder": folder, "path": path, "result": result, "recorded": recorded, "state": state}


def _copy(run, tmp_path) -> Path:
    """A private copy of the run's two files (tamper tests edit it)."""
    path = tmp_path / "run.sqlite"
    shutil.copy(run["path"], path)
    shutil.copy(confidential_path(run["path"]), confidential_path(path))
    return path


def _raw(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def _all_cells(path) -> list:
    conn = sqlite3.connect(path)
    cells = []
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        for row in conn.execute(f"SELECT * FROM {table}"):
            cells.extend(row)
    conn.close()
    return cells


# -- what each file holds ------------------------------------------------------------------------------------


def test_the_run_charged_hits_and_non_hits(run):
    recorded = run["recorded"]
    hits = [r for r in recorded if r.target_hit]
    misses = [r for r in recorded if not r.target_hit]
    assert len(hits) >= 3 and len(misses) >= 3  # the checks below see both kinds
    assert any(len(r.charged_teachers) >= 2 for r in hits)
    assert all(r.charged_teachers == frozenset() for r in misses)  # a non-hit names nobody
    counters, removed, *_ = run["state"]
    assert removed and max(counters) == LIMIT  # teachers reached the limit and were removed


def test_shareable_row_times_are_the_runs_start_whatever_each_step_took(run):
    """Issue 22, item 6: a step's wall-clock time depends on prompt lengths and, under individual charging, on how
    many teachers remain.  Every shareable row stores its run's start instead, so the times in the file say when
    the run began and nothing about its steps; no per-step time is kept in either file."""
    conn = sqlite3.connect(run["path"])
    (started,) = conn.execute("SELECT created FROM runs WHERE id = 1").fetchone()
    times = {created for (created,) in conn.execute("SELECT created FROM charges")}
    conn.close()
    assert len(run["recorded"]) > 5 and times == {started}
    conf = sqlite3.connect(confidential_path(run["path"]))
    columns = {c[1] for (table,) in conf.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
               for c in conf.execute(f"PRAGMA table_info({table})")}
    conf.close()
    assert not any("time" in c or "created" in c for c in columns)


def test_shareable_file_holds_no_teacher_sets_counts_or_data_dependent_totals(run):
    path = run["path"]
    conn = sqlite3.connect(path)
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == SHAREABLE_TABLES
    columns = {table: [c[1] for c in conn.execute(f"PRAGMA table_info({table})")] for table in tables}
    assert columns["charges"] == ["id", "prev_hash", "hash", "event", "count", "outcome", "commitment",
                                  "spent_epsilon", "spent_delta", "created", "writer", "run", "grp"]
    assert not any("teacher" in c for cols in columns.values() for c in cols)
    # Every charge row is a function of public things only: the (fixed) event, multiplicity one, the outcome
    # class (a DP output), the time, the writer, the run, and a salted commitment on hits.
    event_text = canonical_json(event_to_data(BetweenThresholds(0.5, 3, 9).event))
    rows = conn.execute("SELECT id, event, count, outcome, commitment, spent_epsilon, spent_delta, run "
                        "FROM charges ORDER BY id").fetchall()
    outcomes = [r.outcome for r in run["recorded"]]  # "target" on hits; the other answers are non-hit classes
    assert "target" in outcomes and set(outcomes) - {"target"} and set(outcomes) <= {"target", "token", "below"}
    assert [row[3] for row in rows] == outcomes
    for row_id, event, count, outcome, commitment, spent_eps, spent_delta, run_id in rows:
        assert event == event_text and count == 1 and run_id == 1
        assert spent_eps is None and spent_delta is None  # the data-dependent spent() stays confidential
        assert (commitment is not None) == (outcome == "target")
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    assert set(meta) <= SHAREABLE_META
    assert json.loads(meta["config"])["kind"] == "individual-charging"
    (run_meta,) = [json.loads(text) for (text,) in conn.execute("SELECT metadata FROM runs")]
    assert run_meta == {"mechanism": "between-thresholds", "seeded": True}
    conn.close()
    # No teacher set of any hit appears anywhere: not in a cell, not in the raw bytes (database and WAL).
    blobs = b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))
                     if not p.name.endswith(ledger_module.CONFIDENTIAL_SUFFIX)
                     and ".confidential." not in p.name)
    cells = [c for c in _all_cells(path) if isinstance(c, str)]
    for release in run["recorded"]:
        if len(release.charged_teachers) >= 2:
            text = ledger_module._teachers_text(release.charged_teachers)
            assert text.encode() not in blobs
            assert not any(text in cell or text[1:-1] in cell for cell in cells)


def test_commitment_is_salted_and_reveals_nothing_without_the_salt(run):
    conf = sqlite3.connect(confidential_path(run["path"]))
    links = conf.execute("SELECT share_row, salt, charged_teachers FROM charges ORDER BY id").fetchall()
    conf.close()
    share = sqlite3.connect(run["path"])
    commitments = dict(share.execute("SELECT id, commitment FROM charges WHERE commitment IS NOT NULL"))
    share.close()
    salts = set()
    for share_row, salt, teachers in links:
        commitment = commitments[share_row]
        assert commitment == ledger_module._commitment(salt, share_row, teachers)
        # Without the salt, hashing a guessed set (the true one included) does not reproduce it.
        for guess in (teachers, f"{share_row}|{teachers}", f"pate-accountant teachers|{share_row}|{teachers}"):
            assert hashlib.sha256(guess.encode()).hexdigest() != commitment
        assert ledger_module._commitment("00" * 32, share_row, teachers) != commitment
        salts.add(salt)
    assert len(salts) == len(links)  # a fresh 256-bit salt per row


def test_confidential_file_holds_exactly_the_hit_charges(run):
    conf = sqlite3.connect(confidential_path(run["path"]))
    tables = {name for (name,) in conf.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"meta", "charges", "totals", "head"}
    links = conf.execute("SELECT share_row, charged_teachers FROM charges ORDER BY id").fetchall()
    totals = conf.execute("SELECT share_row, spent_epsilon, spent_delta FROM totals ORDER BY share_row").fetchall()
    conf.close()
    share = sqlite3.connect(run["path"])
    hit_rows = [row_id for (row_id,) in share.execute("SELECT id FROM charges WHERE outcome = 'target' ORDER BY id")]
    rows = share.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    share.close()
    hits = [r.charged_teachers for r in run["recorded"] if r.target_hit]
    assert [share_row for share_row, _ in links] == hit_rows  # one row per hit, none for a non-hit
    assert [frozenset(json.loads(text)) for _, text in links] == hits
    assert [share_row for share_row, _, _ in totals] == list(range(1, rows + 1))  # one record() per transaction
    assert totals[-1][1:] == pytest.approx(run["state"][2])


def test_replay_from_both_files_gives_the_same_state(run):
    with Ledger.open(run["path"], read_only=True) as ledger:
        _, acc = _accountant(ledger)
        state = (acc.counters.tolist(), sorted(acc.removed_teachers), acc.spent(), acc.hits, acc.misses)
        assert state == run["state"]
        rows = list(ledger.rows())
    hits = [r.charged_teachers for r in run["recorded"] if r.target_hit]
    assert [row.charged_teachers for row in rows if row.outcome == "target"] == hits
    assert all(row.charged_teachers == frozenset() for row in rows if row.outcome != "target")


# -- audit with and without the confidential file ---------------------------------------------------------------


def test_audit_checks_both_files_when_both_are_present(run, capsys):
    with Ledger.open(run["path"], read_only=True) as ledger:
        result = ledger.verify()
    assert result.ok, result.message
    assert result.confidential == "verified" and result.spent == pytest.approx(run["state"][2])
    assert result.hits == run["state"][3] and result.queries == run["state"][3] + run["state"][4]
    assert "shareable and confidential parts" in result.message
    assert main(["audit", str(run["path"])]) == 0
    out = capsys.readouterr().out
    assert "checked     : shareable and confidential parts" in out
    assert "confidential: a function of who was charged" in out
    assert main(["audit", str(run["path"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["confidential"] == "verified" and data["spent"]["epsilon"] == pytest.approx(run["state"][2][0])


def test_audit_checks_the_shareable_part_alone_without_the_confidential_file(run, tmp_path, capsys):
    path = tmp_path / "shared.sqlite"
    shutil.copy(run["path"], path)  # the shareable file only, as an auditor would get it
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert result.ok, result.message
    assert result.confidential == "absent" and result.spent is None
    assert result.rows == len(run["recorded"]) and result.hits == run["state"][3]
    assert "shareable part verified" in result.message and "not found" in result.message
    assert main(["audit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "checked     : shareable part only" in out
    assert "spent       : confidential" in out
    assert main(["audit", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["confidential"] == "absent" and data["spent"] is None
    assert not Path(confidential_path(path)).exists()  # audit never creates it
    # The confidential file may live elsewhere: --confidential points at it.
    elsewhere = tmp_path / "vault.sqlite"
    shutil.copy(confidential_path(run["path"]), elsewhere)
    assert main(["audit", str(path), "--confidential", str(elsewhere), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["confidential"] == "verified"
    assert main(["audit", str(path), "--confidential", str(tmp_path / "missing.sqlite")]) == 2


def test_replay_needs_the_confidential_file(run, tmp_path):
    path = tmp_path / "shared.sqlite"
    shutil.copy(run["path"], path)
    for read_only in (True, False):
        with Ledger.open(path, read_only=read_only) as ledger:
            with pytest.raises(LedgerError, match="needs its confidential file") as caught:
                _accountant(ledger)
            assert confidential_path(path) in str(caught.value) and "\n" not in str(caught.value)
    assert not Path(confidential_path(path)).exists()  # a missing confidential file is never recreated empty
    with Ledger.open(path) as ledger:
        assert ledger.row_count == len(run["recorded"])


def test_confidential_file_of_another_ledger_is_refused(run, tmp_path):
    path = _copy(run, tmp_path)
    other = tmp_path / "other.sqlite"
    with Ledger.open(other) as ledger:
        _, acc = _accountant(ledger)
        acc.record(Release("between", acc_event(), target_hit=True, charged_teachers={1, 2}))
    shutil.copy(confidential_path(other), confidential_path(path))
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
        assert not result.ok and "belongs to another ledger" in result.message
        with pytest.raises(LedgerError, match="belongs to another ledger"):
            _accountant(ledger)


def acc_event():
    return BetweenThresholds(0.5, 3, 9).event


# -- tampering with either file or the link ------------------------------------------------------------------


def _first_hit(path) -> int:
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT MIN(id) FROM charges WHERE outcome = 'target'").fetchone()[0]
    conn.close()
    return row


def _fails_at(path, row, *words, capsys=None):
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert not result.ok, result.message
    assert result.first_bad_row == row, result.message
    for word in words:
        assert word in result.message, result.message
    if capsys is not None:
        assert main(["audit", str(path)]) == 1
        assert f"row {row}" in capsys.readouterr().err
    return result


def _rehash_confidential(conn, share=None):
    """Recompute the confidential chain (and, given the shareable connection, the commitments and the
    shareable chain), as a forger holding both files would."""
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    prev = ledger_module._confidential_genesis_hash(meta)
    rows = conn.execute(f"SELECT {ledger_module._CONF_COLUMNS} FROM charges ORDER BY id").fetchall()
    commitments = {}
    for row_id, _prev, _hash, share_row, share_hash, salt, teachers in rows:
        commitments[share_row] = ledger_module._commitment(salt, share_row, teachers)
    if share is not None:
        share_meta = dict(share.execute("SELECT key, value FROM meta"))
        share_prev = ledger_module._genesis_hash(share_meta)
        hashes = {}
        for raw in share.execute(f"SELECT {ledger_module._ROW_COLUMNS} FROM charges ORDER BY id").fetchall():
            raw = list(raw)
            if raw[0] in commitments:
                raw[6] = commitments[raw[0]]
            digest = ledger_module._row_hash(share_prev, raw[0], *raw[3:])
            share.execute("UPDATE charges SET prev_hash=?, hash=?, commitment=? WHERE id=?",
                          (share_prev, digest, raw[6], raw[0]))
            hashes[raw[0]] = share_prev = digest
        share.execute("UPDATE head SET last_hash=? WHERE id=1", (share_prev,))
        for share_row, digest in hashes.items():
            conn.execute("UPDATE totals SET share_hash=? WHERE share_row=?", (digest, share_row))
    for row_id, _prev, _hash, share_row, share_hash, salt, teachers in rows:
        if share is not None:
            share_hash = share.execute("SELECT hash FROM charges WHERE id=?", (share_row,)).fetchone()[0]
        digest = ledger_module._confidential_row_hash(prev, row_id, share_row, share_hash, salt, teachers)
        conn.execute("UPDATE charges SET prev_hash=?, hash=?, share_hash=? WHERE id=?", (prev, digest, share_hash, row_id))
        prev = digest
    conn.execute("UPDATE head SET row_count=?, last_hash=? WHERE id=1", (len(rows), prev if rows else None))


def test_edited_confidential_teacher_set_is_named(run, tmp_path, capsys):
    path = _copy(run, tmp_path)
    row = _first_hit(path)
    conf = _raw(confidential_path(path))
    conf.execute("UPDATE charges SET charged_teachers = '[0]' WHERE share_row = ?", (row,))
    conf.close()
    _fails_at(path, row, "was edited", capsys=capsys)


def test_rehashed_confidential_edit_does_not_open_the_commitment(run, tmp_path):
    path = _copy(run, tmp_path)
    row = _first_hit(path)
    conf = _raw(confidential_path(path))
    conf.execute("UPDATE charges SET charged_teachers = '[0]' WHERE share_row = ?", (row,))
    _rehash_confidential(conf)
    conf.close()
    _fails_at(path, row, "does not open", "commitment")


def test_swapped_confidential_rows_are_named(run, tmp_path):
    path = _copy(run, tmp_path)
    conf = _raw(confidential_path(path))
    (a, sa, ta), (b, sb, tb) = conf.execute("SELECT id, salt, charged_teachers FROM charges ORDER BY id LIMIT 2")
    conf.execute("UPDATE charges SET salt=?, charged_teachers=? WHERE id=?", (sb, tb, a))
    conf.execute("UPDATE charges SET salt=?, charged_teachers=? WHERE id=?", (sa, ta, b))
    _rehash_confidential(conf)
    conf.close()
    _fails_at(path, _first_hit(path), "does not open")


def test_dropped_confidential_row_is_named(run, tmp_path):
    path = _copy(run, tmp_path)
    row = _first_hit(path)
    conf = _raw(confidential_path(path))
    conf.execute("DELETE FROM charges WHERE share_row = ?", (row,))
    conf.close()
    _fails_at(path, row)
    conf = _raw(confidential_path(path))
    conf.execute("UPDATE charges SET id = id - 1 WHERE id > (SELECT COUNT(*) FROM charges WHERE share_row < ?)",
                 (row,))
    _rehash_confidential(conf)  # even renumbered, with the chain rebuilt, the next hit's row names another row
    conf.close()
    _fails_at(path, row, "names shareable row")


def test_confidential_rows_added_for_non_hits_are_named(run, tmp_path):
    path = _copy(run, tmp_path)
    share = sqlite3.connect(path)
    miss = share.execute("SELECT MAX(id) FROM charges WHERE outcome != 'target'").fetchone()[0]
    share.close()
    conf = _raw(confidential_path(path))
    count = conf.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    conf.execute("INSERT INTO charges VALUES (?, '', '', ?, 'x', ?, '[1]')", (count + 1, miss, "00" * 32))
    _rehash_confidential(conf)
    conf.close()
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert not result.ok and "no hit row names" in result.message, result.message


def test_commitment_moved_to_a_non_hit_row_is_named(run, tmp_path):
    path = _copy(run, tmp_path)
    share = _raw(path)
    miss = share.execute("SELECT MIN(id) FROM charges WHERE outcome != 'target'").fetchone()[0]
    share.execute("UPDATE charges SET commitment = ? WHERE id = ?", ("ab" * 32, miss))
    conf = _raw(confidential_path(path))
    _rehash_confidential(conf, share)
    conf.close()
    share.close()
    _fails_at(path, miss, "not a hit but carries")
    Path(confidential_path(path)).unlink()  # the shareable check alone catches it too
    _fails_at(path, miss, "commitment")


def test_spent_totals_in_the_shareable_file_are_refused(run, tmp_path):
    path = _copy(run, tmp_path)
    share = _raw(path)
    share.execute("UPDATE charges SET spent_epsilon = 0.5, spent_delta = 1e-6 WHERE id = 2")
    conf = _raw(confidential_path(path))
    _rehash_confidential(conf, share)
    conf.close()
    share.close()
    _fails_at(path, 2, "totals are confidential")


def test_edited_confidential_totals_are_named(run, tmp_path):
    path = _copy(run, tmp_path)
    conf = _raw(confidential_path(path))
    last = conf.execute("SELECT MAX(share_row) FROM totals").fetchone()[0]
    conf.execute("UPDATE totals SET spent_epsilon = 0.001 WHERE share_row = ?", (last,))
    conf.close()
    _fails_at(path, last, "totals disagree")


def test_consistent_forgery_beyond_the_per_teacher_limit_is_named(run, tmp_path, capsys):
    """A forger with both files charges teacher 0 on every hit and recomputes every hash, commitment and
    link: the replay with the per-teacher limit still refuses the first charge beyond it."""
    path = _copy(run, tmp_path)
    share = _raw(path)
    conf = _raw(confidential_path(path))
    # Hits that charged somebody (a hit can count nobody); the forger moves every such charge to teacher 0.
    hit_rows = [r for (r,) in conf.execute("SELECT share_row FROM charges WHERE charged_teachers != '[]' ORDER BY id")]
    assert len(hit_rows) > LIMIT
    conf.execute("UPDATE charges SET charged_teachers = '[0]' WHERE charged_teachers != '[]'")
    _rehash_confidential(conf, share)
    conf.close()
    share.close()
    _fails_at(path, hit_rows[LIMIT], "exceeds the budget", capsys=capsys)


# -- a writer stopped between its two commits -------------------------------------------------------------------


def test_stop_between_commits_leaves_a_ledger_that_verifies_and_the_next_writer_cleans_up(tmp_path):
    path = tmp_path / "crash.sqlite"
    event = acc_event()
    with Ledger.open(path) as ledger:
        _, acc = _accountant(ledger)
        acc.record(Release("between", event, target_hit=True, charged_teachers={1, 2}))
        before = (ledger.row_count, ledger.head_hash, acc.counters.tolist())

        def crash():
            raise RuntimeError("stopped between the commits")

        ledger._between_commits = crash
        with pytest.raises(RuntimeError, match="between the commits"):
            acc.record(Release("between", event, target_hit=True, charged_teachers={3, 4}))
        assert (ledger.row_count, ledger.head_hash, acc.counters.tolist()) == before  # nothing was charged
        del ledger._between_commits
    conf = sqlite3.connect(confidential_path(path))
    assert conf.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == 2  # the orphan of the stopped charge
    conf.close()
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
        assert result.ok and "interrupted" in result.message, result.message
        _, replayed = _accountant(ledger)
        assert replayed.counters.tolist() == before[2]  # the orphan is ignored
    with Ledger.open(path) as ledger:
        _, acc = _accountant(ledger)
        acc.record(Release("between", event, target_hit=True, charged_teachers={5}))
        rows = list(ledger.rows())
    assert [sorted(r.charged_teachers) for r in rows] == [[1, 2], [5]]
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert result.ok and "interrupted" not in result.message, result.message


def test_process_killed_between_commits(tmp_path):
    """The same with a real process exit (no cleanup, no rollback) between the two commits."""
    path = tmp_path / "killed.sqlite"
    script = textwrap.dedent(f"""
        import os
        from pate_accountant.ledger import Ledger
        from pate_accountant.accountants import IndividualChargingAccountant
        from pate_accountant.release import Release
        from mechanisms import BetweenThresholds
        bt = BetweenThresholds(0.5, 3, 9)
        ledger = Ledger.open({str(path)!r})
        acc = IndividualChargingAccountant({TEACHERS}, per_teacher_limit={LIMIT}, epsilon0=0.5, q=bt.q, ledger=ledger)
        acc.record(Release("between", bt.event, target_hit=True, charged_teachers={{1, 2}}))
        ledger._between_commits = lambda: os._exit(9)
        acc.record(Release("between", bt.event, target_hit=True, charged_teachers={{3}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == 9, proc.stderr.decode()
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
        assert result.ok and result.rows == 1 and "interrupted" in result.message, result.message
    with Ledger.open(path) as ledger:
        _, acc = _accountant(ledger)
        assert acc.counters.tolist()[:4] == [0, 1, 1, 0]
        acc.record(Release("between", acc_event(), target_hit=True, charged_teachers={3}))
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert result.ok and result.rows == 2 and "interrupted" not in result.message


# -- the accountant's contract through the split -----------------------------------------------------------------


def test_refused_charge_leaves_both_files_unchanged(tmp_path):
    path = tmp_path / "refuse.sqlite"
    event = acc_event()
    with Ledger.open(path) as ledger:
        _, acc = _accountant(ledger)
        for _ in range(LIMIT):
            acc.record(Release("between", event, target_hit=True, charged_teachers={7}))
        conf = sqlite3.connect(confidential_path(path))
        count_before = conf.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
        before = (ledger.row_count, ledger.head_hash, acc.counters.tolist())
        with pytest.raises(BudgetExhaustedError):
            acc.record_many([Release("between", event, target_hit=True, charged_teachers={1}),
                             Release("between", event, target_hit=True, charged_teachers={7})])
        assert (ledger.row_count, ledger.head_hash, acc.counters.tolist()) == before
        assert conf.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == count_before
        conf.close()
    with Ledger.open(path, read_only=True) as ledger:
        assert ledger.verify().ok


def test_in_memory_ledger_keeps_a_confidential_part():
    with Ledger.in_memory() as ledger:
        _, acc = _accountant(ledger)
        acc.record(Release("between", acc_event(), target_hit=True, charged_teachers={1, 2}))
        acc.record(Release("below", acc_event(), target_hit=False))
        acc.record_outcomes(acc_event(), np.array([True, False]), [[3], [4]])  # the miss's participant is dropped
        assert ledger.has_confidential
        rows = list(ledger.rows())
        assert [sorted(r.charged_teachers) for r in rows] == [[1, 2], [], [3], []]
        result = ledger.verify()
        assert result.ok and result.confidential == "verified" and result.spent == acc.spent()
        again = IndividualChargingAccountant(TEACHERS, per_teacher_limit=LIMIT, epsilon0=0.5, q=acc.q, ledger=ledger)
        assert again.counters.tolist() == acc.counters.tolist()


def test_non_confidential_accountants_store_no_teacher_sets_anywhere(tmp_path):
    from pate_accountant.accountants import BasicCompositionAccountant

    path = tmp_path / "basic.sqlite"
    with Ledger.open(path) as ledger:
        acc = BasicCompositionAccountant(budget=(5.0, 1e-3), ledger=ledger)
        acc.record(Release("tok", BetweenThresholdsEvent(0.1, 0.3), target_hit=True, charged_teachers={11, 12, 13}))
    assert not Path(confidential_path(path)).exists()
    blobs = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"[11,12,13]" not in blobs and b"11,12,13" not in blobs
    with Ledger.open(path, read_only=True) as ledger:
        result = ledger.verify()
    assert result.ok and result.confidential == "none"
