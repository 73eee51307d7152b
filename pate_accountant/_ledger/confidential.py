"""The confidential part of a ledger: teacher sets, their salts and commitments, and their own hash chain.

Only an accountant with ``confidential_charges = True`` (individual charging) keeps one.  For every *hit* row of
the shareable chain it holds one confidential row (the charged teachers and a random 256-bit salt) that names
the shareable row and its hash; the shareable row carries ``HMAC-SHA256(salt, row id | teacher set)``, which
hides the set (the salt never leaves this part) and binds the two parts together.  The spent totals of such an
accountant are functions of the teacher sets, so they are kept here too.

This module is the logic; where the confidential rows live is the store's business (a second SQLite file,
``PATH.confidential.sqlite``, for :class:`.sqlite_store.SQLiteStore`): see :mod:`.store`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time

import attr

from pate_accountant._ledger.chain import _field, _sha256
from pate_accountant._ledger.errors import _RowError
from pate_accountant._ledger.store import CONFIDENTIAL_SCHEMA_VERSION
from pate_accountant.release import TARGET
from pate_accountant.serialization import canonical_json

#: Metadata keys of the confidential part that its first row's ``prev_hash`` covers.
CONFIDENTIAL_GENESIS_KEYS = ("schema_version", "ledger_id", "created")
#: Outcome classes that charge teachers (``None``: a plain ``compose``, charged as a hit).
HIT_OUTCOMES = (None, TARGET)


def _keeps_confidential(accountant_or_class) -> bool:
    """Whether an accountant's state depends on charged teacher sets (``confidential_charges``)."""
    return bool(getattr(accountant_or_class, "confidential_charges", False))


def initial_confidential_meta(ledger_id_text: str | None) -> dict:
    """The metadata texts of a new confidential part of the ledger whose ``ledger_id`` text is given."""
    return {
        "schema_version": canonical_json(CONFIDENTIAL_SCHEMA_VERSION),
        "ledger_id": ledger_id_text,
        "created": canonical_json(time.time()),
    }


def _confidential_row_hash(prev_hash, row_id, share_row, share_hash, salt, teachers_text) -> str:
    """``sha256("confidential" | prev_hash | id | share_row | share_hash | salt | charged_teachers)``."""
    content = "|".join(map(_field, ("confidential", prev_hash, row_id, share_row, share_hash, salt, teachers_text)))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _commitment(salt: str, share_row: int, teachers_text: str) -> str:
    """``HMAC-SHA256(key = salt, message = "pate-accountant teachers|<row id>|<sorted JSON list>")``: hiding
    (the 256-bit salt is random and lives only in the confidential file) and binding (to the row and set)."""
    message = f"pate-accountant teachers|{share_row}|{teachers_text}".encode()
    return hmac.new(bytes.fromhex(salt), message, hashlib.sha256).hexdigest()


def _teachers_text(teachers) -> str:
    return "[" + ",".join(map(str, sorted(map(int, teachers)))) + "]" if teachers else "[]"


def _confidential_genesis_hash(meta: dict) -> str:
    return _sha256("pate-accountant confidential genesis\n"
                   + canonical_json({key: meta.get(key) for key in CONFIDENTIAL_GENESIS_KEYS}))


def seal(teachers, share_row: int) -> tuple[str, str, str]:
    """``(teachers_text, salt, commitment)`` for the hit row ``share_row`` charging ``teachers``: a fresh salt."""
    teachers_text = _teachers_text(teachers)
    salt = os.urandom(32).hex()
    return teachers_text, salt, _commitment(salt, share_row, teachers_text)


def _check_confidential_row(raw, expected_id: int, prev_hash: str, share_row: int, share_hash: str,
                            commitment: str) -> tuple[frozenset, str]:
    """Check the confidential row that belongs to shareable hit row ``share_row``: its own chain, its link
    (the shareable row's hash) and the shareable row's commitment.  Returns ``(teachers, hash)``."""
    if raw is None:
        raise _RowError(share_row, f"row {share_row} is a hit but the confidential file has no row for it "
                                   "(confidential rows were dropped)")
    row_id, stored_prev, stored_hash, linked_row, linked_hash, salt, teachers_text = raw
    where = f"confidential row {row_id!r} (for row {share_row})"
    if row_id != expected_id:
        raise _RowError(share_row, f"{where}: expected confidential row {expected_id}: confidential rows were "
                                   "dropped or renumbered")
    if stored_prev != prev_hash:
        raise _RowError(share_row, f"{where} does not follow the previous confidential row (prev_hash mismatch): "
                                   "confidential rows were dropped, reordered or inserted")
    if _confidential_row_hash(stored_prev, row_id, linked_row, linked_hash, salt, teachers_text) != stored_hash:
        raise _RowError(share_row, f"{where} was edited (its hash does not match its content)")
    if linked_row != share_row or linked_hash != share_hash:
        raise _RowError(share_row, f"{where} names shareable row {linked_row!r}, not row {share_row} with its hash: "
                                   "the confidential file does not belong to these rows")
    try:
        if not isinstance(salt, str) or len(salt) != 64:
            raise TypeError("salt must be 64 hex digits")
        if not isinstance(teachers_text, str):
            raise TypeError("charged_teachers must be JSON text")
        teachers = json.loads(teachers_text)
        if not isinstance(teachers, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                                 for t in teachers):
            raise TypeError("charged_teachers must be a list of non-negative integers")
        expected = _commitment(salt, share_row, teachers_text)
    except Exception as exc:
        raise _RowError(share_row, f"{where} cannot be decoded: {type(exc).__name__}: {exc}") from None
    if not hmac.compare_digest(expected, commitment):
        raise _RowError(share_row, f"{where} does not open row {share_row}'s commitment: its teacher set or salt "
                                   "was changed")
    return frozenset(teachers), stored_hash


def _link(row, row_id: int, links, conf_id: int, conf_prev: str):
    """The charge of the checked shareable row ``row`` with its teacher set read from the confidential rows
    ``links`` (an iterator, advanced by one on hit rows), and the new confidential position (``None`` for a
    row that has no confidential row)."""
    charge = row.charge
    if charge.outcome not in HIT_OUTCOMES:
        if row.commitment is not None:
            raise _RowError(row_id, f"row {row_id} is not a hit but carries a teacher-set commitment")
        return charge, None
    if row.commitment is None:
        raise _RowError(row_id, f"row {row_id} is a hit but carries no commitment to its charged teachers")
    teachers, digest = _check_confidential_row(next(links, None), conf_id + 1, conf_prev, row_id, row.hash,
                                               row.commitment)
    return attr.evolve(charge, charged_teachers=teachers), (conf_id + 1, digest)
