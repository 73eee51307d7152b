"""Privacy accountants sharing one contract (``pate_accountant.accountants.base.Accountant``)."""

from pate_accountant.accountants.base import Accountant, Charge
from pate_accountant.accountants.basic import BasicCompositionAccountant

__all__ = ["Accountant", "BasicCompositionAccountant", "Charge"]
