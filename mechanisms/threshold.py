"""Threshold-privacy aggregators ``TArgMax_T`` and ``TWS_{T,gamma}`` (paper Section 4.3).

Neighbouring relation: one teacher's vote changes (paper Observation 1), so two counts move by one.
Threshold privacy with parameter ``T`` means only tokens with ``c_j >= T`` may be released; it is a
light proxy for DP (``T = Theta(eps^-1 log(1/delta))``), not a DP guarantee, so the event these
aggregators announce (``ThresholdPrivacyEvent``) is rejected by DP accountants.

Diversity preservation (Theorem 4.1, proved in Appendix C): ``TWS_{tau/2, gamma}`` composed with a
coordinated histogram is diversity preserving with ``(tau, beta = 0.17, gamma)``, and
``TArgMax_{ceil(n/2 + 1)}`` with ``(tau, beta = (1/2) ln(2 tau / n), gamma = 2)`` for ``tau > n/2``.
"""

from __future__ import annotations

import attr
import numpy as np

from mechanisms.base import Mechanism, OutcomeDistribution
from mechanisms.histogram import as_batch, as_histogram
from pate_accountant.events import ThresholdPrivacyEvent
from pate_accountant.validation import MAX_COUNT, attrs_validator, check_int, check_real


def _positive_int(instance, attribute, value):
    """A threshold in ``[1, 2^53]``: compared with int64 counts (docs/ranges.md)."""
    check_int(attribute.name, value, minimum=1, maximum=MAX_COUNT)


@attr.s(frozen=True, slots=True)
class ThresholdArgMax(Mechanism):
    """``TArgMax_T``: the most-voted token among those with ``c_j >= T``, else fail.

    Ties between maximisers are broken uniformly at random with ``rng``.  Its claim is threshold privacy
    (:class:`mechanisms.base.ThresholdClaim`): no token below ``T`` votes is ever released.  A run is one
    exact draw from :meth:`output_distribution` (:class:`mechanisms.base.Mechanism`).
    """

    threshold: int = attr.ib(validator=_positive_int)

    @property
    def event(self) -> ThresholdPrivacyEvent:
        return ThresholdPrivacyEvent(self.threshold)

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        hist = as_histogram(histogram, num_teachers)
        tokens, counts = hist.above(self.threshold)
        if tokens.size == 0:
            return OutcomeDistribution(tokens, np.zeros(0), 1.0)
        winners = tokens[counts == counts.max()]
        return OutcomeDistribution(winners, np.full(winners.size, 1.0 / winners.size), 0.0)

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised :meth:`output_distribution`: ``(histogram, token, probability)`` of every token with
        positive probability, sorted by histogram (the rest of each histogram's mass is fail)."""
        batch = as_batch(batch)
        keep = batch.counts >= self.threshold
        sample, tokens, counts = batch.sample[keep], batch.tokens[keep], batch.counts[keep]
        best = np.zeros(batch.num_histograms, dtype=np.int64)
        np.maximum.at(best, sample, counts)
        winner = counts == best[sample]
        sample, tokens = sample[winner], tokens[winner]
        ties = np.bincount(sample, minlength=batch.num_histograms)
        return sample, tokens, 1.0 / ties[sample]


@attr.s(frozen=True, slots=True)
class ThresholdWeightedSampling(Mechanism):
    """``TWS_{T,gamma}``: with probability ``min(1, gamma M_T / n)`` a token of ``S_T`` drawn with
    probability ``c_j / M_T``, else fail; ``S_T = {j : c_j >= T}``, ``M_T = sum_{j in S_T} c_j``.

    Equivalently, token ``j in S_T`` is released with probability ``c_j / max(M_T, n / gamma)``, so no
    token is released more often than ``gamma c_j / n`` (relevance).  Threshold privacy, and one exact draw
    per run, as for :class:`ThresholdArgMax`.
    """

    threshold: int = attr.ib(validator=_positive_int)
    gamma: float = attr.ib(default=1.0, converter=float, validator=attrs_validator(check_real, minimum=1.0))

    @property
    def event(self) -> ThresholdPrivacyEvent:
        return ThresholdPrivacyEvent(self.threshold)

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        hist = as_histogram(histogram, num_teachers)
        tokens, counts = hist.above(self.threshold)
        if tokens.size == 0 or hist.num_teachers == 0:
            return OutcomeDistribution(tokens, np.zeros(tokens.size), 1.0)
        denominator = max(float(counts.sum()), hist.num_teachers / self.gamma)
        probabilities = counts / denominator
        return OutcomeDistribution(tokens, probabilities, max(0.0, 1.0 - probabilities.sum()))

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised :meth:`output_distribution` (see ``ThresholdArgMax.batch_distributions``)."""
        batch = as_batch(batch)
        keep = batch.counts >= self.threshold
        sample, tokens, counts = batch.sample[keep], batch.tokens[keep], batch.counts[keep]
        mass = np.bincount(sample, weights=counts, minlength=batch.num_histograms)
        denominator = np.maximum(mass, batch.num_teachers / self.gamma)
        return sample, tokens, counts / denominator[sample]
