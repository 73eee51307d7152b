"""SQLite transactions and accountant work per charged generation step, with a file ledger.

A *charged step* is what ``PrivateGenerator`` does once per token: ``accountant.can_afford(event)``, then
the mechanism runs through ``accountant.register(mechanism)`` (its pre-run budget check, the mechanism,
``record``); for individual charging (BetweenThresholds, no registered callable) ``can_afford`` then
``record``.  Two settings:

* ``alone``: one writer;
* ``shared``: two ``Ledger`` objects (two SQLite connections, as two processes would have) on one file,
  taking turns, so that every step first catches up on the other writer's row.

Counted per step (after a warm-up step), by wrapping ``sqlite3.connect`` so that every connection the
ledger opens reports its statements (``Connection.set_trace_callback``):

* ``read``: read transactions: ``BEGIN`` (deferred), plus statements run outside any transaction (each
  is an implicit transaction of its own);
* ``write``: ``BEGIN IMMEDIATE`` (the write lock);
* ``statements``: every SQL statement;
* the same three for the confidential file (individual charging only);
* time per step: the median wall-clock microseconds (bound by the disk's fsync with ``--synchronous FULL``,
  the default) and the mean CPU microseconds of this process (``time.process_time``: the code's own cost,
  less sensitive to other jobs on a shared machine);
* accountant work, by wrapping the accountant's methods on the instance: budget checks, in-memory applies,
  state copies and restores, rows replayed.  The names differ between versions of the code (the script
  counts whichever exist), so it can be run against an older checkout for a before/after comparison.

For individual charging the two files (shareable and confidential) are counted apart: one write
transaction takes both files' write locks (a ``BEGIN IMMEDIATE`` on each), and a catch-up reads both.

    .venv/bin/python benchmarks/bench_ledger_transactions.py [--steps N] [--json] [--synchronous NORMAL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pate_accountant.accountants import (  # noqa: E402
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
    IndividualChargingAccountant,
    PldAccountant,
    TargetChargingAccountant,
)
from pate_accountant.events import BetweenThresholdsEvent, EpsilonDeltaEvent  # noqa: E402
from pate_accountant.ledger import Ledger  # noqa: E402
from pate_accountant.release import Release  # noqa: E402

NUM_TEACHERS = 200


class _Counter:
    """Statement and transaction counts over every connection opened while it is installed, per file
    (``""``: the shareable file, ``"conf_"``: the confidential one)."""

    KEYS = ("read", "write", "statements", "conf_read", "conf_write", "conf_statements")

    def __init__(self):
        self.counts = dict.fromkeys(self.KEYS, 0)
        self._real_connect = sqlite3.connect

    def reset(self):
        self.counts = dict.fromkeys(self.KEYS, 0)

    def _trace(self, state, prefix: str):
        def callback(sql):
            text = sql.strip().upper()
            if not text or text.startswith("--"):  # trigger bodies: part of their statement
                return
            counts = self.counts
            counts[prefix + "statements"] += 1
            if text.startswith("BEGIN"):
                counts[prefix + ("write" if "IMMEDIATE" in text or "EXCLUSIVE" in text else "read")] += 1
                state["open"] = True
            elif text.startswith(("COMMIT", "ROLLBACK", "END")):
                state["open"] = False
            elif not state["open"]:  # autocommit: an implicit transaction of its own
                write = text.startswith(("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP"))
                counts[prefix + ("write" if write else "read")] += 1
        return callback

    @contextlib.contextmanager
    def installed(self):
        def connect(database, *args, **kwargs):
            conn = self._real_connect(database, *args, **kwargs)
            prefix = "conf_" if str(database).endswith(".confidential.sqlite") else ""
            conn.set_trace_callback(self._trace({"open": False}, prefix))
            return conn

        sqlite3.connect = connect
        try:
            yield self
        finally:
            sqlite3.connect = self._real_connect


#: Accountant methods counted, by what they do (older and newer names).
WORK = {
    "checks": ("_prepare", "_maybe_compose"),
    "applies": ("_commit",),
    "state_copies": ("_snapshot", "_get_state"),
    "restores": ("_restore", "_set_state"),
    "replayed_rows": ("_replay",),
}


def _instrument(accountant, work: dict) -> None:
    for what, names in WORK.items():
        for name in names:
            method = getattr(type(accountant), name, None)
            if method is None or name in vars(accountant):
                continue
            bound = getattr(accountant, name)

            def wrapper(*args, _bound=bound, _what=what, _name=name, **kwargs):
                if _name == "_maybe_compose":
                    work["checks"] += 1
                    if (args[1] if len(args) > 1 else kwargs.get("do_compose")):
                        work["applies"] += 1
                elif _name == "replay":
                    pass
                else:
                    work[_what] += 1
                return _bound(*args, **kwargs)

            setattr(accountant, name, wrapper)
    replay = getattr(type(accountant), "replay", None)
    if replay is not None and "replay" not in vars(accountant):
        bound = accountant.replay

        def counted_replay(charges, *args, _bound=bound, **kwargs):
            charges = list(charges)
            work["replayed_rows"] += len(charges)
            return _bound(charges, *args, **kwargs)

        accountant.replay = counted_replay


class _Mechanism:
    """A stand-in mechanism: announces ``event`` and releases a token (a target hit every ``hit_every``)."""

    def __init__(self, event, hit_every: int = 0):
        self.event, self._hit_every, self._n = event, hit_every, 0

    def __call__(self, *args, **kwargs):
        self._n += 1
        hit = bool(self._hit_every) and self._n % self._hit_every == 0
        return Release(None if hit else 7, self.event, target_hit=True if hit else None)


def _cases():
    bt = BetweenThresholdsEvent(0.01, q=1 / 3, relation="add-remove-one")
    approx = EpsilonDeltaEvent(1e-4, 1e-12)
    return {
        "basic": (lambda ledger: BasicCompositionAccountant(budget=(1e6, 0.5), ledger=ledger), approx, False),
        "advanced": (lambda ledger: AdvancedCompositionAccountant(budget=(1e6, 0.5), ledger=ledger), approx, False),
        "pld": (lambda ledger: PldAccountant(budget=(1e6, 0.5), ledger=ledger), approx, False),
        "target-charging": (lambda ledger: TargetChargingAccountant(budget=(50.0, 1e-5), ledger=ledger), bt, False),
        "individual-charging": (lambda ledger: IndividualChargingAccountant(
            NUM_TEACHERS, per_teacher_limit=10 ** 6, relation="add-remove-one", ledger=ledger), bt, True),
    }


def _stepper(accountant, event, individual: bool, index: int):
    """One charged generation step for ``accountant`` (as PrivateGenerator runs it)."""
    if individual:
        def step(i):  # three teachers per hit, in turn (so the worst counter, hence spent(), rarely changes)
            if not accountant.can_afford(event):
                raise RuntimeError("budget exhausted")
            hit = i % 4 != 0
            teachers = {(3 * (2 * i + index) + k) % NUM_TEACHERS for k in range(3)} if hit else ()
            accountant.record(Release("between" if hit else "below", event, target_hit=hit, charged_teachers=teachers))
        return step
    run = accountant.register(_Mechanism(event, hit_every=50))

    def step(i):
        if not accountant.can_afford(event):
            raise RuntimeError("budget exhausted")
        run()
    return step


def measure(name: str, steps: int, shared: bool, synchronous: str) -> dict:
    factory, event, individual = _cases()[name]
    counter = _Counter()
    work = {what: 0 for what in WORK}
    times, cpu_times = [], []
    with tempfile.TemporaryDirectory() as folder, counter.installed():
        path = os.path.join(folder, "bench.ledger")
        ledgers = [Ledger.open(path, synchronous=synchronous) for _ in range(2 if shared else 1)]
        try:
            accountants = [factory(ledger) for ledger in ledgers]
            steppers = [_stepper(acc, event, individual, i) for i, acc in enumerate(accountants)]
            for stepper in steppers:  # warm-up: the first charge fixes classes, computes limits
                stepper(0)
            for acc in accountants:
                _instrument(acc, work)
            counter.reset()
            for i in range(1, steps + 1):
                stepper = steppers[i % len(steppers)]
                start, cpu = time.perf_counter(), time.process_time()
                stepper(i)
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu)
            per = {key: n / steps for key, n in counter.counts.items()}
            per.update({what: n / steps for what, n in work.items()})
            result = ledgers[0].verify()
            assert result.ok, result.message
        finally:
            for ledger in ledgers:
                ledger.close()
    per["median_us"] = statistics.median(times) * 1e6
    per["cpu_us"] = statistics.mean(cpu_times) * 1e6
    return per


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", help="accountant kinds to measure (default: all)")
    args = parser.parse_args(argv)
    names = args.only or list(_cases())
    results = {}
    for setting in ("alone", "shared"):
        for name in names:
            results[f"{name} {setting}"] = measure(name, args.steps, setting == "shared", args.synchronous)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if args.json:
        print(json.dumps({"steps": args.steps, "synchronous": args.synchronous, "load": load,
                          "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                          "results": results}, indent=2))
        return 0
    print(f"{args.steps} charged steps per row, synchronous={args.synchronous}, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, load average {load}")
    header = ("case", "read tx", "write tx", "statements", "confidential read / write tx / statements", "checks", "applies",
              "state copies", "restores", "rows replayed", "median us", "CPU us")
    print(" | ".join(header))
    for case, per in results.items():
        print(" | ".join([case] + [f"{per[k]:.2f}" for k in ("read", "write", "statements")]
                         + [f"{per['conf_read']:.2f} / {per['conf_write']:.2f} / {per['conf_statements']:.2f}"]
                         + [f"{per[k]:.2f}" for k in ("checks", "applies", "state_copies", "restores",
                                                      "replayed_rows")]
                         + [f"{per['median_us']:.0f}", f"{per['cpu_us']:.0f}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
