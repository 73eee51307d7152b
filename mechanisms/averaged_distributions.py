"""Gaussian on averaged distributions: Tang et al.'s aggregation of teacher distributions ("Privacy-preserving
in-context learning with differentially private few-shot generation", arXiv 2309.11765, the Gaussian
variant), a mechanism over the teachers' next-token *distributions*.

One step reads the ``m <= B`` active teachers' log-probabilities ``z_i`` and the public model's ``z_pub`` (the
public prompt and the released tokens: public).  The support ``S`` is the public model's top ``k`` tokens (the
paper's reduced vocabulary from the public model; the whole vocabulary of tokens the public model gives mass
when ``top_k`` is ``None``).  Each teacher's distribution at temperature ``tau`` is restricted to ``S`` and
renormalised (uniform on ``S`` when it gives ``S`` no mass), then rounded to ``Q`` integer units
(``resolution``) by largest remainders, so that teacher ``i`` contributes a vector ``a_i`` of non-negative
integers summing to exactly ``Q``.  The step releases

    S[argmax_v (h_v + Y_v)],    h = sum_i a_i,    Y_v ~ N_Z(0, sigma^2) independent and untruncated,

ties to the lowest token id.  This is the paper's noisy average ``(1 / M) sum_i p_i + N(0, sigma_c^2)`` up to
the factor ``Q M`` (the argmax does not see it) and the rounding of each ``p_i`` to ``1 / Q``; the noise is
the discrete Gaussian of Canonne, Kamath and Steinke (2020), drawn exactly
(:meth:`~mechanisms.randomness.RandomBits.discrete_gaussian`), not a float Gaussian.

Privacy (docs/mechanisms/averaged_distributions.md).  Neighbouring ensembles: one teacher's distribution
changes arbitrarily (replace-one: ``a_i`` becomes ``b``) or one teacher joins or leaves (add-remove-one).  For
non-negative integer vectors summing to ``Q`` (or the zero vector of an absent teacher),
``|a - b|_2^2 = |a|^2 + |b|^2 - 2 a.b <= 2 Q^2`` and ``|a|_2^2 <= Q^2``: the L2 sensitivity of ``h`` is
``Delta^2 = 2 Q^2`` under replace-one and ``Q^2`` under add-remove-one.  Adding ``N_Z(0, sigma^2)`` to each
coordinate of an integer vector of L2 sensitivity ``Delta`` is ``Delta^2 / (2 sigma^2)``-zCDP (CKS,
Theorem 14), and the argmax is post-processing.  The mechanism is calibrated to a step ``(epsilon, delta)``:
``rho`` is the largest whose zCDP conversion (:func:`~pate_accountant.events.zcdp_epsilon`) is ``epsilon``
at ``delta`` (less :data:`EPSILON_MARGIN`), and ``sigma^2 = Delta^2 / (2 rho)``.  The event
(:class:`~pate_accountant.events.DiscreteGaussianSumEvent`) carries ``rho`` for the RDP accountant and the
``(epsilon, delta)`` for every other.  ``sigma`` does not depend on the number of teachers: the signal ``h``
grows with them, the noise does not.  The tests check the sensitivity over every neighbouring pair of small
ensembles, and the Renyi divergences and the ``(epsilon, delta)`` of the exact output law
(:func:`mechanisms.testing.check_distribution_mechanism`).

Not here: the paper's Poisson subsampling of teachers per token (privacy amplification); its exponential
variant.  Releasing the argmax is greedy: the records have the diversity the noise gives them.
"""

from __future__ import annotations

import math
from fractions import Fraction

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
from mechanisms.gaussian import count_groups, noise_check_histogram, noise_tables
from mechanisms.randomness import RandomBits, random_bits
from pate_accountant.events import (
    REPLACE_ONE,
    DiscreteGaussianSumEvent,
    zcdp_rho,
)
from pate_accountant.release import Release
from pate_accountant.validation import attrs_validator, check_delta, check_epsilon, check_int, check_real

__all__ = ["EPSILON_MARGIN", "RESOLUTION", "GaussianAveragedDistributions", "quantise"]

#: The units each teacher's distribution on the support is rounded to (``Q``): a probability is kept to
#: ``1 / Q``.  The noise is calibrated in the same units, so ``Q`` changes the rounding, not the privacy.
RESOLUTION = 1024
#: The share of the step epsilon left unused, so that the float rounding of ``rho`` and ``sigma^2`` stays
#: inside the stated ``(epsilon, delta)``.
EPSILON_MARGIN = 1e-9
#: The most teachers (the counts stay far inside int64).
MAX_TEACHERS = 1_000_000
#: Noise values beyond this many ``sigma`` are left out of the exact law (their mass is below ``e^-800``).
LAW_SIGMAS = 40


def quantise(probabilities: np.ndarray, resolution: int) -> np.ndarray:
    """Each row of ``probabilities`` (non-negative, one teacher's law on the support) as non-negative integers
    summing to exactly ``resolution``: the floors of ``resolution * p``, the units still missing given to the
    largest remainders (ties to the lower index; a row of zeros is the uniform law).  A function of one row
    alone."""
    p = np.asarray(probabilities, dtype=np.float64)
    totals = p.sum(axis=1, keepdims=True)
    p = np.where(totals > 0, p / np.where(totals > 0, totals, 1.0), 1.0 / p.shape[1])
    scaled = p * resolution
    base = np.floor(scaled).astype(np.int64)
    remainder = scaled - base
    missing = resolution - base.sum(axis=1)  # in [0, K] (the floors lose less than one unit each)
    every, rest = np.divmod(missing, p.shape[1])
    base += every[:, None]
    for row in np.flatnonzero(rest):  # the rest largest remainders, ties to the lower index
        k = int(rest[row])
        cut = np.partition(remainder[row], -k)[-k]  # the k-th largest remainder
        above = np.flatnonzero(remainder[row] > cut)
        tied = np.flatnonzero(remainder[row] == cut)[: k - above.size]
        base[row, above] += 1
        base[row, tied] += 1
    return base


@attr.s(frozen=True, slots=True)
class GaussianAveragedDistributions:
    """Tang et al.'s Gaussian on averaged distributions (module docstring) at step ``(epsilon, delta)`` under
    ``relation``, for at most ``num_teachers`` teachers; ``temperature`` (the teachers' ``tau``), ``top_k``
    (the public support, ``None``: every token the public model gives mass) and ``resolution`` (``Q``) leave
    the privacy unchanged.

    ``mechanism(teacher_logprobs, public_logprobs, rng=None)`` releases a token id; ``teacher_logprobs`` is an
    ``(m, V)`` array, ``public_logprobs`` a ``(V,)`` one.  It never fails."""

    epsilon: float = attr.ib(converter=lambda value: check_epsilon("epsilon", value))
    delta: float = attr.ib(converter=lambda value: check_delta("delta", value))  # > 0: zCDP gives no pure epsilon
    num_teachers: int = attr.ib(validator=attrs_validator(check_int, minimum=1, maximum=MAX_TEACHERS))
    relation: str = attr.ib(default=REPLACE_ONE, validator=relation_field)
    temperature: float = attr.ib(default=1.0, converter=float,
                                 validator=attrs_validator(check_real, minimum=0.0, min_open=True))
    top_k: int | None = attr.ib(default=None, validator=top_k_field)
    resolution: int = attr.ib(default=RESOLUTION, validator=attrs_validator(check_int, minimum=1, maximum=2**20))

    #: What the generation loop hands the mechanism each step.
    inputs = DISTRIBUTIONS

    @property
    def sensitivity_squared(self) -> int:
        """``Delta^2``: ``2 Q^2`` under replace-one, ``Q^2`` under add-remove-one (module docstring)."""
        return (2 if self.relation == REPLACE_ONE else 1) * self.resolution * self.resolution

    @property
    def sigma_squared(self) -> float:
        """``sigma^2 = Delta^2 / (2 rho)`` for the ``rho`` of the step (rounded up to the next float)."""
        rho = zcdp_rho(self.epsilon * (1.0 - EPSILON_MARGIN), self.delta)
        value = self.sensitivity_squared / (2.0 * rho)
        return math.nextafter(value, math.inf)

    @property
    def event(self) -> DiscreteGaussianSumEvent:
        return DiscreteGaussianSumEvent(self.epsilon, self.delta, self.relation, sigma_squared=self.sigma_squared,
                                        sensitivity_squared=self.sensitivity_squared)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """``(epsilon, delta)``-DP under the calibrated relation; the zCDP ``rho`` is the event's."""
        return claim_under(EpsilonDeltaClaim(self.epsilon, self.delta, self.relation), relation,
                           type(self).__name__)

    @property
    def claimed_relations(self) -> tuple[str, ...]:
        return (self.relation,)

    @classmethod
    def for_run(cls, epsilon: float, delta: float, relation: str, num_teachers: int) -> GaussianAveragedDistributions:
        """What ``generate --mechanism gaussian-averaged-distributions`` builds from a step ``(epsilon, delta)``
        (``delta > 0``); the generator sets the temperature and the public support (:meth:`with_settings`)."""
        return cls(epsilon, delta, num_teachers, relation)

    def with_settings(self, *, temperature: float | None = None,
                      top_k: int | None = None) -> GaussianAveragedDistributions:
        """The same privacy at another temperature or public support (``top_k=0``: the whole vocabulary)."""
        return distribution_settings(self, temperature=temperature, top_k=top_k)

    # -- the aggregate ---------------------------------------------------------------------------------
    def _inputs(self, teacher_logprobs, public_logprobs) -> tuple[np.ndarray, np.ndarray]:
        return check_distribution_inputs(teacher_logprobs, public_logprobs, self.num_teachers)

    def support(self, public_logprobs) -> np.ndarray:
        """The sorted token ids of the public support: the public model's ``top_k`` (ties to the lower id) among
        the tokens it gives mass; a function of the public log-probabilities alone."""
        public = np.asarray(public_logprobs, dtype=np.float64)
        finite = np.flatnonzero(np.isfinite(public))
        if self.top_k is None or self.top_k >= finite.size:
            return finite
        order = np.argsort(-public[finite], kind="stable")[: self.top_k]
        return np.sort(finite[order])

    def counts(self, teacher_logprobs, public_logprobs) -> tuple[np.ndarray, np.ndarray]:
        """``(support, h)``: the public support and the summed rounded distributions on it (module docstring)."""
        teachers, public = self._inputs(teacher_logprobs, public_logprobs)
        support = self.support(public)
        if teachers.shape[0] == 0:
            return support, np.zeros(support.size, dtype=np.int64)
        scores = teachers[:, support] / self.temperature
        top = scores.max(axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):
            weights = np.where(np.isfinite(top), np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
        return support, quantise(weights, self.resolution).sum(axis=0)

    def output_distribution(self, teacher_logprobs, public_logprobs) -> OutcomeDistribution:
        """The law of one step to float64 precision: ``P[v] = sum_x P[Y = x] prod_{u<v} P[Y <= h_v + x - h_u - 1]
        prod_{u>v} P[Y <= h_v + x - h_u]`` (ties to the lower index), over the noise values within
        :data:`LAW_SIGMAS` sigma and the counts' range.  For tests: its work grows with the noise's range."""
        support, h = self.counts(teacher_logprobs, public_logprobs)
        s2 = self.sigma_squared
        reach = int(math.ceil(LAW_SIGMAS * math.sqrt(s2))) + int(h.max() - h.min()) + 2
        values = np.arange(-reach, reach + 1)
        pmf, le = noise_tables(s2, reach)
        out = np.zeros(support.size)
        for v in range(support.size):
            with np.errstate(divide="ignore"):
                log_term = np.log(pmf)
            for u in range(support.size):
                if u != v:
                    with np.errstate(divide="ignore"):
                        log_term = log_term + np.log(le(h[v] + values - h[u] - (1 if u < v else 0)))
            out[v] = float(np.exp(log_term).sum())
        return OutcomeDistribution(support.astype(np.int64), out / out.sum(), 0.0)

    @property
    def sigma(self) -> float:
        """The noise in teachers: ``sigma / Q``, against a token on which ``m`` teachers put all their mass
        (``h = m Q``)."""
        return math.sqrt(self.sigma_squared) / self.resolution

    def noise_release_probability(self, num_teachers: int, vocab_size: int) -> float:
        """The probability that one step releases a token its noise chose, not the teachers, at the step where a
        bare majority ``n // 2 + 1`` of the ``num_teachers`` put all their mass on one token and every other
        teacher on a token of its own (as evenly as the ``vocab_size`` support tokens allow): that another token
        wins (the rule GNMax's plain argmax is judged by, docs/generation.md, "Noise that decides").  Computed with
        each teacher's mass as one unit and the noise ``N_Z(0, (sigma / Q)^2)`` (the step's law with ``Q = 1``):
        the same signal-to-noise ratio, without the rounding to ``Q`` units.  Data-independent."""
        n, size = check_int("num_teachers", num_teachers, minimum=1), check_int("vocab_size", vocab_size, minimum=2)
        counts = noise_check_histogram(n, size, True)
        scale = self.sigma
        if scale > 1e5:  # no step of any realistic ensemble: the noise decides (its law would not fit in memory)
            return 1.0 - 1.0 / size
        groups, multiplicity = count_groups(counts[1:], size - 1)
        top = int(counts[0])
        reach = int(math.ceil(LAW_SIGMAS * scale)) + top + 2
        values = np.arange(-reach, reach + 1)
        pmf, _ = noise_tables(scale * scale, reach)
        cdf = np.cumsum(pmf)
        log_win = np.log(np.maximum(pmf, 1e-320))
        for count, times in zip(groups, multiplicity):  # every other token below or tied with token 0 (ties: 0)
            at = np.clip(top + values - int(count) + reach, -1, 2 * reach)
            below = np.where(at < 0, 0.0, cdf[np.maximum(at, 0)])
            with np.errstate(divide="ignore"):
                log_win = log_win + int(times) * np.log(below)
        return float(min(1.0, max(0.0, 1.0 - np.exp(log_win).sum())))

    def __call__(self, teacher_logprobs, public_logprobs, rng: np.random.Generator | RandomBits | None = None
                 ) -> Release:
        """One step: the support's token of the largest noisy count, the noise drawn exactly (``rng``: ``None``
        for the operating system's cryptographic randomness, a ``numpy.random.Generator`` for reproducible runs,
        tests only)."""
        support, h = self.counts(teacher_logprobs, public_logprobs)
        source = random_bits(rng)
        s2 = Fraction(self.sigma_squared)
        noisy = [int(count) + source.discrete_gaussian(s2) for count in h]
        return Release(int(support[int(np.argmax(noisy))]), self.event)

    def __repr__(self) -> str:
        k = "all" if self.top_k is None else self.top_k
        return (f"GaussianAveragedDistributions(epsilon={self.epsilon:g}, delta={self.delta:g}, "
                f"num_teachers={self.num_teachers}, relation={self.relation!r}, temperature={self.temperature:g}, "
                f"top_k={k}, resolution={self.resolution}, sigma={math.sqrt(self.sigma_squared):.4g})")
