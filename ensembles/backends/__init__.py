"""Model backends: next-token distributions of ``n`` teacher contexts (docs/generation.md).

``NextTokenBackend`` (protocol), ``ToyBackend`` (tests), ``SampledApiBackend`` (sampling-only APIs).
``TransformersBackend`` lives in ``ensembles.backends.transformers_backend`` and imports torch lazily;
it is *not* imported here.
"""

from ensembles.backends.base import ContextBackend, NextTokenBackend
from ensembles.backends.openai_api import OpenAICompatibleBackend
from ensembles.backends.sampled_api import SampledApiBackend, empirical_distribution, expected_tv_bound
from ensembles.backends.toy import ToyBackend

__all__ = [
    "ContextBackend",
    "NextTokenBackend",
    "OpenAICompatibleBackend",
    "SampledApiBackend",
    "ToyBackend",
    "empirical_distribution",
    "expected_tv_bound",
]


def __getattr__(name):
    if name == "TransformersBackend":
        from ensembles.backends.transformers_backend import TransformersBackend

        return TransformersBackend
    raise AttributeError(f"module 'ensembles.backends' has no attribute {name!r}")
