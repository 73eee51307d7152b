"""Poisson-subsampled teachers (issue 34, lever 5): ``mechanisms.subsampled``.

The contract suite (tests/test_mechanism_contract.py) proves the registered examples' claims by exact enumeration
under both relations; here: the amplified terms, what the enumeration catches, the refusals and the accountants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms import DPArgMax, GaussianNoisyArgMax
from mechanisms.base import OutcomeDistribution
from mechanisms.histogram import CountHistogram
from mechanisms.subsampled import SubsampledTeachers, subsampled_terms
from mechanisms.audit import law_epsilon
from mechanisms.gaussian import truncation_bound
from mechanisms.testing import (
    ROUNDING,
    check_mechanism,
    check_privacy_claim,
    check_sampler_matches_law,
    worst_pair_delta,
)
from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant
from pate_accountant.events import ADD_REMOVE_ONE, REPLACE_ONE, EpsilonDeltaEvent, SubsampledTeachersEvent

AR = ADD_REMOVE_ONE


def test_the_amplified_terms():
    """add-remove-one: (log(1 + q (e^eps - 1)), q delta); replace-one: the group bound (2 eps, (1 + e^eps) delta)
    amplified the same way; rate 1 is no amplification."""
    assert subsampled_terms(2.0, 0.2, 0.5, AR) == pytest.approx((math.log(1 + 0.5 * math.expm1(2.0)), 0.1))
    assert subsampled_terms(2.0, 0.2, 0.5, REPLACE_ONE) == pytest.approx(
        (math.log(1 + 0.5 * math.expm1(4.0)), 0.5 * (1 + math.e ** 2) * 0.2))
    assert subsampled_terms(1.0, 0.0, 1.0, AR) == pytest.approx((1.0, 0.0))
    small = subsampled_terms(0.1, 0.0, 0.1, REPLACE_ONE)[0]
    assert small < 0.025  # about q times the replace-one charge of 2 eps


@pytest.mark.parametrize("relation", [REPLACE_ONE, AR])
def test_subsampled_teachers_pass_the_contract(relation):
    """Exact enumeration over every neighbouring pair of small histograms (the laws are the exact binomial mixtures),
    the event against the claim, and the sampler (one coin per teacher) against the exact law."""
    for inner, rate in ((DPArgMax(1.0, 0.1, relation=AR), 0.6), (GaussianNoisyArgMax(1.5, vocab_size=3, relation=AR), 0.4)):
        report = check_mechanism(SubsampledTeachers(inner, rate, relation), relations=(relation,), num_samples=6000)
        assert report is not None


class _KeepsEveryone(SubsampledTeachers):
    """Claims the subsampled bound but runs the inner mechanism on every vote: an under-count."""

    def output_distribution(self, histogram, num_teachers=None) -> OutcomeDistribution:
        return self.inner.output_distribution(histogram, num_teachers)


@pytest.mark.parametrize("relation", [REPLACE_ONE, AR])
def test_the_enumeration_catches_a_rate_that_is_not_applied(relation):
    mechanism = _KeepsEveryone(DPArgMax(2.0, 0.2, relation=AR), 0.05, relation)
    with pytest.raises(AssertionError):
        check_privacy_claim(mechanism, relations=(relation,))


def test_a_run_keeps_each_vote_with_the_rate():
    """One coin per teacher: on a histogram of one voted token and tail votes, the inner mechanism (certain to
    release a majority token) sees the kept votes; the sampler matches the exact mixture."""
    mechanism = SubsampledTeachers(DPArgMax(4.0, 0.05, relation=AR), 0.5, REPLACE_ONE)
    hist = CountHistogram([0, 1], [5, 1], num_teachers=7)
    law = mechanism.output_distribution(hist)
    assert 0 < law.fail < 1 and law.probability(0) > law.probability(1)
    check_sampler_matches_law(mechanism, hist, 6000)
    assert mechanism(hist, rng=np.random.default_rng(1)).event == mechanism.event


def test_refusals():
    with pytest.raises(ValueError, match="add-remove-one"):
        SubsampledTeachers(DPArgMax(2.0, 0.2, relation=REPLACE_ONE), 0.5)
    with pytest.raises(ValueError, match="rate"):
        SubsampledTeachers(DPArgMax(2.0, 0.2, relation=AR), 0.0)
    with pytest.raises(ValueError, match="rate"):
        SubsampledTeachers(DPArgMax(2.0, 0.2, relation=AR), 1.5)
    with pytest.raises(ValueError, match="relation"):
        SubsampledTeachers(DPArgMax(2.0, 0.2, relation=AR), 0.5, "swap-two")


def test_every_accountant_charges_the_amplified_terms():
    mechanism = SubsampledTeachers(DPArgMax(2.0, 0.2, relation=AR), 0.25, REPLACE_ONE)
    event = mechanism.event
    assert isinstance(event, SubsampledTeachersEvent) and event.rate == 0.25 and event.inner_epsilon == 2.0
    basic = BasicCompositionAccountant()
    basic.compose(event, 3)
    assert basic.spent() == pytest.approx((3 * event.epsilon, 3 * event.delta))
    pld = PldAccountant()
    pld.compose(event, 3)
    assert pld.get_epsilon(3 * event.delta) <= 3 * event.epsilon + 1e-6  # the composed PLD never above basic


def test_the_rdp_accountant_takes_a_pure_subsampled_step_and_refuses_an_approximate_one():
    from pate_accountant.accountants import RdpAccountant
    from pate_accountant.errors import UnsupportedEventError

    pure = SubsampledTeachersEvent(epsilon=subsampled_terms(1.0, 0.0, 0.2, AR)[0], delta=0.0, relation=AR, rate=0.2,
                                   inner_epsilon=1.0, inner_delta=0.0)
    rdp = RdpAccountant()
    rdp.compose(pure, 10)
    plain = RdpAccountant()
    plain.compose(EpsilonDeltaEvent(pure.epsilon, 0.0, AR), 10)
    assert rdp.get_epsilon(1e-6) == pytest.approx(plain.get_epsilon(1e-6))  # the pure step it is, as zCDP
    approximate = SubsampledTeachers(DPArgMax(2.0, 0.2, relation=AR), 0.25, REPLACE_ONE).event
    with pytest.raises(UnsupportedEventError):
        RdpAccountant().compose(approximate)


# --- the exact PLD of GNMax on subsampled teachers -------------------------------------------------------------
def _noisy_pair(sigma: float, rate: float, relation: str) -> tuple[dict, dict]:
    """The noisy counts one teacher's vote moves, written from the definitions: each count with the truncated
    discrete Gaussian noise on -T..T (enumerated), the vote kept with probability ``rate``.  add-remove-one: one
    count, with the vote or without it; replace-one: two counts, the vote kept on the first or on the second."""
    bound = truncation_bound(sigma)
    x = np.arange(-bound, bound + 1)
    g = np.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    alone = np.concatenate([g, [0.0]])  # the count on -T..T+1 without the vote
    kept = (1 - rate) * alone + rate * np.concatenate([[0.0], g])  # with the vote, kept with probability rate
    if relation == AR:
        return dict(enumerate(kept)), dict(enumerate(alone))
    return dict(enumerate(np.outer(kept, alone).ravel())), dict(enumerate(np.outer(alone, kept).ravel()))


def _charged_epsilon(event, relation: str, delta: float) -> float:
    pld = PldAccountant(neighboring_relation=relation)
    pld.compose(event)
    return pld.get_epsilon(delta)


def _gnmax_event(sigma: float, rate: float, relation: str) -> SubsampledTeachersEvent:
    return SubsampledTeachers(GaussianNoisyArgMax(sigma, vocab_size=3, relation=AR), rate, relation).event


@pytest.mark.parametrize("relation", [REPLACE_ONE, AR])
@pytest.mark.parametrize("sigma, rate", [(1.0, 0.5), (2.0, 0.3), (0.8, 0.8)])
@pytest.mark.parametrize("delta", [1e-2, 1e-4])
def test_the_pld_charge_bounds_the_subsampled_noisy_histogram_tightly(relation, sigma, rate, delta):
    """The PLD accountant charges GNMax on subsampled teachers by the exact PLD of the noisy counts a vote moves
    (docs/mechanisms/subsampled.md): never below the exact epsilon of that pair, and close to it."""
    exact = law_epsilon(*_noisy_pair(sigma, rate, relation), delta)
    charged = _charged_epsilon(_gnmax_event(sigma, rate, relation), relation, delta)
    assert exact <= charged + 1e-9
    assert charged <= exact + 0.01 + 0.01 * exact
    stated = _gnmax_event(sigma, rate, relation)  # the amplified (epsilon, delta) every other accountant charges
    assert _charged_epsilon(stated, relation, stated.delta) <= stated.epsilon + 1e-3  # up to the discretisation


@pytest.mark.parametrize("relation", [REPLACE_ONE, AR])
def test_the_pld_charge_bounds_the_real_mechanism_on_every_neighbouring_pair(relation):
    """The real mechanism's exact law (the binomial mixture over the kept votes of GNMax's law) on every
    neighbouring pair of small histograms stays within the charged epsilon at several deltas."""
    for sigma, rate in ((0.9, 0.6), (1.5, 0.4)):
        mechanism = SubsampledTeachers(GaussianNoisyArgMax(sigma, vocab_size=3, relation=AR), rate, relation)
        for delta in (1e-2, 1e-3):
            charged = _charged_epsilon(mechanism.event, relation, delta)
            worst = worst_pair_delta(mechanism, charged, relation, max_teachers=3)
            assert worst.delta <= delta + ROUNDING, (sigma, rate, delta, worst)


def test_a_charge_without_the_second_direction_or_at_a_lower_rate_is_caught():
    """The teeth of the two tests above: charging replace-one as one vote leaving (the add-remove PLD), or at half the
    rate, falls below the exact epsilon of the pair."""
    sigma, rate, delta = 1.0, 0.5, 1e-3
    exact = law_epsilon(*_noisy_pair(sigma, rate, REPLACE_ONE), delta)
    one_way = _charged_epsilon(_gnmax_event(sigma, rate, AR), AR, delta)
    assert one_way < exact - 0.05
    half = _charged_epsilon(_gnmax_event(sigma, rate / 2, REPLACE_ONE), REPLACE_ONE, delta)
    assert half < exact - 0.05


def test_the_event_keeps_its_inner_event_through_the_ledger_codec():
    from pate_accountant.serialization import event_from_data, event_to_data

    event = _gnmax_event(1.0, 0.5, REPLACE_ONE)
    assert event.inner == GaussianNoisyArgMax(1.0, vocab_size=3, relation=AR).event
    assert event_from_data(event_to_data(event)) == event
    with pytest.raises(ValueError, match="add-remove-one"):
        SubsampledTeachersEvent(epsilon=1.0, delta=0.0, rate=0.5, inner=GaussianNoisyArgMax(1.0, vocab_size=3).event)
