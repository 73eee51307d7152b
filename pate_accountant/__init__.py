"""pate-accountant: privacy events, releases, accountants and the ledger for Hot PATE.

This package never imports torch, transformers or the ``ensembles`` package.  Its top-level names are
loaded on first use (PEP 562), so that ``import pate_accountant`` (the command line's ``--help`` and
argument errors) does not import dp-accounting and scipy.
"""

from pate_accountant.lazy import lazy_exports

__version__ = "0.1.0"

#: Each top-level name and the module that defines it.
_LAZY = {
    "BudgetExhaustedError": "pate_accountant.errors",
    "PateAccountantError": "pate_accountant.errors",
    "UnsupportedEventError": "pate_accountant.errors",
    "BetweenThresholdsEvent": "pate_accountant.events",
    "BoundaryWrapperEvent": "pate_accountant.events",
    "BoundedRangeEvent": "pate_accountant.events",
    "DiscreteGaussianSumEvent": "pate_accountant.events",
    "EpsilonDeltaEvent": "pate_accountant.events",
    "NoisyArgMaxEvent": "pate_accountant.events",
    "SparseVectorEpisodeEvent": "pate_accountant.events",
    "ThresholdPrivacyEvent": "pate_accountant.events",
    "WeightedSamplingEvent": "pate_accountant.events",
    "Release": "pate_accountant.release",
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__, __dir__ = lazy_exports("pate_accountant", _LAZY, globals())
