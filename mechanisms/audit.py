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

Exact checks, for proofs on small histograms: :func:`hockey_stick` is the tight delta of two output laws
at a given epsilon (both ways), :func:`law_epsilon` the exact epsilon of two laws at a given delta,
:func:`exact_pair_delta` / :func:`exact_pair_epsilon` apply them to a mechanism's exact
``output_distribution`` on one pair, and :func:`small_histograms` /
:func:`neighbouring_pairs` enumerate every histogram with at most ``n`` teachers over a small vocabulary
(tail votes included) and every neighbouring pair under replace-one (a vote moves, ``n`` fixed) or
add/remove-one (a teacher with any vote joins or leaves, ``n`` changes by one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import attr
import numpy as np
from scipy.stats import beta as beta_distribution

from mechanisms.base import FAIL_VALUE
from mechanisms.between_thresholds import BetweenThresholds
from mechanisms.boundary_wrapper import BoundaryWrapper
from mechanisms.gaussian import MIN_SIGMA, GaussianNoisyArgMax, GaussianThresholdArgMax
from mechanisms.histogram import CountHistogram, HistogramBatch, as_histogram
from mechanisms.noisy_argmax import DPArgMax, TruncatedGeometricNoisyArgMax
from mechanisms.weighted_sampling import DPWeightedSampling
from pate_accountant.bisection import switch_point
from pate_accountant.events import ADD_REMOVE_ONE, REPLACE_ONE
from pate_accountant.validation import (
    MAX_COUNT,
    MAX_STEP_EPSILON,
    check_delta,
    check_epsilon,
    check_generator,
    check_int,
    check_real,
)

__all__ = [
    "MAX_AUDIT_EPSILON",
    "MAX_AUDIT_RUNS",
    "MAX_SMALL_HISTOGRAMS",
    "AuditCase",
    "AuditResult",
    "audit_case",
    "between_thresholds_case",
    "boundary_wrapper_case",
    "dp_argmax_case",
    "gaussian_argmax_case",
    "gaussian_threshold_argmax_case",
    "noisy_argmax_case",
    "weighted_sampling_case",
    "audit_pair",
    "clopper_pearson",
    "exact_pair_delta",
    "exact_pair_epsilon",
    "hockey_stick",
    "law_epsilon",
    "largest_showable_epsilon",
    "neighbouring_pairs",
    "run_audit_case",
    "small_histograms",
]

#: The most runs per histogram an audit makes (docs/ranges.md): about 1 to 1.5 microseconds per run on a
#: 2-core machine, so 10^8 runs on each histogram of the pair take a few minutes; beyond that the
#: Clopper-Pearson bounds barely tighten.
MAX_AUDIT_RUNS = 10**8
#: The largest claimed epsilon a ready-made audit case takes (docs/ranges.md): an audit of ``R`` runs cannot
#: show an epsilon above about ``ln(R / 6)`` (the upper confidence bound of an outcome never seen is about
#: ``6 / R``; :func:`largest_showable_epsilon`), 16.9 at :data:`MAX_AUDIT_RUNS`, so a larger claim can never be
#: caught.
MAX_AUDIT_EPSILON = 15.0
#: The most histograms :func:`small_histograms` enumerates (each is a Python object; the exact checks on their
#: pairs are quadratic in the vocabulary).
MAX_SMALL_HISTOGRAMS = 10**6
#: e^epsilon stays a finite float64 up to 709.78; :func:`hockey_stick` takes epsilon up to this.
_MAX_EXP_EPSILON = 700.0

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
    num_runs = check_int("num_runs", num_runs, minimum=1, maximum=MAX_AUDIT_RUNS)
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


def _aligned(first, second) -> tuple[np.ndarray, np.ndarray]:
    """Two laws as aligned probability vectors: ``{outcome: probability}`` mappings (missing outcomes have
    probability zero) or two sequences over the same outcomes."""
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        keys = list(set(first) | set(second))
        return (np.array([first.get(k, 0.0) for k in keys], dtype=np.float64),
                np.array([second.get(k, 0.0) for k in keys], dtype=np.float64))
    p, q = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"two laws must be mappings or 1-d vectors of one length, got shapes {p.shape} and {q.shape}")
    return p, q


def hockey_stick(first, second, epsilon: float) -> float:
    """The tight delta of two output laws at ``epsilon``, both ways:

        max( sum_o max(0, P(o) - e^eps Q(o)),  sum_o max(0, Q(o) - e^eps P(o)) )

    (the hockey-stick divergence; the largest ``P(S) - e^eps Q(S)`` over sets of outcomes ``S``).  The laws
    are ``{outcome: probability}`` dicts (missing outcomes have probability zero) or two probability vectors
    over the same outcomes."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0, maximum=_MAX_EXP_EPSILON)
    p, q = _aligned(first, second)
    scale = math.exp(epsilon)
    return float(max(np.maximum(0.0, p - scale * q).sum(), np.maximum(0.0, q - scale * p).sum()))


def law_epsilon(first, second, delta: float = 0.0) -> float:
    """The exact smallest epsilon with ``P(S) <= e^eps Q(S) + delta`` and ``Q(S) <= e^eps P(S) + delta`` for
    every set of outcomes ``S`` (``inf`` if none exists), for two laws given as in :func:`hockey_stick`.
    Found by bisection on the hockey-stick divergence (monotone in epsilon) to ``1e-15`` relative, from above."""
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
    p, q = _aligned(first, second)

    def divergence(a, b, eps):
        return float(np.maximum(0.0, a - math.exp(eps) * b).sum())

    def smallest(a, b):
        if divergence(a, b, 0.0) <= delta:
            return 0.0
        # e^512 is still a finite float; beyond, no finite epsilon is plausible.
        return switch_point(lambda eps: divergence(a, b, eps) <= delta, 0.0, 1.0, rel_tol=1e-15, limit=512.0)[1]

    return max(smallest(p, q), smallest(q, p))


def exact_pair_delta(mechanism, histogram, neighbour, epsilon: float) -> float:
    """The tight delta at ``epsilon`` of ``mechanism`` on one pair, from its exact ``output_distribution``."""
    return hockey_stick(
        mechanism.output_distribution(histogram).as_dict(), mechanism.output_distribution(neighbour).as_dict(), epsilon
    )


def small_histograms(max_teachers: int, vocab_size: int, *, tail: bool = True, min_teachers: int = 0):
    """Every histogram with ``min_teachers <= n <= max_teachers`` teachers over tokens ``0 .. vocab_size - 1``
    (and, with ``tail``, votes into the tail: teachers that count towards ``n`` but vote for no token), as
    ``CountHistogram`` objects."""

    max_teachers = check_int("max_teachers", max_teachers, minimum=0)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    min_teachers = check_int("min_teachers", min_teachers, minimum=0)
    buckets = vocab_size + (1 if tail else 0)
    total = sum(math.comb(n + buckets - 1, buckets - 1) for n in range(min_teachers, max_teachers + 1))
    if total > MAX_SMALL_HISTOGRAMS:
        raise ValueError(
            f"max_teachers = {max_teachers} over vocab_size = {vocab_size} gives {total:.3g} histograms, more than "
            f"{MAX_SMALL_HISTOGRAMS}: choose fewer teachers or a smaller vocabulary"
        )
    out = []
    for n in range(min_teachers, max_teachers + 1):
        for split in itertools.combinations(range(n + buckets - 1), buckets - 1):  # stars and bars
            bounds = (-1, *split, n + buckets - 1)
            parts = [bounds[i + 1] - bounds[i] - 1 for i in range(buckets)]
            out.append(CountHistogram(np.arange(vocab_size), parts[:vocab_size], num_teachers=n, vocab_size=vocab_size))
    return out


def neighbouring_pairs(max_teachers: int, vocab_size: int, relation: str, *, tail: bool = True, min_teachers: int = 0):
    """Every neighbouring pair ``(c, c')`` of :func:`small_histograms` under ``relation``, once each:

    * ``"replace-one"``: one teacher's vote moves from one token (or the tail) to another, ``n`` fixed;
    * ``"add-remove-one"``: one teacher, with any vote (a token or the tail), is added: ``c'`` has ``n + 1``
      teachers (the pair read backwards is the removal).

    Privacy checks take the hockey-stick divergence both ways, so each unordered pair appears once."""

    if relation not in (REPLACE_ONE, ADD_REMOVE_ONE):
        raise ValueError(f"relation must be {REPLACE_ONE!r} or {ADD_REMOVE_ONE!r}, got {relation!r}")
    top = max_teachers if relation == REPLACE_ONE else max_teachers - 1
    out = []
    for hist in small_histograms(top, vocab_size, tail=tail, min_teachers=min_teachers):
        counts = [hist.count(t) for t in range(vocab_size)]
        vocab = hist.vocab_size

        def make(values, n):
            return CountHistogram(np.arange(vocab_size), values, num_teachers=n, vocab_size=vocab)

        if relation == ADD_REMOVE_ONE:
            for token in range(vocab_size):
                more = list(counts)
                more[token] += 1
                out.append((hist, make(more, hist.num_teachers + 1)))
            if tail:
                out.append((hist, make(counts, hist.num_teachers + 1)))
            continue
        sources = [t for t in range(vocab_size) if counts[t] > 0] + ([None] if tail and hist.tail > 0 else [])
        targets = list(range(vocab_size)) + ([None] if tail else [])
        for source in sources:
            for target in targets:
                if target == source:
                    continue
                moved = list(counts)
                if source is not None:
                    moved[source] -= 1
                if target is not None:
                    moved[target] += 1
                neighbour = make(moved, hist.num_teachers)
                key = (tuple(counts), tuple(moved))
                if key < key[::-1]:  # each unordered pair once
                    out.append((hist, neighbour))
    return out


def exact_pair_epsilon(mechanism, histogram, neighbour, delta: float = 0.0) -> float:
    """The exact smallest epsilon with ``P[o|c] <= e^eps P[o|c'] + delta`` for every *set* of outcomes,
    both ways, from the mechanism's exact ``output_distribution`` (``inf`` if none exists; :func:`law_epsilon`)."""
    return law_epsilon(
        mechanism.output_distribution(histogram).as_dict(), mechanism.output_distribution(neighbour).as_dict(), delta
    )


# --------------------------------------------------------------------------------------------------
# Ready-made audit cases: a mechanism and a neighbouring pair on which its claim is tight.


@attr.s(frozen=True, slots=True)
class AuditCase:
    """A mechanism to run, the claim to test, and a neighbouring pair ``(histogram, neighbour)``."""

    name: str = attr.ib()
    mechanism: object = attr.ib()
    claimed_epsilon: float = attr.ib()
    claimed_delta: float = attr.ib()
    histogram: object = attr.ib()
    neighbour: object = attr.ib()
    note: str = attr.ib()


def _pair(counts: dict, neighbour: dict, n: int, n_neighbour: int | None = None):

    def make(mapping, size):
        return CountHistogram(list(mapping), list(mapping.values()), num_teachers=size)

    return make(counts, n), make(neighbour, n if n_neighbour is None else n_neighbour)


def audit_case(name: str, epsilon: float | None = None, delta: float | None = None, noise_scale: float = 1.0) -> AuditCase:
    """Build the audit case of the mechanism registered as ``name`` (:mod:`mechanisms.registry`; see
    ``registry.audit_names()``).

    ``noise_scale < 1`` runs a deliberately broken variant whose noise is scaled down by that factor (its
    epsilon divided by ``noise_scale``) while the claim stays the honest mechanism's: an audit must catch it.
    """
    from mechanisms import (
        registry,  # the registry imports this module for its case builders
    )

    try:
        entry = registry.mechanism_entry(name)
    except KeyError:
        entry = None
    if entry is None or entry.audit is None:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {list(registry.audit_names())}")
    noise_scale = check_real("noise_scale", noise_scale, minimum=0.0, maximum=1.0, min_open=True)
    if epsilon is not None:
        epsilon = check_epsilon(
            "epsilon", epsilon, maximum=MAX_AUDIT_EPSILON,
            why=f"an audit of at most {MAX_AUDIT_RUNS:.0e} runs cannot show an epsilon above about "
                f"{largest_showable_epsilon(MAX_AUDIT_RUNS):.1f}; docs/ranges.md",
        )
    if delta is not None:
        delta = check_delta("delta", delta)
    return entry.audit(epsilon, delta, noise_scale)


def largest_showable_epsilon(num_runs: int, confidence: float = 0.95, num_outcomes: int = 2) -> float:
    """The largest lower bound :func:`audit_pair` can report with ``num_runs`` runs per histogram (at delta 0):
    ``ln(1 / P_hi)`` with ``P_hi`` the upper Clopper-Pearson bound of an outcome never seen on one side and
    ``P_lo <= 1`` on the other.  A claim above it can never be caught by that many runs."""
    num_runs = check_int("num_runs", num_runs, minimum=1)
    confidence = check_real("confidence", confidence, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    num_outcomes = check_int("num_outcomes", num_outcomes, minimum=1)
    alpha = (1 - confidence) / (2 * num_outcomes)
    return -math.log(clopper_pearson(0, num_runs, 2 * alpha)[1])


def between_thresholds_case(epsilon, delta, scale):

    epsilon = 1.0 if epsilon is None else epsilon
    if 2 / epsilon + 8 > MAX_COUNT:
        raise ValueError(f"epsilon must be >= {2 / (MAX_COUNT - 8):.3g} for the between-thresholds case, got {epsilon:g} "
                         "(its thresholds are 2/epsilon + 8 apart, at most 2^53)")
    honest = BetweenThresholds(epsilon, 0, int(math.ceil(2 / epsilon)) + 8)
    run = BetweenThresholds(min(epsilon / scale, MAX_STEP_EPSILON), honest.low, honest.high)
    h, h2 = _pair({0: 0}, {0: 1}, 1)
    return AuditCase(
        "between-thresholds", run.on_token(0), honest.event.epsilon, 0.0, h, h2,
        "count 0 vs 1 at the lower threshold: P[below] changes by exactly e^eps",
    )


def noisy_argmax_case(epsilon, delta, scale):

    epsilon = 2.0 if epsilon is None else epsilon
    delta = 1e-6 if delta is None else delta
    honest = TruncatedGeometricNoisyArgMax(epsilon, delta)
    run = TruncatedGeometricNoisyArgMax(min(epsilon / scale, MAX_STEP_EPSILON), delta)
    big = 2 * honest.error_bound + 2  # both keys always released
    h, h2 = _pair({0: big, 1: big + 4}, {0: big - 1, 1: big + 5}, 2 * big + 4)
    return AuditCase(
        "noisy-argmax", run, honest.event.epsilon, honest.event.delta, h, h2,
        "replace-one: a vote moves from the trailing token to the leader; P[trailing token wins] moves by ~e^eps",
    )


def dp_argmax_case(epsilon, delta, scale):

    epsilon = 1.0 if epsilon is None else epsilon
    delta = 1e-6 if delta is None else delta
    honest = DPArgMax(epsilon, delta, relation="add-remove-one")
    run = DPArgMax(min(epsilon / scale, MAX_STEP_EPSILON), delta, relation="add-remove-one")
    # n = 200, or more when the noise is wide: the runner-up keeps a vote to lose (n >= 2L + 4).
    n = max(200, 2 * (run.error_bound + 5))
    top = n // 2 + run.error_bound + 1  # yield probability about one half for the mechanism that runs
    h, h2 = _pair({0: top, 1: n - top}, {0: top, 1: n - top - 1}, n, n - 1)
    return AuditCase(
        "dp-argmax", run, honest.event.epsilon, honest.event.delta, h, h2,
        "add-remove-one: a teacher voting for the runner-up leaves (n = 200 -> 199), which moves the release "
        "threshold n/2 + L by a half and the noise the leader needs by one",
    )


def weighted_sampling_case(epsilon, delta, scale):

    epsilon = 2.0 if epsilon is None else epsilon  # per count (1, 1e-6)
    delta = 2e-6 if delta is None else delta
    # Replace-one only (n changes under add/remove-one, and every sampling rate c/n with it).  The pair moves
    # a lone token's vote to the tail, so one count changes: the claim for it is the per-count budget.
    honest = DPWeightedSampling(epsilon, delta)
    run = DPWeightedSampling(min(epsilon / scale, MAX_STEP_EPSILON), delta)
    n = 40
    pi = run.inclusion_probabilities(n)
    # The count where pi* grows fastest, among counts whose inclusion is likely enough to measure.
    ratios = np.where(pi[1:-1] >= 0.02, pi[2:] / np.maximum(pi[1:-1], 1e-300), 0.0)
    c = int(np.argmax(ratios)) + 2
    h, h2 = _pair({0: c}, {0: c - 1}, n)
    eps_c, delta_c = honest.per_count
    return AuditCase(
        "dp-weighted-sampling", run, eps_c, delta_c, h, h2,
        f"replace-one, a vote moved to the tail: a lone token's count {c} vs {c - 1} (n = {n}), where pi* grows "
        "by e^eps_c; one count changes, so the claim is the per-count budget (epsilon/2, delta/2)",
    )


def boundary_wrapper_case(epsilon, delta, scale):

    inner = dp_argmax_case(epsilon, delta, scale)
    honest = BoundaryWrapper(audit_case("dp-argmax", epsilon, delta).mechanism)
    return AuditCase(
        "boundary-dp-argmax", BoundaryWrapper(inner.mechanism), honest.event.epsilon, inner.claimed_delta,
        inner.histogram, inner.neighbour,
        "the dp-argmax pair, wrapped; the claim is the target's privacy level 2 eps_A",
    )



#: The audit size :func:`_telling_pair` chooses a pair for (the command's default ``--runs``).
_PAIR_RUNS = 200_000
#: The GNMax cases' default claim: a large delta, so that the worst pair's telling outcome is likely enough to
#: measure (at delta 1e-6 the set where the loss exceeds epsilon has probability about 1e-5).
_GAUSSIAN_EPSILON, _GAUSSIAN_DELTA = 1.0, 0.05
#: The GNMax cases run over a two-token vocabulary: one outcome (the trailing token) carries the evidence.
_GAUSSIAN_VOCAB = 2


def _pair_score(mechanism, claimed_delta: float, first, second) -> float:
    """What an audit of :data:`_PAIR_RUNS` runs per histogram should show on the pair, from the exact laws: the
    largest ``ln((P - delta - 3 sd) / (Q + 3 sd' + 3 / R))`` over the outcomes and both directions (``sd`` the
    standard deviation of a frequency over ``R`` runs); ``-inf`` when no outcome would give evidence."""
    p, q = mechanism.output_distribution(first).as_dict(), mechanism.output_distribution(second).as_dict()
    best = -math.inf
    for outcome in set(p) | set(q):
        first_p, second_p = (min(1.0, max(0.0, law.get(outcome, 0.0))) for law in (p, q))
        for a, b in ((first_p, second_p), (second_p, first_p)):
            low = a - claimed_delta - 3.0 * math.sqrt(a * (1.0 - a) / _PAIR_RUNS)
            high = b + 3.0 * math.sqrt(b * (1.0 - b) / _PAIR_RUNS) + 3.0 / _PAIR_RUNS
            if low > 0:
                best = max(best, math.log(low / high))
    return best


def _telling_pair(mechanism, claimed_delta: float, pairs):
    """The pair of ``pairs`` with the largest :func:`_pair_score` for ``mechanism`` (the one that runs, as an
    attacker would choose).  A heuristic for the choice only: the audit's bound itself is :func:`audit_pair`'s."""
    return max(pairs, key=lambda pair: _pair_score(mechanism, claimed_delta, *pair))


def _gaussian_run_noise(honest, scale: float) -> dict:
    """The keywords of the GNMax that runs: ``sigma`` scaled by ``scale`` (at least ``MIN_SIGMA``), its own event
    stated at ``epsilon / scale`` (the claim tested stays the honest one's)."""
    sigma = max(MIN_SIGMA, honest.sigma * scale)
    for epsilon in (min(honest.epsilon / scale, MAX_STEP_EPSILON), MAX_STEP_EPSILON):
        try:
            GaussianNoisyArgMax(sigma, epsilon=epsilon)
        except ValueError:  # so little noise that its own delta at that epsilon is 1
            continue
        return {"sigma": sigma, "epsilon": epsilon}
    raise ValueError(f"noise_scale {scale:g} leaves sigma {sigma:g}, too little noise to build a GNMax: choose a "
                     "larger noise scale")


def _grid(low: int, high: int, size: int = 48) -> list[int]:
    """Integers from ``low`` to ``high``: every one up to ``low + size``, then about ``size`` more, geometric."""
    if high <= low + size:
        return list(range(low, high + 1))
    return sorted(set(range(low, low + size)) | {int(v) for v in np.geomspace(low + size, high, size)})


def gaussian_argmax_case(epsilon, delta, scale):

    epsilon = _GAUSSIAN_EPSILON if epsilon is None else epsilon
    delta = _GAUSSIAN_DELTA if delta is None else delta
    honest = GaussianNoisyArgMax.calibrated(epsilon, delta, vocab_size=_GAUSSIAN_VOCAB)
    run = GaussianNoisyArgMax(vocab_size=_GAUSSIAN_VOCAB, **_gaussian_run_noise(honest, scale))
    # Over two tokens the law depends only on the gap g = c_1 - c_0, and a vote moving from token 1 to token 0
    # changes it by two: the pairs {1: g} vs {0: 1, 1: g - 1} are all such pairs up to translation (beyond
    # g = 2T + 2 the trailing token never wins).
    pairs = [(CountHistogram([1], [g], num_teachers=g), CountHistogram([0, 1], [1, g - 1], num_teachers=g))
             for g in _grid(1, 2 * run.truncation_bound + 2)]
    h, h2 = _telling_pair(run, honest.delta, pairs)
    return AuditCase(
        "gaussian-argmax", run, honest.event.epsilon, honest.event.delta, h, h2,
        f"replace-one over two tokens (sigma {honest.sigma:.3g}): the leader gives a vote to the trailing token, "
        "so their noisy difference moves by two (both counts move, as charged) and the trailing token's win "
        "probability moves by about e^eps; of such pairs (every gap up to 2T + 2, or a grid of them), the one "
        "where 2e5 runs show the most",
    )


def gaussian_threshold_argmax_case(epsilon, delta, scale):

    epsilon = _GAUSSIAN_EPSILON if epsilon is None else epsilon
    delta = _GAUSSIAN_DELTA if delta is None else delta
    honest = GaussianNoisyArgMax.calibrated(epsilon, delta, vocab_size=_GAUSSIAN_VOCAB)
    noise = _gaussian_run_noise(honest, scale)
    # As runs build it (GaussianThresholdArgMax.for_teachers): n configured teachers, the threshold a strict
    # majority; n is 3 or a few sigma (so the counts span the noise).  The candidate pairs of n teachers over the
    # two tokens and the tail: a vote moves from token 1 to token 0 ({0: a, 1: n - a} vs {0: a + 1, 1: n - a - 1}),
    # or from a lone token to the tail ({1: k} vs {1: k - 1}, the top count against the threshold).
    best = None
    for n in sorted({3, 2 * math.ceil(noise["sigma"]) + 1, 4 * math.ceil(noise["sigma"]) + 1}):
        run = GaussianThresholdArgMax(vocab_size=_GAUSSIAN_VOCAB, threshold=n // 2 + 1, **noise)
        pairs = [(CountHistogram([0, 1], [a, n - a], num_teachers=n),
                  CountHistogram([0, 1], [a + 1, n - a - 1], num_teachers=n)) for a in _grid(0, n - 1)]
        pairs += [(CountHistogram([1], [k], num_teachers=n), CountHistogram([1], [k - 1], num_teachers=n))
                  for k in _grid(1, n)]
        pair = _telling_pair(run, honest.delta, pairs)
        score = _pair_score(run, honest.delta, *pair)
        if best is None or score > best[0]:
            best = (score, n, run, pair)
    _, n, run, (h, h2) = best
    return AuditCase(
        "gaussian-threshold-argmax", run, honest.event.epsilon, honest.event.delta, h, h2,
        f"replace-one over two tokens, n = {n} configured teachers and the runs' threshold, a strict majority "
        f"({run.threshold} noisy votes; sigma {honest.sigma:.3g}): a vote moves from one token to the other (their "
        "noisy difference moves by two) or to the tail (the top count moves against the threshold); of such pairs "
        "(n among 3 and two and four sigma), the one where 2e5 runs show the most",
    )

def run_audit_case(case: AuditCase, num_runs: int, rng: np.random.Generator, confidence: float = 0.95) -> AuditResult:
    return audit_pair(
        case.mechanism, case.histogram, case.neighbour, num_runs, rng,
        claimed_epsilon=case.claimed_epsilon, claimed_delta=case.claimed_delta, confidence=confidence,
    )
