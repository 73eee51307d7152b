"""What one run of a mechanism releases."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attr
import dp_accounting
import numpy as np

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


def batch_outcome_classes(target_hit, failed=None, outcomes=None) -> np.ndarray:
    """The outcome class of each query of a batch (a ``str`` array): ``outcomes`` as given (each one of
    :data:`OUTCOMES`, ``"target"`` exactly where ``target_hit``), else ``"target"`` on hits, ``"fail"`` where
    ``failed`` and ``"token"`` otherwise.  ``target_hit`` is a 1-d boolean array; raises before anything."""
    hit = np.asarray(target_hit)
    if failed is not None and outcomes is not None:
        raise ValueError("give failed or outcomes, not both")
    if outcomes is not None:
        classes = np.asarray(outcomes).astype(str)
        if classes.shape != hit.shape:
            raise TypeError(f"outcomes must have shape {hit.shape}, got {classes.shape}")
        unknown = sorted(set(classes.tolist()) - set(OUTCOMES))
        if unknown:
            raise ValueError(f"outcomes must be among {OUTCOMES}, got {unknown[0]!r}")
        if not np.array_equal(classes == TARGET, hit.astype(bool)):
            raise ValueError('outcomes must be "target" exactly where target_hit is true')
        return classes
    classes = np.full(hit.shape, TOKEN, dtype="<U6")
    if failed is not None:
        fail = np.asarray(failed)
        if fail.dtype != np.bool_ or fail.shape != hit.shape:
            raise TypeError(f"failed must be a boolean array of shape {hit.shape}, got {fail.dtype} {fail.shape}")
        classes[fail] = FAIL
    classes[hit.astype(bool)] = TARGET
    return classes


def batch_outcomes(batch):
    """A batch release's outcome classes: its ``outcomes`` when it has them, else classes from its
    ``target_hit`` and ``failed`` arrays (:func:`batch_outcome_classes`)."""
    outcomes = getattr(batch, "outcomes", None)
    if outcomes is not None:
        return outcomes
    return batch_outcome_classes(batch.target_hit, getattr(batch, "failed", None))
