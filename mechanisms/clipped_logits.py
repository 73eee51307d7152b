"""Clipped-logit sampling: InvisibleInk's aggregation of teacher distributions (Vinod, Pillutla and Thakurta,
arXiv 2507.02974), a mechanism over the teachers' next-token *distributions* rather than their votes.

One step reads the ``m <= B`` active teachers' log-probabilities ``z_i`` over the vocabulary and the public
model's ``z_pub`` (the public prompt and the released tokens: public), and releases one token of the public
support ``S`` drawn from

    P[v] proportional to exp(s_v),    s_v = (z_pub[v] + (1 / B) sum_i clip(z_i[v] - z_pub[v], -C, C)) / tau,

the exponential mechanism with utility ``s`` (the paper's DClip aggregate at temperature ``tau``).  ``B`` is
the configured number of teachers (fixed and public, never the count of active ones: a teacher that is absent
or has left adds nothing, as if it agreed with the public model).  ``S`` is the public model's top-``k``
widened by a band of ``2 C``: every token ``v`` with ``z_pub[v] >= z_pub_(k) - 2 C``, where ``z_pub_(k)`` is
the ``k``-th largest public log-probability (the whole vocabulary when ``top_k`` is ``None``).  Since each
``s_v tau`` lies within ``C`` of ``z_pub[v]``, a token outside ``S`` is below each of the public top ``k``
in ``s``: ``S`` holds the aggregate's top ``k`` (the paper's top-k+ set; its code takes the narrower band
``2 C / B``, which is as private, since ``S`` is a function of public data either way).  A token the public
model gives probability zero is never released.

Privacy (docs/mechanisms/clipped_logits.md).  Neighbouring ensembles: one teacher's distribution changes
arbitrarily (replace-one: the teacher's records changed) or one teacher joins or leaves (add-remove-one).
Each teacher's term lies in ``[-C, C]`` coordinate-wise, so a neighbour moves every ``s_v`` by
``d_v`` with ``d_v`` in ``[-w C / (B tau), w C / (B tau)]``, ``w = 2`` under replace-one (one term
becomes another) and ``w = 1`` under add-remove-one (one term appears or vanishes).  The log-ratio of the
two laws at ``v`` is ``d_v - log(Z / Z')``: its range over ``v`` is at most ``2 w C / (B tau)``.  The clip
is set so that this range is ``epsilon``: the step is ``epsilon``-bounded-range
(:class:`~pate_accountant.events.BoundedRangeEvent`), hence ``epsilon``-DP and ``epsilon**2 / 8``-zCDP.
The support does not move (it is public).  The tests check the bounded range, the pure ratio and the Renyi
divergences by exact enumeration over neighbouring pairs of small ensembles
(:func:`mechanisms.testing.check_distribution_mechanism`).

Floating point: the law is computed in float64 (log-sum-exp) and drawn exactly from those floats
(:meth:`~mechanisms.base.OutcomeDistribution.sample`).  The clip is calibrated to ``epsilon`` less the float
margins (:data:`CLIP_MARGIN`, :data:`ABSOLUTE_MARGIN`) so that the rounding of the sum and the scores stays inside
the stated ``epsilon``; the enumeration checks the float law with no tolerance.

Log-probabilities: this project's backends give probabilities, so ``z`` is the log-probability at
temperature 1 (the paper clips raw logits; a teacher's logits and log-probabilities differ by a constant of
that teacher alone, so either is a function of one teacher's data and the analysis is the same).  A
probability of zero is ``-inf``: its difference from a finite public value clips to ``-C``, and two zeros
differ by nothing.
"""

from __future__ import annotations

import attr
import numpy as np

from mechanisms.base import (
    DISTRIBUTIONS,
    EpsilonDeltaClaim,
    OutcomeDistribution,
    check_distribution_inputs,
    claim_under,
    distribution_settings,
    relation_field,
    top_k_field,
)
from mechanisms.randomness import RandomBits, random_bits
from pate_accountant.events import REPLACE_ONE, BoundedRangeEvent
from pate_accountant.release import Release
from pate_accountant.validation import attrs_validator, check_delta, check_epsilon, check_int, check_real

__all__ = ["ABSOLUTE_MARGIN", "CLIP_MARGIN", "ClippedLogitSampling", "clip_for"]

#: The clip is calibrated to ``epsilon (1 - CLIP_MARGIN - B^2 2^-50) - ABSOLUTE_MARGIN`` (module docstring): the
#: float64 sum of ``B`` clipped terms is off by at most ``B^2 2^-53 C``, and the scores, their exponentials and
#: the normalisation by a few units in the last place of scores of magnitude below about ``10^3``; the margins
#: hold each below the stated ``epsilon``, so the float law's range stays within it.
CLIP_MARGIN = 1e-9
ABSOLUTE_MARGIN = 1e-11
#: The smallest step epsilon (below it the margins above would be a visible share of it).
MIN_EPSILON = 1e-6
#: The most teachers (``B^2 2^-50`` stays below ``1e-6``).
MAX_TEACHERS = 30_000


def _min_epsilon(instance, attribute, value):
    if value < MIN_EPSILON:
        raise ValueError(f"epsilon must be at least {MIN_EPSILON:g} for clipped-logit sampling, got {value:g} "
                         "(the float margins of the clip would be a visible share of it)")


def clip_for(epsilon: float, num_teachers: int, temperature: float, relation: str) -> float:
    """The clip ``C`` at which one step is ``epsilon``-bounded-range (module docstring):
    ``epsilon B tau / (2 w)`` with ``w = 2`` under replace-one and ``1`` under add-remove-one, for ``epsilon``
    less the float margins (:data:`CLIP_MARGIN`)."""
    width = 2 if relation == REPLACE_ONE else 1
    effective = epsilon * (1.0 - CLIP_MARGIN - num_teachers * num_teachers * 2.0 ** -50) - ABSOLUTE_MARGIN
    return effective * num_teachers * temperature / (2.0 * width)


@attr.s(frozen=True, slots=True)
class ClippedLogitSampling:
    """InvisibleInk's clipped-logit exponential mechanism (module docstring) at per-step bounded range
    ``epsilon`` for ``num_teachers`` configured teachers under ``relation``; ``temperature`` (``tau``) and
    ``top_k`` (the public support's ``k``, ``None``: the whole vocabulary) are utility settings that leave
    ``epsilon`` unchanged (the clip follows them).

    ``mechanism(teacher_logprobs, public_logprobs, rng=None)`` releases a token id; ``teacher_logprobs`` is an
    ``(m, V)`` array (``m <= num_teachers`` active teachers), ``public_logprobs`` a ``(V,)`` one.  It never
    fails."""

    epsilon: float = attr.ib(converter=lambda value: check_epsilon("epsilon", value), validator=_min_epsilon)
    num_teachers: int = attr.ib(validator=attrs_validator(check_int, minimum=1, maximum=MAX_TEACHERS))
    relation: str = attr.ib(default=REPLACE_ONE, validator=relation_field)
    temperature: float = attr.ib(default=1.0, converter=float,
                                 validator=attrs_validator(check_real, minimum=0.0, min_open=True))
    top_k: int | None = attr.ib(default=None, validator=top_k_field)

    #: What the generation loop hands the mechanism each step.
    inputs = DISTRIBUTIONS

    @property
    def clip(self) -> float:
        """``C``: :func:`clip_for` of the settings."""
        return clip_for(self.epsilon, self.num_teachers, self.temperature, self.relation)

    @property
    def event(self) -> BoundedRangeEvent:
        return BoundedRangeEvent(self.epsilon, 0.0, self.relation)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """``(epsilon, 0)``-DP under the calibrated relation; the bounded range and the zCDP parameter are the
        event's (:class:`~pate_accountant.events.BoundedRangeEvent`)."""
        return claim_under(EpsilonDeltaClaim(self.epsilon, 0.0, self.relation), relation, type(self).__name__)

    @property
    def claimed_relations(self) -> tuple[str, ...]:
        return (self.relation,)

    @classmethod
    def for_run(cls, epsilon: float, delta: float, relation: str, num_teachers: int) -> ClippedLogitSampling:
        """What ``generate --mechanism clipped-logit-sampling`` builds from a step ``(epsilon, delta)``: the step
        is pure, so ``delta`` is only checked (in range, as every mechanism's), and the generator sets the
        temperature and the public support (:meth:`with_settings`)."""
        check_delta("delta", delta)
        return cls(epsilon, num_teachers, relation)

    def with_settings(self, *, temperature: float | None = None, top_k: int | None = None) -> ClippedLogitSampling:
        """The same privacy at another temperature or public support (``top_k=0``: the whole vocabulary)."""
        return distribution_settings(self, temperature=temperature, top_k=top_k)

    # -- the law ---------------------------------------------------------------------------------------
    def _inputs(self, teacher_logprobs, public_logprobs) -> tuple[np.ndarray, np.ndarray]:
        return check_distribution_inputs(teacher_logprobs, public_logprobs, self.num_teachers)

    def support(self, public_logprobs) -> np.ndarray:
        """The sorted token ids of the public support ``S`` (module docstring): a function of the public
        log-probabilities alone."""
        public = np.asarray(public_logprobs, dtype=np.float64)
        finite = np.isfinite(public)
        if self.top_k is None or self.top_k >= int(finite.sum()):
            return np.flatnonzero(finite)
        kth = np.partition(public[finite], -self.top_k)[-self.top_k]
        return np.flatnonzero(public >= kth - 2.0 * self.clip)

    def scores(self, teacher_logprobs, public_logprobs) -> tuple[np.ndarray, np.ndarray]:
        """``(support, s)``: the public support and the scores ``s_v`` on it (module docstring)."""
        teachers, public = self._inputs(teacher_logprobs, public_logprobs)
        support = self.support(public)
        base = public[support]
        clip = self.clip
        with np.errstate(invalid="ignore"):
            difference = teachers[:, support] - base  # -inf - finite = -inf; base is finite on the support
        terms = np.clip(difference, -clip, clip)
        return support, (base + terms.sum(axis=0) / self.num_teachers) / self.temperature

    def output_distribution(self, teacher_logprobs, public_logprobs) -> OutcomeDistribution:
        """The exact law of one step: ``softmax(s)`` over the support (computed stably in float64)."""
        support, s = self.scores(teacher_logprobs, public_logprobs)
        weights = np.exp(s - s.max())
        return OutcomeDistribution(support.astype(np.int64), weights / weights.sum(), 0.0)

    def __call__(self, teacher_logprobs, public_logprobs, rng: np.random.Generator | RandomBits | None = None
                 ) -> Release:
        """One step: a token of the support drawn exactly from :meth:`output_distribution`.  ``rng``: ``None``
        for the operating system's cryptographic randomness, a ``numpy.random.Generator`` for reproducible runs
        (tests only)."""
        source = random_bits(rng)
        token = self.output_distribution(teacher_logprobs, public_logprobs).sample(source)
        return Release(token, self.event)

    def __repr__(self) -> str:
        k = "all" if self.top_k is None else self.top_k
        return (f"ClippedLogitSampling(epsilon={self.epsilon:g}, num_teachers={self.num_teachers}, "
                f"relation={self.relation!r}, temperature={self.temperature:g}, top_k={k}, clip={self.clip:.4g})")
