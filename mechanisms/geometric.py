"""Truncated two-sided geometric noise and the optimal per-key release functions.

* ``TG(eps, k)``: integer noise on ``{-k, ..., k}`` with ``P[X = x] = A e^{-eps |x|}``,
  ``A = (1 - e^{-eps}) / (1 + e^{-eps} - 2 e^{-eps (k+1)})``.
* ``k*(eps, delta) = (1/eps) ln((e^eps + 2 delta - 1) / (delta (e^eps + 1)))`` solves ``A(k) e^{-eps k} = delta``;
  the truncation is ``k = ceil(k*)`` and ``delta_eff = A(k) e^{-eps k} <= delta``.
* Thresholded noisy count: a key with count ``c >= 1`` is released with value ``c + X`` iff
  ``c + X >= k + 1``; this is ``(eps, delta_eff)``-DP for one count changing by one (including 0 <-> 1),
  and its release probability equals the optimal reporting function ``pi(c; eps, delta_eff)``.
* ``pi*``: the largest per-key inclusion probability that obeys the DP recursion and a cap
  ``p(c)`` (a Poisson sampling rate).

Sampling is exact (see :mod:`mechanisms.randomness`): ``TruncatedGeometric.sample`` draws one value with
the integer alternating-series sampler (a geometric magnitude taken modulo ``k + 1`` and a fair sign), and
arrays by an inverse distribution function whose thresholds are the exact leading bits of the true
cumulative probabilities (refined bit by bit on a tie), so every value, ``+-k`` included, comes out with
exactly its probability ``A e^{-eps |x|}`` for the rational ``eps`` that the float stores.  The float64
tables (``pmf``, ``cdf``) describe the law; they are not used to draw.

The truncation ``k`` is certified: :func:`truncation` returns the least ``k`` whose ``delta_eff`` is
proven ``<= delta`` by interval arithmetic on ``e^-eps`` (not by a float comparison).
:func:`certified_inclusion` gives the ``pi*`` recursion with the cap ``min(1, c/n)`` in exact fixed-point
arithmetic, rounded so that every per-count privacy constraint holds exactly (the weighted sampler draws
from it).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from mechanisms.randomness import (
    FiniteLaw,
    RandomBits,
    exp_bounds,
    random_bits,
    truncated_geometric_law,
)
from pate_accountant.events import NEIGHBOURING_RELATIONS, REPLACE_ONE
from pate_accountant.validation import MIN_DELTA, check_epsilon, check_int, check_real

__all__ = [
    "INCLUSION_BITS",
    "MAX_ERROR_BOUND",
    "MIN_COUNT_DELTA",
    "TruncatedGeometric",
    "certified_inclusion",
    "delta_effective",
    "delta_effective_bounds",
    "k_star",
    "optimal_inclusion",
    "per_count_budget",
    "check_error_bound",
    "truncation",
]

#: The largest truncation ``L`` (error bound) of truncated-geometric noise (docs/ranges.md): the noise tables
#: hold ``2L + 1`` float64 entries and the exact sampler's law as many thresholds (built in about 3 s at
#: ``L = 10^6``), and a DPArgMax release needs more than ``2L`` teachers anyway.  ``L`` is about
#: ``min(ln(1/delta) / epsilon, 1 / (2 delta))``, so this limits small epsilons together with small deltas.
MAX_ERROR_BOUND = 10**6
#: The smallest per-count delta the helpers take: half of :data:`pate_accountant.validation.MIN_DELTA` (a
#: replace-one mechanism gives each count half its delta).
MIN_COUNT_DELTA = MIN_DELTA / 2


def _check_eps_delta(epsilon, delta) -> tuple[float, float]:
    epsilon = check_epsilon("epsilon", epsilon)
    delta = check_real("delta", delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    if delta < MIN_COUNT_DELTA:
        raise ValueError(f"delta must lie in [{MIN_COUNT_DELTA:g}, 1), got {delta:g} (half the smallest total delta "
                         f"{MIN_DELTA:g}: a per-count share; docs/ranges.md)")
    return epsilon, delta


def check_error_bound(error_bound: int, epsilon: float, delta: float) -> int:
    """``error_bound`` (the truncation ``L`` of a mechanism built at total ``(epsilon, delta)``) if it is at most
    :data:`MAX_ERROR_BOUND`; otherwise a ``ValueError`` naming epsilon and delta, raised before any table is
    built."""
    if error_bound > MAX_ERROR_BOUND:
        raise ValueError(
            f"epsilon = {epsilon:g} with delta = {delta:g} gives the noise truncation L = {error_bound} (about "
            f"min(ln(1/delta)/epsilon, 1/(2 delta))), above the limit {MAX_ERROR_BOUND}: the exact noise tables hold "
            "2L + 1 entries and a release needs more than 2L teachers; raise epsilon or delta (docs/ranges.md)"
        )
    return error_bound


def per_count_budget(epsilon: float, delta: float, relation: str = REPLACE_ONE) -> tuple[float, float]:
    """The per-count ``(eps_c, delta_c)`` of a total ``(epsilon, delta)`` (paper Observation 1).

    Replacing one teacher moves one vote, so two counts change by one: each count gets half the budget.
    Adding or removing a teacher changes one count: each count gets all of it.
    """
    epsilon, delta = _check_eps_delta(epsilon, delta)
    if relation not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {relation!r}")
    return (epsilon / 2, delta / 2) if relation == REPLACE_ONE else (epsilon, delta)


def k_star(epsilon: float, delta: float) -> float:
    """Real-valued truncation point solving ``A(k) e^{-eps k} = delta``; always below ``ln(1/delta)/eps``."""
    epsilon, delta = _check_eps_delta(epsilon, delta)
    return math.log((math.expm1(epsilon) + 2 * delta) / (delta * (math.exp(epsilon) + 1))) / epsilon


def truncation(epsilon: float, delta: float) -> int:
    """The integer truncation (at least 0): the least ``k`` with ``delta_eff(eps, k) = A(k) e^{-eps k} <= delta``,
    proven by interval arithmetic (:func:`delta_effective_bounds`), so never one too small.  This is
    ``ceil(k*)`` except when ``k*`` is within about ``1e-30`` of an integer.  It is the error bound ``L`` of
    the noisy counts."""
    epsilon, delta = _check_eps_delta(epsilon, delta)
    return _certified_truncation(epsilon, delta)


@functools.lru_cache(maxsize=256)
def _certified_truncation(epsilon: float, delta: float) -> int:
    bound = Fraction(delta)
    k = max(0, math.ceil(k_star(epsilon, delta)))
    while delta_effective_bounds(epsilon, k)[1] > bound:
        k += 1
    while k > 0 and delta_effective_bounds(epsilon, k - 1)[1] <= bound:
        k -= 1
    return k


#: Fixed-point precision (bits) of the bounds computed by :func:`delta_effective_bounds`.
_BOUND_BITS = 128


def delta_effective_bounds(epsilon: float, k: int) -> tuple[Fraction, Fraction]:
    """Rigorous rational bounds ``lo <= delta_eff(eps, k) <= hi`` (``hi - lo`` about ``2^-100`` relative).

    ``delta_eff = (1 - r) r^k / (1 + r - 2 r^{k+1})`` with ``r = e^-eps`` enclosed in a fixed-point
    interval; numerator and denominator are bounded separately and divided outwards."""
    epsilon = check_epsilon("epsilon", epsilon)
    k = check_int("k", k, minimum=0)
    # enough bits for 128 significant bits of r^(k+1) (whose size is about 2^(-eps (k+1) / ln 2))
    bits = _BOUND_BITS + 2 * k.bit_length() + int(epsilon * (k + 1) / math.log(2)) + 1
    r_lo, r_hi = exp_bounds(-epsilon, bits)
    one = 1 << bits
    r_hi = min(r_hi, one)
    p_lo, p_hi = _power(r_lo, k, bits, floor=True), _power(r_hi, k, bits, floor=False)
    num_lo, num_hi = (one - r_hi) * p_lo, (one - r_lo) * p_hi  # scaled by 2^(2 bits)
    q_lo, q_hi = (p_lo * r_lo) >> bits, -((-(p_hi * r_hi)) >> bits)  # r^{k+1}
    den_lo, den_hi = one + r_lo - 2 * q_hi, one + r_hi - 2 * q_lo  # scaled by 2^bits
    lo = Fraction(max(num_lo, 0), den_hi << bits)
    hi = Fraction(num_hi, den_lo << bits) if den_lo > 0 else Fraction(1)
    return lo, hi


def _power(base: int, exponent: int, bits: int, floor: bool) -> int:
    """``base^exponent`` in fixed point (scaled by ``2^bits``), rounded down (``floor``) or up."""
    out = 1 << bits
    while exponent:
        if exponent & 1:
            out = (out * base) >> bits if floor else -((-(out * base)) >> bits)
        exponent >>= 1
        if exponent:
            base = (base * base) >> bits if floor else -((-(base * base)) >> bits)
    return out


def _normaliser(epsilon: float, k: int) -> float:
    r = math.exp(-epsilon)
    return (1 - r) / (1 + r - 2 * r ** (k + 1))


def delta_effective(epsilon: float, k: int) -> float:
    """``A(k) e^{-eps k}``: the delta actually spent by ``TG(eps, k)`` with threshold ``k + 1``."""
    epsilon = check_epsilon("epsilon", epsilon)
    k = check_int("k", k, minimum=0)
    return _normaliser(epsilon, k) * math.exp(-epsilon * k)


class TruncatedGeometric:
    """The distribution ``TG(eps, k)`` on ``{-k, ..., k}``: float64 tables for pmf and cdf, exact sampling."""

    __slots__ = ("epsilon", "k", "_support", "_pmf", "_cdf", "_law")

    def __init__(self, epsilon: float, k: int):
        self.epsilon = check_epsilon("epsilon", epsilon)
        self.k = check_int("k", k, minimum=0, maximum=MAX_ERROR_BOUND)
        self._support = np.arange(-self.k, self.k + 1)
        weights = np.exp(-self.epsilon * np.abs(self._support))
        self._pmf = weights / weights.sum()
        self._cdf = np.cumsum(self._pmf)
        self._cdf[-1] = 1.0
        self._law = None

    @property
    def support(self) -> np.ndarray:
        return self._support

    @property
    def normaliser(self) -> float:
        """``A``, the probability of 0."""
        return float(self._pmf[self.k])

    def pmf(self, x) -> np.ndarray:
        x = np.asarray(x)
        inside = np.abs(x) <= self.k
        return np.where(inside, self._pmf[np.clip(x + self.k, 0, 2 * self.k)], 0.0)

    def cdf(self, x) -> np.ndarray:
        """``P[X <= x]``."""
        x = np.asarray(x)
        index = np.clip(np.floor(x).astype(np.int64) + self.k, -1, 2 * self.k)
        return np.where(index < 0, 0.0, self._cdf[np.maximum(index, 0)])

    def sf(self, x) -> np.ndarray:
        """``P[X >= x]`` (note: ``>=``, the release event of a threshold)."""
        return 1.0 - self.cdf(np.ceil(np.asarray(x, dtype=np.float64)) - 1)

    @property
    def law(self) -> FiniteLaw:
        """The exact law (indices ``x + k``) used for vectorised draws; its thresholds are computed once."""
        if self._law is None:
            self._law = truncated_geometric_law(self.epsilon, self.k)
        return self._law

    def sample(self, rng: np.random.Generator | RandomBits | None = None, size=None):
        """Exact draws of ``X``: one ``int`` for ``size=None``, else an ``int64`` array of shape ``size``.

        ``rng``: ``None`` draws from the operating system's cryptographic randomness, a
        ``numpy.random.Generator`` reproducibly from it (tests only), or a ``RandomBits`` source.  One value
        uses the integer alternating-series sampler; arrays use the exact inverse distribution function of
        :attr:`law` (one 64-bit word per value)."""
        source = random_bits(rng)
        if size is None:
            return source.truncated_geometric(self.epsilon, self.k)
        shape = (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)
        count = int(np.prod(shape, dtype=np.int64))
        return (self.law.sample(source, count) - self.k).reshape(shape)


def optimal_inclusion(cap, epsilon: float, delta: float) -> np.ndarray:
    """``pi*`` for counts ``0 .. len(cap) - 1``: ``pi*(0) = 0`` and

    ``pi*(c) = min(cap[c], e^eps pi*(c-1) + delta, 1 - e^{-eps} (1 - pi*(c-1) - delta))``.

    With ``cap = 1`` everywhere this is the optimal reporting function ``pi(c; eps, delta)`` of
    DVGM22 / CGSS21, which equals the thresholded truncated-geometric release probability.
    """
    epsilon, delta = _check_eps_delta(epsilon, delta)
    cap = np.asarray(cap, dtype=np.float64)
    if cap.ndim != 1 or cap.size == 0:
        raise ValueError(f"cap must be a non-empty 1-d array indexed by count, got shape {cap.shape}")
    if ((cap < 0) | (cap > 1)).any():
        raise ValueError("cap must hold probabilities in [0, 1]")
    e_pos, e_neg = math.exp(epsilon), math.exp(-epsilon)
    out = np.zeros(cap.size)
    previous = 0.0
    for c in range(1, cap.size):
        previous = min(cap[c], e_pos * previous + delta, 1.0 - e_neg * (1.0 - previous - delta), 1.0)
        out[c] = previous
    return out


#: Fixed-point precision (bits) of :func:`certified_inclusion`.
INCLUSION_BITS = 160


@functools.lru_cache(maxsize=64)
def certified_inclusion(num_teachers: int, epsilon: float, delta: float) -> tuple[int, ...]:
    """``pi*(c)`` for ``c = 0 .. n`` with the cap ``p(c) = min(1, c/n)``, as integers ``N_c`` meaning
    ``N_c / 2^INCLUSION_BITS``, computed so that the per-count privacy constraints hold *exactly*.

    The recursion of :func:`optimal_inclusion` is run in fixed point with every step rounded towards the
    safe side: ``e^eps`` by a lower bound ``E <= e^eps``, ``e^-eps`` by an upper bound ``e >= e^-eps``
    (:func:`mechanisms.randomness.exp_bounds`), ``delta`` and the cap ``c/n`` rounded down, and

        N_c = min( floor(cap 2^B), floor(E N_{c-1} / 2^B) + floor(delta 2^B),
                   2^B - ceil(e (2^B - N_{c-1} - floor(delta 2^B)) / 2^B) ),

    so with ``pi(c) = N_c / 2^B``: ``pi(c) <= e^eps pi(c-1) + delta`` and
    ``1 - pi(c) >= e^-eps (1 - pi(c-1) - delta)``; ``pi`` is non-decreasing (both recursion terms are at
    least ``pi(c-1)`` since ``E >= 1 >= e``), which gives the two reverse constraints.  Hence
    ``Bernoulli(pi(c-1))`` and ``Bernoulli(pi(c))`` are exactly ``(epsilon, delta)``-indistinguishable for
    every ``c``, with the true ``e^eps``.  Each rounding loses at most ``2^-B`` (``B = 160``), so the values
    agree with the real-number recursion to far better than float64 precision.
    """
    n = check_int("num_teachers", num_teachers, minimum=0)
    epsilon, delta = _check_eps_delta(epsilon, delta)
    bits = INCLUSION_BITS
    one = 1 << bits
    big_e = max(exp_bounds(epsilon, bits)[0], one)
    small_e = min(exp_bounds(-epsilon, bits)[1], one)
    exact_delta = Fraction(delta)
    delta_fixed = (exact_delta.numerator << bits) // exact_delta.denominator
    out, previous = [0], 0
    for c in range(1, n + 1):
        cap = (c << bits) // n
        grow = ((big_e * previous) >> bits) + delta_fixed
        rest = one - previous - delta_fixed
        complement = one - (-((-(small_e * rest)) >> bits)) if rest > 0 else one
        previous = min(cap, grow, complement, one)
        out.append(previous)
    return tuple(out)
