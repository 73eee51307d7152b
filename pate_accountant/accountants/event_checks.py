"""Checks every accountant applies to an event before charging it: valid parameters, one relation.

Parameters.  dp-accounting's events are plain records without validation: ``LaplaceDpEvent(-2)`` builds
fine, and a translation such as ``epsilon = 1 / noise_multiplier`` would turn it into a *negative* cost
(the spent epsilon would go down).  :func:`check_event` walks an event (through ``ComposedDpEvent``,
``SelfComposedDpEvent``, the sampled events and ``BoundaryWrapperEvent.inner``) and refuses, with a
one-line ``ValueError`` or ``TypeError`` that names the event class, the parameter and the value:

===================================  ===============================================================
event                                 requirement
===================================  ===============================================================
``LaplaceDpEvent``                    ``noise_multiplier`` finite and ``> 0``
``GaussianDpEvent``                   ``noise_multiplier`` finite and ``> 0``
``DiscreteLaplaceDpEvent``            ``noise_parameter`` finite and ``> 0``; ``sensitivity`` an integer ``>= 1``
``RandomizedResponseDpEvent``         ``noise_parameter`` in ``(0, 1]``; ``num_buckets`` an integer ``>= 1``
``ZCDpEvent``                         ``rho`` and ``xi`` finite and ``>= 0`` (zero is a free step, not a bad one)
``PoissonSampledDpEvent``             ``sampling_probability`` in ``(0, 1]``; its inner event valid
``SampledWith(out)ReplacementDpEvent`` sizes integers ``>= 1`` (without replacement: sample at most the source)
``SelfComposedDpEvent``               ``count`` an integer ``>= 1``; its inner event valid
``ComposedDpEvent``                   ``events`` a list or tuple of valid events
``NoOpDpEvent``                       nothing to check
===================================  ===============================================================

Our own events validate themselves at construction; :func:`check_event` re-checks their numeric fields
(finite, in range) and their relation, so an event altered after construction is refused too.
dp-accounting's other event types (tree aggregation, repeat-and-select, mixtures, truncated sampling)
have parameters this project does not check, so they are refused with ``UnsupportedEventError``;
``NonPrivateDpEvent`` and ``UnsupportedDpEvent`` are left to the accountants, which all refuse them.

Relations.  Every accountant composes events stated under one neighbouring relation only.  Our events
state theirs (``relation``; a ``BoundaryWrapperEvent`` states its inner event's).  dp-accounting's events
state none: they are read under the accountant's relation.  :func:`relation_after` gives the relation an
accountant holds after charging an event, or raises ``UnsupportedEventError`` naming both relations when
the event would mix two:

* an accountant built with ``neighboring_relation=R`` holds ``R`` from the start;
* otherwise the first charged event that states a relation fixes it; a privacy-bearing dp-accounting
  event charged before any relation is fixed is read under the default, ``"replace-one"``, and fixes it.

Reading a dp-accounting event under a relation follows dp-accounting's own definitions, and where they
disagree, the more expensive one.  dp-accounting calibrates its additive noise (Laplace, discrete Laplace,
Gaussian) to a shift of one under add/remove-one; under replace-one its PLD for a Gaussian uses a shift of
two (one record out, another in), while its RDP accountant still reads a shift of one, and it defines no
replace-one PLD for Laplace at all.  So :func:`check_native_relation` refuses, under ``"replace-one"``,
Laplace and discrete Laplace noise everywhere, and Gaussian noise wherever only the shift-one reading is
available (the RDP accountant); randomized response and sampling without replacement are defined under
replace-one only (the accountants that take them refuse add/remove-one, as dp-accounting does).
"""

from __future__ import annotations

import functools

import dp_accounting
from dp_accounting import dp_event

from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    DiscreteGaussianArgMaxEvent,
    DiscreteGaussianSumEvent,
    EpsilonDeltaEvent,
    SparseVectorEpisodeEvent,
    ThresholdPrivacyEvent,
    zcdp_epsilon,
)
from pate_accountant.validation import check_int, check_real

__all__ = [
    "DEFAULT_RELATION",
    "SHIFT_NOISE",
    "check_event",
    "check_native_relation",
    "check_relation",
    "is_free",
    "relation_after",
    "stated_relations",
]

#: The relation a dp-accounting event is read under when nothing else fixes the accountant's relation.
DEFAULT_RELATION = REPLACE_ONE

#: How deep events may nest (a guard against self-referencing structures).
_MAX_DEPTH = 64

_UNCHECKED_NATIVE = tuple(
    cls
    for cls in (
        getattr(dp_event, name, None)
        for name in (
            "SingleEpochTreeAggregationDpEvent",
            "RepeatAndSelectDpEvent",
            "MixtureOfGaussiansDpEvent",
            "TruncatedSubsampledGaussianDpEvent",
        )
    )
    if cls is not None
)


def check_relation(name: str, value) -> str | None:
    """``None`` or one of the relation names (a ``ValueError`` naming ``name`` otherwise)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"{name} must be one of {NEIGHBOURING_RELATIONS} or None, got {value!r}")
    return value


def _real(event, field: str, **limits) -> float:
    return check_real(f"{type(event).__name__}.{field}", getattr(event, field), **limits)


def _int(event, field: str, **limits) -> int:
    return check_int(f"{type(event).__name__}.{field}", getattr(event, field), **limits)


def check_event(event) -> None:
    """Refuse an event with an invalid parameter anywhere inside it (module docstring); return nothing."""
    _check(event, 0)


#: dp-accounting's discretisation of the privacy loss of a discrete-Gaussian GNMax step (the PLD accountant's
#: default), for the curve its events are checked against and calibrated on.
GAUSSIAN_VALUE_DISCRETIZATION = 1e-4


@functools.lru_cache(maxsize=256)
def _discrete_gaussian_pld(sigma: float, truncation_bound: int, shifts: int):
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    one = pld_lib.from_discrete_gaussian_mechanism(sigma, sensitivity=1, truncation_bound=truncation_bound,
                                                   value_discretization_interval=GAUSSIAN_VALUE_DISCRETIZATION)
    out = one
    for _ in range(shifts - 1):  # compose (dp-accounting's self_compose overflows in its tail bounds here)
        out = out.compose(one)
    return out


@functools.lru_cache(maxsize=1024)
def discrete_gaussian_delta(sigma: float, truncation_bound: int, shifts: int, epsilon: float) -> float:
    """The delta at ``epsilon`` of one GNMax step whose truncated discrete Gaussian noise (``sigma``, values in
    ``{-truncation_bound, ..., truncation_bound}``) moves ``shifts`` counts by one: dp-accounting's pessimistic
    PLD of ``shifts`` one-dimensional discrete-Gaussian mechanisms of sensitivity one (an upper bound on the
    true hockey-stick divergence; docs/mechanisms/gaussian.md).  The one home of this curve: the mechanism is
    calibrated on it and every ``DiscreteGaussianArgMaxEvent`` is checked against it."""
    pld = _discrete_gaussian_pld(float(sigma), int(truncation_bound), int(shifts))
    # dp-accounting's sum can round a delta of about zero to a tiny negative number (-3e-17 seen at sigma 1.5,
    # epsilon 9): no delta is below zero
    return float(min(1.0, max(0.0, pld.get_delta_for_epsilon(float(epsilon)))))


def _check_gaussian_claim(event) -> None:
    """Issue 22, item 1, for GNMax: a hand-built event may state no more privacy than its own noise gives (the
    non-PLD accountants charge the stated ``(epsilon, delta)``)."""
    _real(event, "sigma", minimum=0.0, min_open=True)
    _int(event, "truncation_bound", minimum=1)
    curve = discrete_gaussian_delta(event.sigma, event.truncation_bound, event.shifts, event.epsilon)
    if curve > event.delta * (1.0 + 1e-9):
        raise ValueError(
            f"{type(event).__name__} states (epsilon {event.epsilon!r}, delta {event.delta!r}), but its noise sigma "
            f"{event.sigma!r} (truncated at {event.truncation_bound}) gives delta {curve:.4g} at that epsilon "
            f"under {event.relation}: it claims more privacy than its mechanism has"
        )


def _check_zcdp_claim(event) -> None:
    """A hand-built :class:`DiscreteGaussianSumEvent` may state no more privacy than its ``rho`` gives (the
    accountants other than RDP charge the stated ``(epsilon, delta)``)."""
    _real(event, "sigma_squared", minimum=0.0, min_open=True)
    _real(event, "sensitivity_squared", minimum=0.0, min_open=True)
    if event.delta <= 0.0:
        raise ValueError(f"{type(event).__name__} states delta {event.delta!r}: zCDP gives no pure epsilon, so its "
                         "(epsilon, delta) needs delta > 0")
    least = zcdp_epsilon(event.rho, event.delta)
    if event.epsilon < least * (1.0 - 1e-12):
        raise ValueError(
            f"{type(event).__name__} states (epsilon {event.epsilon!r}, delta {event.delta!r}), but its rho "
            f"{event.rho!r} gives epsilon {least:.6g} at that delta under {event.relation}: it claims more privacy "
            "than its mechanism has")


def _check_episode_claim(event) -> None:
    """A :class:`SparseVectorEpisodeEvent` is pure and states the sum of its two parts (its ``rho``, which the RDP
    accountant charges, is read from the parts)."""
    _real(event, "svt_epsilon", minimum=0.0)
    _real(event, "draw_epsilon", minimum=0.0)
    parts = event.svt_epsilon + event.draw_epsilon
    if event.delta != 0.0 or abs(event.epsilon - parts) > 1e-12 * max(1.0, parts):
        raise ValueError(
            f"{type(event).__name__} states (epsilon {event.epsilon!r}, delta {event.delta!r}), but its sparse vector "
            f"test and draw are {event.svt_epsilon!r} + {event.draw_epsilon!r} pure: its epsilon must be their sum")


def _check(event, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"events nest more than {_MAX_DEPTH} levels deep")
    if not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")
    # -- ours (validated at construction; re-checked in case they were altered since) ---------------------------
    if isinstance(event, EpsilonDeltaEvent):
        _real(event, "epsilon", minimum=0.0)
        _real(event, "delta", minimum=0.0, maximum=1.0, max_open=True)
        _check_stated(event)
        if isinstance(event, DiscreteGaussianArgMaxEvent):
            _check_gaussian_claim(event)
        elif isinstance(event, DiscreteGaussianSumEvent):
            _check_zcdp_claim(event)
        elif isinstance(event, SparseVectorEpisodeEvent):
            _check_episode_claim(event)
    elif isinstance(event, BetweenThresholdsEvent):
        _real(event, "epsilon", minimum=0.0, min_open=True)
        _real(event, "q", minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        _check_stated(event)
    elif isinstance(event, BoundaryWrapperEvent):
        _real(event, "epsilon", minimum=0.0, min_open=True)
        _real(event, "q", minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        _check(event.inner, depth + 1)
    elif isinstance(event, ThresholdPrivacyEvent):
        _int(event, "threshold", minimum=1)
    # -- dp-accounting's ----------------------------------------------------------------------------------------
    elif isinstance(event, dp_event.NoOpDpEvent):
        return
    elif isinstance(event, (dp_event.LaplaceDpEvent, dp_event.GaussianDpEvent)):
        _real(event, "noise_multiplier", minimum=0.0, min_open=True)
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        _real(event, "noise_parameter", minimum=0.0, min_open=True)
        _int(event, "sensitivity", minimum=1)
    elif isinstance(event, dp_event.RandomizedResponseDpEvent):
        _real(event, "noise_parameter", minimum=0.0, maximum=1.0, min_open=True)
        _int(event, "num_buckets", minimum=1)
    elif isinstance(event, dp_event.ZCDpEvent):
        _real(event, "rho", minimum=0.0)
        _real(event, "xi", minimum=0.0)
    elif isinstance(event, dp_event.PoissonSampledDpEvent):
        _real(event, "sampling_probability", minimum=0.0, maximum=1.0, min_open=True)
        _check(event.event, depth + 1)
    elif isinstance(event, (dp_event.SampledWithReplacementDpEvent, dp_event.SampledWithoutReplacementDpEvent)):
        source = _int(event, "source_dataset_size", minimum=1)
        if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
            _int(event, "sample_size", minimum=1, maximum=source)
        else:
            _int(event, "sample_size", minimum=1)
        _check(event.event, depth + 1)
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        _int(event, "count", minimum=1)
        _check(event.event, depth + 1)
    elif isinstance(event, dp_event.ComposedDpEvent):
        parts = event.events
        if not isinstance(parts, (list, tuple)):
            raise TypeError(f"ComposedDpEvent.events must be a list of events, got {type(parts).__name__}")
        for part in parts:
            _check(part, depth + 1)
    elif _UNCHECKED_NATIVE and isinstance(event, _UNCHECKED_NATIVE):
        raise UnsupportedEventError(
            f"cannot account for event {type(event).__name__}: its parameters are not checked by this project"
        )
    # NonPrivateDpEvent, UnsupportedDpEvent and unknown classes: each accountant refuses them by name.


def _check_stated(event) -> None:
    relation = event.relation
    if not isinstance(relation, str) or relation not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"{type(event).__name__}.relation must be one of {NEIGHBOURING_RELATIONS}, got {relation!r}")


def stated_relations(event) -> frozenset:
    """The relations the events inside ``event`` state (empty for dp-accounting's own events)."""
    out: set = set()
    _stated(event, out, 0)
    return frozenset(out)


def _stated(event, out: set, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"events nest more than {_MAX_DEPTH} levels deep")
    if isinstance(event, (EpsilonDeltaEvent, BetweenThresholdsEvent)):
        out.add(event.relation)
    elif isinstance(event, BoundaryWrapperEvent):
        _stated(event.inner, out, depth + 1)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            _stated(part, out, depth + 1)
    else:
        inner = getattr(event, "event", None)  # SelfComposed, PoissonSampled, SampledWith(out)Replacement, ...
        if isinstance(inner, dp_accounting.DpEvent):
            _stated(inner, out, depth + 1)


def is_free(event) -> bool:
    """Whether ``event`` charges nothing at all (``NoOpDpEvent``, possibly composed or repeated)."""
    if isinstance(event, dp_event.NoOpDpEvent):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return all(is_free(part) for part in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return is_free(event.event)
    return False


def relation_after(current: str | None, event, *, default: str = DEFAULT_RELATION) -> str | None:
    """The relation an accountant holding ``current`` (``None``: not fixed yet) holds after charging ``event``.

    Raises ``UnsupportedEventError`` naming both relations when ``event`` mixes two relations, or states
    one other than ``current``.  Nothing is changed: the caller commits the returned relation.
    """
    stated = stated_relations(event)
    if len(stated) > 1:
        first, second = sorted(stated)
        raise UnsupportedEventError(
            f"cannot account for event {event!r}: it mixes the {first!r} and {second!r} relations "
            "(an accountant composes events stated under one relation only)"
        )
    if stated:
        (relation,) = stated
        if current is not None and relation != current:
            raise UnsupportedEventError(
                f"cannot account for event {event!r}: it is stated under the {relation!r} relation, but this "
                f"accountant composes {current!r} events (one guarantee, one relation)"
            )
        return relation
    if current is None and not is_free(event):
        return default
    return current


#: dp-accounting's additive-noise events, calibrated to a shift of one under add/remove-one.
SHIFT_NOISE = (dp_event.LaplaceDpEvent, dp_event.DiscreteLaplaceDpEvent)


def check_native_relation(
    event,
    relation: str | None,
    *,
    add_remove_only: tuple = SHIFT_NOISE,
    who: str = "this accountant",
    keyword: str = "neighboring_relation",
) -> None:
    """Refuse ``event`` if it holds a dp-accounting event of a type in ``add_remove_only`` anywhere inside it
    (a ``BoundaryWrapperEvent``'s inner event included) while the accountant's relation is ``"replace-one"``
    (see the module docstring); ``UnsupportedEventError`` names the inner event, the relation and the
    remedy (``keyword``: the constructor keyword that sets the accountant's relation).  The one rule every
    accountant applies: the composition accountants, target charging and individual charging."""
    if relation != REPLACE_ONE:
        return
    found = _find(event, add_remove_only, 0)
    if found is not None:
        inner = "" if found is event else f" (in {event!r})"
        raise UnsupportedEventError(
            f"{who} cannot account for event {found!r}{inner} under the 'replace-one' relation: dp-accounting "
            "calibrates this noise to a shift of one under add/remove-one (it is read under add/remove-one only: "
            f"build the accountant with {keyword}='add-remove-one' if that is the relation you claim)"
        )


def _find(event, kinds: tuple, depth: int):
    if depth > _MAX_DEPTH:
        raise ValueError(f"events nest more than {_MAX_DEPTH} levels deep")
    if isinstance(event, kinds):
        return event
    if isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            found = _find(part, kinds, depth + 1)
            if found is not None:
                return found
        return None
    inner = getattr(event, "inner", None) if isinstance(event, BoundaryWrapperEvent) else getattr(event, "event", None)
    if isinstance(inner, dp_accounting.DpEvent):
        return _find(inner, kinds, depth + 1)
    return None
