"""The ledger's exceptions (re-exported by :mod:`pate_accountant.ledger`, where they are documented)."""

from __future__ import annotations

from pate_accountant.errors import PateAccountantError


class LedgerError(PateAccountantError):
    """A ledger cannot be opened or written (not a ledger, read-only, wrong schema, ...)."""


class LedgerIntegrityError(LedgerError):
    """The ledger's rows do not verify (edited, dropped, reordered rows or totals that disagree)."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


class LedgerStorageError(LedgerError):
    """The database under a ledger failed while it was read or written (a lost connection, a server that stopped,
    a full disk on the server): what was under way was rolled back, nothing half-written.  Raised by the
    PostgreSQL store for every driver error; the message names the ledger (never its password)."""


class InterruptedWriteError(LedgerError):
    """A ledger file with a rollback journal beside it: a write (the creation, most likely) was interrupted and
    has not been rolled back, so the file cannot be read as it is without writing to it."""


# The public classes keep the module name they have always had (tracebacks, pickles, reprs).
for _cls in (LedgerError, LedgerIntegrityError, LedgerStorageError, InterruptedWriteError):
    _cls.__module__ = "pate_accountant.ledger"
del _cls


class _RowError(Exception):
    """One row fails a check: ``row`` is its id, ``message`` what is wrong (turned into a verdict or a
    :class:`LedgerIntegrityError` by the caller)."""

    def __init__(self, row: int | None, message: str):
        super().__init__(message)
        self.row = row
        self.message = message


class _Discarded(Exception):
    """The file opened was removed (or is being removed) by :meth:`Ledger.discard_if_unused`."""
