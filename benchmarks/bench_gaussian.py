"""Timing of GaussianNoisyArgMax (GNMax with exact discrete Gaussian noise) on a 128,000-token vocabulary.

Run: ``.venv/bin/python benchmarks/bench_gaussian.py``.  Prints the median wall time of one run (noise on
every count, drawn from the operating system's CSPRNG), of one seeded run, and of a batch, for a few
calibrations.  Not a test: the figures depend on the machine and its load (docs/performance.md).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from mechanisms import CountHistogram, GaussianNoisyArgMax

VOCAB = 128_000


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus, vocabulary {VOCAB}")
    hist = CountHistogram([5, 17, 9000], [60, 30, 10], num_teachers=100, vocab_size=VOCAB)
    for epsilon, delta in ((1.0, 1e-6), (0.1, 1e-6)):
        start = time.perf_counter()
        mech = GaussianNoisyArgMax.calibrated(epsilon, delta, vocab_size=VOCAB)
        mech(hist)  # builds the noise thresholds
        setup = time.perf_counter() - start
        rng = np.random.default_rng(0)
        os_run = median_seconds(lambda: mech(hist), 30)
        seeded = median_seconds(lambda: mech(hist, rng=rng), 30)
        batch = median_seconds(lambda: mech.run_batch([hist] * 16, rng=rng), 5)
        print(f"(eps, delta) = ({epsilon}, {delta}): sigma {mech.sigma:.3f}, T {mech.truncation_bound}; "
              f"calibration + table {setup * 1e3:.0f} ms; one run (OS CSPRNG) {os_run * 1e3:.1f} ms; "
              f"one run (seeded) {seeded * 1e3:.1f} ms; batch of 16 {batch * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
