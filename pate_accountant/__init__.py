"""pate-accountant: privacy events, releases and (in later modules) accountants for Hot PATE.

This package never imports torch, transformers or the ``ensembles`` package.
"""

from pate_accountant.errors import BudgetExhaustedError, PateAccountantError, UnsupportedEventError
from pate_accountant.events import (
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    EpsilonDeltaEvent,
    NoisyArgMaxEvent,
    ThresholdPrivacyEvent,
    WeightedSamplingEvent,
)
from pate_accountant.release import Release

__version__ = "0.1.0"

__all__ = [
    "BetweenThresholdsEvent",
    "BoundaryWrapperEvent",
    "BudgetExhaustedError",
    "EpsilonDeltaEvent",
    "NoisyArgMaxEvent",
    "PateAccountantError",
    "Release",
    "ThresholdPrivacyEvent",
    "UnsupportedEventError",
    "WeightedSamplingEvent",
    "__version__",
]
