"""The row codec: stored texts <-> Python values, and the format checks every stored value passes.

* events <-> canonical JSON text (:class:`_Codec`, cached: a run charges the same event over and over);
* one raw shareable row -> a :class:`~pate_accountant.accountants.base.Charge` (:func:`decode_row`: an allowed
  event class, an integer count, a known outcome, ...), and the decoded :class:`LedgerRow`;
* free-form metadata -> canonical JSON, refusing anything that is not plain JSON data;
* a stored accountant configuration -> a fresh accountant (:func:`accountant_from_config`), and the
  comparison of replayed totals with stored ones.

Nothing here knows where the rows are kept or how they are chained (:mod:`.chain` checks the hashes first).
"""

from __future__ import annotations

import json
import math
from typing import Any

import attr

from pate_accountant import registry
from pate_accountant._ledger.errors import LedgerError, _RowError
from pate_accountant.release import OUTCOMES
from pate_accountant.serialization import (
    canonical_json,
    describe_difference,
    event_from_data,
    event_to_data,
)

#: Relative tolerance when comparing replayed totals with the stored ones (they are normally identical).
TOTALS_RTOL = 1e-9
TOTALS_ATOL = 1e-12

#: The columns of one shareable row, in the order every store returns them (``grp`` is NULL on a ledger
#: written before groups existed).
ROW_FIELDS = ("id", "prev_hash", "hash", "event", "count", "outcome", "commitment", "spent_epsilon", "spent_delta",
              "created", "writer", "run", "grp")
#: The columns of one run, in store order.
RUN_FIELDS = ("id", "prev_hash", "hash", "first_row", "metadata", "created", "writer")
#: The columns of one confidential row, in store order.
CONF_FIELDS = ("id", "prev_hash", "hash", "share_row", "share_hash", "salt", "charged_teachers")


#: Returns the ``Charge`` class of :mod:`pate_accountant.accountants.base`.  The ledger imports the accountants
#: (what it rebuilds and replays into) only when it first needs a charge: that import is the facade's, inside a
#: function (:func:`pate_accountant.ledger._charge_class`, which installs itself here when the facade loads).
load_charge_class = None
_charge_cls = None


def charge_class():
    """:class:`pate_accountant.accountants.base.Charge`, loaded on first use through :data:`load_charge_class`."""
    global _charge_cls
    if _charge_cls is None:
        _charge_cls = load_charge_class()
    return _charge_cls


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LedgerRow:
    """One decoded ledger row (what :meth:`Ledger.rows` yields).  ``charged_teachers`` comes from the
    confidential file (empty when the ledger keeps none or the file is not open); ``commitment`` is the
    shareable commitment to it (``None`` on rows that charge no teacher set); ``run`` the run id."""

    id: int
    event: Any
    count: int
    outcome: str | None
    charged_teachers: frozenset
    spent: tuple | None
    created: float
    writer: str
    hash: str
    commitment: str | None = None
    run: int | None = None
    group: int | None = None

    def charge(self):
        return charge_class()(self.event, self.count, self.outcome, self.charged_teachers,
                      None if self.group is None else (self.run, self.group))


LedgerRow.__module__ = "pate_accountant.ledger"


class _Codec:
    """Event <-> JSON text, with small caches (a generation run charges the same event over and over)."""

    _LIMIT = 4096

    def __init__(self):
        self._to_text: dict = {}
        self._from_text: dict = {}

    def encode(self, event) -> str:
        try:
            return self._to_text[event]
        except (KeyError, TypeError):
            pass
        text = canonical_json(event_to_data(event))
        try:
            if len(self._to_text) >= self._LIMIT:
                self._to_text.clear()
            self._to_text[event] = text
        except TypeError:  # an unhashable event (e.g. a ComposedDpEvent holding a list)
            pass
        return text

    def decode(self, text: str):
        event = self._from_text.get(text)
        if event is None:
            event = event_from_data(json.loads(text))
            if len(self._from_text) >= self._LIMIT:
                self._from_text.clear()
            self._from_text[text] = event
        return event


@attr.s(frozen=True, slots=True, auto_attribs=True)
class _CheckedRow:
    charge: Any
    spent: tuple | None
    hash: str
    commitment: str | None
    run: int | None


def decode_row(codec: _Codec, row) -> _CheckedRow:
    """Decode one raw shareable row whose place in the chain has been checked (:func:`.chain._check_row`);
    a ``_RowError`` naming the row when a stored value has the wrong form."""
    Charge = charge_class()
    (row_id, _prev, stored_hash, event_text, count, outcome, commitment, spent_epsilon,
     spent_delta, _created, _writer, run, group) = row
    try:
        if not isinstance(event_text, str):
            raise TypeError("event must be JSON text")
        event = codec.decode(event_text)
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an integer, got {count!r}")
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES} or NULL, got {outcome!r}")
        if commitment is not None and not (isinstance(commitment, str) and len(commitment) == 64):
            raise TypeError("commitment must be a hex digest or NULL")
        if run is not None and (isinstance(run, bool) or not isinstance(run, int) or run < 1):
            raise TypeError(f"run must be a positive integer or NULL, got {run!r}")
        if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 0 or run is None):
            raise TypeError(f"group must be NULL or a non-negative integer on a row of a run, got {group!r}")
        if not (spent_epsilon is None and spent_delta is None) and not (
                isinstance(spent_epsilon, float) and isinstance(spent_delta, float)):
            raise TypeError("spent_epsilon and spent_delta must both be reals, or both NULL")
        charge = Charge(event, count, outcome, group=None if group is None else (run, group))
    except Exception as exc:  # tampered data may fail in any way: report the row, never crash the audit
        raise _RowError(row_id, f"row {row_id} cannot be decoded: {type(exc).__name__}: {exc}") from None
    spent = None if spent_epsilon is None else (spent_epsilon, spent_delta)
    return _CheckedRow(charge, spent, stored_hash, commitment, run)


def ledger_row(codec: _Codec, raw, teachers: frozenset) -> LedgerRow:
    """A raw shareable row as a :class:`LedgerRow` (no checks: :meth:`Ledger.rows`)."""
    (row_id, _prev, digest, event_text, count, outcome, commitment, eps, delta, created, writer, run, group) = raw
    return LedgerRow(row_id, codec.decode(event_text), count, outcome, teachers,
                     None if eps is None else (eps, delta), created, writer, digest, commitment, run, group)


# -- metadata: plain JSON data ------------------------------------------------------------------------------


def _json_data(name: str, value) -> str:
    """Canonical JSON text of ``value``, which must be plain JSON data (dicts with str keys, lists, str,
    finite numbers, bools, None)."""
    _check_json_data(name, value)
    return canonical_json(value)


def _check_json_data(name: str, value) -> None:
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be JSON data: {value!r} is not a finite number")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_data(f"{name}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{name} must be JSON data: key {key!r} is not a string")
            _check_json_data(f"{name}[{key!r}]", item)
        return
    raise TypeError(f"{name} must be JSON data, got {value!r} of type {type(value).__name__}")


def meta_value(meta: dict, key: str):
    """The decoded value of metadata ``key`` (stored as canonical JSON text), ``None`` when absent."""
    text = meta.get(key)
    return None if text is None else json.loads(text)


# -- the accountant configuration ---------------------------------------------------------------------------


def accountant_class(kind: str):
    """The accountant class registered under ``kind`` (:mod:`pate_accountant.registry`); a
    ``LedgerError`` for a kind nobody registered."""
    try:
        return registry.accountant_class(kind)
    except KeyError as exc:
        raise LedgerError(exc.args[0]) from None


def accountant_from_config(config: dict):
    """A fresh accountant (no ledger) equivalent to the one whose ``config()`` is ``config``."""
    if not isinstance(config, dict) or "kind" not in config:
        raise LedgerError(f"an accountant config must be a mapping with a 'kind', got {config!r}")
    cls = accountant_class(config["kind"])
    kwargs = {key: value for key, value in config.items() if key != "kind"}
    if kwargs.get("budget") is not None:
        kwargs["budget"] = tuple(kwargs["budget"])
    return cls(**kwargs)


def _config_difference(stored: dict, given: dict) -> str:
    return describe_difference(stored, given, me="the ledger", them="this accountant")


def _totals_close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=TOTALS_RTOL, abs_tol=TOTALS_ATOL)
