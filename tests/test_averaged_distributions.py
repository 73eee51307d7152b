"""Tang et al.'s Gaussian on averaged distributions (mechanisms/averaged_distributions.py): the rounding, the
sensitivity over every neighbouring pair of small ensembles (and reached), the Renyi divergences and the
(epsilon, delta) of the exact law, a wrong sensitivity caught, the charge of each accountant, the generation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant as NativeRdp
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.averaged_distributions import GaussianAveragedDistributions, quantise
from mechanisms.testing import SMALL_DISTRIBUTIONS, check_distribution_mechanism, distribution_pairs
from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant, RdpAccountant
from pate_accountant.accountants.event_checks import check_event
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    DiscreteGaussianSumEvent,
    zcdp_epsilon,
    zcdp_rho,
)
from pate_accountant.serialization import event_from_data, event_to_data


# -- the rounding ------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=7), min_size=1, max_size=4).filter(
    lambda rows: len({len(r) for r in rows}) == 1), st.integers(1, 5000))
def test_every_teacher_rounds_to_non_negative_units_summing_to_the_resolution(rows, q):
    units = quantise(np.array(rows), q)
    assert units.dtype == np.int64 and (units >= 0).all() and (units.sum(axis=1) == q).all()
    for row, got in zip(rows, units):  # a function of the row alone, within one unit of q p (p renormalised)
        assert np.array_equal(quantise(np.array([row]), q)[0], got)
        total = sum(row)
        if total > 0:
            assert np.all(np.abs(got - q * np.array(row) / total) < 1 + 1e-9)


def test_the_rounding_gives_units_to_the_largest_remainders_and_a_row_of_zeros_is_uniform():
    assert quantise(np.array([[0.5, 0.3, 0.2]]), 4).tolist() == [[2, 1, 1]]  # 2 + 1.2 + 0.8: remainders .2, .8
    assert quantise(np.array([[1.0, 1.0, 1.0]]), 4).tolist() == [[2, 1, 1]]  # ties to the lower index
    assert quantise(np.array([[0.0, 0.0, 0.0]]), 6).tolist() == [[2, 2, 2]]


# -- privacy ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_l2_sensitivity_holds_on_every_neighbouring_pair_and_is_reached(relation):
    """|h - h'|^2 over every neighbouring pair of ensembles of at most 3 teachers of the enumeration's
    distributions, every public support of 2 or 3 tokens: at most 2 Q^2 (replace-one) or Q^2 (add-remove-one),
    and equal to it for a teacher who moves all its mass."""
    with np.errstate(divide="ignore"):
        grid = np.log(np.asarray(SMALL_DISTRIBUTIONS, dtype=np.float64))
    for q in (1, 3, 10):
        mechanism = GaussianAveragedDistributions(1.0, 1e-6, 3, relation, resolution=q)
        worst = 0
        for top_k in (2, None):
            mechanism = mechanism.with_settings(top_k=top_k or 0)
            for public in grid:
                for first, second in distribution_pairs(3, relation):
                    h = [mechanism.counts(grid[list(e)] if e else np.zeros((0, grid.shape[1])), public)[1]
                         for e in (first, second)]
                    worst = max(worst, int(((h[0] - h[1]) ** 2).sum()))
        assert worst == mechanism.sensitivity_squared == (2 if relation == REPLACE_ONE else 1) * q * q


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_exact_law_keeps_the_renyi_divergences_and_the_step_epsilon_delta(relation):
    """check_distribution_mechanism: D_alpha <= alpha rho at orders 1.5 to 64 and the hockey-stick divergence at
    the step epsilon at most delta, over every neighbouring pair; the order-1.5 bound is more than half reached
    under replace-one (the argmax of two tokens keeps most of the vector's divergence: twice the rho would fail)
    and by more than a quarter under add-remove-one."""
    mechanism = GaussianAveragedDistributions(2.0, 1e-3, 3, relation, resolution=2)
    (report,) = check_distribution_mechanism(mechanism, num_samples=2_000)
    assert report.movement > 0.1 and report.worst_epsilon < mechanism.epsilon
    with np.errstate(divide="ignore"):
        public, one, other = np.log([0.5, 0.5]), np.log([[1.0, 0.0]]), np.log([[0.0, 1.0]])
    p = mechanism.output_distribution(one, public).probabilities
    q = mechanism.output_distribution(other if relation == REPLACE_ONE else np.zeros((0, 2)), public).probabilities
    divergence = math.log(float(np.sum(p**1.5 * q**-0.5))) / 0.5
    rho = mechanism.event.rho
    assert (0.5 if relation == REPLACE_ONE else 0.25) * 1.5 * rho < divergence <= 1.5 * rho


class _HalfSensitivity(GaussianAveragedDistributions):
    """A wrong calibration: noise for half the squared sensitivity, the event consistent with that noise."""

    @property
    def sensitivity_squared(self):
        return GaussianAveragedDistributions.sensitivity_squared.fget(self) // 2


def test_noise_for_half_the_sensitivity_is_caught_by_the_enumeration():
    mechanism = _HalfSensitivity(2.0, 1e-3, 3, REPLACE_ONE, resolution=2)
    check_event(mechanism.event)  # the event agrees with the noise: only the enumeration sees the error
    with pytest.raises(AssertionError, match=r"Renyi divergence of order"):
        check_distribution_mechanism(mechanism, num_samples=100)


def test_the_calibration_follows_the_step_and_not_the_teachers():
    for epsilon, delta in ((0.5, 1e-7), (2.0, 1e-3), (8.0, 1e-9)):
        a = GaussianAveragedDistributions(epsilon, delta, 4)
        b = GaussianAveragedDistributions(epsilon, delta, 4000)
        assert a.sigma_squared == b.sigma_squared  # the sum grows with the teachers, the noise does not
        event = a.event
        assert isinstance(event, DiscreteGaussianSumEvent) and event.rho <= zcdp_rho(epsilon, delta)
        assert event.rho == pytest.approx(zcdp_rho(epsilon, delta), rel=1e-8)
        assert zcdp_epsilon(event.rho, delta) <= epsilon
        check_event(event)
    replace = GaussianAveragedDistributions(1.0, 1e-6, 4)
    remove = GaussianAveragedDistributions(1.0, 1e-6, 4, ADD_REMOVE_ONE)
    assert replace.sigma_squared == pytest.approx(2 * remove.sigma_squared)


def test_an_event_stating_more_privacy_than_its_rho_is_refused():
    honest = GaussianAveragedDistributions(1.0, 1e-6, 4).event
    with pytest.raises(ValueError, match=r"claims more privacy than its mechanism has"):
        check_event(DiscreteGaussianSumEvent(0.5, 1e-6, REPLACE_ONE, sigma_squared=honest.sigma_squared,
                                             sensitivity_squared=honest.sensitivity_squared))
    with pytest.raises(ValueError, match=r"needs delta > 0"):
        check_event(DiscreteGaussianSumEvent(1.0, 0.0, REPLACE_ONE, sigma_squared=honest.sigma_squared,
                                             sensitivity_squared=honest.sensitivity_squared))


@pytest.mark.parametrize("relation", NEIGHBOURING_RELATIONS)
def test_the_rdp_accountant_charges_its_rho_and_the_others_its_epsilon_delta(relation):
    event = GaussianAveragedDistributions(0.5, 1e-7, 10, relation).event
    ours = RdpAccountant(neighboring_relation=relation)
    for _ in range(40):
        ours.compose(event)
    native = NativeRdp()
    native.compose(dp_event.ZCDpEvent(rho=event.rho), 40)
    assert ours.get_epsilon(1e-6) == pytest.approx(native.get_epsilon(1e-6), rel=1e-9)
    assert ours.get_epsilon(1e-6) < 40 * 0.5 / 3  # zCDP composes as the square root
    basic = BasicCompositionAccountant(neighboring_relation=relation)
    basic.compose(event, 3)
    assert basic.spent() == pytest.approx((1.5, 3e-7))
    pld = PldAccountant(neighboring_relation=relation)
    pld.compose(event)
    assert pld.get_epsilon(1e-7) == pytest.approx(0.5, rel=1e-3)


def test_the_event_goes_through_the_ledgers_serialisation():
    event = GaussianAveragedDistributions(0.7, 1e-6, 5, ADD_REMOVE_ONE).event
    assert event_from_data(event_to_data(event)) == event


@pytest.mark.parametrize("args, match", [
    ((1.0, 0.0, 4), r"^delta must be > 0"),
    ((0.0, 1e-6, 4), r"^epsilon"),
    ((1.0, 1e-6, 0), r"num_teachers"),
])
def test_bad_settings_are_refused_in_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        GaussianAveragedDistributions(*args)


def test_bad_inputs_are_refused_in_one_line():
    mechanism = GaussianAveragedDistributions(1.0, 1e-6, 2)
    with pytest.raises(ValueError, match=r"more than the configured num_teachers=2"):
        mechanism(np.zeros((3, 4)), np.zeros(4))
    with pytest.raises(ValueError, match=r"^teacher_logprobs must have shape \(m, 4\)"):
        mechanism(np.zeros((2, 3)), np.zeros(4))
    with pytest.raises(ValueError, match=r"^public_logprobs gives every token probability zero"):
        mechanism(np.zeros((2, 4)), np.full(4, -np.inf))


def test_the_support_is_the_public_top_k_and_nothing_the_public_model_rules_out():
    mechanism = GaussianAveragedDistributions(50.0, 0.1, 2, top_k=2)
    with np.errstate(divide="ignore"):
        public = np.log([0.1, 0.4, 0.0, 0.3, 0.2])
        teachers = np.log([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])  # all their mass off the support
    assert mechanism.support(public).tolist() == [1, 3]
    support, h = mechanism.counts(teachers, public)
    assert h.tolist() == [1024, 1024]  # no mass on the support: uniform
    tokens = {mechanism(teachers, public, rng=np.random.default_rng(s)).value for s in range(30)}
    assert tokens <= {1, 3}
    assert GaussianAveragedDistributions(1.0, 0.1, 2).support(public).tolist() == [0, 1, 3, 4]


def test_the_registry_builds_it_from_a_step_budget_and_the_teachers():
    built = registry.build_mechanism("gaussian-averaged-distributions", 0.3, 1e-7, ADD_REMOVE_ONE, num_teachers=16)
    assert built == GaussianAveragedDistributions(0.3, 1e-7, 16, ADD_REMOVE_ONE)
    assert "gaussian-averaged-distributions" in registry.run_mechanism_names()
    with pytest.raises(ValueError, match=r"^delta must be > 0"):
        registry.build_mechanism("gaussian-averaged-distributions", 0.3, 0.0, num_teachers=16)


# -- in the generation loop ------------------------------------------------------------------------------------
from test_generation import CHAIN, VOCAB, W, agreeing  # noqa: E402


def _flat(teacher, context):
    return np.full(len(VOCAB), 1 / len(VOCAB))


def _generator(epsilon=4.0, teachers=8, accountant=None, **options):
    from ensembles.backends import ToyBackend
    from ensembles.generation import PrivateGenerator

    mechanism = registry.build_mechanism("gaussian-averaged-distributions", epsilon, 1e-6, REPLACE_ONE,
                                         num_teachers=teachers)
    accountant = accountant or RdpAccountant(budget=(50.0, 1e-6))
    options.setdefault("public_backend", ToyBackend(_flat, VOCAB))
    return PrivateGenerator(ToyBackend(agreeing(0.99), VOCAB), mechanism, accountant, max_tokens=12, seed=0,
                            **options), accountant


def test_a_generation_charges_one_zcdp_step_per_token_and_follows_agreeing_teachers():
    generator, accountant = _generator(epsilon=8.0)
    assert generator.mechanism.top_k is None and generator.mechanism.temperature == 1.0
    result = generator.generate([f"SECRET{i} the" for i in range(8)], mechanism_rng=np.random.default_rng(5))
    assert len(result.token_ids) == 12 and all(step.outcome == "token" for step in result.steps)
    native = NativeRdp()
    native.compose(dp_event.ZCDpEvent(rho=generator.mechanism.event.rho), 12)
    assert accountant.get_epsilon(1e-6) == pytest.approx(native.get_epsilon(1e-6), rel=1e-9)
    # eight teachers agreeing at 0.99 sum to 8 Q on the chain's next word; sigma is about Q at epsilon 8
    follows = sum(CHAIN.get(a) == b for a, b in zip((W["the"], *result.token_ids), result.token_ids))
    assert follows >= 9
    assert "SECRET" not in repr(result)


def test_options_of_the_votes_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^top_p=0.9: GaussianAveragedDistributions draws from its own aggregate"):
        _generator(top_p=0.9)
    with pytest.raises(ValueError, match=r"it needs a public_backend$"):
        _generator(public_backend=None)


# -- noise that decides ----------------------------------------------------------------------------------------
def test_the_noise_release_probability_is_the_exact_law_of_its_step_at_one_unit_a_teacher():
    """n // 2 + 1 teachers on token 0, each other teacher on a token of its own: the probability that another
    token wins, as the exact law of that step gives it with Q = 1 (the same sigma in teachers)."""
    for epsilon, n, size in ((2.0, 3, 3), (1.0, 5, 4), (4.0, 4, 2)):
        mechanism = GaussianAveragedDistributions(epsilon, 1e-3, n, resolution=1)
        with np.errstate(divide="ignore"):
            teachers = np.log(np.eye(size)[[0] * (n // 2 + 1) + [1 + i % (size - 1) for i in range(n - n // 2 - 1)]])
        law = mechanism.output_distribution(teachers, np.zeros(size))
        expected = 1.0 - law.probabilities[0]
        assert mechanism.noise_release_probability(n, size) == pytest.approx(expected, rel=1e-9, abs=1e-15)
        # the resolution changes the rounding, not the signal-to-noise ratio the rule reads
        finer = GaussianAveragedDistributions(epsilon, 1e-3, n, resolution=64)
        assert finer.sigma == pytest.approx(mechanism.sigma) and \
            finer.noise_release_probability(n, size) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_generate_refuses_a_step_whose_noise_decides_the_releases():
    from pate_app.run import RunInputError, check_noise_floor

    check_noise_floor(GaussianAveragedDistributions(5.0, 1e-7, 64), 64, 49152, 50)  # sigma 1.7 teachers: quiet
    with pytest.raises(RunInputError, match=r"^the Gaussian noise \(sigma 16.2\) over the public top 50 tokens "
                                            r"decides the releases of 16 teachers: .* another token wins with "
                                            r"probability 94%"):
        check_noise_floor(GaussianAveragedDistributions(0.5, 1e-7, 16), 16, 49152, 50)


def test_a_zcdp_mechanism_under_another_accountant_gets_a_warning_naming_rdp():
    from pate_app.run import zcdp_charge_warning

    mechanism = GaussianAveragedDistributions(1.0, 1e-7, 16)
    line = zcdp_charge_warning(mechanism, "pld")
    assert line.startswith("GaussianAveragedDistributions is 0.015-zCDP a step; the pld accountant") and "--accountant rdp" in line
    assert "(epsilon 1, delta 1e-07) a step" in line
    assert zcdp_charge_warning(mechanism, "rdp") is None
    assert zcdp_charge_warning(registry.build_mechanism("clipped-logit-sampling", 0.5, 1e-7, num_teachers=4),
                               "basic").startswith("ClippedLogitSampling is 0.0312-zCDP a step; the basic accountant")
    assert zcdp_charge_warning(registry.build_mechanism("gaussian-argmax", 1.0, 1e-6), "pld") is None
