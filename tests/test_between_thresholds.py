"""BetweenThresholds on a count with discrete Laplace noise, and the q-target certificate of its ``between``
outcome (docs/mechanisms/between_thresholds.md)."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exact_enumeration import GeometricBranching, enumerate_law
from mechanisms import OutcomeDistribution, as_batch
from mechanisms.between_thresholds import (
    ABOVE,
    BELOW,
    BETWEEN,
    OUTCOME_LABELS,
    SCAN_WINDOW,
    BetweenThresholds,
    between_thresholds_q,
    certify_q,
    continuous_q,
    discrete_laplace_cdf,
    discrete_laplace_pmf,
    discrete_laplace_sf,
    outcome_table,
    sample_discrete_laplace,
)
from mechanisms.qtarget import q_star, q_target_decomposition
from mechanisms.testing import check_counts_match_law, check_privacy_claim
from pate_accountant import Release
from pate_accountant.events import ADD_REMOVE_ONE, BetweenThresholdsEvent

P_VALUE_FLOOR = 1e-4


# --- the discrete Laplace law ----------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.05, 0.5, 2.0])
def test_discrete_laplace_pmf_cdf_sf_agree(eps):
    x = np.arange(-int(60 / eps), int(60 / eps) + 1)
    pmf = discrete_laplace_pmf(x, eps)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(np.cumsum(pmf), discrete_laplace_cdf(x, eps), rtol=0, atol=1e-12)
    assert np.allclose(discrete_laplace_sf(x, eps), discrete_laplace_cdf(-x, eps), rtol=0, atol=0)
    assert np.allclose(discrete_laplace_sf(x, eps), 1 - np.cumsum(pmf) + pmf, rtol=0, atol=1e-12)
    # Neighbouring ratios of the pmf are exactly e^eps away from 0.
    assert np.allclose(pmf[1:] / pmf[:-1], np.where(x[1:] <= 0, math.exp(eps), math.exp(-eps)), rtol=1e-12)


def test_discrete_laplace_sampler_is_exact_in_law():
    eps, n = 0.7, 200_000
    z = sample_discrete_laplace(eps, np.random.default_rng(11), size=n)
    assert z.dtype.kind == "i"
    edges = np.arange(-6, 7)
    observed = np.array([(z < -6).sum()] + [(z == k).sum() for k in edges] + [(z > 6).sum()])
    pmf = discrete_laplace_pmf(edges, eps)
    expected_p = np.concatenate([[discrete_laplace_cdf(-7, eps)], pmf, [discrete_laplace_sf(7, eps)]])
    assert expected_p.sum() == pytest.approx(1.0)
    check_counts_match_law(dict(enumerate(observed)), dict(enumerate(expected_p)), alpha=P_VALUE_FLOOR)


# --- exact outcome probabilities -------------------------------------------------------------------
def brute_force_outcomes(c, eps, low, high, width=4000):
    z = np.arange(-width, width + 1)
    pmf = discrete_laplace_pmf(z, eps)
    noisy = c + z
    return np.array([pmf[noisy < low].sum(), pmf[(noisy >= low) & (noisy <= high)].sum(), pmf[noisy > high].sum()])


@pytest.mark.parametrize("eps, low, high", [(0.5, 10, 14), (0.1, 30, 60), (1.0, 5, 7), (2.0, 3, 4)])
def test_outcome_probabilities_match_summed_noise(eps, low, high):
    mech = BetweenThresholds(eps, low, high)
    counts = np.arange(0, high + int(8 / eps) + 5)
    table = mech.outcome_table(counts)
    assert table.shape == (counts.size, 3)
    assert np.allclose(table.sum(axis=1), 1.0, atol=1e-14)
    for c in counts:
        exact = mech.outcome_probabilities(int(c))
        assert exact == pytest.approx(tuple(table[c]), rel=1e-14, abs=0)
        assert np.allclose(exact, brute_force_outcomes(int(c), eps, low, high), rtol=0, atol=1e-12)
    # The module-level table is the same function.
    assert np.array_equal(outcome_table(counts, eps, low, high), table)


@pytest.mark.parametrize("eps, low, high", [(0.1, 20, 40), (0.5, 10, 14), (1.0, 5, 8), (2.0, 3, 4), (0.02, 100, 200)])
def test_each_query_is_exactly_epsilon_dp(eps, low, high):
    # Every outcome's log-probability moves by at most eps when the count moves by one, and the bound
    # is reached (below the interval "between" and "above" move by exactly e^eps).
    mech = BetweenThresholds(eps, low, high)
    counts = np.arange(0, high + int(30 / eps))
    table = mech.outcome_table(counts)
    assert (table > 0).all()
    log_ratio = np.abs(np.diff(np.log(table), axis=0))
    assert log_ratio.max() <= eps + 1e-12
    assert log_ratio.max() == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("eps, low, high", [(0.5, 10, 14), (1.0, 5, 8), (2.0, 3, 4), (0.1, 20, 40)])
def test_exact_sampler_law_is_exactly_epsilon_dp(eps, low, high):
    # The law of the label is computed from the single-query sampler's own code: the discrete Laplace
    # draw is a geometric magnitude (one choice with weight (1 - q) q^g, q standing for e^-eps; the tail
    # beyond the thresholds is one representative value) and a fair sign, a rejected sign is a fresh
    # round.  In exact rational arithmetic, every ratio between neighbouring counts is at most 1/q, the
    # bound is reached, and the law is the closed form of outcome_probabilities.
    q = Fraction(math.exp(-eps))
    g_max = high - low + 12

    def law(count):
        raw, unfinished, restart = enumerate_law(
            lambda prefix: GeometricBranching(prefix, 4, q, g_max, "value"),
            lambda source: BetweenThresholds(eps, low, high)(count, rng=source).value,
        )
        assert unfinished == 0
        return {label: raw.get(label, Fraction(0)) / (1 - restart) for label in OUTCOME_LABELS}

    laws = {c: law(c) for c in range(max(0, low - 5), high + 6)}
    worst = Fraction(0)
    for c in list(laws)[:-1]:
        for label in OUTCOME_LABELS:
            a, b = laws[c][label], laws[c + 1][label]
            assert a > 0 and b > 0
            assert a * q <= b and b * q <= a  # both directions, exactly
            worst = max(worst, a / b, b / a)
        assert sum(laws[c].values()) == 1
    assert worst == 1 / q  # the bound e^eps is attained
    for c, probs in laws.items():
        closed = BetweenThresholds(eps, low, high).outcome_probabilities(c)
        assert [float(probs[label]) for label in OUTCOME_LABELS] == pytest.approx(closed, rel=1e-12)


def test_event_and_relation():
    mech = BetweenThresholds(0.5, 10, 14)
    assert mech.event == BetweenThresholdsEvent(0.5, mech.q)
    assert mech.event.relation == "replace-one"
    other = BetweenThresholds(0.5, 10, 14, relation=ADD_REMOVE_ONE)
    assert other.event.relation == ADD_REMOVE_ONE and other.q == mech.q


# --- sampling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [8, 10, 12, 15, 19])
def test_batch_frequencies_match_exact_probabilities(count):
    mech = BetweenThresholds(0.5, 10, 14)
    n = 60_000
    out = mech.run_batch(np.full(n, count), rng=np.random.default_rng(count))
    assert np.array_equal(out.target_hit, out.values == BETWEEN)
    assert out.event == mech.event and len(out) == n
    observed = dict(enumerate(np.bincount(out.values, minlength=3)))
    check_counts_match_law(observed, dict(enumerate(mech.outcome_probabilities(count))), alpha=P_VALUE_FLOOR)


def test_single_calls_match_exact_probabilities():
    mech = BetweenThresholds(0.5, 10, 14)
    rng = np.random.default_rng(5)
    n = 3000
    labels = [mech(11, rng=rng) for _ in range(n)]
    observed = {name: sum(r.value == name for r in labels) for name in OUTCOME_LABELS}
    check_counts_match_law(observed, dict(zip(OUTCOME_LABELS, mech.outcome_probabilities(11))), alpha=P_VALUE_FLOOR)
    assert all(r.target_hit == (r.value == "between") for r in labels)


def test_thresholding_a_noisy_count_has_the_same_law():
    # Drawing Z and thresholding c + Z gives the law that run() samples from directly.
    eps, low, high, c, n = 0.3, 20, 30, 18, 100_000
    z = sample_discrete_laplace(eps, np.random.default_rng(3), size=n)
    noisy = c + z
    observed = [(noisy < low).sum(), ((noisy >= low) & (noisy <= high)).sum(), (noisy > high).sum()]
    expected = BetweenThresholds(eps, low, high).outcome_probabilities(c)
    check_counts_match_law(dict(enumerate(observed)), dict(enumerate(expected)), alpha=P_VALUE_FLOOR)


def test_call_api_count_or_histogram():
    mech = BetweenThresholds(1.0, 4, 6)
    r = mech(5, rng=np.random.default_rng(0))
    assert isinstance(r, Release) and r.value in OUTCOME_LABELS and r.event == mech.event
    assert r.target_hit == (r.value == "between")
    # A histogram plus a token reads that token's count: same uniform, same outcome as the count itself.
    for seed in range(20):
        direct = mech(5, rng=np.random.default_rng(seed)).value
        assert mech({2: 5, 7: 1}, token=2, rng=np.random.default_rng(seed)).value == direct
        assert mech(np.array([0, 0, 5]), token=2, rng=np.random.default_rng(seed)).value == direct
    # The between outcome is the target (the ledger's "target" class), below is its own class (nothing
    # released), above releases the candidate ("token").
    runs = [mech(c, rng=np.random.default_rng(s)) for s in range(40) for c in (0, 5, 11)]
    assert {r.value for r in runs} == set(OUTCOME_LABELS)
    for r in runs:
        assert r.outcome == {"between": "target", "below": "below", "above": "token"}[r.value]


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (({1: 3},), {}, ValueError, "token is required"),
        ((3,), {"token": 1}, ValueError, "token is only used with a histogram"),
        ((-1,), {}, ValueError, "count must be >= 0, got -1"),
        ((2.5,), {}, TypeError, "count must be an integer, got 2.5"),
        ((True,), {}, TypeError, "count must be an integer"),
        (("abc",), {"token": 1}, TypeError, "histogram must be"),
        (({1: 3},), {"token": -2}, ValueError, "token must be >= 0"),
    ],
)
def test_call_rejects_bad_inputs(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        BetweenThresholds(1.0, 4, 6)(*args, rng=np.random.default_rng(0), **kwargs)


def test_run_batch_on_histograms_with_token():
    mech = BetweenThresholds(0.5, 10, 14)
    hists = np.array([[12, 0, 0, 1], [0, 0, 0, 9], [14, 0, 0, 0], [0, 0, 0, 0]])  # rows are histograms
    counts = np.array([12, 0, 14, 0])
    by_token = mech.run_batch(hists, rng=np.random.default_rng(9), token=0)
    by_count = mech.run_batch(counts, rng=np.random.default_rng(9))
    assert np.array_equal(by_token.values, by_count.values)
    assert np.array_equal(by_token.target_hit, by_token.values == BETWEEN)
    with pytest.raises(ValueError, match="non-negative"):
        mech.run_batch(np.array([1, -1]), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="1-d"):
        mech.run_batch(np.zeros((2, 2), dtype=int), rng=np.random.default_rng(0))


def test_output_distribution_uses_outcome_codes():
    mech = BetweenThresholds(0.5, 10, 14)
    dist = mech.output_distribution({4: 12}, token=4)
    assert isinstance(dist, OutcomeDistribution) and dist.fail == 0.0
    assert list(dist.tokens) == [BELOW, BETWEEN, ABOVE]
    assert tuple(dist.probabilities) == mech.outcome_probabilities(12)


def test_the_query_on_one_token_is_a_histogram_mechanism():
    mech = BetweenThresholds(0.5, 2, 6)
    query = mech.on_token(1)
    assert query.event == mech.event and query.privacy_claim() == mech.privacy_claim()
    claim = mech.privacy_claim()
    assert (claim.epsilon, claim.delta, claim.relation) == (0.5, 0.0, "replace-one")
    assert (claim.target.outcome, claim.target.epsilon, claim.target.q) == (BETWEEN, 0.5, mech.q)
    with pytest.raises(ValueError, match="claims nothing under relation 'add-remove-one'"):
        mech.privacy_claim("add-remove-one")
    hist = {1: 4, 3: 2}
    for seed in range(20):  # the same draw, the same release as the query on token 1
        run = query(hist, rng=np.random.default_rng(seed))
        assert run == mech(hist, token=1, rng=np.random.default_rng(seed))
        assert OUTCOME_LABELS[query.outcome_code(run.value)] == run.value
    assert query.output_distribution(hist).as_dict() == mech.output_distribution(4).as_dict()
    batch = as_batch([hist, {}], num_teachers=6)
    sample, codes, probs = query.batch_distributions(batch)
    assert sample.tolist() == [0, 0, 0, 1, 1, 1] and codes.tolist() == [BELOW, BETWEEN, ABOVE] * 2
    assert probs.tolist() == list(mech.outcome_probabilities(4)) + list(mech.outcome_probabilities(0))
    assert np.array_equal(mech.batch_distributions(batch, token=1)[2], probs)
    with pytest.raises(ValueError, match="token is required"):
        mech.batch_distributions([hist])
    batch = query.run_batch([hist] * 5, rng=np.random.default_rng(3))
    assert np.array_equal(batch.values, mech.run_batch([hist] * 5, rng=np.random.default_rng(3), token=1).values)
    # Its claim, pure epsilon with `between` a q-target, holds on every neighbouring pair of small histograms.
    (report,) = check_privacy_claim(query)
    assert report.worst_delta <= 1e-12 and report.worst_q == pytest.approx(mech.q, rel=1e-9)


# --- the gap requirement and validation ------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((0.1, 0, 10), {}, ValueError, r"gap high - low = 10 is too small for epsilon=0.1.*>= 2.0 / epsilon = 20"),
        ((1.0, 5, 6), {}, ValueError, "too small for epsilon=1.0"),
        ((1.0, 6, 6), {}, ValueError, "low must be < high, got low=6, high=6"),
        ((1.0, 9, 3), {}, ValueError, "low must be < high, got low=9, high=3"),
        ((0.0, 0, 10), {}, ValueError, "epsilon must be > 0.0, got 0.0"),
        ((-1.0, 0, 10), {}, ValueError, "epsilon must be > 0.0"),
        ((float("inf"), 0, 10), {}, ValueError, "epsilon must be finite"),
        (("1", 0, 10), {}, TypeError, "epsilon must be a real number"),
        ((1.0, 0.5, 10), {}, TypeError, "low must be an integer, got 0.5"),
        ((1.0, 0, True), {}, TypeError, "high must be an integer"),
        ((1.0, 0, 10), {"relation": "swap"}, ValueError, "relation must be one of"),
    ],
)
def test_bad_parameters_are_rejected(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        BetweenThresholds(*args, **kwargs)


def test_gap_exactly_at_the_requirement_is_accepted():
    assert BetweenThresholds.MIN_GAP_EPSILON == 2.0
    for eps, gap in [(0.1, 20), (0.5, 4), (1.0, 2), (2.0, 1), (0.01, 200)]:
        BetweenThresholds(eps, 0, gap)


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.005, 5.0), extra=st.integers(0, 50), low=st.integers(-20, 500))
def test_gap_requirement_guarantees_a_fraction_of_the_limit(eps, extra, low):
    gap = math.ceil(BetweenThresholds.MIN_GAP_EPSILON / eps) + extra
    mech = BetweenThresholds(eps, low, low + gap)
    limit = 1 / (1 + math.exp(eps))
    assert mech.q >= (1 - math.exp(-2)) * limit
    assert mech.q <= limit
    assert 0 < mech.event.q < 1


# --- the q-target: certified value, closed form and the continuous formula -------------------------
#: (epsilon, gap, the continuous q_BT at that gap to six decimals), computed once from the closed form.
REFERENCE_Q = [
    (0.1, 10, 0.300270),
    (0.1, 20, 0.410734),
    (0.1, 30, 0.451371),
    (0.5, 6, 0.358744),
    (1.0, 3, 0.255552),
    (0.01, 300, 0.472731),
]


@pytest.mark.parametrize("eps, gap, reference_q", REFERENCE_Q)
def test_discrete_q_is_the_continuous_formula_at_gap_plus_one(eps, gap, reference_q):
    assert continuous_q(eps, gap) == pytest.approx(reference_q, abs=5e-7)
    exact = between_thresholds_q(eps, gap)
    assert exact == pytest.approx(continuous_q(eps, gap + 1), rel=1e-14)
    assert exact > continuous_q(eps, gap)
    # The certifier on its window finds exactly this value ...
    assert certify_q(eps, 0, gap) == pytest.approx(exact, rel=1e-12)
    # ... and so does a scan over every pair in a wide range, anywhere on the integer line.
    span = int(10 / eps)
    wide = np.arange(-span, gap + span)
    assert certify_q(eps, 0, gap, counts=wide) == pytest.approx(exact, rel=1e-9)
    assert certify_q(eps, 1000, 1000 + gap, counts=wide + 1000) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("eps, low, high", [(0.5, 10, 14), (1.0, 3, 6), (0.1, 0, 25), (0.002, 50, 1050)])
def test_event_q_is_what_the_certifier_gives(eps, low, high):
    mech = BetweenThresholds(eps, low, high)
    assert mech.event.q == pytest.approx(certify_q(eps, low, high), rel=1e-12)
    assert mech.event.q == pytest.approx(between_thresholds_q(eps, high - low), rel=1e-12)
    assert mech.event.q <= between_thresholds_q(eps, high - low)


@pytest.mark.parametrize("eps, low, high", [(0.5, 10, 14), (1.0, 3, 6), (0.1, 0, 25)])
def test_certifier_decomposition_is_valid(eps, low, high):
    # Re-derive B0, B1 for every neighbouring pair near and between the thresholds: they reproduce the
    # two output laws with the shared part, are eps-indistinguishable and put >= q on "between".
    mech = BetweenThresholds(eps, low, high)
    e = math.exp(eps)
    for c in range(max(0, low - int(6 / eps)), high + int(6 / eps)):
        p0, p1 = np.array(mech.outcome_probabilities(c)), np.array(mech.outcome_probabilities(c + 1))
        for a, b in ((p0, p1), (p1, p0)):
            dec = q_target_decomposition(a, b, eps, BETWEEN)
            assert dec.q == pytest.approx(q_star(a, b, eps, BETWEEN), rel=1e-12)
            assert dec.q >= mech.q * (1 - 1e-9)
            for part in (dec.b0, dec.b1):
                assert part.sum() == pytest.approx(1.0, abs=1e-9) and (part >= 0).all()
                assert part[BETWEEN] >= mech.q * (1 - 1e-9)
            assert np.all(np.maximum(dec.b0, dec.b1) <= e * np.minimum(dec.b0, dec.b1) * (1 + 1e-9))
            common = dec.common if dec.common is not None else np.zeros(3)
            assert np.allclose(dec.shared * common + (1 - dec.shared) * dec.b0, a, atol=1e-12)
            assert np.allclose(dec.shared * common + (1 - dec.shared) * dec.b1, b, atol=1e-12)
        # An unchanged count is a free pair: q = 1.
        assert q_star(p0, p0, eps, BETWEEN) == 1.0


# Exact arithmetic: with r = e^{-eps} rational every quantity is rational, so the claims "the certifier's
# value is the same for every pair outside the interval" and "the minimum over all pairs is
# r (1 - r^{g+1}) / (1 + r)" can be checked with no rounding at all.
def exact_outcomes(c, r, low, high):
    def sf(k):  # P[Z >= k]
        return r**k / (1 + r) if k >= 1 else 1 - r ** (1 - k) / (1 + r)

    below = 1 - sf(low - c)
    above = sf(high - c + 1)
    return [below, 1 - below - above, above]


def exact_q(p0, p1, e, t):
    if any(max(x, y) > e * min(x, y) for x, y in zip(p0, p1)):
        return Fraction(0)
    u = p0[t] + sum(abs(p0[y] - p1[y]) * (e if p0[y] > p1[y] else 1) / (e - 1) for y in range(3) if y != t)
    return min(p0[t], p1[t]) / u


@pytest.mark.parametrize(
    "r, gap", [(Fraction(9, 10), 3), (Fraction(1, 2), 2), (Fraction(99, 100), 12), (Fraction(2, 3), 5)]
)
def test_discrete_q_exactly_in_rational_arithmetic(r, gap):
    e = 1 / r
    low, high = 40, 40 + gap
    closed = r * (1 - r ** (gap + 1)) / (1 + r)
    values = {}
    for c in range(0, high + 40):
        p0, p1 = exact_outcomes(c, r, low, high), exact_outcomes(c + 1, r, low, high)
        assert sum(p0) == 1
        values[c] = exact_q(p0, p1, e, BETWEEN)
        assert exact_q(p1, p0, e, BETWEEN) == values[c]
    assert min(values.values()) == closed
    # Outside the interval the ratios are fixed, so every pair gives exactly the closed form ...
    assert all(values[c] == closed for c in values if c + 1 <= low or c >= high)
    # ... inside, nothing can be shared and q is the smaller "between" probability, > closed / r * r.
    for c in range(low, high):
        between = min(exact_outcomes(c, r, low, high)[1], exact_outcomes(c + 1, r, low, high)[1])
        assert values[c] == between and between >= closed / r


def test_certifier_window_covers_large_gaps():
    # A gap far wider than the window: the window value still equals the closed form and a full scan.
    eps, gap = 0.01, 5 * SCAN_WINDOW + 300
    full = certify_q(eps, 0, gap, counts=np.arange(-1, gap + 1))
    assert certify_q(eps, 0, gap) == pytest.approx(full, rel=1e-12)
    assert full == pytest.approx(between_thresholds_q(eps, gap), rel=1e-12)
