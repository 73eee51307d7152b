"""GNMax with exact truncated discrete Gaussian noise (mechanisms/gaussian.py; Papernot et al. 2018,
Section 4.1; noise of Canonne, Kamath and Steinke 2020) and its thresholded form.

The reference laws here are written from the definitions (every noise vector enumerated), independently of
the module; the privacy checks compare tight hockey-stick divergences of exact laws with the claim.
"""

import itertools
import math

import numpy as np
import pytest
from conftest import z_bound

from mechanisms import CountHistogram, GaussianNoisyArgMax, GaussianThresholdArgMax
from mechanisms.audit import hockey_stick
from mechanisms.base import gauss_legendre_unit
from mechanisms.gaussian import (
    LAW_TOLERANCE,
    calibrate_sigma,
    count_groups,
    gaussian_delta,
    truncation_bound,
)
from mechanisms.randomness import discrete_gaussian_law, random_bits
from mechanisms.testing import (
    ROUNDING,
    check_counts_match_law,
    check_sampler_matches_law,
    worst_pair_delta,
)
from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    REPLACE_ONE,
    DiscreteGaussianArgMaxEvent,
)

RELATIONS = (REPLACE_ONE, ADD_REMOVE_ONE)


def dg_pmf(sigma: float, bound: int) -> np.ndarray:
    """The truncated discrete Gaussian on -bound..bound from its definition: ~ exp(-x^2 / (2 sigma^2))."""
    x = np.arange(-bound, bound + 1)
    w = np.exp(-(x**2) / (2 * sigma**2))
    return w / w.sum()


def brute_law(counts, sigma: float, threshold=None, cut: float | None = None) -> dict:
    """Release law by enumerating every noise vector of the truncated noise (``|x| <= T``), or, with ``cut``,
    of the noise cut at ``|x| <= cut sigma`` (the rest left out: compare to its mass)."""
    k = truncation_bound(sigma) if cut is None else math.ceil(cut * sigma)
    pmf = dg_pmf(sigma, truncation_bound(sigma))[truncation_bound(sigma) - k : truncation_bound(sigma) + k + 1]
    x = np.arange(-k, k + 1)
    grid = np.array(list(itertools.product(range(2 * k + 1), repeat=len(counts))))
    prob = np.prod(pmf[grid], axis=1)
    noisy = np.asarray(counts) + x[grid]
    best = noisy.max(axis=1)
    tied = noisy == best[:, None]
    share = prob / tied.sum(axis=1)
    out = {j: math.fsum(share[tied[:, j]] if threshold is None else share[tied[:, j] & (best >= threshold)])
           for j in range(len(counts))}
    out[None] = 0.0 if threshold is None else math.fsum(prob[best < threshold])
    return out


def quadrature_law(mech, counts, vocab_size: int):
    """The exact law as first written (every token's tie integral at the exact number of Gauss-Legendre nodes,
    floor((V - 1) / 2) + 1, CDF summed from the bottom): the reference the grouped law must reproduce on small
    vocabularies.  Returns (per-token probabilities, fail)."""
    bound, sigma = mech.truncation_bound, mech.sigma
    threshold = getattr(mech, "threshold", None)
    x = np.arange(-bound, bound + 1)
    log_w = -(x.astype(np.float64) ** 2) / (2.0 * sigma**2)
    pmf = np.exp(log_w - np.logaddexp.reduce(log_w))
    le = np.cumsum(pmf)
    le[bound:] = 1.0 - np.concatenate([le[:bound][::-1], [0.0]])
    dense = np.zeros(vocab_size, dtype=np.int64)
    dense[: len(counts)] = counts
    groups, multiplicity = np.unique(dense, return_counts=True)

    def at(table, noise, outside_low, outside_high):
        idx = noise + bound
        return np.where(idx < 0, outside_low, np.where(idx > 2 * bound, outside_high, table[np.clip(idx, 0, 2 * bound)]))

    top = int(groups[-1])
    low = top - bound if threshold is None else max(top - bound, threshold)
    values = np.arange(low, top + bound + 1)
    fail = 0.0 if threshold is None else float(np.prod(at(le, threshold - 1 - groups, 0.0, 1.0) ** multiplicity))
    if values.size == 0:
        return np.zeros(vocab_size), fail
    noise = values[:, None] - groups[None, :]
    b, a = at(pmf, noise, 0.0, 0.0), at(le, noise - 1, 0.0, 1.0)
    nodes, weights = gauss_legendre_unit((int(multiplicity.sum()) - 1) // 2 + 1)
    with np.errstate(divide="ignore"):
        log_factor = np.log(a[:, :, None] + b[:, :, None] * nodes)
    total = (log_factor * multiplicity[None, :, None]).sum(axis=1)
    win = np.zeros(groups.size)
    with np.errstate(invalid="ignore"):
        for g in range(groups.size):
            rest = np.exp(total - log_factor[:, g, :]) @ weights
            win[g] = float(np.where(b[:, g] > 0, b[:, g] * rest, 0.0).sum())
    return win[np.searchsorted(groups, dense)], fail


# --- the exact law --------------------------------------------------------------------------------------
@pytest.mark.parametrize("counts, sigma", [
    *[(counts, sigma) for counts in [(3, 1, 0), (2, 2, 1), (0, 0, 0), (5, 0, 1)] for sigma in (0.7, 1.3)],
    ((1, 1, 1, 0), 0.7), ((2, 0, 0, 0), 0.7),
])
def test_output_distribution_matches_brute_force(counts, sigma):
    """Every noise vector of the truncated noise enumerated (up to 33^3 or 19^4 of them): the law to float
    rounding."""
    vocab = len(counts)
    hist = CountHistogram(np.arange(vocab), counts, num_teachers=sum(counts) + 1)
    law = GaussianNoisyArgMax(sigma, vocab_size=vocab).output_distribution(hist).as_dict()
    ref = brute_law(counts, sigma)
    for key, value in ref.items():
        assert law.get(key, 0.0) == pytest.approx(value, rel=1e-12, abs=1e-15), key
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    for threshold in (2, 4):
        mech = GaussianThresholdArgMax(sigma, vocab_size=vocab, threshold=threshold)
        law = mech.output_distribution(hist).as_dict()
        ref = brute_law(counts, sigma, threshold)
        for key, value in ref.items():
            assert law.get(key, 0.0) == pytest.approx(value, rel=1e-12, abs=1e-15), (threshold, key)
        assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)


def test_the_brute_force_reference_has_teeth():
    """The reference tells laws apart: cut at 2 sigma (a different noise) it misses mass the law has."""
    counts, sigma = (3, 1, 0), 1.3
    law = GaussianNoisyArgMax(sigma, vocab_size=3).output_distribution(CountHistogram([0, 1], [3, 1])).as_dict()
    cut = brute_law(counts, sigma, cut=2.0)
    assert max(abs(law[k] - cut[k]) for k in range(3)) > 1e-3


CASES = [  # (sigma, vocabulary, voted counts, threshold): ties, a lone vote, thresholds above and below the top
    (0.7, 60, (1,), 2), (1.0, 40, (3, 3, 1), None), (0.3, 36, (), None), (2.0, 30, (4, 2), 3),
    (1.0, 300, (5, 5, 5, 2, 1), None), (2.5, 1000, (9, 6), 8), (6.0, 1500, (30, 28, 26, 20), None),
    (0.5, 800, (1, 1), None), (1.5, 200, (2,), 12), (1.2, 700, (), 3),
]


@pytest.mark.parametrize("sigma, vocab, counts, threshold", CASES)
def test_grouped_law_reproduces_the_quadrature_over_every_token(sigma, vocab, counts, threshold):
    """Grouping equal counts (the zero-vote tokens as one group) and the proven node count give the law that the
    exact Gauss-Legendre rule over the whole vocabulary gave, to float64 rounding; and the law sums to one."""
    kwargs = {"vocab_size": vocab, "epsilon": 9.0}
    mech = (GaussianNoisyArgMax(sigma, **kwargs) if threshold is None
            else GaussianThresholdArgMax(sigma, threshold=threshold, **kwargs))
    hist = CountHistogram(np.arange(len(counts)), counts, num_teachers=sum(counts) + 2)
    law = mech.output_distribution(hist)
    ref, ref_fail = quadrature_law(mech, counts, vocab)
    assert law.tokens.tolist() == list(range(vocab))
    np.testing.assert_allclose(law.probabilities, ref, rtol=1e-12, atol=1e-16)
    assert law.fail == pytest.approx(ref_fail, rel=1e-12, abs=1e-16)
    assert math.fsum(law.probabilities) + law.fail == pytest.approx(1.0, abs=1e-12)


def test_the_node_count_bound_loses_less_than_its_tolerance(monkeypatch):
    """Fewer nodes than the exact rule where the tie count's tail allows: far fewer here, and the law agrees with
    the exact rule on the same grouping to float64 rounding (the bound leaves out less than LAW_TOLERANCE; 2,000
    float64 nodes round to about 1e-12 relative), while one node everywhere would be visibly wrong."""
    mech = GaussianNoisyArgMax(1.0, vocab_size=4000, epsilon=5.0)
    hist = CountHistogram([0, 1, 2], [3, 2, 2], num_teachers=9)
    groups, multiplicity = count_groups(hist.counts, 4000)
    values = np.arange(3 - mech.truncation_bound, 3 + mech.truncation_bound + 1)
    nodes = mech._node_counts(values, groups, multiplicity)
    exact = (int(multiplicity.sum()) - 1) // 2 + 1
    assert exact == 2000 and nodes.max() < exact // 4 and np.median(nodes) <= 2
    law = mech.output_distribution(hist)
    monkeypatch.setattr(GaussianNoisyArgMax, "_node_counts", lambda self, v, g, m: np.full(v.size, exact))
    exact = mech.output_distribution(hist)
    assert LAW_TOLERANCE < 1e-15
    np.testing.assert_allclose(law.probabilities, exact.probabilities, rtol=1e-11, atol=0)
    assert np.abs(law.probabilities - exact.probabilities).sum() <= 1e-11
    # and too few nodes would show: one node where the bound asks for more
    monkeypatch.setattr(GaussianNoisyArgMax, "_node_counts", lambda self, v, g, m: np.ones(v.size, np.int64))
    assert np.abs(mech.output_distribution(hist).probabilities - exact.probabilities).sum() > 1e-6


@pytest.mark.parametrize("vocab", [49_152, 128_256])
def test_law_on_a_large_vocabulary_is_fast_and_symmetric(vocab):
    """No vocabulary limit: an empty histogram gives every token exactly 1/V (exchangeable tokens), and a few
    votes put the zero-vote tokens' total share where the grouped law says, both in milliseconds."""
    mech = GaussianNoisyArgMax(6.0, vocab_size=vocab)
    uniform = mech.output_distribution(CountHistogram([], [], num_teachers=3, vocab_size=vocab))
    np.testing.assert_allclose(uniform.probabilities * vocab, 1.0, rtol=1e-13)
    hist = CountHistogram([7, 40_000], [30, 24], num_teachers=60)
    law = mech.output_distribution(hist)
    zeros = np.delete(law.probabilities, [7, 40_000])
    assert zeros.max() == zeros.min() > 0
    assert math.fsum(law.probabilities) == pytest.approx(1.0, abs=1e-12)
    assert law.probability(7) > law.probability(40_000) > zeros[0]


def test_zero_vote_tokens_are_candidates_and_exchangeable():
    law = GaussianNoisyArgMax(1.0, vocab_size=6).output_distribution({0: 2})
    assert law.fail == 0.0
    zeros = [law.probability(j) for j in range(1, 6)]
    assert min(zeros) > 0.01 and max(zeros) - min(zeros) < 1e-15
    assert law.probability(0) > zeros[0]


# --- privacy: exact enumeration ------------------------------------------------------------------------
def noisy_histogram_delta(sigma: float, epsilon: float, shifts: int) -> float:
    """The exact hockey-stick divergence of the noisy histogram itself (before the argmax) on the worst
    pair: ``shifts`` coordinates moved by one, each with truncated discrete Gaussian noise (enumerated)."""
    bound = truncation_bound(sigma)
    p = dg_pmf(sigma, bound)
    first = np.concatenate([p, [0.0]])  # X on -T..T+1
    second = np.concatenate([[0.0], p])  # X + 1
    if shifts == 1:
        return hockey_stick(dict(enumerate(first)), dict(enumerate(second)), epsilon)
    joint1 = np.outer(first, first[::-1]).ravel()  # one coordinate up, one down (the mirror)
    joint2 = np.outer(second, second[::-1]).ravel()
    return max(float(np.maximum(joint1 - math.exp(epsilon) * joint2, 0).sum()),
               float(np.maximum(joint2 - math.exp(epsilon) * joint1, 0).sum()))


@pytest.mark.parametrize("relation, shifts", [(REPLACE_ONE, 2), (ADD_REMOVE_ONE, 1)])
@pytest.mark.parametrize("sigma, epsilon", [(1.0, 1.0), (2.0, 0.5), (3.0, 1.0), (0.8, 2.0)])
def test_the_charged_curve_bounds_the_noisy_histogram_tightly(relation, shifts, sigma, epsilon):
    """dp-accounting's pessimistic discrete-Gaussian PLD is an upper bound on the exact delta of the noisy
    histogram, and close to it (the discretisation costs little)."""
    exact = noisy_histogram_delta(sigma, epsilon, shifts)
    charged = gaussian_delta(sigma, epsilon, relation)
    assert exact <= charged + ROUNDING
    assert charged <= exact * 1.02 + 1e-9


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("make", [
    lambda r: GaussianNoisyArgMax(1.0, vocab_size=3, relation=r),
    lambda r: GaussianNoisyArgMax(0.6, vocab_size=3, relation=r, epsilon=2.0),
    lambda r: GaussianNoisyArgMax(1.5, vocab_size=4, relation=r, epsilon=0.5),
    lambda r: GaussianThresholdArgMax(1.0, vocab_size=3, relation=r, threshold=3),
    lambda r: GaussianThresholdArgMax(0.6, vocab_size=3, relation=r, threshold=5, epsilon=1.5),
])
def test_claim_holds_on_every_neighbouring_pair(make, relation):
    mech = make(relation)
    claim = mech.privacy_claim(relation)
    assert (claim.epsilon, claim.delta, claim.relation) == (mech.epsilon, mech.delta, relation)
    worst = worst_pair_delta(mech, claim.epsilon, relation)
    assert 0.0 < worst.delta <= claim.delta + ROUNDING
    with pytest.raises(ValueError, match="claims nothing under relation"):
        mech.privacy_claim(ADD_REMOVE_ONE if relation == REPLACE_ONE else REPLACE_ONE)


def test_too_little_noise_for_the_claim_is_caught():
    honest = GaussianNoisyArgMax(1.0, vocab_size=3)
    broken = GaussianNoisyArgMax(0.4, vocab_size=3)
    assert worst_pair_delta(broken, honest.epsilon).delta > honest.delta


# --- accounting -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("relation", RELATIONS)
def test_calibration_is_the_smallest_sigma_to_a_tolerance(relation):
    sigma = calibrate_sigma(1.0, 1e-6, relation)
    assert gaussian_delta(sigma, 1.0, relation) <= 1e-6
    assert gaussian_delta(sigma * (1 - 3e-3), 1.0, relation) > 1e-6
    mech = GaussianNoisyArgMax.calibrated(1.0, 1e-6, relation)
    assert mech.sigma == sigma and mech.delta <= 1e-6 and mech.relation == relation
    # replace-one moves two counts: more noise than add-remove-one
    if relation == REPLACE_ONE:
        assert sigma > calibrate_sigma(1.0, 1e-6, ADD_REMOVE_ONE)


@pytest.mark.parametrize("relation", RELATIONS)
def test_pld_charges_the_discrete_gaussian_composition(relation):
    mech = GaussianNoisyArgMax.calibrated(1.0, 1e-6, relation, vocab_size=10)
    event = mech.event
    assert isinstance(event, DiscreteGaussianArgMaxEvent) and event.shifts == (2 if relation == REPLACE_ONE else 1)
    assert event.truncation_bound == truncation_bound(mech.sigma)
    pld = PldAccountant(neighboring_relation=relation)
    pld.compose(event, count=1)
    assert pld.get_epsilon(1e-6) == pytest.approx(1.0, abs=2e-3)
    pld.compose(event, count=99)
    basic = BasicCompositionAccountant(neighboring_relation=relation)
    basic.compose(event, count=100)
    # 100 steps: the PLD charge is far below basic composition of the stated (1, 1e-6)
    assert pld.get_epsilon(1e-4) < 0.3 * basic.get_epsilon(1e-4)


# --- sampling -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.5, 1.7, 6.0])
def test_noise_sampler_matches_the_pmf(sigma):
    bound = truncation_bound(sigma)
    num = 200_000
    draws = discrete_gaussian_law(sigma, bound).sample(random_bits(np.random.default_rng(11)), num) - bound
    pmf = dg_pmf(sigma, bound)
    seen = np.bincount(draws + bound, minlength=2 * bound + 1) / num
    z = z_bound(2 * bound + 1)
    assert np.all(np.abs(seen - pmf) <= z * np.sqrt(pmf * (1 - pmf) / num) + 1e-12)
    assert abs(draws.mean()) <= z * math.sqrt((pmf * np.arange(-bound, bound + 1) ** 2).sum() / num)


@pytest.mark.parametrize("path", ["batch", "call"])
@pytest.mark.parametrize("mech", [GaussianNoisyArgMax(1.0, vocab_size=5),
                                  GaussianThresholdArgMax(1.2, vocab_size=5, threshold=4)], ids=repr)
def test_sampler_matches_the_exact_law(mech, path):
    for i, hist in enumerate([CountHistogram([0, 3], [4, 3], num_teachers=8), CountHistogram([1], [1])]):
        check_sampler_matches_law(mech, hist, 20_000 if path == "batch" else 3_000, seed=40 + i, path=path)


def test_large_vocabulary_sampler_matches_the_law_on_the_top_token():
    """1,000 tokens, most without a vote: the top token's win frequency against its exact probability."""
    mech = GaussianNoisyArgMax(2.0, vocab_size=1000)
    hist = CountHistogram([7, 500], [9, 6], num_teachers=20)
    law = mech.output_distribution(hist)
    num = 4000
    values = mech.run_batch([hist] * num, np.random.default_rng(5)).values
    z = z_bound(2)
    for token in (7, 500):
        p = law.probability(token)
        assert abs((values == token).mean() - p) <= z * math.sqrt(p * (1 - p) / num)
    zero_share = 1 - law.probability(7) - law.probability(500)
    assert zero_share > 0.01  # the zero-vote tokens do win sometimes
    counts = {int(t): int(c) for t, c in zip(*np.unique(values, return_counts=True))}
    check_counts_match_law(counts, law.as_dict())


@pytest.mark.parametrize("mech", [GaussianNoisyArgMax(6.0, vocab_size=49_152),
                                  GaussianThresholdArgMax(6.0, vocab_size=49_152, threshold=32)], ids=repr)
def test_sampler_matches_the_law_on_a_large_vocabulary(mech):
    """49,152 tokens (SmolLM2's vocabulary): 1,000 runs at a fixed seed against the exact law by chi-square
    (check_counts_match_law, significance 1e-6; the zero-vote tokens, each rare, pooled into one bin that the
    law gives about 4 % without a threshold)."""
    hist = CountHistogram([7, 1000, 30_000, 49_151], [30, 28, 26, 20], num_teachers=110)
    check_sampler_matches_law(mech, hist, 1_000, seed=23)


def test_seeded_runs_are_reproducible_and_none_uses_the_os():
    mech = GaussianNoisyArgMax(1.0, vocab_size=50)
    hist = CountHistogram([3], [2], num_teachers=4)
    a = [mech(hist, rng=np.random.default_rng(3)).value for _ in range(3)]
    b = [mech(hist, rng=np.random.default_rng(3)).value for _ in range(3)]
    assert a == b
    assert 0 <= mech(hist).value < 50
    # the vocabulary may come from the histogram
    assert 0 <= GaussianNoisyArgMax(1.0)(CountHistogram([3], [2], vocab_size=8)).value < 8


# --- bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"sigma": -1.0}, r"sigma must be in \[0.1, 10000.0\], got -1.0"),
    ({"sigma": float("nan")}, "sigma must be in .* got nan"),
    ({"sigma": 1.0, "vocab_size": 0}, "vocab_size must be >= 1, got 0"),
    ({"sigma": 1.0, "relation": "swap"}, "relation must be one of .* got 'swap'"),
    ({"sigma": 1.0, "epsilon": -2.0}, "epsilon"),
    ({"sigma": 0.1}, "sigma 0.1 gives delta 1 at epsilon 1.0"),
])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GaussianNoisyArgMax(**kwargs)


def test_bad_histograms_and_budgets_are_refused():
    with pytest.raises(ValueError, match="token id 5 is outside the vocabulary of size 3"):
        GaussianNoisyArgMax(1.0, vocab_size=3)({5: 1})
    with pytest.raises(ValueError, match="vocab_size must be given to the mechanism or the histogram .* neither has it"):
        GaussianNoisyArgMax(1.0)(CountHistogram([0], [1]))
    with pytest.raises(ValueError, match="token id 5000 is outside the vocabulary of size 5000"):
        GaussianNoisyArgMax(1.0, vocab_size=5000).output_distribution({5000: 1})
    with pytest.raises(ValueError, match="delta"):
        calibrate_sigma(1.0, 0.0)
    with pytest.raises(TypeError, match="threshold must be an integer, got float"):
        GaussianThresholdArgMax(1.0, vocab_size=3, threshold=2.5)


def test_a_hand_built_event_may_not_claim_more_than_its_noise_gives():
    """Issue 22, item 1, for GNMax: the basic accountant charges an event's stated (epsilon, delta), so a
    ``DiscreteGaussianArgMaxEvent`` stating less than its own sigma gives is refused, with the accountant's state
    unchanged; the mechanism's own event, calibrated on the same curve, is accepted."""
    honest = GaussianNoisyArgMax.calibrated(1.0, 1e-6).event
    accountant = BasicCompositionAccountant(budget=(10.0, 1e-3))
    accountant.compose(honest)
    before = accountant.spent()
    forged = DiscreteGaussianArgMaxEvent(epsilon=0.01, delta=1e-9, sigma=honest.sigma,
                                         truncation_bound=honest.truncation_bound, relation=honest.relation)
    with pytest.raises(ValueError, match="claims more privacy than its mechanism has"):
        accountant.compose(forged)
    assert accountant.spent() == before
    # One count moves under add-remove-one (two under replace-one): the same noise states the replace-one
    # guarantee truthfully there too (a looser claim), and is accepted.
    looser = DiscreteGaussianArgMaxEvent(epsilon=honest.epsilon, delta=honest.delta, sigma=honest.sigma,
                                         truncation_bound=honest.truncation_bound, relation=ADD_REMOVE_ONE)
    other = BasicCompositionAccountant(budget=(10.0, 1e-3))
    other.compose(looser)
    assert other.spent() == before
