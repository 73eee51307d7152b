"""Small argument checks shared by the three packages.

Every check raises a ``TypeError`` for a value of the wrong kind and a ``ValueError`` for a value of
the right kind outside its range, and the message names the parameter and the offending value.
"""

from __future__ import annotations

import math
import numbers
import os
import stat

import numpy as np

# -- documented ranges shared by the three packages (docs/ranges.md) ---------------------------------------
#: The largest epsilon of one mechanism run (a mechanism's total per-run epsilon, a step of a private run) and
#: of a planned query's level ``eps0``.  At 50 a run already promises nothing (``e^-50`` is ``2e-22``), and every
#: formula stays finite in float64: the largest exponent any of them takes is ``e^{2 eps}`` (the boundary
#: wrapper's ``q`` at ``eps_A = eps``), far below float64's limit ``e^709``; the exact integer samplers keep
#: their bit counts small (``eps (L + 1) / ln 2`` bits).
MAX_STEP_EPSILON = 50.0
#: The smallest delta a mechanism or a plan takes: below it ``delta`` approaches float64's smallest normal
#: number (``2.2e-308``) and products such as ``delta (e^eps + 1)`` or ``delta / 2`` (a per-count share) lose
#: their precision or underflow.  ``ln(1/delta)`` is at most 691 here.
MIN_DELTA = 1e-300
#: The largest count (votes, teachers, thresholds, token ids) checked where one is converted to float64 or
#: combined in int64 arithmetic: ``2^53``, the largest integer float64 holds exactly.
MAX_COUNT = 2**53


def check_epsilon(name: str, value, *, maximum: float = MAX_STEP_EPSILON, why: str = "") -> float:
    """``value`` as a float in ``(0, maximum]`` (default :data:`MAX_STEP_EPSILON`); the message above the range
    names the range, the value and (``why``) the reason."""
    value = check_real(name, value, minimum=0.0, min_open=True)
    if value > maximum:
        reason = why or "a larger epsilon promises no privacy and leaves float64's range in e^epsilon; docs/ranges.md"
        raise ValueError(f"{name} must lie in (0, {maximum:g}], got {value:g} ({reason})")
    return value


def check_delta(name: str, value, *, minimum: float = MIN_DELTA) -> float:
    """``value`` as a float in ``[minimum, 1)`` (default :data:`MIN_DELTA`)."""
    value = check_real(name, value, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    if value < minimum:
        raise ValueError(
            f"{name} must lie in [{minimum:g}, 1), got {value:g} (smaller deltas leave float64's normal range; "
            "docs/ranges.md)"
        )
    return value


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


#: The most bytes a small input file (a run description, a template) may hold.
SMALL_FILE_BYTES = 1 << 20


def check_regular_file(path, what: str) -> os.stat_result:
    """``os.stat(path)`` of a regular file; ``FileNotFoundError`` ("no such ``what``") when nothing is there,
    ``ValueError`` naming a folder, a device or a pipe (:func:`read_regular_file`)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such {what}: {os.fspath(path)}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a pipe" if stat.S_ISFIFO(info.st_mode) else "a device"
        raise ValueError(f"{what} {os.fspath(path)!r} is {kind}, not a regular file")
    return info


def read_regular_file(path, what: str, max_bytes: int | None = SMALL_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``, which a user named as ``what`` (``"--config file"``), checked
    before it is read: ``FileNotFoundError`` ("no such ``what``") when nothing is there, ``ValueError`` (one line
    naming it) for a folder, a device or a pipe (``/dev/zero`` would be read for ever, a FIFO would block) and for
    a file of more than ``max_bytes`` (``None``: no limit)."""
    info = check_regular_file(path, what)
    if max_bytes is not None and info.st_size > max_bytes:
        raise ValueError(f"{what} {os.fspath(path)!r} holds {info.st_size:,} bytes, more than the {max_bytes:,} such "
                         "a file may have")
    with open(path, "rb") as handle:
        data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:  # grew after the check
        raise ValueError(f"{what} {os.fspath(path)!r} holds more than the {max_bytes:,} bytes such a file may have")
    return data
