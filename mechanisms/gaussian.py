"""Gaussian NoisyArgMax (GNMax) with exact discrete Gaussian noise, and its thresholded form.

Papernot, Song, Mironov, Raghunathan, Talwar and Erlingsson, "Scalable Private Learning with PATE" (ICLR
2018), Section 4.1: the GNMax aggregator adds Gaussian noise ``N(0, sigma^2)`` to every vote count and
releases the argmax.  Here the counts are integers, so the noise is the discrete Gaussian of Canonne, Kamath
and Steinke ("The Discrete Gaussian for Differential Privacy", NeurIPS 2020), truncated to
``{-T, ..., T}`` with ``T = ceil(11.6 sigma)`` (the truncation dp-accounting uses by default: the mass cut
off is below ``1e-30``).  The mechanism and its accounting are about that truncated law exactly.

* :class:`GaussianNoisyArgMax`: ``c~_j = c_j + X_j`` for **every** token ``j`` of the vocabulary (the
  tokens without a vote included), ``X_j`` independent; the release is ``argmax_j c~_j`` (ties broken
  uniformly at random).  It never fails.
* :class:`GaussianThresholdArgMax`: the same single noise draw; the argmax is released only when its noisy
  count is at least ``threshold``, else the run fails (``None``), so a run's fallback works as for
  ``DPArgMax``.  This is *not* the two-draw Confident-GNMax of Papernot et al. 2018 (Section 4.2, which
  checks the threshold with a second, independent noise draw): one draw, one charge.

Privacy (docs/mechanisms/gaussian.md).  Both releases are post-processing of the noisy histogram
``(c~_j)_{j < V}``.  One teacher moves one vote (replace-one): two counts change by ``+1`` and ``-1`` (one, if
the vote moves to or from the tail); a teacher joins or leaves (add-remove-one): one count changes by one.
The noisy histogram is a product of independent coordinates, so the privacy loss of a neighbouring pair is
the sum of the losses of the changed coordinates, each the loss of the one-dimensional truncated discrete
Gaussian mechanism of sensitivity one (a shift by ``-1`` is the mirror of a shift by ``+1``; the law is
symmetric).  The event :class:`~pate_accountant.events.DiscreteGaussianArgMaxEvent` says so, and the PLD
accountant charges that composition from dp-accounting's ``from_discrete_gaussian_mechanism``; its stated
``(epsilon, delta)`` (what other accountants charge) is read off the same curve, pessimistically.

Sampling (:func:`mechanisms.randomness.discrete_gaussian_law`): the truncated law is finite, so each noise
value is one exact inverse-CDF draw (one 64-bit word compared with exact thresholds, deeper bits only on a
tie of probability ``2^-64``), vectorised over the whole vocabulary: a 128,000-token vocabulary costs a few
milliseconds (docs/performance.md).  Ties at the maximum are broken by an exact uniform integer.  Bits come
from the operating system's CSPRNG when ``rng`` is ``None``.

Exact law (:meth:`output_distribution`), for any vocabulary size: tokens with equal counts have equal win
probabilities, so the law is computed over the distinct counts with their multiplicities
(:func:`count_groups`; the zero-vote tokens form one group, and ``n`` teachers leave at most about
``sqrt(2 n) + 1`` groups).  A key of count ``c`` wins at value ``v`` with probability
``b_c(v) int_0^1 prod_{other keys h} (a_h(v) + b_h(v) x) dx`` (``a_h = P[c_h + X <= v - 1]``,
``b_h = P[c_h + X = v]``; the integral is the uniform tie-break), and ``v`` runs over the ``2 T + 1`` values
the top key's noisy count can take.  The integral is a polynomial of degree ``V - 1``, done by Gauss-Legendre
quadrature: with enough nodes to be exact, or with fewer where a proven bound (the tie count's tail,
:meth:`~GaussianNoisyArgMax._node_counts`) keeps the total error of the law below :data:`LAW_TOLERANCE`.
Only many near-certain ties need many nodes (below ``sigma = 1``, the zero-vote tokens of a large vocabulary
tie at the same value): there the rule takes up to ``V / 2`` nodes, seconds for ``10^5`` tokens, and float64
nodes near 1 limit the law to about ``V x 1e-16`` relative.  Elsewhere a 128,000-token law takes milliseconds.
"""

from __future__ import annotations

import math

import attr
import numpy as np

from mechanisms.base import (
    FAIL_VALUE,
    BatchRelease,
    Mechanism,
    OutcomeDistribution,
    gauss_legendre_unit,
)
from mechanisms.histogram import as_histogram
from mechanisms.randomness import discrete_gaussian_law, uniform_below
from pate_accountant.accountants.event_checks import discrete_gaussian_delta
from pate_accountant.bisection import switch_point
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    DiscreteGaussianArgMaxEvent,
    histogram_shifts,
)
from pate_accountant.release import Release
from pate_accountant.validation import check_delta, check_epsilon

__all__ = ["LAW_TOLERANCE", "MIN_GAUSSIAN_DELTA", "GaussianNoisyArgMax", "GaussianThresholdArgMax",
           "calibrate_sigma", "count_groups", "gaussian_delta"]

#: Truncation of the noise in units of sigma (dp-accounting's default; the mass beyond is below 1e-30).
TRUNCATION_SIGMAS = 11.6
#: The smallest step delta a GNMax step can be calibrated for.  dp-accounting's pessimistic curve of the
#: truncated discrete Gaussian does not go below about 5e-16 at any sigma (its cut tails, the edge's infinite
#: loss and float sums: ``gaussian_delta(50, 1.0)`` is 4.9e-16), so a smaller delta cannot be certified
#: (docs/ranges.md, docs/mechanisms/gaussian.md).
MIN_GAUSSIAN_DELTA = 1e-14
#: The range of sigma (docs/ranges.md): below, delta is near 1 at any useful epsilon; above, the noise
#: table (2 T + 1 thresholds) and dp-accounting's PLD grow past a few megabytes.
MIN_SIGMA, MAX_SIGMA = 0.1, 1e4
#: The largest total error (summed over the tokens) the exact law's tie integrals may leave, when fewer
#: quadrature nodes than the exact count are proven enough (:meth:`GaussianNoisyArgMax._node_counts`).
LAW_TOLERANCE = 1e-17
#: Largest ``values x groups x nodes`` array the exact law builds at once.
_LAW_CHUNK = 1 << 22
#: Noise values drawn per chunk of a batch run.
_CHUNK = 1 << 21


# --- validation -----------------------------------------------------------------------------------
def _sigma(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"sigma must be a real number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and MIN_SIGMA <= value <= MAX_SIGMA):
        raise ValueError(f"sigma must be in [{MIN_SIGMA}, {MAX_SIGMA}], got {value!r}")
    return value


def _relation(value) -> str:
    if not isinstance(value, str) or value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")
    return value


def _vocab_size(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"vocab_size must be an integer or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"vocab_size must be >= 1, got {value!r}")
    return int(value)


def _threshold(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"threshold must be an integer, got {type(value).__name__}")
    return int(value)


def truncation_bound(sigma: float) -> int:
    """``T = ceil(11.6 sigma)``: the noise lives on ``{-T, ..., T}``."""
    return max(1, math.ceil(TRUNCATION_SIGMAS * sigma))


# --- accounting -------------------------------------------------------------------------------------
def gaussian_delta(sigma: float, epsilon: float, relation: str = REPLACE_ONE) -> float:
    """The delta at ``epsilon`` of one run with noise ``sigma`` under ``relation``: dp-accounting's
    pessimistic PLD of ``shifts`` (2 under replace-one, 1 under add-remove-one) truncated discrete Gaussian
    mechanisms of sensitivity one (an upper bound on the true hockey-stick divergence), from the accounting
    layer's one home of the curve (:func:`pate_accountant.accountants.event_checks.discrete_gaussian_delta`),
    which every accountant checks this mechanism's events against."""
    shifts = histogram_shifts(_relation(relation))
    sigma = _sigma(sigma)
    return discrete_gaussian_delta(sigma, truncation_bound(sigma), shifts, float(epsilon))


def calibrate_sigma(epsilon: float, delta: float, relation: str = REPLACE_ONE) -> float:
    """The smallest sigma (to a relative ``1e-3``, rounded up) with ``gaussian_delta(sigma, epsilon) <= delta``,
    by bisection on dp-accounting's curve (:func:`pate_accountant.bisection.switch_point`)."""
    epsilon, delta = check_epsilon("epsilon", epsilon), check_delta("delta", delta)
    if delta < MIN_GAUSSIAN_DELTA:
        raise ValueError(f"delta must be at least {MIN_GAUSSIAN_DELTA:g} for a GNMax step (dp-accounting's curve "
                         f"of its noise certifies no delta below about 5e-16 at any sigma), got {delta!r}")
    relation = _relation(relation)
    shifts = histogram_shifts(relation)
    guess = math.sqrt(2 * math.log(1.25 / delta) * shifts) / epsilon

    def passes(sigma: float) -> bool:
        return MIN_SIGMA <= sigma and gaussian_delta(min(sigma, MAX_SIGMA), epsilon, relation) <= delta

    lower = min(MIN_SIGMA, guess / 2)
    _, upper = switch_point(passes, lower, max(guess, 2 * lower), rel_tol=1e-3, limit=MAX_SIGMA)
    if not math.isfinite(upper) or upper > MAX_SIGMA:
        raise ValueError(f"epsilon {epsilon!r}, delta {delta!r}: no sigma up to {MAX_SIGMA} is private enough")
    return max(MIN_SIGMA, upper)


# --- the mechanisms ---------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True)
class GaussianNoisyArgMax(Mechanism):
    """GNMax (Papernot et al. 2018, Section 4.1) with exact truncated discrete Gaussian noise (Canonne,
    Kamath and Steinke 2020) on every count of a vocabulary of ``vocab_size`` tokens.

    ``GaussianNoisyArgMax(sigma, vocab_size=None, relation="replace-one", epsilon=1.0)``: ``vocab_size``
    ``None`` takes the vocabulary from each histogram (it must state one; the vocabulary is the model's,
    not the data's); ``epsilon`` is the level at which the event states its ``(epsilon, delta)`` for the
    accountants that need one number (:func:`gaussian_delta`).  :meth:`calibrated` builds it from a per-step
    ``(epsilon, delta)``.
    """

    sigma: float = attr.ib(converter=_sigma)
    vocab_size: int | None = attr.ib(default=None, kw_only=True, converter=_vocab_size)
    relation: str = attr.ib(default=REPLACE_ONE, kw_only=True, converter=_relation)
    epsilon: float = attr.ib(default=1.0, kw_only=True, converter=lambda v: check_epsilon("epsilon", v))
    _law = attr.ib(init=False, repr=False, eq=False)
    _event = attr.ib(init=False, repr=False, eq=False)

    def __attrs_post_init__(self):
        bound = truncation_bound(self.sigma)
        delta = gaussian_delta(self.sigma, self.epsilon, self.relation)
        if not delta < 1.0:
            raise ValueError(f"sigma {self.sigma!r} gives delta 1 at epsilon {self.epsilon!r}: choose more noise")
        event = DiscreteGaussianArgMaxEvent(self.epsilon, delta, self.relation, sigma=self.sigma,
                                            truncation_bound=bound)
        object.__setattr__(self, "_law", discrete_gaussian_law(self.sigma, bound))
        object.__setattr__(self, "_event", event)

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, relation: str = REPLACE_ONE, **kwargs):
        """The instance whose one run is ``(epsilon, delta')``-DP under ``relation`` with ``delta' <= delta``."""
        return cls(calibrate_sigma(epsilon, delta, relation), relation=relation, epsilon=epsilon, **kwargs)

    @property
    def truncation_bound(self) -> int:
        return self._event.truncation_bound

    @property
    def delta(self) -> float:
        return self._event.delta

    @property
    def event(self) -> DiscreteGaussianArgMaxEvent:
        return self._event

    @property
    def _threshold(self):
        return None

    # -- running ------------------------------------------------------------------------------------------
    def _vocab(self, vocab_size, tokens) -> int:
        size = self.vocab_size if self.vocab_size is not None else vocab_size
        if size is None:
            raise ValueError(
                "vocab_size must be given to the mechanism or the histogram (GNMax noises every token), and neither has it")
        if tokens.size and int(tokens.max()) >= size:
            raise ValueError(f"token id {int(tokens.max())} is outside the vocabulary of size {size}")
        return size

    def _run(self, hist, source) -> Release:
        size = self._vocab(hist.vocab_size, hist.tokens)
        noisy = self._law.sample(source, size) - self.truncation_bound
        noisy[hist.tokens] += hist.counts
        best = int(noisy.max())
        if self._threshold is not None and best < self._threshold:
            return Release(None, self.event)
        winners = np.flatnonzero(noisy == best)
        winner = winners[source.below(winners.size)] if winners.size > 1 else winners[0]
        return Release(int(winner), self.event)

    def _run_batch(self, batch, source) -> BatchRelease:
        size = self._vocab(None, batch.tokens)
        out = np.full(batch.num_histograms, FAIL_VALUE, dtype=np.int64)
        rows = max(1, _CHUNK // size)
        for h0 in range(0, batch.num_histograms, rows):
            h1 = min(batch.num_histograms, h0 + rows)
            noisy = (self._law.sample(source, (h1 - h0) * size) - self.truncation_bound).reshape(h1 - h0, size)
            lo, hi = batch.starts[h0], batch.starts[h1]
            noisy[batch.sample[lo:hi] - h0, batch.tokens[lo:hi]] += batch.counts[lo:hi]
            best = noisy.max(axis=1)
            tied = noisy == best[:, None]
            num_tied = tied.sum(axis=1)
            pick = np.zeros(h1 - h0, dtype=np.int64)
            many = np.flatnonzero(num_tied > 1)
            if many.size:
                pick[many] = uniform_below(num_tied[many], source)
            # the (pick + 1)-th tied position of each row
            winner = np.argmax(np.cumsum(tied, axis=1) > pick[:, None], axis=1)
            released = np.ones(h1 - h0, dtype=bool) if self._threshold is None else best >= self._threshold
            out[h0:h1] = np.where(released, winner, FAIL_VALUE)
        return BatchRelease(out, self.event)

    # -- the exact law ------------------------------------------------------------------------------------
    def _factors(self, noise):
        """``(P[X = x], P[X <= x - 1], P[X >= x + 1])`` for an integer array ``x`` (outside ``-T..T`` the noise has
        no mass); each term is read from the tail where it is small, so none loses relative precision."""
        bound = self.truncation_bound
        pmf, le = noise_tables(self.sigma**2, bound)
        inside = (noise >= -bound) & (noise <= bound)
        return np.where(inside, pmf[np.clip(noise + bound, 0, 2 * bound)], 0.0), le(noise - 1), le(-noise - 1)

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact law of one run: the probability that each token of the vocabulary is the (released) argmax,
        and the fail probability (0 without a threshold).  Float64, for any vocabulary: the work grows with the
        number of distinct counts and the noise's range, not with the vocabulary size (module docstring)."""
        hist = as_histogram(histogram, num_teachers)
        size = self._vocab(hist.vocab_size, hist.tokens)
        groups, multiplicity = count_groups(hist.counts, size)
        bound = self.truncation_bound
        top = int(groups[-1])
        low = top - bound if self._threshold is None else max(top - bound, self._threshold)
        values = np.arange(low, top + bound + 1)
        fail = 0.0
        if self._threshold is not None:  # every noisy count below the threshold: P[c + X <= t - 1] for each key
            b, below, above = self._factors(self._threshold - groups)
            fail = float(np.exp((_log_probability(below, b + above) * multiplicity).sum()))
        win = np.zeros(groups.size)
        if values.size:
            exact = (int(multiplicity.sum()) - 1) // 2 + 1
            nodes = self._node_counts(values, groups, multiplicity)
            for first, last, num_nodes in _blocks(nodes, groups.size, exact):
                win += self._win_block(values[first:last], groups, multiplicity, num_nodes)
        probs = np.full(size, win[0] if groups[0] == 0 else 0.0)  # the zero-vote tokens, if any
        probs[hist.tokens] = win[np.searchsorted(groups, hist.counts)]
        return OutcomeDistribution(np.arange(size), probs, fail)

    def noise_release_probability(self, num_teachers: int, vocab_size: int) -> float:
        """The exact probability that one run releases a token the noise chose, not the teachers (charged as
        private all the same), at the step where the mechanism's rule should give the teachers' token or nothing:
        from :meth:`output_distribution` of one histogram of ``num_teachers`` votes over ``vocab_size`` tokens
        (the model's vocabulary, or a public top-k support).

        * With a threshold: no token has a majority, every teacher voting a token of its own (as evenly as the
          tokens allow when there are fewer tokens than teachers).  No count reaches the threshold, so every
          release there is the noise's: the probability is one less the fail probability.
        * Without a threshold (plain GNMax releases at every step): one token holds a bare majority
          ``n // 2 + 1`` (the weakest vote the threshold form releases) and every other teacher votes a token of
          its own; the probability is that another token outscores the majority.

        Data-independent: ``n`` and the vocabulary are public settings (docs/generation.md, "Noise that
        decides")."""
        if isinstance(num_teachers, bool) or not isinstance(num_teachers, (int, np.integer)) or num_teachers < 1:
            raise ValueError(f"num_teachers must be a positive integer, got {num_teachers!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an integer of at least 2, got {vocab_size!r}")
        counts = noise_check_histogram(int(num_teachers), int(vocab_size), self._threshold is None)
        law = self.output_distribution(counts, num_teachers=int(num_teachers))
        if self._threshold is not None:
            return float(1.0 - law.fail)
        return float(1.0 - law.probabilities[0])

    def _node_counts(self, values, groups, multiplicity) -> np.ndarray:
        """How many Gauss-Legendre nodes the tie integral at each value ``v`` takes: exact (``floor(D/2) + 1``
        for the polynomial's degree ``D``, one less than the number of keys), or fewer with a proven bound on
        what they leave out.

        Write ``F = prod_h (a_h + b_h)`` over every key (the probability that no noisy count exceeds ``v``),
        ``p_h = b_h / (a_h + b_h)`` and ``lam = sum_h p_h``.  For a key ``j`` of count ``c``,
        ``prod_{h != j} (a_h + b_h x) = (F / (a_c + b_c)) sum_t P[K_j = t] x^t`` with ``K_j`` the number of the
        others that tie at ``v``, a sum of independent Bernoulli(``p_h``) variables.  A ``Q``-node rule
        integrates ``x^t`` exactly for ``t < 2Q`` and gives a value in ``[0, 1]`` for the others (positive
        weights summing to 1), as the exact ``1 / (t + 1)`` is, so key ``j`` (weight ``b_c``) is off by at most
        ``p_c F P[K_j >= 2Q] <= p_c F lam^{2Q} / (2Q)!`` (``P[K >= t]`` is at most the ``t``-th elementary
        symmetric sum of the ``p_h``, at most ``lam^t / t!``).  Summed over the keys the law at ``v`` is off by
        at most ``lam F lam^{2Q} / (2Q)!``; ``Q`` is the smallest that brings this below :data:`LAW_TOLERANCE`
        divided by the number of values, so the whole law (summed over tokens and fail) is off by less than
        :data:`LAW_TOLERANCE`, besides float64 rounding.
        """
        from scipy.special import gammaln

        b, a, above = self._factors(values[:, None] - groups[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            log_f = (_log_probability(a + b, above) * multiplicity).sum(axis=1)  # log P[every key <= v]
            share = np.where(a + b > 0, b / (a + b), 0.0)
        lam = (share * multiplicity).sum(axis=1)
        degree = int(multiplicity.sum()) - 1
        exact = degree // 2 + 1
        target = math.log(LAW_TOLERANCE / values.size)
        live = np.isfinite(log_f) & (lam > 0)  # else no key reaches v, or none can tie: one node is exact
        log_lam = np.log(np.where(live, lam, 1.0))
        base = np.where(live, log_f + log_lam, -np.inf)

        def small(t):  # the bound on the error left by integrating x^t and above, against the target
            return base + log_lam * t - gammaln(t + 1.0) <= target

        # t -> lam^t / t! grows up to t = lam and falls after: bisect for the first small t in [ceil(lam), D + 1].
        first = np.ones(values.size)
        lo, hi = np.maximum(1.0, np.ceil(lam)), np.full(values.size, degree + 1.0)
        search = ~small(first) & small(hi)
        for _ in range(64):
            if not (search & (lo < hi)).any():
                break
            mid = np.floor((lo + hi) / 2)
            ok = small(mid)
            hi, lo = np.where(search & ok, mid, hi), np.where(search & ~ok, mid + 1, lo)
        terms = np.where(small(first), 1.0, np.where(search, lo, degree + 1.0))
        return np.minimum(exact, np.ceil(terms / 2)).astype(np.int64)

    def _win_block(self, values, groups, multiplicity, num_nodes: int) -> np.ndarray:
        """For each group, the probability that one given key of it wins at one of ``values`` (summed)."""
        b, a, above = self._factors(values[:, None] - groups[None, :])
        nodes, weights = gauss_legendre_unit(num_nodes)
        b3 = b[:, :, None]
        # log(a + b x), from whichever side keeps its relative precision (a + b + above = 1)
        log_factor = _log_probability(a[:, :, None] + b3 * nodes, above[:, :, None] + b3 * (1.0 - nodes))
        total = (log_factor * multiplicity[None, :, None]).sum(axis=1)  # (values, nodes)
        with np.errstate(invalid="ignore"):
            # One key of group g wins at v; the others (its group less one, every other group) are below or tie.
            # Where a_g + b_g x = 0, b_g = 0 and the key cannot win at v: the term is 0.
            rest = np.exp(total[:, None, :] - log_factor) @ weights  # (values, groups)
            return np.where(b > 0, b * np.where(b > 0, rest, 0.0), 0.0).sum(axis=0)


def noise_tables(sigma_squared: float, bound: int):
    """``(pmf, le)`` for the discrete Gaussian ``N_Z(0, sigma_squared)`` restricted to ``-bound..bound``:
    ``pmf[i] = P[X = i - bound]``, and ``le(y) = P[X <= y]`` for an integer array ``y``, read from the lower half
    of the CDF summed from the far tail so that small tails keep their relative precision (the upper half by
    symmetry, ``P[X >= x] = P[X <= -x]``).  Shared by GNMax's exact law and Tang et al.'s
    (:mod:`mechanisms.averaged_distributions`)."""
    x = np.arange(-bound, bound + 1)
    log_w = -(x.astype(np.float64) ** 2) / (2.0 * sigma_squared)
    pmf = np.exp(log_w - np.logaddexp.reduce(log_w))
    low = np.cumsum(pmf[: bound + 1])

    def le(y):  # P[X <= y]: the lower half directly, the upper half as 1 - P[X <= -y - 1]
        lower = np.where(y < -bound, 0.0, low[np.clip(y + bound, 0, bound)])
        upper = np.where(y >= bound, 0.0, low[np.clip(bound - y - 1, 0, bound)])
        return np.where(y <= 0, lower, 1.0 - upper)

    return pmf, le


def noise_check_histogram(num_teachers: int, vocab_size: int, majority: bool) -> np.ndarray:
    """The dense histogram :meth:`GaussianNoisyArgMax.noise_release_probability` judges the noise on: with
    ``majority``, token 0 holds a bare majority ``n // 2 + 1`` of the ``n`` votes; the other votes go one a token
    to the next tokens, as evenly as the vocabulary allows."""
    n, size = int(num_teachers), int(vocab_size)
    counts = np.zeros(size, dtype=np.int64)
    top = n // 2 + 1 if majority else 0
    first = int(top > 0)
    rest, room = n - top, size - first
    if rest:
        used = min(rest, room)
        counts[first:first + used] = rest // used + (np.arange(used) < rest % used)
    counts[0] += top
    return counts


def count_groups(counts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct counts of a histogram over a vocabulary of ``vocab_size`` tokens, ascending, with how many
    tokens have each: the voted tokens' counts (``counts``, all positive) and, when some token has no vote,
    the count 0.  ``n`` teachers give at most about ``sqrt(2 n) + 1`` groups, whatever the vocabulary."""
    groups, multiplicity = np.unique(np.asarray(counts, dtype=np.int64), return_counts=True)
    zeros = vocab_size - int(multiplicity.sum())
    if zeros:
        groups, multiplicity = np.concatenate([[0], groups]), np.concatenate([[zeros], multiplicity])
    return groups.astype(np.int64), multiplicity.astype(np.int64)


def _log_probability(p, complement):
    """``log p`` for probabilities ``p`` given with their complements ``1 - p`` (both computed without
    cancellation): ``log p`` where ``p < 1/2``, else ``log1p(-complement)``, which keeps relative precision when
    ``p`` is near 1 and many such factors are multiplied."""
    with np.errstate(divide="ignore"):
        return np.where(p < 0.5, np.log(np.where(p < 0.5, p, 1.0)), np.log1p(-np.minimum(complement, 0.5)))


def _blocks(nodes: np.ndarray, num_groups: int, exact: int):
    """Contiguous runs ``(first, last, num_nodes)`` of the values, each with the largest node count in it,
    rounded up to a multiple of 16 above 16 (a few cached rules; more nodes stay within the bound) but never
    past ``exact``, and at most ``_LAW_CHUNK`` elements of ``values x groups x nodes`` at once."""

    def rounded(num: int) -> int:
        return min(exact, num if num <= 16 else 16 * -(-num // 16))

    first = 0
    while first < nodes.size:
        last, most = first + 1, int(nodes[first])
        while last < nodes.size:
            wider = max(most, int(nodes[last]))
            if (last + 1 - first) * num_groups * rounded(wider) > _LAW_CHUNK:
                break
            last, most = last + 1, wider
        yield first, last, rounded(most)
        first = last


@attr.s(frozen=True, slots=True)
class GaussianThresholdArgMax(GaussianNoisyArgMax):
    """GNMax released only above a threshold: one noise draw on every count (as :class:`GaussianNoisyArgMax`),
    and the argmax is released only when its noisy count is at least ``threshold``, else the run fails.
    Post-processing of the same noisy histogram, so it is charged exactly as :class:`GaussianNoisyArgMax`
    (one draw; not the two-draw Confident-GNMax of Papernot et al. 2018, Section 4.2).

    ``threshold`` is an absolute vote count: a function of ``n`` would leak ``n`` under add-remove-one."""

    threshold: int = attr.ib(default=1, kw_only=True, converter=_threshold)

    @classmethod
    def for_teachers(cls, epsilon: float, delta: float, num_teachers: int, relation: str = REPLACE_ONE, **kwargs):
        """The calibrated instance for a run of ``num_teachers`` configured teachers, with the threshold a strict
        majority of them, ``floor(n/2) + 1`` noisy votes: coordinated teachers clear it in their bursts of
        agreement, and a weak plurality fails (the run falls back to the public model) instead of releasing a
        token the noise may have picked among tens of thousands.  ``n`` is the run's public setting, fixed here;
        the mechanism never reads it from a histogram."""
        if isinstance(num_teachers, bool) or not isinstance(num_teachers, (int, np.integer)) or num_teachers < 1:
            raise ValueError(f"num_teachers must be a positive integer, got {num_teachers!r}")
        return cls.calibrated(epsilon, delta, relation, threshold=int(num_teachers) // 2 + 1, **kwargs)

    @property
    def _threshold(self):
        return self.threshold
