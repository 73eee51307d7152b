"""Sparsity-preserving DP weighted sampling: ``LWS_L`` / ``DPWS_(eps, delta)`` (paper Algorithm 3).

Paper: Hot PATE, Section "Heterogeneous Ensembles" (Algorithm ``LWS_L`` = ``distaggmed:alg``, Lemma
``distaggmed:lemma`` = E.2, Corollary ``DPWS:cor``) and Section "DP methods for heterogeneous ensembles"
(paragraph "Private Weighted Sampling", which uses the sparsity-preserving private weighted sampling of
Cohen, Geri, Sarlos and Stemmer 2021, CGSS21).  Analysis: ``docs/mechanisms/weighted_sampling.md``.

Algorithm (``LWS_L`` with the CGSS21 selection):

1. Poisson weighted sample: token ``j`` enters ``S`` independently with probability ``p(c_j) = min(1, c_j/n)``
   (``n`` counts every teacher, tail votes included).
2. ``Select``: a sampled token is kept independently with probability ``r(c_j) = pi*(c_j) / p(c_j)``, where
   ``pi*`` is the pointwise-largest inclusion function that obeys the per-count DP constraints and the cap
   ``p`` (our reconstruction of CGSS21's optimal selection)::

       pi*(0) = 0,   pi*(c) = min(p(c), e^eps_c pi*(c-1) + delta_c, 1 - e^-eps_c (1 - pi*(c-1) - delta_c)).

   End to end, token ``j`` is in ``S*`` independently with probability ``pi*(c_j)``.
3. Return a token of ``S*`` chosen uniformly at random, or fail if ``S*`` is empty.

Neighbouring relation: replace-one only, one teacher's vote changes (paper Observation 1).  One vote
moves from one token to another (or to/from the tail), so ``n`` stays the same, two counts change by one,
and each count runs at half the budget: ``(eps_c, delta_c) = (epsilon/2, delta/2)``.

Add/remove-one (a teacher and its vote join or leave, so ``n`` changes) is refused at construction: the
sampling rate ``c/n`` of *every* token moves with ``n``, on top of the one count that changes, and the
per-count calibration does not pay for that.  For example ``DPWeightedSampling(1, 1e-6)`` calibrated per
count at ``(1, 1e-6)`` has tight delta ``2.2e-3`` at epsilon 1 on ``{12, 28}`` (n = 40) against
``{13, 28}`` (n = 41): the changed count uses the whole ``e^eps`` and the other token's rate ``28/40`` vs
``28/41`` pushes past it (docs/mechanisms/weighted_sampling.md).

Privacy: the inclusions of distinct tokens are independent, and inclusion of one token is an
``(eps_c, delta_c)``-DP function of its own count (the two recursions are exactly the hockey-stick
constraints between ``Bernoulli(pi*(c-1))`` and ``Bernoulli(pi*(c))``).  The key set ``S*`` is therefore
``(epsilon, delta)``-DP by basic composition over the (at most two) changed keys, and the uniform pick is
post-processing.  Tests check this exactly by enumerating every subset on small histograms.

Sanitised counts (``release_counts=True``, our reconstruction): every survivor's count is also
released as ``c_j + X_j`` with ``X_j ~ TG(eps_c, L)``, ``L = truncation(eps_c, delta_c)`` (so
``|error| <= L``).  That is an ``(eps_c, delta_eff)``-DP release per key (``delta_eff <= delta_c``), so by
composition each key costs ``(2 eps_c, 2 delta_c)`` and the whole release ``(2 epsilon, 2 delta)``; the
event is charged that doubled budget.

Utility: ``r(c) = 1`` (every sampled token survives) for every count from about ``L`` up to
``n - (1 - n delta_c) / (e^eps_c - 1)``, which contains ``[2L, n - 1/eps_c]``; near ``c = n`` full retention
fails unless ``delta_c >= 1/n``.  No token is released more often than ``c_j / n``
(relevance with ``gamma = 1``).
"""

from __future__ import annotations

import functools
from fractions import Fraction

import attr
import numpy as np
from scipy.signal import lfilter
from scipy.special import gammaln, xlog1py, xlogy

from mechanisms.base import (
    FAIL_VALUE,
    BatchRelease,
    EpsilonDeltaClaim,
    Mechanism,
    OutcomeDistribution,
    claim_under,
    gauss_legendre_unit,
)
from mechanisms.geometric import (
    INCLUSION_BITS,
    TruncatedGeometric,
    certified_inclusion,
    check_error_bound,
    optimal_inclusion,
    per_count_budget,
    truncation,
)
from mechanisms.histogram import as_batch, as_histogram
from mechanisms.randomness import RationalLaw, sample_laws, uniform_below
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    WeightedSamplingEvent,
)
from pate_accountant.release import Release
from pate_accountant.validation import check_delta, check_epsilon, check_int

__all__ = ["DPWeightedSampling", "inclusion_table", "uniform_survivor_probabilities"]


# -- pi* per ensemble size ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def inclusion_table(num_teachers: int, epsilon_c: float, delta_c: float) -> np.ndarray:
    """``pi*(c)`` for ``c = 0 .. n`` with the cap ``p(c) = min(1, c/n)``, read-only and cached.

    ``epsilon_c, delta_c`` are the *per-count* parameters.  ``n = 0`` gives ``[0]``.
    """
    n = check_int("num_teachers", num_teachers, minimum=0)
    if n == 0:
        table = np.zeros(1)
    else:
        cap = np.minimum(1.0, np.arange(n + 1) / n)
        table = optimal_inclusion(cap, epsilon_c, delta_c)
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=16)
def _noise(epsilon_c: float, k: int) -> TruncatedGeometric:
    return TruncatedGeometric(epsilon_c, k)


@functools.lru_cache(maxsize=1 << 14)
def _inclusion_law(num_teachers: int, epsilon_c: float, delta_c: float, count: int) -> RationalLaw:
    """``Bernoulli(pi~(count))`` as an exact two-outcome law (outcome 0: included), from the certified
    table (see the sampling section of ``DPWeightedSampling``)."""
    scale = 1 << INCLUSION_BITS
    value = certified_inclusion(num_teachers, epsilon_c, delta_c)[count]
    return RationalLaw([Fraction(value, scale), Fraction(scale - value, scale)])


# -- exact output distribution ---------------------------------------------------------------------------
def _binomial_pmf(size: int, prob: float) -> np.ndarray:
    k = np.arange(size + 1)
    log_pmf = gammaln(size + 1) - gammaln(k + 1) - gammaln(size - k + 1) + xlogy(k, prob) + xlog1py(size - k, -prob)
    return np.exp(log_pmf)


def _divide_out(pmf: np.ndarray, prob: float) -> np.ndarray:
    """The pmf of ``K - B`` given the pmf of ``K = K' + B``, ``B ~ Bernoulli(prob)`` independent of ``K'``.

    Polynomial division of the generating function by ``(1 - prob) + prob t``.  The recursion runs forward
    when ``prob <= 1/2`` and backward otherwise, so each step multiplies the error by at most one.
    """
    a, b = 1.0 - prob, prob
    m = pmf.size - 1
    if b <= 0.5:
        out = lfilter([1.0 / a], [1.0, b / a], pmf[:m])
    else:
        out = lfilter([1.0 / b], [1.0, a / b], pmf[::-1][:m])[::-1]
    return np.maximum(out, 0.0)


def uniform_survivor_probabilities(probabilities, multiplicities=None) -> tuple[np.ndarray, float]:
    """Exact law of "include item ``i`` independently with probability ``probabilities[i]``, return a
    uniform included item, or fail if none".

    Returns ``(p_out, fail)``: ``p_out[i] = pi_i E[1 / (1 + K_{-i})]`` with ``K_{-i}`` the number of *other*
    included items (a Poisson-binomial variable), and ``fail = prod_i (1 - pi_i)``.  With
    ``multiplicities``, entry ``i`` stands for ``multiplicities[i]`` items of the same probability and
    ``p_out[i]`` is the probability of *one* of them.

    Method (dynamic programming on the generating function ``G(t) = prod_i (1 - pi_i + pi_i t)``): the pmf
    of ``K`` is built by convolving one binomial pmf per distinct probability; the pmf of ``K_{-i}`` is
    ``G`` divided by ``(1 - pi_i + pi_i t)`` (a stable one-term recursion); then
    ``E[1/(1+K_{-i})] = sum_k P[K_{-i} = k] / (k + 1)``.  Cost ``O(m (m + d))`` for ``m`` items with ``d``
    distinct probabilities (tokens of equal count share one).
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 1 or not np.all((probabilities >= 0) & (probabilities <= 1)):
        raise ValueError("probabilities must be a 1-d array of values in [0, 1]")
    if multiplicities is None:
        multiplicities = np.ones(probabilities.size, dtype=np.int64)
    multiplicities = np.asarray(multiplicities, dtype=np.int64)
    if multiplicities.shape != probabilities.shape or (multiplicities < 1).any():
        raise ValueError("multiplicities must be positive integers, one per probability")
    if probabilities.size == 0:
        return np.zeros(0), 1.0
    pmf = np.ones(1)
    for prob, size in zip(probabilities, multiplicities):
        pmf = np.convolve(pmf, _binomial_pmf(int(size), float(prob)))
    inverse = 1.0 / np.arange(1, pmf.size)
    out = np.empty(probabilities.size)
    for i, prob in enumerate(probabilities):
        out[i] = prob * float(_divide_out(pmf, float(prob)) @ inverse)
    return out, float(pmf[0])


#: Largest (classes x nodes) block evaluated at once by the quadrature.
_BLOCK = 1 << 21
#: Histograms needing more nodes than this (more than twice as many tokens) use the dynamic program.
_MAX_NODES = 1024


def _quadrature_probabilities(table: np.ndarray, counts: np.ndarray, sample: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per entry ``pi_e int_0^1 prod_{other entries i of its histogram} (1 - pi_i + pi_i t) dt`` with
    ``pi = table[count]``, for entries sorted by histogram (``starts`` as in ``HistogramBatch``).

    Entries of one histogram with equal counts share a factor, so the work is per (histogram, distinct
    count) class: ``log prod = sum_classes m_class log(1 - pi + pi t)`` (every factor is ``>= t > 0``).
    Histograms are bucketed by node count (a power of two at least ``ceil(m/2)``, ``m`` = its tokens);
    entries of histograms needing more than ``_MAX_NODES`` nodes are left at zero (the caller uses the
    dynamic program for them)."""
    if counts.size == 0:
        return np.zeros(0)
    # classes: (histogram, count) pairs, sorted by histogram
    order = np.lexsort((counts, sample))
    s_sample, s_counts = sample[order], counts[order]
    new = np.ones(counts.size, dtype=bool)
    new[1:] = (s_sample[1:] != s_sample[:-1]) | (s_counts[1:] != s_counts[:-1])
    class_of = np.empty(counts.size, dtype=np.int64)
    class_of[order] = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    c_sample, c_pi = s_sample[first], table[s_counts[first]]
    c_mult = np.diff(np.append(first, counts.size)).astype(np.float64)
    c_starts = np.searchsorted(c_sample, np.arange(starts.size))  # class range of each histogram
    c_sizes = np.diff(c_starts)
    per_class = np.zeros(first.size)

    sizes = np.diff(starts)
    needed = np.maximum(1, (sizes + 1) // 2)
    bucket = np.left_shift(1, np.ceil(np.log2(needed)).astype(np.int64))
    for num_nodes in np.unique(bucket[(sizes > 0) & (bucket <= _MAX_NODES)]):
        nodes, weights = gauss_legendre_unit(int(num_nodes))
        in_bucket = (bucket == num_nodes) & (sizes > 0)
        hists = np.flatnonzero(in_bucket)
        selected = np.flatnonzero(np.repeat(in_bucket, c_sizes))  # their classes, sorted by histogram
        bounds = np.concatenate(([0], np.cumsum(c_sizes[hists])))  # histogram boundaries within `selected`
        rows = max(1, _BLOCK // int(num_nodes))
        h0 = 0
        while h0 < hists.size:  # blocks of whole histograms, about `rows` classes each
            h1 = max(h0 + 1, int(np.searchsorted(bounds, bounds[h0] + rows, side="right")) - 1)
            classes = selected[bounds[h0] : bounds[h1]]
            local = np.repeat(np.arange(h1 - h0), c_sizes[hists[h0:h1]])
            log_factor = np.log1p(c_pi[classes, None] * (nodes[None, :] - 1.0))
            totals = np.add.reduceat(c_mult[classes, None] * log_factor, bounds[h0:h1] - bounds[h0], axis=0)
            per_class[classes] = c_pi[classes] * (np.exp(totals[local] - log_factor) @ weights)
            h0 = h1
    return per_class[class_of]


def _validated_epsilon(value) -> float:
    """The total per-run epsilon, in ``(0, MAX_STEP_EPSILON]`` (docs/ranges.md)."""
    return check_epsilon("epsilon", value)


def _validated_delta(value) -> float:
    """The total per-run delta, in ``[MIN_DELTA, 1)`` (docs/ranges.md)."""
    return check_delta("delta", value)


def _check_relation(instance, attribute, value):
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"{attribute.name} must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")


def _check_bool(instance, attribute, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{attribute.name} must be a bool, got {value!r} of type {type(value).__name__}")


@attr.s(frozen=True, slots=True)
class DPWeightedSampling(Mechanism):
    """``DPWS_(epsilon, delta)``: ``LWS_L`` (paper Algorithm 3, Section "Heterogeneous Ensembles") with the
    CGSS21 sparsity-preserving private selection (paper Section "DP methods for heterogeneous ensembles";
    module docstring).

    Each token ``j`` with ``c_j >= 1`` is included independently with probability ``pi*(c_j)`` (a Poisson
    sample at rate ``p(c) = min(1, c/n)`` thinned with keep probability ``r(c) = pi*(c)/p(c)``; the ``pi*``
    recursion with a cap is our reconstruction of CGSS21's selection); the release is a uniformly chosen
    included token, or fail.

    Neighbouring relation: ``relation="replace-one"`` (the default and the only one accepted): one
    teacher's vote changes (paper Observation 1), ``n`` stays fixed, two counts change by one, per-count
    budget ``(epsilon/2, delta/2)``.  ``relation="add-remove-one"`` (``n`` changes) raises ``ValueError``:
    every token's sampling rate ``c/n`` would move too (module docstring).  The release is
    ``(epsilon, delta)``-DP under replace-one; with ``release_counts=True`` (sanitised counts
    ``c_j + TG(eps_c, L)`` of every survivor in ``Release.info["noisy_counts"]``) it is charged
    ``(2 epsilon, 2 delta)``.

    ``error_bound`` is ``L = truncation(eps_c, delta_c)``: sanitised counts are within ``L`` of the truth,
    and every count in ``[2L, n - 1/eps_c]`` survives surely once sampled (full retention fails within
    about ``1/eps_c`` of ``n``).
    """

    epsilon: float = attr.ib(converter=_validated_epsilon)
    delta: float = attr.ib(converter=_validated_delta)
    relation: str = attr.ib(default=REPLACE_ONE, validator=_check_relation)
    release_counts: bool = attr.ib(default=False, validator=_check_bool, kw_only=True)

    def __attrs_post_init__(self):
        if self.relation != REPLACE_ONE:
            raise ValueError(
                f"relation must be 'replace-one' for DPWeightedSampling, got {self.relation!r}: when a teacher is "
                "added or removed n changes, and with it every token's sampling rate c/n"
            )
        if self.release_counts and 2 * self.delta >= 1.0:
            raise ValueError(
                f"delta must be < 0.5 when release_counts=True (the release is charged 2 * delta), got {self.delta}"
            )
        if self.release_counts:  # the sanitised counts draw TG(eps_c, L): L is checked before any table is built
            check_error_bound(self.error_bound, self.epsilon, self.delta)

    # -- parameters ---------------------------------------------------------------------------------------
    @property
    def per_count(self) -> tuple[float, float]:
        """The per-count budget ``(eps_c, delta_c) = (epsilon/2, delta/2)`` of the selection (two counts change
        under replace-one)."""
        return per_count_budget(self.epsilon, self.delta, self.relation)

    @property
    def error_bound(self) -> int:
        """``L``: the truncation of the count noise, ``|noisy count - count| <= L``."""
        return truncation(*self.per_count)

    @property
    def event(self) -> WeightedSamplingEvent:
        """What one run costs, known before it runs: ``(epsilon, delta)``, doubled with ``release_counts``."""
        factor = 2 if self.release_counts else 1
        return WeightedSamplingEvent(factor * self.epsilon, factor * self.delta, self.relation)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """``(epsilon, delta)`` under replace-one (the selection composes over the two changed counts, each
        ``(epsilon/2, delta/2)``); doubled with ``release_counts`` (a sanitised count per survivor)."""
        factor = 2 if self.release_counts else 1
        claim = EpsilonDeltaClaim(factor * self.epsilon, factor * self.delta, self.relation)
        return claim_under(claim, relation, type(self).__name__)

    def inclusion_probabilities(self, num_teachers: int) -> np.ndarray:
        """``pi*(c)`` for ``c = 0 .. n`` (read-only): the end-to-end probability that a token of count ``c``
        is in ``S*``."""
        return inclusion_table(num_teachers, *self.per_count)

    def keep_probabilities(self, num_teachers: int) -> np.ndarray:
        """``r(c) = pi*(c) / p(c)`` for ``c = 0 .. n`` (``r(0) = 0``): the probability that a *sampled*
        token survives ``Select``."""
        table = self.inclusion_probabilities(num_teachers)
        n = table.size - 1
        out = np.zeros(table.size)
        if n:
            cap = np.minimum(1.0, np.arange(1, n + 1) / n)
            out[1:] = table[1:] / cap
        return out

    # -- exact distribution ----------------------------------------------------------------------------------
    def _distribution_arrays(self, counts: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, float]:
        if counts.size == 0:
            return np.zeros(0), 1.0
        values, inverse, sizes = np.unique(counts, return_inverse=True, return_counts=True)
        per_class, fail = uniform_survivor_probabilities(table[values], sizes)
        return per_class[inverse.ravel()], fail

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact output law on one histogram: ``P[j] = pi*(c_j) E[1/(1 + K_{-j})]`` (``K_{-j}``: number of
        other included tokens, Poisson-binomial, by dynamic programming) and ``P[fail] = prod_j (1 - pi*(c_j))``.
        See :func:`uniform_survivor_probabilities`."""
        hist = as_histogram(histogram, num_teachers)
        table = self.inclusion_probabilities(hist.num_teachers)
        probs, fail = self._distribution_arrays(hist.counts, table)
        return OutcomeDistribution(hist.tokens.copy(), probs, fail)

    def batch_fail(self, batch) -> np.ndarray:
        """Vectorised fail of :meth:`output_distribution`, ``prod_j (1 - pi*(c_j))`` per histogram (a sum of
        ``log1p`` terms: full precision when a token is nearly certain to be included); 1 with no token."""
        batch = as_batch(batch)
        table = self.inclusion_probabilities(batch.num_teachers)
        with np.errstate(divide="ignore"):  # pi* = 1: that factor is 0, its log -inf, the product 0
            logs = np.log1p(-np.asarray(table[batch.counts], dtype=np.float64))
        return np.exp(np.bincount(batch.sample, weights=logs, minlength=batch.num_histograms))

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`output_distribution` for every histogram of a batch: ``(histogram, token, probability)``
        for every token with a positive count, sorted by histogram (the rest of each histogram's mass is
        fail).

        Vectorised over the batch (no loop over histograms) by exact Gauss-Legendre quadrature of
        ``E[1/(1+K_{-j})] = int_0^1 prod_{i != j} (1 - pi_i + pi_i t) dt`` (a polynomial of degree ``m - 1``,
        integrated exactly by ``ceil(m/2)`` nodes); histograms are grouped by their number of tokens so each
        group uses one node set, and histograms of more than 2048 tokens use the dynamic program.  This is a second exact method; the tests check it against the dynamic
        program of :meth:`output_distribution` and against enumeration of all included sets."""
        batch = as_batch(batch)
        table = self.inclusion_probabilities(batch.num_teachers)
        probs = _quadrature_probabilities(table, batch.counts, batch.sample, batch.starts)
        starts = batch.starts
        for h in np.flatnonzero(np.diff(starts) > 2 * _MAX_NODES):  # very wide histograms: dynamic program
            probs[starts[h] : starts[h + 1]] = self._distribution_arrays(batch.counts[starts[h] : starts[h + 1]], table)[0]
        return batch.sample.copy(), batch.tokens.copy(), probs

    # -- sampling --------------------------------------------------------------------------------------------
    # The sampler draws from the certified table ``pi~(c) = N_c / 2^B`` of ``mechanisms.geometric.
    # certified_inclusion`` (exact integers, B = 160): ``Bernoulli(pi~(c - 1))`` and ``Bernoulli(pi~(c))`` are
    # exactly (eps_c, delta_c)-indistinguishable with the true e^eps_c, so the realised release is exactly
    # (epsilon, delta)-DP and no margin for rounding is needed.  pi~ agrees with the float64 table of
    # ``inclusion_probabilities`` to about 1e-14 relative, for pi and for 1 - pi alike (the fixed-point
    # recursion never forms 1 - x by cancellation: its last rounding is 2^-160 absolute).
    @staticmethod
    def _include_and_pick(counts, sample, starts, num_histograms, law_of_count, source):
        """Vectorised run: entry ``e`` is included with probability exactly ``pi~(counts[e])`` (one 64-bit word
        compared with the exact leading bits of ``pi~``, refined on a tie), then each histogram picks a
        survivor by an exact uniform integer.  Returns the inclusion mask and the chosen entry of each
        histogram (``-1``: fail)."""
        distinct, which = np.unique(counts, return_inverse=True)
        laws = [law_of_count(int(c)) for c in distinct]
        included = sample_laws(laws, which.ravel(), source) == 0 if laws else np.zeros(0, dtype=bool)
        chosen = np.full(num_histograms, -1, dtype=np.int64)
        if counts.size == 0:
            return included, chosen
        survivors = np.bincount(sample[included], minlength=num_histograms)
        before = np.concatenate(([0], np.cumsum(included)))
        rank = before[:-1] - before[starts[:-1]][sample]  # included entries of the same histogram before e
        index = np.zeros(num_histograms, dtype=np.int64)
        several = np.flatnonzero(survivors > 1)
        index[several] = uniform_below(survivors[several], source)
        hit = np.flatnonzero(included & (rank == index[sample]))
        chosen[sample[hit]] = hit
        return included, chosen

    def _run(self, hist, source) -> Release:
        """Run once: a token (or ``None`` for fail) and, with ``release_counts``, ``info["noisy_counts"]``
        ``{token: c_j + X_j}`` for every survivor (``X_j ~ TG(eps_c, L)``, drawn exactly).

        Each token is first Poisson-sampled with probability exactly ``min(1, c/n)`` (``below(n) < c``), then
        kept with probability exactly ``r(c) = pi~(c) / min(1, c/n)`` (a rational Bernoulli); the survivor is an
        exact uniform pick."""
        n = hist.num_teachers
        table = certified_inclusion(n, *self.per_count)
        tokens, counts = hist.tokens, hist.counts
        included = np.zeros(counts.size, dtype=bool)
        for e, c in enumerate(counts.tolist()):
            if c >= n:  # sampled surely; keep with probability pi~(c)
                included[e] = source.bernoulli_ratio(table[min(c, n)], 1 << INCLUSION_BITS)
            elif source.below(n) < c:  # Poisson sample at rate c / n; keep with pi~(c) n / c
                included[e] = source.bernoulli_ratio(table[c] * n, c << INCLUSION_BITS)
        survivors = np.flatnonzero(included)
        value = None if survivors.size == 0 else int(tokens[survivors[source.below(survivors.size)]])
        info = {}
        if self.release_counts:
            eps_c, _ = self.per_count
            noise = _noise(eps_c, self.error_bound).sample(source, survivors.size)
            noisy = counts[survivors] + noise
            info["noisy_counts"] = {int(t): int(v) for t, v in zip(tokens[survivors], noisy)}
        return Release(value, self.event, info=info)

    def _run_batch(self, batch, source) -> BatchRelease:
        """Run on every histogram of a batch, vectorised and exact: one 64-bit word per (histogram, token)
        entry decides inclusion with probability ``pi~(c)`` (the two stages of a single run in one), one
        exact uniform integer per histogram with several survivors picks the survivor.  Each histogram is
        charged :attr:`event`.  A batch releases tokens only: with ``release_counts=True`` no counts are
        returned, and the doubled event is still charged (conservative)."""
        n, (eps_c, delta_c) = batch.num_teachers, self.per_count
        _, chosen = self._include_and_pick(
            batch.counts, batch.sample, batch.starts, batch.num_histograms,
            lambda c: _inclusion_law(n, eps_c, delta_c, min(c, n)), source,
        )
        values = np.full(batch.num_histograms, FAIL_VALUE, dtype=np.int64)
        ok = chosen >= 0
        values[ok] = batch.tokens[chosen[ok]]
        return BatchRelease(values, self.event)
