"""Translating events into (epsilon, delta) terms, for the composition accountants.

Every translation is an upper bound on the event's privacy loss (never an under-count):

* ``EpsilonDeltaEvent`` and its subclasses (``NoisyArgMaxEvent``, ``WeightedSamplingEvent``): their
  stated total ``(epsilon, delta)``.
* ``BetweenThresholdsEvent``: ``(epsilon, 0)`` (discrete Laplace noise on a count of sensitivity one).
* ``BoundaryWrapperEvent`` around an ``(eps_A, delta_A)`` inner event: ``(2 eps_A, 2 delta_A)``
  (:func:`pate_accountant.tct.wrapped_event_terms`; the wrapper can nearly double the inner's delta, so
  ``delta_A`` alone would under-count; docs/mechanisms/boundary_wrapper.md proves the bound).
* dp-accounting's ``NoOpDpEvent`` ``(0, 0)``; ``LaplaceDpEvent(b)`` ``(1/b, 0)``;
  ``DiscreteLaplaceDpEvent(a, s)`` ``(a s, 0)``; ``ComposedDpEvent`` and ``SelfComposedDpEvent`` by their parts.
  Their parameters are checked first (finite and positive noise, an integer sensitivity and count of at
  least one): an invalid one raises ``ValueError`` / ``TypeError`` naming it, never a negative term.
* Anything else (Gaussian, threshold privacy, non-private steps, ...) is rejected.
"""

from __future__ import annotations

import math

import dp_accounting
from dp_accounting import dp_event

from pate_accountant.accountants.event_checks import check_event
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import BetweenThresholdsEvent, BoundaryWrapperEvent, EpsilonDeltaEvent
from pate_accountant.tct import wrapped_event_terms
from pate_accountant.validation import check_int

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
        eps, delta = wrapped_event_terms(math.fsum(e * m for e, _, m in inner), min(1.0, math.fsum(d * m for _, d, m in inner)))
        out.append((max(event.epsilon, eps), delta, multiplicity))
    elif isinstance(event, dp_event.NoOpDpEvent):
        return
    elif isinstance(event, dp_event.LaplaceDpEvent):
        check_event(event)  # noise_multiplier finite and > 0: the term 1/b is never negative
        out.append((1.0 / event.noise_multiplier, 0.0, multiplicity))
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        check_event(event)  # noise_parameter finite and > 0, sensitivity an integer >= 1
        out.append((event.noise_parameter * event.sensitivity, 0.0, multiplicity))
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        check_int("SelfComposedDpEvent.count", event.count, minimum=1)
        _collect(event.event, multiplicity * event.count, out)
    elif isinstance(event, dp_event.ComposedDpEvent):
        if not isinstance(event.events, (list, tuple)):
            raise TypeError(f"ComposedDpEvent.events must be a list of events, got {type(event.events).__name__}")
        for part in event.events:
            _collect(part, multiplicity, out)
    elif isinstance(event, dp_accounting.DpEvent):
        raise UnsupportedEventError(f"cannot account for event {event!r}: it has no (epsilon, delta) form")
    else:
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")
