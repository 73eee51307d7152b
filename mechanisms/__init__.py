"""DP and threshold-privacy aggregation mechanisms for vote histograms (attrs value objects).

Imports only ``pate_accountant`` (never ``ensembles``, torch or transformers).
"""

from mechanisms.base import OutcomeDistribution
from mechanisms.histogram import TAIL_VOTE, CountHistogram, as_histogram
from mechanisms.threshold import ThresholdArgMax, ThresholdWeightedSampling

__all__ = [
    "TAIL_VOTE",
    "CountHistogram",
    "OutcomeDistribution",
    "ThresholdArgMax",
    "ThresholdWeightedSampling",
    "as_histogram",
]
