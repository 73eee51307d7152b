import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ensembles import TAIL_VOTE, TeacherDistributions
from ensembles.metrics import (
    average_yield,
    coverage,
    margins,
    max_counts,
    robust_mass,
    support_size,
    total_variation,
    transferred_distribution,
)

# Three samples of five teachers; sample 2 has one tail vote.
VOTES = np.array(
    [
        [1, 1, 1, 2, 2],
        [3, 3, 3, 3, 0],
        [2, 2, 4, TAIL_VOTE, 1],
    ]
)


def test_threshold_metrics_by_hand():
    # counts: s0 {1:3, 2:2}; s1 {3:4, 0:1}; s2 {2:2, 4:1, 1:1}
    assert coverage(VOTES, 2) == pytest.approx((5 + 4 + 2) / 15)
    assert coverage(VOTES, 3) == pytest.approx((3 + 4) / 15)
    assert support_size(VOTES, 2) == 3  # tokens 1, 2, 3
    assert support_size(VOTES, 4) == 1
    assert average_yield(VOTES, 2) == pytest.approx((2 + 1 + 1) / 3)
    np.testing.assert_allclose(coverage(VOTES, [1, 2, 5]), [14 / 15, 11 / 15, 0.0])
    np.testing.assert_array_equal(support_size(VOTES, np.array([1, 3, 6])), [5, 2, 0])
    assert max_counts(VOTES).tolist() == [3, 4, 2]
    assert margins(VOTES).tolist() == [1, 3, 1]
    assert max_counts(VOTES, retries=3).tolist() == [4]
    assert max_counts(np.array([[TAIL_VOTE, TAIL_VOTE]])).tolist() == [0]
    assert margins(np.array([[5, 5, 5]])).tolist() == [3]


def test_transferred_distribution_and_total_variation():
    q = transferred_distribution(VOTES, 2, vocab_size=5)
    np.testing.assert_allclose(q, np.array([0, 3, 4, 4, 0]) / 15)
    assert q.sum() == pytest.approx(coverage(VOTES, 2))
    average = np.array([0.1, 0.2, 0.3, 0.3, 0.1])
    # TV over V and the fail outcome, which has mass 1 - 11/15 in q and 0 in the average.
    expected = 0.5 * (np.abs(q - average).sum() + (1 - q.sum()))
    assert total_variation(q, average) == pytest.approx(expected)
    assert total_variation(average, average) == 0.0
    with pytest.raises(ValueError, match="sums to"):
        total_variation(np.array([0.8, 0.8]), np.array([0.5, 0.5]))


def test_metric_argument_errors():
    with pytest.raises(ValueError, match="threshold must be positive"):
        coverage(VOTES, 0)
    with pytest.raises(ValueError, match=r"votes must have shape \(num_samples, num_teachers\)"):
        coverage(np.array([1, 2]), 1)
    with pytest.raises(ValueError, match="retries=4 exceeds the number of samples 3"):
        max_counts(VOTES, retries=4)
    with pytest.raises(TypeError, match="votes must be integer"):
        support_size(VOTES.astype(float), 1)


def brute_force_robust_mass(dense, tau):
    n = dense.shape[0]
    total = 0.0
    for j in range(dense.shape[1]):
        column = np.sort(dense[:, j])[::-1]
        cap = column[tau - 1]
        total += np.minimum(dense[:, j], cap).sum() / n
    return total


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 10), st.integers(0, 2**32 - 1))
def test_robust_mass_matches_definition_and_is_monotone(n, vocab, seed):
    rng = np.random.default_rng(seed)
    dense = rng.dirichlet(np.ones(vocab) * 0.5, size=n)
    dense[dense < 0.05] = 0
    dense /= dense.sum(axis=1, keepdims=True)
    teachers = TeacherDistributions.from_dense(dense)
    taus = np.arange(1, n + 1)
    values = robust_mass(teachers, taus)
    expected = [brute_force_robust_mass(dense, t) for t in taus]
    np.testing.assert_allclose(values, expected, atol=1e-12)
    assert values[0] == pytest.approx(1.0)
    assert (np.diff(values) <= 1e-12).all()
    np.testing.assert_allclose(robust_mass(teachers, 1, per_token=True), teachers.average(), atol=1e-12)


def test_robust_mass_examples():
    # Disjoint groups of 2 teachers with point masses: tau <= 2 transfers everything, tau = 3 nothing.
    dense = np.repeat(np.eye(3), 2, axis=0)
    teachers = TeacherDistributions.from_dense(dense)
    np.testing.assert_allclose(robust_mass(teachers, [1, 2, 3, 6]), [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"tau must lie in \[1, num_teachers=6\]"):
        robust_mass(teachers, 7)
