"""Basic composition: epsilons add up and deltas add up (Dwork-Roth Thm 3.16)."""

from __future__ import annotations

from pate_accountant.accountants.base import Accountant, Charge
from pate_accountant.accountants.event_checks import check_native_relation
from pate_accountant.accountants.translate import epsilon_delta_terms

__all__ = ["BasicCompositionAccountant"]


class BasicCompositionAccountant(Accountant):
    """``(sum eps_i, sum delta_i)`` over everything charged; ``get_epsilon(delta)`` is ``sum eps_i`` when
    ``delta >= sum delta_i`` and ``inf`` otherwise.

    Keywords: ``budget=(epsilon, delta)``, ``ledger``, ``neighboring_relation`` (``None``, the default: the
    first charged event fixes it; ``"replace-one"`` or ``"add-remove-one"``): events stated under another
    relation are refused, and dp-accounting's events are read under this one.
    """

    kind = "basic"
    delta_adds_up = True
    parallel_composition = "event"  # docs/groups.md

    def __init__(self, *, budget=None, ledger=None, neighboring_relation=None):
        self._epsilon_total = 0.0
        self._delta_total = 0.0
        super().__init__(budget=budget, ledger=ledger, neighboring_relation=neighboring_relation)

    def _config(self) -> dict:
        if self._configured_relation is None:
            return {}
        return {"neighboring_relation": self._configured_relation}

    def _maybe_compose(self, charge: Charge, do_compose: bool, *, enforce_budget: bool = True) -> None:
        terms = epsilon_delta_terms(charge.event)
        relation = self._relation_after(charge.event)  # UnsupportedEventError naming both relations
        check_native_relation(charge.event, relation, who=type(self).__name__)
        eps = self._epsilon_total + charge.count * sum(e * m for e, _, m in terms)
        delta = min(1.0, self._delta_total + charge.count * sum(d * m for _, d, m in terms))
        if enforce_budget and not self._within_budget(eps, delta):
            self._refuse(f"charging {charge.event!r} x{charge.count}", eps, delta)
        if do_compose:
            self._epsilon_total, self._delta_total = eps, delta
            self._set_relation(relation)

    def _get_state(self):
        return self._epsilon_total, self._delta_total, self._current_relation

    def _set_state(self, data) -> None:
        self._epsilon_total, self._delta_total, self._current_relation = data

    def _epsilon(self, delta: float) -> float:
        return self._epsilon_total if delta >= self._delta_total else float("inf")

    def spent(self) -> tuple[float, float]:
        return self._epsilon_total, self._delta_total
