"""DP and threshold-privacy aggregation mechanisms for vote histograms (attrs value objects).

Every mechanism subclasses :class:`mechanisms.base.Mechanism` and states its privacy claim
(``privacy_claim(relation)``); :mod:`mechanisms.registry` names them, and :mod:`mechanisms.testing` checks a
mechanism's claim and sampler against its exact law.

Imports only ``pate_accountant`` (never ``ensembles``, torch or transformers).
"""

from mechanisms.base import (
    FAIL_VALUE,
    BatchRelease,
    EpsilonDeltaClaim,
    Mechanism,
    OutcomeDistribution,
    TargetClaim,
    ThresholdClaim,
)
from mechanisms.between_thresholds import BetweenThresholds, TokenQuery
from mechanisms.boundary_wrapper import BoundaryWrapper
from mechanisms.histogram import TAIL_VOTE, CountHistogram, HistogramBatch, as_batch, as_histogram
from mechanisms.noisy_argmax import DPArgMax, TruncatedGeometricNoisyArgMax
from mechanisms.threshold import ThresholdArgMax, ThresholdWeightedSampling
from mechanisms.weighted_sampling import DPWeightedSampling

__all__ = [
    "FAIL_VALUE",
    "TAIL_VOTE",
    "BatchRelease",
    "BetweenThresholds",
    "BoundaryWrapper",
    "DPArgMax",
    "DPWeightedSampling",
    "EpsilonDeltaClaim",
    "HistogramBatch",
    "Mechanism",
    "as_batch",
    "CountHistogram",
    "OutcomeDistribution",
    "TargetClaim",
    "ThresholdArgMax",
    "ThresholdClaim",
    "ThresholdWeightedSampling",
    "TokenQuery",
    "TruncatedGeometricNoisyArgMax",
    "as_histogram",
]
