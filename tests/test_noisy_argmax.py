"""Truncated-geometric NoisyArgMax_L and DPArgMax (LArgMax_L): paper Section "DP Aggregation Methods"
(Algorithm 2, Lemma distalghigh, Corollary DPArgMax).

The privacy checks enumerate every noise vector with a law written here from the truncated-geometric pmf
``P[X = x] = A e^{-eps |x|}`` on ``-L..L`` (independent of the module), and bound the hockey-stick divergence
over every outcome set on every neighbouring pair of small histograms (``mechanisms.testing``).
"""

import functools
import itertools
import math
from fractions import Fraction

import attr
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import z_bound
from exact_enumeration import GeometricBranching, enumerate_law
from ensembles import VoteHistogram, batch_from_votes, coordinated_votes
from ensembles.synthetic import disjoint_groups
from mechanisms import FAIL_VALUE, BatchRelease, CountHistogram, HistogramBatch, as_histogram
from mechanisms.audit import hockey_stick, neighbouring_pairs
from mechanisms.geometric import delta_effective, truncation
from mechanisms.noisy_argmax import DPArgMax, TruncatedGeometricNoisyArgMax
from pate_accountant import Release
from mechanisms.testing import check_counts_match_law, worst_pair_delta
from pate_accountant.events import NoisyArgMaxEvent

ADD_REMOVE = "add-remove-one"


# --- reference values: the truncation L, release and yield probabilities ------------------------------
@pytest.mark.parametrize(
    "epsilon, delta, relation, error_bound",
    [
        (1.0, 1e-6, "replace-one", 27),
        (0.5, 1e-6, "replace-one", 50),
        (0.1, 1e-6, "replace-one", 217),
        (1.0, 1e-5, "replace-one", 22),
        (1.0, 1e-6, ADD_REMOVE, 14),
        (0.5, 1e-6, ADD_REMOVE, 25),
        (0.1, 1e-5, ADD_REMOVE, 86),
    ],
)
def test_error_bound_vectors(epsilon, delta, relation, error_bound):
    mech = TruncatedGeometricNoisyArgMax(epsilon, delta, relation=relation)
    assert mech.error_bound == error_bound
    assert mech.event == NoisyArgMaxEvent(epsilon, delta, relation, error_bound)
    assert 0 < mech.effective_delta <= delta
    # DPArgMax reads one count: the whole budget per count under either relation (L = the add-remove value).
    dp = DPArgMax(epsilon, delta, relation=relation)
    assert dp.error_bound == truncation(epsilon, delta) <= error_bound
    assert dp.event == NoisyArgMaxEvent(epsilon, delta, relation, dp.error_bound)
    assert 0 < dp.effective_delta == delta_effective(epsilon, dp.error_bound) <= delta
    # A single key is always released from c = 2L + 1 on (c + X >= L + 1 for every X >= -L), and not before.
    mech = TruncatedGeometricNoisyArgMax(epsilon, delta, relation=relation)
    assert mech.output_distribution({0: 2 * error_bound + 1}).fail == 0.0
    assert mech.output_distribution({0: 2 * error_bound}).fail > 0.0


def test_default_relation_is_replace_one_with_half_budget_per_count():
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    assert mech.relation == "replace-one"
    assert (mech.per_count_epsilon, mech.per_count_delta) == (0.5, 5e-7)
    assert mech.effective_delta == pytest.approx(2 * delta_effective(0.5, 27), rel=1e-12)
    assert TruncatedGeometricNoisyArgMax(1.0, 1e-6, relation=ADD_REMOVE).effective_delta == pytest.approx(
        3.842639e-07, rel=1e-6
    )
    # The paper's L = eps^-1 ln(1/delta) = 13.8 is the add-remove value, up to the ceiling.
    assert math.ceil(math.log(1e6)) == TruncatedGeometricNoisyArgMax(1.0, 1e-6, relation=ADD_REMOVE).error_bound


@pytest.mark.parametrize(
    "count, keep",
    [(1, 3.8426385972e-07), (2, 1.4288013269e-06), (3, 4.2681485432e-06), (5, 3.2966390351e-05),
     (10, 4.9256125266e-03), (13, 9.8937840420e-02), (14, 0.26894131803), (15, 0.73105868197),
     (20, 0.99818810978), (28, 0.99999961574), (29, 1.0), (40, 1.0)],
)
def test_single_key_release_probability_is_the_optimal_keep_probability(count, keep):
    """Per-key release probability P[c + X >= 15] for X ~ TG(1, 14) (per count (1, 1e-6)): reference values
    summed from the pmf, 1 from c = 29 = 2L + 1 on."""
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6, relation=ADD_REMOVE)
    assert mech.output_distribution({7: count}).probability(7) == pytest.approx(keep, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("count", [700, 529, 520, 514, 510, 505, 501])
def test_dpargmax_yield_vector(count):
    """n = 1000, total (1, 1e-6): TG(1, 14) on the top count, threshold n/2 + L = 514; the yield probability
    is P[count + X > 514], summed from the independent pmf ``tg_pmf``; 1 above n/2 + 2L = 528."""
    mech = DPArgMax(1.0, 1e-6)
    assert mech.error_bound == 14
    dist = mech.output_distribution({3: count, 4: 1000 - count})
    noise = np.arange(-14, 15)
    expected = float(tg_pmf(1.0, 14)[count + noise > 514].sum())
    if count > 528:
        assert dist.probability(3) == 1.0 and dist.fail == 0.0
    else:
        assert dist.probability(3) == pytest.approx(expected, rel=1e-12)
    assert dist.probability(3) + dist.fail == pytest.approx(1.0, abs=1e-15)
    assert mech.yield_probability(count, 1000) == dist.probability(3)
    assert mech.yield_probability(500, 1000) == 0.0 and mech.output_distribution({3: 500, 4: 500}).fail == 1.0
    np.testing.assert_array_equal(
        mech.yield_probability(np.array([count, 500]), 1000), [dist.probability(3), 0.0]
    )


# --- an independent brute force ------------------------------------------------------------------
def tg_pmf(epsilon: float, k: int) -> np.ndarray:
    """TG(eps, k) on -k..k, written from its definition: P[X = x] = A e^{-eps |x|}, A normalising."""
    r = math.exp(-epsilon)
    a = (1 - r) / (1 + r - 2 * r ** (k + 1))
    return a * np.exp(-epsilon * np.abs(np.arange(-k, k + 1)))


@functools.lru_cache(maxsize=None)
def brute_joint(items: tuple, epsilon_c: float, k: int) -> dict:
    """Law of NoisyArgMax's release ``(token, noisy count)`` (``None`` = fail) by enumerating every noise
    vector over the keys with a vote; ties split uniformly."""
    keys = [t for t, c in items if c > 0]
    counts = np.array([c for _, c in items if c > 0], dtype=np.int64)
    if not keys:
        return {None: 1.0}
    pmf = tg_pmf(epsilon_c, k)
    grid = np.array(list(itertools.product(range(2 * k + 1), repeat=len(keys))), dtype=np.int64)
    prob = np.prod(pmf[grid], axis=1)
    noisy = counts + grid - k
    released = noisy >= k + 1
    masked = np.where(released, noisy, -1)
    best = masked.max(axis=1)
    tied = released & (masked == best[:, None])
    ties = tied.sum(axis=1)
    out = {None: float(prob[ties == 0].sum())}
    for j, token in enumerate(keys):
        for v in np.unique(best[tied[:, j]]):
            sel = tied[:, j] & (best == v)
            out[(token, int(v))] = float((prob[sel] / ties[sel]).sum())
    return out


def joint_of(mech, hist) -> dict:
    """The brute-force joint law on a histogram (any accepted form)."""
    return brute_joint(tuple(sorted(as_histogram(hist).as_dict().items())), mech.per_count_epsilon, mech.error_bound)


def larg_max_law(joint: dict, n: int, error_bound: int, with_count: bool) -> dict:
    """LArgMax_L applied to the full NoisyArgMax law: release j iff c~_j > n/2 + L."""
    out = {None: 0.0}
    for outcome, p in joint.items():
        if outcome is not None and 2 * outcome[1] > n + 2 * error_bound:
            key = outcome if with_count else outcome[0]
            out[key] = out.get(key, 0.0) + p
        else:
            out[None] += p
    return out


def marginal(joint: dict) -> dict:
    out = {}
    for outcome, p in joint.items():
        key = None if outcome is None else outcome[0]
        out[key] = out.get(key, 0.0) + p
    return out


#: Every neighbouring pair of histograms with at most six teachers over three tokens, tail votes included.
MAX_TEACHERS, VOCAB = 6, 3


def replace_pairs():
    return neighbouring_pairs(MAX_TEACHERS, VOCAB, "replace-one")


def add_remove_pairs():
    return neighbouring_pairs(MAX_TEACHERS, VOCAB, ADD_REMOVE)


def tail_pairs():
    """Replace-one pairs that move a vote to or from the tail (n fixed)."""
    return [(a, b) for a, b in replace_pairs() if a.tail != b.tail]


def worst_divergence(mech, pairs, law) -> float:
    """Largest hockey-stick divergence at the mechanism's total epsilon over the pairs, both ways."""
    return worst_pair_delta(law, mech.epsilon, pairs=pairs).delta


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.1), (1.0, 0.05)])
def test_noisy_argmax_exact_privacy_replace_one(epsilon, delta):
    mech = TruncatedGeometricNoisyArgMax(epsilon, delta)
    assert mech.error_bound in (3, 5)
    pairs = replace_pairs()
    worst = worst_divergence(mech, pairs, lambda h: joint_of(mech, h))
    assert worst <= mech.effective_delta + 1e-12 <= delta + 1e-12
    # Not vacuous: the truncation's delta is really spent (a count going 0 <-> 1 or c <-> c + 1 leaves the
    # mass delta_eff unmatched), and the same pairs show the mechanism is not (0.3 epsilon, delta)-DP.
    assert worst >= delta_effective(mech.per_count_epsilon, mech.error_bound) * (1 - 1e-9)
    assert max(hockey_stick(joint_of(mech, a), joint_of(mech, b), 0.3 * epsilon) for a, b in pairs) > delta


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.1), (1.0, 0.05)])
def test_noisy_argmax_exact_privacy_add_remove(epsilon, delta):
    mech = TruncatedGeometricNoisyArgMax(epsilon, delta, relation=ADD_REMOVE)
    worst = worst_divergence(mech, add_remove_pairs(), lambda h: joint_of(mech, h))
    assert worst <= mech.effective_delta + 1e-12 <= delta + 1e-12


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.1), (1.0, 0.05)])
def test_dpargmax_exact_privacy_replace_one(epsilon, delta):
    """DPArgMax releases (token, noisy count) or fail; n is fixed under replace-one."""
    mech = DPArgMax(epsilon, delta)
    L = mech.error_bound
    pairs = replace_pairs()
    worst = worst_divergence(mech, pairs, lambda h: larg_max_law(joint_of(mech, h), h.num_teachers, L, True))
    assert worst <= mech.effective_delta + 1e-12 <= delta + 1e-12
    # The implementation's exact law is the same mechanism.
    for h in {h for pair in pairs for h in pair}:
        want = larg_max_law(joint_of(mech, h), h.num_teachers, L, False)
        got = mech.output_distribution(h).as_dict()
        for key in set(want) | set(got):
            assert got.get(key, 0.0) == pytest.approx(want.get(key, 0.0), abs=1e-14)


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.1), (1.0, 0.05)])
def test_dpargmax_exact_privacy_add_remove(epsilon, delta):
    mech = DPArgMax(epsilon, delta, relation=ADD_REMOVE)
    L = mech.error_bound
    # n changes with the neighbour: the token alone is (epsilon, delta)-DP ...
    token_law = lambda h: larg_max_law(joint_of(mech, h), h.num_teachers, L, False)  # noqa: E731
    assert worst_divergence(mech, add_remove_pairs(), token_law) <= mech.effective_delta + 1e-12
    # ... but the pair (token, noisy count) is not (the threshold n/2 + L moves by a half), which is why
    # DPArgMax withholds the noisy count under add-remove-one.
    joint_law = lambda h: larg_max_law(joint_of(mech, h), h.num_teachers, L, True)  # noqa: E731
    assert worst_divergence(mech, add_remove_pairs(), joint_law) > delta
    release = mech({0: 12}, rng=np.random.default_rng(0))
    assert release.value == 0 and dict(release.info) == {}
    # A replace-one move to or from the tail (n fixed) keeps the pair covered.
    assert worst_divergence(mech, tail_pairs(), joint_law) <= mech.effective_delta + 1e-12


@pytest.mark.parametrize("epsilon, delta", [(2.0, 0.1), (1.0, 0.05)])
def test_exact_laws_match_the_enumeration(epsilon, delta):
    mech = TruncatedGeometricNoisyArgMax(epsilon, delta)
    for hist in {h for pair in replace_pairs() for h in pair}:
        want = joint_of(mech, hist)
        tokens, values, probs, fail = mech.joint_distribution(hist)
        got = {(int(t), int(v)): p for t, v, p in zip(tokens, values, probs)}
        got[None] = fail
        for key in set(want) | set(got):
            assert got.get(key, 0.0) == pytest.approx(want.get(key, 0.0), abs=1e-14), (hist, key)
        dist = mech.output_distribution(hist).as_dict()
        for key, p in marginal(want).items():
            assert dist.get(key, 0.0) == pytest.approx(p, abs=1e-14)
        assert sum(dist.values()) == pytest.approx(1.0, abs=1e-14)


def test_dpargmax_is_noisy_argmax_followed_by_the_threshold():
    """The binary simplification (sample the top token's noise only) is exact, jointly with the count."""
    dp = DPArgMax(1.0, 1e-6)
    full = dp.noisy_argmax  # the same per-count noise TG(1, 14)
    assert full.error_bound == dp.error_bound == 14 and full.per_count_epsilon == dp.per_count_epsilon == 1.0
    L = dp.error_bound
    rng = np.random.default_rng(5)
    for n in (100, 101):
        for top in range(n // 2 - 2, n - 3, 3):
            rest = rng.multinomial(n - top - 3, np.full(6, 1 / 6))
            hist = {0: top, **{i + 1: int(c) for i, c in enumerate(rest) if c and c <= top}}
            tokens, values, probs, _ = full.joint_distribution(hist, num_teachers=n)
            above = 2 * values > n + 2 * L
            assert set(tokens[above].tolist()) <= {0}
            expected = probs[above].sum()
            assert dp.output_distribution(hist, num_teachers=n).probability(0) == pytest.approx(expected, abs=1e-13)


# --- Monte Carlo: draws follow the exact laws -----------------------------------------------------
#: Significance of the sampler checks below (each at a fixed seed).
ALPHA = 1e-4


TIE_HISTOGRAM = {0: 30, 1: 30, 2: 26, 3: 5, 9: 1}


def test_noisy_argmax_draws_follow_the_exact_joint_law():
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    tokens, values, probs, fail = mech.joint_distribution(TIE_HISTOGRAM)
    expected = {(int(t), int(v)): p for t, v, p in zip(tokens, values, probs)}
    expected[None] = fail
    rng = np.random.default_rng(11)
    num = 20000
    observed: dict = {}
    hist = CountHistogram.from_mapping(TIE_HISTOGRAM)
    for _ in range(num):
        r = mech(hist, rng=rng)
        key = None if r.value is None else (r.value, r.info["noisy_count"])
        observed[key] = observed.get(key, 0) + 1
    check_counts_match_law(observed, expected, alpha=ALPHA)
    # The marginal: tokens 0 and 1 tie exactly (uniform tie-breaking), both far ahead of token 2.
    dist = mech.output_distribution(TIE_HISTOGRAM)
    assert dist.probability(0) == pytest.approx(dist.probability(1), rel=1e-12)
    check_counts_match_law(
        {k: sum(v for o, v in observed.items() if (o is None and k is None) or (o is not None and o[0] == k))
         for k in dist.as_dict()},
        dist.as_dict(), alpha=ALPHA,
    )


def repeated_batch(hist: dict, draws: int, num_teachers: int | None = None) -> HistogramBatch:
    tokens = np.array(sorted(hist), dtype=np.int64)
    counts = np.array([hist[t] for t in tokens], dtype=np.int64)
    n = int(counts.sum()) if num_teachers is None else num_teachers
    return HistogramBatch(
        np.repeat(np.arange(draws), tokens.size), np.tile(tokens, draws), np.tile(counts, draws), draws, n
    )


def value_counts(values: np.ndarray) -> dict:
    keys, freq = np.unique(values, return_counts=True)
    return {(None if k == FAIL_VALUE else int(k)): int(f) for k, f in zip(keys, freq)}


@pytest.mark.parametrize("hist", [TIE_HISTOGRAM, {4: 20, 5: 18}, {6: 3, 7: 1}])
def test_noisy_argmax_run_batch_follows_the_exact_law(hist):
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    num = 30000
    batch = repeated_batch(hist, num)
    values, counts = mech.sample_batch(batch, rng=np.random.default_rng(12))
    check_counts_match_law(value_counts(values), mech.output_distribution(hist).as_dict(), alpha=ALPHA)
    assert np.all(counts[values == FAIL_VALUE] == 0) and np.all(counts[values != FAIL_VALUE] >= mech.error_bound + 1)
    released = mech.run_batch(batch, rng=np.random.default_rng(1))
    assert isinstance(released, BatchRelease) and len(released) == num and released.event == mech.event
    check_counts_match_law(value_counts(released.values), mech.output_distribution(hist).as_dict(), alpha=ALPHA)


@pytest.mark.parametrize("top", [505, 515, 520, 540])
def test_dpargmax_release_law_from_the_exact_sampler(top):
    # The law of (token, noisy count) computed from the single-release sampler's own code: its TG draw is a
    # geometric magnitude modulo L + 1 (one choice with weight (1 - q) q^g, q standing for e^-eps_c; the tail
    # g > L is a fresh draw by memorylessness) and a fair sign (a rejected sign is a fresh round).  In exact
    # rational arithmetic it is A q^|x| on every yielding noise value x, including the extreme x = L.
    mech = DPArgMax(1.0, 1e-6)
    k, eps_c = mech.error_bound, mech.per_count_epsilon
    q = Fraction(math.exp(-eps_c))
    hist = CountHistogram([2, 8], [top, 400], num_teachers=1000)
    raw, unfinished, restart = enumerate_law(
        lambda prefix: GeometricBranching(prefix, 4, q, k, "restart"),
        lambda source: (lambda r: (r.value, r.info.get("noisy_count")))(mech(hist, rng=source)),
    )
    assert unfinished == 0
    law = {key: w / (1 - restart) for key, w in raw.items()}
    a = (1 - q) / (1 + q - 2 * q ** (k + 1))
    needed = k + 1 + (1000 - 2 * top) // 2  # the least noise with top + x > n/2 + L
    expected = {(2, top + x): a * q ** abs(x) for x in range(max(needed, -k), k + 1)}
    fail = 1 - sum(expected.values())
    if fail:
        expected[(None, None)] = fail
    assert law == expected
    assert float(sum(w for (token, _), w in law.items() if token == 2)) == pytest.approx(
        mech.yield_probability(top, 1000), rel=1e-12, abs=1e-300
    )


def test_dpargmax_draws_follow_the_exact_law():
    mech = DPArgMax(1.0, 1e-6)
    hist = CountHistogram([2, 8], [515, 400], num_teachers=1000)  # 85 tail votes
    dist = mech.output_distribution(hist)
    assert dist.probability(2) == pytest.approx(float(tg_pmf(1.0, 14)[14:].sum()), rel=1e-12)  # P[X >= 0]
    assert 0.7 < dist.probability(2) < 0.75
    rng = np.random.default_rng(13)
    num = 20000
    draws = [mech(hist, rng=rng) for _ in range(num)]
    observed = {2: sum(r.value == 2 for r in draws), None: sum(r.value is None for r in draws)}
    check_counts_match_law(observed, dist.as_dict(), alpha=ALPHA)
    # The released noisy count has the law of c + X given c + X > n/2 + L.
    noisy = np.array([r.info["noisy_count"] for r in draws if r.value == 2])
    assert noisy.min() >= 515 and noisy.max() <= 515 + mech.error_bound  # above n/2 + L = 514
    pmf = tg_pmf(1.0, 14)
    support = np.arange(515, 530)
    conditional = pmf[support - 515 + 14] / pmf[support - 515 + 14].sum()
    observed_counts = {int(v): int((noisy == v).sum()) for v in support}
    check_counts_match_law(observed_counts, dict(zip(support.tolist(), conditional)), alpha=ALPHA)
    # run_batch, vectorised (one TG draw per histogram)
    batch = repeated_batch({2: 515, 8: 400}, num, num_teachers=1000)
    values = mech.run_batch(batch, rng=np.random.default_rng(14)).values
    check_counts_match_law(value_counts(values), dist.as_dict(), alpha=ALPHA)


@pytest.mark.parametrize("cls", [TruncatedGeometricNoisyArgMax, DPArgMax])
def test_batch_distributions_match_output_distribution(cls):
    mech = cls(1.0, 1e-6)
    rng = np.random.default_rng(15)
    n = 120
    hists = []
    for _ in range(40):
        top = int(rng.integers(20, n))
        rest = rng.multinomial(n - top, rng.dirichlet(np.ones(5)))
        hists.append({0: top, **{i + 1: int(c) for i, c in enumerate(rest) if c}})
    hists.append({})
    batch = HistogramBatch.from_histograms(hists, num_teachers=n)
    sample, tokens, probs = mech.batch_distributions(batch)
    assert np.all(np.diff(sample) >= 0) and np.all(probs > 0)
    for i, hist in enumerate(hists):
        dist = mech.output_distribution(hist, num_teachers=n)
        sel = sample == i
        assert dict(zip(tokens[sel].tolist(), probs[sel].tolist())) == pytest.approx(
            {k: v for k, v in dist.as_dict().items() if k is not None and v > 0}, abs=1e-15
        )


# --- utility ---------------------------------------------------------------------------------------
histograms = st.tuples(st.lists(st.integers(0, 90), min_size=1, max_size=8), st.integers(0, 30))


@settings(max_examples=60, deadline=None)
@given(histograms, st.sampled_from([(1.0, 1e-6, "replace-one"), (2.0, 0.1, "replace-one"), (1.0, 1e-6, ADD_REMOVE)]))
def test_noisy_argmax_error_contract(hist, params):
    """max_h c_h - L <= c~_j <= c_j + L, always: on the exact law and on many draws."""
    counts, tail = hist
    eps, delta, relation = params
    mech = TruncatedGeometricNoisyArgMax(eps, delta, relation=relation)
    L = mech.error_bound
    dense = np.array(counts)
    n = int(dense.sum()) + tail
    top = int(dense.max())
    tokens, values, probs, fail = mech.joint_distribution(dense, num_teachers=n)
    assert np.all(values >= top - L) and np.all(values <= dense[tokens] + L) and np.all(values >= L + 1)
    if top >= 2 * L + 1:
        assert fail == 0.0  # the contract's premise: something is always released
    draws = 200
    batch = repeated_batch(dict(enumerate(counts)), draws, n)
    values, noisy = mech.sample_batch(batch, rng=np.random.default_rng(len(counts) + 31 * top))
    hit = values != FAIL_VALUE
    assert np.all(noisy[hit] >= top - L) and np.all(noisy[hit] <= dense[values[hit]] + L)
    if top >= 2 * L + 1:
        assert hit.all()
    release = mech(dense, rng=np.random.default_rng(top), num_teachers=n)
    if release.value is not None:
        assert top - L <= release.info["noisy_count"] <= dense[release.value] + L


@settings(max_examples=60, deadline=None)
@given(histograms, st.sampled_from([(1.0, 1e-6), (2.0, 0.1), (0.5, 1e-3)]))
def test_dpargmax_returns_only_a_true_majority(hist, params):
    counts, tail = hist
    mech = DPArgMax(*params)
    L = mech.error_bound
    dense = np.array(counts)
    n = int(dense.sum()) + tail
    top = int(dense.max())
    dist = mech.output_distribution(dense, num_teachers=n)
    for token, p in zip(dist.tokens, dist.probabilities):
        assert p > 0 and 2 * dense[token] > n and dense[token] == top  # only a strict majority, the maximiser
    if 2 * top > n + 4 * L:
        assert dist.fail == 0.0 and dist.probability(int(np.argmax(dense))) == 1.0
    if 2 * top <= n:
        assert dist.fail == 1.0
    values, _ = mech.sample_batch(repeated_batch(dict(enumerate(counts)), 50, n), rng=np.random.default_rng(top))
    assert np.all((values == FAIL_VALUE) | (2 * dense[np.maximum(values, 0)] > n))


def test_dpargmax_boundary_at_exactly_n_half_plus_2L():
    """A count c >= n/2 + 2L is often read as guaranteeing a yield; at equality c~ = n/2 + L (X = -L) is not
    above the threshold, so the yield probability is 1 - delta_eff (strictly above n/2 + 2L it is exactly 1)."""
    mech = DPArgMax(1.0, 1e-6)
    L = mech.error_bound
    at = mech.output_distribution({0: 500 + 2 * L, 1: 500 - 2 * L})
    assert at.fail == pytest.approx(delta_effective(1.0, L), rel=1e-12)
    assert mech.output_distribution({0: 501 + 2 * L, 1: 499 - 2 * L}).fail == 0.0


# --- Lemma distalghigh (diversity preservation of LArgMax_L) ---------------------------------------
BETA = 0.5 * 0.6 * math.log(18 / 17)
LEMMA_CASES = [
    # (relation, support m of token 0, its probability q)
    ("replace-one", 600, 0.3),
    ("replace-one", 800, 0.05),
    ("replace-one", 1000, 0.02),
    (ADD_REMOVE, 600, 0.1),
]


@pytest.mark.parametrize("relation, support, q", LEMMA_CASES)
def test_dpargmax_is_diversity_preserving(relation, support, q):
    """n = 1000 and total (1, 1e-6): L = 27 (replace-one) or 14 (add-remove), both below n/30 = 33.3."""
    n, num = 1000, 3000
    mech = DPArgMax(1.0, 1e-6, relation=relation)
    assert mech.error_bound < n / 30
    teachers = disjoint_groups(n, support, vocab_size=n + 2, q=q)
    rng = np.random.default_rng(support + int(1000 * q))
    batch = batch_from_votes(coordinated_votes(teachers, num, rng), teachers.vocab_size)
    sample, tokens, probs = mech.batch_distributions(batch)
    per_sample = np.zeros(num)
    per_sample[sample[tokens == 0]] = probs[tokens == 0]  # Rao-Blackwellised P[output = 0 | histogram]
    estimate, se = per_sample.mean(), per_sample.std(ddof=1) / math.sqrt(num)
    z = z_bound(2 * len(LEMMA_CASES))
    assert support >= 0.6 * n
    assert estimate + z * se >= BETA * q * support / n  # transfer, tau = 0.6 n
    assert estimate - z * se <= 2.0 * teachers.average()[0]  # relevance, gamma = 2
    assert np.all(np.isin(tokens, [0]))  # only a majority token can be released


# --- inputs, outputs, validation ------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TruncatedGeometricNoisyArgMax, DPArgMax])
def test_histogram_forms_and_release(cls):
    mech = cls(1.0, 1e-6)
    dense = np.zeros(10, dtype=np.int64)
    dense[[2, 7]] = [190, 10]  # n = 200: 190 > n/2 + 2L = 154, so both mechanisms release token 2
    forms = [dense, dense.tolist(), {2: 190, 7: 10}, VoteHistogram([2, 7], [190, 10], num_teachers=200, vocab_size=10)]
    dists = [mech.output_distribution(f).as_dict() for f in forms]
    assert all(d == dists[0] for d in dists)
    for f in forms:
        r = mech(f, rng=np.random.default_rng(3))
        assert isinstance(r, Release) and r.value == 2 and r.event == mech.event and r.outcome == "token"
        assert 190 - mech.error_bound <= r.info["noisy_count"] <= 190 + mech.error_bound
    assert mech(dense).value == 2  # rng=None: fresh OS entropy
    empty = mech({}, rng=np.random.default_rng(0))
    assert empty.value is None and empty.failed
    assert mech.output_distribution({}).fail == 1.0
    batch = HistogramBatch.from_histograms([{}, {2: 190}], num_teachers=200)
    assert mech.run_batch(batch, rng=np.random.default_rng(0)).values.tolist() == [FAIL_VALUE, 2]


def test_mechanisms_are_frozen_value_objects():
    a, b = TruncatedGeometricNoisyArgMax(1, 1e-6), TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    assert a == b and hash(a) == hash(b) and isinstance(a.epsilon, float)
    assert a != TruncatedGeometricNoisyArgMax(1.0, 1e-6, relation=ADD_REMOVE)
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        a.epsilon = 2.0
    assert DPArgMax(0.5, 1e-6).noisy_argmax == TruncatedGeometricNoisyArgMax(0.5, 1e-6, relation=ADD_REMOVE)
    assert "relation='replace-one'" in repr(DPArgMax(1.0, 1e-6))


@pytest.mark.parametrize("cls", [TruncatedGeometricNoisyArgMax, DPArgMax])
@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((0.0, 1e-6), {}, ValueError, "epsilon must be > 0.0, got 0.0"),
        ((-1.0, 1e-6), {}, ValueError, "epsilon must be > 0.0, got -1.0"),
        ((float("inf"), 1e-6), {}, ValueError, "epsilon must be finite"),
        (("1", 1e-6), {}, TypeError, "epsilon must be a real number, got '1'"),
        ((1.0, 0.0), {}, ValueError, "delta must be > 0.0, got 0.0"),
        ((1.0, 1.0), {}, ValueError, "delta must be < 1.0, got 1.0"),
        ((1.0, -0.1), {}, ValueError, "delta must be > 0.0, got -0.1"),
        ((1.0, None), {}, TypeError, "delta must be a real number, got None"),
        ((1.0, 1e-6), {"relation": "swap"}, ValueError, "relation must be one of .* got 'swap'"),
        ((1.0, 1e-6), {"relation": 1}, ValueError, "relation must be one of .* got 1"),
    ],
)
def test_bad_parameters(cls, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls(*args, **kwargs)


@pytest.mark.parametrize("cls", [TruncatedGeometricNoisyArgMax, DPArgMax])
@pytest.mark.parametrize(
    "hist, num_teachers, error, message",
    [
        (np.array([1.5, 2.0]), None, ValueError, "integer counts, got 1.5"),
        (np.array([3, -1]), None, ValueError, "non-negative counts, got -1"),
        ({0: 2, 1: -1}, None, ValueError, "non-negative counts, got -1"),
        ({0: 2.5}, None, ValueError, "integer counts, got 2.5"),
        ({"a": 1}, None, TypeError, "integer token ids, got 'a'"),
        ([3, 3], 5, ValueError, "counts sum to 6, more than num_teachers=5"),
        ("abc", None, TypeError, "got str"),
    ],
)
def test_bad_histograms(cls, hist, num_teachers, error, message):
    mech = cls(1.0, 1e-6)
    with pytest.raises(error, match=message):
        mech(hist, rng=np.random.default_rng(0), num_teachers=num_teachers)
    with pytest.raises(error, match=message):
        mech.output_distribution(hist, num_teachers=num_teachers)


@pytest.mark.parametrize("cls", [TruncatedGeometricNoisyArgMax, DPArgMax])
@pytest.mark.parametrize("rng", [42, np.random.RandomState(0), "seed"])
def test_bad_rng(cls, rng):
    mech = cls(1.0, 1e-6)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mech({0: 5}, rng=rng)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mech({}, rng=rng)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mech.run_batch([{0: 5}], rng=rng)


def test_large_histograms_are_fast_and_normalised():
    """Many keys (near-ties and a long tail of single votes): the exact law stays normalised."""
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    cases = [np.r_[600, np.ones(400, int)], np.full(40, 25), np.ones(1000, int), np.full(2000, 28)]
    for counts in cases:
        dist = mech.output_distribution(counts)
        assert dist.probabilities.sum() + dist.fail == pytest.approx(1.0, abs=1e-12)
    uniform = mech.output_distribution(np.full(2000, 28))
    assert np.allclose(uniform.probabilities, 1 / 2000, rtol=1e-9)


def subset_law(hist: dict, epsilon_c: float, k: int) -> dict:
    """P[token wins] by summing, for each winner value v, over which other keys tie at v (each subset
    S with weight prod_S b_i prod_rest a_i / (|S| + 1)): a second, independent formula for realistic L."""
    pmf = tg_pmf(epsilon_c, k)
    cdf = np.cumsum(pmf)

    def b(c, v):
        return pmf[v - c + k] if abs(v - c) <= k else 0.0

    def a(c, v):  # P[c + X <= v - 1]; every v considered is >= k + 1, so this is "not released or below v"
        x = v - 1 - c
        return 0.0 if x < -k else (1.0 if x >= k else cdf[x + k])

    keys = [t for t, c in hist.items() if c > 0]
    out = {}
    for j in keys:
        others = [hist[i] for i in keys if i != j]
        total = 0.0
        for v in range(k + 1, hist[j] + k + 1):
            inner = 0.0
            for size in range(len(others) + 1):
                for tied in itertools.combinations(range(len(others)), size):
                    term = 1.0 / (size + 1)
                    for i, c in enumerate(others):
                        term *= b(c, v) if i in tied else a(c, v)
                    inner += term
            total += b(hist[j], v) * inner
        out[j] = total
    return out


@pytest.mark.parametrize(
    "hist",
    [
        {0: 40, 1: 40, 2: 38, 3: 30, 4: 2},
        {0: 20, 1: 20, 2: 20, 3: 20, 4: 20},
        {0: 60, 1: 30, 2: 29, 3: 1},
        {5: 28, 9: 27},
    ],
)
def test_exact_law_at_realistic_L_matches_subset_enumeration(hist):
    mech = TruncatedGeometricNoisyArgMax(1.0, 1e-6)
    want = subset_law(hist, mech.per_count_epsilon, mech.error_bound)
    dist = mech.output_distribution(hist)
    for token, p in want.items():
        assert dist.probability(token) == pytest.approx(p, rel=1e-11, abs=1e-15)
    assert dist.probabilities.sum() + dist.fail == pytest.approx(1.0, abs=1e-13)


# --- DPArgMax at the whole budget per count, proved by enumeration ------------------------------------------
def _dpargmax_joint(hist, epsilon: float, L: int) -> dict:
    """The law of DPArgMax's release (token, noisy count), computed here from the TG pmf alone: the
    majority token j (c_j > n/2, at most one) is released with c_j + X iff c_j + X > n/2 + L."""
    pmf = tg_pmf(epsilon, L)
    n = hist.num_teachers
    out = {None: 1.0}
    for token, c in hist.as_dict().items():
        if 2 * c > n:
            for x, p in zip(range(-L, L + 1), pmf):
                if 2 * (c + x) > n + 2 * L:
                    out[(token, c + x)] = p
                    out[None] -= p
    return out


@pytest.mark.parametrize("epsilon, delta", [(1.0, 0.1), (2.0, 0.05), (0.5, 0.2), (1.0, 1e-3)])
def test_dpargmax_whole_budget_per_count_is_exactly_dp_under_replace_one(epsilon, delta):
    """DPArgMax noises the majority count with TG(epsilon, L), L = truncation(epsilon, delta) (not
    epsilon/2): on every replace-one pair of histograms with at most 9 teachers over 3 tokens plus tail,
    both parities of n, the release (token, noisy count) is (epsilon, delta_eff)-DP, delta_eff <= delta.
    The bare-majority swap (n odd: (n+1)/2 and (n-1)/2 trade places) is where delta_eff is spent."""
    mech = DPArgMax(epsilon, delta)
    L = mech.error_bound
    assert L == truncation(epsilon, delta) and mech.per_count_epsilon == epsilon
    assert mech.effective_delta == pytest.approx(delta_effective(epsilon, L), rel=1e-12) and mech.effective_delta <= delta
    pairs = neighbouring_pairs(9, 3, "replace-one")
    laws = {}
    for hist in {h for pair in pairs for h in pair}:
        laws[hist] = _dpargmax_joint(hist, epsilon, L)
        # The implementation's token law is the marginal of this joint law.
        got = mech.output_distribution(hist).as_dict()
        for key, prob in marginal(laws[hist]).items():
            assert got.get(key, 0.0) == pytest.approx(prob, abs=1e-14)
    worst, swaps, parities = 0.0, 0, set()
    for first, second in pairs:
        p, q = laws[first], laws[second]
        value = hockey_stick(p, q, epsilon)  # both ways
        worst = max(worst, value)
        n = first.num_teachers
        a, b = first.as_dict(), second.as_dict()
        if n % 2 and any(2 * c == n + 1 for c in a.values()) and any(2 * c == n + 1 for c in b.values()):
            if max(a, key=a.get) != max(b, key=b.get):
                swaps += 1
                assert value == pytest.approx(delta_effective(epsilon, L), rel=1e-9)  # tight
        if value > 0:
            parities.add(n % 2)
    assert worst <= mech.effective_delta * (1 + 1e-9) + 1e-15
    assert swaps > 0 and parities == {0, 1}
    # The whole budget is used: at a smaller epsilon the same pairs need more than delta_eff.
    assert any(hockey_stick(laws[a], laws[b], 0.9 * epsilon) > mech.effective_delta for a, b in pairs)


def test_dpargmax_error_bound_is_the_whole_budget_value():
    """Total (1, 1e-6): L = 14 for DPArgMax under either relation (27 was the half-budget value, still used by
    the full NoisyArgMax, which releases every count)."""
    for relation in ("replace-one", ADD_REMOVE):
        assert DPArgMax(1.0, 1e-6, relation=relation).error_bound == 14
    assert TruncatedGeometricNoisyArgMax(1.0, 1e-6).error_bound == 27
    assert TruncatedGeometricNoisyArgMax(1.0, 1e-6, relation=ADD_REMOVE).error_bound == 14
