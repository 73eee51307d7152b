"""The exact q-target certifier for finite output distributions (ours).

Definition (our reading of the Target-Charging paper, Cohen and Lyu 2023): an outcome ``t`` is a *q-target* of a mechanism
at privacy level ``eps_B`` if for every neighbouring pair ``(D0, D1)`` the two output distributions split
as ``P_b = p C + (1 - p) B_b`` (``b = 0, 1``; ``C`` a shared part that costs nothing) where ``B_0`` and
``B_1`` are ``eps_B``-indistinguishable and ``min_b B_b(t) >= q``.

For one pair of *finite* distributions the best ``q`` has a closed form.  Write ``E = e^{eps_B}``,
``m_y = min(P0_y, P1_y)``, ``M_y = max(P0_y, P1_y)`` and ``d_y = M_y - m_y``.

* Pure indistinguishability of the ``B``-parts is the pointwise ratio bound, so a coordinate ``y`` can give
  at most ``w_y = (E m_y - M_y) / (E - 1)`` to the shared part: then its residuals are ``E d_y / (E - 1)``
  on the larger side and ``d_y / (E - 1)`` on the smaller side, whose ratio is exactly ``E``.  This is
  non-negative only when ``M_y <= E m_y``; if any coordinate (the target included) breaks that, no
  decomposition exists and ``q* = 0``.
* The target keeps all of its mass in the ``B``-parts (moving target mass into ``C`` lowers
  ``B_b(t) = (P_b(t) - w_t) / (1 - p)`` because ``P_b(t) <= 1 - p``), and every other coordinate gives
  the most it can (a larger ``p`` only raises ``P_b(t) / (1 - p)``).  Hence

      q* = min_b P_b(t) / u,     u = 1 - p = P0(t) + sum_{y != t} d_y * (E if P0_y > P1_y else 1) / (E - 1).

  ``u`` is written with the residuals (each proportional to ``|P0_y - P1_y|``), not as
  ``1 - sum_y w_y``, so no cancellation occurs when the shared part is almost everything.
* If ``u = 0`` the two distributions are equal and put no mass on ``t``: the shared part is everything
  (``p = 1``), ``B`` can be anything and the pair costs nothing, so ``q* = 1`` (vacuous).

Written as ``1 - sum_y w_y`` the same ``u`` would cancel; this module is our own implementation, with
validation and the explicit decomposition.  The approximate
(``eps_B, delta_B``) variant is not covered: ``q_star`` certifies pure ``eps_B``-indistinguishability only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pate_accountant.validation import check_int, check_real

__all__ = [
    "QTargetDecomposition",
    "RATIO_RTOL",
    "pure_dp_level",
    "q_star",
    "q_star_rows",
    "q_target_decomposition",
    "worst_case_q",
]

#: Relative slack on the pointwise ratio bound ``M_y <= E m_y`` (absorbs float rounding of exact ratios).
RATIO_RTOL = 1e-9

#: How far from 1 an input distribution's total may be.
_SUM_ATOL = 1e-9


def _check_distribution_rows(name: str, value) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind not in "biuf" or array.dtype.kind == "b":
        raise TypeError(f"{name} must hold real probabilities, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if array.ndim not in (1, 2) or array.shape[-1] == 0:
        raise ValueError(f"{name} must be a non-empty 1-d distribution or a 2-d array of them, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must hold finite probabilities")
    if (array < 0).any():
        raise ValueError(f"{name} must hold non-negative probabilities, got {array[array < 0].ravel()[0]}")
    totals = array.sum(axis=-1)
    bad = np.abs(totals - 1.0) > _SUM_ATOL * max(1, array.shape[-1])
    if np.any(bad):
        raise ValueError(f"{name} must sum to 1, got a total of {np.ravel(totals)[np.flatnonzero(np.ravel(bad))[0]]!r}")
    return array


def _check_pair(p0, p1, epsilon, target_index) -> tuple[np.ndarray, np.ndarray, float, int]:
    p0 = _check_distribution_rows("p0", p0)
    p1 = _check_distribution_rows("p1", p1)
    if p0.shape != p1.shape:
        raise ValueError(f"p0 and p1 must have the same shape, got {p0.shape} and {p1.shape}")
    epsilon = check_real("epsilon", epsilon, minimum=0.0, min_open=True)
    target_index = check_int("target_index", target_index, minimum=0, maximum=p0.shape[-1] - 1)
    return p0, p1, epsilon, target_index


def _q_rows(p0: np.ndarray, p1: np.ndarray, epsilon: float, t: int) -> np.ndarray:
    """``q*`` for each row pair of two validated 2-d arrays."""
    e = math.exp(epsilon)
    e_minus_1 = math.expm1(epsilon)
    low, high = np.minimum(p0, p1), np.maximum(p0, p1)
    feasible = ~(high > e * low * (1.0 + RATIO_RTOL)).any(axis=1)
    diff = high - low
    factor = np.where(p0 > p1, e, 1.0) / e_minus_1
    factor[:, t] = 0.0
    u = p0[:, t] + (diff * factor).sum(axis=1)
    target = low[:, t]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(u > 0, target / np.where(u > 0, u, 1.0), 1.0)
    q = np.minimum(q, 1.0)
    return np.where(feasible, q, 0.0)


def q_star(p0, p1, epsilon: float, target_index: int = 0) -> float:
    """The largest ``q`` for which outcome ``target_index`` is a ``q``-target of the pair ``(p0, p1)`` at
    pure privacy level ``epsilon`` (see the module docstring); ``0`` when some coordinate's ratio exceeds
    ``e^epsilon``.  ``p0`` and ``p1`` are probability vectors over the same finite outcome list."""
    p0, p1, epsilon, t = _check_pair(p0, p1, epsilon, target_index)
    if p0.ndim != 1:
        raise ValueError(f"q_star takes 1-d distributions, got shape {p0.shape}; use q_star_rows for many pairs")
    return float(_q_rows(p0[None, :], p1[None, :], epsilon, t)[0])


def q_star_rows(p0, p1, epsilon: float, target_index: int = 0) -> np.ndarray:
    """Vectorised :func:`q_star`: row ``i`` of ``p0`` against row ``i`` of ``p1``."""
    p0, p1, epsilon, t = _check_pair(p0, p1, epsilon, target_index)
    return _q_rows(np.atleast_2d(p0), np.atleast_2d(p1), epsilon, t)


def worst_case_q(p0, p1, epsilon: float, target_index: int = 0) -> float:
    """``min`` of :func:`q_star` over all row pairs: the ``q`` a mechanism has over a set of neighbouring
    pairs (rows of ``p0`` against the same rows of ``p1``)."""
    rows = q_star_rows(p0, p1, epsilon, target_index)
    return float(rows.min())


class QTargetDecomposition(NamedTuple):
    """``P_b = shared * common + (1 - shared) * b_parts[b]`` with ``b_parts`` ``epsilon``-indistinguishable
    and ``min_b b_parts[b][target] = q``.  ``common`` is ``None`` when ``shared = 0``; when ``shared = 1``
    (equal inputs with no target mass) the ``b_parts`` are ``None``."""

    q: float
    shared: float
    common: np.ndarray | None
    b0: np.ndarray | None
    b1: np.ndarray | None


def q_target_decomposition(p0, p1, epsilon: float, target_index: int = 0) -> QTargetDecomposition:
    """The optimal decomposition behind :func:`q_star` (for checks and docs).

    Raises ``ValueError`` when no decomposition exists (some coordinate's ratio exceeds ``e^epsilon``).
    """
    p0, p1, epsilon, t = _check_pair(p0, p1, epsilon, target_index)
    if p0.ndim != 1:
        raise ValueError(f"q_target_decomposition takes 1-d distributions, got shape {p0.shape}")
    e = math.exp(epsilon)
    e_minus_1 = math.expm1(epsilon)
    low, high = np.minimum(p0, p1), np.maximum(p0, p1)
    bad = high > e * low * (1.0 + RATIO_RTOL)
    if bad.any():
        y = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"no decomposition at level epsilon={epsilon}: outcome {y} has probabilities {p0[y]!r} and {p1[y]!r}, "
            f"a ratio above e^epsilon"
        )
    diff = high - low
    r0 = np.where(p0 > p1, e * diff, diff) / e_minus_1
    r1 = np.where(p1 > p0, e * diff, diff) / e_minus_1
    r0[t], r1[t] = p0[t], p1[t]
    u = float(r0.sum())
    if u <= 0:
        return QTargetDecomposition(1.0, 1.0, p0.copy(), None, None)
    shared = max(0.0, 1.0 - u)
    common = None
    if shared > 0:
        w = np.clip(low - diff / e_minus_1, 0.0, None)
        w[t] = 0.0
        common = w / w.sum() if w.sum() > 0 else None
        if common is None:
            shared = 0.0
    b0, b1 = r0 / u, r1 / u
    return QTargetDecomposition(float(min(b0[t], b1[t], 1.0)), shared, common, b0, b1)


def pure_dp_level(p0, p1) -> float:
    """``max_y |ln P0_y - ln P1_y|`` over outcomes with positive probability on either side (``inf`` if
    one side has an outcome the other lacks): the pure-DP level of the pair."""
    p0 = _check_distribution_rows("p0", p0)
    p1 = _check_distribution_rows("p1", p1)
    if p0.shape != p1.shape:
        raise ValueError(f"p0 and p1 must have the same shape, got {p0.shape} and {p1.shape}")
    if ((p0 > 0) != (p1 > 0)).any():
        return math.inf
    both = p0 > 0
    return float(np.max(np.abs(np.log(p0[both]) - np.log(p1[both]))))
