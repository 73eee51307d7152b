"""The exact samplers of ``mechanisms.randomness`` and where the bits come from.

Exactness is proven by computing each sampler's output law from its own code (``exact_enumeration``:
every path of its random choices, exact ``Fraction`` weights) and comparing it with the target law;
statistical checks (chi-square at fixed seeds) cover the real bit sources end to end.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mechanisms.randomness as randomness
from exact_enumeration import (
    BitBranching,
    ExpBranching,
    GeometricBranching,
    RatioBranching,
    enumerate_law,
)
from mechanisms import (
    BetweenThresholds,
    DPArgMax,
    DPWeightedSampling,
    OutcomeDistribution,
    ThresholdWeightedSampling,
    TruncatedGeometricNoisyArgMax,
)
from mechanisms.base import sample_batch_outcomes
from mechanisms.between_thresholds import sample_discrete_laplace
from mechanisms.geometric import (
    INCLUSION_BITS,
    TruncatedGeometric,
    certified_inclusion,
    delta_effective,
    delta_effective_bounds,
    k_star,
    truncation,
)
from mechanisms.randomness import (
    GeneratorRandomBits,
    RandomBits,
    RationalLaw,
    SystemRandomBits,
    discrete_laplace_cut_law,
    exp_bounds,
    random_bits,
    sample_geometric,
    sample_laws,
    truncated_geometric_law,
    uniform_below,
)
from mechanisms.testing import check_counts_match_law

P_FLOOR = 1e-6  # chi-square significance (the seeds are fixed, so each check is deterministic)


def exp_decimal(x: Fraction, digits: int = 60) -> Fraction:
    """``e^x`` to ``digits`` significant digits, as a Fraction (an independent reference)."""
    with localcontext() as context:
        context.prec = digits + 10
        return Fraction((Decimal(x.numerator) / Decimal(x.denominator)).exp())


def check_law(observed, probabilities) -> None:
    """Chi-square of the counts ``observed[i]`` against the probabilities ``probabilities[i]`` at ``P_FLOOR``
    (``mechanisms.testing.check_counts_match_law``: rare bins pooled, impossible outcomes refused)."""
    check_counts_match_law(dict(enumerate(observed)), dict(enumerate(probabilities)), alpha=P_FLOOR)


def tg_probabilities(epsilon: float, k: int) -> np.ndarray:
    w = np.exp(-epsilon * np.abs(np.arange(-k, k + 1)))
    return w / w.sum()


# --- 1. exact laws, computed from the samplers' code ---------------------------------------------------
@pytest.mark.parametrize("p", [0.3, 7.7e-18, 1 - 2.0**-53, 5 * 2.0**-200, 0.5, 3 * 2.0**-70, 0.0, 1.0])
@pytest.mark.parametrize("chunk", [1, 3])
def test_bernoulli_of_a_float_is_exactly_that_float(p, chunk):
    # The comparison of U's bits with p's binary expansion, chunk by chunk, over every bit path: a finite tree.
    class Source(BitBranching):
        CHUNK_BITS = chunk

    law, unfinished, restart = enumerate_law(lambda prefix: Source(prefix, 2000), lambda s: s.bernoulli(p))
    assert unfinished == restart == 0
    assert law.get(True, 0) == Fraction(p) and law.get(False, 0) == 1 - Fraction(p)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12, 37])
def test_below_is_exactly_uniform(n):
    rounds = 3 if n < 16 else 2
    k = (n - 1).bit_length()
    law, unfinished, _ = enumerate_law(lambda prefix: BitBranching(prefix, rounds * k), lambda s: s.below(n))
    assert sorted(law) == list(range(n))
    assert len(set(law.values())) == 1  # every value has the same probability
    assert sum(law.values()) + unfinished == 1
    assert unfinished == Fraction(2**k - n, 2**k) ** rounds  # every round rejects with probability 1 - n/2^k


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 7)])
def test_bernoulli_exp_is_the_alternating_series(gamma):
    # For gamma <= 1 the trials stop at K with P[K > j] = gamma^j / j!; truncated at depth D the enumerated
    # P[True] is exactly sum_{K odd <= D} P[K], and the cut mass is gamma^D / D!.
    depth = 14
    law, unfinished, _ = enumerate_law(
        lambda prefix: RatioBranching(prefix, depth), lambda s: s.bernoulli_exp(gamma)
    )
    trials = depth + (gamma == 1)  # a trial of probability 1 (gamma / 1 = 1) makes no random choice
    survive = [gamma**j / math.factorial(j) for j in range(trials + 1)]  # P[K > j]
    expected = sum(survive[j - 1] - survive[j] for j in range(1, trials + 1, 2))
    assert law.get(True, 0) == expected
    assert unfinished == (survive[trials] if gamma else 0)
    true = exp_decimal(-gamma)
    assert law.get(True, 0) <= true <= law.get(True, 0) + unfinished


@pytest.mark.parametrize("gamma", [Fraction(7, 5), Fraction(3), Fraction(0.1)])
def test_bernoulli_exp_above_one_and_float_rates(gamma):
    depth = 30
    law, unfinished, _ = enumerate_law(
        lambda prefix: RatioBranching(prefix, depth), lambda s: s.bernoulli_exp(gamma)
    )
    true = exp_decimal(-gamma)
    assert law.get(True, 0) <= true <= law.get(True, 0) + unfinished
    assert unfinished < Fraction(1, 10**18)


@pytest.mark.parametrize("s, t", [(1, 1), (1, 2), (3, 2), (2, 3), (5, 4)])
def test_geometric_construction_is_exact(s, t):
    # With e^(-1/t) replaced by a rational y (consistently: e^-1 = y^t), the geometric draw must have the
    # law (1 - y^s) y^(s g): computed here from every path of the sampler's own choices.
    # One round of the rejection loop for u is enumerated (a rejected u starts an i.i.d. round: restart).
    y = Fraction(3, 5)
    law, unfinished, restart = enumerate_law(
        lambda prefix: ExpBranching(prefix, 40, y, t), lambda src: src.geometric_ratio(s, t)
    )
    assert unfinished < Fraction(1, 10**6)
    for g in range(4):
        target = (1 - y**s) * y ** (s * g)
        assert law.get(g, 0) / (1 - restart) <= target <= (law.get(g, 0) + unfinished) / (1 - restart)
    # the cut mass is the only gap: what the paths reached sums to one minus it
    assert sum(law.values()) + unfinished + restart == 1


def _one_round_law(make, run):
    law, unfinished, restart = enumerate_law(make, run)
    assert unfinished == 0
    return {x: w / (1 - restart) for x, w in law.items()}


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-18), (0.5, 1e-18), (0.3, 1e-6), (2.0, 1e-12)])
def test_truncated_geometric_extreme_outcome_has_exactly_its_probability(epsilon, delta):
    # TG(eps, k) at delta_eff ~ 1e-18: its magnitude is G mod (k + 1) for a geometric G and its sign a fair
    # bit with (negative, 0) rejected.  Enumerating one round of those inner steps (G in 0..k, the tail
    # G > k being a fresh draw by memorylessness; a rejected sign a fresh round) gives the sampler's law
    # exactly; with q standing for e^-eps it must be A q^|x|, A = (1 - q) / (1 + q - 2 q^(k+1)).
    k = truncation(epsilon, delta)
    q = Fraction(math.exp(-epsilon))
    law = _one_round_law(
        lambda prefix: GeometricBranching(prefix, 10, q, k, "restart"),
        lambda src: src.truncated_geometric(epsilon, k),
    )
    a = (1 - q) / (1 + q - 2 * q ** (k + 1))
    assert set(law) == set(range(-k, k + 1))
    for x in range(-k, k + 1):
        assert law[x] == a * q ** abs(x)
    assert float(law[k]) == pytest.approx(delta_effective(epsilon, k), rel=1e-12)
    assert 0 < law[k] <= Fraction(delta)


def test_extreme_outcome_is_reached_by_the_real_bit_sampler():
    # A scripted bit string that drives the real integer sampler to +-k at delta ~ 1e-18 (eps = 1: each
    # Bernoulli(e^-1) success is the bit 0 (Bernoulli(1/2)) then the 2-bit value 1 (fails Bernoulli(1/3))).
    epsilon, k = 1.0, truncation(1.0, 1e-18)
    assert delta_effective(epsilon, k) < 1e-18

    class Scripted(RandomBits):
        def __init__(self, script):
            super().__init__()
            self.script = list(script)

        def _fresh(self, num_bytes):  # every bit comes from the script through bits()
            raise AssertionError("a scripted source has no raw bytes")

        def bits(self, n):
            expected, value = self.script.pop(0)
            assert n == expected
            return value

    success = [(1, 0), (2, 1)]
    failure = [(1, 1)]
    for sign, want in ((0, k), (1, -k)):
        source = Scripted(success * k + failure + [(1, sign)])
        assert source.truncated_geometric(epsilon, k) == want and not source.script
    # k + 1 successes wrap around to magnitude 0 (the law is TG, never |X| > k)
    source = Scripted(success * (k + 1) + failure + [(1, 0)])
    assert source.truncated_geometric(epsilon, k) == 0
    # A float64 inverse-CDF table cannot represent this outcome: its last step 1 - P[X <= k - 1] is a
    # rounding residue hundreds of times the true probability (so a float sampler would realise that).
    noise = TruncatedGeometric(epsilon, k)
    assert abs((1.0 - float(noise.cdf(k - 1))) - float(noise.pmf(k))) > 100 * float(noise.pmf(k))


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 3.0])
def test_discrete_laplace_construction_is_exact(epsilon):
    q = Fraction(math.exp(-epsilon))
    g_max = 12
    law, unfinished, restart = enumerate_law(
        lambda prefix: GeometricBranching(prefix, 10, q, g_max, "value"),
        lambda src: src.discrete_laplace(epsilon),
    )
    assert unfinished == 0
    for z in range(-g_max, g_max + 1):
        assert law[z] / (1 - restart) == (1 - q) / (1 + q) * q ** abs(z)


@pytest.mark.parametrize("s2", [Fraction(1, 3), Fraction(9, 4), Fraction(50), Fraction(10**6 + 1, 7)])
def test_discrete_gaussian_rejection_keeps_the_gaussian_law(s2):
    """The discrete Gaussian sampler's kept law (a discrete Laplace of rate 1/t times the acceptance
    exp(-(|y| - s2/t)^2 / (2 s2))) is exp(-y^2 / (2 s2)) times a constant, in exact arithmetic: the exponents
    differ by -s2 / (2 t^2) for every y.  The sampler itself draws only from those two exact laws."""
    t = math.isqrt(s2.numerator // s2.denominator) + 1
    assert (t - 1) ** 2 <= s2 < t**2  # t = floor(sigma) + 1
    for y in range(-40, 41):
        kept = -Fraction(abs(y), t) - (abs(y) - s2 / t) ** 2 / (2 * s2)
        assert kept + Fraction(y * y) / (2 * s2) == -s2 / (2 * t * t)
    # a draw goes through discrete_laplace(1/t) and bernoulli_exp of exactly that exponent
    calls = []

    class Recording(GeneratorRandomBits):
        def discrete_laplace(self, gamma):
            calls.append(("laplace", gamma))
            return super().discrete_laplace(gamma)

        def bernoulli_exp(self, gamma):
            calls.append(("accept", gamma))
            return super().bernoulli_exp(gamma)

    y = Recording(np.random.default_rng(5)).discrete_gaussian(s2)
    assert calls[0] == ("laplace", Fraction(1, t)) and calls[-1] == ("accept", (abs(y) - s2 / t) ** 2 / (2 * s2))


def test_categorical_is_exact():
    weights = [0.25, Fraction(1, 3), 0, 2.0**-10, 7]  # small common denominator: every value of below
    law, unfinished, _ = enumerate_law(lambda prefix: RatioBranching(prefix, 4), lambda s: s.categorical(weights))
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    assert unfinished == 0
    assert {i: law.get(i, 0) for i in range(5)} == {i: w / total for i, w in enumerate(exact)}
    with pytest.raises(ValueError, match="weights must not all be zero"):
        SystemRandomBits().categorical([0, 0.0])
    with pytest.raises(ValueError, match=r"weights\[1\] must be >= 0"):
        SystemRandomBits().categorical([1, -0.5])


# --- 2. vectorised laws: exact thresholds and tie resolution --------------------------------------------
class ScriptedWords(RandomBits):
    """Words and 64-bit chunks from a script (to force ties with thresholds)."""

    def __init__(self, words, chunks=()):
        super().__init__()
        self.script_words, self.chunks = list(words), list(chunks)

    def _fresh(self, num_bytes):  # every bit comes from the script through words() and bits()
        raise AssertionError("a scripted source has no raw bytes")

    def words(self, size):
        out, self.script_words = self.script_words[:size], self.script_words[size:]
        return np.array(out, dtype=np.uint64)

    def bits(self, k):
        assert k == 64
        return self.chunks.pop(0)


def test_rational_law_resolves_ties_exactly():
    law = RationalLaw([1, 2])  # boundary 1/3, whose binary expansion never ends
    first = (1 << 64) // 3
    second = ((1 << 128) // 3) - (first << 64)
    assert law.thresholds().tolist() == [first]
    assert law.sample(ScriptedWords([first - 1]), 1).tolist() == [0]
    assert law.sample(ScriptedWords([first + 1]), 1).tolist() == [1]
    assert law.sample(ScriptedWords([first], [second - 1]), 1).tolist() == [0]
    assert law.sample(ScriptedWords([first], [second + 1]), 1).tolist() == [1]
    third = ((1 << 192) // 3) - (((1 << 128) // 3) << 64)
    assert law.sample(ScriptedWords([first], [second, third - 1]), 1).tolist() == [0]
    assert law.sample(ScriptedWords([first], [second, third + 1]), 1).tolist() == [1]


def test_a_boundary_at_one_is_never_crossed():
    # F = 1 exactly (an outcome of probability 0 after it): the threshold word 2^64 - 1 is a tie that the
    # deeper bits always settle below 1.
    law = RationalLaw([1, 0])
    assert law.thresholds().tolist() == [(1 << 64) - 1]
    top = (1 << 64) - 1
    assert law.sample(ScriptedWords([top], [top, top]), 1).tolist() == [0]
    assert law.sample(ScriptedWords([0, top], [0]), 2).tolist() == [0, 0]
    # DPWS with full retention at c = n (pi~(n) = 1) includes the token surely
    mech = DPWeightedSampling(4.0, 0.6)
    assert certified_inclusion(5, *mech.per_count)[5] == 1 << INCLUSION_BITS
    assert mech.run_batch([{0: 5}] * 200, rng=np.random.default_rng(0)).values.tolist() == [0] * 200


@pytest.mark.parametrize("epsilon, k", [(1.0, 41), (0.05, 300), (0.7, 3)])
def test_truncated_geometric_thresholds_are_the_exact_leading_bits(epsilon, k):
    law = truncated_geometric_law(epsilon, k)
    # independent reference: the cumulative sums at 80 digits with decimal
    with localcontext() as context:
        context.prec = 80
        r = Decimal(-epsilon).exp()
        weights = [r ** abs(x) for x in range(-k, k + 1)]
        total = sum(weights)
        running, cdf = Decimal(0), []
        for w in weights[:-1]:
            running += w
            cdf.append(running / total)
        expected = [int((c * (Decimal(2) ** 128)).to_integral_value(rounding="ROUND_FLOOR")) for c in cdf]
    assert law.prefix(2) == expected
    assert law.thresholds().tolist() == [e >> 64 for e in expected]
    # a word equal to a threshold is decided by the next bits of the boundary
    x = 2 * k  # boundary between x = k - 1 and x = k (the extreme outcome)
    word, chunk = expected[x - 1] >> 64, expected[x - 1] & ((1 << 64) - 1)
    assert law.sample(ScriptedWords([word], [chunk - 1]), 1).tolist() == [x - 1]
    assert law.sample(ScriptedWords([word], [chunk + 1]), 1).tolist() == [x]


def test_truncated_geometric_extreme_value_is_drawn_at_its_rate():
    # TG(0.5, 27) at delta_c = 5e-7: P[X = 27] = 3.4e-7.  2e7 exact vectorised draws.
    noise = TruncatedGeometric(0.5, 27)
    source = random_bits(np.random.default_rng(7))
    num, hits = 20_000_000, 0
    for _ in range(num // 2_000_000):
        draws = noise.sample(source, 2_000_000)
        assert np.abs(draws).max() <= 27
        hits += int((draws == 27).sum())
    mean = num * float(noise.pmf(27))
    assert abs(hits - mean) <= 5 * math.sqrt(mean)


@settings(max_examples=40, deadline=None)
@given(epsilon=st.floats(0.01, 8.0), k=st.integers(0, 80))
def test_truncated_geometric_thresholds_track_the_float_cdf(epsilon, k):
    # Invariant: the exact thresholds are non-decreasing and agree with the float64 cdf to its accuracy.
    thresholds = truncated_geometric_law(epsilon, k).thresholds()
    assert np.all(np.diff(thresholds.astype(object)) >= 0)
    cdf = TruncatedGeometric(epsilon, k).cdf(np.arange(-k, k))
    assert np.allclose(thresholds.astype(np.float64) * 2.0**-64, cdf, rtol=0, atol=1e-13)


@pytest.mark.parametrize("epsilon, cuts", [(0.3, [-3, 4]), (1.0, [-40, 30]), (2.0, [0, 1, 5])])
def test_discrete_laplace_cut_law_thresholds(epsilon, cuts):
    law = discrete_laplace_cut_law(epsilon, cuts)
    with localcontext() as context:
        context.prec = 80
        r = Decimal(-epsilon).exp()
        cdf = [r ** (-x) / (1 + r) if x < 0 else 1 - r ** (x + 1) / (1 + r) for x in cuts]
        expected = [int((c * (Decimal(2) ** 128)).to_integral_value(rounding="ROUND_FLOOR")) for c in cdf]
    assert law.prefix(2) == expected


def test_exp_bounds_enclose_the_true_value():
    for x in [0.1, -0.1, 1.0, -37.5, Fraction(2, 3), -700.0]:
        lo, hi = exp_bounds(x, 200)
        true = exp_decimal(Fraction(x), 120) * 2**200
        assert lo <= true <= hi and hi - lo <= 4 + true / 10**50


# --- 3. chi-square of each sampler against its pmf, real bit sources ------------------------------------
def test_scalar_samplers_chi_square():
    source = random_bits(np.random.default_rng(101))
    n = 4000
    # Bernoulli of floats
    for p in (0.3, 0.97):
        hits = sum(source.bernoulli(p) for _ in range(n))
        check_law([hits, n - hits], [p, 1 - p])
    # Bernoulli(e^-gamma)
    for gamma in (Fraction(1, 3), Fraction(2.5)):
        hits = sum(source.bernoulli_exp(gamma) for _ in range(n))
        p = math.exp(-float(gamma))
        check_law([hits, n - hits], [p, 1 - p])
    # below
    draws = np.array([source.below(7) for _ in range(n)])
    check_law(np.bincount(draws, minlength=7), np.full(7, 1 / 7))
    # geometric
    gamma = 0.4
    draws = np.array([source.geometric_exp(gamma) for _ in range(n)])
    top = 15
    observed = np.append(np.bincount(np.minimum(draws, top), minlength=top + 1)[:top], (draws >= top).sum())
    pmf = (1 - math.exp(-gamma)) * np.exp(-gamma * np.arange(top))
    check_law(observed, np.append(pmf, math.exp(-gamma * top)))
    # discrete Laplace
    draws = np.array([source.discrete_laplace(0.8) for _ in range(n)])
    r = math.exp(-0.8)
    edges = np.arange(-6, 7)
    observed = [(draws < -6).sum()] + [(draws == z).sum() for z in edges] + [(draws > 6).sum()]
    pmf = (1 - r) / (1 + r) * r ** np.abs(edges)
    tail = r**7 / (1 + r)
    check_law(observed, np.concatenate([[tail], pmf, [tail]]))
    # discrete Gaussian, untruncated (sigma^2 = 2.25 and 6.5: t = 2 and 3)
    for s2 in (2.25, Fraction(13, 2)):
        draws = np.array([source.discrete_gaussian(s2) for _ in range(n)])
        edges = np.arange(-7, 8)
        weights = np.exp(-np.arange(-60, 61) ** 2 / (2 * float(s2)))
        pmf = weights / weights.sum()
        tail = pmf[: 60 - 7].sum()
        observed = [(draws < -7).sum()] + [(draws == z).sum() for z in edges] + [(draws > 7).sum()]
        check_law(observed, np.concatenate([[tail], pmf[60 - 7: 60 + 8], [tail]]))
    # TG
    draws = np.array([source.truncated_geometric(0.6, 5) for _ in range(n)])
    check_law(np.bincount(draws + 5, minlength=11), tg_probabilities(0.6, 5))
    # categorical
    weights = [0.2, 0.5, 0.3]
    draws = np.array([source.categorical(weights) for _ in range(n)])
    check_law(np.bincount(draws, minlength=3), weights)


def test_vectorised_samplers_chi_square():
    source = random_bits(np.random.default_rng(202))
    n = 200_000
    draws = TruncatedGeometric(0.5, 9).sample(source, n)
    check_law(np.bincount(draws + 9, minlength=19), tg_probabilities(0.5, 9))
    gamma, top = 0.3, 30
    draws = sample_geometric(gamma, n, source)
    observed = np.append(np.bincount(np.minimum(draws, top), minlength=top + 1)[:top], (draws >= top).sum())
    pmf = (1 - math.exp(-gamma)) * np.exp(-gamma * np.arange(top))
    check_law(observed, np.append(pmf, math.exp(-gamma * top)))
    draws = sample_discrete_laplace(0.7, source, size=n)
    r = math.exp(-0.7)
    edges = np.arange(-8, 9)
    observed = [(draws < -8).sum()] + [(draws == z).sum() for z in edges] + [(draws > 8).sum()]
    tail = r**9 / (1 + r)
    check_law(observed, np.concatenate([[tail], (1 - r) / (1 + r) * r ** np.abs(edges), [tail]]))
    draws = uniform_below(np.array([3, 5, 7] * (n // 3)), source)
    for m, offset in ((3, 0), (5, 1), (7, 2)):
        check_law(np.bincount(draws[offset::3], minlength=m), np.full(m, 1 / m))
    laws = [RationalLaw([1, 1, 2]), RationalLaw([Fraction(1, 3), 0, Fraction(2, 3)])]
    which = np.arange(n) % 2
    draws = sample_laws(laws, which, source)
    check_law(np.bincount(draws[which == 0], minlength=3), [0.25, 0.25, 0.5])
    check_law(np.bincount(draws[which == 1], minlength=3), [1 / 3, 0, 2 / 3])


def test_batch_outcomes_exact_fallback():
    # Words chosen next to a running sum force the exact path; its answer is the exact comparison.
    sample, tokens = np.array([0, 0]), np.array([10, 11])
    probs = np.array([0.5, 0.25])
    half = 1 << 63
    assert sample_batch_outcomes(sample, tokens, probs, 1, ScriptedWords([half])).tolist() == [11]
    assert sample_batch_outcomes(sample, tokens, probs, 1, ScriptedWords([half - 1])).tolist() == [10]
    three_quarters = 3 << 62
    assert sample_batch_outcomes(sample, tokens, probs, 1, ScriptedWords([three_quarters])).tolist() == [-1]
    # A probability below 2^-64 is decided by more bits of U.
    tiny = np.array([2.0**-80, 0.5])

    class Bits(ScriptedWords):
        def bits(self, k):
            return self.chunks.pop(0)

    assert sample_batch_outcomes(sample, tokens, tiny, 1, Bits([0], [0])).tolist() == [10]
    assert sample_batch_outcomes(sample, tokens, tiny, 1, Bits([0], [1 << 15])).tolist() == [11]
    # and the fast path agrees with the law
    source = random_bits(np.random.default_rng(5))
    n = 100_000
    sample = np.repeat(np.arange(n), 2)
    tokens = np.tile([3, 4], n)
    probs = np.tile([0.2, 0.7], n)
    values = sample_batch_outcomes(sample, tokens, probs, n, source)
    check_law([(values == 3).sum(), (values == 4).sum(), (values == -1).sum()], [0.2, 0.7, 0.1])


def test_outcome_distribution_sample_is_exact_and_normalised():
    dist = OutcomeDistribution(np.array([5, 6]), np.array([0.25, 2.0**-13]), 0.75)  # sums to 1 + 2^-13
    law, unfinished, _ = enumerate_law(lambda prefix: RatioBranching(prefix, 4), lambda s: dist.sample(s))
    total = Fraction(1) + Fraction(2.0**-13)
    assert unfinished == 0
    assert law == {5: Fraction(0.25) / total, 6: Fraction(2.0**-13) / total, None: Fraction(0.75) / total}
    assert OutcomeDistribution(np.array([1]), np.array([0.0]), 0.0).sample() is None
    with pytest.raises(ValueError, match=r"probabilities\[0\] must be a finite probability"):
        OutcomeDistribution(np.array([1, 2]), np.array([-0.1, 0.5]), 0.6).sample()


# --- 4. certified parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon, delta", [(0.5, 5e-7), (1.0, 1e-18), (0.05, 1e-10), (2.0, 0.3), (0.5, 1e-300)])
def test_truncation_is_the_least_certified_k(epsilon, delta):
    k = truncation(epsilon, delta)
    assert delta_effective_bounds(epsilon, k)[1] <= Fraction(delta)
    if k > 0:
        assert delta_effective_bounds(epsilon, k - 1)[0] > Fraction(delta)
    assert k == max(0, math.ceil(k_star(epsilon, delta)))  # agrees with the float formula here
    # and against an independent evaluation
    r = exp_decimal(-Fraction(epsilon), 80)
    exact = (1 - r) * r**k / (1 + r - 2 * r ** (k + 1))
    lo, hi = delta_effective_bounds(epsilon, k)
    assert lo <= exact * (1 + Fraction(1, 10**60)) and exact <= hi * (1 + Fraction(1, 10**60))


@pytest.mark.parametrize(
    "epsilon_c, delta_c, n",
    [(0.5, 5e-7, 100), (0.5, 5e-7, 1000), (0.25, 5e-9, 300), (1.0, 5e-11, 2000), (0.5, 5e-19, 200), (2.0, 5e-4, 50)],
)
def test_certified_inclusion_is_exactly_private(epsilon_c, delta_c, n):
    # Every neighbouring pair of counts: the hockey-stick divergence between Bernoulli(pi(c-1)) and
    # Bernoulli(pi(c)) at e^eps_c (a lower bound on it: conservative), in exact rational arithmetic.
    table = [Fraction(v, 1 << INCLUSION_BITS) for v in certified_inclusion(n, epsilon_c, delta_c)]
    e = exp_decimal(Fraction(epsilon_c), 60) * (1 - Fraction(1, 10**50))
    worst = Fraction(0)
    for c in range(1, n + 1):
        p, q = table[c], table[c - 1]
        worst = max(worst, p - e * q, q - e * p, (1 - p) - e * (1 - q), (1 - q) - e * (1 - p))
    assert worst <= Fraction(delta_c)
    assert all(table[c] <= Fraction(c, n) for c in range(n + 1)) and table[0] == 0
    # and it is the float recursion's table, to far better than the float recursion's own error
    from mechanisms.weighted_sampling import inclusion_table

    floats = inclusion_table(n, epsilon_c, delta_c)
    for c in range(1, n + 1):
        assert float(table[c]) == pytest.approx(floats[c], rel=1e-12)
        if c < n:
            assert float(1 - table[c]) == pytest.approx(1 - floats[c], rel=1e-11)


# --- 5. where the bits come from ---------------------------------------------------------------------
@pytest.fixture
def os_bytes(monkeypatch):
    calls = []
    real = randomness._system_bytes

    def counting(num_bytes):
        calls.append(num_bytes)
        return real(num_bytes)

    monkeypatch.setattr(randomness, "_system_bytes", counting)
    return calls


def _mechanism_runs():
    hist = {0: 30, 1: 12, 2: 3}
    return [
        ("DPArgMax", lambda rng: DPArgMax(1.0, 1e-6)(hist, rng=rng)),
        ("DPArgMax.run_batch", lambda rng: DPArgMax(1.0, 1e-6).run_batch([hist] * 3, rng=rng)),
        ("NoisyArgMax", lambda rng: TruncatedGeometricNoisyArgMax(1.0, 1e-6)(hist, rng=rng)),
        ("NoisyArgMax.run_batch", lambda rng: TruncatedGeometricNoisyArgMax(1.0, 1e-6).run_batch([hist] * 3, rng=rng)),
        ("DPWeightedSampling", lambda rng: DPWeightedSampling(1.0, 1e-6, release_counts=True)(hist, rng=rng)),
        ("DPWeightedSampling.run_batch", lambda rng: DPWeightedSampling(1.0, 1e-6).run_batch([hist] * 3, rng=rng)),
        ("BetweenThresholds", lambda rng: BetweenThresholds(0.5, 10, 20)(15, rng=rng)),
        ("BetweenThresholds.run_batch", lambda rng: BetweenThresholds(0.5, 10, 20).run_batch([1, 15, 30], rng=rng)),
        ("BetweenThresholds.on_token", lambda rng: BetweenThresholds(0.5, 5, 20).on_token(1)(hist, rng=rng)),
        ("ThresholdWeightedSampling", lambda rng: ThresholdWeightedSampling(2)(hist, rng=rng)),
        ("ThresholdWeightedSampling.run_batch",
         lambda rng: ThresholdWeightedSampling(2).run_batch([hist] * 3, rng=rng)),
        ("TruncatedGeometric.sample", lambda rng: TruncatedGeometric(0.5, 10).sample(rng)),
        ("sample_discrete_laplace", lambda rng: sample_discrete_laplace(0.5, rng, size=4)),
        ("OutcomeDistribution.sample", lambda rng: OutcomeDistribution(np.array([1, 2]), np.array([0.5, 0.3]), 0.2).sample(rng)),
    ]


@pytest.mark.parametrize("name, run", _mechanism_runs())
def test_default_noise_comes_from_the_os_csprng(name, run, os_bytes):
    run(None)
    assert os_bytes, f"{name} drew no bytes from the operating system's random number generator"
    os_bytes.clear()
    run(np.random.default_rng(0))
    assert not os_bytes, f"{name} used the operating system's randomness although a Generator was given"


def test_default_source_is_fresh_per_call():
    assert isinstance(random_bits(None), SystemRandomBits)
    assert random_bits(None) is not random_bits(None)
    generator = np.random.default_rng(3)
    assert isinstance(random_bits(generator), GeneratorRandomBits)
    own = SystemRandomBits()
    assert random_bits(own) is own


def _value(release):
    if hasattr(release, "values"):
        return release.values.tolist()
    if hasattr(release, "value"):
        return (release.value, sorted(release.info.items()) if release.info else None)
    return np.asarray(release).tolist()


@pytest.mark.parametrize("name, run", _mechanism_runs())
def test_a_seeded_generator_gives_reproducible_draws(name, run):
    first = [_value(run(np.random.default_rng(seed))) for seed in range(25)]
    again = [_value(run(np.random.default_rng(seed))) for seed in range(25)]
    assert first == again
    generator = np.random.default_rng(99)
    stream = [_value(run(generator)) for _ in range(25)]
    generator = np.random.default_rng(99)
    assert stream == [_value(run(generator)) for _ in range(25)]


@pytest.mark.parametrize("bad", [424242, "my-secret-seed", np.random.RandomState(0), 1.25])
def test_bad_rng_is_rejected_without_showing_the_value(bad):
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator") as info:
        random_bits(bad)
    assert str(bad) not in str(info.value)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        BetweenThresholds(0.5, 10, 20)(15, rng=bad)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        TruncatedGeometric(0.5, 3).sample(bad)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda s: s.bernoulli(1.5), ValueError, "p must be <= 1, got 1.5"),
        (lambda s: s.bernoulli(float("nan")), ValueError, "p must be finite"),
        (lambda s: s.bernoulli("0.5"), TypeError, "p must be a rational number"),
        (lambda s: s.bernoulli_exp(-1), ValueError, "gamma must be >= 0, got -1.0"),
        (lambda s: s.geometric_exp(0), ValueError, "gamma must be > 0, got 0.0"),
        (lambda s: s.truncated_geometric(0.5, -1), ValueError, "k must be >= 0, got -1"),
        (lambda s: s.truncated_geometric(0.5, 2.0), TypeError, "k must be an integer"),
        (lambda s: s.below(0), ValueError, "n must be >= 1, got 0"),
    ],
)
def test_sampler_arguments_are_checked(call, error, message):
    with pytest.raises(error, match=message):
        call(SystemRandomBits())
