"""Runs, the data set and the claim a run makes on its ledger (docs/ledger.md, "Data sets and runs").

A ledger belongs to one data set and spans runs.  Before its slow start a run *claims* its ledger: it opens it
(creating it when missing), stores or checks the data set's name (:meth:`RunRecords.set_dataset`) and the
accountant configuration; a run refused after its claim gives an unused ledger back
(:meth:`RunRecords.discard_if_unused`).  Each run then records its own metadata (:meth:`RunRecords.begin_run`),
hash-chained in the runs chain and never overwritten, and every row the ledger object writes afterwards names
the run and carries the run's start time (never a charge's own, data-dependent time).

Metadata is shareable, so it must be plain JSON data and never a seed: the checks are here, with the helpers
that describe a seed and a mechanism in words a shareable file may hold.

:class:`RunRecords` is a part of :class:`~pate_accountant.ledger.Ledger` (a mixin): it uses the ledger's store
(``_store``), its write transaction (``_write_transaction``), its metadata reads (``_meta``, ``_meta_value``,
``_head``) and its writer id (``_writer``).
"""

from __future__ import annotations

import json
import time

import attr

from pate_accountant._ledger.chain import _run_hash, _runs_genesis_hash, head_of
from pate_accountant._ledger.codec import _check_json_data, _json_data
from pate_accountant.serialization import canonical_json

#: Longest data set name accepted.
MAX_DATASET_NAME = 200
#: Run-metadata keys that may never hold a number: a seed lets anyone re-run both neighbouring data sets.
SEED_KEYS = ("seed", "seeds", "random_seed", "rng_seed")


def _check_no_seed(name: str, value) -> None:
    """Refuse a number under a seed-like key anywhere in ``value`` (the message never shows the number)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.lower() in SEED_KEYS:
                numbers = [item] if not isinstance(item, (list, tuple)) else list(item)
                if any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
                    raise ValueError(
                        f"{name}[{key!r}] holds a seed: a shareable ledger never stores seeds (anyone who knows "
                        "the seed can re-run both neighbouring data sets); record whether the run was seeded "
                        "(\"seeded\": true/false) instead")
            _check_no_seed(f"{name}[{key!r}]", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_no_seed(f"{name}[{i}]", item)


def _metadata_text(metadata) -> str:
    """The canonical JSON text of run metadata: a dict of plain JSON data holding no seed."""
    if not isinstance(metadata, dict):
        raise TypeError(f"run metadata must be a dict, got {type(metadata).__name__}")
    text = _json_data("run metadata", metadata)
    _check_no_seed("run metadata", metadata)
    return text


def _check_dataset(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"dataset must be a string, got a value of type {type(name).__name__}")
    if not name.strip() or len(name) > MAX_DATASET_NAME or not name.isprintable():
        raise ValueError(f"dataset must be a printable name of 1 to {MAX_DATASET_NAME} characters, got {name!r}")
    return name


def describe_seed(seed) -> str:
    """What run metadata may say about a seed: ``"seeded"`` or ``"OS entropy"`` (for ``None``), never the
    seed itself (a seed lets anyone who knows it re-run both neighbouring data sets and tell them apart)."""
    if seed is None:
        return "OS entropy"
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got a value of type {type(seed).__name__}")
    return "seeded"


def describe_mechanism(mechanism) -> dict:
    """``{"class": ..., "parameters": {...}}`` for an attrs mechanism object (its public parameters only)."""
    cls = type(mechanism)
    if not attr.has(cls):
        raise TypeError(f"mechanism must be an attrs object, got {cls.__name__}")
    parameters = {}
    for field in attr.fields(cls):
        if field.name.startswith("_"):
            continue
        value = getattr(mechanism, field.name)
        if attr.has(type(value)):
            value = describe_mechanism(value)
        elif type(value).__module__ == "numpy" and hasattr(value, "item"):  # a numpy scalar
            value = value.item()
        parameters[field.name] = value
    _check_json_data("mechanism parameters", parameters)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "parameters": parameters}


class RunRecords:
    """The data set, the ledger-wide and per-run metadata, and the claim protocol of a :class:`Ledger`."""

    _run: int | None = None
    _run_created: float | None = None  # the start time of ``_run``: the time on every row it writes

    # -- the data set and ledger-wide metadata -----------------------------------------------------------------
    @property
    def run_metadata(self) -> dict | None:
        """Ledger-wide metadata set by :meth:`set_run_metadata` (each run's own metadata: :attr:`runs`)."""
        return self._meta_value("run_metadata")

    @property
    def dataset(self) -> str | None:
        """The name of the data set this ledger belongs to (``None`` when not named)."""
        return self._meta_value("dataset")

    def _set_meta_once(self, key: str, text: str, what: str) -> None:
        with self._write_transaction():
            stored = self._meta().get(key)
            if stored == text:
                return
            if self._head()[0] > 0:
                raise ValueError(f"{what} can only be set before the first charge (it is covered by the genesis "
                                 f"hash); the ledger has {stored if stored is not None else 'none'}")
            self._store.set_meta(key, text)

    def set_run_metadata(self, metadata: dict) -> None:
        """Store ledger-wide metadata as JSON data: mechanism parameters, model name, ...  Allowed until the
        first row is written (it is covered by the genesis hash); afterwards only an equal value is accepted
        (a process joining the run).  Per-run metadata, kept for every run: :meth:`begin_run`.

        **Never put private data or seeds here** (prompts, records, teacher data): the file is meant to be
        shown to auditors.  A number under a seed-like key (``"seed"``, ``"seeds"``, ...) is refused; the
        ledger cannot tell a prompt from a parameter, so the rest is the caller's duty.
        """
        self._set_meta_once("run_metadata", _metadata_text(metadata), "run metadata")

    def set_dataset(self, name: str) -> None:
        """Name the data set this ledger belongs to (every run charged here spends that data set's budget).
        Allowed until the first row is written; afterwards only the same name is accepted.  The name is
        shareable: choose one that reveals nothing private."""
        name = _check_dataset(name)
        stored = self.dataset
        if stored is not None and stored != name:
            raise ValueError(f"this ledger belongs to the data set {stored!r}, not {name!r}")
        self._set_meta_once("dataset", canonical_json(name), "the data set name")

    # -- runs --------------------------------------------------------------------------------------------------
    def begin_run(self, metadata: dict) -> int:
        """Record the start of a run with its metadata (JSON data: mechanism, accountant, parameters,
        ``"seeded": true/false``, software version; never a seed, never private data) and return its id.
        Every row this ``Ledger`` object writes afterwards names the run.  Runs are hash-chained and never
        overwritten: each run keeps its own metadata."""
        text = _metadata_text(metadata)
        with self._write_transaction():
            first_row, _, run_count, run_hash = head_of(self._store)
            prev = run_hash if run_count else _runs_genesis_hash(self._meta())
            run_id, created = run_count + 1, float(time.time())
            digest = _run_hash(prev, run_id, first_row, text, created, self._writer)
            self._store.append_run((run_id, prev, digest, first_row, text, created, self._writer), run_id, digest)
        self._run, self._run_created = run_id, created
        return run_id

    def _row_time(self) -> float:
        """The time stored on the rows this object writes: the start of its run (:meth:`begin_run`), or without a
        run the ledger's creation time.  A charge's own wall-clock time would depend on the data (prompt lengths;
        under individual charging, how many teachers remain), so it is stored nowhere (docs/ledger.md)."""
        if self._run_created is not None:
            return self._run_created
        created = self._meta_value("created")
        return float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else 0.0

    @property
    def current_run(self) -> int | None:
        """The run this ``Ledger`` object's rows belong to (``None`` before :meth:`begin_run`)."""
        return self._run

    @property
    def runs(self) -> list:
        """Every run's ``{"id", "first_row", "created", "metadata"}``, in order (no verification)."""
        return [{"id": run_id, "first_row": first_row, "created": created, "metadata": json.loads(text)}
                for run_id, _prev, _hash, first_row, text, created, _writer in self._store.runs()]

    # -- the claim ---------------------------------------------------------------------------------------------
    @property
    def created_here(self) -> bool:
        """Whether the :meth:`open` that made this object created the file (it was not at the path before)."""
        return self._store.created_here

    def discard_if_unused(self) -> bool:
        """Close the ledger and, when this object created its file and the ledger is still unused, remove it.

        Unused: no run began and no row was written (a data set name and an accountant configuration may have
        been stored: that is the claim a run makes before its slow start), and no other connection has the file
        open.  The last is decided by SQLite's own lock: in exclusive locking mode the write lock is granted only
        when no other connection holds the file, and it is kept until the file is gone.  Under that lock the
        ledger is marked discarded (a process that opened the path just before reads the mark and opens what
        is at the path instead), its log is folded into the file, a confidential file this object created
        empty is removed, and the path is unlinked.  Returns whether the files were removed; otherwise
        (another process has joined, or charged) they stay as they are and are only closed."""
        if self._read_only or self._path is None or not self.created_here or self._run is not None:
            self.close()
            return False
        return self._store.discard_if_unused()
