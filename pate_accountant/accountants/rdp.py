"""Renyi-DP accountant: a bridge to ``dp_accounting.rdp.RdpAccountant``.

Translation (never an under-count):

====================================================  =====================================================
event                                                 what dp-accounting's RDP accountant composes
====================================================  =====================================================
pure steps: ``EpsilonDeltaEvent(eps, 0)`` (and        ``ZCDpEvent(rho=eps**2 / 2)``: every pure ``eps``-DP
``NoisyArgMaxEvent`` / ``WeightedSamplingEvent``      mechanism is ``eps**2 / 2``-zCDP (Bun-Steinke 2016,
with ``delta = 0``), ``BetweenThresholdsEvent``,      Prop. 1.4), under the relation the event states.
a ``BoundaryWrapperEvent`` around a pure inner step   Never ``LaplaceDpEvent(1 / eps)``: the Laplace RDP
                                                      curve is not an upper bound for every ``eps``-DP step
``BoundedRangeEvent(eps)`` (the clipped-logit         ``ZCDpEvent(rho=eps**2 / 8)``: ``eps``-bounded range
exponential mechanism)                                is ``eps**2 / 8``-zCDP (Cesar-Rogers 2021)
``SparseVectorEpisodeEvent(eps, svt, draw)`` (Amin   ``ZCDpEvent(rho=svt**2 / 2 + draw**2 / 8)``: a pure
et al.'s public agreement: one episode)               AboveThreshold run and a bounded-range draw
``DiscreteGaussianSumEvent`` (Tang et al.'s Gaussian  ``ZCDpEvent(rho=event.rho)``: untruncated discrete
on averaged distributions)                            Gaussian noise, ``sensitivity^2 / (2 sigma^2)``-zCDP
                                                      (Canonne-Kamath-Steinke 2020, Thm. 14); its stated
                                                      ``(eps, delta)`` is not used
approximate steps ``(eps, delta > 0)``                rejected (``UnsupportedEventError`` naming the event):
                                                      an RDP curve cannot carry a delta
dp-accounting's native events (``GaussianDpEvent``,   passed through unchanged, if a scratch
``LaplaceDpEvent``, ``ZCDpEvent``,                    ``dp_accounting.rdp.RdpAccountant`` with the same
``PoissonSampledDpEvent``, ``RandomizedResponse``,    orders and relation ``supports`` them
``SampledWithoutReplacement``, ``RepeatAndSelect``,
tree aggregation, ...)
``ComposedDpEvent``, ``SelfComposedDpEvent``          their parts (so they may mix ours and native ones)
``NoOpDpEvent``                                       nothing
``ThresholdPrivacyEvent``, ``NonPrivateDpEvent``      rejected, naming the event
====================================================  =====================================================

Neighbouring relation: one for everything charged, the keyword ``neighboring_relation`` or (left ``None``,
the default) the relation the first charged event states, ``"replace-one"`` when that event is one of
dp-accounting's.  Our events stating another relation are refused (``UnsupportedEventError`` naming both
relations); the zCDP translation of an event holds under the relation it states.  dp-accounting's native
events are read under the accountant's relation (their noise relative to a query of sensitivity one under
it), which is passed to dp-accounting: ``PoissonSampledDpEvent`` needs ``"add-remove-one"``,
``RandomizedResponseDpEvent`` and ``SampledWithoutReplacementDpEvent`` need ``"replace-one"`` (Gaussian,
Laplace and zCDP are the same under either).  Every event's parameters are checked first (``Charge`` refuses
a non-finite, zero or negative noise, count or rate with a ``ValueError`` naming it), and dp-accounting's
event types whose parameters this project does not check are refused.

RDP composes by adding curves, so the accountant keeps the summed curve (one value per order) and each
event's curve is computed once by a scratch dp-accounting accountant (and cached).  Check-then-commit: the
candidate curve is summed and its epsilon computed before anything changes.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from pate_accountant.accountants.base import Accountant, Charge, ReportsAtOneDelta
from pate_accountant.accountants.event_checks import DEFAULT_RELATION, SHIFT_NOISE, check_native_relation, check_relation
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.errors import UnsupportedEventError
from pate_accountant.events import (
    ADD_REMOVE_ONE,
    REPLACE_ONE,
    BetweenThresholdsEvent,
    BoundaryWrapperEvent,
    BoundedRangeEvent,
    DiscreteGaussianSumEvent,
    SparseVectorEpisodeEvent,
    EpsilonDeltaEvent,
    ThresholdPrivacyEvent,
)
from pate_accountant.validation import check_real

__all__ = ["RdpAccountant", "rdp_translation"]

_SHIFT_NOISE_RDP = SHIFT_NOISE + (dp_event.GaussianDpEvent,)
_RELATIONS = {ADD_REMOVE_ONE: NeighboringRelation.ADD_OR_REMOVE_ONE, REPLACE_ONE: NeighboringRelation.REPLACE_ONE}


def rdp_translation(event) -> list[tuple[dp_event.DpEvent, int]]:
    """``[(dp-accounting event, multiplicity), ...]`` composing to an upper bound on ``event``.

    Our pure steps become ``ZCDpEvent(eps**2 / 2)``; dp-accounting's own events are returned as they are
    (whether dp-accounting supports them is checked by the accountant); anything with a delta, threshold
    privacy and non-private steps raise ``UnsupportedEventError`` naming the event.
    """
    out: list = []
    _collect(event, 1, out, event)
    return out


def _collect(event, n: int, out: list, top) -> None:
    def refuse(why: str):
        inner = "" if event is top else f" (in {top!r})"
        return UnsupportedEventError(f"RdpAccountant cannot account for event {event!r}{inner}: {why}")

    if isinstance(event, (BoundedRangeEvent, SparseVectorEpisodeEvent)):  # bounded range: epsilon**2 / 8-zCDP
        if event.delta > 0.0:
            raise refuse("a bounded-range step has no delta")
        if event.epsilon > 0.0:
            out.append((dp_event.ZCDpEvent(rho=event.rho), n))
    elif isinstance(event, DiscreteGaussianSumEvent):  # untruncated discrete Gaussian noise: its rho exactly
        out.append((dp_event.ZCDpEvent(rho=event.rho), n))
    elif isinstance(event, (EpsilonDeltaEvent, BetweenThresholdsEvent, BoundaryWrapperEvent)):
        for eps, delta, m in epsilon_delta_terms(event):
            if delta > 0.0:
                raise refuse(
                    f"it is ({eps:g}, {delta:g})-DP with delta > 0, and an RDP curve cannot represent a delta "
                    "(use PldAccountant or AdvancedCompositionAccountant)"
                )
            if eps > 0.0:
                out.append((dp_event.ZCDpEvent(rho=eps * eps / 2.0), n * m))
    elif isinstance(event, ThresholdPrivacyEvent):
        raise refuse("threshold privacy is not differential privacy")
    elif isinstance(event, dp_event.NonPrivateDpEvent):
        raise refuse("a non-private step has no finite privacy loss")
    elif isinstance(event, dp_event.NoOpDpEvent):
        return
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        if event.count > 0:
            _collect(event.event, n * event.count, out, top)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            _collect(part, n, out, top)
    elif isinstance(event, dp_event.DpEvent) and type(event).__module__ == dp_event.__name__:
        out.append((event, n))  # a native dp-accounting event: the accountant asks dp-accounting
    else:
        raise refuse("no RDP translation for this event")


@functools.lru_cache(maxsize=4096)
def _curve_cached(event, orders: tuple, relation: str) -> np.ndarray:
    return _curve(event, orders, relation)


def _curve(event, orders: tuple, relation: str) -> np.ndarray:
    """The RDP curve of one native dp-accounting ``event``, from a scratch dp-accounting accountant."""
    scratch = rdp_lib.RdpAccountant(list(orders), _RELATIONS[relation])
    if not scratch.supports(event):
        raise UnsupportedEventError(
            f"RdpAccountant cannot account for event {event!r}: dp-accounting's RDP accountant does not support "
            f'it under neighboring_relation="{relation}" (randomized response and sampling without replacement '
            'need "replace-one", Poisson sampling needs "add-remove-one")'
        )
    scratch.compose(event)
    curve = np.array(scratch._rdp, dtype=np.float64)  # noqa: SLF001  (dp-accounting 0.6.0 keeps the curve here)
    curve.setflags(write=False)
    return curve


def _event_curve(event, orders: tuple, relation: str) -> np.ndarray:
    try:
        hash(event)
    except TypeError:  # an unhashable event (e.g. one holding a list)
        return _curve(event, orders, relation)
    return _curve_cached(event, orders, relation)


class RdpAccountant(ReportsAtOneDelta, Accountant):
    """Renyi-DP composition through dp-accounting: pure steps as zCDP, native
    dp-accounting events as they are; approximate ``(eps, delta > 0)`` steps are rejected.

    Keywords: ``budget=(epsilon, delta)``, ``ledger``, ``orders`` (default dp-accounting's
    ``DEFAULT_RDP_ORDERS``), ``target_delta`` (the delta ``spent()`` reports at without a budget; default
    ``1e-6``) and ``neighboring_relation`` (``None``, the default: fixed by the first charge; or
    ``"replace-one"`` / ``"add-remove-one"``; passed to dp-accounting for its native events).  ``spent()`` is ``(get_epsilon(d), d)`` with ``d`` the budget's
    delta, else ``target_delta``; the epsilon is dp-accounting's RDP-to-DP conversion of the summed curve.
    """

    kind = "rdp"
    parallel_composition = "event"  # docs/groups.md

    def __init__(
        self,
        *,
        budget=None,
        ledger=None,
        orders=None,
        target_delta: float = 1e-6,
        neighboring_relation: str | None = None,
    ):
        self._default_orders = orders is None
        if orders is None:
            orders = rdp_lib.DEFAULT_RDP_ORDERS
        orders = tuple(float(check_real("order", a, minimum=1.0, min_open=True)) for a in orders)
        if not orders:
            raise ValueError("orders must not be empty")
        self._orders = orders
        self._target_delta = check_real("target_delta", target_delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        check_relation("neighboring_relation", neighboring_relation)
        self._rdp = np.zeros(len(orders))
        self._rdp.setflags(write=False)
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=neighboring_relation)

    def _config(self) -> dict:
        orders = None if self._default_orders else list(self._orders)
        return {"orders": orders, "target_delta": self._target_delta, "neighboring_relation": self._configured_relation}

    @property
    def orders(self) -> tuple:
        return self._orders

    @property
    def rdp(self) -> np.ndarray:
        """The summed RDP curve (read-only), one value per order."""
        return self._rdp

    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        parts = rdp_translation(charge.event)
        relation = self._relation_after(charge.event)  # UnsupportedEventError naming both relations
        # Under replace-one dp-accounting's RDP reads Gaussian and Laplace noise as a shift of one, its PLD
        # as a shift of two: the cheaper reading is refused.
        check_native_relation(charge.event, relation, add_remove_only=_SHIFT_NOISE_RDP, who=type(self).__name__)
        curve = np.zeros(len(self._orders))
        for event, n in parts:
            curve += n * _event_curve(event, self._orders, relation or DEFAULT_RELATION)
        candidate = self._rdp + charge.count * curve
        candidate.setflags(write=False)
        if enforce_budget and self._budget is not None and parts:
            eps = _epsilon(self._orders, candidate, self._budget[1])
            if not self._within_budget(eps, self._budget[1]):
                self._refuse(f"charging {charge.event!r} x{charge.count}", eps, self._budget[1])
        if do_compose:
            self._rdp = candidate
            self._set_relation(relation)

    def _epsilon(self, delta: float) -> float:
        return _epsilon(self._orders, self._rdp, delta)

    def _get_state(self):
        return self._rdp, self._current_relation  # the curve is read-only: replaced, never mutated

    def _set_state(self, data) -> None:
        self._rdp, self._current_relation = data


def _epsilon(orders: tuple, rdp: np.ndarray, delta: float) -> float:
    if not np.any(rdp > 0.0):
        return 0.0
    if delta <= 0.0:
        return math.inf
    eps, _ = rdp_lib.compute_epsilon(orders, rdp, delta)
    return max(0.0, float(eps))
