"""The one registry of mechanisms: names for the command line, the runs and the auditor.

``generate``/``demo`` build their per-step mechanism from ``--mechanism NAME`` and ``audit-mechanism NAME``
builds an audit case from the same name; both read this table, so a name means one mechanism everywhere.
An entry has a ``build(epsilon, delta, relation)`` when runs may use it (``runs=True``) and an
``audit(epsilon, delta, noise_scale)`` that returns a :class:`mechanisms.audit.AuditCase` when the
auditor knows a telling neighbouring pair for it.

Registering your own mechanism::

    from mechanisms.registry import register_mechanism

    register_mechanism("my-argmax", build=lambda epsilon, delta, relation: MyArgMax(epsilon, delta, relation),
                       runs=True)

Afterwards ``generate --mechanism my-argmax`` builds it, and ``mechanism_names()`` lists it.  A mechanism is
an object with an ``event`` (its privacy claim, a ``dp_accounting.DpEvent``), a ``__call__(histogram,
rng=None)`` returning a ``Release`` and an ``output_distribution(histogram)``; run its claim through
``tests/test_mechanism_contract.py``'s checks before trusting it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = [
    "ALIASES",
    "MechanismEntry",
    "audit_names",
    "build_mechanism",
    "mechanism_entry",
    "mechanism_names",
    "register_mechanism",
    "run_mechanism_names",
]


@dataclasses.dataclass(frozen=True)
class MechanismEntry:
    """One registered mechanism: ``build(epsilon, delta, relation)`` (``None``: not buildable from a per-step
    budget alone), ``audit(epsilon, delta, noise_scale)`` (``None``: no audit case) and whether runs offer it."""

    name: str
    build: Callable | None
    audit: Callable | None
    runs: bool
    summary: str


_ENTRIES: dict[str, MechanismEntry] = {}

#: Earlier names of ``audit-mechanism`` cases, still accepted.
ALIASES = {"weighted-sampling": "dp-weighted-sampling", "boundary-wrapper": "boundary-dp-argmax"}


def register_mechanism(name: str, *, build: Callable | None = None, audit: Callable | None = None,
                       runs: bool = False, summary: str = "") -> MechanismEntry:
    """Register a mechanism under ``name`` (lower-case words joined by ``-``).  ``runs=True`` needs a
    ``build``.  A name that is taken by another entry is a ``ValueError``."""
    if not isinstance(name, str) or not name or name != name.strip().lower() or " " in name:
        raise ValueError(f"a mechanism name must be lower-case words joined by '-', got {name!r}")
    if name in ALIASES:
        raise ValueError(f"mechanism name {name!r} is an alias of {ALIASES[name]!r}")
    if build is not None and not callable(build) or audit is not None and not callable(audit):
        raise TypeError("build and audit must be callables or None")
    if runs and build is None:
        raise ValueError(f"mechanism {name!r}: runs=True needs a build(epsilon, delta, relation)")
    entry = MechanismEntry(name, build, audit, bool(runs), summary)
    old = _ENTRIES.get(name)
    if old is not None and old != entry:
        raise ValueError(f"mechanism name {name!r} is already registered")
    _ENTRIES[name] = entry
    return entry


def mechanism_entry(name: str) -> MechanismEntry:
    """The entry registered under ``name`` (or an alias of it); ``KeyError`` naming the known names."""
    entry = _ENTRIES.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if entry is None:
        raise KeyError(f"unknown mechanism {name!r}; registered: {', '.join(sorted(_ENTRIES))}")
    return entry


def mechanism_names() -> tuple[str, ...]:
    return tuple(sorted(_ENTRIES))


def run_mechanism_names() -> tuple[str, ...]:
    """The names ``generate``/``demo`` offer, in registration order (the default first)."""
    return tuple(name for name, entry in _ENTRIES.items() if entry.runs)


def audit_names() -> tuple[str, ...]:
    return tuple(sorted(name for name, entry in _ENTRIES.items() if entry.audit is not None))


def build_mechanism(name: str, epsilon: float, delta: float, relation: str = "replace-one"):
    """Build the per-step mechanism ``name`` with per-step ``(epsilon, delta)`` under ``relation``."""
    entry = mechanism_entry(name)
    if entry.build is None:
        raise ValueError(f"mechanism {name!r} cannot be built from a per-step (epsilon, delta) alone")
    return entry.build(epsilon, delta, relation)


# -- the built-in mechanisms --------------------------------------------------------------------------------
def _register_builtins() -> None:
    from mechanisms import audit
    from mechanisms.boundary_wrapper import BoundaryWrapper
    from mechanisms.noisy_argmax import DPArgMax
    from mechanisms.weighted_sampling import DPWeightedSampling

    register_mechanism(
        "dp-argmax", build=lambda e, d, r: DPArgMax(e, d, relation=r), audit=audit.dp_argmax_case, runs=True,
        summary="LArgMax: the majority token when its noisy count clears n/2 + L, else fail")
    register_mechanism(
        "boundary-dp-argmax", build=lambda e, d, r: BoundaryWrapper(DPArgMax(e, d, relation=r)),
        audit=audit.boundary_wrapper_case, runs=True,
        summary="DPArgMax inside the boundary wrapper (a q-target for target charging)")
    register_mechanism(
        "dp-weighted-sampling", build=lambda e, d, r: DPWeightedSampling(e, d, relation=r),
        audit=audit.weighted_sampling_case, runs=True,
        summary="sparsity-preserving DP weighted sampling of a voted token")
    register_mechanism(
        "boundary-dp-weighted-sampling", build=lambda e, d, r: BoundaryWrapper(DPWeightedSampling(e, d, relation=r)),
        runs=True, summary="DPWeightedSampling inside the boundary wrapper")
    register_mechanism(
        "noisy-argmax", audit=audit.noisy_argmax_case,
        summary="truncated-geometric NoisyArgMax: the noisy top token and its noisy count")
    register_mechanism(
        "between-thresholds", audit=audit.between_thresholds_case,
        summary="BetweenThresholds on one count: below / between / above (thresholds needed: not a run mechanism)")


_register_builtins()
