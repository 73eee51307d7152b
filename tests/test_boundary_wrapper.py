"""The q-target certifier (``mechanisms.qtarget``) and the TCT boundary wrapper (paper, "Privacy analysis
considerations"; docs/mechanisms/boundary_wrapper.md)."""

import math
from fractions import Fraction

import attr
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mechanisms import (
    FAIL_VALUE,
    DPArgMax,
    OutcomeDistribution,
    ThresholdArgMax,
    ThresholdWeightedSampling,
    as_histogram,
)
from mechanisms.between_thresholds import BetweenThresholds, discrete_laplace_sf
from mechanisms.boundary_wrapper import (
    MAX_EPSILON_FOR_ONE_THIRD,
    TARGET,
    BoundaryWrapper,
    WrappedDistribution,
    binary_worst_case_q,
    boundary_wrapper_q,
    target_probability,
    wrap_probabilities,
)
from mechanisms.qtarget import pure_dp_level, q_star, q_star_rows, q_target_decomposition, worst_case_q
from mechanisms.testing import check_counts_match_law, check_privacy_claim
from pate_accountant import Release
from pate_accountant.events import BoundaryWrapperEvent, EpsilonDeltaEvent

P_VALUE_FLOOR = 1e-4


# --- test-local mechanisms ---------------------------------------------------------------------------
@attr.s(frozen=True)
class NoisyThresholdBinary:
    """Binary pure eps-DP mechanism: release ``token`` with probability ``s(c) = P[c + Z >= threshold]``
    (``Z`` discrete Laplace), else fail.  One vote moving changes ``c`` by at most one, and both ``s`` and
    ``1 - s`` are discrete-Laplace tail probabilities, whose neighbouring ratios are at most ``e^eps``."""

    epsilon = attr.ib()
    token = attr.ib(default=0)
    threshold = attr.ib(default=3)

    @property
    def event(self):
        return EpsilonDeltaEvent(self.epsilon)

    def output_distribution(self, histogram, num_teachers=None):
        c = as_histogram(histogram, num_teachers).count(self.token)
        s = float(discrete_laplace_sf(self.threshold - c, self.epsilon))
        return OutcomeDistribution(np.array([self.token]), np.array([s]), 1.0 - s)


@attr.s(frozen=True)
class ExponentialChoice:
    """Multi-outcome pure eps-DP mechanism over tokens ``0 .. vocab - 1`` and fail: outcome ``j`` with
    probability proportional to ``exp(eps c_j / 2)`` (fail scored by the tail votes).  One vote moving
    changes two scores by one, so each probability moves by at most ``e^{eps/2}`` in its numerator and
    ``e^{eps/2}`` in the normaliser."""

    epsilon = attr.ib()
    vocab = attr.ib(default=3)

    @property
    def event(self):
        return EpsilonDeltaEvent(self.epsilon)

    def output_distribution(self, histogram, num_teachers=None):
        h = as_histogram(histogram, num_teachers)
        scores = np.array([h.count(j) for j in range(self.vocab)] + [h.tail], dtype=float)
        weights = np.exp(self.epsilon / 2 * (scores - scores.max()))
        p = weights / weights.sum()
        return OutcomeDistribution(np.arange(self.vocab), p[:-1], p[-1])


@attr.s(frozen=True)
class WithEpsilon:
    """Gives a threshold mechanism a (fictitious) DP event so the wrapper accepts it: for the distribution-
    level properties (P[target] <= 1/3 ...) only, never for privacy claims."""

    mech = attr.ib()
    epsilon = attr.ib(default=0.1)

    @property
    def event(self):
        return EpsilonDeltaEvent(self.epsilon)

    def output_distribution(self, histogram, num_teachers=None):
        return self.mech.output_distribution(histogram, num_teachers)

    def batch_distributions(self, batch):
        return self.mech.batch_distributions(batch)


# --- the certifier ------------------------------------------------------------------------------------
def test_q_star_by_hand():
    e = math.exp(0.5)
    # Identical laws: the pair costs nothing.
    assert q_star([0.2, 0.8], [0.2, 0.8], 0.5) == 1.0
    assert q_star([0.0, 1.0], [0.0, 1.0], 0.5) == 1.0
    # A ratio above e^eps anywhere: no decomposition.
    assert q_star([0.5, 0.5], [0.1, 0.9], 0.5) == 0.0
    assert q_star([0.0, 1.0], [0.01, 0.99], 0.5) == 0.0
    # Two outcomes, target 0: the non-target coordinate shares (e m - M) / (e - 1).
    p0, p1 = np.array([0.3, 0.7]), np.array([0.25, 0.75])
    shared = (e * 0.7 - 0.75) / (e - 1)
    assert q_star(p0, p1, 0.5) == pytest.approx(0.25 / (1 - shared), rel=1e-12)
    assert q_star(p0, p1, 0.5) == pytest.approx(q_star(p1, p0, 0.5), rel=1e-14)
    # The target has no mass on either side: a q of 0.
    assert q_star([0.0, 0.4, 0.6], [0.0, 0.5, 0.5], 0.5) == 0.0


@pytest.mark.parametrize(
    "args, error, message",
    [
        (([0.5, 0.5], [0.5, 0.5, 0.0], 1.0), ValueError, "same shape"),
        (([0.5, 0.6], [0.5, 0.5], 1.0), ValueError, "p0 must sum to 1"),
        (([1.5, -0.5], [0.5, 0.5], 1.0), ValueError, "non-negative"),
        (([0.5, 0.5], [np.nan, 0.5], 1.0), ValueError, "finite"),
        (([0.5, 0.5], [0.5, 0.5], 0.0), ValueError, "epsilon must be > 0.0"),
        (([0.5, 0.5], [0.5, 0.5], 1.0, 2), ValueError, "target_index must be <= 1, got 2"),
        (([0.5, 0.5], [0.5, 0.5], 1.0, 0.5), TypeError, "target_index must be an integer"),
        ((["a", "b"], [0.5, 0.5], 1.0), TypeError, "p0 must hold real probabilities"),
        (([], [], 1.0), ValueError, "non-empty"),
    ],
)
def test_q_star_validates(args, error, message):
    with pytest.raises(error, match=message):
        q_star(*args)


def random_dp_pair(rng, k, eps):
    """A random pair of k-outcome laws with every ratio within e^eps (often at the boundary)."""
    while True:
        p0 = rng.dirichlet(np.full(k, rng.choice([0.1, 0.5, 2.0])))
        p0 = np.maximum(p0, 1e-12)
        p0 /= p0.sum()
        factor = np.exp(eps * rng.choice([-1.0, 1.0], size=k) * np.where(rng.random(k) < 0.7, 1.0, rng.random(k)))
        j = rng.integers(k)
        rest = float(np.delete(p0 * factor, j).sum())
        fj = (1 - rest) / p0[j]
        if math.exp(-eps) <= fj <= math.exp(eps):
            factor[j] = fj
            p1 = p0 * factor
            return p0, p1 / p1.sum()


def test_certifier_is_optimal_among_feasible_decompositions():
    # q_star is the best q: no randomly drawn valid decomposition (shared mass w_y within its bound, B parts
    # eps-indistinguishable) beats it, and the explicit decomposition attains it.
    rng = np.random.default_rng(4)
    eps = 0.4
    e = math.exp(eps)
    for _ in range(30):
        p0, p1 = random_dp_pair(rng, 4, eps)
        best = q_star(p0, p1, eps, 0)
        dec = q_target_decomposition(p0, p1, eps, 0)
        assert dec.q == pytest.approx(best, rel=1e-12)
        lo, hi = np.minimum(p0, p1), np.maximum(p0, p1)
        cap = np.maximum((e * lo - hi) / (e - 1), 0)
        for _ in range(200):
            w = cap * rng.random(4) * (rng.random(4) < 0.8)
            u = 1 - w.sum()
            b0, b1 = (p0 - w) / u, (p1 - w) / u
            assert np.all(np.maximum(b0, b1) <= e * np.minimum(b0, b1) * (1 + 1e-9))
            assert min(b0[0], b1[0]) <= best * (1 + 1e-12)


def test_worst_case_q_takes_the_minimum_over_pairs():
    rng = np.random.default_rng(2)
    pairs = [random_dp_pair(rng, 3, 0.3) for _ in range(10)]
    p0, p1 = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    rows = q_star_rows(p0, p1, 0.6, 1)
    assert rows == pytest.approx([q_star(a, b, 0.6, 1) for a, b in pairs], rel=1e-14)
    assert worst_case_q(p0, p1, 0.6, 1) == rows.min()
    with pytest.raises(ValueError, match="no decomposition"):
        q_target_decomposition([0.5, 0.5], [0.1, 0.9], 0.1)


def test_pure_dp_level():
    assert pure_dp_level([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert pure_dp_level([0.2, 0.8], [0.1, 0.9]) == pytest.approx(math.log(2))
    assert pure_dp_level([0.0, 1.0], [0.1, 0.9]) == math.inf


# --- the target probability ---------------------------------------------------------------------------
def test_target_probability_worked_examples():
    # (1 - pi) / (2 - pi): pi = 0.5 -> 1/3, 0.9 -> 0.0909, 0.99 -> 0.0099.
    assert target_probability(0.5) == pytest.approx(1 / 3, rel=1e-15)
    assert target_probability(0.9) == pytest.approx(0.1 / 1.1, rel=1e-15)
    assert target_probability(0.99) == pytest.approx(0.01 / 1.01, rel=1e-15)
    assert target_probability(1.0) == 0.0
    # No outcome reaches 1/2 (a spread-out inner): capped at 1/3 rather than (1 - pi)/(2 - pi) -> 1/2.
    assert target_probability(0.2) == pytest.approx(1 / 3)
    pis = np.linspace(0, 1, 1001)
    t = np.array([target_probability(p) for p in pis])
    assert (t <= 1 / 3 + 1e-15).all() and (np.diff(t) <= 1e-15).all() and (t <= 1 - pis + 1e-15).all()
    with pytest.raises(ValueError, match="max_probability must be <= 1.0"):
        target_probability(1.5)


def test_wrap_probabilities_layout():
    w = wrap_probabilities([0.25, 0.75])
    assert w == pytest.approx([0.25 / 1.25, 0.25 / 1.25, 0.75 / 1.25])
    assert w.sum() == pytest.approx(1.0)


# --- reference values: a binary eps_A-DP mechanism, wrapped ---------------------------------------------
@pytest.mark.parametrize("eps_a, reference_q", [(0.01, 0.3980), (0.1, 0.3794)])
def test_binary_inner_q_at_level_two_eps_reference_values(eps_a, reference_q):
    """The worst q of a wrapped binary eps_A-DP mechanism at level 2 eps_A (to 1e-4: the closed form
    (E + 1) / (2 E^2 + E + 2), E = e^{eps_A}), about 0.33 at 1.5 eps_A, 0 at eps_A."""
    q, level = binary_worst_case_q(eps_a, 2 * eps_a)
    assert q == pytest.approx(reference_q, abs=1e-4)
    assert level <= 2 * eps_a
    # Level 1.5 eps_A gives about 0.33 (0.3317 at eps_A = 0.01); at level eps_A it is not a target.
    q15, _ = binary_worst_case_q(eps_a, 1.5 * eps_a)
    assert q15 == pytest.approx(0.33, abs=0.02)
    assert binary_worst_case_q(eps_a, eps_a)[0] == 0.0


def test_level_one_and_a_half_at_small_epsilon():
    assert binary_worst_case_q(0.01, 0.015)[0] == pytest.approx(0.3317, abs=2e-4)


@pytest.mark.parametrize("eps_a", [0.001, 0.01, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0])
def test_closed_form_q_is_the_binary_infimum(eps_a):
    # The scan approaches (E + 1) / (2 E^2 + E + 2) from above as one outcome's probability -> 1.
    e = math.exp(eps_a)
    limit = (e + 1) / (2 * e * e + e + 2)
    q, level = binary_worst_case_q(eps_a, 2 * eps_a)
    assert limit <= q * (1 + 1e-6)
    assert q - limit < 1e-4
    assert level <= 2 * eps_a * (1 + 1e-12)
    assert boundary_wrapper_q(eps_a) == pytest.approx(min(1 / 3, limit), rel=1e-15)


@pytest.mark.parametrize("e", [Fraction(1001, 1000), Fraction(11, 10), Fraction(3, 2), Fraction(3)])
def test_binary_infimum_in_exact_arithmetic(e):
    # With E = e^{eps_A} rational the wrapped laws and the certifier are rational: check every tight pair
    # on a grid reaching s = 1e-30 exactly, and that the bound is approached.
    f = e * e
    limit = (e + 1) / (2 * e * e + e + 2)

    def wrap(s):
        pi = max(s, 1 - s, Fraction(1, 2))
        t = (1 - pi) / (2 - pi)
        return [t, (1 - t) * (1 - s), (1 - t) * s]

    def q(w0, w1):
        assert all(max(x, y) <= f * min(x, y) for x, y in zip(w0, w1))
        u = w0[0] + sum(abs(w0[y] - w1[y]) * (f if w0[y] > w1[y] else 1) / (f - 1) for y in (1, 2))
        return min(w0[0], w1[0]) / u

    grid = [Fraction(1, 10**k) for k in range(1, 31)] + [Fraction(k, 20) for k in range(1, 20)]
    values = []
    for s1 in grid + [1 - s for s in grid]:
        for s0 in (s1 * e, s1 / e, 1 - (1 - s1) * e, 1 - (1 - s1) / e):
            ok = 0 < s0 < 1 and max(s0, s1) <= e * min(s0, s1) and max(1 - s0, 1 - s1) <= e * min(1 - s0, 1 - s1)
            if ok:
                values.append(q(wrap(s0), wrap(s1)))
    assert min(values) > limit
    assert min(values) - limit < Fraction(1, 10**20)


@pytest.mark.parametrize("eps_a", [0.01, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("k", [3, 4, 6])
def test_multi_outcome_inners_keep_the_bound(eps_a, k):
    # Random eps_A-DP pairs of k-outcome laws, many with no outcome above 1/2 (where the 1/3 cap acts):
    # the wrapped pair is 2 eps_A-DP and the target is at least a boundary_wrapper_q target.
    rng = np.random.default_rng(100 * k + int(100 * eps_a))
    q_bound = boundary_wrapper_q(eps_a)
    e = math.exp(eps_a)
    q_limit = (e + 1) / (2 * e * e + e + 2)
    for _ in range(400):
        p0, p1 = random_dp_pair(rng, k, eps_a)
        w0, w1 = wrap_probabilities(p0), wrap_probabilities(p1)
        assert pure_dp_level(w0, w1) <= 2 * eps_a * (1 + 1e-9)
        q = q_star(w0, w1, 2 * eps_a, 0)
        assert q >= q_limit * (1 - 1e-9) and q >= q_bound * (1 - 1e-9)


def test_one_third_is_valid_up_to_the_crossover():
    assert MAX_EPSILON_FOR_ONE_THIRD == pytest.approx(0.311905, abs=1e-6)
    assert boundary_wrapper_q(MAX_EPSILON_FOR_ONE_THIRD * 0.999) == 1 / 3
    assert boundary_wrapper_q(MAX_EPSILON_FOR_ONE_THIRD * 1.01) < 1 / 3
    assert binary_worst_case_q(MAX_EPSILON_FOR_ONE_THIRD * 1.2, 2 * MAX_EPSILON_FOR_ONE_THIRD * 1.2)[0] < 1 / 3


# --- the mechanism -----------------------------------------------------------------------------------
def test_event_charges_two_eps_and_one_third():
    inner = NoisyThresholdBinary(0.1)
    wrapped = BoundaryWrapper(inner)
    assert wrapped.event == BoundaryWrapperEvent(EpsilonDeltaEvent(0.1), epsilon=0.2, q=1 / 3)
    assert wrapped.inner_epsilon == 0.1 and wrapped.epsilon == 0.2 and wrapped.q == 1 / 3
    # Above the crossover the certified (smaller) q is charged instead of 1/3.
    big = BoundaryWrapper(NoisyThresholdBinary(1.0)).event
    assert big.epsilon == 2.0 and big.q == pytest.approx(0.190716387, abs=1e-9)


def test_rejects_inners_without_epsilon_or_distribution():
    with pytest.raises(TypeError, match="event has an epsilon.*ThresholdArgMax announces ThresholdPrivacyEvent"):
        BoundaryWrapper(ThresholdArgMax(3))
    with pytest.raises(TypeError, match="exact output_distribution"):
        BoundaryWrapper(object())
    with pytest.raises(ValueError, match="inner.event.epsilon must be > 0"):
        BoundaryWrapper(NoisyThresholdBinary(0.0))


def test_wrapped_output_distribution():
    inner = NoisyThresholdBinary(0.5, token=2, threshold=4)
    wrapped = BoundaryWrapper(inner)
    hist = {2: 4, 5: 1}
    dist = wrapped.output_distribution(hist)
    base = inner.output_distribution(hist)
    assert isinstance(dist, WrappedDistribution)
    pi = base.max_probability
    assert dist.target == pytest.approx((1 - pi) / (2 - pi), rel=1e-15)
    assert dist.probability(TARGET) == dist.target
    assert dist.probability(2) == pytest.approx((1 - dist.target) * base.probability(2))
    assert dist.probability(None) == pytest.approx(dist.fail)
    d = dist.as_dict()
    assert set(d) == {2, None, TARGET} and sum(d.values()) == pytest.approx(1.0)
    assert dist.vector().sum() == pytest.approx(1.0)
    # kwargs reach the inner mechanism.
    with_n = wrapped.output_distribution({2: 4}, num_teachers=9)
    assert with_n.inner.as_dict() == inner.output_distribution({2: 4}, num_teachers=9).as_dict()


def test_run_batch_edge_cases():
    wrapped = BoundaryWrapper(WithEpsilon(ThresholdArgMax(3)))
    empty = wrapped.run_batch([], rng=np.random.default_rng(0))
    assert len(empty) == 0 and empty.target_hit.size == 0
    # A certain outcome (pi = 1) is never wrapped into a target.
    out = wrapped.run_batch([{0: 5, 1: 1}, {0: 1, 1: 1, 2: 4}], rng=np.random.default_rng(0))
    assert list(out.values) == [0, 2] and not out.target_hit.any()
    with pytest.raises(ValueError, match="unknown outcome"):
        wrapped.output_distribution({0: 5}).probability("fail")


def test_wrapping_between_thresholds():
    # BetweenThresholds has an exact law over outcome codes and an epsilon: it can be wrapped too.
    bt = BetweenThresholds(0.5, 10, 14)
    wrapped = BoundaryWrapper(bt)
    dist = wrapped.output_distribution(12)
    assert dist.target == pytest.approx(target_probability(max(bt.outcome_probabilities(12))))
    assert wrapped.event.inner == bt.event


INNERS = [
    WithEpsilon(ThresholdArgMax(2)),
    WithEpsilon(ThresholdArgMax(5)),
    WithEpsilon(ThresholdWeightedSampling(2, gamma=1.0)),
    WithEpsilon(ThresholdWeightedSampling(1, gamma=3.0)),
    NoisyThresholdBinary(0.3, token=1, threshold=4),
    ExponentialChoice(0.5, vocab=6),
]


@settings(max_examples=120, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    tail=st.integers(0, 5),
    which=st.integers(0, len(INNERS) - 1),
)
def test_target_probability_properties(counts, tail, which):
    inner = INNERS[which]
    n = sum(counts) + tail
    hist = as_histogram(np.array(counts), num_teachers=n)
    wrapped = BoundaryWrapper(inner)
    base = inner.output_distribution(hist)
    dist = wrapped.output_distribution(hist)
    pi = base.max_probability
    assert dist.target <= 1 / 3 + 1e-15
    assert dist.target <= 1 - pi + 1e-15
    assert dist.target == pytest.approx(min(1 / 3, (1 - pi) / (2 - pi)), rel=1e-12, abs=1e-15)
    if pi >= 0.5:
        assert dist.target == pytest.approx((1 - pi) / (2 - pi), rel=1e-12, abs=1e-15)
    assert sum(dist.as_dict().values()) == pytest.approx(1.0, abs=1e-12)
    # The vectorised path computes the same target probability.
    if n > 0:
        _, _, _, target = wrapped.batch_distributions([hist])
        assert target[0] == pytest.approx(dist.target, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("inner", "counts"),
    [
        (NoisyThresholdBinary(1.0, token=0, threshold=30), [3, 3]),  # no batch law of its own: one law per histogram
        (DPArgMax(1.0, 1e-20), [220, 180]),  # its own vectorised laws (fail is the rest of the mass)
    ],
    ids=["per-histogram laws", "dp-argmax batch laws"],
)
def test_batch_target_keeps_full_precision_at_a_tiny_yield(inner, counts):
    # A yield of about 1e-12 beside a fail of 1 - 1e-12: 1 - fail would keep only about four digits of it.
    wrapped = BoundaryWrapper(inner)
    hist = as_histogram(np.array(counts))
    dist = wrapped.output_distribution(hist)
    y = float(dist.inner.probabilities.sum())
    assert 1e-13 < y < 1e-11 and dist.inner.fail > 0.5
    assert dist.target == pytest.approx(y / (1.0 + y), rel=1e-12, abs=0.0)
    _, _, probs, target = wrapped.batch_distributions([hist, np.array([sum(counts), 0]), hist])
    assert probs[0] == y
    assert target[0] == pytest.approx(dist.target, rel=1e-12, abs=0.0) and target[2] == target[0]
    fail = (1.0 - target[0]) * (1.0 - probs[0])
    assert fail == pytest.approx(dist.fail, rel=1e-15, abs=0.0)


@pytest.mark.parametrize("counts", [[272, 128], [274, 126]])
def test_batch_target_keeps_full_precision_near_a_certain_token(counts):
    """The other side of the same cancellation: a token of probability about 1 - 1e-12, so ``1 - pi`` is about
    the fail of 1e-12 (plus tiny other tokens); ``1 - sum`` of the batch laws would keep four digits of it.  The
    inner states its batch fail from the fail side (``batch_fail``), and the two paths agree."""
    inner = DPArgMax(1.0, 1e-20)  # L = 46: fail 3.7e-12 and 5.1e-13 at these counts
    wrapped = BoundaryWrapper(inner)
    hist = as_histogram(np.array(counts))
    dist = wrapped.output_distribution(hist)
    assert 1e-13 < dist.inner.fail < 1e-11 and dist.target < 1e-9
    fail = inner.batch_fail([hist, hist])
    assert fail[0] == pytest.approx(dist.inner.fail, rel=1e-12, abs=0.0)
    _, _, _, target = wrapped.batch_distributions([hist, np.array([400, 0]), hist])
    assert target[0] == pytest.approx(dist.target, rel=1e-12, abs=0.0) and target[2] == target[0]


def test_weighted_sampling_states_its_batch_fail_from_the_fail_side():
    """``DPWeightedSampling.batch_fail``, the product of ``1 - pi*`` over each histogram's tokens by ``log1p``,
    equals the fail of its exact law, down to a product of 1e-16 (ten tokens near certain inclusion)."""
    from mechanisms import DPWeightedSampling

    inner = DPWeightedSampling(1.0, 1e-20)
    hists = [np.array([390, 10]), np.array([40] * 10), np.array([200, 200])]
    fail = inner.batch_fail(hists)
    for h, f in zip(hists, fail):
        assert f == pytest.approx(inner.output_distribution(as_histogram(h)).fail, rel=1e-12, abs=0.0)


def test_single_and_batch_paths_share_one_outside_mass(monkeypatch):
    import mechanisms.boundary_wrapper as module

    calls = []
    shared = module.outside_mass_rows

    def counted(*args, **kwargs):
        calls.append(args[2])
        return shared(*args, **kwargs)

    monkeypatch.setattr(module, "outside_mass_rows", counted)
    wrapped = BoundaryWrapper(DPArgMax(1.0, 1e-20))
    hists = [np.array([220, 180]), np.array([400, 0]), np.array([0, 0, 400])]
    single = [wrapped.output_distribution(h).target for h in hists]
    _, _, _, batch = wrapped.batch_distributions(hists)
    assert calls == [1, 1, 1, 3]
    assert list(batch) == pytest.approx(single, rel=1e-12, abs=0.0)


def test_target_vanishes_as_one_outcome_dominates():
    inner = NoisyThresholdBinary(0.2, token=0, threshold=10)
    wrapped = BoundaryWrapper(inner)
    targets = [wrapped.output_distribution({0: c, 1: 200 - c}).target for c in range(10, 201)]
    assert targets[0] == pytest.approx(1 / 3, abs=0.03)
    assert (np.diff(targets) <= 1e-15).all()
    assert targets[-1] < 1e-10


# --- sampling ---------------------------------------------------------------------------------------
def test_single_calls_follow_the_wrapped_law():
    inner = NoisyThresholdBinary(0.5, token=3, threshold=4)
    wrapped = BoundaryWrapper(inner)
    hist = {3: 4, 1: 2}
    dist = wrapped.output_distribution(hist)
    rng = np.random.default_rng(8)
    n = 6000
    runs = [wrapped(hist, rng=rng) for _ in range(n)]
    assert all(isinstance(r, Release) and r.event == wrapped.event for r in runs)
    hits = sum(r.target_hit for r in runs)
    tokens = sum(r.value == 3 for r in runs)
    fails = sum(r.value is None and not r.target_hit for r in runs)
    assert all(r.value is None for r in runs if r.target_hit)
    assert all(r.outcome == "target" for r in runs if r.target_hit)
    check_counts_match_law({TARGET: hits, 3: tokens, None: fails}, dist.as_dict(), alpha=P_VALUE_FLOOR)


@pytest.mark.parametrize(
    "inner, n",
    [(WithEpsilon(ThresholdWeightedSampling(2, gamma=1.5)), 60_000), (ExponentialChoice(0.8, vocab=4), 12_000)],
    ids=["batched", "fallback"],
)
def test_run_batch_follows_the_wrapped_law(inner, n):
    wrapped = BoundaryWrapper(inner)
    hist = as_histogram(np.array([1, 3, 2, 4]), num_teachers=12)
    dist = wrapped.output_distribution(hist)
    batch = [hist] * n
    out = wrapped.run_batch(batch, rng=np.random.default_rng(21))
    assert out.event == wrapped.event and out.target_hit.dtype == bool
    assert (out.values[out.target_hit] == FAIL_VALUE).all()
    keys = [k for k in dist.as_dict() if k not in (None, TARGET)]
    observed = {TARGET: int(out.target_hit.sum()), None: int((out.failed & ~out.target_hit).sum()),
                **{k: int((out.values == k).sum()) for k in keys}}
    assert sum(observed.values()) == n
    check_counts_match_law(observed, dist.as_dict(), alpha=P_VALUE_FLOOR)


# --- exact privacy checks on neighbouring histograms -------------------------------------------------
@pytest.mark.parametrize(
    "inner",
    [
        NoisyThresholdBinary(0.1, token=0, threshold=3),
        NoisyThresholdBinary(0.3, token=1, threshold=2),
        NoisyThresholdBinary(1.0, token=0, threshold=4),
        ExponentialChoice(0.3, vocab=3),
        ExponentialChoice(1.0, vocab=3),
    ],
    ids=repr,
)
def test_wrapped_pairs_are_certified_at_two_eps(inner):
    # Every histogram of at most 7 teachers over 3 tokens + tail and every replace-one neighbour: the inner law
    # is eps_A-DP, the wrapped law is 2 eps_A-DP, and the target is a q-target at level 2 eps_A with q at least
    # the event's q (1/3 up to eps_A = 0.3119) -- the bound TCT accounting uses.
    eps_a = inner.epsilon
    wrapped = BoundaryWrapper(inner)
    event = wrapped.event
    assert event.epsilon == pytest.approx(2 * eps_a)
    claim = wrapped.privacy_claim()
    assert (claim.epsilon, claim.delta) == (2 * eps_a, 0.0)
    assert (claim.target.outcome, claim.target.epsilon, claim.target.q) == (TARGET, event.epsilon, event.q)
    # The inner claim read from its event is pure eps_A; the check bounds the tight delta at the claimed
    # epsilon by 1e-12 on every pair (pure DP up to float rounding), and the target's q on every pair.
    (inner_report,) = check_privacy_claim(inner, max_teachers=7)
    (report,) = check_privacy_claim(wrapped, max_teachers=7)
    assert inner_report.claim.epsilon == eps_a and inner_report.worst_delta <= 1e-12
    assert report.worst_delta <= 1e-12 and report.worst_q >= event.q
    if eps_a <= MAX_EPSILON_FOR_ONE_THIRD:
        assert event.q == 1 / 3
