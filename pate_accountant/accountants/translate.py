"""Translating events into (epsilon, delta) terms, for the composition accountants.

Every translation is an upper bound on the event's privacy loss (never an under-count):

* ``EpsilonDeltaEvent`` and its subclasses (``NoisyArgMaxEvent``, ``WeightedSamplingEvent``): their
  stated total ``(epsilon, delta)``.
* ``BetweenThresholdsEvent``: ``(epsilon, 0)`` (discrete Laplace noise on a count of sensitivity one).
* ``BoundaryWrapperEvent``: ``(epsilon, delta_inner)`` with ``epsilon`` the event's level ``2 eps_A``:
  the wrapped mechanism is ``2 eps_A``-DP in its pure part (docs/mechanisms/boundary_wrapper.md).
* dp-accounting's ``NoOpDpEvent`` ``(0, 0)``; ``LaplaceDpEvent(b)`` ``(1/b, 0)``;
  ``DiscreteLaplaceDpEvent(a, s)`` ``(a s, 0)``; ``ComposedDpEvent`` and ``SelfComposedDpEvent`` by their parts.
* Anything else (Gaussian, threshold privacy, non-private steps, ...) is rejected.
"""

from __future__ import annotations

import dp_accounting
from dp_accounting import dp_event

from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import BetweenThresholdsEvent, BoundaryWrapperEvent, EpsilonDeltaEvent

__all__ = ["epsilon_delta_terms"]


def epsilon_delta_terms(event: dp_accounting.DpEvent) -> list[tuple[float, float, int]]:
    """``[(epsilon, delta, multiplicity), ...]`` whose composition bounds ``event``.

    Raises ``UnsupportedEventError`` naming the event when it has no (epsilon, delta) form.
    """
    out: list[tuple[float, float, int]] = []
    _collect(event, 1, out)
    return out


def _collect(event, multiplicity: int, out: list) -> None:
    if isinstance(event, EpsilonDeltaEvent):
        out.append((event.epsilon, event.delta, multiplicity))
    elif isinstance(event, BetweenThresholdsEvent):
        out.append((event.epsilon, 0.0, multiplicity))
    elif isinstance(event, BoundaryWrapperEvent):
        inner = epsilon_delta_terms(event.inner)
        inner_delta = sum(d * m for _, d, m in inner)
        out.append((event.epsilon, min(1.0, inner_delta), multiplicity))
    elif isinstance(event, dp_event.NoOpDpEvent):
        return
    elif isinstance(event, dp_event.LaplaceDpEvent):
        out.append((1.0 / event.noise_multiplier, 0.0, multiplicity))
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        out.append((event.noise_parameter * event.sensitivity, 0.0, multiplicity))
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        if event.count > 0:
            _collect(event.event, multiplicity * event.count, out)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            _collect(part, multiplicity, out)
    elif isinstance(event, dp_accounting.DpEvent):
        raise UnsupportedEventError(f"cannot account for event {event!r}: it has no (epsilon, delta) form")
    else:
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")
