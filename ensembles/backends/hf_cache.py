"""The one place that knows how a transformers model takes and returns its KV cache.

transformers 5.0 to 5.23 name the cache ``past_key_values`` on a model's ``forward`` and on its output;
5.24 renamed both to ``cache`` and keeps the old keyword only as a deprecated alias (a ``FutureWarning``
announcing its removal in 5.40).  :func:`forward_with_cache` feeds a cache under whichever name the model's
own ``forward`` declares and reads it back from whichever field its output has, so the backend, the
sharded workers and the answer scorer run on every 5.x release without touching a deprecated name.

torch is not imported here; the module is light.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

__all__ = ["cache_keyword", "forward_with_cache"]

#: The current name first: a model that declares both takes the current one.
_NAMES = ("cache", "past_key_values")


@functools.lru_cache(maxsize=64)
def _keyword_of(forward) -> str:
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: the long-standing name
        return _NAMES[1]
    for name in _NAMES:
        if name in parameters:
            return name
    return _NAMES[1]


def cache_keyword(module) -> str:
    """``"cache"`` when ``module.forward`` declares that parameter (transformers 5.24 and later), else
    ``"past_key_values"``.  ``inspect.signature`` follows the ``functools.wraps`` of transformers' deprecation
    decorators to the real parameters; the answer is kept per class."""
    return _keyword_of(type(module).forward)


def _output_cache(output):
    """The cache a model output carries, read from its declared field (never the deprecated alias)."""
    fields = {f.name for f in dataclasses.fields(output)} if dataclasses.is_dataclass(output) else set()
    for name in _NAMES:
        if name in fields:
            return getattr(output, name)
    raise TypeError(f"{type(output).__name__} has no cache field (looked for {', '.join(_NAMES)})")


def forward_with_cache(module, cache, **inputs):
    """``module(**inputs, use_cache=True)`` with ``cache`` under the keyword the module declares; returns
    ``(output, cache)``, the cache as the output holds it (the same object, extended, for a ``DynamicCache``)."""
    output = module(**inputs, **{cache_keyword(module): cache}, use_cache=True)
    return output, _output_cache(output)
