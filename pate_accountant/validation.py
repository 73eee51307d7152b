"""Small argument checks shared by the three packages.

Every check raises a ``TypeError`` for a value of the wrong kind and a ``ValueError`` for a value of
the right kind outside its range, and the message names the parameter and the offending value.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer in ``[minimum, maximum]``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_real(
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
) -> float:
    """Return ``value`` as a finite ``float`` in the given (open or closed) interval."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value < minimum or (min_open and value == minimum)):
        raise ValueError(f"{name} must be {'>' if min_open else '>='} {minimum}, got {value}")
    if maximum is not None and (value > maximum or (max_open and value == maximum)):
        raise ValueError(f"{name} must be {'<' if max_open else '<='} {maximum}, got {value}")
    return value


def check_generator(name: str, rng) -> np.random.Generator:
    """Require an explicit ``numpy.random.Generator`` (no global state, no legacy RandomState)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (for example numpy.random.default_rng(seed)), "
            f"got {type(rng).__name__}"
        )
    return rng


def attrs_validator(check, **limits):
    """Turn one of the checks above into an attrs validator that names the attribute."""

    def validator(instance, attribute, value):
        check(attribute.name, value, **limits)

    return validator


def resolve_rng(name: str, rng) -> np.random.Generator:
    """A ``numpy.random.Generator`` for randomness that needs no privacy (vote sampling, synthetic teachers,
    simulations): ``None`` gives a fresh PCG64 generator seeded from OS entropy; otherwise a ``Generator``
    is required.

    DP noise does not come from here: the mechanisms draw it through ``mechanisms.randomness.random_bits``,
    which with ``None`` reads the operating system's cryptographic random number generator directly and
    samples every noise law exactly with integer arithmetic.  A PCG64 stream is not a cryptographic
    generator (its state can be recovered from its outputs), which is fine for simulations only.
    """
    if rng is None:
        return np.random.default_rng()
    return check_generator(name, rng)
