"""Shared pieces of the mechanism contract (DESIGN.md, Contracts: Mechanism)."""

from __future__ import annotations

import attr
import numpy as np

from pate_accountant.validation import check_generator, resolve_rng


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

    def sample(self, rng: np.random.Generator | None = None):
        """Draw one outcome: a token id, or ``None`` for fail.

        A certain outcome is returned without drawing; otherwise one uniform comes from ``rng``
        (``None``: fresh OS entropy).
        """
        if rng is not None:
            check_generator("rng", rng)
        if self.fail >= 1.0 or self.tokens.size == 0:
            return None
        if self.tokens.size == 1 and self.probabilities[0] >= 1.0:
            return int(self.tokens[0])
        draw = resolve_rng("rng", rng).random()
        k = int(np.searchsorted(np.cumsum(self.probabilities), draw, side="right"))
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
    sample: np.ndarray, tokens: np.ndarray, probabilities: np.ndarray, num_histograms: int, rng: np.random.Generator
) -> np.ndarray:
    """Draw one outcome per histogram from per-histogram token probabilities (the rest is fail).

    ``sample``/``tokens``/``probabilities`` list the positive-probability tokens of each histogram,
    sorted by histogram.  One uniform per histogram, compared with running sums taken within each
    histogram (never across histograms, so no precision is lost); returns token ids, ``FAIL_VALUE`` for fail.
    """
    draws = rng.random(num_histograms)
    out = np.full(num_histograms, FAIL_VALUE, dtype=np.int64)
    if sample.size == 0:
        return out
    starts = np.searchsorted(sample, np.arange(num_histograms + 1))
    sizes = np.diff(starts)
    position = np.arange(sample.size) - starts[sample]
    width = int(sizes.max())
    rows_per_chunk = max(1, (1 << 20) // width)
    for h0 in range(0, num_histograms, rows_per_chunk):
        h1 = min(num_histograms, h0 + rows_per_chunk)
        e0, e1 = starts[h0], starts[h1]
        table = np.zeros((h1 - h0, width))
        table[sample[e0:e1] - h0, position[e0:e1]] = probabilities[e0:e1]
        running = np.cumsum(table, axis=1)
        index = (running <= draws[h0:h1, None]).sum(axis=1)
        hit = index < sizes[h0:h1]
        rows = np.flatnonzero(hit)
        out[h0 + rows] = tokens[starts[h0 + rows] + index[rows]]
    return out
