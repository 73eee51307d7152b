"""Truncated-geometric ``NoisyArgMax_L`` and the ``LArgMax_L`` aggregator ``DPArgMax``.

Paper: Hot PATE, Section "DP Aggregation Methods" (homogeneous ensembles): Algorithm ``LArgMax_L``
(``distagg:alg``, Algorithm 2), Lemma ``distalghigh`` (diversity preservation with ``tau = 0.6 n``,
``beta = 0.5 * 0.6 * ln(18/17)``, ``gamma = 2`` when ``L < n/30``) and Corollary ``DPArgMax``.

Neighbouring relations (one meaning each).  Replace-one (the default): one teacher's vote moves from one
token (or the tail) to another, ``n`` fixed, two counts change by one (paper Observation 1).
Add-remove-one: a teacher and its vote join or leave, ``n`` changes by one, one count (or the tail) with
it.  A mechanism's ``(epsilon, delta)`` is its *total* guarantee under its ``relation``.

* ``TruncatedGeometricNoisyArgMax`` releases a token and its noisy count, a function of every count and not
  of ``n``: under replace-one two counts change, so each is noised at ``(epsilon/2, delta/2)``; under
  add-remove-one one count changes, so each gets ``(epsilon, delta)``.
* ``DPArgMax`` releases only the majority token (at most one token has ``c > n/2``), a function of that one
  count and of ``n``.  Under either relation a neighbour moves the noise the majority needs by at most one
  (or swaps a bare majority between two tokens, where the release has probability ``delta_eff``), so every
  count is noised at the whole budget ``(epsilon, delta)`` (``DPArgMax`` class docstring).

The error bound ``L`` is computed, not assumed: ``L = k = ceil(k*(eps_c, delta_c))``, the truncation of the
per-count noise ``TG(eps_c, k)``.  For total ``(1, 1e-6)`` that is ``L = 27`` for the replace-one
``TruncatedGeometricNoisyArgMax`` and ``L = 14`` for ``DPArgMax`` and for the add-remove-one
``TruncatedGeometricNoisyArgMax`` (the paper's ``eps^-1 ln(1/delta)``, up to the ceiling).

Sampling is exact (see :mod:`mechanisms.randomness`): the noise ``TG(eps_c, L)`` is drawn with integer
arithmetic from random bits, so every noise value, the extreme ``+-L`` included, has exactly its
probability ``A e^{-eps_c |x|}`` for the rational ``eps_c`` that the float stores, and ties are broken by an
exact uniform integer.  The realised mechanism is therefore exactly the one analysed: its delta is
``delta_eff(eps_c, L)``, certified ``<= delta_c`` by ``truncation`` (no margin is needed for rounding).
Bits come from the operating system's cryptographic randomness when ``rng`` is ``None``; a
``numpy.random.Generator`` makes runs reproducible (tests only: whoever knows the seed knows the noise).
The output distributions (``output_distribution`` and friends) are float64 computations of the same law.
"""

from __future__ import annotations

import math

import attr
import numpy as np

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
    TruncatedGeometric,
    check_error_bound,
    delta_effective,
    per_count_budget,
    truncation,
)
from mechanisms.histogram import as_batch, as_histogram
from mechanisms.randomness import random_bits, uniform_below
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    NoisyArgMaxEvent,
)
from pate_accountant.release import Release
from pate_accountant.validation import check_delta, check_epsilon

__all__ = ["DPArgMax", "TruncatedGeometricNoisyArgMax"]

#: Bound on the quadrature error of one tie integral, per key (see ``_win_table``).
_TIE_TOLERANCE = 1e-17
#: Largest ``values x groups x nodes`` array built at once by ``_win_table``.
_CHUNK_ELEMENTS = 1 << 22


# --- validation (converters, so the stored values are plain floats) -------------------------------
def _epsilon(value) -> float:
    """The total per-run epsilon, in ``(0, MAX_STEP_EPSILON]`` (docs/ranges.md)."""
    return check_epsilon("epsilon", value)


def _delta(value) -> float:
    """The total per-run delta, in ``[MIN_DELTA, 1)`` (docs/ranges.md)."""
    return check_delta("delta", value)


def _relation(value) -> str:
    if not isinstance(value, str) or value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")
    return value


# --- the noise table ------------------------------------------------------------------------------
class _Table:
    """``TG(eps, k)`` as exact lookup tables: ``pmf(x)`` and ``le(x) = P[X <= x]`` for integer arrays ``x``.

    ``P[X >= x] = le(-x)`` by symmetry, so both tails are read from cumulative sums of small terms and
    keep full relative precision (no ``1 - cdf`` cancellation).
    """

    __slots__ = ("k", "_pmf", "_le")

    def __init__(self, noise: TruncatedGeometric):
        self.k = noise.k
        self._pmf = noise.pmf(noise.support)
        self._le = np.cumsum(self._pmf)
        self._le[-1] = 1.0

    def pmf(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        return np.where(np.abs(x) <= self.k, self._pmf[np.clip(x + self.k, 0, 2 * self.k)], 0.0)

    def le(self, x) -> np.ndarray:
        """``P[X <= x]``."""
        x = np.asarray(x, dtype=np.int64)
        return np.where(x < -self.k, 0.0, np.where(x >= self.k, 1.0, self._le[np.clip(x + self.k, 0, 2 * self.k)]))

    def ge(self, x) -> np.ndarray:
        """``P[X >= x]``."""
        return self.le(-np.asarray(x, dtype=np.int64))

    def log_le(self, x) -> np.ndarray:
        """``ln P[X <= x]`` to full relative precision, also when ``P[X <= x]`` is close to 1."""
        x = np.asarray(x, dtype=np.int64)
        low, high = self.le(x), self.ge(x + 1)
        with np.errstate(divide="ignore"):
            return np.where(low < 0.5, np.log(low), np.log1p(-high))


def _nodes_needed(rate: float, degree: int, tolerance: float) -> int:
    """Quadrature nodes for ``int_0^1 prod_h (a_h + b_h x) dx`` with ``degree`` factors that depend on ``x``.

    Exact once ``2 Q > degree``.  The coefficient of ``x^t`` is the probability that exactly ``t`` other keys
    tie, so the terms a ``Q``-node rule gets wrong (``t >= 2 Q``) weigh at most ``P[T >= 2 Q] <= rate^{2Q} /
    (2Q)!`` with ``rate = sum_h b_h``; ``Q`` stops growing once that is below ``tolerance``.
    """
    if degree <= 0:
        return 1
    terms = np.arange(1, degree + 2)
    if rate > 0:
        log_tail = terms * math.log(rate) - np.array([math.lgamma(t + 1) for t in terms])
        small = np.flatnonzero(log_tail <= math.log(tolerance))
        terms_needed = int(terms[small[0]]) if small.size else degree + 1
    else:
        terms_needed = 1
    needed = max(1, -(-min(terms_needed, degree + 1) // 2))
    return needed if needed <= 16 else 16 * -(-needed // 16)  # a few cached sizes


# --- shared parameters -----------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class _CountNoise(Mechanism):
    """Total ``(epsilon, delta)`` under ``relation``; per-count noise ``TG(eps_c, L)`` with
    ``(eps_c, delta_c) = _per_count()``."""

    epsilon: float = attr.ib(converter=_epsilon)
    delta: float = attr.ib(converter=_delta)
    relation: str = attr.ib(default=REPLACE_ONE, kw_only=True, converter=_relation)
    _noise: TruncatedGeometric = attr.ib(init=False, repr=False, eq=False)
    _table: _Table = attr.ib(init=False, repr=False, eq=False)

    def __attrs_post_init__(self):
        eps_c, delta_c = self._per_count()
        # The truncation L is checked before any table of 2L + 1 entries is built (docs/ranges.md).
        error_bound = check_error_bound(truncation(eps_c, delta_c), self.epsilon, self.delta)
        noise = TruncatedGeometric(eps_c, error_bound)
        object.__setattr__(self, "_noise", noise)
        object.__setattr__(self, "_table", _Table(noise))

    def _per_count(self) -> tuple[float, float]:
        """``(eps_c, delta_c)``: half the budget per count under replace-one (two counts change), all of it
        under add-remove-one."""
        return per_count_budget(self.epsilon, self.delta, self.relation)

    @property
    def per_count_epsilon(self) -> float:
        """``eps_c``, the parameter of the per-count noise ``TG(eps_c, L)``."""
        return self._noise.epsilon

    @property
    def per_count_delta(self) -> float:
        """``delta_c``, the delta the truncation ``L`` is calibrated to (``delta_eff(eps_c, L) <= delta_c``)."""
        return self._per_count()[1]

    @property
    def error_bound(self) -> int:
        """``L = k = ceil(k*(eps_c, delta_c))``: the truncation of the per-count noise."""
        return self._noise.k

    @property
    def effective_delta(self) -> float:
        """The delta actually spent: ``delta_eff(eps_c, L) = A e^{-eps_c L}`` per changed count, times the
        number of counts one neighbouring step changes (2 under replace-one, 1 under add-remove-one).
        Never above ``delta``."""
        per_count = delta_effective(self.per_count_epsilon, self.error_bound)
        return 2 * per_count if self.relation == REPLACE_ONE else per_count

    @property
    def event(self) -> NoisyArgMaxEvent:
        """The privacy event of one run, known before it runs."""
        return NoisyArgMaxEvent(
            epsilon=self.epsilon, delta=self.delta, relation=self.relation, error_bound=self.error_bound
        )

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """``(epsilon, effective_delta)`` under :attr:`relation`: the truncation's delta as really spent
        (:attr:`effective_delta`, never above the ``delta`` the event charges)."""
        claim = EpsilonDeltaClaim(self.epsilon, self.effective_delta, self.relation)
        return claim_under(claim, relation, type(self).__name__)


# --- NoisyArgMax_L ----------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class TruncatedGeometricNoisyArgMax(_CountNoise):
    """``NoisyArgMax_L`` with truncated two-sided geometric noise (paper Section "DP Aggregation
    Methods", paragraph "DP instantiations of NoisyArgMax_L").

    ``TruncatedGeometricNoisyArgMax(epsilon, delta, relation="replace-one")`` is ``(epsilon, delta)``-DP in
    total under ``relation``.  Under the default replace-one (one teacher's vote moves, paper Observation 1)
    two counts move by one and each count is noised at ``(eps_c, delta_c) = (epsilon/2, delta/2)``; under
    add-remove-one (a teacher and its vote join or leave) one count moves and each gets ``(epsilon, delta)``.
    The release depends on the counts only, not on ``n``, so a teacher voting into the tail changes nothing.

    On a histogram ``c``:

    1. every token with ``c_j >= 1`` gets ``c~_j = c_j + X_j``, ``X_j ~ TG(eps_c, L)`` independently, and is
       *released* iff ``c~_j >= L + 1`` (``(eps_c, delta_eff)``-DP per count, ``delta_eff <= delta_c``);
    2. the release is the released token with the largest noisy count (ties broken uniformly at random)
       with ``info = {"noisy_count": c~_j}``, or ``None`` (fail) when nothing is released.

    Step 2 is post-processing of the released sparse noisy histogram, so the whole is ``(epsilon, delta)``-DP.
    Tokens with no vote are never candidates: that is safe only because the noise is truncated and the
    release threshold ``L + 1`` sits above every noisy value a zero count could have had (``0 + X <= L``),
    so a token appearing or disappearing (count 0 <-> 1) costs at most ``delta_eff``.

    Error contract (paper Algorithm 2), deterministically: ``max_h c_h - L <= c~_j <= c_j + L``.
    Every token with ``c_j >= 2L + 1`` is always released.
    """

    def _win_table(self, counts: np.ndarray):
        """Exact law of the winner by count group.

        Returns ``(groups, multiplicity, values, win, fail)``: ``win[v, g]`` is the probability that one
        given key of count ``groups[g]`` is released as the argmax with noisy count ``values[v]``.

        For a key ``j`` to win at value ``v`` it must have ``c~_j = v`` (probability ``b_j(v)``), every other
        key must be unreleased or below ``v`` (``a_i(v) = P[c_i + X <= v - 1]``, since ``v >= L + 1``) or tie at
        ``v`` (``b_i(v)``), and ``j`` must win the uniform tie-break among the ``t`` tied others
        (probability ``1/(t + 1) = int_0^1 x^t dx``).  Summing over which others tie gives

            P[j wins at v] = b_j(v) * int_0^1 prod_{i != j} (a_i(v) + b_i(v) x) dx,

        a polynomial integral done by Gauss-Legendre quadrature with enough nodes to be exact (or, for very
        many near-tied keys, with a proven error below ``1e-17`` per key; see ``_nodes_needed``).  Keys with
        equal counts share ``a`` and ``b``, so the product runs over count groups with multiplicities.  The
        winner's value lies in ``[max(L + 1, c_max - L), c_max + L]``: at most ``2L + 1`` values.
        """
        k, table = self.error_bound, self._table
        groups, multiplicity = np.unique(np.asarray(counts, dtype=np.int64), return_counts=True)
        if groups.size == 0:
            return groups, multiplicity, np.zeros(0, np.int64), np.zeros((0, 0)), 1.0
        top = int(groups[-1])
        values = np.arange(max(k + 1, top - k), top + k + 1)
        fail = float(np.exp((table.log_le(k - groups) * multiplicity).sum()))
        win = np.zeros((values.size, groups.size))
        tolerance = _TIE_TOLERANCE / max(1, int(multiplicity.sum()))
        step = max(1, _CHUNK_ELEMENTS // max(1, groups.size * 64))
        for v0 in range(0, values.size, step):
            win[v0 : v0 + step] = self._win_chunk(values[v0 : v0 + step], groups, multiplicity, tolerance)
        return groups, multiplicity, values, win, fail

    def _win_chunk(self, values, groups, multiplicity, tolerance):
        table, k = self._table, self.error_bound
        tie = values[:, None] - groups[None, :]  # the noise X a key of count c needs for c + X = v
        b = table.pmf(tie)
        below = table.le(tie - 1)  # a = P[c + X <= v - 1]
        above = table.ge(tie + 1)  # P[c + X >= v + 1]
        always_above = groups[None, :] > values[:, None] + k  # a = b = 0: no key of this count is ever <= v
        blocked = (always_above * multiplicity).sum(axis=1) > 0
        degree = int(((b > 0) * multiplicity).sum(axis=1).max()) - 1
        rate = float((b * multiplicity).sum(axis=1).max())
        nodes, weights = gauss_legendre_unit(_nodes_needed(rate, degree, tolerance))
        bx = b[:, :, None] * nodes
        with np.errstate(divide="ignore", invalid="ignore"):
            # log(a + b x), from whichever side keeps relative precision.
            log_factor = np.where(
                below[:, :, None] < 0.5,
                np.log(below[:, :, None] + bx),
                np.log1p(-(above[:, :, None] + (b[:, :, None] - bx))),
            )
        log_factor[np.broadcast_to(always_above[:, :, None], log_factor.shape)] = 0.0
        log_total = (log_factor * multiplicity[None, :, None]).sum(axis=1)  # (values, nodes)
        integrals = np.exp(log_total[:, None, :] - log_factor) @ weights  # (values, groups)
        integrals[blocked] = 0.0
        return b * integrals

    def joint_distribution(self, histogram, num_teachers: int | None = None):
        """The exact law of the full release ``(token, noisy count)``.

        Returns ``(tokens, noisy_counts, probabilities, fail)``: arrays listing every pair with positive
        probability, and the probability of fail.
        """
        hist = as_histogram(histogram, num_teachers)
        groups, _, values, win, fail = self._win_table(hist.counts)
        if groups.size == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros(0), fail
        per_key = win[:, np.searchsorted(groups, hist.counts)]  # (values, keys)
        v_index, key_index = np.nonzero(per_key > 0)
        return hist.tokens[key_index], values[v_index], per_key[v_index, key_index], fail

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact marginal law of the released token (see ``_win_table`` for the method)."""
        hist = as_histogram(histogram, num_teachers)
        return self._distribution(hist.tokens, hist.counts)

    def _distribution(self, tokens, counts) -> OutcomeDistribution:
        groups, _, _, win, fail = self._win_table(counts)
        if groups.size == 0:
            return OutcomeDistribution(np.zeros(0, np.int64), np.zeros(0), fail)
        probabilities = win.sum(axis=0)[np.searchsorted(groups, counts)]
        keep = probabilities > 0
        return OutcomeDistribution(np.asarray(tokens)[keep], probabilities[keep], fail)

    def _run(self, hist, source) -> Release:
        """One run (``mechanism(histogram, rng=None)``, :class:`mechanisms.base.Mechanism`): noise every voted
        count, threshold at ``L + 1``, release the noisy argmax (or fail), with ``info["noisy_count"]``.
        Exact draws from the bit source (module docstring)."""
        noisy = hist.counts + self._noise.sample(source, hist.counts.size)
        released = np.flatnonzero(noisy >= self.error_bound + 1)
        if released.size == 0:
            return Release(None, self.event)
        best = noisy[released].max()
        winners = released[noisy[released] == best]
        winner = winners[source.below(winners.size)] if winners.size > 1 else winners[0]
        return Release(int(hist.tokens[winner]), self.event, info={"noisy_count": int(best)})

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`output_distribution` of every histogram of a batch: ``(histogram, token, probability)`` of
        each token with positive probability, sorted by histogram (the rest of each histogram's mass is fail).

        This loops over the histograms (each one is vectorised over its count groups, values and quadrature
        nodes); histograms with the same multiset of counts share one computation.
        """
        batch = as_batch(batch)
        out_sample, out_tokens, out_probs = [], [], []
        cache: dict = {}
        for i in range(batch.num_histograms):
            lo, hi = batch.starts[i], batch.starts[i + 1]
            counts = batch.counts[lo:hi]
            if counts.size == 0:
                continue
            key = np.sort(counts).tobytes()
            if key not in cache:
                groups, _, _, win, _ = self._win_table(counts)
                cache[key] = (groups, win.sum(axis=0))
            groups, per_group = cache[key]
            probs = per_group[np.searchsorted(groups, counts)]
            keep = probs > 0
            out_sample.append(np.full(int(keep.sum()), i, dtype=np.int64))
            out_tokens.append(batch.tokens[lo:hi][keep])
            out_probs.append(probs[keep])
        if not out_sample:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(out_sample), np.concatenate(out_tokens), np.concatenate(out_probs)

    def sample_batch(self, batch, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One run per histogram, vectorised: ``(values, noisy_counts)``.

        ``values[i]`` is the released token of histogram ``i`` (``FAIL_VALUE`` for fail) and
        ``noisy_counts[i]`` its noisy count (0 for fail).  All entries are noised at once with exact ``TG``
        draws (one 64-bit word each, exact inverse distribution function), thresholded at ``L + 1``; each
        histogram's largest noisy count is found by a segmented maximum and, when several keys tie, the
        winner is an exact uniform pick among them.
        """
        source = random_bits(rng)
        batch = as_batch(batch)
        values = np.full(batch.num_histograms, FAIL_VALUE, dtype=np.int64)
        noisy_counts = np.zeros(batch.num_histograms, dtype=np.int64)
        noisy = batch.counts + self._noise.sample(source, batch.counts.size)
        released = noisy >= self.error_bound + 1
        sample, tokens, noisy = batch.sample[released], batch.tokens[released], noisy[released]
        if sample.size:  # entries stay sorted by histogram
            first = np.flatnonzero(np.append(True, sample[1:] != sample[:-1]))
            hists = sample[first]
            best = np.maximum.reduceat(noisy, first)
            top = noisy == np.repeat(best, np.diff(np.append(first, sample.size)))
            top_index = np.flatnonzero(top)
            ties = np.bincount(sample[top], minlength=batch.num_histograms)[hists]
            pick = np.zeros(hists.size, dtype=np.int64)
            several = ties > 1
            pick[several] = uniform_below(ties[several], source)
            chosen = top_index[np.searchsorted(sample[top_index], hists) + pick]
            values[hists] = tokens[chosen]
            noisy_counts[hists] = best
        return values, noisy_counts

    def _run_batch(self, batch, source) -> BatchRelease:
        """Run on every histogram of a batch (see :meth:`sample_batch`)."""
        values, _ = self.sample_batch(batch, source)
        return BatchRelease(values, self.event)


# --- LArgMax_L / DPArgMax ---------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class DPArgMax(_CountNoise):
    """``DPArgMax_(epsilon, delta)``: ``LArgMax_L`` (paper Algorithm 2, ``distagg:alg``) on top of
    truncated-geometric ``NoisyArgMax_L`` (paper Corollary ``DPArgMax``).

    ``(epsilon, delta)`` is the total guarantee under ``relation`` (default replace-one: one teacher's vote
    moves, ``n`` fixed, paper Observation 1; or add-remove-one: a teacher joins or leaves, ``n`` changes).
    Under both, the majority token's count is noised at the whole budget: ``TG(epsilon, L)`` with
    ``L = truncation(epsilon, delta)`` (14 for ``(1, 1e-6)``), because the release reads one count.

    Privacy, exactly.  Let ``need(c, n) = L + 1 + floor((n - 2c) / 2)``, the least noise with
    ``c + x > n/2 + L``; the output is the majority token ``j*`` with probability ``P[X >= need]`` and fail
    otherwise (``P = 0`` when ``c <= n/2``).  For ``X ~ TG(eps, L)`` the pair ``Bernoulli(P[X >= x])`` /
    ``Bernoulli(P[X >= x + 1])`` is ``(eps, delta_eff)``-indistinguishable (the survival functions differ by a
    factor ``e^eps`` except for the mass ``A e^{-eps L} = delta_eff`` at ``x = L``), and so is the joint
    ``(j*, c + X)`` against ``(j*, c + 1 + X)`` (a thresholded truncated-geometric count).  A neighbour:

    * replace-one, the majority token keeps the majority: its count moves by at most one, ``n`` is fixed, so
      ``need`` moves by at most one;
    * replace-one with ``n`` odd, a bare majority swaps (``(n+1)/2`` and ``(n-1)/2`` trade places between
      tokens ``a`` and ``b``): each side releases its own token with probability ``P[X >= L] = delta_eff``
      and fails otherwise, so the divergence is ``delta_eff`` (outputs, counts included, are disjoint);
    * a token gains or loses the majority: its ``need`` moves by one to or from ``L + 1`` (probability 0);
    * add-remove-one: ``c`` moves by one with ``n`` (same token) or ``n`` alone moves; ``floor((n - 2c)/2)``
      moves by at most one.

    So the token is ``(epsilon, delta_eff(epsilon, L))``-DP under either relation, ``delta_eff <= delta``;
    with its noisy count too under replace-one.  ``tests/test_noisy_argmax.py`` and
    ``tests/test_mechanism_contract.py`` check this by exact enumeration over every neighbouring pair of
    small histograms, both parities of ``n``.

    Release the noisy maximiser ``j`` iff its noisy count ``c~_j > n/2 + L``, else fail, where
    ``n = num_teachers`` (tail votes included).  A release implies ``c_j > n/2`` (so ``j`` is the true
    maximiser) and ``c_j > n/2 + 2L`` guarantees one.  (At ``c_j = n/2 + 2L`` exactly the yield probability
    is ``1 - delta_eff``, not 1: ``c~_j`` can equal ``n/2 + L``.)

    Exact binary simplification.  Since ``c~_i <= c_i + L``, a noisy count above ``n/2 + L`` needs
    ``c_i > n/2``, which at most one token ``j*`` has.  So the output is ``j*`` or fail, and it is ``j*``
    exactly when ``c_{j*} + X_{j*} > n/2 + L``: in that event ``j*`` is released (``c~ >= L + 1``) and beats
    every other key strictly (``c~_i <= c_i + L < n/2 + L``), so neither the other keys' noise nor the
    tie-break can change the outcome, and the released noisy count is ``c_{j*} + X_{j*}``.  Sampling only
    ``X_{j*} ~ TG(eps_c, L)`` therefore gives exactly the output distribution of the full NoisyArgMax
    followed by the threshold, jointly with the noisy count:
    ``P[yield] = P[c_{j*} + X > n/2 + L]``, a ``TG`` survival function.

    The release carries ``info = {"noisy_count": c~_j}`` under replace-one.  Under add-remove-one the vote
    total ``n`` itself changes with the neighbour, which moves the threshold ``n/2 + L`` by a half: the token
    alone stays ``(epsilon, delta)``-DP (the threshold in count units moves by at most one), but the pair
    (token, noisy count) would not be, so the count is withheld there (see ``docs/mechanisms/noisy_argmax.md``).

    Diversity preservation (paper Lemma ``distalghigh``): with ``L < n/30`` the coordinated ensemble sampler
    with this aggregator is diversity preserving with ``tau = 0.6 n``, ``beta = 0.5 * 0.6 * ln(18/17)``,
    ``gamma = 2``.
    """

    def _per_count(self) -> tuple[float, float]:
        """The whole budget per count, under either relation (class docstring)."""
        return self.epsilon, self.delta

    @property
    def effective_delta(self) -> float:
        """The delta actually spent, ``delta_eff(epsilon, L) = A e^{-epsilon L}`` (one count), never above
        ``delta``."""
        return delta_effective(self.per_count_epsilon, self.error_bound)

    @property
    def noisy_argmax(self) -> TruncatedGeometricNoisyArgMax:
        """The full ``NoisyArgMax_L`` with the same per-count noise ``TG(epsilon, L)`` (as an add-remove-one
        mechanism: it releases every count, so under replace-one it would need half the budget per count)."""
        return TruncatedGeometricNoisyArgMax(self.epsilon, self.delta, relation=ADD_REMOVE_ONE)

    def _noise_needed(self, top_count, num_teachers):
        """The least noise ``x`` with ``c + x > n/2 + L``: ``L + 1 + floor((n - 2c) / 2)``."""
        top_count = np.asarray(top_count, dtype=np.int64)
        return self.error_bound + 1 + (num_teachers - 2 * top_count) // 2

    def yield_probability(self, top_count, num_teachers: int):
        """``P[c + X > n/2 + L]`` for the top count ``c`` (an array or a scalar): the exact probability that
        a histogram whose largest count is ``c`` releases its maximiser (needed by the boundary
        wrapper).  Zero whenever ``c <= n/2``."""
        probability = self._table.ge(self._noise_needed(top_count, num_teachers))
        return float(probability) if np.ndim(probability) == 0 else probability

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact law of the released token: ``{j*: P[yield], fail: 1 - P[yield]}``."""
        hist = as_histogram(histogram, num_teachers)
        if hist.tokens.size == 0:
            return OutcomeDistribution(np.zeros(0, np.int64), np.zeros(0), 1.0)
        token, count = hist.top(1)[0]
        needed = self._noise_needed(count, hist.num_teachers)
        probability = float(self._table.ge(needed))
        fail = float(self._table.le(needed - 1))  # from the other tail: full precision near 1
        if probability <= 0:
            return OutcomeDistribution(np.zeros(0, np.int64), np.zeros(0), 1.0)
        return OutcomeDistribution(np.array([token], dtype=np.int64), np.array([probability]), fail)

    def _run(self, hist, source) -> Release:
        """One run (``mechanism(histogram, rng=None)``): draw the top token's noise only (exact, see the class
        docstring): one ``TG`` value from the integer sampler."""
        if hist.tokens.size == 0:
            return Release(None, self.event)
        token, count = hist.top(1)[0]
        noisy = count + int(self._noise.sample(source))
        if 2 * noisy <= hist.num_teachers + 2 * self.error_bound:
            return Release(None, self.event)
        info = {"noisy_count": noisy} if self.relation == REPLACE_ONE else {}
        return Release(int(token), self.event, info=info)

    def batch_fail(self, batch) -> np.ndarray:
        """Vectorised fail of :meth:`output_distribution`, from the other tail of the noise (full precision
        when a token is nearly certain); 1 for a histogram with no token."""
        batch = as_batch(batch)
        top_count, top_token = batch.top()
        fail = np.asarray(self._table.le(self._noise_needed(top_count, batch.num_teachers) - 1), dtype=np.float64)
        return np.where(top_token >= 0, fail, 1.0)

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised :meth:`output_distribution`: ``(histogram, token, probability)`` for every histogram
        that can yield, sorted by histogram (the rest of each histogram's mass is fail)."""
        batch = as_batch(batch)
        top_count, top_token = batch.top()
        probability = self._table.ge(self._noise_needed(top_count, batch.num_teachers))
        keep = np.flatnonzero((probability > 0) & (top_token >= 0))
        return keep.astype(np.int64), top_token[keep], probability[keep]

    def sample_batch(self, batch, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One run per histogram, vectorised: ``(values, noisy_counts)`` (``FAIL_VALUE`` and 0 for fail);
        one exact ``TG`` draw per histogram (one 64-bit word, exact inverse distribution function), for its
        top count."""
        source = random_bits(rng)
        batch = as_batch(batch)
        top_count, top_token = batch.top()
        noisy = top_count + self._noise.sample(source, batch.num_histograms)
        yields = (2 * noisy > batch.num_teachers + 2 * self.error_bound) & (top_token >= 0)
        values = np.where(yields, top_token, FAIL_VALUE).astype(np.int64)
        return values, np.where(yields, noisy, 0).astype(np.int64)

    def _run_batch(self, batch, source) -> BatchRelease:
        """Run on every histogram of a batch (one ``TG`` draw per histogram)."""
        values, _ = self.sample_batch(batch, source)
        return BatchRelease(values, self.event)
