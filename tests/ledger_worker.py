"""A process that charges a shared ledger, for the crash and concurrency tests in test_ledger.py.

``serve PATH --budget EPS --step S [--max-batch K]``
    Imports once, prints ``ready``, then for each ``run SEED`` line on stdin forks a child that opens
    the ledger (totals per row for even seeds, per transaction for odd ones), attaches a
    BasicCompositionAccountant and charges batches of 1..K releases of
    ``EpsilonDeltaEvent(S)`` (``record_many``, one transaction per batch; single charges once a batch no
    longer fits) until the budget is spent;
    prints ``pid N`` (the test SIGKILLs that child at a random moment), ``attached`` once the child has
    opened the ledger and caught up (``gone`` if it died first), then ``exit CODE`` once the child is gone
    (code 0: budget exhausted, -9: killed).  ``quit`` ends it.  Forking saves the ~1.5 s import
    per run; each child is a separate process with its own SQLite connection.

``race N`` (a command of ``serve``; pass ``--pause SECONDS``)
    Forks N racers at once; each opens the ledger with its own connection (alternately storing totals
    per row and per transaction), attaches, begins its own run (``Ledger.begin_run``, with ``--runs``), and
    waits for the start signal; then all charge ``EpsilonDeltaEvent(S)`` one at a time (pausing between
    charges, as generation steps would) until ``BudgetExhaustedError``.  Prints one JSON line per racer
    (charges made, writer id, run id, final spent), then ``done``.  (Without pauses SQLite's busy handler
    lets one tight writer starve the others: still correct, but then there is no race to test.)

    With ``--kind individual`` the racers share an ``IndividualChargingAccountant`` ledger (50 teachers,
    per-teacher limit ``--limit``, so a shareable and a confidential file): each step syncs, picks three
    active teachers at random and records a BetweenThresholds hit charging them (one query in four is a
    miss, naming nobody); a refusal because another racer removed one of them meanwhile is counted and the
    racer goes on, until no teacher is active.  Each JSON line also lists the racer's hits (teacher sets).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def _accountant(path: str, budget: float, totals: str = "row"):
    from pate_accountant.accountants import BasicCompositionAccountant
    from pate_accountant.ledger import Ledger

    ledger = Ledger.open(path, totals=totals)
    return ledger, BasicCompositionAccountant(budget=(budget, 1e-5), ledger=ledger)


def _child(path: str, budget: float, step: float, max_batch: int, seed: int, attached_fd: int) -> int:
    from pate_accountant.errors import BudgetExhaustedError
    from pate_accountant.events import EpsilonDeltaEvent
    from pate_accountant.release import Release

    rng = random.Random(seed)
    ledger, accountant = _accountant(path, budget, ("row", "transaction")[seed % 2])
    os.write(attached_fd, b"attached\n")
    os.close(attached_fd)
    event = EpsilonDeltaEvent(step, 1e-9)
    try:
        while True:
            size = rng.randint(1, max_batch)
            releases = [Release(rng.choice([None, 7, 8]), event, target_hit=rng.random() < 0.1,
                                charged_teachers=rng.sample(range(50), 3)) for _ in range(size)]
            try:
                if size == 1 and rng.random() < 0.5:
                    accountant.compose(event)
                else:
                    accountant.record_many(releases)
            except BudgetExhaustedError:
                if size == 1:
                    return 0
                accountant.compose(event)  # a whole batch no longer fits: spend the rest one at a time
    except BudgetExhaustedError:
        return 0
    finally:
        ledger.close()


def serve(args) -> int:
    import pate_accountant.accountants  # noqa: F401  (import once, before forking)
    import pate_accountant.ledger  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command:
            continue
        if command[0] == "quit":
            return 0
        if command[0] == "race":
            _race(args, int(command[1]))
            continue
        if command[0] != "run":
            print(f"unknown command {line!r}", file=sys.stderr, flush=True)
            return 2
        seed = int(command[1])
        sys.stdout.flush()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the loop, never flushes the parent's buffers
            os.close(read_fd)
            code = 1
            try:
                code = _child(args.path, args.budget, args.step, args.max_batch, seed, write_fd)
            except BaseException as exc:  # report, then exit without running the parent's cleanup
                print(f"child error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            os._exit(code)
        os.close(write_fd)
        print(f"pid {pid}", flush=True)
        with os.fdopen(read_fd, "rb") as pipe:  # "attached", or nothing if it died before attaching
            print("attached" if pipe.readline() == b"attached\n" else "gone", flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"exit {code}", flush=True)
    return 0


#: The BetweenThresholds event of the individual-charging race (epsilon 0.5, q of a gap of 6).
INDIVIDUAL_EVENT = (0.5, 0.3)
INDIVIDUAL_TEACHERS = 50


def _individual_accountant(path: str, limit: int, totals: str):
    from pate_accountant.accountants import IndividualChargingAccountant
    from pate_accountant.ledger import Ledger

    ledger = Ledger.open(path, totals=totals)
    return ledger, IndividualChargingAccountant(INDIVIDUAL_TEACHERS, per_teacher_limit=limit, relation="add-remove-one",
                                                ledger=ledger)


def _racer(args, index: int, totals: str, go_fd: int, out_fd: int) -> int:
    from pate_accountant.errors import BudgetExhaustedError
    from pate_accountant.events import BetweenThresholdsEvent, EpsilonDeltaEvent
    from pate_accountant.release import Release

    individual = args.kind == "individual"
    if individual:
        ledger, accountant = _individual_accountant(args.path, args.limit, totals)
    else:
        ledger, accountant = _accountant(args.path, args.budget, totals)
    run = ledger.begin_run({"racer": index, "seeded": False}) if args.runs else None
    os.write(out_fd, b"ready\n")
    if os.read(go_fd, 1) != b"g":  # the start gun: all racers attached, then all released together
        return 2
    charged, refused, hits = 0, 0, []
    if individual:
        rng = random.Random(1000 + index)
        event = BetweenThresholdsEvent(*INDIVIDUAL_EVENT, relation="add-remove-one")
        while True:
            ledger.sync(accountant)
            active = accountant.active_teachers().tolist()
            if not active:
                break
            hit = rng.random() < 0.75
            teachers = sorted(rng.sample(active, min(3, len(active)))) if hit else []
            release = Release("between" if hit else "below", event, target_hit=hit, charged_teachers=teachers)
            try:
                accountant.record(release)
            except BudgetExhaustedError:
                refused += 1
                continue
            charged += 1
            if hit:
                hits.append(teachers)
            if args.pause:
                time.sleep(args.pause)
    else:
        event = EpsilonDeltaEvent(args.step)
        try:
            while True:
                accountant.compose(event)
                charged += 1
                if args.pause:
                    time.sleep(args.pause)
        except BudgetExhaustedError:
            pass
    report = {"charged": charged, "refused": refused, "hits": hits, "writer": ledger._writer, "run": run,
              "totals": totals}
    if not individual:
        report["spent"] = list(accountant.spent())
    os.write(out_fd, (json.dumps(report) + "\n").encode())
    ledger.close()
    return 0


def _race(args, workers: int) -> None:
    go_r, go_w = os.pipe()
    children = []
    for i in range(workers):
        out_r, out_w = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.close(out_r)
            code = 1
            try:
                code = _racer(args, i, ("row", "transaction")[i % 2], go_r, out_w)
            except BaseException as exc:
                print(f"racer error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            os._exit(code)
        os.close(out_w)
        children.append((pid, os.fdopen(out_r, "rb")))
    os.close(go_r)
    for _, out in children:
        assert out.readline() == b"ready\n"
    os.write(go_w, b"g" * workers)
    os.close(go_w)
    for pid, out in children:
        line = out.readline().decode().strip()
        out.close()
        _, status = os.waitpid(pid, 0)
        print(line if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else f"failed {status}", flush=True)
    print("done", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["serve"])
    parser.add_argument("path")
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--step", type=float, required=True)
    parser.add_argument("--max-batch", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--kind", choices=["basic", "individual"], default="basic")
    parser.add_argument("--limit", type=int, default=3, help="per-teacher limit of --kind individual")
    parser.add_argument("--runs", action="store_true", help="each racer begins its own run first")
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
