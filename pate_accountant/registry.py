"""The one registry of accountants: every place that turns a name into an accountant reads it.

The ledger rebuilds the accountant a file was written by from the ``kind`` in its metadata, ``generate`` and
``demo`` build the accountant named by ``--accountant``, and ``pate-accountant audit`` replays a ledger:
all three look the name up here, so a name means one class everywhere and a new accountant is added in
one place.

Registering your own accountant (a subclass of :class:`~pate_accountant.accountants.base.Accountant` with a
``kind`` and a ``config()`` that rebuilds it)::

    from pate_accountant.accountants.base import Accountant
    from pate_accountant.registry import register_accountant

    @register_accountant
    class MyAccountant(Accountant):
        kind = "my-accountant"
        ...

After that ``Ledger`` replays and verifies files written by ``MyAccountant``, and
``accountant_class("my-accountant")`` returns it.  Pass ``runs=True`` (``register_accountant(runs=True)``)
to offer it to ``generate``/``demo`` as well: it must then be buildable by ``cls.for_run(budget=..., ledger=...,
mechanism=..., num_teachers=...)`` (by default ``cls(budget=..., ledger=...)``).
"""

from __future__ import annotations

import dataclasses

__all__ = ["BUILTIN_KINDS", "AccountantEntry", "accountant_class", "accountant_names", "register_accountant", "run_accountant_names"]


@dataclasses.dataclass(frozen=True)
class AccountantEntry:
    """One registered accountant: its ``kind``, its class, and whether runs (``generate``/``demo``) offer it."""

    kind: str
    cls: type
    runs: bool


_ENTRIES: dict[str, AccountantEntry] = {}
_BUILTINS_LOADED = False
#: The built-in kinds and whether runs offer them, known without importing the accountants (and dp-accounting
#: behind them), so that the command line lists them fast; ``pate_accountant.accountants`` registers the
#: classes, and a test keeps each class's ``kind`` and flag equal to this table.
BUILTIN_KINDS = {"basic": True, "advanced": True, "pld": True, "target-charging": True, "rdp": True,
                 "individual-charging": True}


def register_accountant(cls=None, *, runs: bool = False):
    """Register an ``Accountant`` subclass under its ``kind``; usable as ``@register_accountant`` or
    ``@register_accountant(runs=True)``.  Registering another class under a taken kind is a ``ValueError``
    (re-registering the same class is a no-op), so two accountants can never answer to one name."""

    def add(klass):
        from pate_accountant.accountants.base import Accountant

        if not isinstance(klass, type) or not issubclass(klass, Accountant):
            raise TypeError(f"register_accountant needs an Accountant subclass, got {klass!r}")
        kind = klass.__dict__.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"{klass.__qualname__} must define a non-empty class attribute 'kind' to be registered")
        if kind in BUILTIN_KINDS:
            _load_builtins()  # a built-in's name: the built-in class must be there to refuse a second one
        old = _ENTRIES.get(kind)
        if old is not None and old.cls is not klass:
            raise ValueError(f"accountant kind {kind!r} is already registered to {old.cls.__module__}.{old.cls.__qualname__}")
        _ENTRIES[kind] = AccountantEntry(kind, klass, bool(runs))
        return klass

    return add if cls is None else add(cls)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import pate_accountant.accountants  # noqa: F401  (its modules register the built-in accountants)


def accountant_class(kind: str) -> type:
    """The accountant class registered under ``kind``; ``KeyError`` naming the known kinds otherwise."""
    _load_builtins()
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"accountant kind must be a non-empty string, got {kind!r}")
    entry = _ENTRIES.get(kind)
    if entry is None:
        raise KeyError(f"unknown accountant kind {kind!r}; registered: {', '.join(sorted(_ENTRIES))} "
                       "(register your own with pate_accountant.registry.register_accountant)")
    return entry.cls


def _runs_by_kind() -> dict[str, bool]:
    """Every kind and its ``runs`` flag: the built-ins from :data:`BUILTIN_KINDS` (nothing imported), and
    every class registered so far."""
    return {**BUILTIN_KINDS, **{kind: entry.runs for kind, entry in _ENTRIES.items()}}


def accountant_names() -> tuple[str, ...]:
    """Every registered kind, sorted (imports no accountant)."""
    return tuple(sorted(_runs_by_kind()))


def run_accountant_names() -> tuple[str, ...]:
    """The kinds that ``generate`` and ``demo`` offer (registered with ``runs=True``), sorted (imports no
    accountant)."""
    return tuple(sorted(kind for kind, runs in _runs_by_kind().items() if runs))
