"""Basic composition: epsilons add up and deltas add up (Dwork-Roth Thm 3.16)."""

from __future__ import annotations

from pate_accountant.accountants.base import Accountant, Charge
from pate_accountant.accountants.translate import epsilon_delta_terms

__all__ = ["BasicCompositionAccountant"]


class BasicCompositionAccountant(Accountant):
    """``(sum eps_i, sum delta_i)`` over everything charged; ``get_epsilon(delta)`` is ``sum eps_i`` when
    ``delta >= sum delta_i`` and ``inf`` otherwise."""

    kind = "basic"

    def __init__(self, *, budget=None, ledger=None):
        self._epsilon_total = 0.0
        self._delta_total = 0.0
        super().__init__(budget=budget, ledger=ledger)

    def _prepare(self, charge: Charge):
        terms = epsilon_delta_terms(charge.event)
        eps = self._epsilon_total + charge.count * sum(e * m for e, _, m in terms)
        delta = min(1.0, self._delta_total + charge.count * sum(d * m for _, d, m in terms))
        if not self._within_budget(eps, delta):
            self._refuse(f"charging {charge.event!r} x{charge.count}", eps, delta)
        return eps, delta

    def _commit(self, plan) -> None:
        self._epsilon_total, self._delta_total = plan

    def _epsilon(self, delta: float) -> float:
        return self._epsilon_total if delta >= self._delta_total else float("inf")

    def spent(self) -> tuple[float, float]:
        return self._epsilon_total, self._delta_total
