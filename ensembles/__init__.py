"""Teacher ensembles for Hot PATE: distributions, coordinated/independent votes, samplers, metrics.

torch and transformers are imported only inside ``ensembles.backends``, lazily.  The names below are
imported on first use (PEP 562), so that importing one submodule (``ensembles.data``, ``ensembles.metrics``)
does not load the generation loop and the mechanisms behind it.
"""

from pate_accountant.lazy import lazy_exports

#: Each public name and the module that defines it (a subpackage or submodule names itself).
_MODULES = {
    "TeacherDistributions": "ensembles.distributions",
    "TAIL_VOTE": "ensembles.histograms",
    "VoteHistogram": "ensembles.histograms",
    "batch_from_votes": "ensembles.histograms",
    "coordinated_votes": "ensembles.histograms",
    "coordinated_votes_from_noise": "ensembles.histograms",
    "count_votes": "ensembles.histograms",
    "histograms_from_votes": "ensembles.histograms",
    "independent_votes": "ensembles.histograms",
    "EnsembleSampler": "ensembles.samplers",
    "GenerationResult": "ensembles.generation",
    "PrivateGenerator": "ensembles.generation",
    "StepRecord": "ensembles.generation",
    "backends": "ensembles.backends",
    "data": "ensembles.data",
    "metrics": "ensembles.metrics",
    "synthetic": "ensembles.synthetic",
}
__all__ = sorted(_MODULES)


__getattr__, __dir__ = lazy_exports("ensembles", _MODULES, globals())
