"""Privacy accountants sharing one contract (``pate_accountant.accountants.base.Accountant``)."""

# parallel registers the group views that Accountant.parallel_groups hands out (they subclass Accountant).
from pate_accountant.accountants import parallel  # noqa: F401
from pate_accountant.accountants.advanced import AdvancedCompositionAccountant
from pate_accountant.accountants.base import Accountant, AccountantState, Charge, Remaining
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.accountants.pld import PldAccountant
from pate_accountant.accountants.rdp import RdpAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant
from pate_accountant.registry import accountant_class, register_accountant

# The built-in accountants, in the one registry (pate_accountant.registry).  ``runs``: offered by
# ``generate``/``demo`` (buildable from a budget alone, or from the run as individual charging is; RDP charges the
# pure steps, the zCDP of clipped-logit sampling among them, and refuses a step with a delta before the run).
for _cls, _runs in (
    (BasicCompositionAccountant, True),
    (AdvancedCompositionAccountant, True),
    (PldAccountant, True),
    (TargetChargingAccountant, True),
    (RdpAccountant, True),
    (IndividualChargingAccountant, True),
):
    register_accountant(_cls, runs=_runs)
del _cls, _runs


def remaining_of(kind: str, spent, budget) -> Remaining:
    """What a ledger's budget has left after ``spent``, for the accountant ``kind`` it is kept by: what ``audit``
    and ``ledger list`` print, the same computation as :meth:`Accountant.remaining_budget` (:class:`Remaining`)."""
    return Remaining.of(spent, budget, delta_adds_up=bool(getattr(accountant_class(kind), "delta_adds_up", False)))


__all__ = [
    "Accountant",
    "AccountantState",
    "AdvancedCompositionAccountant",
    "BasicCompositionAccountant",
    "Charge",
    "IndividualChargingAccountant",
    "PldAccountant",
    "RdpAccountant",
    "Remaining",
    "TargetChargingAccountant",
    "remaining_of",
]
