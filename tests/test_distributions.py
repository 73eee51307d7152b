import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ensembles import TeacherDistributions
from ensembles.distributions import SUM_TOLERANCE


def dense_example():
    return np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])


def test_from_dense_round_trip_and_properties():
    p = dense_example()
    t = TeacherDistributions.from_dense(p)
    assert t.num_teachers == 3 and t.vocab_size == 4
    np.testing.assert_allclose(t.to_dense(), p)
    np.testing.assert_allclose(t.average(), p.mean(axis=0))
    assert t.nnz == 10
    ids, probs = t.row(1)
    assert ids.tolist() == [0, 2, 3]
    np.testing.assert_allclose(probs, [0.1, 0.6, 0.3])
    assert (t.tail == 0).all()


def test_from_sparse_equals_from_dense():
    t = TeacherDistributions.from_sparse([[2, 0], [3]], [[0.4, 0.6], [1.0]], vocab_size=5)
    expected = np.array([[0.6, 0, 0.4, 0, 0], [0, 0, 0, 1.0, 0]])
    np.testing.assert_allclose(t.to_dense(), expected)
    np.testing.assert_allclose(TeacherDistributions.from_dense(expected).to_dense(), expected)


def test_rows_are_renormalised_within_tolerance():
    p = dense_example()
    p[0] *= 1 + SUM_TOLERANCE / 2
    t = TeacherDistributions.from_dense(p)
    np.testing.assert_allclose(t.to_dense().sum(axis=1), 1.0, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.__setitem__((1, 2), np.nan), "teacher 1, token 2 holds a NaN"),
        (lambda p: p.__setitem__((2, 0), -0.25), "teacher 2, token 0 holds a negative"),
        (lambda p: p.__setitem__((0, 0), 0.4), "teacher 0: probabilities sum to 0.9"),
        (lambda p: p.__setitem__((2, 3), np.inf), "teacher 2, token 3 holds a infinite"),
    ],
)
def test_dense_validation_names_the_teacher(mutate, message):
    p = dense_example()
    mutate(p)
    with pytest.raises(ValueError, match=message):
        TeacherDistributions.from_dense(p)


def test_dense_shape_and_type_errors():
    with pytest.raises(ValueError, match="2-d"):
        TeacherDistributions.from_dense(np.ones(4) / 4)
    with pytest.raises(ValueError, match="at least one teacher"):
        TeacherDistributions.from_dense(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="non-empty vocabulary"):
        TeacherDistributions.from_dense(np.zeros((2, 0)))
    with pytest.raises(TypeError, match="numeric"):
        TeacherDistributions.from_dense(np.array([["a", "b"]]))
    with pytest.raises(TypeError, match="from_dense or"):
        TeacherDistributions(None, None, None, None, 3)


def test_sparse_validation_names_the_teacher():
    with pytest.raises(ValueError, match=r"teacher 1: token id 7 is outside the vocabulary \[0, 5\)"):
        TeacherDistributions.from_sparse([[0], [7]], [[1.0], [1.0]], vocab_size=5)
    with pytest.raises(ValueError, match="teacher 0: token id 1 is listed twice"):
        TeacherDistributions.from_sparse([[1, 1]], [[0.5, 0.5]], vocab_size=5)
    with pytest.raises(ValueError, match="teacher 1: probabilities sum to 0.5.*tail="):
        TeacherDistributions.from_sparse([[0], [1]], [[1.0], [0.5]], vocab_size=5)
    with pytest.raises(ValueError, match="teacher 0: token_ids and probs must be 1-d of equal length"):
        TeacherDistributions.from_sparse([[0, 1]], [[1.0]], vocab_size=5)
    with pytest.raises(ValueError, match="same number of teachers"):
        TeacherDistributions.from_sparse([[0], [1]], [[1.0]], vocab_size=5)
    with pytest.raises(ValueError, match="at least one teacher"):
        TeacherDistributions.from_sparse([], [], vocab_size=5)
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        TeacherDistributions.from_sparse([[0]], [[1.0]], vocab_size=0)
    with pytest.raises(TypeError, match="teacher 0: token_ids must be integers"):
        TeacherDistributions.from_sparse([[0.5]], [[1.0]], vocab_size=5)
    with pytest.raises(ValueError, match="teacher 0, entry 1 holds a NaN"):
        TeacherDistributions.from_sparse([[0, 1]], [[1.0, np.nan]], vocab_size=5)


def test_explicit_tail_is_accepted_and_validated():
    t = TeacherDistributions.from_sparse([[0], [1, 2]], [[0.9], [0.5, 0.3]], vocab_size=4, tail=[0.1, 0.2])
    np.testing.assert_allclose(t.tail, [0.1, 0.2])
    np.testing.assert_allclose(t.average(), [0.45, 0.25, 0.15, 0.0])
    with pytest.raises(ValueError, match=r"tail must have shape \(2,\)"):
        TeacherDistributions.from_sparse([[0], [1]], [[0.9], [0.8]], vocab_size=4, tail=[0.1])
    with pytest.raises(ValueError, match="tail must be finite and non-negative: teacher 1"):
        TeacherDistributions.from_sparse([[0], [1]], [[0.9], [0.8]], vocab_size=4, tail=[0.1, -0.2])


def test_top_k_moves_dropped_mass_to_tail():
    t = TeacherDistributions.from_dense(dense_example()).top_k(2)
    np.testing.assert_allclose(t.to_dense(), [[0.5, 0.3, 0, 0], [0, 0, 0.6, 0.3], [0.25, 0.25, 0, 0]])
    np.testing.assert_allclose(t.tail, [0.2, 0.1, 0.5])
    renormalised = TeacherDistributions.from_dense(dense_example()).top_k(1, renormalize=True)
    np.testing.assert_allclose(renormalised.to_dense().sum(axis=1), 1.0)
    assert (renormalised.tail == 0).all()


def test_top_p_keeps_smallest_prefix_reaching_p():
    t = TeacherDistributions.from_dense(dense_example()).top_p(0.8)
    # teacher 0: 0.5 + 0.3 = 0.8 reaches p; teacher 1: 0.6 + 0.3; teacher 2: three quarters are not enough.
    assert t.support_sizes.tolist() == [2, 2, 4]
    np.testing.assert_allclose(t.tail, [0.2, 0.1, 0.0])
    assert TeacherDistributions.from_dense(dense_example()).top_p(1.0).nnz == 10


def test_temperature_matches_closed_form_and_refuses_tails():
    p = dense_example()
    t = TeacherDistributions.from_dense(p).with_temperature(0.5)
    expected = p**2 / (p**2).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(t.to_dense(), expected)
    np.testing.assert_allclose(TeacherDistributions.from_dense(p).with_temperature(1.0).to_dense(), p)
    with pytest.raises(ValueError, match="temperature needs untruncated distributions, but teacher 0 has a tail"):
        TeacherDistributions.from_dense(p).top_k(1).with_temperature(2.0)
    with pytest.raises(ValueError, match="temperature must be > 0.0, got 0.0"):
        TeacherDistributions.from_dense(p).with_temperature(0)


def test_subset_selects_teachers_in_order():
    t = TeacherDistributions.from_dense(dense_example()).top_k(3)
    s = t.subset([2, 0])
    np.testing.assert_allclose(s.to_dense(), t.to_dense()[[2, 0]])
    np.testing.assert_allclose(s.tail, t.tail[[2, 0]])
    with pytest.raises(ValueError, match="teacher index 3 is outside"):
        t.subset([3])


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 12),
    st.floats(0.05, 1.0),
    st.integers(1, 12),
    st.integers(0, 2**32 - 1),
)
def test_truncation_preserves_total_mass_and_keeps_the_largest(n, vocab, p, k, seed):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(vocab) * 0.5, size=n)
    t = TeacherDistributions.from_dense(probs)
    for truncated in (t.top_p(p), t.top_k(k)):
        np.testing.assert_allclose(truncated.to_dense().sum(axis=1) + truncated.tail, 1.0, atol=1e-12)
        dense = truncated.to_dense()
        for i in range(n):
            kept = dense[i] > 0
            if kept.any() and (~kept & (probs[i] > 0)).any():
                assert probs[i][kept].min() >= probs[i][~kept].max() - 1e-15
    kept_p = t.top_p(p)
    assert (kept_p.to_dense().sum(axis=1) >= p - 1e-9).all()
