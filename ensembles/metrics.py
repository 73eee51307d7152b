"""Diversity and utility metrics for vote histograms (paper Section 5, Appendices C and D).

``votes`` is always a ``(num_samples, num_teachers)`` vote matrix from :func:`ensembles.coordinated_votes`
or :func:`ensembles.independent_votes` (``r`` samples of the shared randomness); tail votes
(``TAIL_VOTE``) count in ``n`` but belong to no token.  ``threshold`` is ``T`` and may be a scalar or an
array (the result then has one entry per threshold).

* coverage (transferred probability mass): ``(1/r) sum_h sum_j c_j^h 1{c_j^h >= T} / n``;
* support size (transferred support): ``|{j : max_h c_j^h >= T}|``;
* average yield per sample: ``(1/r) sum_h |{j : c_j^h >= T}|``;
* per-sample maximum count and margin (top minus second), and the maximum over ``k`` retries;
* the transferred distribution ``(1/r) sum_h c_j^h 1{c_j^h >= T} / n`` and its total variation to the
  average teacher distribution (the missing mass is the ``fail`` outcome);
* the tau-robust mass ``P(tau) = sum_j (1/n) sum_i min(p_ij, tau-th largest p_hj)`` (Remark D.1);
* pairwise agreement: probability Jaccard ``J_P`` (exact for Algorithm 1) and weighted Jaccard ``J_W``;
* :func:`cold_zero_threshold`: a threshold from which independent (Cold PATE) coverage is zero with high
  probability (Chernoff-Hoeffding bound on each token's binomial-like count).
"""

from __future__ import annotations

import numpy as np

from ensembles.distributions import TeacherDistributions
from ensembles.histograms import count_votes
from pate_accountant.validation import check_int, check_real

__all__ = [
    "agreement_by_token",
    "cold_zero_threshold",
    "average_yield",
    "coverage",
    "independent_agreement",
    "margins",
    "max_counts",
    "probability_jaccard",
    "robust_mass",
    "support_size",
    "total_variation",
    "transferred_distribution",
    "weighted_jaccard",
]


def _votes(votes) -> np.ndarray:
    array = np.asarray(votes)
    if array.ndim != 2:
        raise ValueError(f"votes must have shape (num_samples, num_teachers), got {array.shape}")
    if array.dtype.kind not in "iu":
        raise TypeError(f"votes must be integer token ids, got dtype {array.dtype}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"votes must hold at least one sample and one teacher, got shape {array.shape}")
    return array


def _thresholds(threshold) -> tuple[np.ndarray, bool]:
    values = np.asarray(threshold)
    scalar = values.ndim == 0
    values = np.atleast_1d(values)
    if values.dtype.kind not in "iuf" or values.ndim != 1:
        raise TypeError(f"threshold must be a number or a 1-d array of numbers, got {threshold!r}")
    if not np.isfinite(values).all() or (values <= 0).any():
        raise ValueError(f"threshold must be positive, got {threshold!r}")
    return values.astype(np.float64), scalar


def _per_threshold(values: np.ndarray, scalar: bool):
    return values[0].item() if scalar else values


def coverage(votes, threshold):
    """Fraction of all votes that go to tokens whose count is at least ``threshold``, averaged over samples."""
    votes = _votes(votes)
    t, scalar = _thresholds(threshold)
    _, _, counts = count_votes(votes)
    ordered = np.sort(counts)
    suffix = np.concatenate([np.cumsum(ordered[::-1])[::-1], [0]])
    above = suffix[np.searchsorted(ordered, t, side="left")]
    return _per_threshold(above / votes.size, scalar)


def support_size(votes, threshold):
    """Number of distinct tokens that reach ``threshold`` in at least one sample."""
    votes = _votes(votes)
    t, scalar = _thresholds(threshold)
    _, tokens, counts = count_votes(votes)
    if tokens.size == 0:
        return _per_threshold(np.zeros(t.size, dtype=np.int64), scalar)
    best = np.zeros(tokens.max() + 1, dtype=np.int64)
    np.maximum.at(best, tokens, counts)
    best = np.sort(best[best > 0])
    return _per_threshold(best.size - np.searchsorted(best, t, side="left"), scalar)


def average_yield(votes, threshold):
    """Average number of tokens per sample whose count is at least ``threshold``."""
    votes = _votes(votes)
    t, scalar = _thresholds(threshold)
    _, _, counts = count_votes(votes)
    ordered = np.sort(counts)
    return _per_threshold((ordered.size - np.searchsorted(ordered, t, side="left")) / votes.shape[0], scalar)


def _top_two(votes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample largest and second-largest counts (0 where absent)."""
    sample, _, counts = count_votes(votes)
    num_samples = votes.shape[0]
    order = np.lexsort((-counts, sample))
    sample, counts = sample[order], counts[order]
    first = np.searchsorted(sample, np.arange(num_samples))
    present = np.bincount(sample, minlength=num_samples)
    top = np.zeros(num_samples, dtype=np.int64)
    second = np.zeros(num_samples, dtype=np.int64)
    top[present >= 1] = counts[first[present >= 1]]
    second[present >= 2] = counts[first[present >= 2] + 1]
    return top, second


def max_counts(votes, retries: int = 1) -> np.ndarray:
    """Per-sample maximum count (tail votes excluded).

    With ``retries = k > 1`` consecutive groups of ``k`` samples are one step with ``k`` tries (fresh
    shared randomness each), and the result is the maximum over each group's tries: shape
    ``(num_samples // k,)`` (a trailing partial group is dropped).
    """
    votes = _votes(votes)
    retries = check_int("retries", retries, minimum=1)
    top, _ = _top_two(votes)
    groups = top.size // retries
    if groups == 0:
        raise ValueError(f"retries={retries} exceeds the number of samples {top.size}")
    return top[: groups * retries].reshape(groups, retries).max(axis=1)


def margins(votes) -> np.ndarray:
    """Per-sample margin: top count minus second count (the second is 0 when only one token has votes)."""
    votes = _votes(votes)
    top, second = _top_two(votes)
    return top - second


def transferred_distribution(votes, threshold, vocab_size: int) -> np.ndarray:
    """``q_j(T) = (1/r) sum_h c_j^h 1{c_j^h >= T} / n`` as a length-``vocab_size`` vector.

    Its total is :func:`coverage`; the rest is the ``fail`` outcome.
    """
    votes = _votes(votes)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    t, scalar = _thresholds(threshold)
    if not scalar:
        raise TypeError("transferred_distribution takes one threshold")
    _, tokens, counts = count_votes(votes)
    keep = counts >= t[0]
    if tokens.size and tokens.max() >= vocab_size:
        raise ValueError(f"vote {int(tokens.max())} is outside the vocabulary of size {vocab_size}")
    return np.bincount(tokens[keep], weights=counts[keep], minlength=vocab_size) / votes.size


def total_variation(p, q) -> float:
    """Total variation distance between two (sub-)distributions over the same tokens.

    Mass missing from either vector (``1 - sum``) is an extra ``fail`` outcome, so a transferred
    distribution can be compared with the average teacher distribution directly.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p and q must be 1-d of equal length, got shapes {p.shape} and {q.shape}")
    for name, v in (("p", p), ("q", q)):
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError(f"{name} must hold finite non-negative probabilities")
        if v.sum() > 1.0 + 1e-9:
            raise ValueError(f"{name} sums to {v.sum():.12g}, more than 1")
    missing = abs(max(0.0, 1.0 - p.sum()) - max(0.0, 1.0 - q.sum()))
    return float(0.5 * (np.abs(p - q).sum() + missing))


def robust_mass(teachers: TeacherDistributions, tau, *, per_token: bool = False):
    """The tau-robust mass ``P(tau)`` of Remark D.1 (an upper bound on what support ``tau`` can transfer).

    ``P_j(tau) = (1/n) sum_i min(p_ij, t_j(tau))`` with ``t_j(tau)`` the ``tau``-th largest of
    ``p_1j .. p_nj`` (zeros included); ``P(1)`` is the average distribution's mass and ``P`` does not
    increase with ``tau``.  ``tau`` may be an integer or an array of integers in ``[1, n]``.  With
    ``per_token=True`` and a scalar ``tau`` returns the vector ``(P_j(tau))_j`` over the vocabulary.
    """
    if not isinstance(teachers, TeacherDistributions):
        raise TypeError(f"teachers must be a TeacherDistributions, got {type(teachers).__name__}")
    n = teachers.num_teachers
    taus = np.atleast_1d(np.asarray(tau))
    scalar = np.ndim(tau) == 0
    if taus.dtype.kind not in "iu":
        raise TypeError(f"tau must be an integer or integer array, got {tau!r}")
    if (taus < 1).any() or (taus > n).any():
        raise ValueError(f"tau must lie in [1, num_teachers={n}], got {tau!r}")
    if per_token and not scalar:
        raise TypeError("per_token=True needs a scalar tau")
    tokens, probs = teachers.token_ids, teachers.probs
    order = np.lexsort((-probs, tokens))
    tokens, probs = tokens[order], probs[order]
    starts = np.searchsorted(tokens, np.unique(tokens))
    sizes = np.diff(np.append(starts, tokens.size))
    token_index = np.repeat(np.arange(starts.size), sizes)
    results = []
    for t in taus:
        t = int(t)
        # t-th largest of n values (zeros included): the entry of rank t-1 if the token has >= t entries.
        has = sizes >= t
        cap = np.zeros(starts.size)
        cap[has] = probs[starts[has] + t - 1]
        contribution = np.minimum(probs, cap[token_index])
        if per_token:
            return np.bincount(tokens, weights=contribution, minlength=teachers.vocab_size) / n
        results.append(contribution.sum() / n)
    out = np.asarray(results)
    return out[0].item() if scalar else out


def probability_jaccard(p, q) -> float:
    """``J_P(p, q) = sum_j 1 / sum_k max(p_k / p_j, q_k / q_j)`` over ``j`` with ``p_j, q_j > 0``.

    Exactly the probability that two teachers with distributions ``p`` and ``q`` cast the same vote under
    Algorithm 1 (shared ``u_j ~ Exp(1)``, vote ``argmax_j p_j / u_j``); Moulton and Jiang (2018).  The
    per-token term is the probability that both vote ``j``.
    """
    return float(agreement_by_token(p, q).sum())


def agreement_by_token(p, q) -> np.ndarray:
    """``Pr[y_p = y_q = j] = 1 / sum_k max(p_k / p_j, q_k / q_j)`` for every token ``j`` (0 if ``p_j q_j = 0``)."""
    p, q = _pair(p, q)
    out = np.zeros(p.size)
    both = np.flatnonzero((p > 0) & (q > 0))
    with np.errstate(over="ignore"):  # a huge ratio sum (tiny p_j) correctly gives probability 0
        for j in both:
            out[j] = 1.0 / np.maximum(p / p[j], q / q[j]).sum()
    return out


def weighted_jaccard(p, q) -> float:
    """``J_W(p, q) = sum_j min(p_j, q_j) / sum_j max(p_j, q_j) = (1 - TV) / (1 + TV)``; a lower bound on ``J_P``."""
    p, q = _pair(p, q)
    return float(np.minimum(p, q).sum() / np.maximum(p, q).sum())


def independent_agreement(p, q) -> float:
    """Probability that two independent samples from ``p`` and ``q`` agree: ``sum_j p_j q_j``."""
    p, q = _pair(p, q)
    return float(p @ q)


def _pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be 1-d of equal length, got shapes {p.shape} and {q.shape}")
    for name, v in (("p", p), ("q", q)):
        if not np.isfinite(v).all() or (v < 0).any() or abs(v.sum() - 1.0) > 1e-9:
            raise ValueError(f"{name} must be a probability vector (non-negative, summing to 1)")
    return p, q


def cold_zero_threshold(average, num_teachers: int, num_samples: int, delta: float = 1e-6):
    """Smallest ``T`` such that, with probability at least ``1 - delta``, no token reaches count ``T`` in any
    of ``num_samples`` independent (Cold PATE) histograms of ``n = num_teachers`` teachers whose average
    distribution is ``average``; ``None`` when no ``T <= n`` qualifies.

    Token ``j``'s independent count is a sum of ``n`` independent Bernoulli votes with mean ``n pbar_j``
    (Poisson-binomial).  The Chernoff-Hoeffding bound ``Pr[count_j >= T] <= exp(-n D(T/n || pbar_j))`` for
    ``T/n > pbar_j`` (``D``: Bernoulli relative entropy; Hoeffding 1963, Theorem 1, which holds for any
    independent summands in ``[0, 1]`` with average mean ``pbar_j``), with a union bound over the tokens and the samples, must total at most ``delta``.  Coverage
    is non-increasing in ``T``, so it stays zero above the returned value.
    """
    from scipy.special import rel_entr

    n = check_int("num_teachers", num_teachers, minimum=1)
    r = check_int("num_samples", num_samples, minimum=1)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    p = np.asarray(average, dtype=np.float64).ravel()
    p = p[p > 0]
    for t in range(1, n + 1):
        q = t / n
        if (p >= q).any():
            continue
        divergence = rel_entr(q, p) + rel_entr(1.0 - q, 1.0 - p)  # finite and warning-free for tiny p
        if r * np.exp(-n * divergence).sum() <= delta:
            return t
    return None
