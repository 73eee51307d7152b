"""Teacher ensembles for Hot PATE: distributions, coordinated/independent votes, samplers, metrics.

torch and transformers are imported only inside ``ensembles.backends``, lazily.
"""

from ensembles.distributions import TeacherDistributions
from ensembles.histograms import (
    TAIL_VOTE,
    VoteHistogram,
    batch_from_votes,
    coordinated_votes,
    coordinated_votes_from_noise,
    count_votes,
    histograms_from_votes,
    independent_votes,
)

__all__ = [
    "TAIL_VOTE",
    "TeacherDistributions",
    "VoteHistogram",
    "batch_from_votes",
    "coordinated_votes",
    "coordinated_votes_from_noise",
    "count_votes",
    "histograms_from_votes",
    "independent_votes",
]

from ensembles import backends, data, metrics, synthetic  # noqa: E402
from ensembles.generation import GenerationResult, PrivateGenerator, StepRecord  # noqa: E402
from ensembles.samplers import EnsembleSampler  # noqa: E402

__all__ += [
    "EnsembleSampler",
    "GenerationResult",
    "PrivateGenerator",
    "StepRecord",
    "backends",
    "data",
    "metrics",
    "synthetic",
]
