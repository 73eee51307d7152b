"""Writers on several hosts sharing one PostgreSQL ledger (issue 25): hosts differ from processes on one host by their
clocks, their writer ids and their own connections.  Three writer processes, each with its own clock (skewed by
-3600 s, 0 and +3600 s where the ledger reads it), its own ``Ledger`` (writer id, connection) and its own run, charge
one budget interleaved until it is spent; then the ledger verifies, holds exactly the charges the writers report,
never overspent, passes ``pate-accountant audit URL``, and a signed checkpoint made after the skewed runs verifies.

Signed checkpoints compare times written by different hosts: hosts sharing a ledger need clocks that agree within
``SIGNED_AT_SKEW_S`` for them (``test_a_checkpoint_signed_across_skewed_clocks``; docs/ledger.md, "Clocks")."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.checkpoints import (
    SIGNED_AT_SKEW_S,
    append_checkpoint,
    check_checkpoints,
    generate_key,
    load_private_key,
    load_public_key,
    sign_checkpoint,
)
from pate_accountant.cli import main
from pate_accountant.events import EpsilonDeltaEvent
from pate_accountant.ledger import Ledger

psycopg = pytest.importorskip("psycopg")

from pg_server import ledger_url as _url  # noqa: E402
from test_ledger_postgres import charge_until_spent  # noqa: E402

#: Each host's clock, relative to the true time, in the order the hosts begin their runs (so run start times go
#: down: nothing may assume that a later run began later).
SKEWS = (3600.0, 0.0, -3600.0)
BUDGET, STEP = 1.0, 0.01


class _SkewedClock:
    """The ``time`` module as a host whose clock is ``skew`` seconds off sees it (``time.time`` only)."""

    def __init__(self, skew: float):
        self._skew = skew

    def time(self) -> float:
        return time.time() + self._skew

    def __getattr__(self, name):
        return getattr(time, name)


def _skew_clock(skew: float) -> None:
    """In this process only: every place the ledger and the checkpoints read the wall clock reads it ``skew`` off."""
    from pate_accountant import checkpoints
    from pate_accountant._ledger import chain, confidential, runs

    clock = _SkewedClock(skew)
    for module in (chain, confidential, runs, checkpoints):
        module.time = clock


def _host(url: str, index: int, turns, start, queue) -> None:
    """One host: its clock, its ``Ledger``; it begins its run when the host before it has begun (``turns``), then,
    once every host has, charges ``STEP`` at a time, interleaved with the others, until the budget is spent."""
    skew = SKEWS[index]
    _skew_clock(skew)
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=(BUDGET, 1e-5), ledger=ledger)
        if index:
            assert turns[index - 1].wait(timeout=120)
        run = ledger.begin_run({"mechanism": "test", "host": index})
        turns[index].set()
        start.wait(timeout=120)  # every host has begun its run: charge
        charged = charge_until_spent(accountant, STEP, BUDGET)
        queue.put((index, charged, ledger._writer, run, ledger.runs[run - 1]["created"], time.time()))


def _race(url: str) -> list:
    context = multiprocessing.get_context("spawn")
    turns = [context.Event() for _ in SKEWS]
    start, queue = context.Barrier(len(SKEWS)), context.Queue()
    processes = [context.Process(target=_host, args=(url, index, turns, start, queue)) for index in range(len(SKEWS))]
    for process in processes:
        process.start()
    try:
        reports = sorted(queue.get(timeout=240) for _ in processes)
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return reports


def test_writers_on_hosts_with_skewed_clocks_share_one_budget(postgres_database, tmp_path, capsys):
    url = _url(postgres_database)
    with Ledger.open(url) as ledger:  # created on a true clock
        BasicCompositionAccountant(budget=(BUDGET, 1e-5), ledger=ledger)
        created = ledger.created
    began = time.time()
    reports = _race(url)
    assert [index for index, *_ in reports] == [0, 1, 2]
    assert len({writer for _, _, writer, *_ in reports}) == 3  # each host its own writer id
    assert [run for _, _, _, run, *_ in reports] == [1, 2, 3]  # begun in turn
    for index, _, _, _, run_created, _ in reports:  # each run carries its host's clock
        assert abs(run_created - SKEWS[index] - began) < 120
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok, result.message
        assert result.rows == sum(charged for _, charged, *_ in reports)
        assert result.spent[0] <= BUDGET + 1e-9
        assert result.spent[0] > BUDGET - STEP - 1e-9  # used up, not wasted
        runs = reader.runs
        assert [run["created"] for run in runs] == sorted((run["created"] for run in runs), reverse=True)
        rows = list(reader.rows())
        for index, charged, writer, run, run_created, _ in reports:
            mine = [row for row in rows if row.writer == writer]
            assert len(mine) == charged
            assert all(row.run == run for row in mine)
        assert sum(1 for _, charged, *_ in reports if charged) >= 2  # they really interleaved
        # Interleaved: the rows' run ids (and so their stored times, their runs' starts) go back and forth.
        changes = sum(1 for a, b in zip(rows, rows[1:]) if a.run != b.run)
        assert changes >= 2, [row.run for row in rows]
        # A checkpoint signed after the skewed runs (on a true clock, the last run begun an hour behind it).
        private, public = generate_key(tmp_path / "operator.key")
        checkpoint = sign_checkpoint(reader, load_private_key(private), verification=result)
        assert checkpoint["signed_at"] >= created
        signed = check_checkpoints(reader, [checkpoint], load_public_key(public))
        assert signed.ok and signed.covered_rows == result.rows, signed.message
    checkpoints = tmp_path / "budget.checkpoints.jsonl"
    append_checkpoint(checkpoints, checkpoint)
    code = main(["audit", url, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["ok"] and json.loads(out)["rows"] == result.rows
    code = main(["audit", url, "--json", "--public-key", public, "--checkpoints", str(checkpoints)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["signed"]["ok"]


def _skewed_run(url: str, skew: float, sign_with, queue) -> None:
    """A host ``skew`` seconds off begins a run and charges once; with ``sign_with`` (a private key file) it signs
    its run's end as a run does, ``at_run_start``."""
    _skew_clock(skew)
    with Ledger.open(url) as ledger:
        accountant = BasicCompositionAccountant(budget=(BUDGET, 1e-5), ledger=ledger)
        ledger.begin_run({"mechanism": "test", "skew": skew})
        accountant.compose(EpsilonDeltaEvent(STEP))
        checkpoint = None
        if sign_with is not None:
            checkpoint = sign_checkpoint(ledger, load_private_key(sign_with), at_run_start=True)
        queue.put(checkpoint)


@pytest.mark.parametrize("skew", [300.0, 3600.0], ids=["five minutes", "an hour"])
@pytest.mark.parametrize("case", ["true signer after a run begun ahead", "a run behind signs its own end at_run_start"])
def test_a_checkpoint_signed_across_skewed_clocks(postgres_database, tmp_path, case, skew):
    """A checkpoint may not say it was signed before the ledger was created or before the last run it covers began
    (``SIGNED_AT_SKEW_S`` = 600 s allowed), and those times come from the clocks of the hosts that wrote them.  So
    hosts whose clocks agree within that sign and verify across hosts; an hour apart, an honest checkpoint is
    refused, and the refusal says that clocks may be the cause (docs/ledger.md, "Clocks")."""
    url = _url(postgres_database)
    private, public = generate_key(tmp_path / "operator.key")
    with Ledger.open(url) as ledger:  # created on a true clock
        BasicCompositionAccountant(budget=(BUDGET, 1e-5), ledger=ledger)
    ahead = case.startswith("true signer")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_skewed_run, args=(url, skew if ahead else -skew, None if ahead else private, queue))
    child.start()
    try:
        checkpoint = queue.get(timeout=120)
        child.join(timeout=60)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    with Ledger.open(url, read_only=True) as reader:
        result = reader.verify()
        assert result.ok and result.rows == 1, result.message  # the ledger itself is fine either way
        if ahead:
            checkpoint = sign_checkpoint(reader, load_private_key(private), verification=result)
        signed = check_checkpoints(reader, [checkpoint], load_public_key(public))
    if skew < SIGNED_AT_SKEW_S:
        assert signed.ok, signed.message
    else:
        assert not signed.ok
        assert ("before run 1 began" if ahead else "before the ledger was created") in signed.message
        assert "clock is more than 600 s behind" in signed.message


def test_the_skewed_clock_shim_is_the_time_module_elsewhere():
    clock = _SkewedClock(-3600.0)
    assert abs(clock.time() + 3600.0 - time.time()) < 5 and clock.monotonic is time.monotonic
