"""Option types and output helpers shared by the commands (docs/cli.md).

An option type turns a bad value into ``argparse.ArgumentTypeError``, which argparse reports as
``argument --opt: must be ..., got ...`` with exit status 2, before anything runs or is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction
from pathlib import Path

__all__ = [
    "cannot_write",
    "int_at_least",
    "nonnegative_int",
    "open_unit",
    "positive_float",
    "print_json",
    "positive_int",
    "real_in",
    "scale",
    "whole_number",
    "write_json",
]


def int_at_least(minimum: int, what: str):
    """An integer option ``>= minimum`` (written as a plain integer)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


def whole_number(what: str, minimum: int):
    """An integer option ``>= minimum`` that may also be written as a float with no fraction (``1e6``)."""

    def parse(text: str) -> int:
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if isinstance(value, float):  # allow 1e6, refuse 2.5
            if not math.isfinite(value) or value != int(value):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
            value = int(value)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


def real_in(what: str, minimum: float, maximum: float | None = None, *, min_open: bool = False,
            max_open: bool = False):
    """A finite float option in an interval; a fraction such as ``1/3`` is read exactly first."""

    def parse(text: str) -> float:
        try:
            value = float(Fraction(text.strip())) if "/" in text else float(text)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        bad = not math.isfinite(value) or value < minimum or (min_open and value == minimum)
        if maximum is not None:
            bad = bad or value > maximum or (max_open and value == maximum)
        if bad:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value:g}")
        return value

    return parse


positive_int = int_at_least(1, "a positive integer")
nonnegative_int = int_at_least(0, "a non-negative integer")
positive_float = real_in("a positive number", 0.0, min_open=True)
open_unit = real_in("a number in (0, 1)", 0.0, 1.0, min_open=True, max_open=True)
scale = real_in("a number in (0, 1]", 0.0, 1.0, min_open=True)


def write_json(path: Path, payload: dict) -> None:
    """``payload`` as indented JSON (no NaN or infinity) into ``path``."""
    path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def print_json(payload: dict, **kwargs) -> None:
    """``payload`` as indented JSON on stdout (no NaN or infinity)."""
    print(json.dumps(payload, indent=2, allow_nan=False, **kwargs))


def cannot_write(out, exc: OSError) -> int:
    """Report an unwritable ``--out`` folder on stderr; the exit status 1."""
    print(f"pate-accountant: error: cannot write into --out {str(out)!r}: {exc}", file=sys.stderr)
    return 1
