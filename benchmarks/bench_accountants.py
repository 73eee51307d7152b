"""Throughput of the in-memory accountants: charged events per second.

An *event* is one mechanism release charged to an accountant (one query).  The releases are built before
the clock starts (building a ``Release`` is the mechanism's cost, not the accountant's) from a pool of
``--pool`` distinct objects, cycled until ``--events`` records are made.  Paths measured:

* ``TargetChargingAccountant.record`` with a budget (precomputed hit limit: one integer comparison per
  event), BetweenThresholds releases with a 0.1% hit rate: (a) every release sharing one event object, (b)
  every release with its own (equal) event object, as real mechanisms build them; and boundary-wrapper
  releases (each with its own event object, the inner NoisyArgMax event included).
* ``TargetChargingAccountant.record_outcomes``: the vectorised path (batches of ``--batch`` outcomes).
* ``IndividualChargingAccountant.record``: 1000 teachers, every release a ``between`` hit charging 1-3
  random teachers (a hit is the expensive case: non-hits charge nobody), shared and fresh event objects;
  and ``record_outcomes`` with CSR charged sets (batches of ``--batch``).
* ``BasicCompositionAccountant.record`` for comparison (the contract path with no fast path).

Each path is timed ``--repeats`` times; the table shows the median and the best rate.  The machine is
shared, so the best of several runs is the fairer figure for the code itself.  Target: 10^6 events/s.

    .venv/bin/python benchmarks/bench_accountants.py [--quick] [--json] [--repeats R] [--events N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pate_accountant import BetweenThresholdsEvent, BoundaryWrapperEvent, NoisyArgMaxEvent, Release  # noqa: E402
from pate_accountant.accountants.basic import BasicCompositionAccountant  # noqa: E402
from pate_accountant.accountants.individual import IndividualChargingAccountant  # noqa: E402
from pate_accountant.accountants.target_charging import TargetChargingAccountant  # noqa: E402

TARGET_PER_SECOND = 1e6
NUM_TEACHERS = 1000


def bt_event():
    return BetweenThresholdsEvent(0.01, 1 / 3)


def wrapper_event():
    return BoundaryWrapperEvent(NoisyArgMaxEvent(0.005, 1e-12, error_bound=7000), epsilon=0.01, q=1 / 3)


def tct_releases(pool: int, rng, fresh: bool, make_event) -> list:
    shared = make_event()
    hits = rng.random(pool) < 1e-3
    return [Release(None, make_event() if fresh else shared, target_hit=bool(h)) for h in hits]


def individual_releases(pool: int, rng, fresh: bool) -> list:
    shared = bt_event()
    sizes = rng.integers(1, 4, size=pool)
    out = []
    for k in sizes:
        teachers = frozenset(rng.choice(NUM_TEACHERS, size=int(k), replace=False).tolist())
        out.append(Release("between", bt_event() if fresh else shared, target_hit=True, charged_teachers=teachers))
    return out


def time_records(make_accountant, releases: list, events: int, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        acc = make_accountant()
        acc.record(releases[0])  # the first record of a class computes its limit: setup, not throughput
        record = acc.record
        cycles, rest = divmod(events, len(releases))
        t0 = time.perf_counter()
        for _ in range(cycles):
            for release in releases:
                record(release)
        for release in releases[:rest]:
            record(release)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^5 events per path instead of 10^6")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--pool", type=int, default=100_000, help="distinct release objects, cycled")
    parser.add_argument("--batch", type=int, default=10_000, help="outcomes per record_outcomes call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    pool = min(args.pool, events)
    rng = np.random.default_rng(args.seed)

    def tct():
        return TargetChargingAccountant(budget=(8.0, 1e-6))

    def individual():
        return IndividualChargingAccountant(NUM_TEACHERS, per_teacher_limit=10**9)

    t0 = time.perf_counter()
    TargetChargingAccountant(budget=(8.0, 1e-6)).can_afford(bt_event())
    limit_setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    IndividualChargingAccountant(NUM_TEACHERS, budget=(1.0, 1e-6), epsilon0=0.01, gap=300)
    individual_setup = time.perf_counter() - t0

    rows = []

    def add(name, times, count):
        median = statistics.median(times)
        rows.append({
            "path": name,
            "events": count,
            "seconds_median": median,
            "events_per_second_median": count / median,
            "events_per_second_best": count / min(times),
        })

    add("TCT record, BetweenThresholds, shared event", time_records(
        tct, tct_releases(pool, rng, False, bt_event), events, args.repeats), events)
    add("TCT record, BetweenThresholds, fresh events", time_records(
        tct, tct_releases(pool, rng, True, bt_event), events, args.repeats), events)
    add("TCT record, BoundaryWrapper, fresh events", time_records(
        tct, tct_releases(pool, rng, True, wrapper_event), events, args.repeats), events)

    batch = args.batch
    outcomes = [rng.random(batch) < 1e-3 for _ in range(max(1, events // batch))]
    times = []
    for _ in range(args.repeats):
        acc = tct()
        event = bt_event()
        acc.compose(event)
        t0 = time.perf_counter()
        for hits in outcomes:
            acc.record_outcomes(event, hits)
        times.append(time.perf_counter() - t0)
    add(f"TCT record_outcomes (batches of {batch})", times, batch * len(outcomes))

    add("Individual record, 1-3 teachers/hit, shared event", time_records(
        individual, individual_releases(pool, rng, False), events, args.repeats), events)
    add("Individual record, 1-3 teachers/hit, fresh events", time_records(
        individual, individual_releases(pool, rng, True), events, args.repeats), events)

    csr_batches = []
    for _ in range(max(1, events // batch)):
        sizes = rng.integers(1, 4, size=batch)
        indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # Distinct teachers within a row: an offset walk modulo n.
        starts = rng.integers(0, NUM_TEACHERS, size=batch)
        indices = (np.repeat(starts, sizes) + (np.arange(indptr[-1]) - np.repeat(indptr[:-1], sizes))) % NUM_TEACHERS
        csr_batches.append((np.ones(batch, dtype=bool), (indptr, indices.astype(np.int64))))
    times = []
    for _ in range(args.repeats):
        acc = individual()
        event = bt_event()
        t0 = time.perf_counter()
        for hits, charged in csr_batches:
            acc.record_outcomes(event, hits, charged)
        times.append(time.perf_counter() - t0)
    add(f"Individual record_outcomes CSR (batches of {batch})", times, batch * len(csr_batches))

    basic_events = max(1, events // 10)
    add("Basic record (contract path, for comparison)", time_records(
        BasicCompositionAccountant, tct_releases(min(pool, basic_events), rng, False, bt_event), basic_events,
        args.repeats), basic_events)

    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "target_events_per_second": TARGET_PER_SECOND,
        "setup_seconds": {"tct_hit_limit_for_a_new_class": limit_setup, "individual_limit": individual_setup},
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    width = max(len(r["path"]) for r in rows)
    print(f"{'path':<{width}}  {'events':>9}  {'median s':>9}  {'median ev/s':>12}  {'best ev/s':>12}  >= 1e6")
    for r in rows:
        ok = "yes" if r["events_per_second_best"] >= TARGET_PER_SECOND else "no"
        print(
            f"{r['path']:<{width}}  {r['events']:>9}  {r['seconds_median']:>9.4f}  "
            f"{r['events_per_second_median']:>12,.0f}  {r['events_per_second_best']:>12,.0f}  {ok}"
        )
    print(f"setup: TCT hit limit for a new class {limit_setup:.3f} s; individual limit {individual_setup:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
