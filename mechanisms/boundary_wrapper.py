"""The TCT boundary wrapper (paper, "Privacy analysis considerations"; docs/mechanisms/boundary_wrapper.md).

``BoundaryWrapper(inner)`` runs on the *exact* output distribution of ``inner`` on the given histogram
(for a coordinated ensemble: conditioned on the shared randomness, which is public).  With
``pi = max_y P[inner = y]`` (the fail outcome counts as an outcome) it returns the special outcome
``target`` with probability

    P[target] = (1 - pi') / (2 - pi'),      pi' = max(pi, 1/2)          [the paper's formula; the clip is ours]

and otherwise a sample of ``inner``'s distribution.  ``P[target] <= 1/3`` always, it decreases as the
inner mechanism agrees with itself, and ``P[target] <= 1 - pi`` vanishes as one outcome's probability
tends to one.  For every inner with ``pi >= 1/2`` (all binary inners, e.g. LArgMax conditioned on the
histogram) this is exactly the paper's ``(1 - pi) / (2 - pi)``; the clip only acts when no
outcome has probability ``1/2``, where the unclipped formula would exceed the paper's bound of ``1/3``
(it tends to ``1/2`` for a spread-out inner).

Requirements on ``inner``: an ``output_distribution(histogram, ...) -> OutcomeDistribution`` that is
exact (``ThresholdArgMax``, ``ThresholdWeightedSampling`` and ``BetweenThresholds`` compute theirs in
closed form; so must any DP argmax / weighted-sampling mechanism that is to be wrapped), and an ``event`` with a
positive ``epsilon`` (``eps_A``; a mechanism that is pure ``eps_A``-DP under the event's relation).

Privacy (docs/mechanisms/boundary_wrapper.md; neighbouring relation: the inner event's, by default one
teacher's vote changes, paper Observation 1).  For a pure ``eps_A``-DP inner:

* the wrapped mechanism is ``2 eps_A``-DP (each factor of ``P[target]`` and of ``(1 - P[target]) P_y``
  moves by at most ``e^{eps_A}``; numerically the worst ratio is about ``1.33 eps_A``);
* ``target`` is a ``q``-target at level ``2 eps_A`` with ``q = (E + 1) / (2 E^2 + E + 2)``, ``E = e^{eps_A}``
  [OURS]: the infimum of the certifier over eps_A-DP pairs (found numerically, checked in the tests),
  approached as one outcome's probability tends to one.  This is ``0.3980`` at ``eps_A = 0.01`` and ``0.3794`` at ``0.1``.

:attr:`BoundaryWrapper.event` is ``BoundaryWrapperEvent(inner.event, epsilon=2 eps_A, q)`` with
``q = min(1/3, (E + 1) / (2 E^2 + E + 2))``: the paper's charge ``q = 1/3`` as long as
it is valid, which is for ``eps_A <= ln((1 + sqrt 3) / 2) = 0.3119``; above that the default would
under-count, so the certified value is used.  For an ``(eps_A, delta_A)`` inner the wrapper is
``(2 eps_A, 2 delta_A)``-DP as a plain step, and a target-charging accountant pays a mixture weight
``1 - (1 - delta_A)^2`` on every query (:func:`pate_accountant.tct.wrapped_query_delta`;
docs/tct_and_individual.md, section 1).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attr
import numpy as np

from mechanisms.base import (
    FAIL_VALUE,
    BatchRelease,
    EpsilonDeltaClaim,
    Mechanism,
    OutcomeDistribution,
    claim_under,
    privacy_claim_of,
    sample_batch_outcomes,
    wrapped_claim,
)
from mechanisms.histogram import as_batch
from mechanisms.qtarget import q_star_rows
from mechanisms.randomness import random_bits
from pate_accountant.events import BoundaryWrapperEvent
from pate_accountant.release import TARGET, Release
from pate_accountant.tct import MAX_EPSILON_FOR_ONE_THIRD, boundary_wrapper_q
from pate_accountant.validation import MAX_STEP_EPSILON, check_int, check_real

__all__ = [
    "MAX_EPSILON_FOR_ONE_THIRD",
    "TARGET",
    "BoundaryWrapper",
    "WrappedDistribution",
    "ApproximateInnerCertificate",
    "approximate_inner_certificate",
    "binary_worst_case_q",
    "boundary_wrapper_q",
    "outside_mass_rows",
    "target_probability",
    "wrap_probabilities",
]

def _target_probability(pi):
    pi = np.maximum(np.asarray(pi, dtype=np.float64), 0.5)
    return (1.0 - pi) / (2.0 - pi)


def outside_mass_rows(sample, probabilities, num_rows: int, fail=None) -> np.ndarray:
    """``1 - pi`` of each row of a batch of laws (``pi`` the largest probability of the row, fail included),
    summed from the small probabilities themselves: ``1 - max`` would cancel to zero when a yield of ``1e-18``
    sits beside a fail of ``1 - 1e-18`` (and the target would vanish where it must not).

    Row ``r`` lists the probabilities ``probabilities[sample == r]`` of its tokens; ``fail[r]`` is its fail
    probability, by default the rest of its mass ``1 - sum`` (a batch's layout,
    :meth:`mechanisms.base.Mechanism.batch_distributions`).  Where fail is the largest outcome, ``1 - pi`` is
    the sum of the token probabilities (``1 - sum`` is never used there); otherwise it is the sum of the
    tokens other than the largest one, plus fail.  The one computation of :meth:`BoundaryWrapper.output_distribution`
    (one row) and :meth:`BoundaryWrapper.batch_distributions`."""
    sample = np.asarray(sample, dtype=np.int64)
    probs = np.asarray(probabilities, dtype=np.float64)
    total = np.bincount(sample, weights=probs, minlength=num_rows)
    top = np.zeros(num_rows)
    np.maximum.at(top, sample, probs)
    fail = np.clip(1.0 - total, 0.0, 1.0) if fail is None else np.asarray(fail, dtype=np.float64)
    # The tokens other than each row's largest (its first occurrence): their sum, without cancellation.
    at_top = np.flatnonzero(probs == top[sample])
    _, first = np.unique(sample[at_top], return_index=True)
    rest = probs.copy()
    rest[at_top[first]] = 0.0
    others = np.bincount(sample, weights=rest, minlength=num_rows)
    return np.where(fail >= top, total, others + fail)


def target_from_outside_mass(outside):
    """``P[target] = a' / (1 + a')`` with ``a' = min(a, 1/2)``, ``a = 1 - pi`` (a number or an array): the same
    value as :func:`target_probability` without the cancellation of ``1 - pi``."""
    a = np.clip(np.asarray(outside, dtype=np.float64), 0.0, 0.5)
    target = a / (1.0 + a)
    return float(target) if target.ndim == 0 else target


def mass_outside_max(distribution: OutcomeDistribution) -> float:
    """``1 - pi`` of one law (:func:`outside_mass_rows` with one row and the law's own ``fail``)."""
    probs = np.asarray(distribution.probabilities, dtype=np.float64)
    return float(outside_mass_rows(np.zeros(probs.size, dtype=np.int64), probs, 1, [float(distribution.fail)])[0])


def target_probability(max_probability: float) -> float:
    """``P[target] = (1 - pi') / (2 - pi')`` with ``pi' = max(pi, 1/2)``: at most ``1/3``, at most ``1 - pi``."""
    pi = check_real("max_probability", max_probability, minimum=0.0, maximum=1.0)
    return float(_target_probability(pi))


def wrap_probabilities(probabilities) -> np.ndarray:
    """The wrapped law of a probability vector ``P`` (all outcomes, fail included):
    ``[P[target], (1 - P[target]) P]``."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"probabilities must be a non-empty 1-d vector, got shape {p.shape}")
    t = float(_target_probability(p.max()))
    return np.concatenate([[t], (1.0 - t) * p])


def binary_worst_case_q(eps_a: float, epsilon_b: float, num: int = 2000) -> tuple[float, float]:
    """Scan the wrapped pairs of a binary ``eps_A``-DP mechanism and return ``(worst q, worst DP level)``.

    A binary mechanism is a pair of probabilities ``(s0, s1)`` of one outcome on neighbouring inputs with
    all four ratios ``s0/s1``, ``(1 - s0)/(1 - s1)`` (and inverses) at most ``e^{eps_A}``.  The worst case lies
    where a ratio constraint is tight, so for ``num`` evenly spaced values of ``s1`` in ``(0, 1)`` (plus
    geometrically spaced ones down to ``1e-6`` from either end, where the infimum is approached) the scan
    takes each ``s0`` that makes one constraint tight and is feasible.  ``q`` is
    :func:`mechanisms.qtarget.q_star` of the two wrapped laws at level ``epsilon_b``; the DP level is the
    largest ``|ln ratio|`` of the wrapped laws.
    """
    eps_a = check_real("eps_a", eps_a, minimum=0.0, min_open=True)
    epsilon_b = check_real("epsilon_b", epsilon_b, minimum=0.0, min_open=True)
    num = check_int("num", num, minimum=2)
    e = math.exp(eps_a)
    edge = np.geomspace(1e-6, 1e-2, 48)
    s1 = np.unique(np.concatenate([np.linspace(0.0, 1.0, num + 2)[1:-1], edge, 1 - edge]))
    s0 = np.concatenate([s1 * e, s1 / e, 1 - (1 - s1) * e, 1 - (1 - s1) / e])
    s1 = np.tile(s1, 4)
    slack = 1 + 1e-12
    ok = (s0 > 0) & (s0 < 1)
    ok &= (s0 <= e * s1 * slack) & (s1 <= e * s0 * slack)
    ok &= ((1 - s0) <= e * (1 - s1) * slack) & ((1 - s1) <= e * (1 - s0) * slack)
    s0, s1 = s0[ok], s1[ok]

    def wrapped(s):
        t = _target_probability(np.maximum(s, 1 - s))
        return np.stack([t, (1 - t) * (1 - s), (1 - t) * s], axis=1)

    w0, w1 = wrapped(s0), wrapped(s1)
    q = float(q_star_rows(w0, w1, epsilon_b, 0).min())
    level = float(np.abs(np.log(w0) - np.log(w1)).max())
    return q, level


class ApproximateInnerCertificate(NamedTuple):
    """What :func:`approximate_inner_certificate` found for one pair of inner laws: the pure pair
    ``(pure0, pure1)`` (``eps_A``-indistinguishable, each within a ``(1 - delta_A)`` mixture of the real law),
    the ``q`` of the wrapped pure pair at level ``2 eps_A``, and ``weight``, the smallest ``w`` with
    ``W(P_b) >= (1 - w) W(pure_b)`` for both worlds (``W`` the wrapper)."""

    pure0: np.ndarray
    pure1: np.ndarray
    q: float
    weight: float


def approximate_inner_certificate(p0, p1, eps_a: float, delta_a: float) -> ApproximateInnerCertificate | None:
    """Certify, for one neighbouring pair of inner laws ``p0, p1`` (vectors over the same outcomes, fail
    included), the step of the target-charging proof for an ``(eps_A, delta_A)`` inner mechanism.

    Finds, by a linear program, distributions ``pure0, pure1`` with ``(1 - delta_A) pure_b <= p_b`` pointwise
    and ``pure0 / pure1`` within ``[e^{-eps_A}, e^{eps_A}]`` everywhere (such a pair exists for every
    ``(eps_A, delta_A)``-indistinguishable pair, by Kairouz, Oh and Viswanath's reduction to the canonical
    four-outcome pair), then reports the wrapped pure pair's ``q`` at level ``2 eps_A`` and the mixture
    weight ``w`` that the accountant must pay per query (``1 - (1 - delta_A)^2`` by the proof).  ``None``
    when the linear program finds no such pair (then the inner is not ``(eps_A, delta_A)``-DP on this pair).
    Meant for tests at moderate parameters (probabilities well above the solver's ``1e-9`` tolerance).
    """
    from scipy.optimize import linprog

    p0 = np.asarray(p0, dtype=np.float64)
    p1 = np.asarray(p1, dtype=np.float64)
    eps_a = check_real("eps_a", eps_a, minimum=0.0, min_open=True)
    delta_a = check_real("delta_a", delta_a, minimum=0.0, maximum=1.0, max_open=True)
    m = p0.size
    e = math.exp(eps_a) * (1.0 - 1e-7)  # solve slightly inside the ratio bound
    scale = 1.0 / (1.0 - delta_a * (1.0 - 1e-6))
    bounds = [(0.0, min(1.0, x * scale)) for x in np.concatenate([p0, p1])]
    a_eq = np.zeros((2, 2 * m))
    a_eq[0, :m] = 1.0
    a_eq[1, m:] = 1.0
    eye = np.eye(m)
    a_ub = np.block([[eye, -e * eye], [-e * eye, eye]])
    result = linprog(np.zeros(2 * m), A_ub=a_ub, b_ub=np.zeros(2 * m), A_eq=a_eq, b_eq=[1.0, 1.0], bounds=bounds)
    if result.status != 0:
        return None
    pure0, pure1 = np.clip(result.x[:m], 0.0, None), np.clip(result.x[m:], 0.0, None)
    pure0, pure1 = pure0 / pure0.sum(), pure1 / pure1.sum()
    w0, w1 = wrap_probabilities(pure0), wrap_probabilities(pure1)
    q = float(q_star_rows(w0[None, :], w1[None, :], 2.0 * eps_a, 0)[0])
    weight = 0.0
    for real, pure in ((wrap_probabilities(p0), w0), (wrap_probabilities(p1), w1)):
        positive = pure > 0
        weight = max(weight, float(np.max(1.0 - real[positive] / pure[positive], initial=0.0)))
    return ApproximateInnerCertificate(pure0, pure1, q, weight)


@attr.s(frozen=True, slots=True, eq=False)
class WrappedDistribution:
    """The exact output law of a wrapped mechanism on one input: ``target`` is ``P[target]``; the inner
    outcomes keep their relative weights, scaled by ``1 - target`` (``tokens``/``probabilities``/``fail``
    as in ``OutcomeDistribution``).  ``inner`` is the unwrapped law."""

    target: float = attr.ib(converter=float)
    inner: OutcomeDistribution = attr.ib()

    @property
    def tokens(self) -> np.ndarray:
        return self.inner.tokens

    @property
    def probabilities(self) -> np.ndarray:
        return (1.0 - self.target) * self.inner.probabilities

    @property
    def fail(self) -> float:
        return (1.0 - self.target) * self.inner.fail

    def probability(self, outcome) -> float:
        """Probability of ``TARGET`` (``"target"``), ``None`` (fail) or a token."""
        if isinstance(outcome, str):
            if outcome != TARGET:
                raise ValueError(f"unknown outcome {outcome!r}: use {TARGET!r}, None (fail) or a token id")
            return self.target
        return (1.0 - self.target) * self.inner.probability(outcome)

    def as_dict(self) -> dict:
        """``{token: p, None: fail, "target": P[target]}``."""
        out = {key: (1.0 - self.target) * p for key, p in self.inner.as_dict().items()}
        out[TARGET] = self.target
        return out

    def vector(self) -> np.ndarray:
        """``[P[target], P[fail], P[tokens[0]], ...]`` (the layout :func:`wrap_probabilities` uses)."""
        return np.concatenate([[self.target, self.fail], self.probabilities])


def _inner_epsilon(inner) -> float:
    event = getattr(inner, "event", None)
    eps = getattr(event, "epsilon", None)
    if eps is None:
        raise TypeError(
            f"BoundaryWrapper needs an inner mechanism whose event has an epsilon (a DP mechanism); "
            f"{type(inner).__name__} announces {type(event).__name__}"
        )
    eps = check_real("inner.event.epsilon", eps, minimum=0.0)
    if eps == 0.0:
        raise ValueError("inner.event.epsilon must be > 0 for a boundary wrapper (got 0.0)")
    if eps > MAX_STEP_EPSILON:  # q takes e^{2 eps_A}: the per-run range of a mechanism (docs/ranges.md)
        raise ValueError(f"inner.event.epsilon must lie in (0, {MAX_STEP_EPSILON:g}] for a boundary wrapper, got {eps:g}")
    return eps


def _check_inner(instance, attribute, value):
    if not callable(getattr(value, "output_distribution", None)):
        raise TypeError(
            f"BoundaryWrapper needs an inner mechanism with an exact output_distribution(histogram); "
            f"{type(value).__name__} has none"
        )
    _inner_epsilon(value)


@attr.s(frozen=True, slots=True)
class BoundaryWrapper(Mechanism):
    """``BoundaryWrapper(inner)``: ``target`` with probability ``(1 - pi') / (2 - pi')`` (``<= 1/3``), else a
    sample of ``inner`` (module docstring).  Neighbouring relation: that of ``inner.event`` (by default one
    teacher's vote changes, paper Observation 1).

    A call passes its keyword arguments on to ``inner.output_distribution`` (``num_teachers=``, or ``token=``
    for a wrapped ``BetweenThresholds``), so its input is whatever the inner mechanism takes."""

    inner = attr.ib(validator=_check_inner)

    @property
    def inner_epsilon(self) -> float:
        """``eps_A``, the inner event's epsilon."""
        return _inner_epsilon(self.inner)

    @property
    def epsilon(self) -> float:
        """The privacy level of the target: ``2 eps_A``."""
        return 2.0 * self.inner_epsilon

    @property
    def q(self) -> float:
        """The ``q`` charged for the target at level :attr:`epsilon` (:func:`boundary_wrapper_q`)."""
        return boundary_wrapper_q(self.inner_epsilon)

    @property
    def event(self) -> BoundaryWrapperEvent:
        return BoundaryWrapperEvent(self.inner.event, epsilon=self.epsilon, q=self.q)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """The wrapped bound of the inner mechanism's claim (``mechanisms.base.wrapped_claim``): ``(2 eps_A,
        2 delta_A)`` (``pate_accountant.tct.wrapped_event_terms``), under the inner relation; for a pure inner
        also the target, a ``q``-target at the level and ``q`` the event charges."""
        inner = privacy_claim_of(self.inner)
        if not isinstance(inner, EpsilonDeltaClaim):
            raise TypeError(f"the inner mechanism claims {type(inner).__name__}, not (epsilon, delta)-DP")
        return claim_under(wrapped_claim(inner, self.event), relation, type(self).__name__)

    def output_distribution(self, histogram, **kwargs) -> WrappedDistribution:
        """The exact wrapped law on ``histogram`` (``kwargs`` go to ``inner.output_distribution``)."""
        inner = self.inner.output_distribution(histogram, **kwargs)
        if not isinstance(inner, OutcomeDistribution):
            raise TypeError(
                f"{type(self.inner).__name__}.output_distribution must return an OutcomeDistribution, "
                f"got {type(inner).__name__}"
            )
        return WrappedDistribution(target_from_outside_mass(mass_outside_max(inner)), inner)

    def __call__(self, histogram, rng: np.random.Generator | None = None, **kwargs) -> Release:
        """One wrapped run: ``Release(None, target_hit=True)`` for the target, else
        ``Release(token or None, target_hit=False)``.  The target is a Bernoulli draw with the exact
        ``P[target]``, then the inner outcome is drawn from the inner law; both go through
        :meth:`mechanisms.base.OutcomeDistribution.sample` (``rng=None``: the OS's randomness)."""
        dist = self.output_distribution(histogram, **kwargs)
        rng = random_bits(rng)  # one bit source for the coin and the inner draw
        coin = OutcomeDistribution(np.zeros(1, dtype=np.int64), np.array([dist.target]), 1.0 - dist.target)
        if dist.target > 0.0 and coin.sample(rng) is not None:
            return Release(None, self.event, target_hit=True)
        return Release(dist.inner.sample(rng), self.event, target_hit=False)

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised inner laws plus the target: ``(sample, tokens, probabilities, target)`` where the
        first three list the inner mechanism's positive-probability tokens (unscaled, sorted by histogram)
        and ``target[i]`` is ``P[target]`` on histogram ``i``.  Uses ``inner.batch_distributions`` when it
        exists, otherwise one :meth:`output_distribution` per histogram."""
        batch = as_batch(batch)
        fail = None  # the rest of each histogram's mass, unless the inner laws state it
        if callable(getattr(self.inner, "batch_distributions", None)):
            sample, tokens, probs = self.inner.batch_distributions(batch)
            sample = np.asarray(sample, dtype=np.int64)
            tokens = np.asarray(tokens, dtype=np.int64)
            probs = np.asarray(probs, dtype=np.float64)
            stated = getattr(self.inner, "batch_fail", None)
            fail = stated(batch) if callable(stated) else None  # from the fail side, where the inner states it
        else:
            parts = [self.inner.output_distribution(h) for h in batch]
            sample = np.repeat(np.arange(len(parts)), [d.tokens.size for d in parts]).astype(np.int64)
            tokens = np.concatenate([np.asarray(d.tokens, dtype=np.int64) for d in parts] + [np.zeros(0, np.int64)])
            probs = np.concatenate([np.asarray(d.probabilities, dtype=np.float64) for d in parts] + [np.zeros(0)])
            fail = np.array([float(d.fail) for d in parts])
        outside = outside_mass_rows(sample, probs, batch.num_histograms, fail)
        return sample, tokens, probs, target_from_outside_mass(outside)

    def _run_batch(self, batch, source) -> BatchRelease:
        """Run on every histogram of a batch: ``values[i]`` is the released token, ``FAIL_VALUE`` for fail
        *and* for the target; ``target_hit[i]`` tells the two apart.  Two exact draws per histogram
        (:func:`mechanisms.base.sample_batch_outcomes`): a Bernoulli with the target probability, then the
        inner outcome."""
        sample, tokens, probs, target = self.batch_distributions(batch)
        n = batch.num_histograms
        everyone = np.arange(n, dtype=np.int64)
        hit = sample_batch_outcomes(everyone, np.zeros(n, dtype=np.int64), target, n, source) != FAIL_VALUE
        values = sample_batch_outcomes(sample, tokens, probs, n, source)
        values = np.where(hit, FAIL_VALUE, values)
        return BatchRelease(values, self.event, target_hit=hit)
