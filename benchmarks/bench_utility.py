"""The utility benchmark (issue 33; docs/utility.md): what the synthetic records are worth against held-out real
ones, beside the public model alone and the same teachers without noise, with the run's cost beside it.

It runs ``pate-accountant experiment utility`` (:mod:`pate_app.experiments.utility`) on one data file and prints
its table and headline with the date, the machine's load and the wall time, so that docs/results.md can quote a
figure with the command that produced it:

    .venv/bin/python benchmarks/bench_utility.py --quick                      # bundled sample, about 20 minutes
    .venv/bin/python benchmarks/bench_utility.py --data FILE --label-field L  # your corpus (docs/utility.md)

Every option of the experiment is accepted (``--help``); the JSON result goes to ``--out``.
"""

from __future__ import annotations

import os
import sys
import time

from pate_app.cli import build_parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser("experiment")
    args = parser.parse_args(["experiment", "utility", *argv])
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; "
          f"pate-accountant experiment utility {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    status = args.handler(args)
    print(f"# wall time {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
