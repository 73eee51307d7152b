"""DPWeightedSampling: LWS_L / DPWS (paper Algorithm 3, Lemma E.2, Corollary DPWS).

What each group of tests proves:
* reference vectors of the keep probability ``r(c) = pi*(c) / p(c)``: the ``pi*`` recursion with the cap
  ``min(1, c/n)`` (per key), including the exact interval where ``r = 1``;
* exact privacy: on every small histogram and every replace-one neighbour, the hockey-stick divergence of
  the *included set* and of the *final outcome* is at most ``delta`` at ``epsilon``; with ``release_counts``
  the per-key and joint (set, noisy counts) laws obey the doubled charge;
* add/remove-one (``n`` changes, and with it every rate ``c/n``) is refused: the per-count calibration is
  broken there, exactly (the n = 40 pair of the soundness review);
* exactness: ``output_distribution`` (dynamic program) = ``batch_distributions`` (quadrature) = enumeration of
  every included set; ``__call__`` and ``run_batch`` draws follow it (chi-square);
* utility: full retention on ``[2L, n - 2/epsilon]``, the exact upper end, relevance ``P[j] <= c_j/n``,
  sanitised counts within ``L``;
* Lemma E.2 (diversity preservation, ``tau = 4L``, ``beta = ln(2)/16``, ``gamma = 1``) by Monte Carlo on
  coordinated histograms.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import z_bound
from ensembles import batch_from_votes, coordinated_votes
from ensembles.synthetic import disjoint_groups
from mechanisms import FAIL_VALUE, BatchRelease, HistogramBatch, as_histogram
from mechanisms.audit import hockey_stick, neighbouring_pairs, small_histograms
from mechanisms.geometric import TruncatedGeometric, delta_effective, optimal_inclusion, truncation
from mechanisms import weighted_sampling
from mechanisms.weighted_sampling import DPWeightedSampling, inclusion_table, uniform_survivor_probabilities
from mechanisms.testing import check_counts_match_law
from pate_accountant import Release
from pate_accountant.events import WeightedSamplingEvent

REPLACE, ADD_REMOVE = "replace-one", "add-remove-one"


# --- reference vectors: the keep probability with p(c) = min(1, c/n), per key ---------------------------
def keep(n, epsilon, delta):
    cap = np.minimum(1.0, np.arange(n + 1) / n)
    pi = optimal_inclusion(cap, epsilon, delta)
    r = np.zeros(n + 1)
    r[1:] = pi[1:] / cap[1:]
    return r


@pytest.mark.parametrize(
    "n, epsilon, delta, lo, hi, r1, rn",
    [
        (1000, 1.0, 1e-6, 10, 999, 1.0e-3, 0.9996325),
        (1000, 0.5, 5e-7, 21, 998, 5.0e-4, 0.9992647),
        (5000, 0.1, 1e-6, 74, 4990, 5.0e-3, 0.9992703),
    ],
)
def test_keep_probability_reference_vectors(n, epsilon, delta, lo, hi, r1, rn):
    """Per count ``(epsilon, delta)`` and ``n``: ``r = 1`` exactly on ``[lo, hi]``, ``r(1)`` and ``r(n)``
    (reference values computed once from the recursion, to the digits shown)."""
    r = keep(n, epsilon, delta)
    ones = np.flatnonzero(r == 1.0)
    assert ones[0] == lo and ones[-1] == hi and ones.size == hi - lo + 1  # exactly [lo, hi]
    assert r[1] == pytest.approx(r1, rel=1e-9)
    assert r[n] == pytest.approx(rn, abs=5e-8)
    # The cached table the mechanism uses is the same function.
    assert np.array_equal(inclusion_table(n, epsilon, delta), optimal_inclusion(np.minimum(1, np.arange(n + 1) / n), epsilon, delta))


def test_keep_probability_just_below_full_retention():
    """At per count (0.5, 5e-7), n = 1000, r = 1 starts at c = 21; one count earlier r(20) = 0.8488031."""
    assert keep(1000, 0.5, 5e-7)[20] == pytest.approx(0.8488031, abs=5e-8)


def test_mechanism_uses_half_budget_per_count_under_replace_one():
    # Total (1, 1e-6) replace-one runs every count at (0.5, 5e-7) (two counts change): the second reference
    # row above, and L = truncation(0.5, 5e-7) = 27.
    mech = DPWeightedSampling(1.0, 1e-6)
    assert mech.per_count == (0.5, 5e-7)
    assert mech.error_bound == 27
    assert np.array_equal(mech.keep_probabilities(1000), keep(1000, 0.5, 5e-7))
    per_count_whole = DPWeightedSampling(2.0, 2e-6)  # per count (1, 1e-6): the paper's L = 14
    assert per_count_whole.per_count == (1.0, 1e-6) and per_count_whole.error_bound == 14
    assert np.array_equal(per_count_whole.keep_probabilities(1000), keep(1000, 1.0, 1e-6))


def test_add_remove_one_is_refused_because_the_rates_move_with_n():
    """Under add/remove-one a teacher and its vote join: one count moves by one *and* n moves by one, so every
    token's rate c/n moves.  Calibrated per count at (1, 1e-6) (the reading that only one count changes),
    the pair {12, 28} (n = 40) / {13, 28} (n = 41) needs delta 2.2e-3 at epsilon 1: 2000 times the claim."""
    per_count = DPWeightedSampling(2.0, 2e-6)  # replace-one: every count at (1, 1e-6)
    first = per_count.output_distribution({0: 12, 1: 28}, num_teachers=40).as_dict()
    second = per_count.output_distribution({0: 13, 1: 28}, num_teachers=41).as_dict()
    delta = hockey_stick(first, second, 1.0)
    assert delta == pytest.approx(2.1986e-3, rel=1e-3) and delta > 1000 * 1e-6
    with pytest.raises(ValueError, match="relation must be 'replace-one' for DPWeightedSampling, got 'add-remove-one'"):
        DPWeightedSampling(1.0, 1e-6, ADD_REMOVE)
    with pytest.raises(ValueError, match="got 'add-remove-one'"):
        DPWeightedSampling(1.0, 1e-6, relation=ADD_REMOVE, release_counts=True)


def test_tail_votes_count_towards_n():
    mech = DPWeightedSampling(2.0, 0.2)
    # 5 votes for token 0 out of n = 10 teachers: sampling rate 1/2, not 1.
    dist = mech.output_distribution({0: 5}, num_teachers=10)
    assert dist.probability(0) == pytest.approx(mech.inclusion_probabilities(10)[5]) and dist.probability(0) <= 0.5
    assert mech.output_distribution(as_histogram([0, 0]), num_teachers=3).fail == 1.0
    assert mech.output_distribution({}, num_teachers=0).fail == 1.0


# --- exact privacy on small histograms ----------------------------------------------------------------
MASKS = {k: np.array(list(itertools.product([False, True], repeat=k)), dtype=bool) for k in range(1, 6)}


def set_law(pi):
    """Probability of every included set (rows of MASKS[k])."""
    masks = MASKS[pi.size]
    return np.prod(np.where(masks, pi, 1.0 - pi), axis=1)


def outcome_law(pi):
    """(P[token 0], ..., P[token k-1], P[fail]) by summing over included sets."""
    masks = MASKS[pi.size]
    law = set_law(pi)
    size = masks.sum(axis=1)
    share = np.where(size > 0, law / np.maximum(size, 1), 0.0)
    return np.append(masks.T.astype(float) @ share, law[size == 0].sum())


PRIVACY_CASES = [
    # (total epsilon, total delta, relation, max n, tokens): large deltas so that every branch of the
    # recursion (cap, multiplicative, complement) binds at these tiny n.
    (1.0, 0.1, REPLACE, 7, 3),
    (2.0, 0.2, REPLACE, 7, 3),
    (0.5, 0.05, REPLACE, 6, 3),
    (2.0, 0.02, REPLACE, 5, 4),
    (0.6, 0.6, REPLACE, 7, 3),
]


@pytest.mark.parametrize("epsilon, delta, relation, max_n, k", PRIVACY_CASES)
def test_exact_privacy_of_included_set_and_outcome(epsilon, delta, relation, max_n, k):
    """Every histogram of 1 to ``max_n`` teachers over ``k`` tokens plus tail, and every replace-one pair of
    them: the law of the included set (each token in independently with pi*(c)), and the outcome law
    enumerated from it, which is the mechanism's exact output distribution."""
    mech = DPWeightedSampling(epsilon, delta, relation)
    for hist in small_histograms(max_n, k, min_teachers=1):
        law_out = outcome_law(mech.inclusion_probabilities(hist.num_teachers)[hist.to_dense(k)])
        dist = mech.output_distribution(hist)
        for j in range(k):
            assert dist.probability(j) == pytest.approx(law_out[j], rel=1e-12, abs=1e-15)
        assert dist.fail == pytest.approx(law_out[-1], rel=1e-12, abs=1e-15)
    worst_set = worst_outcome = 0.0
    pairs = neighbouring_pairs(max_n, k, relation, min_teachers=1)
    for first, second in pairs:
        table = mech.inclusion_probabilities(first.num_teachers)
        pi, pi2 = table[first.to_dense(k)], table[second.to_dense(k)]
        d_set = hockey_stick(set_law(pi), set_law(pi2), epsilon)
        d_out = hockey_stick(outcome_law(pi), outcome_law(pi2), epsilon)
        assert d_out <= d_set + 1e-15  # post-processing
        assert d_set <= delta * (1 + 1e-9) + 1e-15, (first, second, d_set)
        worst_set, worst_outcome = max(worst_set, d_set), max(worst_outcome, d_out)
    assert len(pairs) > 200
    # Not vacuous: some neighbouring pair uses at least a third of delta.
    assert worst_set >= delta / 3


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-6), (0.1, 1e-6), (2.0, 1e-3), (0.5, 0.05)])
@pytest.mark.parametrize("n", [1, 2, 10, 1000])
def test_per_count_inclusion_is_dp_and_tight(epsilon, delta, n):
    """Bernoulli(pi*(c)) vs Bernoulli(pi*(c+1)) for every c: within (eps_c, delta_c); the first step from 0 is tight."""
    mech = DPWeightedSampling(epsilon, delta)
    eps_c, delta_c = mech.per_count
    pi = mech.inclusion_probabilities(n)
    law = np.stack([pi, 1 - pi], axis=1)
    worst = max(hockey_stick(law[c], law[c + 1], eps_c) for c in range(n))
    assert worst <= delta_c * (1 + 1e-9)
    assert pi[1] == pytest.approx(min(1.0 / n, delta_c))  # 0 -> 1 vote: the whole delta_c (or the cap)


# --- sanitised counts: the charge is doubled ---------------------------------------------------------
def keyed_law(c, pi, noise, L, grid):
    """Law of one key's output: index 0 = not included, index 1 + (v + L) = included with noisy count v."""
    out = np.zeros(grid + 1)
    out[0] = 1.0 - pi[c]
    if c > 0:
        out[1 + c : 1 + c + 2 * L + 1] = pi[c] * noise.pmf(np.arange(-L, L + 1))
    return out


@pytest.mark.parametrize("epsilon, delta, relation", [(2.0, 0.2, REPLACE), (2.0, 0.1, REPLACE), (1.0, 1e-6, REPLACE)])
def test_noisy_counts_cost_per_key(epsilon, delta, relation):
    mech = DPWeightedSampling(epsilon, delta, relation, release_counts=True)
    eps_c, delta_c = mech.per_count
    L = mech.error_bound
    assert L == truncation(eps_c, delta_c) and delta_effective(eps_c, L) <= delta_c
    noise = TruncatedGeometric(eps_c, L)
    n = 60
    pi = mech.inclusion_probabilities(n)
    grid = n + 2 * L + 1
    laws = [keyed_law(c, pi, noise, L, grid) for c in range(n + 1)]
    per_key = max(hockey_stick(laws[c], laws[c + 1], 2 * eps_c) for c in range(n))
    # Composition: selection (eps_c, delta_c) + noisy count (eps_c, delta_eff) per key.
    assert per_key <= (delta_c + delta_effective(eps_c, L)) * (1 + 1e-9)
    # The count release is not free: at the undoubled eps_c the law with counts is strictly heavier than the
    # selection alone, and for realistic deltas it breaks (eps_c, delta_c) by orders of magnitude.
    selection = [np.array([1 - pi[c], pi[c]]) for c in range(n + 1)]
    alone = max(hockey_stick(selection[c], selection[c + 1], eps_c) for c in range(n))
    with_counts = max(hockey_stick(laws[c], laws[c + 1], eps_c) for c in range(n))
    assert alone <= delta_c * (1 + 1e-9) and with_counts > alone
    if delta < 1e-3:
        assert with_counts > 1000 * delta_c


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.2), (2.0, 1e-3)])
def test_noisy_counts_joint_law_obeys_doubled_event(epsilon, delta):
    """Joint law of (included set, noisy counts) over 3 tokens (product over keys) for every replace-one
    neighbour at n <= 5: within the doubled event (2 eps, 2 delta), and at eps heavier than the included set
    alone."""
    mech = DPWeightedSampling(epsilon, delta, release_counts=True)
    assert mech.event == WeightedSamplingEvent(2 * epsilon, 2 * delta, REPLACE)
    eps_c, _ = mech.per_count
    L = mech.error_bound
    noise = TruncatedGeometric(eps_c, L)
    worst_doubled = worst_single = worst_selection = 0.0

    def joint(hist):
        n = hist.num_teachers
        pi, grid = mech.inclusion_probabilities(n), n + 2 * L + 1
        laws = [keyed_law(int(c), pi, noise, L, grid) for c in hist.to_dense(3)]
        return np.einsum("i,j,k->ijk", *laws).ravel()

    for first, second in neighbouring_pairs(5, 3, REPLACE, min_teachers=1):
        pi = mech.inclusion_probabilities(first.num_teachers)
        law, law2 = joint(first), joint(second)
        selection = hockey_stick(set_law(pi[first.to_dense(3)]), set_law(pi[second.to_dense(3)]), mech.epsilon)
        worst_selection = max(worst_selection, selection)
        worst_doubled = max(worst_doubled, hockey_stick(law, law2, mech.event.epsilon))
        worst_single = max(worst_single, hockey_stick(law, law2, mech.epsilon))
    assert worst_doubled <= mech.event.delta * (1 + 1e-9)
    # The sanitised counts cost more than the included set alone (see also test_noisy_counts_cost_per_key).
    assert worst_selection <= mech.delta * (1 + 1e-9) and worst_single > worst_selection


def test_noisy_counts_are_within_L_and_follow_tg(rng):
    mech = DPWeightedSampling(2.0, 0.02, release_counts=True)
    eps_c, _ = mech.per_count
    L = mech.error_bound
    assert L == 4
    hist = {0: 2, 1: 4, 2: 6, 3: 10}
    n = 25
    pi = mech.inclusion_probabilities(n)
    errors, seen = [], np.zeros(4)
    num = 6000
    for _ in range(num):
        release = mech(hist, rng=rng, num_teachers=n)
        assert release.event == mech.event
        noisy = release.info["noisy_counts"]
        assert (release.value is None) == (not noisy)
        if release.value is not None:
            assert release.value in noisy
        for token, value in noisy.items():
            errors.append(value - hist[token])
            seen[token] += 1
    errors = np.array(errors)
    assert np.abs(errors).max() <= L
    support = np.arange(-L, L + 1)
    observed = (errors[:, None] == support).sum(axis=0)
    check_counts_match_law(dict(enumerate(observed)), dict(enumerate(TruncatedGeometric(eps_c, L).pmf(support))),
                           alpha=1e-4)
    # Every token is in the released set with probability pi*(c_j).
    expected = pi[[2, 4, 6, 10]]
    se = np.sqrt(expected * (1 - expected) / num)
    assert np.all(np.abs(seen / num - expected) <= z_bound(4) * se)


# --- exact distribution and sampling -----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=9), st.integers(0, 3))
def test_survivor_probabilities_match_enumeration(probs, repeat_ones):
    """The dynamic program against enumeration of every included set (probabilities 0 and 1 included)."""
    probs = np.array(probs + [1.0] * repeat_ones)
    out, fail = uniform_survivor_probabilities(probs)
    k = probs.size
    expected, expected_fail = np.zeros(k), 0.0
    for bits in itertools.product([False, True], repeat=k):
        mask = np.array(bits, dtype=bool)
        p = float(np.prod(np.where(mask, probs, 1 - probs)))
        if mask.any():
            expected[mask] += p / mask.sum()
        else:
            expected_fail += p
    assert np.allclose(out, expected, rtol=1e-10, atol=1e-14)
    assert fail == pytest.approx(expected_fail, abs=1e-14)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=12),
    st.integers(0, 30),
    st.sampled_from([(1.0, 1e-6), (0.5, 1e-3), (2.0, 0.05), (4.0, 0.2), (2.0, 2e-6), (8.0, 0.4)]),
    st.sampled_from([REPLACE]),
)
def test_relevance_and_batch_agreement(counts, tail, budget, relation):
    """gamma = 1 relevance: no token is released more often than c_j/n (and than pi*(c_j)); the quadrature of
    batch_distributions equals the dynamic program of output_distribution."""
    hist = as_histogram(np.array(counts), num_teachers=sum(counts) + tail)
    n = hist.num_teachers
    if n == 0:
        return
    mech = DPWeightedSampling(*budget, relation)
    dist = mech.output_distribution(hist)
    pi = mech.inclusion_probabilities(n)
    assert dist.probabilities.sum() + dist.fail == pytest.approx(1.0, abs=1e-12)
    assert dist.fail == pytest.approx(float(np.prod(1 - pi[hist.counts])), abs=1e-14)
    for token, prob in zip(dist.tokens, dist.probabilities):
        c = hist.count(token)
        assert prob <= pi[c] * (1 + 1e-12) and prob <= c / n * (1 + 1e-12)
    sample, tokens, probs = mech.batch_distributions(HistogramBatch.from_histograms([hist, {}, hist], num_teachers=n))
    assert np.array_equal(sample, np.repeat([0, 2], hist.tokens.size))
    assert np.array_equal(tokens, np.tile(hist.tokens, 2))
    assert np.allclose(probs, np.tile(dist.probabilities, 2), rtol=1e-11, atol=1e-15)


@pytest.mark.parametrize("max_nodes, block", [(1024, 1 << 21), (4, 1 << 21), (1024, 3)])
def test_batch_distributions_on_large_histograms(max_nodes, block, monkeypatch):
    """Quadrature (with a small node cap: the dynamic-program fallback for wide histograms; with a small
    block: the blocked evaluation) against the dynamic program of output_distribution."""
    monkeypatch.setattr(weighted_sampling, "_MAX_NODES", max_nodes)
    monkeypatch.setattr(weighted_sampling, "_BLOCK", block)
    rng = np.random.default_rng(5)
    n = 3000
    hists = []
    for k in (1, 2, 9, 70, 400, 1200):
        tokens = rng.choice(10 * n, size=k, replace=False)
        counts = rng.integers(1, n // k + 1, size=k)
        hists.append(dict(zip(tokens.tolist(), counts.tolist())))
    mech = DPWeightedSampling(1.0, 2e-4)  # per count (0.5, 1e-4)
    batch = HistogramBatch.from_histograms(hists, num_teachers=n)
    sample, tokens, probs = mech.batch_distributions(batch)
    for i, hist in enumerate(hists):
        dist = mech.output_distribution(hist, num_teachers=n)
        mine = sample == i
        assert np.array_equal(tokens[mine], dist.tokens)
        assert np.allclose(probs[mine], dist.probabilities, rtol=1e-10, atol=1e-16)
        assert dist.probabilities.sum() + dist.fail == pytest.approx(1.0, abs=1e-11)


CALL_HIST = {0: 1, 1: 2, 2: 3, 3: 5}


def test_call_includes_tokens_with_exactly_the_certified_probability():
    # The single-release law computed from the sampler's own code: the Poisson sample is below(n) < c (n
    # equally likely answers), the keep decision one rational Bernoulli, the survivor a uniform pick.  In
    # exact arithmetic each token is included with probability pi~(c), the certified table (which is
    # exactly (eps_c, delta_c)-DP per count, test_exact_sampling), and the release law is the subset law.
    from fractions import Fraction

    from exact_enumeration import RatioBranching, enumerate_law
    from mechanisms.geometric import INCLUSION_BITS, certified_inclusion

    n = 12
    mech = DPWeightedSampling(1.0, 1e-2)
    table = [Fraction(v, 1 << INCLUSION_BITS) for v in certified_inclusion(n, *mech.per_count)]
    for c in range(1, n + 1):
        law, unfinished, _ = enumerate_law(
            lambda prefix: RatioBranching(prefix, 8), lambda s: mech({0: c}, rng=s, num_teachers=n).value
        )
        assert unfinished == 0 and law.get(0, 0) == table[c]
    law, unfinished, _ = enumerate_law(
        lambda prefix: RatioBranching(prefix, 8), lambda s: mech({0: 5, 1: 7}, rng=s, num_teachers=n).value
    )
    p5, p7 = table[5], table[7]
    assert unfinished == 0
    assert law == {0: p5 * (1 - p7) + p5 * p7 / 2, 1: p7 * (1 - p5) + p5 * p7 / 2, None: (1 - p5) * (1 - p7)}
    # and it is the float law of output_distribution, to float precision
    dist = mech.output_distribution({0: 5, 1: 7}, num_teachers=n)
    assert [float(law[0]), float(law[1]), float(law[None])] == pytest.approx(
        [dist.probability(0), dist.probability(1), dist.fail], rel=1e-12
    )


def test_call_draws_follow_output_distribution(rng):
    mech = DPWeightedSampling(2.0, 0.1)
    dist = mech.output_distribution(CALL_HIST, num_teachers=12)
    assert min(dist.as_dict().values()) > 0.03
    values = []
    for _ in range(15000):
        release = mech(CALL_HIST, rng=rng, num_teachers=12)
        assert isinstance(release, Release) and release.event == mech.event and "noisy_counts" not in release.info
        values.append(release.value)
    observed = {label: values.count(label) for label in set(values)}
    check_counts_match_law(observed, dist.as_dict(), alpha=1e-4)


def test_run_batch_draws_follow_output_distribution(rng):
    mech = DPWeightedSampling(2.0, 0.1)  # per count (1, 0.05)
    n = 12
    shapes = [CALL_HIST, {4: 7, 9: 1}, {}, {2: 10}, {0: 3, 1: 3, 2: 3, 5: 1}]
    reps = 20000
    one = HistogramBatch.from_histograms(shapes, num_teachers=n)
    # histogram i * reps + r is a copy of shapes[i]
    sample = (one.sample[:, None] * reps + np.arange(reps)[None, :]).ravel()
    batch = HistogramBatch(sample, np.repeat(one.tokens, reps), np.repeat(one.counts, reps), len(shapes) * reps, n)
    released = mech.run_batch(batch, rng=rng)
    assert isinstance(released, BatchRelease) and released.event == mech.event and len(released) == batch.num_histograms
    for i, hist in enumerate(shapes):
        values = released.values[i * reps : (i + 1) * reps]
        keys, freq = np.unique(values, return_counts=True)
        observed = {(None if k == FAIL_VALUE else int(k)): int(f) for k, f in zip(keys, freq)}
        # five histograms, each at significance 1e-4 / 5
        check_counts_match_law(observed, mech.output_distribution(hist, num_teachers=n).as_dict(), alpha=2e-5)


def test_run_batch_accepts_dense_rows_and_default_rng():
    mech = DPWeightedSampling(4.0, 0.3)
    released = mech.run_batch(np.array([[4, 0, 0], [0, 0, 0], [2, 2, 0]]))
    assert released.values[1] == FAIL_VALUE and released.values[0] in (0, FAIL_VALUE)
    assert mech({0: 3, 1: 1}).value in (0, 1, None)  # rng=None: OS entropy
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mech({0: 3}, rng=7)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mech.run_batch([{0: 3}], rng=7)


# --- utility ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("relation", [REPLACE])
@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.2, 0.4, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-4, 1e-6, 1e-10])
def test_every_sampled_count_in_the_middle_survives(relation, epsilon, delta):
    """Issue: "keeps every sampled count in [2L, n - 2/epsilon]" with L = error_bound and epsilon the *total*
    epsilon (= n - 1/eps_c under replace-one): r(c) = pi*(c)/p(c) == 1 exactly there.  Also the exact upper
    end of full retention, n - ceil((1 - n delta_c)/(e^eps_c - 1)) (near c = n full retention needs
    delta_c >= 1/n), and the lower end is at most 2L."""
    mech = DPWeightedSampling(epsilon, delta, relation)
    eps_c, delta_c = mech.per_count
    L = mech.error_bound
    for n in (20, 100, 1000, 5000):
        r = mech.keep_probabilities(n)
        lo, hi = max(1, 2 * L), math.floor(n - 2 / epsilon)
        if lo <= hi:
            assert (r[lo : hi + 1] == 1.0).all(), (n, lo, hi)
        ones = np.flatnonzero(r[:n] == 1.0)
        if ones.size:
            top = n - max(0, math.ceil((1 - n * delta_c) / math.expm1(eps_c) - 1e-9))
            assert ones[-1] == min(top, n - 1) or (top == n and r[n] == 1.0)
            assert ones.size == ones[-1] - ones[0] + 1  # one interval
            if lo <= hi:
                assert ones[0] <= lo
        if n * delta_c < 1:
            assert r[n] < 1.0  # full retention fails at c = n unless delta_c >= 1/n


# --- Lemma E.2: diversity preservation of LWS_L -------------------------------------------------------
LEMMA_FAMILIES = {
    # (group size m, q); n = 200 teachers, L = 7 so tau = 4L = 28
    "all-small-q": (200, 0.05),
    "tau-large-q": (28, 0.9),
    "half-mid-q": (100, 0.3),
}


@pytest.mark.parametrize("family", sorted(LEMMA_FAMILIES))
def test_lemma_e2_diversity_preservation(family, rng):
    """Total (2, 1e-3) replace-one: per count (1, 5e-4), L = 7, tau = 4L = 28, beta = ln(2)/16, gamma = 1.
    Rao-Blackwellised estimate of P[output = token 0] over 20000 coordinated histograms of n = 200 teachers
    (batch_distributions gives the exact conditional probability per histogram)."""
    n = 200
    mech = DPWeightedSampling(2.0, 1e-3)
    L = mech.error_bound
    assert L == 7
    m, q = LEMMA_FAMILIES[family]
    assert m >= 4 * L
    teachers = disjoint_groups(n, m, vocab_size=n + n // m + 2, q=q)
    num = 20000
    batch = batch_from_votes(coordinated_votes(teachers, num, rng), teachers.vocab_size)
    sample, tokens, probs = mech.batch_distributions(batch)
    per_hist = np.zeros(num)
    zero = tokens == 0
    per_hist[sample[zero]] = probs[zero]
    estimate, se = per_hist.mean(), per_hist.std(ddof=1) / np.sqrt(num)
    z = z_bound(2 * len(LEMMA_FAMILIES))
    assert estimate + z * se >= math.log(2) / 16 * q * m / n  # transfer
    assert estimate - z * se <= teachers.average()[0]  # relevance, gamma = 1


# --- construction, events, bad input ------------------------------------------------------------------
def test_event_is_known_before_running():
    mech = DPWeightedSampling(1, 1e-6)
    assert isinstance(mech.epsilon, float) and mech.epsilon == 1.0
    assert mech.event == WeightedSamplingEvent(1.0, 1e-6, REPLACE)
    doubled = DPWeightedSampling(0.5, 1e-5, release_counts=True)
    assert doubled.event == WeightedSamplingEvent(1.0, 2e-5, REPLACE)
    assert doubled.error_bound == truncation(0.25, 5e-6)
    assert mech == DPWeightedSampling(1.0, 1e-6) and hash(mech) == hash(DPWeightedSampling(1.0, 1e-6))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(epsilon=0.0, delta=1e-6), ValueError, "epsilon must be > 0.0, got 0.0"),
        (dict(epsilon=-1, delta=1e-6), ValueError, "epsilon must be > 0.0, got -1.0"),
        (dict(epsilon=float("inf"), delta=1e-6), ValueError, "epsilon must be finite"),
        (dict(epsilon="1", delta=1e-6), TypeError, "epsilon must be a real number, got '1'"),
        (dict(epsilon=1.0, delta=0.0), ValueError, "delta must be > 0.0, got 0.0"),
        (dict(epsilon=1.0, delta=1.0), ValueError, "delta must be < 1.0, got 1.0"),
        (dict(epsilon=1.0, delta=1.5), ValueError, "delta must be < 1.0, got 1.5"),
        (dict(epsilon=1.0, delta=1e-6, relation="swap"), ValueError, "relation must be one of .* got 'swap'"),
        (dict(epsilon=1.0, delta=1e-6, release_counts=1), TypeError, "release_counts must be a bool, got 1"),
        (dict(epsilon=1.0, delta=0.5, release_counts=True), ValueError, "delta must be < 0.5 when release_counts"),
    ],
)
def test_bad_parameters(kwargs, error, message):
    with pytest.raises(error, match=message):
        DPWeightedSampling(**kwargs)


@pytest.mark.parametrize(
    "bad, num_teachers, error, message",
    [
        (np.array([1.5, 2]), None, ValueError, "integer counts, got 1.5"),
        (np.array([3, -1]), None, ValueError, "non-negative counts, got -1"),
        ({0: 2, 1: -1}, None, ValueError, "non-negative counts, got -1"),
        ({0: 2.5}, None, ValueError, "integer counts, got 2.5"),
        ([3, 3], 5, ValueError, "counts sum to 6, more than num_teachers=5"),
        ({0: 2, "a": 1}, None, TypeError, "integer token ids, got 'a'"),
        ("abc", None, TypeError, "got str"),
    ],
)
def test_bad_histograms(bad, num_teachers, error, message):
    mech = DPWeightedSampling(1.0, 1e-6)
    with pytest.raises(error, match=message):
        mech(bad, rng=np.random.default_rng(0), num_teachers=num_teachers)
    with pytest.raises(error, match=message):
        mech.output_distribution(bad, num_teachers=num_teachers)


def test_bad_batches():
    mech = DPWeightedSampling(1.0, 1e-6)
    with pytest.raises(ValueError, match="more than num_teachers=3"):
        mech.run_batch(HistogramBatch([0, 0], [1, 2], [2, 2], 1, 3), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="non-negative counts"):
        mech.batch_distributions(np.array([[1, -1]]))
    with pytest.raises(TypeError, match="num_teachers must be an integer"):
        mech.inclusion_probabilities(2.0)
