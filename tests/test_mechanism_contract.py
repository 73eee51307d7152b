"""One contract suite, parametrized over every registered mechanism (``mechanisms.registry``) and every relation.

Each registered name gives a few small instances under a relation (``registry.contract_examples``: the
entry's ``examples``, or its ``build`` at a few large budgets), or refuses the relation with a ``ValueError``
naming it.  For every instance the public checks of ``mechanisms.testing`` run:

* its privacy claim (``privacy_claim(relation)``) holds on **every** neighbouring pair of histograms with at
  most six teachers over three tokens, tail votes included, computed from the exact output laws: the tight
  hockey-stick divergence at the claimed epsilon is at most the claimed delta, a claimed q-target is
  certified on each pair, a threshold claim releases no token below its threshold;
* its event charges at least that claim (a composition accountant spends no less);
* its sampler matches its exact law: a chi-square test at a fixed seed, by ``run_batch`` and by single calls.

A mechanism registered by a user (before this module is collected) gets the same tests; so does every
mechanism class the package exports, which must be reachable from some registered name.
"""

from __future__ import annotations

import math

import attr
import numpy as np
import pytest

import mechanisms
from mechanisms import registry
from mechanisms.audit import neighbouring_pairs, small_histograms
from mechanisms.base import (
    EpsilonDeltaClaim,
    Mechanism,
    OutcomeDistribution,
    ThresholdClaim,
    reads_distributions,
)
from mechanisms.testing import (
    MAX_TEACHERS,
    ROUNDING,
    SAMPLER_HISTOGRAMS,
    VOCAB_SIZE,
    check_counts_match_law,
    check_distribution_mechanism,
    check_episodic_mechanism,
    check_event_covers_claim,
    check_privacy_claim,
    check_registered_mechanism,
    check_sampler_matches_law,
    worst_pair_delta,
)
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    EpsilonDeltaEvent,
)

NAMES = registry.mechanism_names()
CASES = [(name, relation) for name in NAMES for relation in NEIGHBOURING_RELATIONS]

#: The relations the built-in mechanisms refuse (every sampling rate c/n of weighted sampling moves with n).
BUILTIN_REFUSALS = {("dp-weighted-sampling", ADD_REMOVE_ONE), ("boundary-dp-weighted-sampling", ADD_REMOVE_ONE)}


def _examples(name, relation):
    """The instances of ``name`` under ``relation``, or ``None`` when it refuses the relation (checked to be
    a ``ValueError`` naming it)."""
    try:
        return registry.contract_examples(name, relation)
    except ValueError as exc:
        assert relation in str(exc), f"{name} refused {relation} without naming it: {exc}"
        return None


def _reached_classes(mechanism) -> set:
    """The mechanism's class and those of the mechanisms it runs (a wrapper's inner, a token query's query)."""
    out = {type(mechanism)}
    for part in ("inner", "query"):
        inner = getattr(mechanism, part, None)
        if inner is not None:
            out |= _reached_classes(inner)
    return out


# -- the registry covers the package ---------------------------------------------------------------------
def test_every_exported_mechanism_class_is_reached_by_a_registered_name():
    exported = {getattr(mechanisms, n) for n in mechanisms.__all__}
    classes = {c for c in exported if isinstance(c, type) and issubclass(c, Mechanism) and c is not Mechanism}
    assert {"ThresholdArgMax", "ThresholdWeightedSampling", "TruncatedGeometricNoisyArgMax", "DPArgMax",
            "DPWeightedSampling", "BetweenThresholds", "BoundaryWrapper", "TokenQuery", "GaussianNoisyArgMax",
            "GaussianThresholdArgMax"} <= {c.__name__ for c in classes}
    reached = set()
    for name, relation in CASES:
        for example in _examples(name, relation) or []:
            reached |= _reached_classes(example)
    assert classes <= reached, f"not reached by any registered name: {sorted(c.__name__ for c in classes - reached)}"


def test_the_builtin_refusals_are_exactly_the_known_ones():
    refused = {(name, relation) for name, relation in CASES if _examples(name, relation) is None}
    assert BUILTIN_REFUSALS <= refused
    assert {case for case in refused if case[0] in _BUILTIN_NAMES} == BUILTIN_REFUSALS


_BUILTIN_NAMES = {"dp-argmax", "boundary-dp-argmax", "dp-weighted-sampling", "boundary-dp-weighted-sampling",
                  "noisy-argmax", "between-thresholds", "threshold-argmax", "threshold-weighted-sampling",
                  "gaussian-argmax", "gaussian-threshold-argmax"}


def test_the_builtin_names_are_registered():
    assert _BUILTIN_NAMES <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_name_accepts_a_relation_and_its_instances_claim_it(name):
    accepted = [relation for relation in NEIGHBOURING_RELATIONS if _examples(name, relation) is not None]
    assert accepted, f"{name} refuses every relation"
    for relation in accepted:
        for example in _examples(name, relation):
            assert relation in example.claimed_relations, (name, example)
            claim = example.privacy_claim(relation)
            assert isinstance(claim, (EpsilonDeltaClaim, ThresholdClaim)), claim


def test_the_enumeration_covers_both_relations():
    hists = small_histograms(MAX_TEACHERS, VOCAB_SIZE)
    assert len(hists) == sum(math.comb(n + VOCAB_SIZE, VOCAB_SIZE) for n in range(MAX_TEACHERS + 1))  # tokens + tail
    replace = neighbouring_pairs(MAX_TEACHERS, VOCAB_SIZE, REPLACE_ONE)
    add = neighbouring_pairs(MAX_TEACHERS, VOCAB_SIZE, ADD_REMOVE_ONE)
    assert all(a.num_teachers == b.num_teachers for a, b in replace)
    assert all(b.num_teachers == a.num_teachers + 1 for a, b in add)
    # one vote differs: replace-one moves it (L1 distance 2 over tokens and tail), add/remove adds it.
    for a, b in replace:
        diff = np.abs(b.to_dense(VOCAB_SIZE) - a.to_dense(VOCAB_SIZE)).sum() + abs(b.tail - a.tail)
        assert diff == 2
    for a, b in add:
        assert (b.to_dense(VOCAB_SIZE) - a.to_dense(VOCAB_SIZE)).sum() + (b.tail - a.tail) == 1
    assert len({(a, b) for a, b in replace} | {(b, a) for a, b in replace}) == 2 * len(replace)


# -- privacy by exact enumeration --------------------------------------------------------------------------
@pytest.mark.parametrize("name, relation", CASES)
def test_claim_holds_on_every_neighbouring_pair_and_the_event_covers_it(name, relation):
    examples = _examples(name, relation)
    if examples is None:  # refused at construction, naming the relation (checked in _examples)
        return
    for mechanism in examples:
        if getattr(mechanism, "episodic", False):  # a sparse vector test: its episodes' transcripts are enumerated
            (report,) = check_episodic_mechanism(mechanism, relations=(relation,))
            assert report.relation == relation and report.num_ensemble_pairs > 100
            assert report.num_sequence_pairs > 100
        elif reads_distributions(mechanism):  # the pairs are ensembles of distributions, and the sampler is checked
            (report,) = check_distribution_mechanism(mechanism, relations=(relation,))
        else:
            (report,) = check_privacy_claim(mechanism, relations=(relation,))
        if not getattr(mechanism, "episodic", False):
            assert report.relation == relation and report.num_pairs > 100
        check_event_covers_claim(mechanism, relations=(relation,))




@pytest.mark.parametrize("name, tightest", [("gaussian-argmax", {REPLACE_ONE: 0.95, ADD_REMOVE_ONE: 0.3}),
                                            ("gaussian-threshold-argmax", {REPLACE_ONE: 0.95, ADD_REMOVE_ONE: 0.95})])
def test_the_gaussian_claims_are_enumerated_under_both_relations_and_nearly_reached(name, tightest):
    """Both Gaussian mechanisms claim both relations, and the enumeration of every neighbouring pair reaches
    their charged curve: on some example the worst pair's exact delta is at least ``tightest`` of the claimed
    delta (replace-one moves two counts, as charged; under add-remove-one the plain argmax over three tokens
    hides part of the one count that moves, the thresholded form's fail outcome does not)."""
    for relation in NEIGHBOURING_RELATIONS:
        ratios = []
        for mechanism in _examples(name, relation):
            assert mechanism.relation == relation and mechanism.claimed_relations == (relation,)
            (report,) = check_privacy_claim(mechanism, relations=(relation,))
            assert report.num_pairs == len(neighbouring_pairs(MAX_TEACHERS, VOCAB_SIZE, relation))
            ratios.append(report.worst_delta / mechanism.privacy_claim(relation).delta)
        assert tightest[relation] <= max(ratios) <= 1.0 + 1e-9, (relation, ratios)


# -- sampler against exact law ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, relation", CASES)
def test_sampler_matches_the_exact_law(name, relation):
    for index, mechanism in enumerate(_examples(name, relation) or []):
        if reads_distributions(mechanism):
            continue  # no histograms: check_distribution_mechanism tests its sampler (the claim test above)
        for i, hist in enumerate(SAMPLER_HISTOGRAMS):
            check_sampler_matches_law(mechanism, hist, seed=20261123 + 10 * index + i)
        # single calls take the same law (fewer draws: one Python call each)
        check_sampler_matches_law(mechanism, SAMPLER_HISTOGRAMS[0], 2_000, seed=7 + index, path="call")


# -- the checks have teeth -----------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class Overclaiming(Mechanism):
    """Runs ``actual`` (its law, its sampler) but states the claim and event of ``honest``."""

    honest = attr.ib()
    actual = attr.ib()

    @property
    def event(self):
        return self.honest.event

    def privacy_claim(self, relation=None):
        return self.honest.privacy_claim(relation)

    def output_distribution(self, histogram, num_teachers=None):
        return self.actual.output_distribution(histogram, num_teachers)


@pytest.mark.parametrize(
    "honest, broken",
    [
        # DPArgMax's claim is tight (the truncation's delta is reached), so even a little less noise breaks it.
        (mechanisms.DPArgMax(1.0, 0.1), mechanisms.DPArgMax(1.5, 0.1)),
        (mechanisms.TruncatedGeometricNoisyArgMax(2.0, 0.2), mechanisms.TruncatedGeometricNoisyArgMax(4.0, 0.2)),
        (mechanisms.DPWeightedSampling(1.0, 0.05), mechanisms.DPWeightedSampling(2.0, 0.05)),
        (mechanisms.BetweenThresholds(1.0, 1, 3).on_token(0), mechanisms.BetweenThresholds(2.0, 1, 3).on_token(0)),
        # GNMax's claim is nearly tight on these pairs too (the charged curve is within 0.2 % of the worst pair).
        (mechanisms.GaussianNoisyArgMax(1.0, vocab_size=3), mechanisms.GaussianNoisyArgMax(0.8, vocab_size=3)),
        (mechanisms.GaussianThresholdArgMax(1.0, vocab_size=3, threshold=3),
         mechanisms.GaussianThresholdArgMax(0.8, vocab_size=3, threshold=3)),
    ],
    ids=lambda m: repr(m),
)
def test_a_claim_with_too_little_noise_is_caught(honest, broken):
    """The same mechanism with its noise scaled down but the honest claim: some replace-one pair of small
    histograms exceeds the claimed delta, and the check says so."""
    claim = honest.privacy_claim()
    assert worst_pair_delta(honest, claim.epsilon).delta <= claim.delta + ROUNDING
    assert worst_pair_delta(broken, claim.epsilon).delta > claim.delta
    with pytest.raises(AssertionError, match="tight delta .* > claimed|is only a .*-target"):
        check_privacy_claim(Overclaiming(honest, broken))


def test_a_target_claim_that_is_too_generous_is_caught():
    query = mechanisms.BetweenThresholds(1.0, 1, 3)
    honest = query.privacy_claim()

    @attr.s(frozen=True, slots=True)
    class Generous(Overclaiming):
        def privacy_claim(self, relation=None):
            target = attr.evolve(honest.target, q=honest.target.q * 1.05)
            return attr.evolve(honest, target=target)

    with pytest.raises(AssertionError, match="is only a .*-target at level"):
        check_privacy_claim(Generous(query.on_token(0), query.on_token(0)))


def test_an_event_charging_less_than_the_claim_is_caught():
    @attr.s(frozen=True, slots=True)
    class Undercharged(Overclaiming):
        @property
        def event(self):
            return EpsilonDeltaEvent(0.5 * self.honest.epsilon, self.honest.delta)

    honest = mechanisms.DPArgMax(1.0, 0.1)
    check_event_covers_claim(honest)
    with pytest.raises(AssertionError, match="less than the claim .* under-count"):
        check_event_covers_claim(Undercharged(honest, honest))

    @attr.s(frozen=True, slots=True)
    class StatedElsewhere(Overclaiming):
        """Claims add/remove-one but announces the replace-one event."""

        @property
        def event(self):
            return self.actual.event

    with pytest.raises(AssertionError, match="cannot charge the event .*'replace-one'"):
        check_event_covers_claim(StatedElsewhere(mechanisms.DPArgMax(1.0, 0.1, relation=ADD_REMOVE_ONE), honest))


def test_a_threshold_claim_is_checked_and_never_charged_as_dp():
    check_event_covers_claim(mechanisms.ThresholdArgMax(3))
    lying = Overclaiming(mechanisms.ThresholdArgMax(4), mechanisms.ThresholdArgMax(2))
    with pytest.raises(AssertionError, match="below the claimed threshold 4"):
        check_privacy_claim(lying)


def test_a_vacuous_check_is_refused():
    # DPArgMax at (0.1, 1e-6) has L = 128: with six teachers it releases with probability about delta at
    # most, so its law hardly moves and passing would prove little.
    quiet = mechanisms.DPArgMax(0.1, 1e-6)
    with pytest.raises(AssertionError, match="would be vacuous"):
        check_privacy_claim(quiet)
    (report,) = check_privacy_claim(quiet, min_movement=0.0)
    assert 0.0 < report.movement < 1e-5 and report.worst_delta <= quiet.privacy_claim().delta + ROUNDING


def test_a_sampler_that_does_not_follow_its_law_is_caught():
    honest = mechanisms.ThresholdWeightedSampling(2, 1.0)

    @attr.s(frozen=True, slots=True)
    class Skewed(Overclaiming):
        def output_distribution(self, histogram, num_teachers=None):
            law = self.honest.output_distribution(histogram, num_teachers)
            probs = law.probabilities * 0.9
            return OutcomeDistribution(law.tokens, probs, 1.0 - probs.sum())

        def batch_distributions(self, batch):
            return self.honest.batch_distributions(batch)

    hist = SAMPLER_HISTOGRAMS[0]
    check_sampler_matches_law(honest, hist)
    with pytest.raises(AssertionError, match="chi-square .* do not follow the exact law"):
        check_sampler_matches_law(Skewed(honest, honest), hist)
    with pytest.raises(AssertionError, match="outcomes of probability zero: 7"):
        check_counts_match_law({0: 10, 7: 1}, {0: 1.0, None: 0.0})


def test_weighted_sampling_per_count_calibration_fails_add_remove_one():
    """Why DPWeightedSampling refuses add/remove-one: calibrated per count at (1, 0.05) (the reading where one
    count changes), the add/remove-one pairs, where n and every sampling rate c/n change too, need more than
    delta 0.05 at epsilon 1."""
    per_count_one = mechanisms.DPWeightedSampling(2.0, 0.1)  # replace-one: per-count (1, 0.05)
    assert per_count_one.per_count == (1.0, 0.05)
    assert worst_pair_delta(per_count_one, 1.0, ADD_REMOVE_ONE).delta > 0.05
    with pytest.raises(ValueError, match="relation must be 'replace-one' for DPWeightedSampling, got 'add-remove-one'"):
        mechanisms.DPWeightedSampling(1.0, 0.05, ADD_REMOVE_ONE)


def test_a_user_registered_mechanism_gets_the_contract(monkeypatch):
    """A mechanism registered with examples (here: the exponential mechanism over three tokens and the tail)
    passes the registry-wide check; the same one with half the noise but the same claim fails it."""
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))

    @attr.s(frozen=True, slots=True)
    class ExponentialVote(Mechanism):
        epsilon = attr.ib()
        relation = attr.ib(default=REPLACE_ONE)
        noise_scale = attr.ib(default=1.0)

        @property
        def event(self):
            return EpsilonDeltaEvent(self.epsilon, 0.0, self.relation)

        def output_distribution(self, histogram, num_teachers=None):
            h = mechanisms.as_histogram(histogram, num_teachers)
            scores = np.array([h.count(j) for j in range(3)] + [h.tail], dtype=float)
            weights = np.exp(self.epsilon / self.noise_scale / 2 * (scores - scores.max()))
            p = weights / weights.sum()
            return OutcomeDistribution(np.arange(3), p[:3], p[3])

    registry.register_mechanism("test-exponential-vote",
                                examples=lambda r: [ExponentialVote(1.0, r), ExponentialVote(0.3, r)])
    reports = check_registered_mechanism("test-exponential-vote", num_samples=4000, histograms=SAMPLER_HISTOGRAMS[:2])
    assert set(reports) == set(NEIGHBOURING_RELATIONS) and all(len(v) == 2 for v in reports.values())
    registry.register_mechanism("test-exponential-vote-broken",
                                examples=lambda r: [ExponentialVote(1.0, r, noise_scale=0.5)])
    with pytest.raises(AssertionError, match="tight delta"):
        check_registered_mechanism("test-exponential-vote-broken", num_samples=4000)
    registry.register_mechanism("test-no-examples")
    with pytest.raises(LookupError, match="has no examples"):
        check_registered_mechanism("test-no-examples")
