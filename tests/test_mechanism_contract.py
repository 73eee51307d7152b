"""One contract suite, parametrized over every mechanism class in ``mechanisms`` and every relation.

Discovery: every class named in ``mechanisms.__all__`` that has an ``event`` and an ``output_distribution``
is a mechanism under contract.  ``BUILDERS`` says how to build a few instances of each under a relation
(small noise, so that histograms of at most six teachers exercise every branch); a mechanism with no
builder fails ``test_every_mechanism_has_a_builder``, so one added later cannot slip through.

For each mechanism and each neighbouring relation (replace-one: a vote moves, ``n`` fixed; add/remove-one:
a teacher with any vote, tail votes included, joins or leaves, ``n`` changes by one), either

* the mechanism refuses the relation at construction with a ``ValueError`` naming it, or
* every instance's event states that relation, and for **every** neighbouring pair of histograms with at
  most ``MAX_TEACHERS`` teachers over ``VOCAB`` tokens, the tight hockey-stick divergence of the exact
  output laws at the claimed epsilon is at most the claimed delta.  The claim is the event's
  ``(epsilon, delta)`` as an accountant charges it (``epsilon_delta_terms``; for the boundary wrapper that
  is the wrapped claim, the q-target side is tested with target charging); a threshold-privacy event
  claims instead that no token below its threshold is ever released.

And every sampler matches its exact law: a chi-square test at a fixed seed on a few histograms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import mechanisms
from mechanisms.audit import exact_pair_delta, neighbouring_pairs, small_histograms
from mechanisms.base import FAIL_VALUE
from mechanisms.histogram import CountHistogram, HistogramBatch
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.events import ADD_REMOVE_ONE, NEIGHBOURING_RELATIONS, REPLACE_ONE, ThresholdPrivacyEvent

#: Histograms of at most this many teachers over this many tokens (plus tail votes) are enumerated.
MAX_TEACHERS = 6
VOCAB = 3
#: Slack on the claimed delta for float64 rounding of the exact laws (probabilities are sums of a few
#: dozen terms, each exact to about 1e-16 relative).
ROUNDING = 1e-12


def _discovered() -> list[type]:
    out = []
    for name in mechanisms.__all__:
        obj = getattr(mechanisms, name)
        if isinstance(obj, type) and hasattr(obj, "event") and hasattr(obj, "output_distribution"):
            out.append(obj)
    return out


MECHANISMS = _discovered()


class TokenQuery:
    """A count query (``BetweenThresholds``) run on token ``token`` of each histogram: the mechanism the
    privacy claim is about when the token is fixed in advance."""

    def __init__(self, mechanism, token: int = 0):
        self.mechanism, self.token = mechanism, token

    @property
    def event(self):
        return self.mechanism.event

    def output_distribution(self, histogram):
        return self.mechanism.output_distribution(histogram, token=self.token)

    def run_batch(self, batch, rng=None):
        return self.mechanism.run_batch(batch, rng=rng, token=self.token)

    def __repr__(self):
        return f"TokenQuery({self.mechanism!r}, token={self.token})"


def _noisy_argmax(relation):
    cls = mechanisms.TruncatedGeometricNoisyArgMax
    return [cls(2.0, 0.2, relation=relation), cls(1.0, 0.1, relation=relation), cls(4.0, 0.05, relation=relation)]


def _dp_argmax(relation):
    cls = mechanisms.DPArgMax
    return [cls(2.0, 0.2, relation=relation), cls(1.0, 0.1, relation=relation), cls(4.0, 0.05, relation=relation),
            cls(0.5, 0.3, relation=relation)]


def _weighted_sampling(relation):
    cls = mechanisms.DPWeightedSampling
    return [cls(1.0, 0.05, relation), cls(2.0, 0.1, relation), cls(0.5, 1e-3, relation),
            cls(1.0, 0.05, relation, release_counts=True)]


def _between_thresholds(relation):
    cls = mechanisms.BetweenThresholds
    return [TokenQuery(cls(1.0, 1, 3, relation=relation)), TokenQuery(cls(0.5, 0, 4, relation=relation)),
            TokenQuery(cls(2.0, 2, 3, relation=relation))]


def _threshold_argmax(relation):
    return [mechanisms.ThresholdArgMax(2), mechanisms.ThresholdArgMax(4)]


def _threshold_weighted_sampling(relation):
    return [mechanisms.ThresholdWeightedSampling(2, 1.0), mechanisms.ThresholdWeightedSampling(3, 2.0)]


def _boundary_wrapper(relation):
    inner = [mechanisms.DPArgMax(2.0, 0.2, relation=relation), mechanisms.DPArgMax(0.6, 0.3, relation=relation)]
    if relation == REPLACE_ONE:
        inner.append(mechanisms.DPWeightedSampling(1.0, 0.05))
    return [mechanisms.BoundaryWrapper(m) for m in inner]


#: ``builder(relation) -> [mechanism, ...]``; raises ``ValueError`` when the class refuses the relation.
BUILDERS = {
    mechanisms.TruncatedGeometricNoisyArgMax: _noisy_argmax,
    mechanisms.DPArgMax: _dp_argmax,
    mechanisms.DPWeightedSampling: _weighted_sampling,
    mechanisms.BetweenThresholds: _between_thresholds,
    mechanisms.ThresholdArgMax: _threshold_argmax,
    mechanisms.ThresholdWeightedSampling: _threshold_weighted_sampling,
    mechanisms.BoundaryWrapper: _boundary_wrapper,
}

#: Relations a class refuses at construction (it must raise a clear ValueError naming the relation).
REFUSED = {(mechanisms.DPWeightedSampling, ADD_REMOVE_ONE)}


def _build(cls, relation):
    builder = BUILDERS.get(cls)
    if builder is None:
        pytest.fail(f"no builder for mechanism {cls.__name__}: add one to BUILDERS in {__name__}")
    return builder(relation)


def _stated_relation(event):
    inner = getattr(event, "inner", None)
    return getattr(event if inner is None else inner, "relation", None)


def _claim(event) -> tuple[float, float]:
    terms = epsilon_delta_terms(event)
    return math.fsum(e * m for e, _, m in terms), min(1.0, math.fsum(d * m for _, d, m in terms))


def _law(mechanism, histogram) -> dict:
    return mechanism.output_distribution(histogram).as_dict()


# -- discovery ---------------------------------------------------------------------------------------------------
def test_discovery_finds_the_mechanisms():
    names = {cls.__name__ for cls in MECHANISMS}
    assert {"TruncatedGeometricNoisyArgMax", "DPArgMax", "DPWeightedSampling", "BetweenThresholds",
            "BoundaryWrapper", "ThresholdArgMax", "ThresholdWeightedSampling"} <= names


@pytest.mark.parametrize("cls", MECHANISMS, ids=lambda c: c.__name__)
def test_every_mechanism_has_a_builder(cls):
    assert cls in BUILDERS, f"no builder for mechanism {cls.__name__}: add one to BUILDERS"


def test_the_enumeration_covers_both_relations():
    hists = small_histograms(MAX_TEACHERS, VOCAB)
    assert len(hists) == sum(math.comb(n + VOCAB, VOCAB) for n in range(MAX_TEACHERS + 1))  # tokens + tail
    replace = neighbouring_pairs(MAX_TEACHERS, VOCAB, REPLACE_ONE)
    add = neighbouring_pairs(MAX_TEACHERS, VOCAB, ADD_REMOVE_ONE)
    assert all(a.num_teachers == b.num_teachers for a, b in replace)
    assert all(b.num_teachers == a.num_teachers + 1 for a, b in add)
    # one vote differs: replace-one moves it (L1 distance 2 over tokens and tail), add/remove adds it.
    for a, b in replace:
        diff = np.abs(b.to_dense(VOCAB) - a.to_dense(VOCAB)).sum() + abs(b.tail - a.tail)
        assert diff == 2
    for a, b in add:
        assert (b.to_dense(VOCAB) - a.to_dense(VOCAB)).sum() + (b.tail - a.tail) == 1
    assert len({(a, b) for a, b in replace} | {(b, a) for a, b in replace}) == 2 * len(replace)


# -- privacy by exact enumeration -----------------------------------------------------------------------------------
CASES = [(cls, relation) for cls in MECHANISMS for relation in NEIGHBOURING_RELATIONS]


@pytest.mark.parametrize("cls, relation", CASES, ids=lambda x: getattr(x, "__name__", x))
def test_claim_bounds_the_tight_divergence_on_every_neighbouring_pair(cls, relation):
    if (cls, relation) in REFUSED:
        with pytest.raises(ValueError, match=relation):
            _build(cls, relation)
        return
    built = _build(cls, relation)
    assert built
    pairs = neighbouring_pairs(MAX_TEACHERS, VOCAB, relation)
    for mechanism in built:
        event = mechanism.event
        if isinstance(event, ThresholdPrivacyEvent):
            _check_threshold_claim(mechanism, event.threshold)
            continue
        assert _stated_relation(event) == relation, (mechanism, event)
        epsilon, delta = _claim(event)
        cached = _Cached(mechanism)
        worst, where = 0.0, None
        for first, second in pairs:
            value = exact_pair_delta(cached, first, second, epsilon)
            if value > worst:
                worst, where = value, (first, second)
        assert worst <= delta + ROUNDING, f"{mechanism!r}: tight delta {worst:.6g} > {delta:.6g} at eps {epsilon} on {where}"
        # The check has teeth: the output law moves on some neighbouring pair (total variation > 0), so the
        # enumerated histograms exercise the mechanism.
        assert max(exact_pair_delta(cached, a, b, 0.0) for a, b in pairs) > 1e-3, mechanism


class _Cached:
    """The exact laws of one mechanism, computed once per histogram."""

    def __init__(self, mechanism):
        self.mechanism, self.laws = mechanism, {}

    def output_distribution(self, histogram):
        key = (histogram.num_teachers, histogram.tokens.tobytes(), histogram.counts.tobytes())
        if key not in self.laws:
            self.laws[key] = _law(self.mechanism, histogram)
        return _Dict(self.laws[key])


class _Dict:
    def __init__(self, law):
        self.law = law

    def as_dict(self):
        return self.law


def _check_threshold_claim(mechanism, threshold: int) -> None:
    """Threshold privacy: only tokens with count at least the threshold are ever released."""
    for hist in small_histograms(MAX_TEACHERS, VOCAB):
        for token, p in _law(mechanism, hist).items():
            if token is not None and p > 0:
                assert hist.count(token) >= threshold, (mechanism, hist, token, p)


# -- sampler against exact law ---------------------------------------------------------------------------------------
SAMPLER_HISTOGRAMS = [
    CountHistogram([0, 1, 2], [4, 1, 1], num_teachers=6),
    CountHistogram([0, 1, 2], [2, 2, 1], num_teachers=6),
    CountHistogram([0, 1], [5, 0], num_teachers=6),
    CountHistogram([0, 1, 2], [3, 3, 0], num_teachers=7),
]
DRAWS = 20_000
#: Per-test significance: the chi-square statistic is compared with its (1 - ALPHA) quantile, so an honest
#: sampler fails with probability ALPHA per histogram (the seed is fixed, so the outcome is reproducible).
ALPHA = 1e-6
_TARGET_CODE = FAIL_VALUE - 1


def _sample(mechanism, histogram, rng, target: bool) -> np.ndarray:
    """``DRAWS`` runs on ``histogram``: released values, with ``_TARGET_CODE`` for a target outcome when the
    law has one (``target``; a count query's ``between`` is an ordinary outcome code of its law)."""
    batch = HistogramBatch(np.repeat(np.arange(DRAWS), histogram.tokens.size), np.tile(histogram.tokens, DRAWS),
                           np.tile(histogram.counts, DRAWS), DRAWS, histogram.num_teachers)
    released = mechanism.run_batch(batch, rng=rng)
    values = np.asarray(released.values, dtype=np.int64).copy()
    if target and released.target_hit is not None:
        values[np.asarray(released.target_hit, dtype=bool)] = _TARGET_CODE
    return values


def _code(outcome) -> int:
    return FAIL_VALUE if outcome is None else (_TARGET_CODE if outcome == "target" else int(outcome))


@pytest.mark.parametrize("cls", MECHANISMS, ids=lambda c: c.__name__)
def test_sampler_matches_the_exact_law(cls):
    rng = np.random.default_rng(20261123)
    built = _build(cls, REPLACE_ONE)
    for mechanism in built:
        for hist in SAMPLER_HISTOGRAMS:
            exact = mechanism.output_distribution(hist).as_dict()
            law = {_code(k): v for k, v in exact.items() if v > 0}
            assert math.isclose(sum(law.values()), 1.0, abs_tol=1e-9), (mechanism, hist, law)
            values = _sample(mechanism, hist, rng, "target" in exact)
            observed = dict(zip(*np.unique(values, return_counts=True)))
            impossible = set(int(k) for k in observed) - set(law)
            assert not impossible, f"{mechanism!r} on {hist}: outcomes {impossible} have probability zero"
            codes = sorted(law)
            expected = np.array([law[c] * DRAWS for c in codes])
            counts = np.array([observed.get(c, 0) for c in codes], dtype=np.float64)
            small = expected < 5  # pool rare outcomes so the chi-square approximation holds
            if small.any():
                expected = np.append(expected[~small], expected[small].sum())
                counts = np.append(counts[~small], counts[small].sum())
            if expected.size < 2 or expected[-1] == 0:
                expected, counts = expected[expected > 0], counts[expected > 0]
            if expected.size < 2:
                assert counts.sum() == DRAWS
                continue
            statistic = float(((counts - expected) ** 2 / expected).sum())
            limit = float(stats.chi2.isf(ALPHA, expected.size - 1))
            assert statistic <= limit, f"{mechanism!r} on {hist}: chi-square {statistic:.1f} > {limit:.1f}"


# -- the enumeration has teeth ---------------------------------------------------------------------------------------
def _worst(mechanism, relation, epsilon) -> float:
    cached = _Cached(mechanism)
    return max(exact_pair_delta(cached, a, b, epsilon) for a, b in neighbouring_pairs(MAX_TEACHERS, VOCAB, relation))


@pytest.mark.parametrize(
    "honest, broken",
    [
        # DPArgMax's release reads one count (at most one token exceeds n/2), so doubling its epsilon stays
        # within the claim; four times is caught.
        (mechanisms.DPArgMax(1.0, 0.1), mechanisms.DPArgMax(4.0, 0.1)),
        (mechanisms.TruncatedGeometricNoisyArgMax(2.0, 0.2), mechanisms.TruncatedGeometricNoisyArgMax(4.0, 0.2)),
        (mechanisms.DPWeightedSampling(1.0, 0.05), mechanisms.DPWeightedSampling(2.0, 0.05)),
        (TokenQuery(mechanisms.BetweenThresholds(1.0, 1, 3)), TokenQuery(mechanisms.BetweenThresholds(2.0, 1, 3))),
    ],
    ids=lambda m: repr(m),
)
def test_the_enumeration_catches_a_claim_with_too_little_noise(honest, broken):
    """The same mechanism with its noise scaled down (epsilon doubled) but the honest claim: some
    replace-one pair of small histograms exceeds the claimed delta."""
    epsilon, delta = _claim(honest.event)
    assert _worst(honest, REPLACE_ONE, epsilon) <= delta + ROUNDING
    assert _worst(broken, REPLACE_ONE, epsilon) > delta


def test_weighted_sampling_per_count_calibration_fails_add_remove_one():
    """Why DPWeightedSampling refuses add/remove-one: calibrated per count at (1, 0.05) (the old reading,
    one count changes), the add/remove-one pairs, where n and every sampling rate c/n change too, need
    more than delta 0.05 at epsilon 1."""
    per_count_one = mechanisms.DPWeightedSampling(2.0, 0.1)  # replace-one: per-count (1, 0.05)
    assert per_count_one.per_count == (1.0, 0.05)
    assert _worst(per_count_one, ADD_REMOVE_ONE, 1.0) > 0.05
    with pytest.raises(ValueError, match="relation must be 'replace-one' for DPWeightedSampling, got 'add-remove-one'"):
        mechanisms.DPWeightedSampling(1.0, 0.05, ADD_REMOVE_ONE)
