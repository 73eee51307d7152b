"""Events to and from plain JSON data, for the ledger (no pickle: a ledger is data, never code).

Only classes from an allow-list of modules (our events and dp-accounting's) can be rebuilt.
"""

from __future__ import annotations

import enum
import importlib
import json

import attr
import dp_accounting

__all__ = ["canonical_json", "describe_difference", "event_from_data", "event_to_data"]

ALLOWED_MODULES = ("pate_accountant.events", "dp_accounting.dp_event")


def event_to_data(event: dp_accounting.DpEvent) -> dict:
    """A JSON-compatible description of ``event`` (class and fields, recursively)."""
    if not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {type(event).__name__}")
    cls = type(event)
    if cls.__module__ not in ALLOWED_MODULES:
        raise TypeError(f"cannot serialise event class {cls.__module__}.{cls.__name__}")
    return {"class": f"{cls.__module__}.{cls.__name__}",
            "fields": {f.name: _value_to_data(getattr(event, f.name)) for f in attr.fields(cls)}}


def _value_to_data(value):
    if isinstance(value, dp_accounting.DpEvent):
        return {"event": event_to_data(value)}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__name__}", "name": value.name}
    if isinstance(value, (list, tuple)):
        return {"list": [_value_to_data(v) for v in value]}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot serialise field value of type {type(value).__name__}")


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    if module not in ALLOWED_MODULES and not module.startswith("dp_accounting."):
        raise ValueError(f"class {path!r} is not an allowed event class")
    return getattr(importlib.import_module(module), name)


def event_from_data(data: dict) -> dp_accounting.DpEvent:
    """Rebuild an event written by :func:`event_to_data`."""
    if not isinstance(data, dict) or "class" not in data or "fields" not in data:
        raise ValueError("event data must be a mapping with 'class' and 'fields'")
    module = data["class"].rpartition(".")[0]
    if module not in ALLOWED_MODULES:
        raise ValueError(f"class {data['class']!r} is not an allowed event class")
    cls = _resolve(data["class"])
    return cls(**{name: _value_from_data(value) for name, value in data["fields"].items()})


def _value_from_data(value):
    if isinstance(value, dict):
        if "event" in value:
            return event_from_data(value["event"])
        if "enum" in value:
            return getattr(_resolve(value["enum"]), value["name"])
        if "list" in value:
            return [_value_from_data(v) for v in value["list"]]
        raise ValueError(f"unknown field encoding {sorted(value)}")
    return value


def canonical_json(data) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for hashing ledger rows."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _shown(data: dict, key: str) -> str:
    """One stored value in words: ``not set`` for a key the side lacks, ``none`` for a JSON null, a budget as
    ``(epsilon E, delta D)``, anything else as compact JSON."""
    if key not in data:
        return "not set"
    value = data[key]
    if value is None:
        return "none"
    if key == "budget" and isinstance(value, (list, tuple)) and len(value) == 2:
        return f"(epsilon {value[0]:g}, delta {value[1]:g})"
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def describe_difference(mine: dict, theirs: dict, *, me: str = "the ledger", them: str = "this accountant") -> str:
    """What differs between two configs (JSON objects), one clause per key, in words (no ``None``, no
    placeholders).  A different accountant ``kind`` is said first and alone with the budget, since every other
    key then differs by construction."""
    if mine.get("kind") != theirs.get("kind") and ("kind" in mine or "kind" in theirs):
        clauses = [f"kind: {me} is kept by the {mine.get('kind', 'unknown')} accountant, {them} is "
                   f"{theirs.get('kind', 'unknown')}"]
        keys = ["budget"] if mine.get("budget") != theirs.get("budget") else []
    else:
        clauses = []
        keys = sorted(key for key in set(mine) | set(theirs)
                      if (key in mine) != (key in theirs) or mine.get(key) != theirs.get(key))
    clauses += [f"{key}: {me} has {_shown(mine, key)}, {them} has {_shown(theirs, key)}" for key in keys]
    return "; ".join(clauses)
