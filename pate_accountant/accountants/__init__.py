"""Privacy accountants sharing one contract (``pate_accountant.accountants.base.Accountant``)."""

from pate_accountant.accountants.advanced import AdvancedCompositionAccountant
from pate_accountant.accountants.base import Accountant, Charge
from pate_accountant.accountants.basic import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant
from pate_accountant.accountants.pld import PldAccountant
from pate_accountant.accountants.rdp import RdpAccountant
from pate_accountant.accountants.target_charging import TargetChargingAccountant

__all__ = [
    "Accountant",
    "AdvancedCompositionAccountant",
    "BasicCompositionAccountant",
    "Charge",
    "IndividualChargingAccountant",
    "PldAccountant",
    "RdpAccountant",
    "TargetChargingAccountant",
]
