"""Poisson-subsampled teachers: each teacher's vote enters a step with probability ``rate`` (issue 34, lever 5).

At every run, each teacher is kept with probability ``q`` on fresh coins of the mechanism's own randomness (never
seen by anyone), and the inner mechanism runs on the votes of the kept teachers alone (on an empty histogram when
none is kept: the mechanism must be the inner one on every subset, the empty one included, for the bound below).  Keeping each of the ``c_j`` teachers who voted ``j`` independently is the same as
drawing the kept count ``k_j ~ Binomial(c_j, q)`` for every vote value (tokens and the tail), independently, which
is how it is drawn here, exactly (:meth:`~mechanisms.randomness.RandomBits.bernoulli`, one coin per teacher).

**The claim** (Balle, Barthe and Gaboardi 2018, "Privacy amplification by subsampling", Theorem 2, advanced joint
convexity: for ``mu = (1 - q) mu0 + q mu1`` and ``mu' = (1 - q) mu0 + q mu1'``, ``gamma >= 1``,
``gamma' = 1 + q (gamma - 1)`` and ``beta = gamma' / gamma``,
``D_gamma'(mu || mu') = q D_gamma(mu1 || (1 - beta) mu0 + beta mu1')``; the hockey-stick divergence is convex in
its second argument).  Let the inner mechanism ``M`` be ``(eps, delta)``-DP under add-remove-one (a teacher and its
vote join or leave).  Condition on the other teachers' coins; ``A`` is ``M`` without the teacher that differs,
``B`` and ``B'`` with its two votes.

* add-remove-one: the two laws are ``(1 - q) A + q B`` and ``A``; both directions are at most ``q delta`` at
  ``gamma' = 1 + q (e^eps - 1)``: ``(log(1 + q (e^eps - 1)), q delta)``.
* replace-one: the two laws are ``(1 - q) A + q B`` and ``(1 - q) A + q B'``; ``B`` against ``A`` is within
  ``(eps, delta)`` and ``B`` against ``B'`` within the group bound ``(2 eps, (1 + e^eps) delta)`` (remove, then
  add), so at ``gamma = e^(2 eps)`` both are at most ``(1 + e^eps) delta``:
  ``(log(1 + q (e^(2 eps) - 1)), q (1 + e^eps) delta)``.

The mixture over the other teachers' coins keeps both bounds.  Against the inner run on every vote
(replace-one: about ``2 eps`` for a mechanism calibrated under add-remove-one) the charge falls about ``q``-fold
for small ``eps``; the price is that a step sees about ``q n`` votes, so a threshold the inner mechanism sets
from its histogram's ``n`` (DPArgMax's majority) is set from the kept votes.  ``tests/test_subsampled.py`` proves
the claim by exact enumeration (the contract suite over every neighbouring pair of small histograms, each law the
exact mixture over all kept sub-histograms).
"""

from __future__ import annotations

import itertools
import math

import attr
import numpy as np
from scipy import stats

from mechanisms.base import EpsilonDeltaClaim, Mechanism, OutcomeDistribution, privacy_claim_of
from mechanisms.histogram import CountHistogram, as_histogram
from pate_accountant.events import ADD_REMOVE_ONE, NEIGHBOURING_RELATIONS, REPLACE_ONE, SubsampledTeachersEvent
from pate_accountant.release import Release
from pate_accountant.validation import check_real

__all__ = ["SubsampledTeachers", "subsampled_terms"]


def subsampled_terms(epsilon: float, delta: float, rate: float, relation: str) -> tuple[float, float]:
    """The ``(epsilon, delta)`` of a run on Poisson-subsampled teachers at ``rate`` whose inner mechanism is
    ``(epsilon, delta)``-DP under add-remove-one, under ``relation`` (module docstring)."""
    if relation == ADD_REMOVE_ONE:
        base, spread = float(epsilon), float(delta)
    else:
        base, spread = 2.0 * float(epsilon), (1.0 + math.exp(float(epsilon))) * float(delta)
    return math.log1p(rate * math.expm1(base)), rate * spread


def _kept(tokens: np.ndarray, kept: np.ndarray, num_teachers: int, vocab_size) -> CountHistogram:
    """The histogram of the kept votes (tokens no kept teacher voted for left out)."""
    keep = kept > 0
    return CountHistogram(tokens[keep], kept[keep], num_teachers=num_teachers, vocab_size=vocab_size)


def _relation(instance, attribute, value):
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")


@attr.s(frozen=True, slots=True)
class SubsampledTeachers(Mechanism):
    """``inner`` (calibrated under add-remove-one) on the votes of the teachers a Poisson draw at ``rate`` keeps,
    afresh at every run; the claim under ``relation`` is amplified as the module docstring proves."""

    inner = attr.ib()
    rate: float = attr.ib(converter=float)
    relation: str = attr.ib(default=REPLACE_ONE, validator=_relation)

    @rate.validator
    def _check_rate(self, attribute, value):
        check_real("rate", value, minimum=0.0, maximum=1.0, min_open=True)

    def __attrs_post_init__(self):
        try:
            claim = privacy_claim_of(self.inner, ADD_REMOVE_ONE)
        except ValueError:
            raise ValueError("the inner mechanism of subsampled teachers must be calibrated under add-remove-one "
                             "(its claim when a teacher joins or leaves)") from None
        if not isinstance(claim, EpsilonDeltaClaim):
            raise ValueError(f"the inner mechanism must claim (epsilon, delta)-DP, got {type(claim).__name__}")
        if subsampled_terms(claim.epsilon, claim.delta, self.rate, self.relation)[1] >= 1.0:
            raise ValueError(f"subsampled teachers at rate {self.rate:g}: the inner delta {claim.delta:g} gives no "
                             f"guarantee under {self.relation}")

    @property
    def event(self) -> SubsampledTeachersEvent:
        claim = privacy_claim_of(self.inner, ADD_REMOVE_ONE)
        epsilon, delta = subsampled_terms(claim.epsilon, claim.delta, self.rate, self.relation)
        return SubsampledTeachersEvent(epsilon=epsilon, delta=delta, relation=self.relation, rate=self.rate,
                                       inner_epsilon=claim.epsilon, inner_delta=claim.delta, inner=self.inner.event)

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact law: the mixture of the inner laws over every kept sub-histogram, each with its binomial
        weight (for small histograms: the number of sub-histograms is the product of ``c_j + 1``)."""
        hist = as_histogram(histogram, num_teachers)
        tokens, counts = np.asarray(hist.tokens, dtype=np.int64), np.asarray(hist.counts, dtype=np.int64)
        tail = int(hist.num_teachers - counts.sum())
        sizes = [int(c) for c in counts] + [tail]
        laws = [stats.binom.pmf(np.arange(c + 1), c, self.rate) for c in sizes]
        total: dict = {}
        fail = 0.0
        for kept in itertools.product(*(range(c + 1) for c in sizes)):
            weight = math.prod(float(law[k]) for law, k in zip(laws, kept))
            if weight == 0.0:
                continue
            sub = _kept(tokens, np.asarray(kept[:-1], dtype=np.int64), int(sum(kept)), hist.vocab_size)
            law = self.inner.output_distribution(sub)
            fail += weight * float(law.fail)
            for token, p in zip(law.tokens, law.probabilities):
                total[int(token)] = total.get(int(token), 0.0) + weight * float(p)
        keys = sorted(total)
        return OutcomeDistribution(np.asarray(keys, dtype=np.int64), np.asarray([total[k] for k in keys]), fail)

    def _run(self, histogram, source) -> Release:
        counts = np.asarray(histogram.counts, dtype=np.int64)
        tail = int(histogram.num_teachers - counts.sum())
        kept = np.array([sum(source.bernoulli(self.rate) for _ in range(int(c))) for c in counts], dtype=np.int64)
        kept_tail = sum(source.bernoulli(self.rate) for _ in range(tail))
        sub = _kept(np.asarray(histogram.tokens, dtype=np.int64), kept, int(kept.sum()) + kept_tail,
                    histogram.vocab_size)
        return Release(self.inner(sub, source).value, self.event)
