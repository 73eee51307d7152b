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

from pate_accountant.validation import MAX_STEP_EPSILON, MIN_DELTA
from pate_app.grammar import Parser, add_option

__all__ = [
    "BUDGET_DELTA_HELP",
    "DEFAULT_RAY_TIMEOUT",
    "DEFAULT_VOCAB_SIZE",
    "BUDGET_EPSILON_HELP",
    "Parser",
    "PUBLIC_AGREEMENT_OPTION",
    "STEP_DELTA_HELP",
    "STEP_EPSILON_HELP",
    "add_option",
    "add_verbose_option",
    "cannot_write",
    "delta",
    "int_at_least",
    "int_in",
    "nonnegative_int",
    "open_unit",
    "positive_float",
    "print_json",
    "positive_int",
    "real_in",
    "scale",
    "step_epsilon",
    "whole_number",
    "write_json",
]


def int_at_least(minimum: int, what: str, maximum: int | None = None):
    """An integer option ``>= minimum`` (and ``<= maximum``, if given), written as a plain integer."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


def whole_number(what: str, minimum: int, maximum: int | None = None):
    """An integer option ``>= minimum`` (and ``<= maximum``, if given) that may also be written as a float with
    no fraction (``1e6``)."""

    def parse(text: str) -> int:
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if isinstance(value, float):  # allow 1e6, refuse 2.5
            if not math.isfinite(value) or value != int(value):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
            value = int(value)
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value if abs(value) < 10**15 else text}")
        return value

    return parse


def int_in(minimum: int, maximum: int, why: str = ""):
    """An integer option in ``[minimum, maximum]`` (``1e6`` is fine, ``2.5`` is not); ``why`` is said with the
    range, e.g. ``must be an integer in [1, 100000000] (...)``."""
    return whole_number(f"an integer in [{minimum}, {maximum}]" + (f" ({why})" if why else ""), minimum, maximum)


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


def top_k_or_auto(text: str):
    """``--public-top-k``: a positive integer, or ``auto`` (sized on the public examples)."""
    return "auto" if text.strip().lower() == "auto" else int_at_least(1, "a positive integer or auto")(text)


nonnegative_int = int_at_least(0, "a non-negative integer")
positive_float = real_in("a positive number", 0.0, min_open=True)
open_unit = real_in("a number in (0, 1)", 0.0, 1.0, min_open=True, max_open=True)
scale = real_in("a number in (0, 1]", 0.0, 1.0, min_open=True)
unit = real_in("a number in [0, 1]", 0.0, 1.0)
#: The epsilon of one mechanism run, in ``(0, MAX_STEP_EPSILON]`` (docs/ranges.md).
step_epsilon = real_in(f"a number in (0, {MAX_STEP_EPSILON:g}]", 0.0, MAX_STEP_EPSILON, min_open=True)
#: A delta, in ``[MIN_DELTA, 1)`` (docs/ranges.md).
delta = real_in(f"a number in [{MIN_DELTA:g}, 1)", MIN_DELTA, 1.0, max_open=True)


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


#: The one grammar's help texts (docs/cli.md): totals are ``--budget-*``, one mechanism run is ``--step-*``.
BUDGET_EPSILON_HELP = "total privacy budget epsilon of the data set"
BUDGET_DELTA_HELP = "total privacy budget delta of the data set"
STEP_EPSILON_HELP = f"epsilon of one mechanism run (one step), in (0, {MAX_STEP_EPSILON:g}]"
STEP_DELTA_HELP = f"delta of one mechanism run (one step), in [{MIN_DELTA:g}, 1)"


def add_verbose_option(p) -> None:
    """``--verbose``: the warnings that libraries raise during the run, each once as one line on stderr."""
    p.add_argument("--verbose", action="store_true",
                   help="show each warning that a library (torch, transformers, Ray) raises during the run once, "
                        "as one line on stderr (default: they go to the pate_app.library_warnings logger only)")


#: Seconds a cluster ``--ray-address`` has to accept a connection, by default (``generate --ray-timeout``).
DEFAULT_RAY_TIMEOUT = 10.0
#: The vocabulary ``plan best`` assumes for GNMax, which noises every token of it: the embedded SmolLM2's (``plan best
#: --vocab-size``, and the default of the planner's laws, :mod:`pate_app.planning`).
DEFAULT_VOCAB_SIZE = 49152
#: The ``plan best`` option that states the public model's agreement with the teachers (the planner names it).
PUBLIC_AGREEMENT_OPTION = "--public-agreement"
