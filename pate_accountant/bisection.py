"""One bisection for every calibration in the package: the point where a monotone predicate turns true.

The accountants, planning and the auditor each need the smallest value at which a monotone condition holds
(the smallest epsilon that a bound certifies, the largest per-query level that still fits a budget, the
smallest epsilon of a pair of laws); :func:`switch_point` brackets it by doubling and halving and then
narrows the bracket by bisection, so the answer is certified on the side the caller asks for.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["switch_point"]


def switch_point(passes: Callable[[float], bool], lower: float, upper: float, *, rel_tol: float,
                 limit: float = math.inf) -> tuple[float, float]:
    """Bracket ``[lo, hi]`` with ``passes(hi)`` true and ``passes(lo)`` false, ``hi - lo <= rel_tol * hi``.

    ``passes`` must be monotone on ``(0, limit]``: false below some point, true from it on.  The bracket
    starts at ``[lower, upper]`` (``0 <= lower < upper``): ``upper`` is doubled (and ``lower`` moved up to
    the failed value) until ``passes(upper)``, and ``lower`` is halved until it fails; ``lower = 0`` is taken
    to fail unchecked.  When ``upper`` would exceed ``limit`` (nothing passes) the result is ``(lower, inf)``;
    when halving reaches the smallest positive floats (everything passes) it is ``(0.0, lower)``.
    """
    if not 0.0 <= lower < upper:
        raise ValueError(f"the bracket must satisfy 0 <= lower < upper, got [{lower!r}, {upper!r}]")
    while not passes(upper):
        lower, upper = upper, 2.0 * upper
        if upper > limit:
            return lower, math.inf
    while lower > 0.0 and passes(lower):
        upper, lower = lower, lower / 2.0
        if lower < 1e-300:
            return 0.0, upper
    while upper - lower > rel_tol * upper:
        middle = (lower + upper) / 2.0
        if middle in (lower, upper):  # no float strictly between: as narrow as it gets
            break
        if passes(middle):
            upper = middle
        else:
            lower = middle
    return lower, upper
