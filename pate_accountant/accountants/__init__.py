"""Privacy accountants sharing one contract (``pate_accountant.accountants.base.Accountant``)."""

from pate_accountant.accountants.base import Accountant, Charge
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant

__all__ = [
    "Accountant",
    "BasicCompositionAccountant",
    "Charge",
    "IndividualChargingAccountant",
    "TargetChargingAccountant",
]
