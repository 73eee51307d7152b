"""What one run of a mechanism releases."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attr
import dp_accounting

#: Outcome classes a ledger records: a released token (or answer), a fail, a q-target hit, and
#: BetweenThresholds' ``below`` (the count is under the lower threshold: an answer, but no token released).
TOKEN, FAIL, TARGET, BELOW = "token", "fail", "target", "below"
OUTCOMES = (TOKEN, FAIL, TARGET, BELOW)


def _check_event(instance, attribute, value):
    if not isinstance(value, dp_accounting.DpEvent):
        raise TypeError(f"{attribute.name} must be a dp_accounting.DpEvent, got {type(value).__name__}")


def _check_teachers(instance, attribute, value):
    for teacher in value:
        if isinstance(teacher, bool) or not isinstance(teacher, int) or teacher < 0:
            raise ValueError(f"{attribute.name} must hold non-negative teacher indices, got {teacher!r}")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Release:
    """The output of one mechanism run.

    ``value`` is the released token (or outcome label); ``None`` means the mechanism failed (the
    paper's ``fail``/abstain outcome).  ``event`` is the privacy event the run is charged as,
    ``target_hit`` says whether a q-target outcome occurred (``None`` when the mechanism has no
    target), ``charged_teachers`` lists the teachers an individual-charging accountant charges, and
    ``info`` holds further released values (for example the noisy count of the released token).
    """

    value: Any
    event: dp_accounting.DpEvent = attr.ib(validator=_check_event)
    target_hit: bool | None = None
    charged_teachers: frozenset = attr.ib(default=frozenset(), converter=frozenset, validator=_check_teachers)
    #: Further *released* (already privatised) values, e.g. a noisy count; never raw counts or data.
    info: Mapping = attr.ib(factory=dict, converter=lambda m: MappingProxyType(dict(m)), eq=False, hash=False)

    @property
    def failed(self) -> bool:
        return self.value is None

    @property
    def outcome(self) -> str:
        """The class a ledger records: ``"target"`` (a q-target hit), ``"fail"`` (``value is None``),
        ``"below"`` (BetweenThresholds' answer ``"below"``: nothing released) or ``"token"``."""
        if self.target_hit:
            return TARGET
        if self.value is None:
            return FAIL
        return BELOW if isinstance(self.value, str) and self.value == BELOW else TOKEN
