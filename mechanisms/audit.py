"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon.

Run the mechanism many times on each histogram of a neighbouring pair ``(c, c')`` (one teacher's vote
moved, Observation 1), count each outcome, and for every outcome ``o`` and both directions bound

    epsilon >= ln( (P_lo[o | c] - delta) / P_hi[o | c'] )

where ``P_lo`` and ``P_hi`` are Clopper-Pearson bounds.  All ``2 x (number of outcomes)`` bounds hold
together with probability at least ``confidence`` (Bonferroni), so the reported lower bound exceeds
the true epsilon of the pair with probability at most ``1 - confidence``.  A mechanism whose claim is
honest is never caught (up to that probability); a broken one (for example with its noise halved) is,
given enough runs on a pair where it leaks.

The outcomes are the released values (tokens, ``fail``, or the target outcome of wrapped mechanisms).
Runs use the mechanism's vectorised ``run_batch`` when it has one.
"""

from __future__ import annotations

import math

import attr
import numpy as np
from scipy.stats import beta as beta_distribution

from mechanisms.base import FAIL_VALUE
from mechanisms.histogram import HistogramBatch, as_histogram
from pate_accountant.validation import check_generator, check_int, check_real

__all__ = ["AuditResult", "audit_pair", "clopper_pearson", "exact_pair_epsilon"]

#: Label of the target outcome in audit counts.
TARGET_LABEL = "target"
FAIL_LABEL = "fail"


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` Clopper-Pearson interval for a binomial proportion."""
    successes = check_int("successes", successes, minimum=0)
    trials = check_int("trials", trials, minimum=1)
    if successes > trials:
        raise ValueError(f"successes={successes} exceeds trials={trials}")
    alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    lower = 0.0 if successes == 0 else float(beta_distribution.ppf(alpha / 2, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta_distribution.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return lower, upper


@attr.s(frozen=True, slots=True)
class AuditResult:
    """What an audit found.  ``epsilon_lower_bound`` is ``-inf`` when no outcome gives evidence."""

    epsilon_lower_bound: float = attr.ib()
    claimed_epsilon: float = attr.ib()
    claimed_delta: float = attr.ib()
    worst_outcome: object = attr.ib()
    direction: str = attr.ib()
    num_runs: int = attr.ib()
    confidence: float = attr.ib()
    counts: dict = attr.ib()
    counts_neighbour: dict = attr.ib()

    @property
    def violation(self) -> bool:
        """True when the audit proves (at ``confidence``) that the claimed epsilon is exceeded."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def as_dict(self) -> dict:
        return {
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "claimed_epsilon": self.claimed_epsilon,
            "claimed_delta": self.claimed_delta,
            "violation": self.violation,
            "worst_outcome": str(self.worst_outcome),
            "direction": self.direction,
            "num_runs": self.num_runs,
            "confidence": self.confidence,
            "counts": {str(k): v for k, v in self.counts.items()},
            "counts_neighbour": {str(k): v for k, v in self.counts_neighbour.items()},
        }


_TARGET_CODE = FAIL_VALUE - 1


def _codes(values: np.ndarray, target_hit) -> np.ndarray:
    codes = np.asarray(values, dtype=np.int64).copy()
    if target_hit is not None:
        codes[np.asarray(target_hit, dtype=bool)] = _TARGET_CODE
    return codes


def _label(code: int):
    return {FAIL_VALUE: FAIL_LABEL, _TARGET_CODE: TARGET_LABEL}.get(code, code)


def _run(mechanism, histogram, num_runs: int, rng: np.random.Generator, chunk: int = 100_000) -> dict:
    hist = as_histogram(histogram)
    counts: dict = {}
    if hasattr(mechanism, "run_batch"):
        for start in range(0, num_runs, chunk):
            size = min(chunk, num_runs - start)
            batch = HistogramBatch(
                np.repeat(np.arange(size), hist.tokens.size),
                np.tile(hist.tokens, size),
                np.tile(hist.counts, size),
                size,
                hist.num_teachers,
            )
            released = mechanism.run_batch(batch, rng=rng)
            codes, freq = np.unique(_codes(released.values, released.target_hit), return_counts=True)
            for code, f in zip(codes.tolist(), freq.tolist()):
                counts[_label(code)] = counts.get(_label(code), 0) + f
    else:
        for _ in range(num_runs):
            release = mechanism(hist, rng=rng)
            label = TARGET_LABEL if release.target_hit else (FAIL_LABEL if release.value is None else release.value)
            counts[label] = counts.get(label, 0) + 1
    return counts


def _claims(mechanism, claimed_epsilon, claimed_delta) -> tuple[float, float]:
    event = getattr(mechanism, "event", None)
    if claimed_epsilon is None:
        claimed_epsilon = getattr(event, "epsilon", None)
        if claimed_epsilon is None:
            raise TypeError("the mechanism's event states no epsilon: pass claimed_epsilon")
    if claimed_delta is None:
        claimed_delta = getattr(event, "delta", 0.0)
    return (
        check_real("claimed_epsilon", claimed_epsilon, minimum=0.0),
        check_real("claimed_delta", claimed_delta, minimum=0.0, maximum=1.0),
    )


def audit_pair(
    mechanism,
    histogram,
    neighbour,
    num_runs: int,
    rng: np.random.Generator,
    *,
    claimed_epsilon: float | None = None,
    claimed_delta: float | None = None,
    confidence: float = 0.95,
) -> AuditResult:
    """Lower-bound the epsilon of ``mechanism`` on the pair ``(histogram, neighbour)``.

    The claim defaults to the mechanism's event (``event.epsilon``, ``event.delta``).  The pair should
    be neighbouring (one vote moved, or added/removed under that relation); the audit does not check it.
    """
    num_runs = check_int("num_runs", num_runs, minimum=1)
    check_generator("rng", rng)
    confidence = check_real("confidence", confidence, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    epsilon, delta = _claims(mechanism, claimed_epsilon, claimed_delta)
    counts = _run(mechanism, histogram, num_runs, rng)
    counts_neighbour = _run(mechanism, neighbour, num_runs, rng)
    outcomes = sorted(set(counts) | set(counts_neighbour), key=str)
    alpha = (1 - confidence) / max(1, 2 * len(outcomes))
    best, worst_outcome, direction = -math.inf, None, ""
    for outcome in outcomes:
        for name, first, second in (("c vs c'", counts, counts_neighbour), ("c' vs c", counts_neighbour, counts)):
            low, _ = clopper_pearson(first.get(outcome, 0), num_runs, 2 * alpha)
            _, high = clopper_pearson(second.get(outcome, 0), num_runs, 2 * alpha)
            if low - delta > 0 and high > 0:
                bound = math.log((low - delta) / high)
                if bound > best:
                    best, worst_outcome, direction = bound, outcome, name
    return AuditResult(best, epsilon, delta, worst_outcome, direction, num_runs, confidence, counts, counts_neighbour)


def exact_pair_epsilon(mechanism, histogram, neighbour, delta: float = 0.0) -> float:
    """The exact smallest epsilon with ``P[o|c] <= e^eps P[o|c'] + delta`` for every *set* of outcomes,
    both ways, from the mechanism's exact ``output_distribution`` (``inf`` if none exists)."""
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    first = mechanism.output_distribution(histogram).as_dict()
    second = mechanism.output_distribution(neighbour).as_dict()
    keys = set(first) | set(second)
    p = np.array([first.get(k, 0.0) for k in keys])
    q = np.array([second.get(k, 0.0) for k in keys])

    def divergence(a, b, eps):
        return float(np.maximum(0.0, a - math.exp(eps) * b).sum())

    def smallest(a, b):
        if divergence(a, b, 0.0) <= delta:
            return 0.0
        hi = 1.0
        while divergence(a, b, hi) > delta:
            hi *= 2
            if hi > 1e4:
                return math.inf
        lo = 0.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if divergence(a, b, mid) <= delta else (mid, hi)
        return hi

    return max(smallest(p, q), smallest(q, p))
