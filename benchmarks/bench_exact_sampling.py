"""Cost of one exact single release, and of the exact vectorised batch path.

Single releases (``mechanism(histogram)``, the path a private run takes) draw their noise with integer
arithmetic from the operating system's cryptographic randomness (``rng=None``); the figures are the
median over ``--calls`` calls, in microseconds per call, for:

* DPArgMax(1, 1e-6) on a histogram of 64 teachers (one exact TG draw),
* TruncatedGeometricNoisyArgMax(1, 1e-6) on the same histogram (one TG draw per voted token),
* BetweenThresholds(0.5, 20, 30) on one count (one exact discrete Laplace draw),
* DPWeightedSampling(1, 1e-6) on the same histogram (exact Bernoullis per token, an exact uniform pick),
* OutcomeDistribution.sample on a 50-token law (exact categorical draw).

The batch figures are histograms per second of ``run_batch`` on ``--batch`` copies of the histogram.

    .venv/bin/python benchmarks/bench_exact_sampling.py [--calls N] [--batch B] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mechanisms import (  # noqa: E402
    BetweenThresholds,
    CountHistogram,
    DPArgMax,
    DPWeightedSampling,
    HistogramBatch,
    OutcomeDistribution,
    TruncatedGeometricNoisyArgMax,
)

HISTOGRAM = {3: 40, 7: 12, 11: 6, 19: 3, 23: 2, 29: 1}  # 64 teachers


def per_call_us(run, calls: int) -> float:
    run()  # warm caches (noise tables, certified inclusion table)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def per_second(run, size: int, repeats: int = 3) -> float:
    run()
    best = min(_timed(run) for _ in range(repeats))
    return size / best


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    dp_argmax = DPArgMax(1.0, 1e-6)
    noisy_argmax = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    between = BetweenThresholds(0.5, 20, 30)
    weighted = DPWeightedSampling(1.0, 1e-6)
    rng = np.random.default_rng(0)
    law = OutcomeDistribution(np.arange(50), rng.dirichlet(np.ones(51))[:50], 0.0)
    law = OutcomeDistribution(law.tokens, law.probabilities, max(0.0, 1.0 - float(law.probabilities.sum())))

    hist = CountHistogram.from_mapping(HISTOGRAM)
    single = {
        "DPArgMax": per_call_us(lambda: dp_argmax(hist), args.calls),
        "TruncatedGeometricNoisyArgMax": per_call_us(lambda: noisy_argmax(hist), args.calls),
        "BetweenThresholds": per_call_us(lambda: between(25), args.calls),
        "DPWeightedSampling": per_call_us(lambda: weighted(hist), args.calls),
        "OutcomeDistribution.sample": per_call_us(lambda: law.sample(), args.calls),
    }
    tokens = np.array(sorted(HISTOGRAM), dtype=np.int64)
    values = np.array([HISTOGRAM[t] for t in tokens], dtype=np.int64)
    batch = HistogramBatch(
        np.repeat(np.arange(args.batch), tokens.size), np.tile(tokens, args.batch), np.tile(values, args.batch),
        args.batch, int(values.sum()),
    )
    counts = np.full(args.batch, 25)
    batched = {
        "DPArgMax": per_second(lambda: dp_argmax.run_batch(batch), args.batch),
        "TruncatedGeometricNoisyArgMax": per_second(lambda: noisy_argmax.run_batch(batch), args.batch),
        "BetweenThresholds": per_second(lambda: between.run_batch(counts), args.batch),
        "DPWeightedSampling": per_second(lambda: weighted.run_batch(batch), args.batch),
    }
    result = {"single_release_us": single, "batch_histograms_per_second": batched}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("one exact release (rng=None: OS randomness), median microseconds per call")
        for name, value in single.items():
            print(f"  {name:32s} {value:10.1f}")
        print(f"run_batch on {args.batch} histograms, histograms per second (exact)")
        for name, value in batched.items():
            print(f"  {name:32s} {value:10.3g}")
    return result


if __name__ == "__main__":
    main()
