"""DP and threshold-privacy aggregation mechanisms for vote histograms (attrs value objects).

Imports only ``pate_accountant`` (never ``ensembles``, torch or transformers).
"""

from mechanisms.between_thresholds import BetweenThresholds
from mechanisms.boundary_wrapper import BoundaryWrapper
from mechanisms.base import FAIL_VALUE, BatchRelease, OutcomeDistribution
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
    "HistogramBatch",
    "as_batch",
    "CountHistogram",
    "OutcomeDistribution",
    "ThresholdArgMax",
    "ThresholdWeightedSampling",
    "TruncatedGeometricNoisyArgMax",
    "as_histogram",
]
