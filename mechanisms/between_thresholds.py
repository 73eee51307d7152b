"""BetweenThresholds on an integer count (discrete Laplace noise), for the Target-Charging Technique of
the paper's "Privacy analysis considerations".

One query reads one integer count ``c`` (the votes for one token ``v``), adds a fresh integer noise
``Z`` with ``P[Z = z] = (1 - r) / (1 + r) r^{|z|}``, ``r = e^{-epsilon}`` (the two-sided geometric or
discrete Laplace law, untruncated) and releases only which side of two integer thresholds
``low < high`` the noisy count fell on::

    below    if c + Z <  low
    between  if low <= c + Z <= high      (the target: the charged outcome)
    above    if c + Z >  high

Privacy (neighbouring relation: one teacher's vote changes, paper Observation 1).  Replacing one
teacher moves one vote, so the count of ``v`` changes by at most one; adding or removing a teacher
also changes it by at most one.  Under either relation the released label is post-processing of the
``epsilon``-DP discrete Laplace mechanism on a sensitivity-one count, so each query is pure
``epsilon``-DP (the tests check every ratio exactly).

Target (our derivation): ``between`` is a ``q``-target at level ``epsilon`` with

    q = (1 - e^{-epsilon (g + 1)}) / (1 + e^{epsilon}),      g = high - low,

the continuous-Laplace BetweenThresholds formula at gap ``g + 1`` (the interval holds ``g + 1`` integers),
so always strictly above the continuous ``q_BT(epsilon, g)``.  Derivation (docs/mechanisms/
between_thresholds.md): for pairs ``(c, c + 1)`` with ``c + 1 <= low`` the certifier of
:mod:`mechanisms.qtarget` gives exactly this value for every ``c`` (the ratios stabilise: all three
outcome probabilities of ``c`` are those of ``c + 1`` times fixed factors), mirrored for ``c >= high``;
for pairs inside ``[low, high]`` no mass can be shared and ``q`` is the smaller ``between``
probability, which is at least ``e^{epsilon}`` times larger.  The event's ``q`` is computed at
construction by running the certifier on a finite window of pairs that provably contains the minimum
(:func:`certify_q`) and taking the minimum with the closed form.

Sampling is exact (see :mod:`mechanisms.randomness`), so each query is *exactly* pure ``epsilon``-DP for
the rational ``epsilon`` that the float stores, with no rounding margin.  A single query draws ``Z`` with
the integer discrete Laplace sampler (Bernoulli(e^-gamma) by the alternating series, a geometric
magnitude, a fair sign) and thresholds ``c + Z``; no float is involved.  :meth:`BetweenThresholds.run_batch`
draws the label directly from its law by an exact inverse distribution function: one 64-bit word per
query compared with the exact leading bits of ``P[below]`` and ``P[below] + P[between]`` (computed by
interval arithmetic on ``e^-epsilon``, refined bit by bit on a tie), which is the same law.  Bits come
from the operating system's cryptographic randomness when ``rng`` is ``None``; a
``numpy.random.Generator`` makes runs reproducible (tests only: whoever knows the seed knows the noise).
:func:`sample_discrete_laplace` draws ``Z`` itself (exactly) for cross-checks.
"""

from __future__ import annotations

import functools
import math
import numbers

import attr
import numpy as np

from mechanisms.base import (
    BatchRelease,
    EpsilonDeltaClaim,
    Mechanism,
    OutcomeDistribution,
    TargetClaim,
    claim_under,
)
from mechanisms.histogram import as_batch, as_histogram
from mechanisms.qtarget import q_star_rows
from mechanisms.randomness import (
    discrete_laplace_cut_law,
    random_bits,
    sample_geometric,
    sample_laws,
)
from pate_accountant.events import (
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    BetweenThresholdsEvent,
)
from pate_accountant.release import BELOW as BELOW_CLASS
from pate_accountant.release import TARGET, TOKEN, Release
from pate_accountant.validation import MAX_COUNT, check_delta, check_epsilon, check_int, check_real

__all__ = [
    "ABOVE",
    "BELOW",
    "BETWEEN",
    "OUTCOME_LABELS",
    "SCAN_WINDOW",
    "BetweenThresholds",
    "TokenQuery",
    "between_thresholds_q",
    "certify_q",
    "continuous_q",
    "discrete_laplace_cdf",
    "discrete_laplace_pmf",
    "discrete_laplace_sf",
    "outcome_table",
    "sample_discrete_laplace",
]

#: Outcome codes (the values of a batch release and the "tokens" of ``output_distribution``).
BELOW, BETWEEN, ABOVE = 0, 1, 2
#: Outcome labels (the ``value`` of a ``Release``), indexed by code.
OUTCOME_LABELS = ("below", "between", "above")


def _eps(epsilon) -> float:
    """Epsilon in ``(0, MAX_STEP_EPSILON]`` (docs/ranges.md)."""
    return check_epsilon("epsilon", epsilon)


def _bounded_int(name: str, value, minimum: int = -MAX_COUNT) -> int:
    """A threshold, count or token in ``[minimum, MAX_COUNT]``: int64 arithmetic on it (``c + 1``, ``high - c``)
    stays exact and it converts to float64 exactly (docs/ranges.md)."""
    return check_int(name, value, minimum=minimum, maximum=MAX_COUNT)


def _int_array(name: str, values) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype == object or array.dtype.kind not in "iuf" or array.dtype.kind == "b":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            raise ValueError(f"{name} must hold integers, got {array[bad].ravel()[0]!r}")
    return array.astype(np.int64)


# -- the discrete Laplace law ----------------------------------------------------------------------
def discrete_laplace_pmf(x, epsilon: float) -> np.ndarray:
    """``P[Z = x] = (1 - r) / (1 + r) r^{|x|}``, ``r = e^{-epsilon}``."""
    epsilon = _eps(epsilon)
    x = _int_array("x", x)
    r = math.exp(-epsilon)
    return (-math.expm1(-epsilon) / (1 + r)) * np.exp(-epsilon * np.abs(x))


def discrete_laplace_cdf(x, epsilon: float) -> np.ndarray:
    """``P[Z <= x]``: ``r^{-x} / (1 + r)`` for ``x < 0`` and ``1 - r^{x+1} / (1 + r)`` for ``x >= 0``."""
    epsilon = _eps(epsilon)
    x = _int_array("x", x)
    r = math.exp(-epsilon)
    left = np.exp(-epsilon * np.maximum(-x, 0)) / (1 + r)
    right = 1.0 - np.exp(-epsilon * (np.maximum(x, -1) + 1)) / (1 + r)
    return np.where(x < 0, left, right)


def discrete_laplace_sf(x, epsilon: float) -> np.ndarray:
    """``P[Z >= x]`` (by symmetry ``P[Z <= -x]``)."""
    return discrete_laplace_cdf(-_int_array("x", x), epsilon)


def sample_discrete_laplace(epsilon: float, rng: np.random.Generator | None = None, size=None):
    """Exact integer draws of ``Z``: one ``int`` for ``size=None`` (the integer sampler), else an ``int64``
    array of shape ``size``: ``G1 - G2`` with ``G1, G2`` independent exact geometric draws of ratio
    ``e^-epsilon``, whose difference has exactly the discrete Laplace law.  ``rng=None``: the operating
    system's cryptographic randomness; a ``numpy.random.Generator``: reproducible (tests only)."""
    epsilon = _eps(epsilon)
    source = random_bits(rng)
    if size is None:
        return source.discrete_laplace(epsilon)
    shape = (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)
    count = int(np.prod(shape, dtype=np.int64))
    return (sample_geometric(epsilon, count, source) - sample_geometric(epsilon, count, source)).reshape(shape)


# -- outcome probabilities -------------------------------------------------------------------------
def _table(counts: np.ndarray, epsilon: float, low: int, high: int) -> np.ndarray:
    """``(len(counts), 3)`` exact outcome probabilities, each written without cancellation."""
    counts = np.asarray(counts, dtype=np.int64)
    r = math.exp(-epsilon)
    inner = -math.expm1(-epsilon * (high - low + 1)) / (1 + r)  # (1 - r^{g+1}) / (1 + r)
    a = low - counts  # c + Z < low  <=>  Z <= a - 1
    b = high - counts  # c + Z > high <=>  Z >= b + 1
    lower = a >= 1  # c < low: Z has to climb at least a to reach the interval
    upper = b <= -1  # c > high
    ra = np.exp(-epsilon * np.maximum(a, 0))  # r^a          (used where a >= 1)
    rb = np.exp(-epsilon * np.maximum(-b, 0))  # r^{-b}       (used where b <= -1)
    out = np.empty(counts.shape + (3,))
    # below = P[Z <= a - 1]
    out[..., BELOW] = np.where(
        lower, 1.0 - ra / (1 + r), np.exp(-epsilon * (1 + np.maximum(-a, 0))) / (1 + r)
    )
    # above = P[Z >= b + 1]
    out[..., ABOVE] = np.where(upper, 1.0 - rb / (1 + r), np.exp(-epsilon * (1 + np.maximum(b, 0))) / (1 + r))
    # between = P[a <= Z <= b]
    mid = (-np.expm1(-epsilon * (np.maximum(b, 0) + 1)) + r * -np.expm1(-epsilon * np.maximum(-a, 0))) / (1 + r)
    out[..., BETWEEN] = np.where(lower, ra * inner, np.where(upper, rb * inner, mid))
    return out


def outcome_table(counts, epsilon: float, low: int, high: int) -> np.ndarray:
    """Exact ``(below, between, above)`` probabilities for each count (rows of a ``(..., 3)`` array)."""
    epsilon = _eps(epsilon)
    low, high = _bounded_int("low", low), _bounded_int("high", high)
    if low >= high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    return _table(_int_array("counts", counts), epsilon, low, high)


def continuous_q(epsilon: float, gap: float) -> float:
    """The continuous-Laplace ``q_BT = (1 - e^{-epsilon g}) / (1 + e^{epsilon})`` for continuous Laplace noise."""
    epsilon = _eps(epsilon)
    gap = check_real("gap", gap, minimum=0.0, min_open=True)
    return -math.expm1(-epsilon * gap) / (1 + math.exp(epsilon))


def between_thresholds_q(epsilon: float, gap: int) -> float:
    """The exact ``q`` of ``between`` for the discrete version: ``(1 - e^{-epsilon (g+1)}) / (1 + e^{epsilon})``,
    i.e. :func:`continuous_q` at gap ``g + 1`` (derivation in the module docstring and the docs)."""
    gap = check_int("gap", gap, minimum=1, maximum=2 * MAX_COUNT)
    return continuous_q(epsilon, gap + 1)


#: Half-width of the certifier's window at each threshold (pairs further in are never the minimum).
SCAN_WINDOW = 64


def certify_q(epsilon: float, low: int, high: int, counts=None) -> float:
    """Run the q-target certifier on the pairs ``(c, c + 1)`` for ``c`` in ``counts`` and return the worst.

    By default ``counts`` is the window ``[low - 1, low + W] U [high - W - 1, high]`` (``W = SCAN_WINDOW``),
    which contains the minimum over *all* integers ``c``: every pair with ``c + 1 <= low`` gives the same
    value as ``c = low - 1`` (and every pair with ``c >= high`` the same as ``c = high``), and inside
    ``[low, high]`` the certifier's value is ``min(between(c), between(c + 1))``, a concave function of
    the position that is smallest at the two ends.  (``q*`` is symmetric in the pair, so ``c + 1`` vs
    ``c`` needs no separate pass.)
    """
    epsilon = _eps(epsilon)
    low, high = _bounded_int("low", low), _bounded_int("high", high)
    if low >= high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    if counts is None:
        left = np.arange(low - 1, min(high, low + SCAN_WINDOW) + 1)
        right = np.arange(max(low, high - SCAN_WINDOW - 1), high + 1)
        counts = np.union1d(left, right)
    else:
        counts = _int_array("counts", counts).ravel()
        if counts.size == 0:
            raise ValueError("counts must not be empty")
    worst = 1.0
    for start in range(0, counts.size, 1 << 16):
        chunk = counts[start : start + (1 << 16)]
        rows = q_star_rows(_table(chunk, epsilon, low, high), _table(chunk + 1, epsilon, low, high), epsilon, BETWEEN)
        worst = min(worst, float(rows.min()))
    return worst


@functools.lru_cache(maxsize=4096)
def _label_law(epsilon: float, low: int, high: int, count: int):
    """The exact law of the label code for one count: ``c + Z < low`` iff ``Z <= low - c - 1``, and
    ``c + Z <= high`` iff ``Z <= high - c``."""
    return discrete_laplace_cut_law(epsilon, [low - count - 1, high - count])


# -- the mechanism ---------------------------------------------------------------------------------
def _threshold(name):
    def convert(value):
        return _bounded_int(name, value)

    return convert


def _relation(value):
    if value not in NEIGHBOURING_RELATIONS:
        raise ValueError(f"relation must be one of {NEIGHBOURING_RELATIONS}, got {value!r}")
    return value


@attr.s(frozen=True, slots=True)
class BetweenThresholds(Mechanism):
    """``BetweenThresholds(epsilon, low, high)``: below / between / above on one noisy count.

    Pure ``epsilon``-DP per query (the count has sensitivity one under replace-one and add/remove: one
    teacher's vote changes, paper Observation 1).  The ``between`` outcome is the target: it is charged
    by target-charging accountants, and :attr:`event` carries its certified ``q`` (see the module
    docstring).  ``low`` and ``high`` are integers in ``[-2^53, 2^53]`` with ``(high - low) * epsilon >=
    MIN_GAP_EPSILON``; ``epsilon`` lies in ``(0, 50]`` (docs/ranges.md).

    A query reads one count, so a call takes a count, or a histogram with ``token=``; :meth:`on_token`
    gives the histogram mechanism that always reads the same token (a :class:`TokenQuery`, whose law and
    runs are over the outcome codes).
    """

    #: The gap requirement: ``(high - low) * epsilon >= 2``, so ``q >= (1 - e^{-2}) / (1 + e^{epsilon})``,
    #: at least ``1 - e^{-2} = 86%`` of the limit ``1 / (1 + e^{epsilon})`` reached as the gap grows.
    MIN_GAP_EPSILON = 2.0

    epsilon: float = attr.ib(converter=_eps)
    low: int = attr.ib(converter=_threshold("low"))
    high: int = attr.ib(converter=_threshold("high"))
    relation: str = attr.ib(default=REPLACE_ONE, converter=_relation, kw_only=True)
    _q: float = attr.ib(init=False, repr=False, eq=False, hash=False)

    def __attrs_post_init__(self):
        if self.low >= self.high:
            raise ValueError(f"low must be < high, got low={self.low}, high={self.high}")
        gap = self.high - self.low
        if gap * self.epsilon < self.MIN_GAP_EPSILON * (1 - 1e-12):
            raise ValueError(
                f"the gap high - low = {gap} is too small for epsilon={self.epsilon}: BetweenThresholds needs "
                f"high - low >= {self.MIN_GAP_EPSILON} / epsilon = {self.MIN_GAP_EPSILON / self.epsilon:.6g}"
            )
        q = min(certify_q(self.epsilon, self.low, self.high), between_thresholds_q(self.epsilon, gap))
        object.__setattr__(self, "_q", q)

    # -- privacy -----------------------------------------------------------------------------------
    @property
    def gap(self) -> int:
        return self.high - self.low

    @property
    def q(self) -> float:
        """The certified ``q`` of the ``between`` target at level ``epsilon`` (computed at construction)."""
        return self._q

    @property
    def event(self) -> BetweenThresholdsEvent:
        return BetweenThresholdsEvent(self.epsilon, self._q, self.relation)

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        """Pure ``epsilon``-DP under :attr:`relation`, with ``between`` (code ``BETWEEN``) a ``q``-target at
        level ``epsilon`` for the certified :attr:`q`."""
        claim = EpsilonDeltaClaim(self.epsilon, 0.0, self.relation, target=TargetClaim(BETWEEN, self.epsilon, self._q))
        return claim_under(claim, relation, type(self).__name__)

    def batch_distributions(self, batch, token: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The law of the query on the count of ``token`` in each histogram of ``batch``: ``(histogram, code,
        probability)`` (see :meth:`TokenQuery.batch_distributions`).  ``token`` is required."""
        if token is None:
            raise ValueError("token is required: BetweenThresholds reads one count of each histogram")
        return self.on_token(token).batch_distributions(batch)

    #: ``for_teachers`` puts the lower threshold at this fraction of the configured teachers ``n``.
    RUN_LOW_FRACTION = 0.2

    @classmethod
    def for_teachers(cls, epsilon: float, num_teachers: int, relation: str = REPLACE_ONE, *,
                     step_delta: float | None = None) -> BetweenThresholds:
        """The query a private run makes on the count of a candidate token (the individual-charging scheme of
        the paper's "DP methods for heterogeneous ensembles"): thresholds set from the configured number of
        teachers ``n`` alone (public), ``low = ceil(n / 5)`` and ``high = low + ceil(2 / epsilon)``, the smallest
        gap the query allows.  The run counts the teachers included at a random rate ``nu ~ U[1/n, 1]`` who vote
        the candidate, so a candidate all ``n`` teachers vote for clears ``low`` with probability about 4/5 and
        one half of them vote for with about 3/5; counts of ``high`` or more are released without a charge
        (docs/tct_and_individual.md, "In generate").  The query is pure epsilon-DP: a run's ``step_delta``, when
        given, is checked like any mechanism's and then unused."""
        n = check_int("num_teachers", num_teachers, minimum=1)
        if step_delta is not None:
            check_delta("delta", step_delta)
        epsilon = check_epsilon("epsilon", epsilon)
        low = max(1, math.ceil(cls.RUN_LOW_FRACTION * n))
        return cls(epsilon, low, low + math.ceil(cls.MIN_GAP_EPSILON / epsilon * (1 - 1e-12)), relation=relation)

    def on_token(self, token: int) -> "TokenQuery":
        """The query run on the count of ``token`` in each histogram: a histogram mechanism (the count read is
        fixed in advance, which is what the privacy claim is about)."""
        return TokenQuery(self, token)

    # -- exact distribution ------------------------------------------------------------------------
    def _count(self, count_or_histogram, token) -> int:
        value = count_or_histogram
        if isinstance(value, (numbers.Number, np.generic)):
            if token is not None:
                raise ValueError(
                    f"token is only used with a histogram input; got the count {value!r} and token={token!r}"
                )
            return _bounded_int("count", value, 0)
        if token is None:
            raise ValueError("token is required when the input is a histogram (BetweenThresholds reads one count)")
        return as_histogram(value).count(_bounded_int("token", token, 0))

    def outcome_probabilities(self, count: int) -> tuple[float, float, float]:
        """Exact ``(P[below], P[between], P[above])`` for the count ``count``."""
        count = _bounded_int("count", count, 0)
        row = _table(np.array([count]), self.epsilon, self.low, self.high)[0]
        return float(row[BELOW]), float(row[BETWEEN]), float(row[ABOVE])

    def outcome_table(self, counts) -> np.ndarray:
        """Vectorised :meth:`outcome_probabilities`: a ``(len(counts), 3)`` array."""
        counts = _int_array("counts", counts)
        if (counts < 0).any():
            raise ValueError(f"counts must be non-negative, got {int(counts[counts < 0].ravel()[0])}")
        return _table(counts, self.epsilon, self.low, self.high)

    def output_distribution(self, count_or_histogram, token: int | None = None) -> OutcomeDistribution:
        """The exact output law as an ``OutcomeDistribution`` over the outcome *codes* ``BELOW, BETWEEN,
        ABOVE`` (``0, 1, 2``; labels in ``OUTCOME_LABELS``), with fail probability ``0``."""
        probs = np.array(self.outcome_probabilities(self._count(count_or_histogram, token)))
        return OutcomeDistribution(np.array([BELOW, BETWEEN, ABOVE]), probs, 0.0)

    # -- running -----------------------------------------------------------------------------------
    def _code(self, noisy: int) -> int:
        return BELOW if noisy < self.low else (BETWEEN if noisy <= self.high else ABOVE)

    def __call__(self, count_or_histogram, rng: np.random.Generator | None = None, token: int | None = None) -> Release:
        """One query on an integer count, or on a histogram's count of ``token``.

        ``Release.value`` is ``"below"``, ``"between"`` or ``"above"``; ``target_hit`` is ``True`` exactly
        for ``"between"``.  The noise ``Z`` is one exact integer discrete Laplace draw (module docstring);
        ``rng=None`` takes the bits from the operating system's cryptographic randomness.
        """
        count = self._count(count_or_histogram, token)
        source = random_bits(rng)
        code = self._code(count + source.discrete_laplace(self.epsilon))
        return Release(OUTCOME_LABELS[code], self.event, target_hit=code == BETWEEN)

    def run_batch(self, counts, rng: np.random.Generator | None = None, token: int | None = None) -> BatchRelease:
        """Vectorised queries: ``counts`` is a 1-d array of counts, or (with ``token``) a batch of histograms
        (anything :func:`mechanisms.as_batch` takes) whose counts of ``token`` are used.

        Returns a ``BatchRelease`` whose ``values`` are outcome codes (``BELOW, BETWEEN, ABOVE``) and whose
        ``target_hit`` is ``values == BETWEEN``; each query is charged :attr:`event`.  Each label is an exact
        draw from its law (one 64-bit word per query, module docstring).
        """
        if token is None:
            counts = _int_array("counts", counts)
            if counts.ndim != 1:
                raise ValueError(f"counts must be a 1-d array (or pass token= with a batch), got shape {counts.shape}")
            if (counts < 0).any():
                raise ValueError(f"counts must be non-negative, got {int(counts[counts < 0][0])}")
        else:
            token = _bounded_int("token", token, 0)
            batch = as_batch(counts)
            hit = batch.tokens == token
            counts = np.zeros(batch.num_histograms, dtype=np.int64)
            counts[batch.sample[hit]] = batch.counts[hit]
        source = random_bits(rng)
        distinct, which = np.unique(counts, return_inverse=True)
        laws = [_label_law(self.epsilon, self.low, self.high, int(c)) for c in distinct]
        codes = sample_laws(laws, which.ravel(), source) if laws else np.zeros(0, dtype=np.int64)
        classes = np.array([BELOW_CLASS, TARGET, TOKEN])[codes] if codes.size else np.zeros(0, dtype="<U6")
        return BatchRelease(codes, self.event, target_hit=codes == BETWEEN, classes=classes)


@attr.s(frozen=True, slots=True)
class TokenQuery(Mechanism):
    """A :class:`BetweenThresholds` query run on the count of one fixed ``token`` of each histogram.

    A histogram mechanism like the others.  As for the query itself, a run's ``Release.value`` is the label
    (``"below"``, ``"between"``, ``"above"``; ``target_hit`` for ``"between"``), while :meth:`output_distribution`
    and ``run_batch`` use the codes ``BELOW, BETWEEN, ABOVE`` (``0, 1, 2``); :meth:`outcome_code` maps a
    label to its code.  Its event and privacy claim are the query's (the count has sensitivity one under
    either relation)."""

    query: BetweenThresholds = attr.ib()
    token: int = attr.ib(converter=lambda v: _bounded_int("token", v, 0))

    @query.validator
    def _check_query(self, attribute, value):
        if not isinstance(value, BetweenThresholds):
            raise TypeError(f"query must be a BetweenThresholds, got {type(value).__name__}")

    @property
    def event(self) -> BetweenThresholdsEvent:
        return self.query.event

    def privacy_claim(self, relation: str | None = None) -> EpsilonDeltaClaim:
        return self.query.privacy_claim(relation)

    def output_distribution(self, histogram, num_teachers: int | None = None) -> OutcomeDistribution:
        return self.query.output_distribution(as_histogram(histogram, num_teachers), token=self.token)

    @staticmethod
    def outcome_code(label) -> int:
        """The code of a released label (``"below"`` -> ``BELOW`` ...), as in the exact law."""
        return OUTCOME_LABELS.index(label)

    def _run(self, hist, source) -> Release:
        return self.query(hist, rng=source, token=self.token)

    def batch_distributions(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every histogram's law over the three codes: ``(histogram, code, probability)``, sorted by histogram."""
        batch = as_batch(batch)
        hit = batch.tokens == self.token
        counts = np.zeros(batch.num_histograms, dtype=np.int64)
        counts[batch.sample[hit]] = batch.counts[hit]
        table = self.query.outcome_table(counts)
        sample = np.repeat(np.arange(batch.num_histograms, dtype=np.int64), 3)
        codes = np.tile(np.array([BELOW, BETWEEN, ABOVE], dtype=np.int64), batch.num_histograms)
        return sample, codes, table.ravel()

    def _run_batch(self, batch, source) -> BatchRelease:
        return self.query.run_batch(batch, rng=source, token=self.token)
