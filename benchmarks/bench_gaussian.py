"""Timing of GaussianNoisyArgMax (GNMax with exact discrete Gaussian noise) on real vocabulary sizes.

Run: ``.venv/bin/python benchmarks/bench_gaussian.py`` (``--vocab 49152 128256`` by default).  For each
vocabulary and a few calibrations it prints the median wall time of:

* one run: noise on every count, drawn from the operating system's CSPRNG (what ``generate`` does), and one
  seeded run;
* a batch of 16 runs (``run_batch``);
* the step before it: the ``n`` integer votes a device backend sends back, counted into a histogram on the host
  (``VoteHistogram.from_votes``), for ``n`` = 64, 256 and 1,024 teachers;
* the exact output law (``output_distribution``) on that histogram.

Why this matters (docs/mechanisms/gaussian.md, "Where the noise is added"): a device backend returns ``n``
votes, not counts, so the histogram is built on the host anyway; if noising the whole vocabulary there costs a
few milliseconds, nothing is gained by drawing the noise on the device, where no exact integer sampler from the
operating system's generator exists.  Not a test: the figures depend on the machine and its load
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ensembles.histograms import VoteHistogram
from mechanisms import CountHistogram, GaussianNoisyArgMax

VOCABS = (49_152, 128_256)
BUDGETS = ((1.0, 1e-6), (0.1, 1e-6))
TEACHERS = (64, 256, 1024)


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def coordinated_like_votes(num_teachers: int, vocab: int, rng) -> np.ndarray:
    """Votes shaped like a coordinated histogram's: about 60 % on one token, the rest on a few dozen others."""
    top = rng.integers(vocab)
    others = rng.integers(vocab, size=32)
    votes = np.where(rng.random(num_teachers) < 0.6, top, others[rng.integers(32, size=num_teachers)])
    return votes.astype(np.int32)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus")
    rng = np.random.default_rng(0)
    for vocab in args.vocab:
        print(f"vocabulary {vocab}")
        votes = {n: coordinated_like_votes(n, vocab, rng) for n in TEACHERS}
        for n, v in votes.items():
            count = median_seconds(lambda v=v, vocab=vocab: VoteHistogram.from_votes(v, vocab), args.repeats)
            print(f"  {n} votes -> histogram on the host: {count * 1e6:.0f} us")
        hist = CountHistogram([5, 17, vocab - 1], [60, 30, 10], num_teachers=100, vocab_size=vocab)
        for epsilon, delta in BUDGETS:
            start = time.perf_counter()
            mech = GaussianNoisyArgMax.calibrated(epsilon, delta, vocab_size=vocab)
            mech(hist)  # builds the noise thresholds
            setup = time.perf_counter() - start
            counted = VoteHistogram.from_votes(votes[256], vocab)
            os_run = median_seconds(lambda mech=mech, hist=hist: mech(hist), args.repeats)
            seeded = median_seconds(lambda mech=mech, hist=hist: mech(hist, rng=rng), args.repeats)
            batch = median_seconds(lambda mech=mech, hist=hist: mech.run_batch([hist] * 16, rng=rng), 5)
            law = median_seconds(lambda mech=mech, counted=counted: mech.output_distribution(counted), 5)
            print(f"  (eps, delta) = ({epsilon}, {delta}): sigma {mech.sigma:.3f}, T {mech.truncation_bound}; "
                  f"calibration + table {setup * 1e3:.0f} ms; one run (OS CSPRNG) {os_run * 1e3:.1f} ms; "
                  f"one run (seeded) {seeded * 1e3:.1f} ms; batch of 16 {batch * 1e3:.0f} ms; "
                  f"exact law (256 teachers) {law * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
