import numpy as np
import pytest

from ensembles.synthetic import alpha_mixture, disjoint_groups, planet_z_like, pooled_supports


def test_alpha_mixture_structure(rng):
    t = alpha_mixture(5, 40, 0.3, rng, common_size=4, private_size=3)
    dense = t.to_dense()
    np.testing.assert_allclose(dense[:, :4], 0.3 / 4)
    private = dense[:, 4:]
    assert ((private > 0).sum(axis=0) <= 1).all()  # private tokens are disjoint
    np.testing.assert_allclose(private.sum(axis=1), 0.7)
    identical = alpha_mixture(3, 2, 1.0, rng, common_size=2)
    np.testing.assert_allclose(identical.to_dense(), 0.5)
    dirichlet = alpha_mixture(3, 20, 0.5, rng, common_size=5, common_concentration=0.5).to_dense()
    assert np.allclose(dirichlet[0, :5], dirichlet[1, :5]) and dirichlet[0, :5].sum() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="vocab_size=10 is too small"):
        alpha_mixture(5, 10, 0.3, rng, private_size=2)
    with pytest.raises(ValueError, match="alpha must be > 0.0, got 0.0"):
        alpha_mixture(5, 10, 0.0, rng)


def test_disjoint_groups_structure():
    t = disjoint_groups(7, 3, vocab_size=20, q=0.4, private_size=2)
    dense = t.to_dense()
    np.testing.assert_allclose(dense[:, :3], np.repeat(np.eye(3), 3, axis=0)[:7] * 0.4)
    np.testing.assert_allclose(dense.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="group_size must be <= 7, got 8"):
        disjoint_groups(7, 8, vocab_size=20, q=0.4)


@pytest.mark.slow
def test_planet_z_like_matches_the_task_shape(rng):
    teachers, common = planet_z_like(500, rng, common_size=20, generalization_mass=0.25, junk_mass=0.003)
    assert common.size == 20 and np.all((common >= 1000) & (common < 1900))
    dense = teachers.to_dense()  # (500, 128k) float64: 0.5 GB, made once (a view of it keeps it alive)
    dense_common = dense[:, common]
    # In-prompt mass is 1 - 0.25 - 0.003; the common part of it is large, the private number small on average.
    in_c = dense_common.sum(axis=1)
    assert np.all(in_c < 0.747 + 1e-12) and in_c.mean() > 0.6
    numbers = dense[:, 1000:1900].sum(axis=1)
    del dense
    np.testing.assert_allclose(numbers, 0.997)
    # Each teacher has exactly one in-prompt number outside C (its private number).
    support = teachers.support_sizes
    assert np.all(support == 20 + 1 + 64 + 1)
    with pytest.raises(ValueError, match="generalization_mass \\+ junk_mass must be < 1"):
        planet_z_like(10, rng, generalization_mass=0.9, junk_mass=0.2)


def test_pooled_supports_shape(rng):
    t = pooled_supports(50, 10_000, rng, pool_size=400, support_size=40)
    assert t.num_teachers == 50 and np.all(t.support_sizes == 40)
    assert np.unique(t.token_ids).size <= 400
    with pytest.raises(ValueError, match="support_size must be <= 400, got 500"):
        pooled_supports(5, 10_000, rng, pool_size=400, support_size=500)
