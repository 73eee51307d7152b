"""Shared pieces of the mechanism contract: exact output laws, batch releases, and exact sampling from a
finite law."""

from __future__ import annotations

import bisect

import attr
import numpy as np

from mechanisms.randomness import RandomBits, random_bits


@attr.s(frozen=True, slots=True, eq=False)
class OutcomeDistribution:
    """The exact output distribution of a mechanism on one histogram.

    ``tokens[k]`` is released with probability ``probabilities[k]``; ``fail`` is the probability of the
    fail outcome.  Tokens not listed have probability zero.
    """

    tokens: np.ndarray = attr.ib()
    probabilities: np.ndarray = attr.ib()
    fail: float = attr.ib(converter=float)

    def probability(self, token) -> float:
        """Probability of ``token`` (``None`` for the fail outcome)."""
        if token is None:
            return self.fail
        hit = np.flatnonzero(self.tokens == token)
        return float(self.probabilities[hit[0]]) if hit.size else 0.0

    def as_dict(self) -> dict:
        out = {int(t): float(p) for t, p in zip(self.tokens, self.probabilities) if p > 0}
        out[None] = self.fail
        return out

    @property
    def max_probability(self) -> float:
        """The probability of the most likely outcome (fail included)."""
        return float(max(self.fail, self.probabilities.max() if self.probabilities.size else 0.0))

    def sample(self, rng: np.random.Generator | RandomBits | None = None):
        """Draw one outcome exactly: a token id, or ``None`` for fail.

        The law drawn from is the listed one, normalised exactly: the float probabilities and ``fail`` are
        read as the exact rationals they store, and outcome ``k`` comes out with probability exactly
        ``w_k / sum(w)`` (``mechanisms.randomness.RandomBits.categorical``: one uniform integer below the
        common-denominator total, no float rounding).  A certain outcome is returned without drawing, and
        a law with no mass at all is fail.  ``rng``: ``None`` for the operating system's cryptographic
        randomness, a ``numpy.random.Generator`` for reproducible draws (tests only), or a ``RandomBits``.
        """
        source = random_bits(rng)
        if self.fail >= 1.0 or self.tokens.size == 0:
            return None
        if self.tokens.size == 1 and self.probabilities[0] >= 1.0:
            return int(self.tokens[0])
        weights = [float(p) for p in np.asarray(self.probabilities, dtype=np.float64)] + [max(float(self.fail), 0.0)]
        bad = [i for i, w in enumerate(weights) if not (w >= 0.0 and w < float("inf"))]
        if bad:
            name = "fail" if bad[0] == len(weights) - 1 else f"probabilities[{bad[0]}]"
            raise ValueError(f"{name} must be a finite probability >= 0, got {weights[bad[0]]}")
        if not any(weights):
            return None
        k = source.categorical(weights)
        return int(self.tokens[k]) if k < self.tokens.size else None


#: The value a batch release uses for the fail outcome.
FAIL_VALUE = -1


@attr.s(frozen=True, slots=True, eq=False)
class BatchRelease:
    """What a mechanism releases on each histogram of a batch: ``values[i]`` is the token released on
    histogram ``i`` (``FAIL_VALUE`` for fail), ``target_hit[i]`` whether a target outcome occurred
    (``None`` for mechanisms without a target).  Each histogram is charged ``event`` once."""

    values: np.ndarray = attr.ib()
    event = attr.ib()
    target_hit: np.ndarray | None = attr.ib(default=None)

    def __len__(self) -> int:
        return int(self.values.size)

    @property
    def failed(self) -> np.ndarray:
        return self.values == FAIL_VALUE


def sample_batch_outcomes(
    sample: np.ndarray, tokens: np.ndarray, probabilities: np.ndarray, num_histograms: int, rng=None
) -> np.ndarray:
    """Draw one outcome per histogram from per-histogram token probabilities (the rest is fail), exactly.

    ``sample``/``tokens``/``probabilities`` list the positive-probability tokens of each histogram,
    sorted by histogram.  Histogram ``h`` releases its ``i``-th token when ``C_{i-1} <= U < C_i`` for the
    exact running sums ``C_i`` of its (float) probabilities, and fails when ``U >= C_last``; ``U`` is
    uniform.  Fast path: the first 64 bits of ``U`` (one word per histogram) are compared with float64
    running sums taken within each histogram (never across histograms); that comparison is certain
    whenever the word is further than ``(width + 3) 2^-52`` from every running sum (a bound on the float
    error of a sum of ``width`` probabilities), and otherwise (probability about ``width^2 2^-51``) the
    histogram is decided exactly: the running sums as integers over their common power-of-two
    denominator ``2^E``, compared with ``floor(2^E U)`` (more bits of ``U`` drawn when ``E > 64``).
    ``rng``: ``None`` (the operating system's cryptographic randomness), a ``numpy.random.Generator``
    (reproducible) or a ``RandomBits``.  Returns token ids, ``FAIL_VALUE`` for fail.
    """
    source = random_bits(rng)
    words = source.words(num_histograms)
    out = np.full(num_histograms, FAIL_VALUE, dtype=np.int64)
    if sample.size == 0:
        return out
    uniforms = words.astype(np.float64) * 2.0**-64  # within 2^-53 of the word's value
    starts = np.searchsorted(sample, np.arange(num_histograms + 1))
    sizes = np.diff(starts)
    position = np.arange(sample.size) - starts[sample]
    width = int(sizes.max())
    margin = (width + 3) * 2.0**-52
    rows_per_chunk = max(1, (1 << 20) // width)
    for h0 in range(0, num_histograms, rows_per_chunk):
        h1 = min(num_histograms, h0 + rows_per_chunk)
        e0, e1 = starts[h0], starts[h1]
        table = np.zeros((h1 - h0, width))
        table[sample[e0:e1] - h0, position[e0:e1]] = probabilities[e0:e1]
        running = np.cumsum(table, axis=1)
        index = (running <= uniforms[h0:h1, None]).sum(axis=1)
        close = (np.abs(running - uniforms[h0:h1, None]) <= margin).any(axis=1)
        hit = index < sizes[h0:h1]
        rows = np.flatnonzero(hit)
        out[h0 + rows] = tokens[starts[h0 + rows] + index[rows]]
        for row in np.flatnonzero(close):
            h = h0 + row
            k = _exact_index(probabilities[starts[h] : starts[h + 1]], int(words[h]), source)
            out[h] = tokens[starts[h] + k] if k < sizes[h] else FAIL_VALUE
    return out


def _exact_index(probabilities: np.ndarray, word: int, source: RandomBits) -> int:
    """The least ``i`` with ``U < C_i`` (exact running sums of ``probabilities``), for a uniform ``U`` whose
    first 64 bits are ``word``; ``len(probabilities)`` when ``U`` is beyond them all (fail)."""
    ratios = [float(p).as_integer_ratio() for p in probabilities]
    scale_bits = max(den.bit_length() - 1 for _, den in ratios)  # every denominator is a power of two
    running, total = [], 0
    for num, den in ratios:
        total += num << (scale_bits - (den.bit_length() - 1))
        running.append(total)
    if scale_bits <= 64:
        scaled = word >> (64 - scale_bits)
    else:
        scaled = (word << (scale_bits - 64)) | source.bits(scale_bits - 64)
    return bisect.bisect_right(running, scaled)
