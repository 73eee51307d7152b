"""DP and threshold-privacy aggregation mechanisms for vote histograms (attrs value objects).

Every mechanism subclasses :class:`mechanisms.base.Mechanism` and states its privacy claim
(``privacy_claim(relation)``); :mod:`mechanisms.registry` names them, and :mod:`mechanisms.testing` checks a
mechanism's claim and sampler against its exact law.

Imports only ``pate_accountant`` (never ``ensembles``, torch or transformers).
"""

from pate_accountant.lazy import lazy_exports

#: Each public name and the module that defines it: imported on first use (PEP 562), so that importing
#: ``mechanisms.registry`` to list the names stays light.
_MODULES = {
    "FAIL_VALUE": "mechanisms.base",
    "BatchRelease": "mechanisms.base",
    "EpsilonDeltaClaim": "mechanisms.base",
    "Mechanism": "mechanisms.base",
    "OutcomeDistribution": "mechanisms.base",
    "TargetClaim": "mechanisms.base",
    "ThresholdClaim": "mechanisms.base",
    "BetweenThresholds": "mechanisms.between_thresholds",
    "TokenQuery": "mechanisms.between_thresholds",
    "BoundaryWrapper": "mechanisms.boundary_wrapper",
    "ClippedLogitSampling": "mechanisms.clipped_logits",
    "GaussianAveragedDistributions": "mechanisms.averaged_distributions",
    "SparseVectorPublicAgreement": "mechanisms.public_agreement",
    "TAIL_VOTE": "mechanisms.histogram",
    "CountHistogram": "mechanisms.histogram",
    "HistogramBatch": "mechanisms.histogram",
    "as_batch": "mechanisms.histogram",
    "as_histogram": "mechanisms.histogram",
    "GaussianNoisyArgMax": "mechanisms.gaussian",
    "GaussianThresholdArgMax": "mechanisms.gaussian",
    "DPArgMax": "mechanisms.noisy_argmax",
    "TruncatedGeometricNoisyArgMax": "mechanisms.noisy_argmax",
    "ThresholdArgMax": "mechanisms.threshold",
    "ThresholdWeightedSampling": "mechanisms.threshold",
    "DPWeightedSampling": "mechanisms.weighted_sampling",
}


__getattr__, __dir__ = lazy_exports("mechanisms", _MODULES, globals())


__all__ = [
    "FAIL_VALUE",
    "TAIL_VOTE",
    "BatchRelease",
    "BetweenThresholds",
    "BoundaryWrapper",
    "ClippedLogitSampling",
    "DPArgMax",
    "DPWeightedSampling",
    "EpsilonDeltaClaim",
    "GaussianAveragedDistributions",
    "GaussianNoisyArgMax",
    "GaussianThresholdArgMax",
    "HistogramBatch",
    "Mechanism",
    "as_batch",
    "CountHistogram",
    "OutcomeDistribution",
    "SparseVectorPublicAgreement",
    "TargetClaim",
    "ThresholdArgMax",
    "ThresholdClaim",
    "ThresholdWeightedSampling",
    "TokenQuery",
    "TruncatedGeometricNoisyArgMax",
    "as_histogram",
]
