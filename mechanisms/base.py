"""Shared pieces of the mechanism contract: the :class:`Mechanism` base class, privacy claims, exact output
laws, batch releases, and exact sampling from a finite law.

A mechanism is a frozen attrs value object with

* an ``event`` (a ``dp_accounting.DpEvent``, known before it runs): what an accountant charges for one run;
* a :meth:`~Mechanism.privacy_claim`: the guarantee the mechanism's own analysis proves under a neighbouring
  relation, as data (:class:`EpsilonDeltaClaim`, optionally with a :class:`TargetClaim`, or
  :class:`ThresholdClaim`), the way a measurement carries its privacy map.  The contract checks of
  :mod:`mechanisms.testing` read it: the exact law must respect it on every neighbouring pair of small
  histograms, and the event must charge at least as much;
* an exact ``output_distribution(histogram)`` (an :class:`OutcomeDistribution`);
* ``mechanism(histogram, rng=None) -> Release`` and ``run_batch(batch, rng=None) -> BatchRelease``.

:class:`Mechanism` holds the shared plumbing (histogram coercion, the bit source, building the ``Release`` or
``BatchRelease``); a subclass supplies ``event`` and ``output_distribution`` and, when it samples otherwise
than by one exact draw from its law, ``_run`` / ``_run_batch``.
"""

from __future__ import annotations

import functools

import abc
import bisect

import attr
import numpy as np

from mechanisms.histogram import as_batch, as_histogram
from mechanisms.randomness import RandomBits, random_bits
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    EpsilonDeltaEvent,
    ThresholdPrivacyEvent,
)
from pate_accountant.release import TARGET, Release, batch_outcome_classes
from pate_accountant.tct import wrapped_event_terms
from pate_accountant.validation import check_int, check_real

__all__ = [
    "DISTRIBUTIONS",
    "FAIL_VALUE",
    "BatchRelease",
    "EpsilonDeltaClaim",
    "Mechanism",
    "OutcomeDistribution",
    "TargetClaim",
    "ThresholdClaim",
    "claim_from_event",
    "claim_under",
    "check_distribution_inputs",
    "claimed_relations_of",
    "distribution_settings",
    "gauss_legendre_unit",
    "privacy_claim_of",
    "reads_distributions",
    "relation_field",
    "top_k_field",
    "sample_batch_outcomes",
    "wrapped_claim",
]


#: The ``inputs`` of a mechanism over teacher *distributions* (:mod:`mechanisms.clipped_logits`): each step it
#: reads the active teachers' and the public model's next-token log-probabilities, not a vote histogram.
DISTRIBUTIONS = "distributions"


def reads_distributions(mechanism) -> bool:
    """Whether ``mechanism`` runs on teacher distributions (``mechanism(teacher_logprobs, public_logprobs, rng)``)
    rather than on a vote histogram."""
    return getattr(mechanism, "inputs", None) == DISTRIBUTIONS


def relation_field(instance, attribute, value) -> None:
    """The attrs validator of a mechanism's ``relation`` over distributions: one of the neighbouring relations."""
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")


def top_k_field(instance, attribute, value) -> None:
    """The attrs validator of a public support's ``top_k``: ``None`` (the whole vocabulary) or at least 1."""
    if value is not None:
        check_int("top_k", value, minimum=1)


def distribution_settings(mechanism, *, temperature=None, top_k=None):
    """``mechanism`` (an attrs mechanism over distributions) at another ``temperature`` or public support
    (``top_k=0``: the whole vocabulary); ``None`` keeps the setting.  The settings leave the privacy unchanged."""
    changes = {}
    if temperature is not None:
        changes["temperature"] = temperature
    if top_k is not None:
        changes["top_k"] = None if top_k == 0 else top_k
    return attr.evolve(mechanism, **changes)


def check_distribution_inputs(teacher_logprobs, public_logprobs, num_teachers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(teachers, public)`` as float64 arrays of shapes ``(m, V)`` and ``(V,)``, ``m <= num_teachers``;
    log-probabilities (finite or ``-inf``), the public ones not all ``-inf``; a one-line ``ValueError`` naming the
    argument otherwise."""
    public = np.asarray(public_logprobs, dtype=np.float64)
    teachers = np.asarray(teacher_logprobs, dtype=np.float64)
    if public.ndim != 1 or public.size == 0:
        raise ValueError(f"public_logprobs must be a non-empty 1-d vector, got shape {public.shape}")
    if teachers.ndim != 2 or teachers.shape[1] != public.size:
        raise ValueError(f"teacher_logprobs must have shape (m, {public.size}), got {teachers.shape}")
    if teachers.shape[0] > num_teachers:
        raise ValueError(f"teacher_logprobs holds {teachers.shape[0]} teachers, more than the configured "
                         f"num_teachers={num_teachers}")
    for name, values in (("teacher_logprobs", teachers), ("public_logprobs", public)):
        if np.isnan(values).any() or (values == np.inf).any():
            raise ValueError(f"{name} must hold log-probabilities (finite or -inf)")
    if not np.isfinite(public).any():
        raise ValueError("public_logprobs gives every token probability zero")
    return teachers, public


@functools.lru_cache(maxsize=64)
def gauss_legendre_unit(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on ``[0, 1]`` (read-only, cached): exact for polynomials of degree
    ``< 2 num_nodes``.  The one quadrature of the exact laws (DPWeightedSampling's inclusion integrals, the
    truncated-geometric NoisyArgMax and GNMax tie integrals)."""
    from scipy.special import roots_legendre

    nodes, weights = roots_legendre(num_nodes)
    nodes, weights = (nodes + 1.0) / 2.0, weights / 2.0
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


@attr.s(frozen=True, slots=True, eq=False)
class OutcomeDistribution:
    """The exact output distribution of a mechanism on one histogram.

    ``tokens[k]`` is released with probability ``probabilities[k]``; ``fail`` is the probability of the
    fail outcome.  Tokens not listed have probability zero.
    """

    tokens: np.ndarray = attr.ib()
    probabilities: np.ndarray = attr.ib()
    fail: float = attr.ib(converter=float)

    def probability(self, token) -> float:
        """Probability of ``token`` (``None`` for the fail outcome)."""
        if token is None:
            return self.fail
        hit = np.flatnonzero(self.tokens == token)
        return float(self.probabilities[hit[0]]) if hit.size else 0.0

    def as_dict(self) -> dict:
        out = {int(t): float(p) for t, p in zip(self.tokens, self.probabilities) if p > 0}
        out[None] = self.fail
        return out

    @property
    def max_probability(self) -> float:
        """The probability of the most likely outcome (fail included)."""
        return float(max(self.fail, self.probabilities.max() if self.probabilities.size else 0.0))

    def sample(self, rng: np.random.Generator | RandomBits | None = None):
        """Draw one outcome exactly: a token id, or ``None`` for fail.

        The law drawn from is the listed one, normalised exactly: the float probabilities and ``fail`` are
        read as the exact rationals they store, and outcome ``k`` comes out with probability exactly
        ``w_k / sum(w)`` (``mechanisms.randomness.RandomBits.categorical``: one uniform integer below the
        common-denominator total, no float rounding).  A certain outcome is returned without drawing, and
        a law with no mass at all is fail.  ``rng``: ``None`` for the operating system's cryptographic
        randomness, a ``numpy.random.Generator`` for reproducible draws (tests only), or a ``RandomBits``.
        """
        source = random_bits(rng)
        if self.fail >= 1.0 or self.tokens.size == 0:
            return None
        if self.tokens.size == 1 and self.probabilities[0] >= 1.0:
            return int(self.tokens[0])
        weights = [float(p) for p in np.asarray(self.probabilities, dtype=np.float64)] + [max(float(self.fail), 0.0)]
        bad = [i for i, w in enumerate(weights) if not (w >= 0.0 and w < float("inf"))]
        if bad:
            name = "fail" if bad[0] == len(weights) - 1 else f"probabilities[{bad[0]}]"
            raise ValueError(f"{name} must be a finite probability >= 0, got {weights[bad[0]]}")
        if not any(weights):
            return None
        k = source.categorical(weights)
        return int(self.tokens[k]) if k < self.tokens.size else None


#: The value a batch release uses for the fail outcome.
FAIL_VALUE = -1


@attr.s(frozen=True, slots=True, eq=False)
class BatchRelease:
    """What a mechanism releases on each histogram of a batch: ``values[i]`` is the token released on
    histogram ``i`` (``FAIL_VALUE`` for fail), ``target_hit[i]`` whether a target outcome occurred
    (``None`` for mechanisms without a target).  Each histogram is charged ``event`` once."""

    values: np.ndarray = attr.ib()
    event = attr.ib()
    target_hit: np.ndarray | None = attr.ib(default=None)
    #: The ledger's outcome class of each entry, when the values alone do not say it (BetweenThresholds'
    #: ``below``); ``None``: derived by :attr:`outcomes`.
    classes: np.ndarray | None = attr.ib(default=None, kw_only=True)

    def __len__(self) -> int:
        return int(self.values.size)

    @property
    def failed(self) -> np.ndarray:
        return self.values == FAIL_VALUE

    @property
    def outcomes(self) -> np.ndarray:
        """The outcome class of each entry, as :attr:`pate_accountant.Release.outcome` names it: ``"target"``
        on a target hit, ``"fail"`` for ``FAIL_VALUE``, else ``"token"`` (or the mechanism's own ``classes``)."""
        if self.classes is not None:
            return np.asarray(self.classes)
        hit = np.zeros(self.values.shape, dtype=bool) if self.target_hit is None else np.asarray(self.target_hit)
        return batch_outcome_classes(hit, self.failed)


def sample_batch_outcomes(
    sample: np.ndarray, tokens: np.ndarray, probabilities: np.ndarray, num_histograms: int, rng=None
) -> np.ndarray:
    """Draw one outcome per histogram from per-histogram token probabilities (the rest is fail), exactly.

    ``sample``/``tokens``/``probabilities`` list the positive-probability tokens of each histogram,
    sorted by histogram.  Histogram ``h`` releases its ``i``-th token when ``C_{i-1} <= U < C_i`` for the
    exact running sums ``C_i`` of its (float) probabilities, and fails when ``U >= C_last``; ``U`` is
    uniform.  Fast path: the first 64 bits of ``U`` (one word per histogram) are compared with float64
    running sums taken within each histogram (never across histograms); that comparison is certain
    whenever the word is further than ``(width + 3) 2^-52`` from every running sum (a bound on the float
    error of a sum of ``width`` probabilities), and otherwise (probability about ``width^2 2^-51``) the
    histogram is decided exactly: the running sums as integers over their common power-of-two
    denominator ``2^E``, compared with ``floor(2^E U)`` (more bits of ``U`` drawn when ``E > 64``).
    ``rng``: ``None`` (the operating system's cryptographic randomness), a ``numpy.random.Generator``
    (reproducible) or a ``RandomBits``.  Returns token ids, ``FAIL_VALUE`` for fail.
    """
    source = random_bits(rng)
    words = source.words(num_histograms)
    out = np.full(num_histograms, FAIL_VALUE, dtype=np.int64)
    if sample.size == 0:
        return out
    uniforms = words.astype(np.float64) * 2.0**-64  # within 2^-53 of the word's value
    starts = np.searchsorted(sample, np.arange(num_histograms + 1))
    sizes = np.diff(starts)
    position = np.arange(sample.size) - starts[sample]
    width = int(sizes.max())
    margin = (width + 3) * 2.0**-52
    rows_per_chunk = max(1, (1 << 20) // width)
    for h0 in range(0, num_histograms, rows_per_chunk):
        h1 = min(num_histograms, h0 + rows_per_chunk)
        e0, e1 = starts[h0], starts[h1]
        table = np.zeros((h1 - h0, width))
        table[sample[e0:e1] - h0, position[e0:e1]] = probabilities[e0:e1]
        running = np.cumsum(table, axis=1)
        index = (running <= uniforms[h0:h1, None]).sum(axis=1)
        close = (np.abs(running - uniforms[h0:h1, None]) <= margin).any(axis=1)
        hit = index < sizes[h0:h1]
        rows = np.flatnonzero(hit)
        out[h0 + rows] = tokens[starts[h0 + rows] + index[rows]]
        for row in np.flatnonzero(close):
            h = h0 + row
            k = _exact_index(probabilities[starts[h] : starts[h + 1]], int(words[h]), source)
            out[h] = tokens[starts[h] + k] if k < sizes[h] else FAIL_VALUE
    return out


def _exact_index(probabilities: np.ndarray, word: int, source: RandomBits) -> int:
    """The least ``i`` with ``U < C_i`` (exact running sums of ``probabilities``), for a uniform ``U`` whose
    first 64 bits are ``word``; ``len(probabilities)`` when ``U`` is beyond them all (fail)."""
    ratios = [float(p).as_integer_ratio() for p in probabilities]
    scale_bits = max(den.bit_length() - 1 for _, den in ratios)  # every denominator is a power of two
    running, total = [], 0
    for num, den in ratios:
        total += num << (scale_bits - (den.bit_length() - 1))
        running.append(total)
    if scale_bits <= 64:
        scaled = word >> (64 - scale_bits)
    else:
        scaled = (word << (scale_bits - 64)) | source.bits(scale_bits - 64)
    return bisect.bisect_right(running, scaled)


# -- privacy claims -----------------------------------------------------------------------------------------
def _relation(instance, attribute, value):
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"{attribute.name} must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")


def _epsilon(value) -> float:
    return check_real("epsilon", value, minimum=0.0)


def _delta(value) -> float:
    return check_real("delta", value, minimum=0.0, maximum=1.0)


@attr.s(frozen=True, slots=True)
class TargetClaim:
    """``outcome`` is a ``q``-target at privacy level ``epsilon``: on every neighbouring pair the two output
    laws split as ``P_b = p C + (1 - p) B_b`` with a shared part ``C`` and parts ``B_0``, ``B_1`` that are
    (pure) ``epsilon``-indistinguishable and each put at least ``q`` on ``outcome``
    (:func:`mechanisms.qtarget.q_star` is the best such ``q`` of one pair).  ``outcome`` is a key of the law's
    ``as_dict()``: a token or outcome code, or ``"target"`` for a wrapped mechanism."""

    outcome = attr.ib()
    epsilon: float = attr.ib(converter=_epsilon)
    q: float = attr.ib(converter=lambda v: check_real("q", v, minimum=0.0, maximum=1.0, min_open=True))


@attr.s(frozen=True, slots=True)
class EpsilonDeltaClaim:
    """The release is ``(epsilon, delta)``-DP under ``relation``: for every neighbouring pair of histograms
    ``(c, c')`` and every set ``S`` of outcomes, ``P[S | c] <= e^epsilon P[S | c'] + delta``.  ``target``
    (optional) adds a q-target claim (:class:`TargetClaim`) that holds on the same pairs."""

    epsilon: float = attr.ib(converter=_epsilon)
    delta: float = attr.ib(converter=_delta)
    relation: str = attr.ib(validator=_relation)
    target: TargetClaim | None = attr.ib(default=None, kw_only=True)

    @target.validator
    def _check_target(self, attribute, value):
        if value is not None and not isinstance(value, TargetClaim):
            raise TypeError(f"target must be a TargetClaim or None, got {type(value).__name__}")


@attr.s(frozen=True, slots=True)
class ThresholdClaim:
    """Threshold privacy (paper Section 4.3): no token with fewer than ``threshold`` votes is ever released.
    A proxy for DP, not a DP guarantee; it holds whatever the neighbouring relation."""

    threshold: int = attr.ib(converter=lambda v: check_int("threshold", v, minimum=1))


def claim_from_event(event):
    """The claim an event states on its face: ``EpsilonDeltaEvent`` (and subclasses) its ``(epsilon, delta)``,
    ``BetweenThresholdsEvent`` ``(epsilon, 0)``, ``BoundaryWrapperEvent`` the wrapped bound of its inner
    event (``2 eps_A``, about ``2 delta_A``: :func:`pate_accountant.tct.wrapped_event_terms`) with its target
    at ``(event.epsilon, event.q)`` when the inner is pure, ``ThresholdPrivacyEvent`` a :class:`ThresholdClaim`.
    Any other event is a ``TypeError``: a mechanism announcing it must state its claim itself."""
    if isinstance(event, ThresholdPrivacyEvent):
        return ThresholdClaim(event.threshold)
    if isinstance(event, EpsilonDeltaEvent):
        return EpsilonDeltaClaim(event.epsilon, event.delta, event.relation)
    if isinstance(event, BetweenThresholdsEvent):
        return EpsilonDeltaClaim(event.epsilon, 0.0, event.relation)
    if isinstance(event, BoundaryWrapperEvent):
        inner = claim_from_event(event.inner)
        if not isinstance(inner, EpsilonDeltaClaim):
            raise TypeError(f"a boundary wrapper needs a DP inner event, got {type(event.inner).__name__}")
        return wrapped_claim(inner, event)
    raise TypeError(
        f"no privacy claim can be read from a {type(event).__name__}: give the mechanism a privacy_claim(relation)"
    )


def wrapped_claim(inner: EpsilonDeltaClaim, event: BoundaryWrapperEvent) -> EpsilonDeltaClaim:
    """The claim of the boundary wrapper around an inner mechanism claiming ``inner``: ``(eps, delta)`` from
    :func:`pate_accountant.tct.wrapped_event_terms`, and, for a pure inner, the target at the level and
    ``q`` the event charges (``(event.epsilon, event.q)``; an approximate inner's target is certified
    per query with a mixture weight instead, which no single pair shows)."""
    epsilon, delta = wrapped_event_terms(inner.epsilon, inner.delta)
    target = TargetClaim(TARGET, event.epsilon, event.q) if inner.delta == 0.0 else None
    return EpsilonDeltaClaim(epsilon, delta, inner.relation, target=target)


def claim_under(claim, relation: str | None, owner: str = "the mechanism"):
    """``claim`` if it holds under ``relation`` (``None``: the claim's own relation), else a ``ValueError``.
    A threshold claim holds under every relation."""
    if relation is None:
        return claim
    if relation not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {relation!r}")
    if isinstance(claim, EpsilonDeltaClaim) and claim.relation != relation:
        raise ValueError(
            f"{owner} claims nothing under relation {relation!r}: it is calibrated under {claim.relation!r}"
        )
    return claim


def privacy_claim_of(mechanism, relation: str | None = None):
    """``mechanism.privacy_claim(relation)`` when it has one, else the claim read from its event
    (:func:`claim_from_event`): so the checks of :mod:`mechanisms.testing` also take mechanisms that do not
    subclass :class:`Mechanism`."""
    method = getattr(mechanism, "privacy_claim", None)
    if callable(method):
        return method(relation)
    return claim_under(claim_from_event(mechanism.event), relation, type(mechanism).__name__)


def claimed_relations_of(mechanism) -> tuple[str, ...]:
    """The relations ``mechanism`` claims a guarantee under: its DP claim's relation, or every relation for a
    threshold claim."""
    claim = privacy_claim_of(mechanism)
    return (claim.relation,) if isinstance(claim, EpsilonDeltaClaim) else NEIGHBOURING_RELATIONS


# -- the base class -----------------------------------------------------------------------------------------
class Mechanism(abc.ABC):
    """Base class of the aggregation mechanisms (subclasses are frozen, slotted attrs classes).

    A subclass supplies :attr:`event` and :meth:`output_distribution`; by default a run is one exact draw
    from that law (:meth:`OutcomeDistribution.sample`) and a batch run one exact draw per histogram from
    :meth:`batch_distributions` (:func:`sample_batch_outcomes`).  A mechanism that samples its noise
    directly overrides ``_run(histogram, source) -> Release`` and ``_run_batch(batch, source) ->
    BatchRelease``, which receive the coerced ``CountHistogram`` / ``HistogramBatch`` and the bit source.

    Its privacy claim is :meth:`privacy_claim`; the default reads it from the event
    (:func:`claim_from_event`), and a mechanism whose analysis proves more (a smaller delta, a q-target)
    overrides it.  The neighbouring relation is the one the claim names (by default one teacher's vote
    moves, paper Observation 1).
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def event(self):
        """The privacy event of one run (a ``dp_accounting.DpEvent``), known before it runs."""

    @abc.abstractmethod
    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        """The exact law of one run on ``histogram``."""

    # -- privacy ---------------------------------------------------------------------------------------
    def privacy_claim(self, relation: str | None = None):
        """The guarantee of one run under ``relation`` (``None``: the relation the mechanism is calibrated
        under): an :class:`EpsilonDeltaClaim` (with an optional :class:`TargetClaim`) or a
        :class:`ThresholdClaim`.  A ``ValueError`` when the mechanism claims nothing under ``relation``."""
        return claim_under(claim_from_event(self.event), relation, type(self).__name__)

    @property
    def claimed_relations(self) -> tuple[str, ...]:
        """The neighbouring relations :meth:`privacy_claim` answers for."""
        return claimed_relations_of(self)

    # -- running ---------------------------------------------------------------------------------------
    def __call__(self, histogram, rng: np.random.Generator | RandomBits | None = None,
                 num_teachers: int | None = None) -> Release:
        """One run on ``histogram`` (a ``CountHistogram``/``VoteHistogram``, a dense count vector or a
        ``{token: count}`` mapping; ``num_teachers`` overrides its ``n``).  ``rng``: ``None`` for the operating
        system's cryptographic randomness, a ``numpy.random.Generator`` for reproducible runs (tests only),
        or a ``RandomBits``."""
        hist = as_histogram(histogram, num_teachers)
        return self._run(hist, random_bits(rng))

    def _run(self, histogram, source: RandomBits) -> Release:
        return Release(self.output_distribution(histogram).sample(source), self.event)

    def batch_fail(self, batch) -> np.ndarray | None:
        """The fail probability of every histogram of a batch, computed from the fail side itself (so it keeps
        its relative precision when it is tiny), or ``None`` when the mechanism states none and a batch's fail
        is the rest of each histogram's mass, ``1 - sum``.  :class:`~mechanisms.boundary_wrapper.BoundaryWrapper`
        reads it: near a certain token, ``1 - sum`` keeps only the digits of ``1e-16 / fail``."""
        return None

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`output_distribution` of every histogram of a batch: ``(histogram, token, probability)`` of
        each token with positive probability, sorted by histogram (the rest of each histogram's mass is
        fail).  This default calls :meth:`output_distribution` once per distinct histogram of the batch."""
        batch = as_batch(batch)
        seen: dict = {}
        laws = []
        for h in batch:
            key = (h.tokens.tobytes(), h.counts.tobytes())
            if key not in seen:
                seen[key] = self.output_distribution(h)
            laws.append(seen[key])
        keep = [np.asarray(d.probabilities, dtype=np.float64) > 0 for d in laws]
        sample = np.repeat(np.arange(len(laws)), [int(k.sum()) for k in keep]).astype(np.int64)
        tokens = np.concatenate([np.asarray(d.tokens, dtype=np.int64)[k] for d, k in zip(laws, keep)]
                                + [np.zeros(0, np.int64)])
        probs = np.concatenate([np.asarray(d.probabilities, dtype=np.float64)[k] for d, k in zip(laws, keep)]
                               + [np.zeros(0)])
        return sample, tokens, probs

    def run_batch(self, batch, rng: np.random.Generator | RandomBits | None = None) -> BatchRelease:
        """One run on every histogram of ``batch`` (a ``HistogramBatch``, a sequence of histograms or a 2-d
        count matrix); each histogram is charged :attr:`event` once.  ``rng`` as for a single run."""
        batch = as_batch(batch)
        return self._run_batch(batch, random_bits(rng))

    def _run_batch(self, batch, source: RandomBits) -> BatchRelease:
        sample, tokens, probs = self.batch_distributions(batch)
        return BatchRelease(sample_batch_outcomes(sample, tokens, probs, batch.num_histograms, source), self.event)
