"""What an accountant's charge is written through: its position in the ledger and the write transaction's rows.

:class:`_Position` is what one attached accountant has seen (the last row and confidential row, with their
hashes).  :class:`_Transaction` is what :meth:`Ledger.transaction` yields: the accountant appends each charge it
has checked and applied; when the block ends the charges become chained rows (:mod:`.chain`), hit rows sealed
with a commitment and a confidential row (:mod:`.confidential`), and the store appends them inside its write
transaction (:mod:`.store`).
"""

from __future__ import annotations

import math
import weakref

from pate_accountant._ledger.chain import _row_hash
from pate_accountant._ledger.codec import charge_class
from pate_accountant._ledger.confidential import (
    HIT_OUTCOMES,
    _confidential_row_hash,
    seal,
)

#: When a writer stores the spent totals: after the last row of each transaction (the other rows of a
#: batch store NULL; the default: one ``spent()`` per batch), or after every row.
TOTALS_MODES = ("transaction", "row")


class _Position:
    """What one attached accountant has seen: ``mark = (last row id, its hash, last confidential row id, its
    hash)``, replaced as a whole (one attribute store), so that it never names a half-updated position."""

    __slots__ = ("ref", "mark", "confidential")

    def __init__(self, accountant, confidential: bool = False):
        try:
            self.ref = weakref.ref(accountant)
        except TypeError:  # no weak references (a class with __slots__): hold it
            self.ref = lambda: accountant
        self.mark = (0, None, 0, None)
        self.confidential = confidential

    @property
    def last_id(self) -> int:
        return self.mark[0]

    @property
    def last_hash(self) -> str | None:
        return self.mark[1]

    @property
    def conf_id(self) -> int:
        return self.mark[2]

    @property
    def conf_hash(self) -> str | None:
        return self.mark[3]


class _Transaction:
    """What ``Ledger.transaction(accountant)`` yields: the accountant appends each charge it has checked and
    applied with ``append(charge)``; the ledger writes the rows, with the accountant's ``spent()``, when
    the block ends, then commits.  ``committed`` says whether the rows are in the ledger *and* the
    accountant's position has moved past them (so the accountant keeps the charges)."""

    def __init__(self, ledger, accountant, position: _Position, head_rows: int, head_hash: str | None,
                 conf_head: tuple | None = None):
        self._ledger = ledger
        self._accountant = accountant
        self._position = position
        self._head_rows = head_rows
        self._head_hash = head_hash
        self._conf_head = conf_head  # (row_count, last_hash) of the confidential file, or None
        self._charges: list = []
        self._totals: list = []
        self._new_mark = None  # the position after the rows, once written
        self._closed = False

    @property
    def committed(self) -> bool:
        return self._new_mark is not None and self._position.mark is self._new_mark

    def append(self, charge) -> None:
        """Add the row of ``charge``, which the accountant has just checked and applied (its ``spent()`` now
        includes it).  With ``totals="row"`` the ledger reads ``spent()`` for this row now; otherwise once,
        for the transaction's last row, when the block ends."""
        if self._closed:
            raise RuntimeError("the transaction is over: append inside its block")
        if not isinstance(charge, charge_class()):
            raise TypeError(f"append takes one Charge, got {type(charge).__name__}")
        if charge.group is not None and charge.group[0] != self._ledger._run:
            raise ValueError(f"a charge of group {charge.group[1]} of run {charge.group[0]} cannot be written by this "
                             f"ledger object, whose run is {self._ledger._run}")
        self._charges.append(charge)
        self._totals.append(self._spent(charge) if self._ledger._totals == "row" else None)

    def _spent(self, charge) -> tuple[float, float]:
        epsilon, delta = self._accountant.spent()
        epsilon, delta = float(epsilon), float(delta)
        if math.isnan(epsilon) or math.isnan(delta):
            raise ValueError(f"accountant reports a NaN spent total after {charge!r}")
        return epsilon, delta

    def _write(self) -> None:
        """Write the appended rows (inside the write transaction, before its commit); compute the new mark.

        With a confidential file, each hit charge's teacher set goes there (with its salt), the shareable row
        gets the commitment, and the totals go to the confidential file only; other teacher sets are dropped.
        """
        self._closed = True
        charges, spent = self._charges, self._totals
        confidential = self._conf_head is not None
        conf_id, conf_prev = self._conf_head if confidential else (0, None)
        if not charges:
            self._new_mark = (self._head_rows, self._head_hash, conf_id, conf_prev)
            return
        if spent[-1] is None:
            spent[-1] = self._spent(charges[-1])
        ledger = self._ledger
        prev = self._head_hash if self._head_rows else ledger._genesis()
        conf_genesis = ledger._confidential_genesis() if confidential and not conf_id else None
        row_id = self._head_rows
        created = ledger._row_time()  # the run's start, never the charge's own (data-dependent) time
        run = ledger._run
        rows, conf_rows, totals_rows = [], [], []
        for charge, totals in zip(charges, spent):
            row_id += 1
            group = None if charge.group is None else charge.group[1]
            event_text = ledger._codec.encode(charge.event)
            commitment = salt = teachers_text = None
            if confidential and charge.outcome in HIT_OUTCOMES:
                teachers_text, salt, commitment = seal(charge.charged_teachers, row_id)
            stored = (None, None) if (totals is None or confidential) else totals
            digest = _row_hash(prev, row_id, event_text, charge.count, charge.outcome, commitment, stored[0],
                               stored[1], created, ledger._writer, run, group)
            rows.append((row_id, prev, digest, event_text, charge.count, charge.outcome, commitment, stored[0],
                         stored[1], created, ledger._writer, run, group))
            if commitment is not None:
                conf_id += 1
                link_prev = conf_prev if conf_prev is not None else conf_genesis
                conf_digest = _confidential_row_hash(link_prev, conf_id, row_id, digest, salt, teachers_text)
                conf_rows.append((conf_id, link_prev, conf_digest, row_id, digest, salt, teachers_text))
                conf_prev = conf_digest
            if confidential and totals is not None:
                totals_rows.append((row_id, digest, totals[0], totals[1]))
            prev = digest
        store = ledger._store
        if confidential:  # committed first (see LedgerStore.write)
            store.append_confidential(conf_rows, totals_rows, conf_id, conf_prev)
        store.append_rows(rows, row_id, prev)
        self._new_mark = (row_id, prev, conf_id, conf_prev)
