"""Advanced composition: the smallest of several valid bounds on a multiset of (epsilon, delta) steps.

Every event is translated into ``(epsilon, delta)`` terms (:func:`~pate_accountant.accountants.translate.
epsilon_delta_terms`; never an under-count), and the accountant keeps the multiset of terms as a dict
``{(epsilon_i, delta_i): count}`` so that identical steps are recognised.  At a total ``delta`` it reports the
smallest of the bounds that apply:

* ``"basic"``: ``sum epsilon_i`` when ``delta >= sum delta_i`` (Dwork-Roth Thm 3.16);
* ``"drv"``: heterogeneous Dwork-Rothblum-Vadhan with slack ``delta' = delta - sum delta_i > 0``
  (:func:`pate_accountant.composition.drv_from_sums` on running sums);
* ``"kov"``: Kairouz-Oh-Viswanath Thm 3.3, the optimal bound on the grid ``eps0 (k - 2i)`` for ``k``
  identical ``(eps0, delta0)`` steps (:func:`pate_accountant.composition.kov`; listed where
  ``k ln(1 + e^eps0) <= 700``);
* ``"optimal-pure"`` (identical pure steps) and ``"optimal"`` (identical ``(eps0, delta0 > 0)`` steps): the
  exact optimal composition with a continuous ``eps'``: the worst ``(eps0, delta0)`` mechanism
  leaks with probability ``delta0`` and otherwise is binary randomized response, so
  ``delta(eps') = 1 - (1 - delta0)^k (1 - delta_RR(eps'))`` with ``delta_RR`` of
  :func:`pate_accountant.composition.pure_optimal_delta` (:func:`pate_accountant.composition.optimal_epsilon`).
  It equals KOV at KOV's grid points.

Every formula is :mod:`pate_accountant.composition`'s; this module only keeps running sums for DRV and
caches the values per ``(eps0, delta0, k, delta)``.

``bound_name(delta)`` (and ``last_bound``, set by every ``get_epsilon``) says which bound won;
``bounds(delta)`` gives all of them.  ``spent()`` is ``(get_epsilon(d), d)`` with ``d`` the budget's delta, or
the ``target_delta`` keyword (default ``1e-6``) without a budget.  The budget check tries cheap valid bounds
first (basic, DRV, and for a pure step the last certified epsilon plus the step's epsilon) and computes the
optimal bounds only when none fits, so its decision is always that of the smallest bound.

Rounding stays on the safe side (no bound is reported below its exact value): the optimal bound's pure
part gets ``1 - (1 - delta) / (1 - delta0)^k`` from ``log1p`` / ``expm1``, rounded down
(:func:`pate_accountant.composition.pure_part_delta`), and a candidate epsilon must meet it with a relative
margin; DRV's slack is reduced by a bound on the rounding of the summed deltas; a KOV value below the
safely rounded optimum (only possible where a grid point's delta lies within rounding of the target: KOV's
grid test has no safety margin) is dropped.

Neighbouring relation: one for everything charged (``neighboring_relation``, or fixed by the first charge;
see :mod:`pate_accountant.accountants.event_checks`); dp-accounting's Laplace events only under
``"add-remove-one"``.
"""

from __future__ import annotations

import functools
import math

from pate_accountant import composition
from pate_accountant.accountants.base import Accountant, Charge, ReportsAtOneDelta
from pate_accountant.accountants.event_checks import check_native_relation
from pate_accountant.accountants.translate import epsilon_delta_terms
from pate_accountant.validation import check_real

__all__ = ["AdvancedCompositionAccountant", "BOUND_NAMES"]

#: The bounds the accountant compares, in the order used to break ties.
BOUND_NAMES = ("optimal-pure", "optimal", "kov", "drv", "basic")

#: ``"kov"`` is listed only where ``k ln(1 + e^eps0)`` is at most this: the range of dp-accounting's KOV (it
#: computes ``(1 + e^eps0)^k`` as a float), which this accountant used to call.  Kept so that ``bounds()``
#: lists what it always listed; :func:`pate_accountant.composition.kov` itself has no such limit, and the
#: optimal bound (never above KOV, so KOV is never the one reported) is computed at every ``k``.
_KOV_MAX_LOG = 700.0
#: Unit roundoff bound for the error bounds on running sums (twice the double-precision unit roundoff).
_ULP = 2.0**-52


# Both are cached per (eps0, delta0, k, delta); composition's own per-k cache of the k + 1 binomial weights is
# bypassed (cache=False): a budgeted accountant asks for a new k at every charge.
@functools.lru_cache(maxsize=4096)
def _kov(epsilon0: float, delta0: float, k: int, delta: float) -> float:
    """KOV Thm 3.3 (``inf`` where it does not apply or is not reported, see ``_KOV_MAX_LOG``)."""
    if k * math.log1p(math.exp(epsilon0)) > _KOV_MAX_LOG:
        return math.inf
    return composition.kov(epsilon0, delta0, k, delta, cache=False)


@functools.lru_cache(maxsize=4096)
def _optimal(epsilon0: float, delta0: float, k: int, delta: float) -> float:
    """Optimal composition of ``k`` identical ``(epsilon0, delta0)`` steps at total ``delta`` (never below the
    exact value; :func:`pate_accountant.composition.optimal_epsilon`)."""
    return composition.optimal_epsilon(k, epsilon0, delta0, delta, cache=False)


class AdvancedCompositionAccountant(ReportsAtOneDelta, Accountant):
    """Heterogeneous DRV, KOV and exact optimal composition for identical steps, basic composition: the
    smallest valid bound.  Neighbouring relation: one for everything charged (the
    keyword ``neighboring_relation``, or the relation the first charged event states; an event stated under
    another one is refused, and dp-accounting's events are read under it).

    Keywords: ``budget=(epsilon, delta)``, ``ledger``, ``target_delta`` (the delta ``spent()`` reports at
    when there is no budget; default ``1e-6``), ``neighboring_relation`` (default ``None``).
    """

    kind = "advanced"
    parallel_composition = "event"  # docs/groups.md

    def __init__(self, *, budget=None, ledger=None, target_delta: float = 1e-6, neighboring_relation=None):
        self._target_delta = check_real("target_delta", target_delta, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
        self._classes: dict[tuple[float, float], int] = {}
        # Running sums: (sum eps, sum delta, sum eps^2, sum eps (e^eps - 1), a bound on the rounding error of
        # the sum of deltas).  The streaming state of DRV (the charge check must not walk the whole history):
        # the bound itself is composition.drv_from_sums on these sums.
        self._sums = (0.0, 0.0, 0.0, 0.0, 0.0)
        # With a budget: a valid epsilon at the budget's delta for everything charged (so that a pure step can
        # often be accepted by basic composition without re-running the optimal bound).
        self._certified: float | None = 0.0
        self.last_bound: str | None = None
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=neighboring_relation)

    def _config(self) -> dict:
        config = {"target_delta": self._target_delta}
        if self._configured_relation is not None:
            config["neighboring_relation"] = self._configured_relation
        return config

    @property
    def classes(self) -> dict:
        """``{(epsilon_i, delta_i): count}`` of the charged steps (a copy)."""
        return dict(self._classes)

    # -- the accountant hooks -----------------------------------------------------------------------------
    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        """O(size of the event), plus the epsilon bounds when there is a budget."""
        new: dict[tuple[float, float], int] = {}
        for eps, delta, mult in epsilon_delta_terms(charge.event):  # UnsupportedEventError names the event
            if eps > 0.0 or delta > 0.0:
                new[(eps, delta)] = new.get((eps, delta), 0) + mult * charge.count
        relation = self._relation_after(charge.event)  # UnsupportedEventError naming both relations
        check_native_relation(charge.event, relation, who=type(self).__name__)
        s_eps, s_delta, s_sq, s_drift, s_error = self._sums
        for (eps, delta), n in new.items():
            sq, drift = composition.drv_terms(eps, n)
            s_eps += n * eps
            s_delta += n * delta
            s_sq += sq
            s_drift += drift
            s_error += 2.0 * _ULP * s_delta  # the product and the addition round once each
        sums = (s_eps, s_delta, s_sq, s_drift, s_error)
        certified = None  # a replayed row (no budget check) leaves no certified epsilon
        if enforce_budget and self._budget is not None:
            budget_eps, budget_delta = self._budget
            certified = min(_cheap_bounds(sums, budget_delta).values(), default=math.inf)
            pure = all(delta == 0.0 for _, delta in new)
            if certified > budget_eps and pure and self._certified is not None:
                # Basic composition of the charged block (certified at the budget's delta) with the new pure steps.
                certified = self._certified + sum(n * eps for (eps, _), n in new.items())
            if certified > budget_eps:
                # The optimal bounds are evaluated only when the cheap ones do not fit.
                certified, _ = _smallest(_all_bounds(_single_class(self._classes, new), sums, budget_delta))
                if not self._within_budget(certified, budget_delta):
                    self._refuse(f"charging {charge.event!r} x{charge.count}", certified, budget_delta)
        if not do_compose:
            return
        self._sums, self._certified = sums, certified
        for key, n in new.items():
            self._classes[key] = self._classes.get(key, 0) + n
        self._set_relation(relation)

    def _epsilon(self, delta: float) -> float:
        value, name = _smallest(self.bounds(delta))
        self.last_bound = name
        return value

    def _get_state(self):
        # The dict is updated in place when composing (so it is copied); the rest is replaced.
        return dict(self._classes), self._sums, self._certified, self._current_relation

    def _set_state(self, data) -> None:
        classes, self._sums, self._certified, self._current_relation = data
        self._classes = dict(classes)

    # -- reporting ------------------------------------------------------------------------------------------
    def bounds(self, delta: float) -> dict[str, float]:
        """Every bound that applies at total ``delta`` (name -> epsilon); ``{}`` if none does."""
        delta = check_real("delta", delta, minimum=0.0, maximum=1.0)
        return _all_bounds(_single_class(self._classes, {}), self._sums, delta)

    def bound_name(self, delta: float) -> str | None:
        """Which bound ``get_epsilon(delta)`` reports (``None`` when none applies: epsilon is ``inf``)."""
        return _smallest(self.bounds(delta))[1]


def _cheap_bounds(sums, delta: float) -> dict[str, float]:
    s_eps, s_delta, s_sq, s_drift, s_error = sums
    if s_eps == 0.0 and s_delta == 0.0:
        return {"basic": 0.0}
    out = {}
    if delta >= s_delta:
        out["basic"] = s_eps
    # DRV's slack delta' = delta - sum delta_i, rounded down: the sum's own rounding (s_error) and that of the
    # difference are taken off, so that a slack near zero is never overstated (ln(1/delta') would be too small).
    slack = (delta - s_delta) - s_error - _ULP * delta
    if 0.0 < slack < 1.0:
        out["drv"] = composition.drv_from_sums(s_sq, s_drift, slack)
    return out


def _single_class(classes: dict, new: dict):
    """``(eps0, delta0, k)`` when ``classes`` plus ``new`` hold one class of identical steps, else ``None``."""
    if len(classes) > 1 or len(new) > 1:
        return None
    merged = dict(classes)
    for key, n in new.items():
        merged[key] = merged.get(key, 0) + n
    if len(merged) != 1:
        return None
    ((eps0, delta0), k), = merged.items()
    return eps0, delta0, k


def _all_bounds(single, sums, delta: float) -> dict[str, float]:
    out = _cheap_bounds(sums, delta)
    if single is not None:
        eps0, delta0, k = single
        optimal = _optimal(eps0, delta0, k, delta)
        if math.isfinite(optimal):
            out["optimal-pure" if delta0 == 0.0 else "optimal"] = optimal
        if eps0 > 0.0:
            kov = _kov(eps0, delta0, k, delta)
            # KOV's grid value is never below the exact optimum; dp-accounting's test of it computes
            # 1 - (1 - delta0)^k (1 - delta_i) in plain floats, so a grid value below our safely rounded
            # optimum (or where that optimum cannot be certified) is a rounding artefact and is dropped.
            if math.isfinite(kov) and math.isfinite(optimal) and kov >= optimal:
                out["kov"] = kov
    return out


def _smallest(bounds: dict[str, float]) -> tuple[float, str | None]:
    best, name = math.inf, None
    for candidate in BOUND_NAMES:
        value = bounds.get(candidate)
        if value is not None and value < best:
            best, name = value, candidate
    return best, name
