"""Threshold-privacy aggregators (Section 4.3) and the diversity-preservation constants of Theorem 4.1."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import z_bound
from ensembles import EnsembleSampler, TeacherDistributions, coordinated_votes, histograms_from_votes
from ensembles.synthetic import disjoint_groups
from mechanisms import CountHistogram, ThresholdArgMax, ThresholdWeightedSampling, as_histogram
from mechanisms.testing import check_sampler_matches_law
from pate_accountant import Release, ThresholdPrivacyEvent


# --- histogram inputs ----------------------------------------------------------------------------
def test_histogram_inputs_are_equivalent():
    dense = np.array([0, 4, 0, 2, 1])
    mapping = {1: 4, 3: 2, 4: 1}
    a, b = as_histogram(dense), as_histogram(mapping)
    assert a == b and a.num_teachers == 7
    assert as_histogram(a) is a
    assert as_histogram(dense, num_teachers=10).tail == 3


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (np.array([1.5, 2]), ValueError, "integer counts, got 1.5"),
        (np.array([3, -1]), ValueError, "non-negative counts, got -1"),
        ({0: 2, "a": 1}, TypeError, "integer token ids, got 'a'"),
        ("abc", TypeError, "got str"),
    ],
)
def test_bad_histograms_are_rejected(bad, error, message):
    with pytest.raises(error, match=message):
        as_histogram(bad)


def test_counts_above_num_teachers_are_rejected():
    with pytest.raises(ValueError, match="counts sum to 6, more than num_teachers=5"):
        as_histogram([3, 3], num_teachers=5)


# --- TArgMax -------------------------------------------------------------------------------------
def test_threshold_argmax_exact_outputs():
    mech = ThresholdArgMax(3)
    assert mech.event == ThresholdPrivacyEvent(3)
    r = mech({0: 2, 5: 4, 7: 3}, rng=np.random.default_rng(0))
    assert isinstance(r, Release) and r.value == 5 and r.outcome == "token"
    assert mech({0: 2, 1: 2}, rng=np.random.default_rng(0)).value is None
    dist = mech.output_distribution({1: 3, 2: 3, 3: 1})
    assert dist.as_dict() == {1: 0.5, 2: 0.5, None: 0.0}
    # Ties are broken uniformly at random.
    rng = np.random.default_rng(1)
    draws = [mech({1: 3, 2: 3}, rng=rng).value for _ in range(4000)]
    assert abs(np.mean(np.array(draws) == 1) - 0.5) < z_bound(1) * np.sqrt(0.25 / 4000)


def test_tail_votes_are_never_released():
    # 8 of 10 teachers voted into their tails: nothing reaches T = 3 although n is 10.
    h = CountHistogram([4], [2], num_teachers=10)
    assert ThresholdArgMax(3)(h, rng=np.random.default_rng(0)).value is None
    assert ThresholdWeightedSampling(3).output_distribution(h).fail == 1.0


# --- TWS -----------------------------------------------------------------------------------------
def test_weighted_sampling_exact_distribution():
    mech = ThresholdWeightedSampling(2, gamma=1.0)
    dist = mech.output_distribution({0: 1, 1: 2, 2: 3}, num_teachers=10)
    # S_T = {1, 2}, M_T = 5 < n / gamma = 10: token j with probability c_j / 10.
    assert dist.as_dict() == pytest.approx({1: 0.2, 2: 0.3, None: 0.5})
    boosted = ThresholdWeightedSampling(2, gamma=4.0).output_distribution({0: 1, 1: 2, 2: 3}, num_teachers=10)
    assert boosted.as_dict() == pytest.approx({1: 0.4, 2: 0.6, None: 0.0})


def test_weighted_sampling_draws_follow_the_exact_distribution():
    mech = ThresholdWeightedSampling(2, gamma=1.5)
    hist = as_histogram({0: 1, 1: 2, 2: 3, 3: 6}, num_teachers=20)
    # M_T = 11 < n / gamma = 40/3: token j with probability c_j / (40/3), fail 1 - 11 / (40/3).
    assert mech.output_distribution(hist).as_dict() == pytest.approx({1: 0.15, 2: 0.225, 3: 0.45, None: 0.175})
    report = check_sampler_matches_law(mech, hist, 20000, seed=3, alpha=1e-4, path="call")
    assert report.degrees_of_freedom == 3


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=8),
    st.integers(0, 20),
    st.integers(1, 30),
    st.floats(1.0, 5.0),
)
def test_aggregators_are_relevant_and_thresholded(counts, tail, threshold, gamma):
    hist = as_histogram(np.array(counts), num_teachers=sum(counts) + tail)
    if hist.num_teachers == 0:
        return
    n = hist.num_teachers
    tws = ThresholdWeightedSampling(threshold, gamma).output_distribution(hist)
    targ = ThresholdArgMax(threshold).output_distribution(hist)
    for dist, factor in ((tws, gamma), (targ, None)):
        assert dist.probabilities.sum() + dist.fail == pytest.approx(1.0)
        for token, prob in zip(dist.tokens, dist.probabilities):
            assert hist.count(token) >= threshold  # threshold privacy
            if factor is not None:
                assert prob <= factor * hist.count(token) / n + 1e-12  # relevance of TWS


def test_bad_parameters():
    with pytest.raises(ValueError, match="threshold must be >= 1, got 0"):
        ThresholdArgMax(0)
    with pytest.raises(TypeError, match="threshold must be an integer, got 2.5"):
        ThresholdWeightedSampling(2.5)
    with pytest.raises(ValueError, match="gamma must be >= 1.0, got 0.5"):
        ThresholdWeightedSampling(3, gamma=0.5)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        ThresholdArgMax(1)({0: 1, 1: 1}, rng=42)


# --- Theorem 4.1: diversity preservation of the coordinated samplers ------------------------------
def token_probability(teachers, aggregator, token, num, rng):
    """Rao-Blackwellised Monte Carlo estimate of Pr[M(p) = token] and its standard error."""
    votes = coordinated_votes(teachers, num, rng)
    values = np.array([aggregator.output_distribution(h).probability(token) for h in histograms_from_votes(votes, teachers.vocab_size)])
    return values.mean(), values.std(ddof=1) / np.sqrt(num)


FAMILIES = {
    # many teachers, tiny q: all 200 teachers give token 0 probability 0.02
    "many-small": dict(num_teachers=200, group_size=200, q=0.02),
    # few teachers, large q: 20 of 200 teachers give token 0 probability 0.9
    "few-large": dict(num_teachers=200, group_size=20, q=0.9),
    # a middle case
    "half-mid": dict(num_teachers=200, group_size=100, q=0.2),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tws_is_diversity_preserving_with_beta_017(family, rng):
    params = FAMILIES[family]
    n, tau, q = params["num_teachers"], params["group_size"], params["q"]
    teachers = disjoint_groups(n, tau, vocab_size=n + n // tau + 1, q=q)
    aggregator = ThresholdWeightedSampling(tau // 2, gamma=1.0)
    estimate, se = token_probability(teachers, aggregator, 0, 20000, rng)
    z = z_bound(2 * len(FAMILIES))
    assert estimate + z * se >= 0.17 * (tau / n) * q  # transfer
    assert estimate - z * se <= 1.0 * teachers.average()[0]  # relevance, gamma = 1


@pytest.mark.parametrize("tau_fraction, q", [(0.9, 0.3), (0.75, 0.6), (1.0, 0.1)])
def test_targmax_is_diversity_preserving_for_homogeneous_ensembles(tau_fraction, q, rng):
    n = 100
    tau = int(tau_fraction * n)
    teachers = disjoint_groups(n, tau, vocab_size=n + n // tau + 2, q=q)
    aggregator = ThresholdArgMax(int(np.ceil(n / 2 + 1)))
    estimate, se = token_probability(teachers, aggregator, 0, 20000, rng)
    z = z_bound(6)
    assert estimate + z * se >= 0.5 * np.log(2 * tau / n) * (tau / n) * q
    assert estimate - z * se <= 2.0 * teachers.average()[0]


def test_uniform_over_many_tokens_hot_always_yields_cold_never(rng):
    """Identical teachers uniform over m >> n^2 tokens: Cold PATE yields nothing at T = 2."""
    n, m, num = 20, 40_000, 2000
    ids = np.tile(np.arange(m), (n, 1))
    teachers = TeacherDistributions.from_sparse(ids, np.full((n, m), 1.0 / m), vocab_size=m)
    aggregator = ThresholdWeightedSampling(2)
    hot = EnsembleSampler("coordinated", aggregator).sample_many(teachers, num, rng)
    cold = EnsembleSampler("independent", aggregator).sample_many(teachers, num, rng)
    assert all(r.value is not None for r in hot)
    assert len({r.value for r in hot}) > 0.9 * num  # diverse: almost every draw is a new token
    cold_yield = np.mean([r.value is not None for r in cold])
    collision_bound = n * (n - 1) / (2 * m)  # union bound on any two teachers agreeing
    assert cold_yield <= collision_bound + z_bound(1) * np.sqrt(collision_bound / num)


def test_sampler_output_distribution_matches_sampling(rng):
    teachers = disjoint_groups(60, 20, vocab_size=70, q=0.5)
    sampler = EnsembleSampler("coordinated", ThresholdWeightedSampling(10))
    dist = sampler.output_distribution(teachers, 4000, rng)
    draws = sampler.sample_many(teachers, 4000, rng)
    for token in (0, 1, 2, None):
        freq = np.mean([r.value == token for r in draws])
        p = dist.probability(token)
        assert abs(freq - p) <= z_bound(4) * np.sqrt(max(p * (1 - p), 1e-4) / 4000) * np.sqrt(2)
    with pytest.raises(ValueError, match="histograms must be one of"):
        EnsembleSampler("hot", ThresholdArgMax(3))
    with pytest.raises(TypeError, match="aggregator must be a mechanism"):
        EnsembleSampler("coordinated", 3)


def test_sampler_estimates_by_counting_when_the_aggregator_has_no_exact_law(rng):
    class Majority:
        """An aggregator with no output_distribution: the top token if it has a strict majority."""

        event = ThresholdPrivacyEvent(1)

        def __call__(self, histogram, rng=None):
            (token, count), = histogram.top(1) or [(None, 0)]
            return Release(token if count * 2 > histogram.num_teachers else None, self.event)

    teachers = disjoint_groups(30, 30, vocab_size=40, q=0.5)
    dist = EnsembleSampler("coordinated", Majority()).output_distribution(teachers, 3000, rng)
    # Token 0 wins a strict majority exactly when more than 15 of 30 teachers vote for it.
    from scipy.stats import betabinom

    exact = betabinom(30, 1.0, 1.0).sf(15)  # alpha = 1/2: BetaBin(n, 1, 1) is uniform on 0..30
    assert abs(dist.probability(0) - exact) <= z_bound(1) * np.sqrt(exact * (1 - exact) / 3000)
    assert dist.probability(0) + dist.fail == pytest.approx(1.0)


@pytest.mark.parametrize("mechanism", [ThresholdArgMax(3), ThresholdWeightedSampling(2, gamma=1.5)])
def test_threshold_batches_follow_the_exact_distribution(mechanism):
    from mechanisms import HistogramBatch, as_batch

    hists = [{0: 3, 1: 3, 2: 1}, {0: 1, 1: 1}, {4: 5, 5: 2}]
    batch = as_batch(hists, num_teachers=8)
    assert isinstance(batch, HistogramBatch) and len(batch) == 3
    sample, tokens, probs = mechanism.batch_distributions(batch)
    for i, h in enumerate(hists):
        exact = mechanism.output_distribution(h, num_teachers=8).as_dict()
        got = {int(t): p for s, t, p in zip(sample, tokens, probs) if s == i}
        assert got == pytest.approx({k: v for k, v in exact.items() if k is not None and v > 0})
    check_sampler_matches_law(mechanism, as_histogram(hists[0], num_teachers=8), 20000, seed=4, alpha=1e-4)
