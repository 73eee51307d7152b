"""The hash chains: how rows, runs and the genesis are hashed, how a stored row is checked against its
place in the chain, and the pins (the heads that checkpoints and ``--expect-head`` compare).

The shareable rows form one chain anchored at a genesis hash of the metadata (accountant configuration, data
set, software version: all frozen once the first row exists); the runs a second one, anchored at the ledger
id; the confidential rows a third (:mod:`.confidential`).  Every value is hashed through :func:`_field`, an
unambiguous text: strings are length-prefixed, reals written with ``repr``, and any value of an unexpected type
hashes differently from every well-formed one.  docs/ledger.md, "Hashing", states the formulas.

Full verification (replaying every row) is :mod:`.verify`; writing new rows is :mod:`.transaction`.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

from pate_accountant import __version__
from pate_accountant._ledger.codec import _CheckedRow, _Codec, decode_row
from pate_accountant._ledger.errors import LedgerIntegrityError, _RowError
from pate_accountant._ledger.store import SCHEMA_VERSION
from pate_accountant.serialization import canonical_json

#: Metadata keys that the first row's ``prev_hash`` (the genesis hash) covers.
GENESIS_KEYS = ("schema_version", "ledger_id", "created", "software_version", "config", "run_metadata", "dataset")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _field(value) -> str:
    """Unambiguous text of one stored value, for hashing: strings are length-prefixed, reals are written
    with ``repr`` (which round-trips doubles), and a value of an unexpected type hashes differently from
    any well-formed one (so a column tampered to another type is caught)."""
    kind = type(value)  # exact types: bool is not int here, and SQLite returns exactly these
    if kind is str:
        return f"s{len(value)}:{value}"
    if kind is float:
        return f"f{value!r}"
    if kind is int:
        return f"i{value}"
    if value is None:
        return "n"
    return f"!{value!r}"


def _row_hash(prev_hash, row_id, event_text, count, outcome, commitment, spent_epsilon, spent_delta,
              created, writer, run, group=None) -> str:
    """``sha256(prev_hash | id | event | count | outcome | commitment | spent | created | writer | run)``, with
    ``| group`` appended for a row of one of a run's groups (so rows without a group hash as they always did)."""
    fields = (prev_hash, row_id, event_text, count, outcome, commitment, spent_epsilon, spent_delta, created, writer,
              run) + (() if group is None else (group,))
    content = "|".join(map(_field, fields))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _run_hash(prev_hash, run_id, first_row, metadata_text, created, writer) -> str:
    """``sha256("run" | prev_hash | id | first_row | metadata | created | writer)``."""
    content = "|".join(map(_field, ("run", prev_hash, run_id, first_row, metadata_text, created, writer)))
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _genesis_hash(meta: dict) -> str:
    """The first row's ``prev_hash``: a hash of the stored metadata texts (configuration included)."""
    return _sha256("pate-accountant ledger genesis\n" + canonical_json({key: meta.get(key) for key in GENESIS_KEYS}))


def _runs_genesis_hash(meta: dict) -> str:
    """The first run's ``prev_hash``: anchored at the ledger id, which never changes (the other metadata may
    change until the first charge, and a run may begin before it)."""
    return _sha256("pate-accountant runs genesis\n" + _field(meta.get("ledger_id")))


def initial_meta() -> dict:
    """The metadata texts of a new ledger: schema version, a random ledger id, the creation time and the
    software version (a store writes them with its layout; the genesis hash covers them)."""
    return {
        "schema_version": canonical_json(SCHEMA_VERSION),
        "ledger_id": canonical_json(uuid.uuid4().hex),
        "created": canonical_json(time.time()),
        "software_version": canonical_json(__version__),
    }


def _check_row(codec: _Codec, row, expected_id: int, prev_hash: str) -> _CheckedRow:
    """Check one raw shareable row against the chain and decode it; raise ``_RowError`` naming the row."""
    (row_id, stored_prev, stored_hash, event_text, count, outcome, commitment, spent_epsilon,
     spent_delta, created, writer, run, group) = row
    if row_id != expected_id:
        if isinstance(row_id, int) and row_id > expected_id:
            missing = f"row {expected_id}" if row_id == expected_id + 1 else f"rows {expected_id}-{row_id - 1}"
            raise _RowError(expected_id, f"{missing} missing (the rows jump from {expected_id - 1} to {row_id}): "
                                         "rows were dropped or renumbered")
        raise _RowError(expected_id, f"row {expected_id}: unexpected id {row_id!r}")
    if stored_prev != prev_hash:
        what = "the ledger metadata" if row_id == 1 else f"row {row_id - 1}"
        raise _RowError(row_id, f"row {row_id} does not follow {what} (prev_hash mismatch): "
                                "rows were dropped, reordered or inserted, or the metadata was edited")
    if _row_hash(stored_prev, row_id, event_text, count, outcome, commitment, spent_epsilon, spent_delta, created,
                 writer, run, group) != stored_hash:
        raise _RowError(row_id, f"row {row_id} was edited (its hash does not match its content)")
    return decode_row(codec, row)


def verify_runs(store, meta: dict, run_count, run_last_hash):
    """Check the runs' chain and head; returns ``(runs, None)`` or ``(None, message)``."""
    prev, expected, runs = _runs_genesis_hash(meta), 1, []
    for run_id, stored_prev, stored_hash, first_row, text, created, writer in store.runs():
        if run_id != expected:
            return None, f"run {expected} is missing (the runs jump to {run_id!r}): runs were dropped or renumbered"
        if stored_prev != prev:
            return None, f"run {run_id} does not follow run {run_id - 1} (prev_hash mismatch): runs were reordered"
        if _run_hash(stored_prev, run_id, first_row, text, created, writer) != stored_hash:
            return None, f"run {run_id}'s metadata was edited (its hash does not match its content)"
        if isinstance(first_row, bool) or not isinstance(first_row, int) or first_row < 0 or (
                runs and first_row < runs[-1]["first_row"]):
            return None, f"run {run_id} has an invalid first row {first_row!r}"
        try:
            metadata = json.loads(text)
        except ValueError as exc:
            return None, f"run {run_id}'s metadata cannot be decoded: {exc}"
        runs.append({"id": run_id, "first_row": first_row, "rows": 0, "created": created, "metadata": metadata})
        prev, expected = stored_hash, expected + 1
    if run_count != len(runs) or run_last_hash != (prev if runs else None):
        return None, (f"the head records {run_count!r} runs but the table has {len(runs)}, or its last run hash "
                      "differs: runs were dropped or the head was edited")
    return runs, None


# -- pins -------------------------------------------------------------------------------------------------


def head_of(store) -> tuple:
    """``(row_count, last_hash, run_count, run_last_hash)`` of ``store``; a :class:`LedgerIntegrityError` when
    the head is missing."""
    head = store.head()
    if head is None:
        raise LedgerIntegrityError("the ledger's head row is missing")
    return head


def pin_record(store) -> dict:
    """``{"rows", "head_hash", "runs", "run_head_hash"}``: the heads of both chains, read together."""
    rows, head_hash, runs, run_head_hash = head_of(store)
    return {"rows": rows, "head_hash": head_hash, "runs": runs, "run_head_hash": run_head_hash}
