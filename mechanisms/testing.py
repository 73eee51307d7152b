"""Contract checks for mechanisms, as plain functions: unit-test your own mechanism the way ours are tested.

Each check raises ``AssertionError`` with a message naming the mechanism, the relation and the offending
pair or histogram, and otherwise returns a small report; none needs pytest.

* :func:`check_privacy_claim` -- exact enumeration.  For every neighbouring pair of small histograms (at
  most ``max_teachers`` teachers over ``vocab_size`` tokens, tail votes included; replace-one: one vote
  moves, ``n`` fixed; add/remove-one: a teacher with any vote joins or leaves) the mechanism's exact output
  laws (``output_distribution``) must respect its :meth:`~mechanisms.base.Mechanism.privacy_claim`: the tight
  hockey-stick divergence at the claimed epsilon is at most the claimed delta
  (:func:`mechanisms.audit.hockey_stick`), a claimed q-target is certified on every pair
  (:func:`mechanisms.qtarget.q_star`), and a threshold claim releases no token below its threshold.  The
  check refuses to pass vacuously: some neighbouring pair must move the law.
* :func:`check_event_covers_claim` -- the event, as a composition accountant charges it, is at least the
  claim (never an under-count), and a threshold-privacy event is refused by a DP accountant.
* :func:`check_sampler_matches_law` -- a chi-square test of ``num_samples`` runs (``run_batch`` or single
  calls) at a fixed seed against the exact law (:func:`check_counts_match_law`).
* :func:`check_mechanism` runs all three on one instance; :func:`check_registered_mechanism` on the small
  instances of a registered name (:func:`mechanisms.registry.contract_examples`), under each relation.
* :func:`check_distribution_mechanism` -- the same for a mechanism over teacher *distributions*
  (``inputs == "distributions"``: InvisibleInk's clipped-logit sampling), by exact enumeration over
  neighbouring ensembles of small distributions (:data:`SMALL_DISTRIBUTIONS`): one teacher's distribution
  replaced by any other, or a teacher joining or leaving, with every public distribution; the laws must respect
  the claimed epsilon, the event's bounded range and the Renyi divergences of its zCDP parameter.

A mechanism need not subclass :class:`mechanisms.base.Mechanism`: one with an ``event``, an exact
``output_distribution(histogram)`` and a ``run_batch`` or ``__call__`` will do (its claim is then read from
its event, :func:`mechanisms.base.privacy_claim_of`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from typing import Callable, NamedTuple

import attr
import numpy as np
from scipy import stats

from mechanisms.audit import (
    hockey_stick,
    law_epsilon,
    neighbouring_pairs,
    small_histograms,
)
from mechanisms.base import (
    FAIL_VALUE,
    EpsilonDeltaClaim,
    ThresholdClaim,
    claimed_relations_of,
    privacy_claim_of,
    reads_distributions,
)
from mechanisms.histogram import CountHistogram, HistogramBatch, as_histogram
from mechanisms.qtarget import q_star
from mechanisms.public_agreement import transcript_law
from mechanisms.registry import contract_examples
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    ThresholdPrivacyEvent,
)
from pate_accountant.release import TARGET
from pate_accountant.validation import check_int, check_real

__all__ = [
    "ALPHA",
    "MAX_TEACHERS",
    "MIN_MOVEMENT",
    "NUM_SAMPLES",
    "ROUNDING",
    "SAMPLER_HISTOGRAMS",
    "SEED",
    "VOCAB_SIZE",
    "ClaimReport",
    "PairDelta",
    "SamplerReport",
    "SMALL_DISTRIBUTIONS",
    "DistributionClaimReport",
    "EpisodeClaimReport",
    "check_counts_match_law",
    "check_distribution_mechanism",
    "check_episodic_mechanism",
    "check_event_covers_claim",
    "check_mechanism",
    "check_privacy_claim",
    "check_registered_mechanism",
    "check_sampler_matches_law",
    "sample_outcomes",
    "worst_pair_delta",
]

#: Histograms of at most this many teachers over this many tokens (plus tail votes) are enumerated.
MAX_TEACHERS = 6
VOCAB_SIZE = 3
#: Slack on a claimed delta (and on a claimed q) for the float64 rounding of exact laws: their probabilities
#: are sums of a few dozen terms, each exact to about 1e-16 relative.
ROUNDING = 1e-12
#: The largest total variation between the laws of some neighbouring pair must reach this, or the
#: enumerated histograms do not exercise the mechanism and a passing check would prove nothing.
MIN_MOVEMENT = 1e-3
#: Significance of a sampler check: an honest sampler fails it with probability ``ALPHA`` (the seed is
#: fixed, so a given check passes or fails reproducibly).
ALPHA = 1e-6
NUM_SAMPLES = 20_000
SEED = 20261123
#: Outcomes expected fewer than this many times in the sample are pooled (the chi-square approximation).
_MIN_EXPECTED = 5.0
#: Histograms the sampler checks run on by default: ties, tail votes, a lone count and two values of ``n``.
SAMPLER_HISTOGRAMS = (
    CountHistogram([0, 1, 2], [4, 1, 1], num_teachers=6),
    CountHistogram([0, 1, 2], [2, 2, 1], num_teachers=6),
    CountHistogram([0, 1], [5, 0], num_teachers=6),
    CountHistogram([0, 1, 2], [3, 3, 0], num_teachers=7),
)


# -- exact laws ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _pairs(max_teachers: int, vocab_size: int, relation: str, tail: bool) -> tuple:
    return tuple(neighbouring_pairs(max_teachers, vocab_size, relation, tail=tail))


@functools.lru_cache(maxsize=16)
def _histograms(max_teachers: int, vocab_size: int, tail: bool) -> tuple:
    return tuple(small_histograms(max_teachers, vocab_size, tail=tail))


def _name(mechanism) -> str:
    return repr(mechanism)


def _law_function(mechanism) -> Callable:
    """``histogram -> {outcome: probability}`` for a mechanism (its ``output_distribution``) or a plain law
    function (returning a dict or anything with ``as_dict()``), cached per histogram."""
    method = getattr(mechanism, "output_distribution", None)
    law = (lambda h: method(h)) if callable(method) else mechanism
    if not callable(law):
        raise TypeError(
            f"need a mechanism with an output_distribution or a law function, got {type(mechanism).__name__}"
        )
    cache: dict = {}

    def cached(histogram) -> dict:
        key = (histogram.num_teachers, histogram.tokens.tobytes(), histogram.counts.tobytes())
        if key not in cache:
            out = law(histogram)
            cache[key] = dict(out) if isinstance(out, Mapping) else out.as_dict()
        return cache[key]

    return cached


class PairDelta(NamedTuple):
    """The tight delta at some epsilon on the worst neighbouring pair, and that pair (``None`` without pairs)."""

    delta: float
    histogram: object
    neighbour: object


def worst_pair_delta(mechanism, epsilon: float, relation: str = REPLACE_ONE, *, pairs=None,
                     max_teachers: int = MAX_TEACHERS, vocab_size: int = VOCAB_SIZE, tail: bool = True) -> PairDelta:
    """The largest tight delta at ``epsilon`` (:func:`mechanisms.audit.hockey_stick`, both ways) over the
    neighbouring pairs, whatever the mechanism claims.  ``mechanism``: anything with an exact
    ``output_distribution``, or a law function ``histogram -> {outcome: probability}``.  ``pairs``: the
    pairs to use; by default every pair of :func:`mechanisms.audit.neighbouring_pairs` under ``relation``."""
    epsilon = check_real("epsilon", epsilon, minimum=0.0)
    if pairs is None:
        pairs = _pairs(max_teachers, vocab_size, relation, tail)
    law = _law_function(mechanism)
    worst = PairDelta(0.0, None, None)
    for first, second in pairs:
        value = hockey_stick(law(first), law(second), epsilon)
        if value > worst.delta or worst.histogram is None:
            worst = PairDelta(value, first, second)
    return worst


# -- privacy claims --------------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class ClaimReport:
    """What :func:`check_privacy_claim` found under one relation.

    ``worst_delta`` is the tight delta at the claimed epsilon on the worst pair ``worst_pair``, and
    ``worst_epsilon`` the exact epsilon of that pair at the claimed delta (:func:`mechanisms.audit.
    law_epsilon`); both ``None`` for a threshold claim.  ``worst_q`` is the smallest certified ``q`` of a
    claimed target over the pairs (``None`` without a target claim).  ``movement`` is the largest total
    variation between the laws of a neighbouring pair."""

    relation: str = attr.ib()
    claim = attr.ib()
    num_pairs: int = attr.ib()
    movement: float = attr.ib()
    worst_delta: float | None = attr.ib(default=None)
    worst_pair: tuple | None = attr.ib(default=None)
    worst_epsilon: float | None = attr.ib(default=None)
    worst_q: float | None = attr.ib(default=None)


def _target_q(first: dict, second: dict, outcome, epsilon: float) -> float:
    keys = sorted(set(first) | set(second) | {outcome}, key=repr)
    p0 = np.array([first.get(k, 0.0) for k in keys])
    p1 = np.array([second.get(k, 0.0) for k in keys])
    return q_star(p0 / p0.sum(), p1 / p1.sum(), epsilon, keys.index(outcome))


def check_privacy_claim(mechanism, *, relations=None, max_teachers: int = MAX_TEACHERS,
                        vocab_size: int = VOCAB_SIZE, tail: bool = True, rounding: float = ROUNDING,
                        min_movement: float = MIN_MOVEMENT) -> list[ClaimReport]:
    """Check the mechanism's privacy claim by exact enumeration under each relation in ``relations``
    (default: every relation it claims, :attr:`mechanisms.base.Mechanism.claimed_relations`).

    * An :class:`~mechanisms.base.EpsilonDeltaClaim` ``(epsilon, delta)``: on every neighbouring pair the
      tight delta at ``epsilon`` is at most ``delta + rounding``; with a target, ``q_star`` of the pair at the
      target's level is at least ``q - rounding``.
    * A :class:`~mechanisms.base.ThresholdClaim` ``T``: on every small histogram no token with fewer than ``T``
      votes has positive probability.

    ``min_movement``: the largest total variation over the pairs must reach it (pass ``0`` to allow a
    mechanism whose law never moves on these histograms).  Returns one :class:`ClaimReport` per relation."""
    max_teachers = check_int("max_teachers", max_teachers, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    rounding = check_real("rounding", rounding, minimum=0.0)
    min_movement = check_real("min_movement", min_movement, minimum=0.0, maximum=1.0)
    relations = claimed_relations_of(mechanism) if relations is None else tuple(relations)
    if not relations:
        raise AssertionError(f"{_name(mechanism)} claims no neighbouring relation")
    law = _law_function(mechanism)
    reports = []
    for relation in relations:
        if relation not in NEIGHBOURING_RELATIONS:
            raise ValueError(f"relations must hold names from {NEIGHBOURING_RELATIONS}, got {relation!r}")
        claim = privacy_claim_of(mechanism, relation)
        where = f"{_name(mechanism)} under {relation}"
        pairs = _pairs(max_teachers, vocab_size, relation, tail)
        if not pairs:
            raise AssertionError(f"{where}: no neighbouring pairs to check with at most {max_teachers} teachers")
        movement = max((hockey_stick(law(a), law(b), 0.0) for a, b in pairs), default=0.0)
        if movement < min_movement:
            raise AssertionError(
                f"{where}: the output law moves by at most {movement:.3g} (total variation) on the neighbouring "
                f"pairs of histograms with at most {max_teachers} teachers over {vocab_size} tokens: the check "
                "would be vacuous; use less noise or more teachers"
            )
        if isinstance(claim, ThresholdClaim):
            for hist in _histograms(max_teachers, vocab_size, tail):
                for outcome, p in law(hist).items():
                    if isinstance(outcome, (int, np.integer)) and p > 0 and hist.count(int(outcome)) < claim.threshold:
                        raise AssertionError(
                            f"{where}: token {outcome} has {hist.count(int(outcome))} votes, below the claimed "
                            f"threshold {claim.threshold}, yet is released with probability {p:.6g} on {hist}"
                        )
            reports.append(ClaimReport(relation, claim, len(pairs), movement))
            continue
        if not isinstance(claim, EpsilonDeltaClaim):
            raise TypeError(f"{where}: privacy_claim returned {type(claim).__name__}, not a claim")
        if claim.relation != relation:
            raise AssertionError(f"{where}: privacy_claim({relation!r}) answered for {claim.relation!r}")
        worst = PairDelta(0.0, None, None)
        worst_q = None
        for first, second in pairs:
            p, q = law(first), law(second)
            value = hockey_stick(p, q, claim.epsilon)
            if value > worst.delta or worst.histogram is None:
                worst = PairDelta(value, first, second)
            if claim.target is not None:
                certified = _target_q(p, q, claim.target.outcome, claim.target.epsilon)
                if certified < claim.target.q - rounding:
                    raise AssertionError(
                        f"{where}: outcome {claim.target.outcome!r} is only a {certified:.6g}-target at level "
                        f"{claim.target.epsilon:.6g} on {first} vs {second}, below the claimed q = {claim.target.q:.6g}"
                    )
                worst_q = certified if worst_q is None else min(worst_q, certified)
        pair_epsilon = law_epsilon(law(worst.histogram), law(worst.neighbour), claim.delta)
        if worst.delta > claim.delta + rounding:
            raise AssertionError(
                f"{where}: tight delta {worst.delta:.6g} > claimed {claim.delta:.6g} at epsilon {claim.epsilon:.6g} "
                f"on {worst.histogram} vs {worst.neighbour} (that pair needs epsilon {pair_epsilon:.6g} at the "
                "claimed delta)"
            )
        reports.append(ClaimReport(relation, claim, len(pairs), movement, worst.delta,
                                   (worst.histogram, worst.neighbour), pair_epsilon, worst_q))
    return reports


def check_event_covers_claim(mechanism, *, relations=None) -> None:
    """The mechanism's event charges at least its claim under each relation (default: those it claims).

    An ``(epsilon, delta)`` claim: a :class:`~pate_accountant.accountants.BasicCompositionAccountant` under the
    relation composes the event once and must have spent at least ``(epsilon, delta)`` (it refuses an event
    stated under another relation, which fails the check); a claimed target must not be charged at a
    smaller level or a larger ``q`` than claimed.  A threshold claim: the event is threshold privacy at a
    threshold no larger than the claimed one, and a DP accountant refuses it."""
    relations = claimed_relations_of(mechanism) if relations is None else tuple(relations)
    event = mechanism.event
    for relation in relations:
        claim = privacy_claim_of(mechanism, relation)
        where = f"{_name(mechanism)} under {relation}"
        if isinstance(claim, ThresholdClaim):
            if not isinstance(event, ThresholdPrivacyEvent) or event.threshold > claim.threshold:
                raise AssertionError(f"{where}: the event {event!r} does not follow from the claim {claim!r}")
            try:
                BasicCompositionAccountant(neighboring_relation=relation).compose(event)
            except UnsupportedEventError:
                continue
            raise AssertionError(f"{where}: a DP accountant charged the threshold-privacy event {event!r}")
        accountant = BasicCompositionAccountant(neighboring_relation=relation)
        try:
            accountant.compose(event)
        except UnsupportedEventError as exc:
            raise AssertionError(f"{where}: a composition accountant cannot charge the event {event!r}: {exc}") from exc
        epsilon, delta = accountant.spent()
        if epsilon < claim.epsilon * (1 - 1e-12) or delta < claim.delta * (1 - 1e-12):
            raise AssertionError(
                f"{where}: the event is charged ({epsilon:.6g}, {delta:.6g}), less than the claim "
                f"({claim.epsilon:.6g}, {claim.delta:.6g}): accountants would under-count"
            )
        target = claim.target
        q, level = getattr(event, "q", None), getattr(event, "epsilon", None)
        if target is not None and q is not None:
            if q > target.q * (1 + 1e-12) or level < target.epsilon * (1 - 1e-12):
                raise AssertionError(
                    f"{where}: the event charges its target at level {level:.6g} with q = {q:.6g}; the claim only "
                    f"certifies level {target.epsilon:.6g} with q = {target.q:.6g}"
                )


# -- samplers --------------------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class SamplerReport:
    """A chi-square test of observed outcome counts against an exact law: the statistic, the limit it had to
    stay under (the ``1 - alpha`` quantile) and its degrees of freedom (0: one outcome carries everything,
    and only impossible outcomes were looked for)."""

    num_samples: int = attr.ib()
    statistic: float = attr.ib()
    limit: float = attr.ib()
    degrees_of_freedom: int = attr.ib()
    counts: dict = attr.ib(eq=False)


def check_counts_match_law(counts: Mapping, law: Mapping, *, alpha: float = ALPHA,
                           what: str = "sampler") -> SamplerReport:
    """Chi-square test of ``counts`` (``{outcome: times seen}``) against ``law`` (``{outcome: probability}``,
    normalised here).  An outcome of probability zero that was seen fails at once.  Outcomes expected fewer
    than five times in ``sum(counts)`` draws are pooled into one bin (merged into the smallest other bin if
    still rare), so the chi-square approximation holds; the statistic must not exceed the ``1 - alpha``
    quantile of the chi-square law with ``bins - 1`` degrees of freedom."""
    alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    total = math.fsum(float(p) for p in law.values())
    if not total > 0:
        raise ValueError(f"{what}: the law has no mass")
    num = int(sum(int(v) for v in counts.values()))
    if num <= 0:
        raise ValueError(f"{what}: no draws to test")
    impossible = sorted((str(k) for k, v in counts.items() if v and not law.get(k, 0.0) > 0))
    if impossible:
        raise AssertionError(f"{what}: drew outcomes of probability zero: {', '.join(impossible)}")
    keys = [k for k, p in law.items() if p > 0]
    expected = np.array([law[k] / total * num for k in keys])
    observed = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    small = expected < _MIN_EXPECTED
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
        if expected[-1] < _MIN_EXPECTED and expected.size > 2:
            j = int(np.argmin(expected[:-1]))
            expected[j] += expected[-1]
            observed[j] += observed[-1]
            expected, observed = expected[:-1], observed[:-1]
    if expected.size < 2:
        return SamplerReport(num, 0.0, 0.0, 0, dict(counts))
    statistic = float(((observed - expected) ** 2 / expected).sum())
    limit = float(stats.chi2.isf(alpha, expected.size - 1))
    if not statistic <= limit:
        raise AssertionError(
            f"{what}: chi-square {statistic:.1f} > {limit:.1f} ({expected.size - 1} degrees of freedom, "
            f"alpha {alpha:g}, {num} draws): the draws do not follow the exact law"
        )
    return SamplerReport(num, statistic, limit, expected.size - 1, dict(counts))


def sample_outcomes(mechanism, histogram, num_samples: int, rng, *, path: str = "batch", law_keys=()) -> dict:
    """``{outcome: count}`` of ``num_samples`` runs on ``histogram``: ``path="batch"`` runs ``run_batch`` once
    on that many copies, ``path="call"`` calls the mechanism that many times.  Outcomes are keyed as in the
    exact law's ``as_dict()``: the value (``None`` for fail), or ``"target"`` for a target hit when the law
    has a ``"target"`` outcome (``law_keys``).  A mechanism whose single runs release labels of its law's
    outcomes (a ``TokenQuery``) maps them back with its ``outcome_code(value)``."""
    num_samples = check_int("num_samples", num_samples, minimum=1)
    hist = as_histogram(histogram)
    has_target = TARGET in law_keys
    counts: dict = {}
    if path == "batch":
        batch = HistogramBatch(np.repeat(np.arange(num_samples), hist.tokens.size), np.tile(hist.tokens, num_samples),
                               np.tile(hist.counts, num_samples), num_samples, hist.num_teachers)
        released = mechanism.run_batch(batch, rng=rng)
        values = np.asarray(released.values, dtype=np.int64)
        if values.shape != (num_samples,):
            raise AssertionError(
                f"{_name(mechanism)}: run_batch returned {values.shape} values for {num_samples} histograms"
            )
        hits = np.zeros(num_samples, dtype=bool)
        if has_target and released.target_hit is not None:
            hits = np.asarray(released.target_hit, dtype=bool)
            counts[TARGET] = int(hits.sum())
        keys, freq = np.unique(values[~hits], return_counts=True)
        for k, f in zip(keys.tolist(), freq.tolist()):
            counts[None if k == FAIL_VALUE else int(k)] = int(f)
    elif path == "call":
        code = getattr(mechanism, "outcome_code", None)
        for _ in range(num_samples):
            release = mechanism(hist, rng=rng)
            if has_target and release.target_hit:
                key = TARGET
            else:
                key = code(release.value) if callable(code) and release.value is not None else release.value
            counts[key] = counts.get(key, 0) + 1
    else:
        raise ValueError(f"path must be 'batch' or 'call', got {path!r}")
    return {k: v for k, v in counts.items() if v}


def check_sampler_matches_law(mechanism, histogram, num_samples: int = NUM_SAMPLES, seed: int = SEED, *,
                              alpha: float = ALPHA, path: str = "batch") -> SamplerReport:
    """``num_samples`` runs of ``mechanism`` on ``histogram`` (``path="batch"``: one ``run_batch``;
    ``"call"``: single calls), drawn with ``numpy.random.default_rng(seed)``, against its exact
    ``output_distribution`` by :func:`check_counts_match_law` at significance ``alpha``.  The exact law must
    sum to one (to ``1e-9``)."""
    law = mechanism.output_distribution(histogram).as_dict()
    total = math.fsum(law.values())
    what = f"{_name(mechanism)} on {as_histogram(histogram)} ({path})"
    if not abs(total - 1.0) <= 1e-9:
        raise AssertionError(f"{what}: the exact law sums to {total!r}, not 1")
    counts = sample_outcomes(mechanism, histogram, num_samples, np.random.default_rng(seed), path=path, law_keys=law)
    return check_counts_match_law(counts, law, alpha=alpha, what=what)


# -- everything at once ----------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class MechanismReport:
    """The reports of :func:`check_mechanism`: one :class:`ClaimReport` per relation, one
    :class:`SamplerReport` per (histogram, path)."""

    mechanism = attr.ib()
    claims: list = attr.ib()
    samplers: list = attr.ib()


def check_mechanism(mechanism, *, relations=None, histograms=SAMPLER_HISTOGRAMS, num_samples: int = NUM_SAMPLES,
                    seed: int = SEED, alpha: float = ALPHA, paths=("batch",), max_teachers: int = MAX_TEACHERS,
                    vocab_size: int = VOCAB_SIZE, min_movement: float = MIN_MOVEMENT) -> MechanismReport:
    """:func:`check_privacy_claim`, :func:`check_event_covers_claim` and :func:`check_sampler_matches_law` (on
    each of ``histograms``, by each of ``paths``, histogram ``i`` at seed ``seed + i``) on one mechanism."""
    claims = check_privacy_claim(mechanism, relations=relations, max_teachers=max_teachers, vocab_size=vocab_size,
                                 min_movement=min_movement)
    check_event_covers_claim(mechanism, relations=relations)
    samplers = [check_sampler_matches_law(mechanism, hist, num_samples, seed + i, alpha=alpha, path=path)
                for i, hist in enumerate(histograms) for path in paths]
    return MechanismReport(mechanism, claims, samplers)


# -- mechanisms over distributions -------------------------------------------------------------------------
#: The probability vectors over 3 tokens each teacher (and the public model) may hold in the enumeration:
#: certain tokens, zeros beside mass (whose log-differences clip at the bound), even and skewed laws.
SMALL_DISTRIBUTIONS = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.5, 0.0), (0.0, 0.5, 0.5),
                       (1 / 3, 1 / 3, 1 / 3), (0.7, 0.2, 0.1), (0.05, 0.05, 0.9))
#: Renyi orders at which a zCDP claim ``D_alpha <= alpha rho`` is checked.
RENYI_ORDERS = (1.5, 2.0, 4.0, 16.0, 64.0)


@attr.s(frozen=True, slots=True)
class DistributionClaimReport:
    """What :func:`check_distribution_mechanism` found under one relation: the pairs checked, the largest
    total variation, the largest log-ratio range (the bounded range) and the largest absolute log-ratio (the
    pure epsilon) over the pairs."""

    relation: str = attr.ib()
    num_pairs: int = attr.ib()
    movement: float = attr.ib()
    worst_range: float = attr.ib()
    worst_epsilon: float = attr.ib()


def _ensembles(size: int, choices: int):
    """Every multiset of ``size`` indices below ``choices`` (teachers are exchangeable in the aggregate)."""
    return itertools.combinations_with_replacement(range(choices), size)


def distribution_pairs(num_teachers: int, relation: str, *, distributions=SMALL_DISTRIBUTIONS):
    """Neighbouring ensembles (index tuples into ``distributions``) of at most ``num_teachers`` teachers:
    replace-one: one teacher's distribution replaced by another, every size from 1 to ``num_teachers``;
    add-remove-one: a teacher of any distribution joins an ensemble of fewer than ``num_teachers``.  Each pair
    once; the check reads both directions."""
    k = len(distributions)
    for size in range(1, num_teachers + 1):
        for ensemble in _ensembles(size, k):
            if relation == REPLACE_ONE:
                for member in sorted(set(ensemble)):
                    for other in range(member + 1, k):
                        changed = list(ensemble)
                        changed[changed.index(member)] = other
                        yield ensemble, tuple(sorted(changed))
                continue
            if size == 1:
                yield (), ensemble
            if size < num_teachers:
                for other in range(k):
                    yield ensemble, tuple(sorted((*ensemble, other)))


def check_distribution_mechanism(mechanism, *, relations=None, distributions=SMALL_DISTRIBUTIONS,
                                 min_movement: float = MIN_MOVEMENT, num_samples: int = NUM_SAMPLES,
                                 seed: int = SEED, alpha: float = ALPHA) -> list:
    """Exact enumeration for a mechanism over teacher distributions (``inputs == "distributions"``, called as
    ``mechanism(teacher_logprobs, public_logprobs, rng)`` with an exact ``output_distribution`` of the same
    arguments).  Under each relation (default: those it claims), for every public distribution of
    ``distributions`` and every neighbouring pair of ensembles of at most ``mechanism.num_teachers`` (capped at
    3) teachers (:func:`distribution_pairs`), both ways:

    * both laws put mass on the same tokens;
    * a pure claim (``delta == 0``): no log-ratio exceeds the claimed epsilon in absolute value, and for a
      bounded-range event (``event.rho``) the log-ratios span at most ``event.epsilon``;
    * an approximate claim (``delta > 0``, a zCDP event with ``event.rho``): the hockey-stick divergence
      ``sum_v max(0, P[v] - e^epsilon Q[v])`` is at most ``delta``;
    * an event with ``rho``: ``D_alpha(P || Q) <= alpha rho`` at each of :data:`RENYI_ORDERS`;
    * some pair moves the law by ``min_movement`` in total variation (no vacuous pass).

    Then :func:`check_event_covers_claim`, and a chi-square test of ``num_samples`` single calls against the
    exact law on one ensemble.  Returns a :class:`DistributionClaimReport` per relation."""
    relations = claimed_relations_of(mechanism) if relations is None else tuple(relations)
    with np.errstate(divide="ignore"):
        grid = np.log(np.asarray(distributions, dtype=np.float64))
    size = min(int(mechanism.num_teachers), 3)
    event = mechanism.event
    rho = getattr(event, "rho", None)
    reports = []
    for relation in relations:
        claim = privacy_claim_of(mechanism, relation)
        where = f"{_name(mechanism)} under {relation}"
        if not isinstance(claim, EpsilonDeltaClaim) or (claim.delta != 0.0 and rho is None):
            raise AssertionError(f"{where}: a distribution mechanism must claim pure DP or be zCDP with an "
                                 f"(epsilon, delta), got {claim!r} and an event without rho")
        pure = claim.delta == 0.0
        pairs = list(distribution_pairs(size, relation, distributions=distributions))
        movement = worst_range = worst_epsilon = 0.0
        for public in grid:
            laws: dict = {}

            def law(ensemble):
                if ensemble not in laws:
                    teachers = grid[list(ensemble)] if ensemble else np.zeros((0, grid.shape[1]))
                    out = mechanism.output_distribution(teachers, public)
                    full = np.zeros(grid.shape[1])
                    full[np.asarray(out.tokens, dtype=np.int64)] = out.probabilities
                    laws[ensemble] = full
                return laws[ensemble]

            for first, second in pairs:
                p, q = law(first), law(second)
                what = f"{where}: public {np.exp(public).round(3).tolist()}, teachers {first} and {second}"
                if not np.array_equal(p > 0, q > 0):
                    raise AssertionError(f"{what}: the laws put mass on different tokens")
                on = p > 0
                ratio = np.log(p[on]) - np.log(q[on])
                spread = float(ratio.max() - ratio.min())
                largest = float(np.abs(ratio).max())
                movement = max(movement, 0.5 * float(np.abs(p - q).sum()))
                worst_range, worst_epsilon = max(worst_range, spread), max(worst_epsilon, largest)
                if pure and largest > claim.epsilon:
                    raise AssertionError(f"{what}: a log-ratio of {largest!r} exceeds the claimed epsilon "
                                         f"{claim.epsilon!r}")
                if not pure:
                    for a, b in ((p, q), (q, p)):
                        stick = float(np.maximum(a - math.exp(claim.epsilon) * b, 0.0).sum())
                        if stick > claim.delta + ROUNDING:
                            raise AssertionError(f"{what}: the hockey-stick divergence at epsilon {claim.epsilon!r} "
                                                 f"is {stick!r}, above the claimed delta {claim.delta!r}")
                if rho is not None:
                    if pure and spread > event.epsilon:
                        raise AssertionError(f"{what}: the log-ratios span {spread!r}, more than the bounded range "
                                             f"{event.epsilon!r} the event charges")
                    for a, b in ((p[on], q[on]), (q[on], p[on])):
                        for order in RENYI_ORDERS:
                            divergence = math.log(float(np.sum(a ** order * b ** (1.0 - order)))) / (order - 1.0)
                            if divergence > order * rho + ROUNDING:
                                raise AssertionError(f"{what}: the Renyi divergence of order {order} is "
                                                     f"{divergence!r}, above {order} x rho = {order * rho!r}")
        if movement < min_movement:
            raise AssertionError(f"{where}: no neighbouring pair moves the law by {min_movement} (largest total "
                                 f"variation {movement!r}): the enumeration proves nothing")
        reports.append(DistributionClaimReport(relation, len(pairs) * len(grid), movement, worst_range, worst_epsilon))
    check_event_covers_claim(mechanism, relations=relations)
    teachers, public = grid[[0, 3, 6][:size]], grid[5]
    exact = mechanism.output_distribution(teachers, public).as_dict()
    rng = np.random.default_rng(seed)
    counts: dict = {}
    for _ in range(num_samples):
        value = mechanism(teachers, public, rng=rng).value
        counts[value] = counts.get(value, 0) + 1
    check_counts_match_law(counts, exact, alpha=alpha, what=f"{_name(mechanism)}'s sampler")
    return reports


@attr.s(frozen=True, slots=True)
class EpisodeClaimReport:
    """What :func:`check_episodic_mechanism` found under one relation: the neighbouring ensembles and query
    sequences checked, the largest query change (at most the sensitivity) and the largest absolute log-ratio of
    a transcript's probability (at most the test's epsilon)."""

    relation: str = attr.ib()
    num_ensemble_pairs: int = attr.ib()
    num_sequence_pairs: int = attr.ib()
    worst_query_change: int = attr.ib()
    worst_epsilon: float = attr.ib()


def check_episodic_mechanism(mechanism, *, relations=None, length: int = 3,
                             distributions=SMALL_DISTRIBUTIONS, num_samples: int = NUM_SAMPLES, seed: int = SEED,
                             alpha: float = ALPHA) -> list:
    """Exact enumeration for a sparse vector test over distributions (``mechanism.episodic``: an episode of
    AboveThreshold, then a private draw; :mod:`mechanisms.public_agreement`).  Under each relation:

    * the query moves by at most ``mechanism.sensitivity`` over every neighbouring pair of ensembles of at most 3
      teachers of ``distributions`` (:func:`distribution_pairs`), every public law;
    * the transcript (``below`` ``k`` times then ``above``, or ``below`` throughout) of one episode over every pair
      of query sequences of ``length`` integers within ``2 Delta`` of the threshold, each query of one moved by at
      most ``Delta`` from the other's: no log-ratio of a transcript's exact probability
      (:func:`mechanisms.public_agreement.transcript_law`) exceeds the test's epsilon;
    * the draw passes :func:`check_distribution_mechanism`; the event covers the claim
      (:func:`check_event_covers_claim`); single-step episodes answer ``below`` as often as the law says
      (chi-square of ``num_samples`` calls).

    Returns an :class:`EpisodeClaimReport` per relation."""
    relations = claimed_relations_of(mechanism) if relations is None else tuple(relations)
    with np.errstate(divide="ignore"):
        grid = np.log(np.asarray(distributions, dtype=np.float64))
    size = min(int(mechanism.num_teachers), 3)
    delta_q = int(mechanism.sensitivity)
    threshold = int(mechanism.threshold_units)
    gamma_threshold, gamma_query = mechanism.gammas
    low, width = threshold - 2 * delta_q, 4 * delta_q + 1  # the queries: within 2 Delta of the threshold
    laws = np.empty((width,) * length + (length + 1,))
    for index in itertools.product(range(width), repeat=length):
        laws[index] = np.log(transcript_law([low + i for i in index], threshold, gamma_threshold, gamma_query))
    reports = []
    for relation in relations:
        where = f"{_name(mechanism)} under {relation}"
        pairs = list(distribution_pairs(size, relation, distributions=distributions))
        worst_change = 0
        for public in grid:
            queries: dict = {}

            def query(ensemble):
                if ensemble not in queries:
                    teachers = grid[list(ensemble)] if ensemble else np.zeros((0, grid.shape[1]))
                    queries[ensemble] = mechanism.query(teachers, public)
                return queries[ensemble]

            for first, second in pairs:
                change = abs(query(first) - query(second))
                if change > delta_q:
                    raise AssertionError(f"{where}: public {np.exp(public).round(3).tolist()}, teachers {first} and "
                                         f"{second}: the query moves by {change}, more than its sensitivity {delta_q}")
                worst_change = max(worst_change, change)
        worst, count = 0.0, 0
        for shift in itertools.product(range(-delta_q, delta_q + 1), repeat=length):  # q' = q + shift, both in range
            here = tuple(slice(max(0, -d), width - max(0, d)) for d in shift)
            there = tuple(slice(max(0, d), width - max(0, -d)) for d in shift)
            ratios = np.abs(laws[here] - laws[there]).max(axis=-1)
            count += ratios.size
            if ratios.max() > mechanism.svt_epsilon + 1e-9:
                at = np.unravel_index(int(ratios.argmax()), ratios.shape)
                q = tuple(low + sl.start + i for sl, i in zip(here, at))
                other = tuple(a + d for a, d in zip(q, shift))
                raise AssertionError(f"{where}: queries {q} and {other}: a transcript's log-ratio is "
                                     f"{float(ratios.max())!r}, above the test's epsilon {mechanism.svt_epsilon!r}")
            worst = max(worst, float(ratios.max()))
        reports.append(EpisodeClaimReport(relation, len(pairs) * len(grid), count, worst_change, worst))
    check_distribution_mechanism(mechanism.draw, relations=relations, num_samples=min(num_samples, 2_000))
    check_event_covers_claim(mechanism, relations=relations)
    teachers, public = grid[[0, 3, 6][:size]], grid[5]
    q = mechanism.query(teachers, public)
    law = transcript_law([q], threshold, gamma_threshold, gamma_query)
    rng = np.random.default_rng(seed)
    below = sum(mechanism(teachers, public, rng=rng).outcome == "below" for _ in range(num_samples))
    check_counts_match_law({"above": num_samples - below, "below": below},
                           {"above": float(law[0]), "below": float(law[1])}, alpha=alpha,
                           what=f"{_name(mechanism)}'s sparse vector test")
    return reports


def check_registered_mechanism(name: str, **options) -> dict:
    """:func:`check_mechanism` on every small instance of the registered mechanism ``name`` under each
    neighbouring relation (:func:`mechanisms.registry.contract_examples`).  A relation the mechanism refuses
    must be refused with a ``ValueError`` naming it; at least one relation must be accepted, and each instance
    built under a relation must claim a guarantee under it.  ``options`` go to :func:`check_mechanism`.
    Returns ``{relation: [MechanismReport, ...]}`` (``[]`` for a refused relation)."""

    out: dict = {}
    for relation in NEIGHBOURING_RELATIONS:
        try:
            examples = contract_examples(name, relation)
        except ValueError as exc:
            if relation not in str(exc):
                raise AssertionError(f"mechanism {name!r} refused {relation} without naming it: {exc}") from exc
            out[relation] = []
            continue
        for example in examples:
            if relation not in claimed_relations_of(example):
                raise AssertionError(f"{name!r}: {_name(example)}, built under {relation}, claims nothing under it")
        out[relation] = [check_episodic_mechanism(example, relations=(relation,))
                         if getattr(example, "episodic", False)
                         else check_distribution_mechanism(example, relations=(relation,))
                         if reads_distributions(example)
                         else check_mechanism(example, relations=(relation,), **options) for example in examples]
    if not any(out.values()):
        raise AssertionError(f"mechanism {name!r} refuses every neighbouring relation")
    return out
