"""Amin et al.'s public agreement by a sparse vector test (mechanisms/public_agreement.py): the transcript law of an
episode against a direct computation, AboveThreshold's epsilon over every pair of neighbouring query sequences,
the query's sensitivity, noise for half the sensitivity caught, the episode's charge, the generation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant as NativeRdp

from mechanisms import registry
from mechanisms.public_agreement import (
    Episode,
    SparseVectorPublicAgreement,
    discrete_laplace_cdf,
    transcript_law,
)
from mechanisms.testing import SMALL_DISTRIBUTIONS, check_episodic_mechanism
from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant, RdpAccountant
from pate_accountant.accountants.event_checks import check_event
from pate_accountant.events import ADD_REMOVE_ONE, NEIGHBOURING_RELATIONS, REPLACE_ONE, SparseVectorEpisodeEvent
from pate_accountant.serialization import event_from_data, event_to_data


# -- the law of an episode -------------------------------------------------------------------------------------
def test_the_discrete_laplace_cdf_is_the_sum_of_its_pmf():
    for gamma in (0.05, 0.7, 3.0):
        r = math.exp(-gamma)
        z = np.arange(-4000, 4001)
        pmf = (1 - r) / (1 + r) * r ** np.abs(z)
        for x in (-30, -1, 0, 2, 17):
            assert discrete_laplace_cdf(gamma, x) == pytest.approx(pmf[z <= x].sum(), rel=1e-12, abs=1e-300)


def test_the_transcript_law_is_the_direct_double_sum():
    """P[below^k above] = sum over the threshold noise z of P[z] prod_{t<k} P[q_t + Z < T + z] P[q_k + Z >= T + z]."""
    gt, gq, threshold, queries = 0.4, 0.2, 5, (3, 7, 5)
    law = transcript_law(queries, threshold, gt, gq)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    r = math.exp(-gt)
    direct = np.zeros(4)
    for z in range(-400, 401):
        p = (1 - r) / (1 + r) * r ** abs(z)
        still = p
        for k, q in enumerate(queries):
            below = float(discrete_laplace_cdf(gq, threshold + z - q - 1))
            direct[k] += still * (1 - below)
            still *= below
        direct[3] += still
    assert law == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
@pytest.mark.parametrize("mechanism", [
    SparseVectorPublicAgreement(2.0, 3, resolution=1),
    SparseVectorPublicAgreement(4.0, 3, temperature=0.7, top_k=1, threshold=0.3, svt_share=0.75, resolution=2),
], ids=["eps2-Q1", "eps4-Q2"])
def test_the_episode_keeps_the_tests_epsilon_over_every_neighbouring_query_sequence(mechanism, relation):
    """check_episodic_mechanism: every transcript of every pair of neighbouring query sequences of length 3 within
    log-ratio svt_epsilon (more than half reached), the query's sensitivity over every neighbouring pair of small
    ensembles (reached), the draw's bounded range, the event and the sampler."""
    import attr

    mechanism = attr.evolve(mechanism, relation=relation)
    (report,) = check_episodic_mechanism(mechanism, num_samples=2_000)
    assert report.num_sequence_pairs > 1_000
    assert 0.5 * mechanism.svt_epsilon < report.worst_epsilon <= mechanism.svt_epsilon
    assert report.worst_query_change == mechanism.sensitivity  # a teacher that moves all its mass


class _HalfNoise(SparseVectorPublicAgreement):
    """A wrong calibration: the noise of a test for half the sensitivity."""

    @property
    def gammas(self):
        gt, gq = SparseVectorPublicAgreement.gammas.fget(self)
        return 2 * gt, 2 * gq


def test_noise_for_half_the_sensitivity_is_caught_by_the_enumeration():
    with pytest.raises(AssertionError, match=r"a transcript's log-ratio is .* above the test's epsilon"):
        check_episodic_mechanism(_HalfNoise(2.0, 3, resolution=1), num_samples=100)


def test_the_query_is_the_rounded_l1_distance_of_the_teachers_from_the_public_model():
    mechanism = SparseVectorPublicAgreement(1.0, 4, resolution=10)
    with np.errstate(divide="ignore"):
        public = np.log([0.5, 0.5, 0.0])
        teachers = np.log([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.5, 0.0]])
    # units: public (5, 5, 0); teachers (10, 0, 0), (0, 0, 10), (5, 5, 0): the sum of differences (0, -10, 10)
    assert mechanism.query(teachers, public) == 20
    assert mechanism.query(np.zeros((0, 3)), public) == 0  # absent teachers agree with the public model
    assert mechanism.threshold_units == math.ceil(0.7 * 4 * 10) and mechanism.sensitivity == 20


# -- the mechanism ---------------------------------------------------------------------------------------------
def test_an_episode_is_charged_when_it_opens_and_ends_with_its_above():
    mechanism = SparseVectorPublicAgreement(2.0, 3, threshold=0.0, resolution=4)
    with np.errstate(divide="ignore"):
        public = np.log([1.0, 0.0, 0.0])
        far = np.log([[0.0, 1.0, 0.0]] * 3)  # q = 2 * 3 * 4 = 24, far above a threshold of 0
    episode = Episode()
    release = mechanism(far, public, rng=np.random.default_rng(0), episode=episode)
    assert release.outcome == "token" and release.event == mechanism.event and episode.level is None
    agree = mechanism(np.repeat(public[None, :], 3, axis=0), public, rng=np.random.default_rng(1), episode=episode)
    # q = 0 against a threshold of 0 plus noise: below or above; either way the call opened an episode
    assert agree.event == mechanism.event
    if agree.outcome == "below":
        assert episode.level is not None
        again = mechanism(np.repeat(public[None, :], 3, axis=0), public, rng=np.random.default_rng(2), episode=episode)
        assert again.event == dp_event.NoOpDpEvent()  # an open episode charges nothing more


def test_the_private_draw_is_the_clipped_logit_mechanism_at_the_rest_of_epsilon():
    mechanism = SparseVectorPublicAgreement(3.0, 5, ADD_REMOVE_ONE, temperature=0.8, top_k=2, svt_share=0.25)
    draw = mechanism.draw
    assert (draw.epsilon, draw.num_teachers, draw.relation, draw.temperature, draw.top_k) == (
        pytest.approx(2.25), 5, ADD_REMOVE_ONE, 0.8, 2)
    event = mechanism.event
    assert isinstance(event, SparseVectorEpisodeEvent) and event.epsilon == pytest.approx(3.0)
    assert event.rho == pytest.approx(0.75**2 / 2 + 2.25**2 / 8)


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_rdp_accountant_charges_an_episode_as_zcdp_and_the_others_as_pure(relation):
    event = SparseVectorPublicAgreement(1.0, 8, relation).event
    ours = RdpAccountant(neighboring_relation=relation)
    for _ in range(20):
        ours.compose(event)
    native = NativeRdp()
    native.compose(dp_event.ZCDpEvent(rho=0.5**2 / 2 + 0.5**2 / 8), 20)
    assert ours.get_epsilon(1e-6) == pytest.approx(native.get_epsilon(1e-6), rel=1e-9)
    basic = BasicCompositionAccountant(neighboring_relation=relation)
    basic.compose(event, 3)
    assert basic.spent() == pytest.approx((3.0, 0.0))
    pld = PldAccountant(neighboring_relation=relation)
    pld.compose(event)
    assert pld.get_epsilon(0.0) == pytest.approx(1.0, rel=1e-3)
    assert event_from_data(event_to_data(event)) == event


def test_an_episode_event_stating_other_than_its_parts_is_refused():
    with pytest.raises(ValueError, match=r"its epsilon must be their sum"):
        check_event(SparseVectorEpisodeEvent(1.0, 0.0, REPLACE_ONE, svt_epsilon=0.0, draw_epsilon=0.0))
    with pytest.raises(ValueError, match=r"its epsilon must be their sum"):
        check_event(SparseVectorEpisodeEvent(0.5, 0.0, REPLACE_ONE, svt_epsilon=0.5, draw_epsilon=0.5))
    check_event(SparseVectorEpisodeEvent(1.0, 0.0, REPLACE_ONE, svt_epsilon=0.5, draw_epsilon=0.5))


@pytest.mark.parametrize("args, kwargs, match", [
    ((1.0, 4), {"threshold": 2.5}, r"threshold"),
    ((1.0, 4), {"svt_share": 1.0}, r"^svt_share"),
    ((1e-6, 4), {}, r"leaves the draw"),
    ((1.0, 0), {}, r"num_teachers"),
])
def test_bad_settings_are_refused_in_one_line(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparseVectorPublicAgreement(*args, **kwargs)


def test_the_registry_builds_it_from_a_step_budget_and_the_teachers():
    built = registry.build_mechanism("svt-public-agreement", 0.3, 1e-7, ADD_REMOVE_ONE, num_teachers=16)
    assert built == SparseVectorPublicAgreement(0.3, 16, ADD_REMOVE_ONE)
    assert "svt-public-agreement" in registry.run_mechanism_names()


# -- in the generation loop ------------------------------------------------------------------------------------
from test_generation import CHAIN, VOCAB, W, agreeing  # noqa: E402


def _public_chain(teacher, context):
    """A public model that knows the chain as well as the teachers do."""
    return agreeing(0.99)(teacher, context)


def _flat(teacher, context):
    return np.full(len(VOCAB), 1 / len(VOCAB))


def _generator(public, epsilon=8.0, teachers=8, accountant=None, **options):
    from ensembles.backends import ToyBackend
    from ensembles.generation import PrivateGenerator

    mechanism = registry.build_mechanism("svt-public-agreement", epsilon, 1e-6, REPLACE_ONE, num_teachers=teachers)
    accountant = accountant or RdpAccountant(budget=(1000.0, 1e-6))  # an episode of epsilon 8 is rho 10
    options.setdefault("fallback", "public")
    return PrivateGenerator(ToyBackend(agreeing(0.99), VOCAB), mechanism, accountant, max_tokens=12, seed=0,
                            public_backend=ToyBackend(public, VOCAB), **options), accountant


def test_where_the_public_model_agrees_the_tokens_are_public_and_free():
    """Teachers and public model on the same chain: the test answers below (distance 0 against a threshold of
    0.7 B Q), every token is the public model's, and one episode is charged for the record."""
    generator, accountant = _generator(_public_chain)
    result = generator.generate([f"SECRET{i} the" for i in range(8)], mechanism_rng=np.random.default_rng(3))
    outcomes = [step.outcome for step in result.steps]
    assert len(result.token_ids) == 12 and outcomes.count("fallback") >= 11
    charged = NativeRdp()
    charged.compose(dp_event.ZCDpEvent(rho=generator.mechanism.event.rho), outcomes.count("token") + 1)
    assert accountant.get_epsilon(1e-6) <= charged.get_epsilon(1e-6) * (1 + 1e-9)
    assert "SECRET" not in repr(result)


def test_where_the_public_model_knows_nothing_the_teachers_words_are_drawn_privately():
    generator, accountant = _generator(_flat)
    result = generator.generate(["x the"] * 8, mechanism_rng=np.random.default_rng(4))
    outcomes = [step.outcome for step in result.steps]
    assert outcomes.count("token") >= 10  # the flat public model is far from the chain: above at most steps
    follows = sum(CHAIN.get(a) == b for a, b in zip((W["the"], *result.token_ids), result.token_ids))
    assert follows >= 8
    native = NativeRdp()
    native.compose(dp_event.ZCDpEvent(rho=generator.mechanism.event.rho), outcomes.count("token") + 1)
    assert accountant.get_epsilon(1e-6) <= native.get_epsilon(1e-6) * (1 + 1e-9)


def test_a_generator_without_the_public_fallback_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^fallback='retry': SparseVectorPublicAgreement answers 'below'"):
        _generator(_flat, fallback="retry")
