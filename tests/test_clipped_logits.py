"""InvisibleInk's clipped-logit sampling (mechanisms/clipped_logits.py): the bounded range proven by exact
enumeration and reached, a wrong clip caught by the same check, the support, the charge of each accountant."""

from __future__ import annotations

import itertools
from collections import Counter

import attr
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant as NativeRdp

from mechanisms import registry
from mechanisms.clipped_logits import CLIP_MARGIN, ClippedLogitSampling, clip_for
from mechanisms.testing import SMALL_DISTRIBUTIONS, check_distribution_mechanism, distribution_pairs
from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant, RdpAccountant
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    BoundedRangeEvent,
    EpsilonDeltaEvent,
)
from pate_accountant.serialization import event_from_data, event_to_data


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_bounded_range_is_reached_on_the_enumerated_pairs(relation):
    """The clip is not looser than it must be: some neighbouring pair spans the whole charged range (to the
    calibration margin), and none spans more (check_distribution_mechanism raises)."""
    for mechanism in (ClippedLogitSampling(0.5, 3, relation), ClippedLogitSampling(1.0, 2, relation, 0.8, 1)):
        (report,) = check_distribution_mechanism(mechanism, num_samples=2_000)
        assert mechanism.epsilon * (1 - 1e-6) <= report.worst_range <= mechanism.epsilon
        assert report.worst_epsilon <= mechanism.epsilon and report.movement > 0.05


class _WideClip(ClippedLogitSampling):
    """A wrong calibration: the replace-one clip used under add-remove-one would be right; twice it is not."""

    @property
    def clip(self):
        return 2.0 * clip_for(self.epsilon, self.num_teachers, self.temperature, self.relation)


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_a_clip_twice_too_wide_is_caught_by_the_enumeration(relation):
    with pytest.raises(AssertionError, match=r"(exceeds the claimed epsilon|span)"):
        check_distribution_mechanism(_WideClip(0.5, 3, relation), num_samples=100)


def test_the_enumeration_holds_every_neighbour():
    k = len(SMALL_DISTRIBUTIONS)
    replace = list(distribution_pairs(2, REPLACE_ONE))
    # each unordered pair of equal-size multisets (1 or 2 teachers) that differ in one member, exactly once
    expected = set()
    for size in (1, 2):
        sets = list(itertools.combinations_with_replacement(range(k), size))
        for a, b in itertools.combinations(sets, 2):
            if sum((Counter(a) - Counter(b)).values()) == 1:
                expected.add((a, b))
    assert len(replace) == len(set(replace)) and {tuple(sorted(p)) for p in replace} == expected
    add = list(distribution_pairs(2, ADD_REMOVE_ONE))
    assert all(len(b) == len(a) + 1 for a, b in add) and ((), (0,)) in add
    assert len(add) == k + k * k  # the empty ensemble and each single teacher, each joined by any teacher


def test_an_absent_teacher_counts_as_agreeing_with_the_public_model():
    """The normaliser is the configured number of teachers: a missing teacher adds nothing, exactly as a teacher
    whose distribution is the public one."""
    rng = np.random.default_rng(1)
    public = np.log(rng.dirichlet(np.ones(6)))
    teachers = np.log(rng.dirichlet(np.ones(6), size=2))
    mechanism = ClippedLogitSampling(1.0, 4, REPLACE_ONE)
    fewer = mechanism.output_distribution(teachers, public)
    padded = mechanism.output_distribution(np.vstack([teachers, public, public]), public)
    np.testing.assert_allclose(fewer.probabilities, padded.probabilities, rtol=1e-12)


def test_the_support_holds_the_aggregates_top_k():
    rng = np.random.default_rng(2)
    for trial in range(50):
        public = np.log(rng.dirichlet(np.full(40, 0.3)))
        teachers = np.log(rng.dirichlet(np.full(40, 0.3), size=5))
        mechanism = ClippedLogitSampling(float(rng.uniform(0.5, 20)), 5, REPLACE_ONE, top_k=3)
        support = mechanism.support(public)
        whole = attr.evolve(mechanism, top_k=None)
        tokens, scores = whole.scores(teachers, public)
        top = tokens[np.argsort(scores)[-3:]]
        assert set(top.tolist()) <= set(support.tolist()), trial
        # and the support is a function of the public log-probabilities alone
        assert np.array_equal(support, mechanism.support(public.copy()))


def test_a_token_the_public_model_rules_out_is_never_released():
    with np.errstate(divide="ignore"):
        public = np.log(np.array([0.5, 0.5, 0.0]))
        teachers = np.log(np.array([[0.0, 0.0, 1.0]] * 3))
    law = ClippedLogitSampling(10.0, 3, REPLACE_ONE).output_distribution(teachers, public)
    assert set(law.tokens.tolist()) == {0, 1}


def test_the_clip_follows_the_temperature_and_the_relation():
    base = ClippedLogitSampling(2.0, 8, REPLACE_ONE)
    assert base.clip == pytest.approx(2.0 * 8 / 4 * (1 - CLIP_MARGIN))
    assert base.with_settings(temperature=0.5).clip == pytest.approx(base.clip / 2)
    assert ClippedLogitSampling(2.0, 8, ADD_REMOVE_ONE).clip == pytest.approx(2 * base.clip)
    assert base.with_settings(top_k=5).top_k == 5 and base.with_settings(top_k=5).with_settings(top_k=0).top_k is None
    assert base.with_settings(temperature=0.5).event == base.event  # the privacy does not move


@pytest.mark.parametrize("bad, match", [
    (dict(teachers=np.zeros((5, 4))), r"^teacher_logprobs holds 5 teachers, more than the configured num_teachers=4$"),
    (dict(teachers=np.zeros((2, 3))), r"^teacher_logprobs must have shape \(m, 4\), got \(2, 3\)$"),
    (dict(public=np.full(4, -np.inf)), r"^public_logprobs gives every token probability zero$"),
    (dict(public=np.array([0.0, np.nan, 0.0, 0.0])), r"^public_logprobs must hold log-probabilities"),
    (dict(teachers=np.full((1, 4), np.inf)), r"^teacher_logprobs must hold log-probabilities"),
])
def test_bad_inputs_are_refused_in_one_line(bad, match):
    mechanism = ClippedLogitSampling(1.0, 4, REPLACE_ONE)
    teachers = bad.get("teachers", np.log(np.full((2, 4), 0.25)))
    public = bad.get("public", np.log(np.full(4, 0.25)))
    with pytest.raises(ValueError, match=match):
        mechanism(teachers, public, rng=np.random.default_rng(0))


def test_the_registry_builds_it_from_a_step_budget_and_the_teachers():
    built = registry.build_mechanism("clipped-logit-sampling", 0.3, 1e-7, ADD_REMOVE_ONE, num_teachers=16)
    assert built == ClippedLogitSampling(0.3, 16, ADD_REMOVE_ONE)
    assert "clipped-logit-sampling" in registry.run_mechanism_names()
    with pytest.raises(ValueError, match=r"^delta must"):
        registry.build_mechanism("clipped-logit-sampling", 0.3, 0.0, num_teachers=16)


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_rdp_accountant_charges_the_bounded_range_as_zcdp_and_the_others_as_pure(relation):
    """RDP: ``epsilon**2 / 8``-zCDP per step (exactly what dp-accounting gives that zCDP composition); the basic
    accountant: ``epsilon`` per step; PLD: at least what the RDP bound gives at small step counts."""
    event = ClippedLogitSampling(0.4, 10, relation).event
    assert isinstance(event, BoundedRangeEvent) and event.rho == pytest.approx(0.02)
    ours = RdpAccountant(neighboring_relation=relation)
    native = NativeRdp()  # zCDP reads the same under either relation
    for _ in range(30):
        ours.compose(event)
    native.compose(dp_event.ZCDpEvent(rho=0.02), 30)
    assert ours.get_epsilon(1e-6) == pytest.approx(native.get_epsilon(1e-6), rel=1e-9)
    basic = BasicCompositionAccountant(neighboring_relation=relation)
    for _ in range(30):
        basic.compose(event)
    assert basic.spent()[0] == pytest.approx(12.0)
    # zCDP is four times cheaper than the pure translation RDP would make of an epsilon-DP step
    pure = RdpAccountant(neighboring_relation=relation)
    for _ in range(30):
        pure.compose(EpsilonDeltaEvent(0.4, 0.0, relation))
    assert ours.get_epsilon(1e-6) < pure.get_epsilon(1e-6)
    pld = PldAccountant(neighboring_relation=relation)
    pld.compose(event)
    assert pld.get_epsilon(0.0) == pytest.approx(0.4, rel=1e-3)


def test_the_event_goes_through_the_ledgers_serialisation():
    event = BoundedRangeEvent(0.7, 0.0, ADD_REMOVE_ONE)
    assert event_from_data(event_to_data(event)) == event


# -- in the generation loop ------------------------------------------------------------------------------------
# the word-chain teachers of the generation tests: the -> cat -> sat -> on -> the ...
from test_generation import CHAIN, VOCAB, W, agreeing  # noqa: E402


def _flat(teacher, context):
    return np.full(len(VOCAB), 1 / len(VOCAB))


def _generator(epsilon=4.0, teachers=8, accountant=None, **options):
    from ensembles.backends import ToyBackend
    from ensembles.generation import PrivateGenerator

    mechanism = registry.build_mechanism("clipped-logit-sampling", epsilon, 1e-6, REPLACE_ONE, num_teachers=teachers)
    accountant = accountant or RdpAccountant(budget=(50.0, 1e-6))
    options.setdefault("public_backend", ToyBackend(_flat, VOCAB))
    return PrivateGenerator(ToyBackend(agreeing(0.99), VOCAB), mechanism, accountant, max_tokens=12, seed=0,
                            **options), accountant


def test_a_generation_charges_one_bounded_range_step_per_token_and_follows_agreeing_teachers():
    generator, accountant = _generator(epsilon=3.0, public_support=3)
    assert generator.mechanism.top_k == 3 and generator.mechanism.temperature == 1.0
    result = generator.generate([f"SECRET{i} the" for i in range(8)], mechanism_rng=np.random.default_rng(5))
    assert len(result.token_ids) == 12 and all(step.outcome == "token" for step in result.steps)
    native = NativeRdp()
    native.compose(dp_event.ZCDpEvent(rho=3.0 ** 2 / 8), 12)
    assert accountant.get_epsilon(1e-6) == pytest.approx(native.get_epsilon(1e-6), rel=1e-9)
    # teachers who agree at 0.99 against a flat public model move the law: most tokens follow the chain
    follows = sum(CHAIN.get(a) == b for a, b in zip((W["the"], *result.token_ids), result.token_ids))
    assert follows >= 9
    assert "SECRET" not in repr(result)


def test_at_a_tiny_epsilon_the_tokens_are_the_public_models():
    """At epsilon 1e-3 the clip is about 2e-3 nats: the law is the public one to within 0.1 % (a flat public model
    over 10 words: the chain's words are no more frequent than the others)."""
    generator, _ = _generator(epsilon=1e-3)
    tokens = []
    for seed in range(10):
        tokens += generator.generate(["x the"] * 8, mechanism_rng=np.random.default_rng(seed)).token_ids
    share = sum(CHAIN.get(a) == b for a, b in zip(tokens, tokens[1:])) / (len(tokens) - 1)
    assert share < 0.3  # 0.1 expected; the chain would give about 1


def test_the_budget_ends_the_generation_between_steps():
    generator, accountant = _generator(accountant=BasicCompositionAccountant(budget=(10.0, 0.0)))
    result = generator.generate(["x the"] * 8, mechanism_rng=np.random.default_rng(0))
    assert len(result.token_ids) == 2 and result.stop_reason == "budget"  # 4 + 4 of 10: a third step would exceed it
    assert accountant.spent()[0] == pytest.approx(8.0)


@pytest.mark.parametrize("options, match", [
    (dict(public_backend=None), r"reads the public model's distribution: it needs a public_backend$"),
    (dict(top_p=0.9), r"^top_p=0.9: ClippedLogitSampling draws from its own aggregate"),
    (dict(public_mix=0.2), r"^public_mix=0.2: ClippedLogitSampling reads the public model's distribution itself$"),
])
def test_options_of_the_votes_are_refused_in_one_line(options, match):
    with pytest.raises(ValueError, match=match):
        _generator(**options)


def test_more_prompts_than_calibrated_teachers_are_refused_before_anything_is_charged():
    generator, accountant = _generator(teachers=4)
    with pytest.raises(ValueError, match=r"^6 teacher prompts, more than the 4 teachers"):
        generator.generate(["x the"] * 6)
    assert accountant.spent()[0] == 0.0
