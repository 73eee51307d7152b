"""The paper's claims about coordinated ensembles (Section 3, Appendix C), at fixed seeds.

Tolerances are normal-approximation bounds from the sample size, Bonferroni-corrected over the number
of simultaneous checks (``z_bound``), never tuned to pass.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import betabinom

from conftest import z_bound
from ensembles import TeacherDistributions, coordinated_votes, independent_votes
from ensembles.metrics import (
    agreement_by_token,
    independent_agreement,
    probability_jaccard,
    weighted_jaccard,
)
from ensembles.synthetic import alpha_mixture, disjoint_groups
from mechanisms.testing import check_counts_match_law


# --- Claim 1: expected counts ------------------------------------------------------------------
@pytest.mark.parametrize("draw", [coordinated_votes, independent_votes])
def test_claim1_expected_count_is_sum_of_probabilities(draw, rng):
    n, vocab, num = 30, 40, 20000
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.ones(vocab) * 0.4, size=n))
    votes = draw(teachers, num, rng)
    counts = np.stack([np.bincount(row, minlength=vocab) for row in votes])
    expected = teachers.average() * n
    se = counts.std(axis=0, ddof=1) / np.sqrt(num)
    mask = expected > 0
    z = np.abs(counts.mean(axis=0)[mask] - expected[mask]) / se[mask]
    assert z.max() < z_bound(vocab)


def test_claim1_holds_for_kept_tokens_after_truncation(rng):
    n, vocab, num = 20, 30, 20000
    teachers = TeacherDistributions.from_dense(rng.dirichlet(np.ones(vocab) * 0.4, size=n)).top_p(0.8)
    votes = coordinated_votes(teachers, num, rng)
    counts = np.stack([np.bincount(row[row >= 0], minlength=vocab) for row in votes])
    expected = teachers.average() * n
    se = counts.std(axis=0, ddof=1) / np.sqrt(num)
    mask = expected > 0
    assert (np.abs(counts.mean(axis=0)[mask] - expected[mask]) / se[mask]).max() < z_bound(vocab)


# --- Claim 2 / Appendix C, corrected ------------------------------------------------------------
P = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
Q = np.array([0.1, 0.2, 0.3, 0.0, 0.4])


def test_agreement_is_the_probability_jaccard_not_the_weighted_jaccard(rng):
    num = 200_000
    teachers = TeacherDistributions.from_dense(np.stack([P, Q]))
    votes = coordinated_votes(teachers, num, rng)
    both = votes[votes[:, 0] == votes[:, 1], 0]
    observed = np.bincount(both, minlength=P.size) / num
    exact = agreement_by_token(P, Q)
    se = np.sqrt(np.maximum(exact * (1 - exact), 1e-12) / num)
    assert (np.abs(observed - exact) <= z_bound(P.size + 1) * se).all()
    total = observed.sum()
    j_p, j_w = probability_jaccard(P, Q), weighted_jaccard(P, Q)
    se_total = np.sqrt(j_p * (1 - j_p) / num)
    assert abs(total - j_p) <= z_bound(P.size + 1) * se_total
    # The paper's equality J = J_W is refuted: the agreement is far above J_W.
    assert (total - j_w) / se_total > 20
    # Coordinated agreement on each token is at least the independent one (Claim 2, second part).
    assert (exact >= P * Q - 1e-15).all()


def test_independent_teachers_agree_with_inner_product(rng):
    num = 200_000
    votes = independent_votes(TeacherDistributions.from_dense(np.stack([P, Q])), num, rng)
    rate = (votes[:, 0] == votes[:, 1]).mean()
    expected = independent_agreement(P, Q)
    assert abs(rate - expected) <= z_bound(1) * np.sqrt(expected * (1 - expected) / num)


def probability_vectors(size):
    return st.lists(st.floats(0.0, 1.0), min_size=size, max_size=size).filter(lambda v: sum(v) > 1e-3).map(
        lambda v: np.asarray(v) / sum(v)
    )


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 7).flatmap(lambda k: st.tuples(probability_vectors(k), probability_vectors(k))))
def test_probability_jaccard_bounds(pair):
    p, q = pair
    per_token = agreement_by_token(p, q)
    denominator = np.maximum(p, q).sum()
    assert (per_token >= np.minimum(p, q) / denominator - 1e-12).all()
    assert (per_token <= np.minimum(p, q) + 1e-12).all()
    j_w = weighted_jaccard(p, q)
    tv = 0.5 * np.abs(p - q).sum()
    assert j_w == pytest.approx((1 - tv) / (1 + tv), abs=1e-12)
    assert probability_jaccard(p, q) >= j_w - 1e-12
    assert probability_jaccard(p, p) == pytest.approx(1.0)


# --- Lemma C.1 (diversity transfer) -------------------------------------------------------------
@pytest.mark.parametrize("p, q", [(0.5, 0.05), (0.25, 0.2), (0.8, 0.5), (0.5, 0.9)])
def test_lemma_c1_diversity_transfer(p, q, rng):
    n, supporters, num = 120, 80, 20000
    # Token 0 has probability q at 80 teachers; everything else is private to each teacher.
    teachers = disjoint_groups(n, supporters, vocab_size=2 + n * 3, q=q, private_size=3)
    votes = coordinated_votes(teachers, num, rng)
    count = (votes == 0).sum(axis=1)
    hit = (count >= np.floor(p * supporters)).mean()
    bound = 0.5 * np.log(1 / p) * q
    assert hit + z_bound(4) * np.sqrt(max(hit * (1 - hit), 1e-4) / num) >= bound


# --- Section 6: the alpha mixture ---------------------------------------------------------------
@pytest.mark.parametrize("alpha, common_size", [(0.3, 1), (0.1, 1), (0.5, 200), (0.2, 50)])
def test_alpha_mixture_count_law_is_beta_binomial(alpha, common_size, rng):
    """Shared winner count ~ Bin(n, e^{-y(1-alpha)}), y ~ Exp(alpha), i.e. BetaBin(n, alpha/(1-alpha), 1)."""
    n, num = 40, 20000
    teachers = alpha_mixture(n, common_size + n * 2, alpha, rng, common_size=common_size, private_size=2)
    votes = coordinated_votes(teachers, num, rng)
    common = votes < common_size
    # All teachers that vote for the common part vote for the same common token.
    firsts = np.where(common.any(axis=1), votes[np.arange(num), common.argmax(axis=1)], -1)
    assert ((votes == firsts[:, None]) | ~common).all()
    count = common.sum(axis=1)
    law = betabinom(n, alpha / (1 - alpha), 1)
    observed = np.bincount(count, minlength=n + 1)
    # Chi-square against the pmf, cells expected fewer than five times pooled.
    check_counts_match_law(dict(enumerate(observed)), dict(enumerate(law.pmf(np.arange(n + 1)))), alpha=1e-4)


@pytest.mark.parametrize("alpha", [0.05, 0.2, 0.4])
def test_alpha_mixture_yield_above_high_threshold_is_about_alpha(alpha, rng):
    n, num = 200, 20000
    teachers = alpha_mixture(n, 1 + n, alpha, rng)
    votes = coordinated_votes(teachers, num, rng)
    above = ((votes == 0).sum(axis=1) >= n // 2).mean()
    exact = betabinom(n, alpha / (1 - alpha), 1).sf(n // 2 - 1)
    assert abs(above - exact) <= z_bound(3) * np.sqrt(exact * (1 - exact) / num)
    # For large n the yield above n/2 tends to 1 - 2^{-alpha/(1-alpha)}, which lies in [alpha/2, alpha].
    limit = 1 - 0.5 ** (alpha / (1 - alpha))
    assert alpha / 2 <= limit <= alpha
    assert abs(exact - limit) < 0.01
