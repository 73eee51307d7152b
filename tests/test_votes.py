"""Algorithm 1 and the independent ensemble: exactness against the literal algorithm, laws, memory."""

import tracemalloc

import numpy as np
import pytest

from conftest import z_bound
from ensembles import (
    TAIL_VOTE,
    TeacherDistributions,
    VoteHistogram,
    coordinated_votes,
    coordinated_votes_from_noise,
    count_votes,
    histograms_from_votes,
    independent_votes,
)
from ensembles.histograms import literal_coordinated_votes
from ensembles.synthetic import pooled_supports


def ragged_teachers(rng, n=40, vocab=300):
    """Teachers with very different support sizes, so several padded blocks are used."""
    ids, probs = [], []
    for i in range(n):
        size = int(rng.integers(1, 120)) if i % 3 else int(rng.integers(150, vocab))
        chosen = rng.choice(vocab, size=size, replace=False)
        ids.append(chosen)
        probs.append(rng.dirichlet(np.ones(size) * 0.7))
    return TeacherDistributions.from_sparse(ids, probs, vocab)


def test_fast_votes_equal_the_literal_algorithm(rng):
    teachers = ragged_teachers(rng)
    noise = rng.standard_exponential((300, teachers.vocab_size))
    fast = coordinated_votes_from_noise(teachers, noise)
    np.testing.assert_array_equal(fast, literal_coordinated_votes(teachers, noise))


def test_fast_votes_equal_the_literal_algorithm_with_tails(rng):
    teachers = ragged_teachers(rng).top_p(0.9)
    assert (teachers.tail > 0).any()
    noise = rng.standard_exponential((300, teachers.vocab_size))
    tail_noise = rng.standard_exponential(300)
    fast = coordinated_votes_from_noise(teachers, noise, tail_noise)
    np.testing.assert_array_equal(fast, literal_coordinated_votes(teachers, noise, tail_noise))
    assert (fast == TAIL_VOTE).any()
    with pytest.raises(ValueError, match="tail_noise is required"):
        coordinated_votes_from_noise(teachers, noise)


def test_noise_shape_is_checked(rng):
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.ones(10), size=3))
    with pytest.raises(ValueError, match=r"noise must have shape \(num_samples, 10\)"):
        coordinated_votes_from_noise(teachers, np.ones((2, 9)))


def test_identical_teachers_always_agree(rng):
    p = rng.dirichlet(np.ones(50))
    teachers = TeacherDistributions.from_dense(np.tile(p, (25, 1)))
    votes = coordinated_votes(teachers, 2000, rng)
    assert (votes == votes[:, :1]).all()
    # ... and their common vote is distributed as p (chi-square at a fixed seed).
    from scipy.stats import chisquare

    observed = np.bincount(votes[:, 0], minlength=50)
    assert chisquare(observed, 2000 * p).pvalue > 1e-4


def test_each_teacher_votes_with_its_own_distribution(rng):
    """Per-teacher marginal of both ensembles is p^(i) (the basis of Claim 1)."""
    from scipy.stats import chisquare

    probs = rng.dirichlet(np.ones(6), size=4)
    teachers = TeacherDistributions.from_dense(probs)
    num = 20000
    for draw in (coordinated_votes, independent_votes):
        votes = draw(teachers, num, rng)
        for i in range(4):
            observed = np.bincount(votes[:, i], minlength=6)
            assert chisquare(observed, num * probs[i]).pvalue > 1e-4 / 8


def test_same_seed_same_votes():
    teachers = pooled_supports(30, 500, np.random.default_rng(1), pool_size=100, support_size=20)
    a = coordinated_votes(teachers, 50, np.random.default_rng(7))
    b = coordinated_votes(teachers, 50, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    c = independent_votes(teachers, 50, np.random.default_rng(7))
    np.testing.assert_array_equal(c, independent_votes(teachers, 50, np.random.default_rng(7)))


def test_votes_require_an_explicit_generator():
    teachers = TeacherDistributions.from_dense(np.full((2, 2), 0.5))
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        coordinated_votes(teachers, 3, 0)
    with pytest.raises(ValueError, match="num_samples must be >= 0, got -1"):
        independent_votes(teachers, -1, np.random.default_rng(0))
    assert coordinated_votes(teachers, 0, np.random.default_rng(0)).shape == (0, 2)


def test_tail_votes_have_exactly_the_tail_probability(rng):
    probs = rng.dirichlet(np.ones(30) * 0.3, size=10)
    teachers = TeacherDistributions.from_dense(probs).top_k(3)
    num = 20000
    for draw in (coordinated_votes, independent_votes):
        votes = draw(teachers, num, rng)
        tail_rate = (votes == TAIL_VOTE).mean(axis=0)
        se = np.sqrt(teachers.tail * (1 - teachers.tail) / num)
        assert (np.abs(tail_rate - teachers.tail) <= z_bound(20) * se + 1e-12).all()


def test_memory_stays_bounded_by_chunking():
    """Peak memory is far below samples x teachers x support (which would be 2.4 GB here)."""
    teachers = pooled_supports(2000, 128_000, np.random.default_rng(3), pool_size=3000, support_size=300)
    coordinated_votes(teachers, 1, np.random.default_rng(0))  # builds the cached plan
    tracemalloc.start()
    votes = coordinated_votes(teachers, 500, np.random.default_rng(0))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    materialised = 500 * 2000 * 300 * 8
    assert votes.shape == (500, 2000)
    assert peak < 40e6 < materialised / 50


def test_vote_histogram_and_counts():
    votes = np.array([3, 1, 3, TAIL_VOTE, 3, 0])
    h = VoteHistogram.from_votes(votes, vocab_size=5)
    assert h.num_teachers == 6 and h.tail == 1
    assert h.as_dict() == {0: 1, 1: 1, 3: 3}
    assert h.count(3) == 3 and h.count(4) == 0
    assert h.top(2) == [(3, 3), (0, 1)]
    assert h.max_count == 3 and h.margin == 2
    with pytest.raises(ValueError, match="vote 5 is neither a token id"):
        VoteHistogram.from_votes([5], vocab_size=5)
    with pytest.raises(TypeError, match="votes must be integer"):
        VoteHistogram.from_votes([0.5], vocab_size=5)
    matrix = np.array([[2, 2, TAIL_VOTE], [0, 1, 1]])
    sample, token, count = count_votes(matrix)
    assert list(zip(sample.tolist(), token.tolist(), count.tolist())) == [(0, 2, 2), (1, 0, 1), (1, 1, 2)]
    hs = histograms_from_votes(matrix, vocab_size=3)
    assert [x.as_dict() for x in hs] == [{2: 2}, {0: 1, 1: 2}]
    assert all(x.num_teachers == 3 for x in hs)


@pytest.mark.memory
def test_memory_bounded_at_paper_scale():
    """n = 10^4 teachers, V = 128k, 1000 samples: memory grows with the stored entries, not with V or samples."""
    teachers = pooled_supports(10_000, 128_000, np.random.default_rng(5), pool_size=3000, support_size=300)
    entry_bytes = teachers.nnz * 8  # 24 MB
    tracemalloc.start()
    coordinated_votes(teachers, 1, np.random.default_rng(0))  # builds and caches the plan
    _, plan_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    votes = coordinated_votes(teachers, 1000, np.random.default_rng(0))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert votes.shape == (1000, 10_000)
    # Building the plan costs a small multiple of the stored entries (it holds ids, 1/p and cumulative sums).
    assert plan_peak < 10 * entry_bytes
    # Sampling adds the 80 MB output and chunk-sized buffers; a dense n x V matrix would be 10 GB.
    assert peak - plan_peak < votes.nbytes + 40e6


def test_votes_do_not_depend_on_the_number_of_threads():
    teachers = pooled_supports(64, 2000, np.random.default_rng(2), pool_size=300, support_size=40)
    for draw in (coordinated_votes, independent_votes):
        one = draw(teachers, 400, np.random.default_rng(9), num_threads=1)
        three = draw(teachers, 400, np.random.default_rng(9), num_threads=3)
        np.testing.assert_array_equal(one, three)
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        coordinated_votes(teachers, 4, np.random.default_rng(0), num_threads=0)
