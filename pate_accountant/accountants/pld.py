"""Privacy-loss-distribution accountant: a bridge to ``dp_accounting.pld``.

Each event is translated into *groups* of identical single-step PLDs, each built by dp-accounting's own
constructors (pessimistic estimates at ``value_discretization_interval``):

* ``EpsilonDeltaEvent`` (also ``NoisyArgMaxEvent``, ``WeightedSamplingEvent``) and ``BoundaryWrapperEvent``:
  ``from_privacy_parameters(DifferentialPrivacyParameters(eps, delta))`` for each ``(eps, delta)`` term of
  :func:`~pate_accountant.accountants.translate.epsilon_delta_terms`: the worst case of any
  ``(eps, delta)``-DP step;
* ``BetweenThresholdsEvent(eps)``: ``from_discrete_laplace_mechanism(parameter=eps, sensitivity=1)``, exact
  for its two-sided geometric noise ``P[Z = z] ~ e^{-eps |z|}`` (dp-accounting's convention too) on a count of
  sensitivity one;
* ``DiscreteGaussianArgMaxEvent(sigma, truncation_bound)`` (GNMax): ``from_discrete_gaussian_mechanism(sigma,
  sensitivity=1, truncation_bound=...)``, composed ``event.shifts`` times (2 under replace-one: one count up,
  one down; 1 under add-remove-one): exact for the truncated discrete Gaussian noise the mechanism draws
  (docs/mechanisms/gaussian.md);
* ``SubsampledTeachersEvent`` around a ``DiscreteGaussianArgMaxEvent`` (GNMax on Poisson-subsampled teachers):
  ``from_discrete_gaussian_mechanism(sigma, sensitivity=1, truncation_bound=..., sampling_prob=q)``, whose two
  directions are the pair of one teacher joining or leaving; under replace-one the two directions convolved
  (one vote leaves one count, another joins another count, each kept with probability ``q``: the loss is the
  sum of the two directions' independent losses, docs/mechanisms/subsampled.md).  Around any other inner event it
  is the stated ``(epsilon, delta)``;
* ``LaplaceDpEvent(b)``: ``from_laplace_mechanism(b)``; ``DiscreteLaplaceDpEvent(a, s)``:
  ``from_discrete_laplace_mechanism(a, s)``;
* ``GaussianDpEvent(sigma)``: ``from_gaussian_mechanism(sigma)``, composed ``count`` times (dp-accounting
  builds ``k`` Gaussians at once as one with ``sigma / sqrt(k)``, a slightly tighter discretisation, but only
  for a single ``compose(event, k)``: composing them one by one gives our figure; we always compose, so
  the result does not depend on how the charges were grouped);
* ``RandomizedResponseDpEvent(p, m)``: ``from_randomized_response(p, m)`` composed ``count`` times
  (dp-accounting's own ``PLDAccountant`` drops the count);
* ``PoissonSampledDpEvent(q, GaussianDpEvent | LaplaceDpEvent)``: the matching constructor with
  ``sampling_prob=q`` (its add and remove PLDs are kept apart);
* ``ComposedDpEvent``, ``SelfComposedDpEvent``: their parts, counts multiplied; ``NoOpDpEvent``: nothing.

Everything else (``ThresholdPrivacyEvent``, non-private steps, zCDP, ...) raises ``UnsupportedEventError``
naming the event.  Every event's parameters are checked before anything else (``Charge`` refuses a
non-finite, zero or negative noise, count or rate with a ``ValueError`` naming it).

Relation.  One relation for everything charged: the keyword ``neighboring_relation``, or (left ``None``)
the relation the first charged event states, ``"replace-one"`` when that event is one of dp-accounting's.
Our events stating another relation are refused (``UnsupportedEventError`` naming both).  dp-accounting's
native events are read under the accountant's relation as dp-accounting defines them there: Laplace,
discrete Laplace and sampled Laplace only under ``"add-remove-one"`` (their noise is calibrated to a shift
of one when a record is added or removed); Gaussian and sampled Gaussian under either, with dp-accounting's
replace construction under ``"replace-one"`` (a shift of two: one record out, another in); randomized
response only under ``"replace-one"``.

Composition.  The accountant keeps counts of identical groups and composes lazily: a group of ``k``
identical two-point PLDs (every pure or ``(eps, delta)`` step, every BetweenThresholds query) is composed
exactly as a binomial law, larger groups by one FFT power (dp-accounting's ``self_convolve``), and groups
are merged smallest first (sparse outer sums while small, exact shift-and-add for a few-point factor, FFT
convolution otherwise).  Every truncation is pessimistic (left tails move up to the first kept loss, right
tails to the infinite loss, as dp-accounting does), so the reported epsilon is an upper bound.  With a budget, a charge
is accepted at once when a cheap valid bound fits (a PLD of the steps up to some earlier charge, at the
remaining delta, plus basic composition of the steps since); otherwise the exact PLD that would be reported
after the charge is composed before anything is committed, and the charge is refused if it exceeds the budget.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.common import DifferentialPrivacyParameters
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy import signal, stats

from pate_accountant.accountants.base import Accountant, Charge, ReportsAtOneDelta
from pate_accountant.accountants.event_checks import (
    DEFAULT_RELATION,
    check_native_relation,
    check_relation,
)
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    REPLACE_ONE,
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    DiscreteGaussianArgMaxEvent,
    EpsilonDeltaEvent,
    SubsampledTeachersEvent,
    ThresholdPrivacyEvent,
)
from pate_accountant.validation import check_real

__all__ = ["PldAccountant", "compose_groups", "group_pld"]

#: Tail mass dropped (pessimistically) at each convolution, as dp-accounting's default.
TAIL_MASS_TRUNCATION = 1e-15
#: Sparse x sparse convolutions stay sparse up to this many products.
_SPARSE_PRODUCTS = 1 << 16
#: The pending steps are composed into the composed part once there are ``FLUSH_MIN`` of them and at least
#: ``FLUSH_RATIO`` (with a budget: ``FLUSH_RATIO_BUDGET``) times as many as the composed part holds.
FLUSH_MIN = 64
FLUSH_RATIO = 4.0
FLUSH_RATIO_BUDGET = 0.125
#: A factor with at most this many points is convolved exactly by shift-and-add.
_SHIFT_ADD_POINTS = 16

_RELATIONS = {ADD_REMOVE_ONE: NeighboringRelation.ADD_OR_REMOVE_ONE, REPLACE_ONE: NeighboringRelation.REPLACE_ONE}


# ---------------------------------------------------------------------------------------------------------
# A discretised privacy-loss pmf: losses (lo + i) * interval for dense, idx * interval for sparse.
# ---------------------------------------------------------------------------------------------------------
@attr.s(frozen=True, slots=True, eq=False)
class _Pmf:
    probs: np.ndarray = attr.ib()
    inf: float = attr.ib()
    lo: int = attr.ib(default=0)  # dense: loss index of probs[0]
    idx: np.ndarray | None = attr.ib(default=None)  # sparse: sorted loss indices

    @property
    def sparse(self) -> bool:
        return self.idx is not None

    @property
    def first(self) -> int:
        return int(self.idx[0]) if self.sparse else self.lo

    @property
    def last(self) -> int:
        return int(self.idx[-1]) if self.sparse else self.lo + len(self.probs) - 1

    @property
    def span(self) -> int:
        return self.last - self.first + 1

    @property
    def nnz(self) -> int:
        return len(self.probs)

    def indices(self) -> np.ndarray:
        return self.idx if self.sparse else np.arange(self.lo, self.lo + len(self.probs), dtype=np.int64)

    def dense(self) -> _Pmf:
        if not self.sparse:
            return self
        probs = np.zeros(self.span)
        np.add.at(probs, self.idx - self.idx[0], self.probs)
        return _Pmf(probs, self.inf, lo=int(self.idx[0]))


_IDENTITY = _Pmf(np.array([1.0]), 0.0, idx=np.array([0], dtype=np.int64))


def _sparse(idx, probs, inf) -> _Pmf:
    """A sparse pmf, densified when it fills its span."""
    pmf = _Pmf(np.asarray(probs, dtype=np.float64), float(inf), idx=np.asarray(idx, dtype=np.int64))
    if pmf.nnz > _SHIFT_ADD_POINTS and pmf.nnz * 4 >= pmf.span:
        return pmf.dense()
    return pmf


def _from_dp(pmf: pld_pmf.PLDPmf) -> _Pmf:
    """Read a dp-accounting pmf (version 0.6.0 keeps the arrays in private attributes)."""
    if isinstance(pmf, pld_pmf.SparsePLDPmf):
        items = sorted((int(k), float(v)) for k, v in pmf._loss_probs.items() if v > 0.0)  # noqa: SLF001
        if not items:
            return _Pmf(np.array([0.0]), float(pmf._infinity_mass), idx=np.array([0], dtype=np.int64))  # noqa: SLF001
        idx, probs = zip(*items)
        return _sparse(idx, probs, pmf._infinity_mass)  # noqa: SLF001
    probs = np.array(pmf._probs, dtype=np.float64)  # noqa: SLF001  (a copy: ours are never written to)
    probs.setflags(write=False)
    return _Pmf(probs, float(pmf._infinity_mass), lo=int(pmf._lower_loss))  # noqa: SLF001


def _tail_count(probs: np.ndarray, half: float) -> int:
    """The longest prefix of ``probs`` with sum at most ``half`` (scanning growing chunks, not the whole array)."""
    n, size, total, start = len(probs), 1024, 0.0, 0
    while start < n:
        chunk = probs[start:start + size]
        sums = total + np.cumsum(chunk)
        inside = int(np.searchsorted(sums, half, side="right"))
        if inside < len(chunk):
            return start + inside
        total, start, size = float(sums[-1]), start + len(chunk), size * 4
    return n


def _truncate(pmf: _Pmf, tail: float) -> _Pmf:
    """Drop at most ``tail / 2`` of mass on each side, pessimistically: the left tail joins the first kept
    loss (a larger loss), the right tail goes to the infinite loss."""
    probs = pmf.probs
    if tail <= 0.0 or len(probs) <= 1:
        return pmf
    half = tail / 2
    left = min(_tail_count(probs, half), len(probs) - 1)
    right = min(_tail_count(probs[::-1], half), len(probs) - 1 - left)
    if left == 0 and right == 0:
        return pmf
    stop = len(probs) - right
    kept = probs[left:stop].copy()
    kept[0] += float(np.sum(probs[:left]))
    inf = pmf.inf + float(np.sum(probs[stop:]))
    if pmf.sparse:
        return _sparse(pmf.idx[left:stop], kept, inf)
    return _Pmf(kept, inf, lo=pmf.lo + left)


def _convolve(a: _Pmf, b: _Pmf, tail: float = TAIL_MASS_TRUNCATION) -> _Pmf:
    """The pmf of the composition of ``a`` and ``b`` (sum of independent losses)."""
    inf = a.inf + b.inf - a.inf * b.inf
    if a.sparse and b.sparse and a.nnz * b.nnz <= _SPARSE_PRODUCTS:
        sums = (a.idx[:, None] + b.idx[None, :]).ravel()
        values = np.multiply.outer(a.probs, b.probs).ravel()
        idx, inverse = np.unique(sums, return_inverse=True)
        out = _sparse(idx, np.bincount(inverse.ravel(), weights=values, minlength=len(idx)), inf)
    else:
        if a.sparse and a.nnz <= _SHIFT_ADD_POINTS:
            small, big = a, b.dense()
        elif b.sparse and b.nnz <= _SHIFT_ADD_POINTS:
            small, big = b, a.dense()
        else:
            small = None
        if small is not None:  # exact: a few shifted copies of the dense factor
            start = small.first
            probs = np.zeros(len(big.probs) + small.span - 1)
            n = len(big.probs)
            for i, p in zip(small.idx, small.probs):
                offset = int(i) - start
                probs[offset:offset + n] += p * big.probs
            out = _Pmf(probs, inf, lo=big.lo + start)
        else:
            da, db = a.dense(), b.dense()
            short, long_ = sorted((len(da.probs), len(db.probs)))
            convolve = signal.oaconvolve if short * 32 < long_ else signal.fftconvolve  # overlap-add when lopsided
            probs = convolve(da.probs, db.probs)
            np.maximum(probs, 0.0, out=probs)  # FFT round-off can dip below zero
            out = _Pmf(probs, inf, lo=da.lo + db.lo)
    return _truncate(out, tail)


def _power(pmf: _Pmf, k: int, tail: float = TAIL_MASS_TRUNCATION) -> _Pmf:
    """The ``k``-fold composition of ``pmf`` with itself."""
    if k == 1:
        return pmf
    inf = -math.expm1(k * math.log1p(-pmf.inf)) if pmf.inf < 1.0 else 1.0
    if pmf.sparse and pmf.nnz == 1:
        mass = float(pmf.probs[0]) ** k
        return _Pmf(np.array([mass]), inf, idx=pmf.idx * k)
    if pmf.sparse and pmf.nnz == 2:  # exact: a binomial number of low losses
        (low, high), (p_low, p_high) = pmf.idx, pmf.probs
        mass = p_low + p_high
        i = np.arange(k + 1)
        probs = stats.binom.pmf(i, k, p_low / mass) * mass**k
        idx = (k - i)[::-1] * int(high) + i[::-1] * int(low)
        return _truncate(_sparse(idx, probs[::-1], inf), tail)
    dense = pmf.dense()
    shift, probs = pld_common.self_convolve(dense.probs, k, tail)
    probs = np.maximum(np.asarray(probs, dtype=np.float64), 0.0)
    # dp-accounting moves the whole truncation budget to the infinite loss (the FFT wraps the tails around).
    return _Pmf(probs, min(1.0, inf + tail), lo=dense.lo * k + int(shift))


def _merge(pmfs) -> _Pmf:
    """Compose several pmfs, always merging the two narrowest first (Huffman order)."""
    counter = itertools.count()
    heap = [(p.span, next(counter), p) for p in pmfs]
    if not heap:
        return _IDENTITY
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        c = _convolve(a, b)
        heapq.heappush(heap, (c.span, next(counter), c))
    return heap[0][2]


def _epsilon_for_delta(pmf: _Pmf, delta: float, interval: float) -> float:
    """Smallest epsilon >= 0 with hockey-stick divergence at most ``delta`` (dp-accounting's formula):
    ``delta(eps) = inf + sum_{l > eps} p_l (1 - e^{eps - l})``, which is continuous and non-increasing.

    With ``U_j = inf + sum_{i >= j} p_i`` and ``W_j = sum_{i >= j} p_i e^{-l_i}`` over the positive losses
    ``l_0 < l_1 < ...``, ``delta(eps) = U_j - e^eps W_j`` on ``(l_{j-1}, l_j]``: a binary search finds the first
    ``j`` with ``delta(l_j) <= delta`` and the answer is ``log((U_j - delta) / W_j)``.
    """
    if pmf.inf > delta:
        return math.inf
    losses = pmf.indices() * interval
    start = int(np.searchsorted(losses, 0.0, side="right"))
    loss, prob = losses[start:], pmf.probs[start:]
    n = loss.size
    if n == 0:
        return 0.0
    upper = pmf.inf + np.cumsum(prob[::-1])[::-1]
    lower = np.cumsum((prob * np.exp(-loss))[::-1])[::-1]
    if upper[0] - lower[0] <= delta:
        return 0.0

    def delta_at_grid(j: int) -> float:  # delta(l_j): only the losses above l_j count
        if j + 1 >= n:
            return pmf.inf
        w = float(lower[j + 1])
        return float(upper[j + 1]) - (math.exp(float(loss[j]) + math.log(w)) if w > 0.0 else 0.0)

    lo, hi = 0, n - 1  # delta_at_grid(n - 1) = inf <= delta
    while lo < hi:
        mid = (lo + hi) // 2
        if delta_at_grid(mid) <= delta:
            hi = mid
        else:
            lo = mid + 1
    if lower[lo] <= 0.0:
        return float(loss[lo])
    return max(0.0, math.log((float(upper[lo]) - delta) / float(lower[lo])))


@attr.s(frozen=True, slots=True, eq=False)
class _Composed:
    """A composed PLD: the remove-side pmf and, when some step is asymmetric, the add-side one."""

    remove: _Pmf = attr.ib()
    add: _Pmf | None = attr.ib(default=None)
    cache: dict = attr.ib(factory=dict)  # delta -> epsilon

    def epsilon(self, delta: float, interval: float) -> float:
        if delta not in self.cache:
            if len(self.cache) > 4096:
                self.cache.clear()
            eps = _epsilon_for_delta(self.remove, delta, interval)
            if self.add is not None:
                eps = max(eps, _epsilon_for_delta(self.add, delta, interval))
            self.cache[delta] = eps
        return self.cache[delta]


_EMPTY = _Composed(_IDENTITY)


# ---------------------------------------------------------------------------------------------------------
# Events -> groups
# ---------------------------------------------------------------------------------------------------------
# A group key names one single-step PLD: ("eps-delta", eps, delta), ("discrete-laplace", a, s),
# ("laplace", b, q), ("gaussian", sigma, q), ("randomized-response", p, m), ("discrete-gaussian", sigma, bound),
# ("sampled-discrete-gaussian", sigma, bound, q).


def _event_groups(event, relation: str) -> dict:
    """``{key: multiplicity}`` for one occurrence of ``event``; raises ``UnsupportedEventError`` naming it."""
    out: dict = {}
    _collect(event, 1, out, relation, event)
    return out


def _add(out: dict, key, n: int) -> None:
    out[key] = out.get(key, 0) + n


def _collect(event, n: int, out: dict, relation: str, top) -> None:
    def refuse(why: str):
        inner = "" if event is top else f" (in {top!r})"
        return UnsupportedEventError(f"PldAccountant cannot account for event {event!r}{inner}: {why}")

    if isinstance(event, BetweenThresholdsEvent):
        _add(out, ("discrete-laplace", event.epsilon, 1), n)
    elif isinstance(event, DiscreteGaussianArgMaxEvent):
        _add(out, ("discrete-gaussian", float(event.sigma), int(event.truncation_bound)), n * event.shifts)
    elif isinstance(event, SubsampledTeachersEvent) and isinstance(event.inner, DiscreteGaussianArgMaxEvent):
        _add(out, ("sampled-discrete-gaussian", float(event.inner.sigma), int(event.inner.truncation_bound),
                   float(event.rate)), n)
    elif isinstance(event, (EpsilonDeltaEvent, BoundaryWrapperEvent)):
        for eps, delta, m in epsilon_delta_terms(event):
            if eps > 0.0 or delta > 0.0:
                _add(out, ("eps-delta", eps, delta), n * m)
    elif isinstance(event, ThresholdPrivacyEvent):
        raise refuse("threshold privacy is not differential privacy")
    elif isinstance(event, dp_event.NoOpDpEvent):
        return
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        if event.count > 0:
            _collect(event.event, n * event.count, out, relation, top)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            _collect(part, n, out, relation, top)
    elif isinstance(event, dp_event.NonPrivateDpEvent):
        raise refuse("a non-private step has no finite privacy loss")
    elif isinstance(event, dp_event.LaplaceDpEvent):
        _positive(event.noise_multiplier, refuse)
        _add(out, ("laplace", float(event.noise_multiplier), 1.0), n)
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        _positive(event.noise_parameter, refuse)
        if event.sensitivity > 0:
            _add(out, ("discrete-laplace", float(event.noise_parameter), int(event.sensitivity)), n)
    elif isinstance(event, dp_event.GaussianDpEvent):
        _positive(event.noise_multiplier, refuse)
        _add(out, ("gaussian", float(event.noise_multiplier), 1.0), n)
    elif isinstance(event, dp_event.RandomizedResponseDpEvent):
        if relation != REPLACE_ONE:
            raise refuse('randomized response needs neighboring_relation="replace-one" (as in dp-accounting)')
        if event.num_buckets == 1:
            return
        _positive(event.noise_parameter, refuse)
        _add(out, ("randomized-response", float(event.noise_parameter), int(event.num_buckets)), n)
    elif isinstance(event, dp_event.PoissonSampledDpEvent):
        q = float(event.sampling_probability)
        inner = event.event
        if q == 0.0:
            return
        if isinstance(inner, dp_event.GaussianDpEvent):
            _positive(inner.noise_multiplier, refuse)
            _add(out, ("gaussian", float(inner.noise_multiplier), q), n)
        elif isinstance(inner, dp_event.LaplaceDpEvent):
            _need_add_remove(relation, refuse)
            _positive(inner.noise_multiplier, refuse)
            _add(out, ("laplace", float(inner.noise_multiplier), q), n)
        else:
            raise refuse("Poisson sampling is supported around a GaussianDpEvent or a LaplaceDpEvent only")
    else:
        raise refuse("no privacy loss distribution for this event")


def _need_add_remove(relation: str, refuse) -> None:
    if relation != ADD_REMOVE_ONE:
        raise refuse('dp-accounting defines a sampled Laplace under neighboring_relation="add-remove-one" only')


def _positive(value, refuse) -> None:
    if not value > 0:
        raise refuse("zero noise is not private")


@functools.lru_cache(maxsize=128)
def _single(key, interval: float, relation: str) -> tuple[_Pmf, _Pmf | None]:
    """The (remove, add-or-None) pmfs of one step of ``key``."""
    kind = key[0]
    dp_relation = _RELATIONS[relation]
    if kind == "eps-delta":

        pld = pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(key[1], key[2]), value_discretization_interval=interval)
    elif kind == "discrete-laplace":
        pld = pld_lib.from_discrete_laplace_mechanism(key[1], sensitivity=key[2], value_discretization_interval=interval)
    elif kind == "discrete-gaussian":
        pld = pld_lib.from_discrete_gaussian_mechanism(
            key[1], sensitivity=1, truncation_bound=key[2], value_discretization_interval=interval
        )
    elif kind == "sampled-discrete-gaussian":
        pld = pld_lib.from_discrete_gaussian_mechanism(
            key[1], sensitivity=1, truncation_bound=key[2], value_discretization_interval=interval, sampling_prob=key[3]
        )
        if relation == REPLACE_ONE:  # one vote leaves with probability q, another joins: both directions at once
            remove = _from_dp(pld._pmf_remove)  # noqa: SLF001
            return _convolve(remove, remove if pld._symmetric else _from_dp(pld._pmf_add)), None  # noqa: SLF001
    elif kind == "laplace":
        pld = pld_lib.from_laplace_mechanism(key[1], value_discretization_interval=interval, sampling_prob=key[2])
    elif kind == "gaussian":
        pld = pld_lib.from_gaussian_mechanism(
            key[1], value_discretization_interval=interval, sampling_prob=key[2], neighboring_relation=dp_relation
        )
    elif kind == "randomized-response":
        pld = pld_lib.from_randomized_response(key[1], key[2], value_discretization_interval=interval, neighboring_relation=dp_relation)
    else:  # pragma: no cover - keys are made above
        raise ValueError(key)
    remove = _from_dp(pld._pmf_remove)  # noqa: SLF001
    add = None if pld._symmetric else _from_dp(pld._pmf_add)  # noqa: SLF001
    return remove, add


def group_pld(key, count: int, interval: float, relation: str = DEFAULT_RELATION) -> tuple[_Pmf, _Pmf | None]:
    """The (remove, add-or-None) pmfs of ``count`` identical steps of ``key``."""
    remove, add = _single(key, interval, relation)
    return _power(remove, count), (None if add is None else _power(add, count))


def compose_groups(
    groups: dict, interval: float, relation: str = DEFAULT_RELATION, base: _Composed = _EMPTY, powers: dict | None = None
) -> _Composed:
    """``base`` composed with ``count`` steps of every ``key`` in ``groups``.

    ``powers`` (optional, updated): a cache ``{key: (count, remove, add)}`` of group PLDs, reused when a
    group's count has not changed.
    """
    removes, adds, asymmetric = [base.remove], [base.add], base.add is not None
    for key, count in groups.items():
        cached = None if powers is None else powers.get(key)
        if cached is not None and cached[0] == count:
            remove, add = cached[1], cached[2]
        else:
            remove, add = group_pld(key, count, interval, relation)
            if powers is not None:
                powers[key] = (count, remove, add)
        removes.append(remove)
        adds.append(add)
        asymmetric = asymmetric or add is not None
    remove = _merge(removes)
    add = _merge([r if a is None else a for r, a in zip(removes, adds)]) if asymmetric else None
    return _Composed(remove, add)


def _basic_terms(key) -> tuple[float, float] | None:
    """A valid ``(epsilon, delta)`` of one step of ``key`` (``None`` where there is no cheap one)."""
    kind = key[0]
    if kind == "eps-delta":
        return key[1], key[2]
    if kind == "discrete-laplace":
        return key[1] * key[2], 0.0
    if kind == "laplace" and key[2] == 1.0:
        return 1.0 / key[1], 0.0
    if kind == "randomized-response":
        p, m = key[1], key[2]
        return math.log1p(m * (1.0 - p) / p), 0.0
    return None


#: For the cheap budget check, a step without a closed-form (epsilon, delta) (Gaussian, sampled noise) is
#: charged at this fraction of the budget's delta, with the epsilon of its own single-step PLD there.
STEP_DELTA_FRACTION = 1e-3


@functools.lru_cache(maxsize=4096)
def _step_terms(key, interval: float, relation: str, budget_delta: float) -> tuple[float, float] | None:
    """A valid ``(epsilon, delta)`` of one step of ``key``, for the cheap budget check (``None``: none)."""
    terms = _basic_terms(key)
    if terms is not None:
        return terms
    delta = budget_delta * STEP_DELTA_FRACTION
    remove, add = _single(key, interval, relation)
    eps = _epsilon_for_delta(remove, delta, interval)
    if add is not None:
        eps = max(eps, _epsilon_for_delta(add, delta, interval))
    return (eps, delta) if math.isfinite(eps) else None


def _merged_counts(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, n in b.items():
        out[key] = out.get(key, 0) + n
    return out


class PldAccountant(ReportsAtOneDelta, Accountant):
    """Composition of privacy loss distributions (dp-accounting's PLD machinery).

    Keywords: ``budget=(epsilon, delta)``, ``ledger``, ``value_discretization_interval`` (default ``1e-4``),
    ``target_delta`` (the delta ``spent()`` reports at without a budget; default ``1e-6``) and
    ``neighboring_relation`` (``None``, the default: fixed by the first charge, see the module docstring;
    ``"replace-one"`` or ``"add-remove-one"``: the one relation of everything charged, under which
    dp-accounting's native events are read; the accountant never converts between relations).  ``spent()`` is ``(get_epsilon(d), d)`` with ``d`` the
    budget's delta, else ``target_delta``.  The epsilon is a pessimistic (upper) estimate.

    State: the committed steps are split into a *composed* part (a PLD) and a *pending* multiset of groups;
    the pending steps are composed into the composed part when they reach its size (an eighth of it with a
    budget; and at least ``FLUSH_MIN`` steps), so the work per report stays bounded.  The reported PLD is the composed part
    composed with the pending groups.  Both depend only on the sequence of charges, not on when ``spent()``
    was asked (a ledger replay reproduces the figures exactly).
    """

    kind = "pld"
    parallel_composition = "event"  # docs/groups.md

    def __init__(
        self,
        *,
        budget=None,
        ledger=None,
        value_discretization_interval: float = 1e-4,
        target_delta: float = 1e-6,
        neighboring_relation: str | None = None,
    ):
        self._interval = check_real(
            "value_discretization_interval", value_discretization_interval, minimum=0.0, maximum=1.0, min_open=True
        )
        self._target_delta = check_real("target_delta", target_delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        check_relation("neighboring_relation", neighboring_relation)
        self._counts: dict = {}  # everything committed: key -> count
        self._state: _Composed = _EMPTY  # the composed part ...
        self._state_steps = 0  # ... and how many steps it holds
        self._pending: dict = {}  # committed, not yet in the composed part: key -> count
        self._pending_steps = 0
        self._report: _Composed | None = _EMPTY  # the composed part with the pending groups (None: not computed)
        # For the cheap budget check: a PLD of the steps committed up to some point, and a basic
        # (eps, delta, all-have-one) bound on the steps committed since.
        self._bound_base: _Composed = _EMPTY
        self._since = (0.0, 0.0, True)
        self._powers: dict = {}  # cache of the pending groups' PLDs
        self._version = 0  # changes with every change of the state (keys _checked)
        self._checked = None  # ((version, relation, new groups), candidate PLD) of the last exact budget check
        # With a budget, charges near it are checked exactly: a smaller pending part makes that cheaper.
        self._flush_ratio = FLUSH_RATIO_BUDGET if budget is not None else FLUSH_RATIO
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=neighboring_relation)

    def _config(self) -> dict:
        return {
            "value_discretization_interval": self._interval,
            "target_delta": self._target_delta,
            "neighboring_relation": self._configured_relation,
        }

    @property
    def _relation(self) -> str:
        """The relation the committed groups are read under (the default before anything fixed one: then
        no group depends on it)."""
        return self._current_relation or DEFAULT_RELATION

    @property
    def groups(self) -> dict:
        """``{group key: count}`` of everything charged (a copy)."""
        return dict(self._counts)

    # -- the accountant hooks -----------------------------------------------------------------------------
    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        """O(size of the event) without a budget; with one, a cheap valid bound or the exact candidate PLD."""
        relation = self._relation_after(charge.event)  # UnsupportedEventError naming both relations
        check_native_relation(charge.event, relation, who=type(self).__name__)  # Laplace: add/remove only
        read_under = relation or DEFAULT_RELATION
        new = {key: m * charge.count for key, m in _event_groups(charge.event, read_under).items()}
        candidate = None
        if enforce_budget and self._budget is not None and new:
            candidate = self._check_budget(charge, new, read_under)
        if do_compose:
            self._apply(new, candidate, relation)

    def _check_budget(self, charge: Charge, new: dict, read_under: str) -> _Composed | None:
        """``None`` when a cheap valid bound fits the budget; else the exact PLD that would be reported after
        the charge (``BudgetExhaustedError`` when it does not fit)."""
        budget_eps, budget_delta = self._budget
        eps_sum, delta_sum, cheap_ok = self._since
        for key, n in new.items():
            terms = _step_terms(key, self._interval, read_under, budget_delta)
            if terms is None:
                cheap_ok = False
                break
            eps_sum += n * terms[0]
            delta_sum += n * terms[1]
        if cheap_ok and delta_sum <= budget_delta:
            # Basic composition of two blocks: the bound base at delta_b - delta_sum, the rest at (eps_sum, delta_sum).
            if self._base_epsilon_at_least(budget_delta - delta_sum) + eps_sum <= budget_eps:
                return None
        # Exactly the PLD the accountant will report once this charge is committed.  A check and the charge
        # that follows it (can_afford, then record) compose it once: the last one is kept for this state.
        key = (self._version, read_under, frozenset(new.items()))
        cached = self._checked
        if cached is not None and cached[0] == key:
            candidate = cached[1]
        else:
            candidate = compose_groups(
                _merged_counts(self._pending, new), self._interval, read_under, self._state, self._powers
            )
            self._checked = (key, candidate)
        eps = candidate.epsilon(budget_delta, self._interval)
        if not self._within_budget(eps, budget_delta):
            self._refuse(f"charging {charge.event!r} x{charge.count}", eps, budget_delta)
        return candidate

    def _base_epsilon_at_least(self, delta: float) -> float:
        """An epsilon valid at ``delta`` for the bound base: its epsilon at the largest rung not above ``delta``
        of the ladder ``delta_b``, ``delta_b (1 - 2^-j)``, ``delta_b 2^-i`` (cached per PLD, so that charges with
        ever-changing deltas cost no new PLD evaluation; epsilon decreases in delta, so it stays valid)."""
        budget_delta = self._budget[1]
        if delta <= 0.0:
            return math.inf
        if delta >= budget_delta:
            rung = budget_delta
        elif delta >= budget_delta / 2:
            rung = budget_delta * (1.0 - 2.0 ** -min(60, math.floor(-math.log2(1.0 - delta / budget_delta))))
        else:
            rung = budget_delta * 2.0 ** -math.ceil(math.log2(budget_delta / delta))
        rung = min(rung, delta)
        return self._bound_base.epsilon(rung, self._interval)

    def _apply(self, new: dict, candidate: _Composed | None, relation) -> None:
        self._version += 1
        self._checked = None
        self._set_relation(relation)
        if not new:
            return
        steps = 0
        for key, n in new.items():
            self._counts[key] = self._counts.get(key, 0) + n
            self._pending[key] = self._pending.get(key, 0) + n
            steps += n
        self._pending_steps += steps
        if candidate is not None:
            self._report = self._bound_base = candidate
            self._since = (0.0, 0.0, True)
        else:
            self._report = None
            if self._budget is not None:
                eps_sum, delta_sum, cheap_ok = self._since
                for key, n in new.items():
                    terms = _step_terms(key, self._interval, self._relation, self._budget[1])
                    if terms is None:
                        cheap_ok = False
                        break
                    eps_sum += n * terms[0]
                    delta_sum += n * terms[1]
                self._since = (eps_sum, delta_sum, cheap_ok)
        if self._pending_steps >= max(FLUSH_MIN, self._state_steps * self._flush_ratio):
            self._state = self._report_pld()
            self._state_steps += self._pending_steps
            self._pending, self._pending_steps, self._powers = {}, 0, {}
            self._bound_base, self._since = self._state, (0.0, 0.0, True)

    def _report_pld(self) -> _Composed:
        if self._report is None:
            self._report = compose_groups(self._pending, self._interval, self._relation, self._state, self._powers)
        return self._report

    def _epsilon(self, delta: float) -> float:
        if not self._counts:
            return 0.0
        return self._report_pld().epsilon(delta, self._interval)

    def _get_state(self):
        # The two dicts are updated in place when composing (so they are copied); the PLDs are replaced, never
        # mutated.  The reported PLD and the group PLDs are caches (functions of these), left out.
        state = {name: getattr(self, name) for name in _STATE_FIELDS}
        state["_counts"], state["_pending"] = dict(self._counts), dict(self._pending)
        return state

    def _set_state(self, data) -> None:
        if all(getattr(self, name) is data[name] or getattr(self, name) == data[name] for name in _STATE_FIELDS):
            return  # nothing changed since (a refused charge taken back): keep the caches
        for name in _STATE_FIELDS:
            setattr(self, name, data[name])
        self._counts, self._pending = dict(data["_counts"]), dict(data["_pending"])
        self._report, self._powers = None, {}
        self._version += 1
        self._checked = None


#: The state: everything committed (the caches ``_report`` and ``_powers`` are recomputed when needed).
_STATE_FIELDS = (
    "_counts", "_state", "_state_steps", "_pending", "_pending_steps", "_bound_base", "_since", "_current_relation",
)
