"""Known values for the composition accountants (docs/accountants.md) and their bridges to dp-accounting.

* ``AdvancedCompositionAccountant``: DRV, KOV and exact optimal composition against the reference table and
  ``dp_accounting.pld.accountant.advanced_composition``; the smallest bound is reported, with its name.
* ``RdpAccountant`` / ``PldAccountant``: equal to dp-accounting's own accountants on native events, pure
  steps as zCDP (RDP) and as ``from_privacy_parameters`` (PLD), BetweenThresholds as discrete Laplace.
* Never under-counting: every accountant is at least the exact optimal composition where it is known.
* Rejections name the event.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import accountant as pld_accountant
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.common import DifferentialPrivacyParameters
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from pate_accountant import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    ThresholdPrivacyEvent,
    UnsupportedEventError,
    WeightedSamplingEvent,
)
from pate_accountant.accountants.advanced import AdvancedCompositionAccountant
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.pld import PldAccountant, compose_groups
from pate_accountant.accountants.rdp import RdpAccountant, rdp_translation
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.composition import optimal_epsilon, pure_optimal_epsilon, pure_part_delta

#: dp-accounting calibrates Laplace and (its RDP) Gaussian noise to add/remove-one: the accountants that
#: compare with it on those events are built under that relation, and our events are stated under it too.
AR = "add-remove-one"

# -- Advanced composition: reference table -----------------------------------------------------------------------
#: (k, eps0, delta, basic, DRV, KOV 3.3, exact optimal): the known values of docs/accountants.md.
TABLE = [
    (100, 0.1, 1e-6, 10.0, 6.308231, 4.8, 4.774568),
    (100, 0.1, 1e-5, 10.0, 5.850235, 4.4, 4.306791),
    (1000, 0.01, 1e-6, 10.0, 1.762760, 1.38, 1.365447),
    (10000, 0.01, 1e-6, 100.0, 6.261538, None, 4.885516),
    (50, 0.5, 1e-6, 25.0, 34.802643, 21.0, 20.301001),
]


@pytest.mark.parametrize("k, eps0, delta, basic, drv, kov, optimal", TABLE)
def test_advanced_bounds_match_the_reference_table(k, eps0, delta, basic, drv, kov, optimal):
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(eps0), count=k)
    bounds = acc.bounds(delta)
    assert bounds["basic"] == pytest.approx(basic, rel=1e-12)
    assert bounds["drv"] == pytest.approx(drv, abs=1e-6)
    if kov is None:
        assert "kov" not in bounds  # dp-accounting's loop would overflow at k = 10^4
    else:
        assert bounds["kov"] == pytest.approx(kov, rel=1e-9)
    assert bounds["optimal-pure"] == pytest.approx(optimal, abs=1e-6)
    # The smallest valid bound is reported, with its name: the exact optimal one for identical pure steps.
    assert acc.get_epsilon(delta) == min(bounds.values()) == bounds["optimal-pure"]
    assert acc.bound_name(delta) == acc.last_bound == "optimal-pure"


def test_advanced_k50_basic_beats_drv():
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(0.5), count=50)
    bounds = acc.bounds(1e-6)
    assert bounds["basic"] < bounds["drv"]  # 25 < 34.80: DRV is worse than basic here
    # Break the identical-steps structure: now basic is the best bound left.
    acc.compose(EpsilonDeltaEvent(0.4))
    bounds = acc.bounds(1e-6)
    assert set(bounds) == {"basic", "drv"}
    assert acc.get_epsilon(1e-6) == pytest.approx(25.4)
    assert acc.last_bound == "basic"


def test_advanced_heterogeneous_reports_drv():
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(0.1), count=100)
    acc.compose(EpsilonDeltaEvent(0.05, 1e-8), count=10)
    eps = [0.1] * 100 + [0.05] * 10
    slack = 1e-5 - 10 * 1e-8
    expected = math.sqrt(2 * math.log(1 / slack) * sum(e * e for e in eps)) + sum(e * math.expm1(e) for e in eps)
    assert acc.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-12)
    assert acc.bound_name(1e-5) == "drv"
    assert set(acc.bounds(1e-5)) == {"basic", "drv"}
    # At a total delta below the steps' deltas nothing applies.
    assert acc.get_epsilon(5e-8) == math.inf and acc.bound_name(5e-8) is None
    # At exactly the steps' deltas only basic composition applies.
    assert acc.bounds(1e-7) == {"basic": pytest.approx(10.5)}


@pytest.mark.parametrize("eps0, delta0, k, delta", [(0.1, 1e-8, 100, 1e-5), (0.3, 0.0, 40, 1e-6), (0.05, 1e-9, 300, 1e-6)])
def test_advanced_kov_equals_dp_accounting(eps0, delta0, k, delta):
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(eps0, delta0), count=k)
    expected = pld_accountant.advanced_composition(DifferentialPrivacyParameters(eps0, delta0), k, delta)
    bounds = acc.bounds(delta)
    assert bounds["kov"] == pytest.approx(expected, rel=1e-12)
    optimal = bounds["optimal" if delta0 > 0 else "optimal-pure"]
    # The continuous optimum is at most KOV's grid value, and above the grid point below it.
    assert expected - 2 * eps0 < optimal <= expected + 1e-9
    assert acc.get_epsilon(delta) == optimal


def test_advanced_optimal_with_delta0_agrees_with_pld():
    """Pure composition with delta0 > 0 (docs/accountants.md): 1 - (1 - delta0)^k (1 - delta_RR(eps')) against dp-accounting's PLD."""
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(0.1, 1e-8), count=100)
    pld = pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(0.1, 1e-8)).self_compose(100)
    assert acc.bounds(1e-5)["optimal"] == pytest.approx(pld.get_epsilon_for_delta(1e-5), abs=1e-6)
    assert acc.bound_name(1e-5) == "optimal"


def test_advanced_budget_uses_the_optimal_bound():
    # 100 pure 0.1 steps cost 4.7746 optimally but 6.31 (DRV) / 10 (basic).
    acc = AdvancedCompositionAccountant(budget=(4.78, 1e-6))
    for _ in range(100):
        acc.compose(EpsilonDeltaEvent(0.1))
    assert acc.spent() == (pytest.approx(4.774568, abs=1e-6), 1e-6)
    assert not acc.can_afford(EpsilonDeltaEvent(0.1))
    with pytest.raises(BudgetExhaustedError):
        acc.compose(EpsilonDeltaEvent(0.1))
    assert acc.classes == {(0.1, 0.0): 100}


def test_basic_budget_includes_its_delta_boundary():
    """The delta side of "a budget is a hard limit" (docs/accountants.md): approximate steps whose summed
    delta lands exactly on the budget's delta are accepted, with epsilon to spare; the next one is refused
    and changes nothing (the contract suite lands the epsilon side for every accountant)."""
    step = EpsilonDeltaEvent(0.01, 3e-7)
    probe = BasicCompositionAccountant()
    for _ in range(4):
        probe.compose(step)
    budget = (1.0, probe.spent()[1])
    acc = BasicCompositionAccountant(budget=budget)
    for _ in range(4):
        assert acc.can_afford(step)
        acc.compose(step)
    assert acc.spent()[1] == budget[1] and acc.spent()[0] < budget[0]
    before = acc.state()
    assert not acc.can_afford(step)
    with pytest.raises(BudgetExhaustedError):
        acc.compose(step)
    assert acc.state() == before


def test_advanced_budgeted_identical_steps_are_fast():
    acc = AdvancedCompositionAccountant(budget=(2.0, 1e-6))
    charged = 0
    while True:
        try:
            acc.compose(EpsilonDeltaEvent(0.01))
        except BudgetExhaustedError:
            break
        charged += 1
    assert acc.spent()[0] <= 2.0 < pure_optimal_epsilon(charged + 1, 0.01, 1e-6)
    assert pure_optimal_epsilon(charged, 0.01, 1e-6) == pytest.approx(acc.spent()[0], rel=1e-12)


def test_advanced_translations():
    acc = AdvancedCompositionAccountant()
    wrapped = BoundaryWrapperEvent(EpsilonDeltaEvent(0.1, 1e-9, AR), 0.2, 1 / 3)
    acc.compose(BetweenThresholdsEvent(0.2, 0.3, AR))
    acc.compose(NoisyArgMaxEvent(0.5, 1e-7, AR))
    acc.compose(wrapped)
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(10.0), 3))
    acc.compose(EpsilonDeltaEvent(0.0, relation=AR))  # a free step does not break "identical steps"
    assert acc.neighboring_relation == AR
    ((wrapped_eps, wrapped_delta, _),) = epsilon_delta_terms(wrapped)
    assert acc.classes == {(0.2, 0.0): 1, (0.5, 1e-7): 1, (wrapped_eps, wrapped_delta): 1, (0.1, 0.0): 3}


def test_advanced_spent_reports_at_target_delta_or_budget_delta():
    acc = AdvancedCompositionAccountant(target_delta=1e-5)
    acc.compose(EpsilonDeltaEvent(0.1), count=100)
    assert acc.spent() == (pytest.approx(4.306791, abs=1e-6), 1e-5)
    acc = AdvancedCompositionAccountant(budget=(100.0, 1e-5), target_delta=1e-9)
    acc.compose(EpsilonDeltaEvent(0.1), count=100)
    assert acc.spent()[1] == 1e-5
    assert acc.config()["target_delta"] == 1e-9


# -- RDP -------------------------------------------------------------------------------------------------------------
def _dp_rdp(*events, relation=NeighboringRelation.ADD_OR_REMOVE_ONE, delta=1e-6):
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    for event, count in events:
        acc.compose(event, count)
    return acc.get_epsilon(delta)


def test_rdp_laplace_matches_dp_accounting_and_the_reference_value():
    acc = RdpAccountant(neighboring_relation=AR)
    acc.compose(dp_event.LaplaceDpEvent(10.0), count=100)
    assert acc.get_epsilon(1e-6) == pytest.approx(_dp_rdp((dp_event.LaplaceDpEvent(10.0), 100)), rel=1e-12)
    assert acc.get_epsilon(1e-6) == pytest.approx(4.984174, abs=1e-6)  # docs/accountants.md


@pytest.mark.parametrize("sigma, count", [(1.0, 1), (5.0, 40), (20.0, 1000)])
def test_rdp_gaussian_matches_dp_accounting(sigma, count):
    acc = RdpAccountant(neighboring_relation=AR)
    for _ in range(count):
        acc.compose(dp_event.GaussianDpEvent(sigma))
    expected = _dp_rdp((dp_event.GaussianDpEvent(sigma), count))
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-9)
    assert acc.spent() == (pytest.approx(expected, rel=1e-9), 1e-6)


def test_rdp_pure_steps_are_zcdp_not_laplace():
    acc = RdpAccountant()
    acc.compose(EpsilonDeltaEvent(0.1), count=60)
    acc.compose(BetweenThresholdsEvent(0.1, 0.3), count=40)
    expected = _dp_rdp((dp_event.ZCDpEvent(rho=0.1**2 / 2), 100))
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-12)
    assert rdp_translation(EpsilonDeltaEvent(0.3)) == [(dp_event.ZCDpEvent(rho=0.045), 1)]
    # Never LaplaceDpEvent(1/eps): its RDP curve is below the worst case of a pure step (it under-counts).
    laplace = _dp_rdp((dp_event.LaplaceDpEvent(10.0), 100))
    assert laplace < pure_optimal_epsilon(100, 0.1, 1e-6) + 0.5  # not a certificate: shown for the record
    assert acc.get_epsilon(1e-6) >= pure_optimal_epsilon(100, 0.1, 1e-6)


def test_rdp_mixed_composed_event_matches_dp_accounting():
    event = dp_event.ComposedDpEvent([
        EpsilonDeltaEvent(0.2, relation=AR),
        dp_event.GaussianDpEvent(4.0),
        dp_event.SelfComposedDpEvent(BetweenThresholdsEvent(0.05, 0.3, AR), 3),
        dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)),
    ])
    acc = RdpAccountant()  # the event states add/remove-one: that fixes the accountant's relation
    acc.compose(event, count=10)
    expected = _dp_rdp(
        (dp_event.ZCDpEvent(rho=0.02), 10),
        (dp_event.GaussianDpEvent(4.0), 10),
        (dp_event.ZCDpEvent(rho=0.05**2 / 2), 30),
        (dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), 10),
    )
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-9)


def test_rdp_randomized_response_needs_replace_one():
    rr = dp_event.RandomizedResponseDpEvent(2 / (1 + math.exp(0.1)), 2)
    with pytest.raises(UnsupportedEventError, match="RandomizedResponseDpEvent.*replace-one"):
        RdpAccountant(neighboring_relation=AR).compose(rr)
    acc = RdpAccountant()  # the default relation is replace-one
    acc.compose(rr, count=100)
    expected = _dp_rdp((rr, 100), relation=NeighboringRelation.REPLACE_ONE)
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-12)
    assert acc.get_epsilon(1e-6) == pytest.approx(5.073153, abs=1e-6)  # docs/accountants.md
    assert acc.neighboring_relation == "replace-one" and acc.config()["neighboring_relation"] is None


@pytest.mark.parametrize(
    "event, words",
    [
        (EpsilonDeltaEvent(0.1, 1e-7), "delta"),
        (NoisyArgMaxEvent(1.0, 1e-6), "delta"),
        (WeightedSamplingEvent(1.0, 1e-6), "delta"),
        (BoundaryWrapperEvent(EpsilonDeltaEvent(0.1, 1e-9), 0.2, 1 / 3), "delta"),
        (ThresholdPrivacyEvent(5), "threshold"),
        (dp_event.NonPrivateDpEvent(), "non-private"),
        (dp_event.UnsupportedDpEvent(), "does not support"),
    ],
)
def test_rdp_rejections_name_the_event(event, words):
    acc = RdpAccountant()
    acc.compose(EpsilonDeltaEvent(0.1))
    before = acc.spent()
    with pytest.raises(UnsupportedEventError, match=type(event).__name__) as info:
        acc.compose(event)
    assert words in str(info.value)
    with pytest.raises(UnsupportedEventError, match=type(event).__name__):
        acc.compose(dp_event.ComposedDpEvent([EpsilonDeltaEvent(0.1), event]))
    assert acc.spent() == before


def test_rdp_thousand_budgeted_events():
    acc = RdpAccountant(budget=(50.0, 1e-6), neighboring_relation=AR)
    events = [EpsilonDeltaEvent(0.01, relation=AR), dp_event.GaussianDpEvent(30.0), BetweenThresholdsEvent(0.02, 0.3, AR)]
    for i in range(1000):
        acc.compose(events[i % 3])
    expected = _dp_rdp(
        (dp_event.ZCDpEvent(rho=0.01**2 / 2), 334),
        (dp_event.GaussianDpEvent(30.0), 333),
        (dp_event.ZCDpEvent(rho=0.02**2 / 2), 333),
    )
    assert acc.spent()[0] == pytest.approx(expected, rel=1e-9)


# -- PLD -------------------------------------------------------------------------------------------------------------
def _dp_pld(*events, relation=NeighboringRelation.ADD_OR_REMOVE_ONE, delta=1e-6):
    acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    for event, count in events:
        acc.compose(event, count)
    return acc.get_epsilon(delta)


def test_pld_laplace_matches_dp_accounting_and_the_reference_value():
    acc = PldAccountant(neighboring_relation=AR)
    for _ in range(100):
        acc.compose(dp_event.LaplaceDpEvent(10.0))
    expected = _dp_pld((dp_event.LaplaceDpEvent(10.0), 100))
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-8)
    assert acc.get_epsilon(1e-6) == pytest.approx(4.692667, abs=1e-6)  # docs/accountants.md


@pytest.mark.parametrize(
    "event, count",
    [
        (dp_event.GaussianDpEvent(10.0), 40),
        (dp_event.GaussianDpEvent(10.0), 5),
        (dp_event.DiscreteLaplaceDpEvent(0.1, 1), 300),
        (dp_event.DiscreteLaplaceDpEvent(0.2, 3), 20),
        (dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(2.0)), 200),
        (dp_event.PoissonSampledDpEvent(0.1, dp_event.LaplaceDpEvent(2.0)), 50),
    ],
)
def test_pld_native_events_match_dp_accounting(event, count):
    at_once, one_by_one = PldAccountant(neighboring_relation=AR), PldAccountant(neighboring_relation=AR)
    at_once.compose(event, count=count)
    for _ in range(count):
        one_by_one.compose(event)
    expected = _dp_pld((event, count))
    assert at_once.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-7)
    assert one_by_one.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-7)


def test_pld_interleaved_native_events_match_dp_accounting():
    mix = [dp_event.LaplaceDpEvent(10.0), dp_event.GaussianDpEvent(20.0), dp_event.DiscreteLaplaceDpEvent(0.05, 1)]
    ours, theirs = PldAccountant(neighboring_relation=AR), pld_privacy_accountant.PLDAccountant()
    for i in range(30):
        ours.compose(mix[i % 3])
        theirs.compose(mix[i % 3])
        if i % 10 == 9:  # flush part-way: the composed PLD is kept incrementally
            assert ours.get_epsilon(1e-6) == pytest.approx(theirs.get_epsilon(1e-6), rel=1e-7)
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-7)


def test_pld_randomized_response_count_is_respected():
    """A dp-accounting pitfall (docs/accountants.md): dp-accounting's PLDAccountant drops the count of a RandomizedResponseDpEvent."""
    rr = dp_event.RandomizedResponseDpEvent(2 / (1 + math.exp(0.1)), 2)
    acc = PldAccountant()  # default: replace-one
    acc.compose(rr, count=100)
    composed = _dp_pld((dp_event.ComposedDpEvent([rr] * 100), 1), relation=NeighboringRelation.REPLACE_ONE)
    assert acc.get_epsilon(1e-6) == pytest.approx(composed, rel=1e-8)
    assert acc.get_epsilon(1e-6) == pytest.approx(4.782011, abs=1e-6)  # docs/accountants.md
    pitfall = _dp_pld((rr, 100), relation=NeighboringRelation.REPLACE_ONE)
    assert pitfall < 0.11 < acc.get_epsilon(1e-6)  # what we must not do
    with pytest.raises(UnsupportedEventError, match="RandomizedResponseDpEvent.*replace-one"):
        PldAccountant(neighboring_relation=AR).compose(rr)
    with pytest.raises(UnsupportedEventError, match="LaplaceDpEvent.*replace-one.*add-remove-one"):
        acc.compose(dp_event.LaplaceDpEvent(1.0))


def test_pld_pure_steps_are_optimal_composition():
    acc = PldAccountant()
    acc.compose(EpsilonDeltaEvent(0.1), count=100)
    exact = pure_optimal_epsilon(100, 0.1, 1e-6)
    assert exact - 1e-9 <= acc.get_epsilon(1e-6) <= exact + 1e-3  # 4.774568 (the exact optimum; RR via dp-accounting: 4.782)
    expected = pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(0.1, 0.0)).self_compose(100)
    assert acc.get_epsilon(1e-6) == pytest.approx(expected.get_epsilon_for_delta(1e-6), rel=1e-9)


def test_pld_between_thresholds_is_discrete_laplace():
    acc = PldAccountant()
    acc.compose(BetweenThresholdsEvent(0.1, 0.3), count=300)
    expected = _dp_pld((dp_event.DiscreteLaplaceDpEvent(0.1, 1), 300))
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-7)
    # Exact for two-sided geometric noise P[Z = z] ~ e^{-eps |z|}: a pure 0.1 step (from_privacy_parameters)
    # is the worst case and costs more.
    worst = PldAccountant()
    worst.compose(EpsilonDeltaEvent(0.1), count=300)
    assert acc.get_epsilon(1e-6) <= worst.get_epsilon(1e-6)


def test_pld_translations_of_our_events():
    acc = PldAccountant()
    acc.compose(NoisyArgMaxEvent(0.5, 1e-8), count=2)
    acc.compose(WeightedSamplingEvent(0.5, 1e-8))
    acc.compose(BoundaryWrapperEvent(EpsilonDeltaEvent(0.1, 1e-9), 0.2, 1 / 3))
    acc.compose(dp_event.SelfComposedDpEvent(EpsilonDeltaEvent(0.2, 1e-9), 4))
    acc.compose(dp_event.NoOpDpEvent())
    ((w_eps, w_delta, _),) = epsilon_delta_terms(BoundaryWrapperEvent(EpsilonDeltaEvent(0.1, 1e-9), 0.2, 1 / 3))
    assert acc.groups == {("eps-delta", 0.5, 1e-8): 3, ("eps-delta", 0.2, 1e-9): 4, ("eps-delta", w_eps, w_delta): 1}
    plds = [pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(0.5, 1e-8)).self_compose(3),
            pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(0.2, 1e-9)).self_compose(4),
            pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(w_eps, w_delta))]
    expected = plds[0].compose(plds[1]).compose(plds[2]).get_epsilon_for_delta(1e-6)
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "event, words",
    [
        (ThresholdPrivacyEvent(5), "threshold"),
        (dp_event.NonPrivateDpEvent(), "non-private"),
        (dp_event.ZCDpEvent(0.1), "no privacy loss distribution"),
        (dp_event.PoissonSampledDpEvent(0.1, EpsilonDeltaEvent(1.0)), "Poisson"),
    ],
)
def test_pld_rejections_name_the_event(event, words):
    acc = PldAccountant(budget=(10.0, 1e-6))
    acc.compose(EpsilonDeltaEvent(0.1))
    before = acc.spent()
    with pytest.raises(UnsupportedEventError, match=type(event).__name__) as info:
        acc.compose(event)
    assert words in str(info.value)
    assert acc.spent() == before


def test_pld_budget_check_decides_as_the_exact_pld():
    """The cheap path only accepts what the exact PLD would accept; refusals come from the exact PLD."""
    events = [EpsilonDeltaEvent(0.05, relation=AR), BetweenThresholdsEvent(0.1, 0.3, AR), dp_event.GaussianDpEvent(20.0),
              NoisyArgMaxEvent(0.2, 1e-10, AR), dp_event.LaplaceDpEvent(15.0)]
    budget = (3.0, 1e-6)
    acc = PldAccountant(budget=budget)  # the first event fixes add/remove-one
    reference = PldAccountant(neighboring_relation=AR)
    charged = 0
    for i in range(2000):
        event = events[i % len(events)]
        try:
            acc.compose(event)
        except BudgetExhaustedError:
            break
        reference.compose(event)
        charged += 1
    else:  # pragma: no cover
        pytest.fail("the budget was never reached")
    assert acc.spent()[0] <= budget[0] + 1e-12
    assert reference.get_epsilon(budget[1]) == pytest.approx(acc.spent()[0], rel=1e-7)
    reference.compose(events[charged % len(events)])
    assert reference.get_epsilon(budget[1]) > budget[0]


@pytest.mark.parametrize("budget", [None, (2.5, 1e-6)])
def test_pld_figures_do_not_depend_on_when_they_are_asked(budget):
    """The reported PLD is a function of the sequence of charges: asking ``spent()`` after every charge, or
    replaying the charges as a ledger does (``replay``: without the budget check), gives the very same figures."""
    from pate_accountant.accountants.base import Charge

    events = [dp_event.LaplaceDpEvent(10.0), dp_event.GaussianDpEvent(20.0), EpsilonDeltaEvent(0.05, relation=AR),
              NoisyArgMaxEvent(0.1, 1e-9, AR), BetweenThresholdsEvent(0.03, 0.3, AR), dp_event.DiscreteLaplaceDpEvent(0.05, 1)]
    asked, silent, replayed = (PldAccountant(budget=budget, neighboring_relation=AR) for _ in range(3))
    figures = []
    for i in range(90):
        event = events[i % len(events)]
        try:
            asked.compose(event)
        except BudgetExhaustedError:
            break
        figures.append(asked.spent())
        silent.compose(event)
        replayed.replay([Charge(event)])
        if i % 17 == 0:
            assert replayed.spent() == figures[-1]
    assert budget is None or len(figures) < 90
    assert silent.spent() == replayed.spent() == figures[-1]


def test_pld_config_and_validation():
    acc = PldAccountant(value_discretization_interval=1e-3, target_delta=1e-7, neighboring_relation="replace-one")
    assert acc.config() == {"kind": "pld", "budget": None, "value_discretization_interval": 1e-3,
                            "target_delta": 1e-7, "neighboring_relation": "replace-one"}
    with pytest.raises(ValueError):
        PldAccountant(neighboring_relation="swap")
    with pytest.raises(ValueError):
        PldAccountant(value_discretization_interval=0.0)
    with pytest.raises(ValueError):
        RdpAccountant(orders=[0.5, 2.0])
    assert RdpAccountant().config()["orders"] is None  # dp-accounting's default orders
    rdp = RdpAccountant(orders=[2, 4.5, 32])
    assert rdp.config() == {"kind": "rdp", "budget": None, "orders": [2.0, 4.5, 32.0], "target_delta": 1e-6,
                            "neighboring_relation": None}
    assert PldAccountant().config()["neighboring_relation"] is None
    assert rdp.orders == (2.0, 4.5, 32.0)


def test_compose_groups_is_order_free():
    groups = {("eps-delta", 0.1, 0.0): 30, ("laplace", 10.0, 1.0): 20, ("discrete-laplace", 0.05, 1): 50}
    forward = compose_groups(groups, 1e-4)
    backward = compose_groups(dict(reversed(list(groups.items()))), 1e-4)
    assert forward.epsilon(1e-6, 1e-4) == pytest.approx(backward.epsilon(1e-6, 1e-4), rel=1e-12)


# -- never under-counting ------------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(
    eps0=st.floats(0.01, 0.5),
    k=st.integers(1, 120),
    others=st.lists(st.tuples(st.floats(0.01, 0.5), st.integers(1, 20)), max_size=3),
    delta=st.sampled_from([1e-7, 1e-6, 1e-4]),
)
def test_no_accountant_under_counts_pure_steps(eps0, k, others, delta):
    """Each accountant is at least the exact optimal composition of the largest identical block it was given
    (composition is monotone: more steps never cost less)."""
    lower = pure_optimal_epsilon(k, eps0, delta)
    accountants = [AdvancedCompositionAccountant(), RdpAccountant(), PldAccountant()]
    for acc in accountants:
        acc.compose(EpsilonDeltaEvent(eps0), count=k)
        for eps, count in others:
            acc.compose(EpsilonDeltaEvent(eps), count=count)
    for acc in accountants:
        assert acc.get_epsilon(delta) >= lower - 1e-9 * max(1.0, lower), type(acc).__name__
    if not others:
        advanced, rdp, pld = (acc.get_epsilon(delta) for acc in accountants)
        assert advanced == pytest.approx(lower, rel=1e-9)  # exact for identical steps
        assert pld <= lower + 2 * k * 1e-4  # the PLD's pessimism is at most its rounding of the losses


@pytest.mark.parametrize("accountant", [AdvancedCompositionAccountant, RdpAccountant, PldAccountant])
def test_threshold_privacy_is_rejected_everywhere(accountant):
    with pytest.raises(UnsupportedEventError, match="ThresholdPrivacyEvent"):
        accountant().compose(ThresholdPrivacyEvent(3))


def test_advanced_rejects_events_without_epsilon_delta_form():
    with pytest.raises(UnsupportedEventError, match="GaussianDpEvent"):
        AdvancedCompositionAccountant().compose(dp_event.GaussianDpEvent(1.0))


# -- speed ------------------------------------------------------------------------------------------------------------
def _heterogeneous_events(n: int, seed: int = 1):
    kinds = [
        EpsilonDeltaEvent(0.05, relation=AR), EpsilonDeltaEvent(0.02, 1e-10, AR), BetweenThresholdsEvent(0.05, 0.3, AR),
        BetweenThresholdsEvent(0.02, 0.3, AR), NoisyArgMaxEvent(0.1, 1e-10, AR), WeightedSamplingEvent(0.03, 1e-11, AR),
        dp_event.LaplaceDpEvent(20.0), dp_event.GaussianDpEvent(30.0), dp_event.DiscreteLaplaceDpEvent(0.01, 1),
        EpsilonDeltaEvent(0.01, relation=AR),
    ]
    rng = np.random.default_rng(seed)
    return [kinds[i] for i in rng.integers(0, len(kinds), n)]


def test_pld_thousand_heterogeneous_events():
    events = _heterogeneous_events(1000)
    acc = PldAccountant(neighboring_relation=AR)
    for event in events:
        acc.compose(event)
    eps = acc.get_epsilon(1e-6)
    assert 0 < eps < sum(getattr(e, "epsilon", 0.1) for e in events)


# --- get_epsilon and a re-derived delta agree ------------------------------------------------------------
from hypothesis import given as _given  # noqa: E402
from hypothesis import settings as _settings  # noqa: E402
from hypothesis import strategies as _st  # noqa: E402

from pate_accountant.composition import pure_optimal_delta  # noqa: E402


@_settings(max_examples=25, deadline=None)
@_given(_st.integers(1, 400), _st.floats(0.005, 0.5), _st.sampled_from([1e-3, 1e-5, 1e-7]))
def test_get_epsilon_and_rederived_delta_agree(k, eps0, delta):
    """For k identical pure eps0 steps the exact delta at the reported epsilon re-derives the delta asked for:
    exactly (advanced, optimal-pure bound) or from below (PLD is pessimistic, so its epsilon is a bit larger)."""
    advanced = AdvancedCompositionAccountant()
    advanced.compose(EpsilonDeltaEvent(eps0), count=k)
    eps = advanced.get_epsilon(delta)
    rederived = pure_optimal_delta(k, eps0, eps)
    assert rederived <= delta * (1 + 1e-9)
    if eps > 0:
        # Just below the reported epsilon the exact delta exceeds the target: the bound is tight.
        assert pure_optimal_delta(k, eps0, eps * (1 - 1e-6)) >= delta * (1 - 1e-6) or advanced.bound_name(delta) != "optimal-pure"
    pld = PldAccountant(value_discretization_interval=1e-4)
    pld.compose(EpsilonDeltaEvent(eps0), count=k)
    eps_pld = pld.get_epsilon(delta)
    assert pure_optimal_delta(k, eps0, eps_pld) <= delta * (1 + 1e-9)  # never under-counts
    # ... and is close: pessimistic discretisation rounds each step's loss up by at most one interval.
    assert eps_pld <= eps + k * 1e-4 + 1e-9


# -- the optimal bound when nearly all of delta goes to the steps' own delta ----------------------------------------
def _exact_optimal_epsilon(k: int, eps0: float, delta0: float, delta: float) -> Decimal:
    """The optimal epsilon of k identical (eps0, delta0) steps at total delta, in 60-digit decimal arithmetic:
    the smallest eps with 1 - (1 - delta0)^k (1 - delta_RR(eps)) <= delta (bisection to 1e-30)."""
    with localcontext() as ctx:
        ctx.prec = 60
        e0, d0, target = Decimal(eps0), Decimal(delta0), Decimal(delta)
        p = 1 / (1 + e0.exp())
        weights = [Decimal(math.comb(k, i)) * p**i * (1 - p) ** (k - i) for i in range(k + 1)]
        losses = [e0 * (k - 2 * i) for i in range(k + 1)]
        survive = (1 - d0) ** k

        def total(eps: Decimal) -> Decimal:
            rr = sum((w * (1 - (eps - loss).exp()) for w, loss in zip(weights, losses) if loss > eps), Decimal(0))
            return 1 - survive * (1 - rr)

        lo, hi = Decimal(0), Decimal(k) * e0
        while hi - lo > Decimal("1e-30"):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if total(mid) <= target else (mid, hi)
        return hi


@pytest.mark.parametrize("k, eps0, delta", [(100, 0.1, 1e-6), (50, 0.5, 1e-5), (1000, 0.01, 1e-6)])
@pytest.mark.parametrize("share", [0.5, 0.999, 0.99999, 0.9999999])
def test_advanced_optimal_bound_is_never_below_the_exact_optimum(k, eps0, delta, share):
    """``share`` of the total delta goes to the steps' own deltas (k delta0 = share * delta).  Near share = 1
    the pure part's delta, 1 - (1 - delta)/(1 - delta0)^k, is tiny: computing it as a difference of two
    numbers near one lost its digits and the reported epsilon fell 1.2e-5 below the exact optimum.  Now it
    is at least the 60-digit value and within 1e-8 of it."""
    delta0 = share * delta / k
    exact = float(_exact_optimal_epsilon(k, eps0, delta0, delta))
    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(eps0, delta0), count=k)
    bounds = acc.bounds(delta)
    assert exact <= bounds["optimal"] <= exact + 1e-8
    assert acc.get_epsilon(delta) >= exact
    assert all(value >= exact for value in bounds.values()), bounds
    assert optimal_epsilon(k, eps0, delta0, delta) == bounds["optimal"]


def test_pure_part_delta_is_a_lower_bound_without_cancellation():
    with localcontext() as ctx:
        ctx.prec = 400  # exact for these inputs' binary values
        for k, delta0, delta in [(100, 9.99999e-9, 1e-6), (1000, 9.9999999e-10, 1e-6), (3, 1e-3, 0.5), (1, 0.0, 1e-6)]:
            exact = 1 - (1 - Decimal(delta)) / (1 - Decimal(delta0)) ** k
            ours = pure_part_delta(k, delta0, delta)
            assert Decimal(ours) <= exact
            assert Decimal(ours) >= exact * (1 - Decimal("1e-6"))
    assert pure_part_delta(100, 1e-8, 0.9e-6) < 0  # 1 - (1 - 1e-8)^100 > 0.9e-6: nothing left
    assert optimal_epsilon(100, 0.1, 1e-8, 0.9e-6) == math.inf
    assert pure_part_delta(5, 0.1, 1.0) == 1.0


# -- relations: one per accountant, dp-accounting's events read under it ---------------------------------------------
def test_native_events_fix_the_default_relation_and_ours_fix_their_own():
    acc = BasicCompositionAccountant()
    assert acc.neighboring_relation is None
    acc.compose(dp_event.NoOpDpEvent())  # free: fixes nothing
    assert acc.neighboring_relation is None
    acc.compose(EpsilonDeltaEvent(0.1, relation=AR))
    assert acc.neighboring_relation == AR
    acc.compose(dp_event.LaplaceDpEvent(10.0))  # read under add/remove-one
    with pytest.raises(UnsupportedEventError, match="'replace-one'.*'add-remove-one'"):
        acc.compose(EpsilonDeltaEvent(0.1))
    assert acc.spent() == (pytest.approx(0.2), 0.0)
    pld = PldAccountant()
    pld.compose(dp_event.GaussianDpEvent(10.0))  # a native event first: the default relation
    assert pld.neighboring_relation == "replace-one"
    with pytest.raises(UnsupportedEventError, match="'add-remove-one'.*'replace-one'"):
        pld.compose(BetweenThresholdsEvent(0.1, 0.3, AR))
    with pytest.raises(UnsupportedEventError, match="mixes the 'add-remove-one' and 'replace-one' relations"):
        AdvancedCompositionAccountant().compose(dp_event.ComposedDpEvent([EpsilonDeltaEvent(0.1), EpsilonDeltaEvent(0.1, relation=AR)]))
    fixed = RdpAccountant(neighboring_relation=AR)
    with pytest.raises(UnsupportedEventError, match="'replace-one'.*'add-remove-one'"):
        fixed.compose(EpsilonDeltaEvent(0.1))
    assert fixed.spent()[0] == 0.0 and fixed.config()["neighboring_relation"] == AR
    with pytest.raises(ValueError, match="neighboring_relation"):
        BasicCompositionAccountant(neighboring_relation="swap-one")


@pytest.mark.parametrize("accountant", [BasicCompositionAccountant, AdvancedCompositionAccountant, RdpAccountant, PldAccountant])
@pytest.mark.parametrize("event", [dp_event.LaplaceDpEvent(10.0), dp_event.DiscreteLaplaceDpEvent(0.1, 1),
                                   dp_event.ComposedDpEvent([EpsilonDeltaEvent(0.1), dp_event.LaplaceDpEvent(10.0)])])
def test_laplace_noise_is_refused_under_replace_one(accountant, event):
    """dp-accounting calibrates Laplace noise to add/remove-one (a shift of one); under replace-one a record
    out and another in can shift a sum by two, so no accountant reads it there."""
    acc = accountant()
    acc.compose(EpsilonDeltaEvent(0.1))
    before = acc.spent()
    with pytest.raises(UnsupportedEventError, match="replace-one"):
        acc.compose(event)
    assert acc.spent() == before
    fine = accountant(neighboring_relation=AR)
    if isinstance(event, dp_event.ComposedDpEvent):
        event = dp_event.ComposedDpEvent([EpsilonDeltaEvent(0.1, relation=AR), dp_event.LaplaceDpEvent(10.0)])
    if accountant is RdpAccountant and isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        with pytest.raises(UnsupportedEventError, match="does not support"):  # dp-accounting's RDP has none
            fine.compose(event)
        return
    fine.compose(dp_event.SelfComposedDpEvent(event, 2))  # under add/remove-one it is charged
    assert fine.spent()[0] > 0.0


def test_gaussian_under_replace_one_is_the_pld_replace_construction_and_refused_by_rdp():
    """dp-accounting's PLD reads a Gaussian under replace-one as a shift of two; its RDP accountant would read
    a shift of one (an under-count by that reading), so our RDP accountant refuses it there."""
    acc = PldAccountant()
    acc.compose(dp_event.GaussianDpEvent(10.0), count=40)
    expected = _dp_pld((dp_event.GaussianDpEvent(10.0), 40), relation=NeighboringRelation.REPLACE_ONE)
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-7)
    assert acc.get_epsilon(1e-6) > _dp_pld((dp_event.GaussianDpEvent(10.0), 40))  # dearer than add/remove-one
    with pytest.raises(UnsupportedEventError, match="GaussianDpEvent.*replace-one"):
        RdpAccountant().compose(dp_event.GaussianDpEvent(10.0))


def test_the_relation_survives_a_ledger_replay():
    from pate_accountant.ledger import Ledger

    with Ledger.in_memory() as ledger:
        acc = PldAccountant(ledger=ledger)
        acc.compose(BetweenThresholdsEvent(0.1, 0.3, AR), count=3)
        again = PldAccountant(ledger=ledger)  # replays the rows
        assert again.neighboring_relation == AR and again.spent() == acc.spent()
        with pytest.raises(UnsupportedEventError, match="'replace-one'.*'add-remove-one'"):
            again.compose(BetweenThresholdsEvent(0.1, 0.3))
        assert ledger.verify().ok


# -- one home per formula: the accountant's bounds are pate_accountant.composition's ---------------------------------
def test_advanced_bounds_are_the_composition_functions():
    from pate_accountant import composition

    acc = AdvancedCompositionAccountant()
    acc.compose(EpsilonDeltaEvent(0.1, 1e-9), count=100)
    bounds = acc.bounds(1e-5)
    assert bounds["optimal"] == composition.optimal_epsilon(100, 0.1, 1e-9, 1e-5)
    assert bounds["kov"] == composition.kov(0.1, 1e-9, 100, 1e-5)
    # DRV from the running sums: the homogeneous and heterogeneous forms of the one formula agree.
    s_eps, s_delta, s_sq, s_drift, s_error = acc._sums  # noqa: SLF001
    slack = (1e-5 - s_delta) - s_error - 2.0**-52 * 1e-5
    assert bounds["drv"] == composition.drv_from_sums(s_sq, s_drift, slack)
    assert bounds["drv"] == pytest.approx(composition.drv_epsilon(100, 0.1, slack), rel=1e-14)
    assert bounds["drv"] == pytest.approx(composition.drv([0.1] * 100, slack), rel=1e-14)
    # Without the cache of binomial weights the values are the same.
    assert composition.optimal_epsilon(100, 0.1, 1e-9, 1e-5, cache=False) == bounds["optimal"]
    assert composition.kov(0.1, 1e-9, 100, 1e-5, cache=False) == bounds["kov"]


@pytest.mark.parametrize("k, eps0, delta0, delta", [(7, 0.3, 0.0, 1e-3), (40, 0.1, 1e-7, 1e-5), (200, 0.05, 0.0, 1e-6),
                                                    (100, 0.1, 1e-8, 1e-5), (300, 0.05, 1e-9, 1e-6), (1, 1.0, 0.0, 0.1)])
def test_kov_is_the_grid_of_dp_accountings_kov(k, eps0, delta0, delta):
    from pate_accountant import composition

    expected = pld_accountant.advanced_composition(DifferentialPrivacyParameters(eps0, delta0), k, delta)
    assert composition.kov(eps0, delta0, k, delta) == pytest.approx(expected, rel=1e-12)


def test_kov_beyond_dp_accountings_overflow():
    """dp-accounting's KOV overflows near k = 1000; composition.kov does not (k = 10^4, eps0 = 0.01)."""
    from pate_accountant import composition

    value = composition.kov(0.01, 0.0, 10_000, 1e-6)
    optimal = pure_optimal_epsilon(10_000, 0.01, 1e-6)
    assert value == pytest.approx(4.9, abs=1e-9) and optimal <= value < optimal + 0.02
    assert composition.kov(0.1, 1e-8, 100, 0.9e-6) == math.inf  # delta does not cover 1 - (1 - delta0)^100
    assert composition.kov(0.0, 0.0, 5, 1e-6) == 0.0 and composition.kov(0.5, 0.0, 0, 1e-6) == 0.0


def test_switch_point_brackets_the_turn_of_a_monotone_predicate():
    """The one bisection behind the calibrations: the bracket holds the switch, certified on both sides."""
    from pate_accountant.bisection import switch_point

    for target in (1e-9, 0.3, 1.0, 7.5, 1e5):
        lo, hi = switch_point(lambda x, t=target: x >= t, 0.0, 1.0, rel_tol=1e-12)
        assert lo < target <= hi and hi - lo <= 1e-12 * hi
        lo, hi = switch_point(lambda x, t=target: x >= t, 2.0, 4.0, rel_tol=1e-12)  # a start above: halves down
        assert lo < target <= hi
    assert switch_point(lambda x: False, 0.0, 1.0, rel_tol=1e-6, limit=100.0) == (64.0, math.inf)
    assert switch_point(lambda x: True, 0.5, 1.0, rel_tol=1e-6)[0] == 0.0
    with pytest.raises(ValueError, match="lower < upper"):
        switch_point(lambda x: True, 1.0, 1.0, rel_tol=1e-6)
