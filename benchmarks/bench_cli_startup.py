"""Command-line start-up: wall seconds of ``pate-accountant --help``, of each command's ``--help`` and of an
argument error, each in a fresh interpreter, best of ``--repeats`` (docs/performance.md, "Command-line
start-up").  Usage: ``python benchmarks/bench_cli_startup.py [--repeats 5]``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pate_app


def _best(argv: list, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pate_accountant", *argv], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cases = ([["--help"]] + [[name, "--help"] for name in pate_app.COMMANDS]
             + [["plan", "for-tokens", "--help"], ["experiment", "alpha-sweep", "--help"],
                ["plan", "hits", "--eps0", "abc"], ["generate", "--teachers", "0"]])
    print(f"best of {args.repeats}, fresh interpreter each, load average {os.getloadavg()[0]:.2f}")
    for argv in cases:
        print(f"  pate-accountant {' '.join(argv):32s}: {_best(argv, args.repeats):6.2f} s")


if __name__ == "__main__":
    main()
