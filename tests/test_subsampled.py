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
from mechanisms.testing import check_mechanism, check_privacy_claim, check_sampler_matches_law
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
