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
