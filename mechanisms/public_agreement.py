"""Public agreement by a sparse vector test: Amin et al.'s private prediction ("Private prediction for large-scale
synthetic text generation", arXiv 2407.12108), a mechanism over the teachers' next-token *distributions* that
spends privacy only where the private data disagrees with the public model.

Each step reads the ``m <= B`` active teachers' log-probabilities and the public model's (the public prompt and the
released tokens: public) and asks whether the teachers agree with the public model:

    q = | sum_{i active} (a_i - a_pub) |_1,

where ``a_i`` is teacher ``i``'s distribution over the vocabulary at temperature 1, rounded to ``Q`` integer units
(``resolution``, :func:`mechanisms.averaged_distributions.quantise`), and ``a_pub`` the public model's, rounded the
same way; an absent teacher counts as agreeing with the public model.  ``q / (B Q)`` is the L1 distance between the
teachers' mean distribution and the public one (Amin et al.'s distance, in ``[0, 2]``), kept as an exact integer.

An **episode** is one AboveThreshold run (Dwork and Roth 2014, Algorithm 1, Theorem 3.23) over these queries, with
discrete Laplace noise on integers: it draws a noisy threshold ``T + Z_T`` once, where ``T = ceil(theta B Q)``
(``threshold``: ``theta``), ``P[Z_T = z] ~ exp(-gamma_T |z|)`` and ``gamma_T = svt_epsilon / (2 Delta)``; each step
draws ``Z_q`` with ``gamma_q = svt_epsilon / (4 Delta)`` and answers

* ``below`` when ``q + Z_q < T + Z_T``: the teachers agree with the public model; the step releases nothing and
  the generator appends the public model's token (a public fallback, charged nothing);
* ``above`` otherwise: a private token is drawn by InvisibleInk's clipped-logit exponential mechanism at
  ``draw_epsilon`` (:class:`mechanisms.clipped_logits.ClippedLogitSampling`, the same teachers, support and
  temperature), and the episode ends.  The next step opens a new episode.

Privacy (docs/mechanisms/public_agreement.md).  ``Delta = 2 Q``: under replace-one one teacher's term
``a_i - a_pub`` becomes another's or vanishes, under add-remove-one one appears or vanishes, and
``|a_i - a'_i|_1 <= 2 Q``, ``|a_i - a_pub|_1 <= 2 Q`` (vectors of non-negative integers summing to ``Q``), so every
query moves by at most ``Delta`` under either relation.  AboveThreshold with these noises is ``svt_epsilon``-DP for
any number of ``below`` answers and queries chosen adaptively from the released tokens: the proof of Theorem 3.23
shifts the threshold noise by ``Delta`` and the query noise of the ``above`` step by ``2 Delta``, integers here, so
it holds for the discrete Laplace law as written.  The draw adds ``draw_epsilon`` bounded range.  An episode is
charged when it opens (:class:`~pate_accountant.events.SparseVectorEpisodeEvent`: ``epsilon`` pure, ``rho =
svt_epsilon^2 / 2 + draw_epsilon^2 / 8``-zCDP for the RDP accountant); the steps of an open episode charge nothing
(``NoOpDpEvent``).  An episode the record ends before its ``above`` was charged in full.  The tests enumerate the
exact law of every transcript over every pair of neighbouring query sequences of small cases, and the query's
sensitivity over every neighbouring pair of small ensembles (:func:`mechanisms.testing.check_episodic_mechanism`).

We differ from Amin et al. in three deliberate ways: the noise is discrete and drawn exactly; the distance is kept
on an integer grid so that its sensitivity holds exactly; the private draw is the clipped-logit exponential
mechanism against the public model (InvisibleInk's), where Amin et al. clip each teacher's logits around its own
maximum.
"""

from __future__ import annotations

import math
from fractions import Fraction

import attr
import numpy as np
from dp_accounting import dp_event

from mechanisms.averaged_distributions import quantise
from mechanisms.base import (
    DISTRIBUTIONS,
    EpsilonDeltaClaim,
    check_distribution_inputs,
    claim_under,
    distribution_settings,
    relation_field,
    top_k_field,
)
from mechanisms.clipped_logits import MAX_TEACHERS, MIN_EPSILON, ClippedLogitSampling
from mechanisms.randomness import RandomBits, random_bits
from pate_accountant.events import REPLACE_ONE, SparseVectorEpisodeEvent
from pate_accountant.release import BELOW, Release
from pate_accountant.validation import attrs_validator, check_delta, check_epsilon, check_int, check_real

__all__ = ["RESOLUTION", "THRESHOLD", "Episode", "SparseVectorPublicAgreement", "discrete_laplace_cdf",
           "transcript_law"]

#: The units each distribution is rounded to (``Q``).  The noise is calibrated in the same units.
RESOLUTION = 256
#: The default ``theta``: Amin et al.'s threshold on the L1 distance between the teachers' mean and the public
#: distribution (their reported setting; the distance lies in ``[0, 2]``).
THRESHOLD = 0.7


def _share(instance, attribute, value):
    check_real("svt_share", value, minimum=0.0, maximum=1.0, min_open=True, max_open=True)


def discrete_laplace_cdf(gamma: float, x) -> np.ndarray:
    """``P[Z <= x]`` for ``P[Z = z] = (1 - r) / (1 + r) r^|z|``, ``r = e^-gamma`` (integer ``x``, any array)."""
    r = math.exp(-float(gamma))
    x = np.asarray(x, dtype=np.float64)
    below = r ** np.abs(x) / (1.0 + r)  # x < 0: sum_{z <= x} = r^{|x|} / (1 + r)
    above = 1.0 - r ** (np.maximum(x, -1.0) + 1.0) / (1.0 + r)  # x >= 0: one less P[Z >= x + 1]
    return np.where(x < 0, below, above)


def transcript_law(queries, threshold: int, gamma_threshold: float, gamma_query: float,
                   reach: int | None = None) -> np.ndarray:
    """The law of one AboveThreshold episode over the integer ``queries`` (module docstring): entry ``k < L`` is
    ``P[below^k above]``, entry ``L`` is ``P[below^L]`` (no ``above`` within the queries).  The threshold noise is
    summed over ``|z| <= reach`` (default: where its mass falls below ``1e-40``), the query noise in closed form."""
    q = np.asarray(queries, dtype=np.int64)
    if reach is None:
        reach = int(math.ceil(40 * math.log(10) / float(gamma_threshold))) + 1
    z = np.arange(-reach, reach + 1)
    r = math.exp(-float(gamma_threshold))
    weight = (1.0 - r) / (1.0 + r) * r ** np.abs(z)
    level = threshold + z  # the noisy threshold
    out = np.zeros(q.size + 1)
    still = weight.copy()  # P[Z_T = z and below so far]
    for k, value in enumerate(q):
        below = discrete_laplace_cdf(gamma_query, level - value - 1)  # q + Z_q < level
        out[k] = float((still * (1.0 - below)).sum())
        still = still * below
    out[q.size] = float(still.sum())
    return out


class Episode:
    """The state of one AboveThreshold run: its noisy threshold while open (``None``: the next step opens one).
    Secret: it lives in the generator's aggregation scheme, never in a result, log or ledger."""

    __slots__ = ("level",)

    def __init__(self):
        self.level = None

    def __repr__(self) -> str:
        return f"Episode({'open' if self.level is not None else 'closed'})"


@attr.s(frozen=True, slots=True)
class SparseVectorPublicAgreement:
    """Amin et al.'s public agreement by a sparse vector test (module docstring) at ``epsilon`` an episode under
    ``relation``, for at most ``num_teachers`` teachers: ``svt_share`` of it for the test, the rest for the private
    draw; ``threshold`` is ``theta``; ``temperature`` and ``top_k`` are the draw's (``None``: the whole vocabulary).

    ``mechanism(teacher_logprobs, public_logprobs, rng=None, episode=None)`` answers one step: a token id
    (``above``: the private draw) or ``"below"`` (agreement: the caller appends the public model's token).  The
    event of a call is the episode's when it opens one, else ``NoOpDpEvent``.  Without ``episode`` every call is
    an episode of its own."""

    epsilon: float = attr.ib(converter=lambda value: check_epsilon("epsilon", value))
    num_teachers: int = attr.ib(validator=attrs_validator(check_int, minimum=1, maximum=MAX_TEACHERS))
    relation: str = attr.ib(default=REPLACE_ONE, validator=relation_field)
    temperature: float = attr.ib(default=1.0, converter=float,
                                 validator=attrs_validator(check_real, minimum=0.0, min_open=True))
    top_k: int | None = attr.ib(default=None, validator=top_k_field)
    threshold: float = attr.ib(default=THRESHOLD, converter=float,
                               validator=attrs_validator(check_real, minimum=0.0, maximum=2.0))
    svt_share: float = attr.ib(default=0.5, converter=float, validator=_share)
    resolution: int = attr.ib(default=RESOLUTION, validator=attrs_validator(check_int, minimum=1, maximum=2**16))

    #: What the generation loop hands the mechanism each step; and that it keeps an :class:`Episode`.
    inputs = DISTRIBUTIONS
    episodic = True

    def __attrs_post_init__(self):
        if self.draw_epsilon < MIN_EPSILON:
            raise ValueError(f"epsilon {self.epsilon:g} leaves the draw {self.draw_epsilon:g}, below the "
                             f"{MIN_EPSILON:g} clipped-logit sampling takes")

    # -- calibration -----------------------------------------------------------------------------------
    @property
    def svt_epsilon(self) -> float:
        return self.epsilon * self.svt_share

    @property
    def draw_epsilon(self) -> float:
        return self.epsilon - self.svt_epsilon

    @property
    def sensitivity(self) -> int:
        """``Delta = 2 Q``: how far one neighbour moves a query, under either relation (module docstring)."""
        return 2 * self.resolution

    @property
    def threshold_units(self) -> int:
        """``T = ceil(theta B Q)``."""
        return int(math.ceil(self.threshold * self.num_teachers * self.resolution))

    @property
    def gammas(self) -> tuple[Fraction, Fraction]:
        """The discrete Laplace rates ``(gamma_T, gamma_q) = (svt_epsilon / (2 Delta), svt_epsilon / (4 Delta))``,
        exact."""
        e = Fraction(self.svt_epsilon)
        return e / (2 * self.sensitivity), e / (4 * self.sensitivity)

    @property
    def draw(self) -> ClippedLogitSampling:
        """The private draw at ``draw_epsilon``."""
        return ClippedLogitSampling(self.draw_epsilon, self.num_teachers, self.relation, self.temperature,
                                    self.top_k)

    @property
    def event(self) -> SparseVectorEpisodeEvent:
        """The charge of one episode (the worst case of a call)."""
        return SparseVectorEpisodeEvent(self.svt_epsilon + self.draw_epsilon, 0.0, self.relation,
                                        svt_epsilon=self.svt_epsilon, draw_epsilon=self.draw_epsilon)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """``(epsilon, 0)``-DP an episode under the calibrated relation."""
        return claim_under(EpsilonDeltaClaim(self.event.epsilon, 0.0, self.relation), relation, type(self).__name__)

    @property
    def claimed_relations(self) -> tuple[str, ...]:
        return (self.relation,)

    @classmethod
    def for_run(cls, epsilon: float, delta: float, relation: str, num_teachers: int) -> SparseVectorPublicAgreement:
        """What ``generate --mechanism svt-public-agreement`` builds from a step ``(epsilon, delta)``: ``epsilon``
        an episode (pure; ``delta`` is only checked); the generator sets the temperature and the support."""
        check_delta("delta", delta)
        return cls(epsilon, num_teachers, relation)

    def with_settings(self, *, temperature: float | None = None,
                      top_k: int | None = None) -> SparseVectorPublicAgreement:
        """The same privacy at another temperature or support of the draw (``top_k=0``: the whole vocabulary)."""
        return distribution_settings(self, temperature=temperature, top_k=top_k)

    # -- the query -------------------------------------------------------------------------------------
    def query(self, teacher_logprobs, public_logprobs) -> int:
        """``q``: the rounded L1 distance of the teachers from the public model, in units (module docstring)."""
        teachers, public = check_distribution_inputs(teacher_logprobs, public_logprobs, self.num_teachers)
        rows = np.vstack([public[None, :], teachers])
        top = rows.max(axis=1, keepdims=True)
        weights = np.exp(rows - np.where(np.isfinite(top), top, 0.0))
        units = quantise(weights, self.resolution)
        return int(np.abs((units[1:] - units[0]).sum(axis=0)).sum())

    def __call__(self, teacher_logprobs, public_logprobs, rng: np.random.Generator | RandomBits | None = None,
                 episode: Episode | None = None) -> Release:
        """One step (module docstring).  ``rng``: ``None`` for the operating system's cryptographic randomness, a
        ``numpy.random.Generator`` for reproducible runs (tests only)."""
        source = random_bits(rng)
        episode = Episode() if episode is None else episode
        gamma_threshold, gamma_query = self.gammas
        value = self.query(teacher_logprobs, public_logprobs)
        opened = episode.level is None
        if opened:
            episode.level = self.threshold_units + source.discrete_laplace(gamma_threshold)
        event = self.event if opened else dp_event.NoOpDpEvent()
        if value + source.discrete_laplace(gamma_query) < episode.level:
            return Release(BELOW, event)
        episode.level = None  # the episode ends with its above
        token = self.draw.output_distribution(teacher_logprobs, public_logprobs).sample(source)
        return Release(token, event)

    def __repr__(self) -> str:
        k = "all" if self.top_k is None else self.top_k
        return (f"SparseVectorPublicAgreement(epsilon={self.epsilon:g} an episode (test {self.svt_epsilon:g}, draw "
                f"{self.draw_epsilon:g}), num_teachers={self.num_teachers}, relation={self.relation!r}, "
                f"threshold={self.threshold:g}, temperature={self.temperature:g}, top_k={k}, "
                f"resolution={self.resolution})")
