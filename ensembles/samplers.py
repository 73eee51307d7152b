"""Ensemble samplers ``M = A o H`` (paper Section 4.3): a histogram distribution and an aggregator.

``EnsembleSampler(histograms="coordinated", aggregator=A)`` is Hot PATE's ``M^coo_A``: draw a coordinated
histogram (Algorithm 1) and release ``A(c)``; ``histograms="independent"`` is Cold PATE's ``M^ind_A``.
By Corollary 3.1 the sampler inherits the aggregator's privacy: for a fixed shared randomness one
teacher changes at most one vote, so the neighbouring relation is "one teacher's vote changes".
"""

from __future__ import annotations

import attr
import numpy as np

from ensembles.distributions import TeacherDistributions
from ensembles.histograms import coordinated_votes, histograms_from_votes, independent_votes
from ensembles.keyed_votes import check_histograms
from mechanisms.base import OutcomeDistribution
from pate_accountant.release import Release
from pate_accountant.validation import check_generator, check_int

#: Each law of ``ensembles.keyed_votes.HISTOGRAMS`` and its vote kernel.
HISTOGRAM_KINDS = {"coordinated": coordinated_votes, "independent": independent_votes}


def _check_kind(instance, attribute, value):
    check_histograms(value)  # the one check of the histogram law (its message names ``histograms``)


def _check_aggregator(instance, attribute, value):
    if not callable(value) or not hasattr(value, "event"):
        raise TypeError(
            f"{attribute.name} must be a mechanism (callable on a histogram, with an .event), got {type(value).__name__}"
        )


@attr.s(frozen=True, slots=True)
class EnsembleSampler:
    """An ensemble sampler: ``histograms`` is ``"coordinated"`` (Hot PATE) or ``"independent"`` (Cold PATE)."""

    histograms: str = attr.ib(validator=_check_kind)
    aggregator = attr.ib(validator=_check_aggregator)

    @property
    def event(self):
        return self.aggregator.event

    def votes(self, teachers: TeacherDistributions, num_samples: int, rng: np.random.Generator, *,
              num_threads: int | None = None) -> np.ndarray:
        """``num_samples`` vote vectors (one per draw of the histogram), shape ``(num_samples, n)``;
        ``num_threads`` goes to the vote kernel."""
        return HISTOGRAM_KINDS[self.histograms](teachers, num_samples, rng, num_threads=num_threads)

    def sample(self, teachers: TeacherDistributions, rng: np.random.Generator) -> Release:
        """One draw from ``M((p^(i))_i)``: a fresh histogram, then the aggregator."""
        (release,) = self.sample_many(teachers, 1, rng)
        return release

    def sample_many(self, teachers: TeacherDistributions, num_samples: int, rng: np.random.Generator) -> list[Release]:
        """``num_samples`` independent draws (fresh shared randomness for each)."""
        check_generator("rng", rng)
        votes = self.votes(teachers, num_samples, rng)
        return [self.aggregator(h, rng=rng) for h in histograms_from_votes(votes, teachers.vocab_size)]

    def output_distribution(
        self, teachers: TeacherDistributions, num_samples: int, rng: np.random.Generator
    ) -> OutcomeDistribution:
        """Monte Carlo estimate of the aggregate distribution over ``V`` and ``fail``.

        When the aggregator computes its exact output distribution per histogram (``output_distribution``),
        the estimate averages those (a Rao-Blackwellised, lower-variance estimate); otherwise it counts
        the outcomes of ``num_samples`` runs.
        """
        num_samples = check_int("num_samples", num_samples, minimum=1)
        check_generator("rng", rng)
        votes = self.votes(teachers, num_samples, rng)
        totals = np.zeros(teachers.vocab_size)
        fail = 0.0
        exact = getattr(self.aggregator, "output_distribution", None)
        for h in histograms_from_votes(votes, teachers.vocab_size):
            if exact is not None:
                dist = exact(h)
                np.add.at(totals, dist.tokens, dist.probabilities)
                fail += dist.fail
            else:
                release = self.aggregator(h, rng=rng)
                if release.value is None:
                    fail += 1.0
                else:
                    totals[release.value] += 1.0
        tokens = np.flatnonzero(totals)
        return OutcomeDistribution(tokens, totals[tokens] / num_samples, fail / num_samples)
