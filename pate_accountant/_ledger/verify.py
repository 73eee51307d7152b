"""Verification: everything :meth:`Ledger.verify` and ``pate-accountant audit`` check (docs/ledger.md, "What
``verify()`` and ``pate-accountant audit PATH`` check").

The runs' chain and head first; then, row by row inside one read snapshot (of both parts), the row chain
(:func:`.chain._check_row`), the row's format (:mod:`.codec`), its run, its link to the confidential part
(:mod:`.confidential`), a replay through a fresh accountant rebuilt from the stored configuration with its
budget enforced, and the stored totals; then the heads.  It reads through the store's read methods only, so
any store verifies the same way.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import attr

from pate_accountant._ledger.chain import _check_row, _genesis_hash, verify_runs
from pate_accountant._ledger.codec import (
    _Codec,
    _config_difference,
    _totals_close,
    accountant_class,
    accountant_from_config,
    meta_value,
)
from pate_accountant._ledger.confidential import (
    HIT_OUTCOMES,
    _confidential_genesis_hash,
    _keeps_confidential,
    _link,
)
from pate_accountant._ledger.errors import LedgerIntegrityError, _RowError
from pate_accountant._ledger.store import SCHEMA_VERSION
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.release import TARGET
from pate_accountant.serialization import canonical_json


@attr.s(frozen=True, slots=True, auto_attribs=True)
class VerificationResult:
    """What :meth:`Ledger.verify` found.  ``ok`` is true when the chains, the heads and the replayed totals
    all agree and the budget was never exceeded; otherwise ``first_bad_row`` names the first offending
    row (``None`` when no single row is to blame, e.g. a damaged metadata table) and ``message`` says
    what is wrong.

    ``confidential`` says what was checked of the confidential part: ``"verified"`` (present and checked:
    teacher sets, links, per-teacher limits and totals), ``"absent"`` (the accountant keeps one but it was
    not found: only the shareable part was checked, and ``spent`` is ``None`` because it is a function of
    the confidential data) or ``"none"`` (the accountant keeps no confidential data).  ``runs`` lists each
    run's metadata; ``queries`` and ``hits`` count the charged queries and their hits (outcome classes
    are DP outputs)."""

    ok: bool
    rows: int
    spent: tuple | None
    first_bad_row: int | None
    message: str
    kind: str | None = None
    budget: tuple | None = None
    config: dict | None = None
    run_metadata: dict | None = None
    head_hash: str | None = None
    software_version: str | None = None
    ledger_id: str | None = None
    dataset: str | None = None
    runs: tuple = ()
    confidential: str = "none"
    confidential_path: str | None = None
    queries: int | None = None
    hits: int | None = None

    def as_dict(self) -> dict:
        data = attr.asdict(self, recurse=False)
        data["spent"] = None if self.spent is None else {"epsilon": self.spent[0], "delta": self.spent[1]}
        data["budget"] = None if self.budget is None else {"epsilon": self.budget[0], "delta": self.budget[1]}
        data["runs"] = [dict(run) for run in self.runs]
        return data


VerificationResult.__module__ = "pate_accountant.ledger"


def confidential_head(store) -> tuple:
    """``(row_count, last_hash)`` of the confidential part; a :class:`LedgerIntegrityError` when it is missing."""
    head = store.confidential_head()
    if head is None:
        raise LedgerIntegrityError("the confidential file's head row is missing")
    return head


def needs_confidential(store) -> bool:
    """Whether the stored configuration is that of an accountant with confidential charges."""
    config = meta_value(store.meta(), "config") if "meta" in store.tables() else None
    if isinstance(config, dict):
        with contextlib.suppress(Exception):
            return _keeps_confidential(accountant_class(config.get("kind")))
    return False


def _group_spends(runs_by_id: dict, group_charges: dict, config) -> None:
    """Add to each run with groups ``"groups": [{"group", "rows", "spent"}]``: each group's own charges replayed
    alone into a fresh accountant of the ledger's configuration (what that group's records would have spent in a
    run of their own; the data set's spend takes the largest per event, docs/groups.md)."""
    for (run_id, group), charges in sorted(group_charges.items()):
        alone = accountant_from_config(config)
        alone.replay(charges)
        spent = [float(x) for x in alone.spent()]
        runs_by_id[run_id].setdefault("groups", []).append({"group": group, "rows": len(charges), "spent": spent})


def _verify(store, codec: _Codec, confidential_location) -> VerificationResult:
    tables = store.tables()
    if not tables:
        return VerificationResult(False, 0, None, None, "not a pate-accountant ledger: the database has no tables")
    missing = {"meta", "charges", "head", "runs"} - tables
    if missing:
        return VerificationResult(False, 0, None, None, f"not a pate-accountant ledger: tables {sorted(missing)} missing")
    meta = store.meta()
    info: dict[str, Any] = {}
    try:
        for key in ("ledger_id", "software_version", "config", "run_metadata", "dataset"):
            info[key] = None if meta.get(key) is None else json.loads(meta[key])
        version = json.loads(meta["schema_version"])
    except (KeyError, ValueError) as exc:
        return VerificationResult(False, 0, None, None, f"the ledger metadata is damaged: {exc}")
    if version != SCHEMA_VERSION:
        return VerificationResult(False, 0, None, None, f"unsupported ledger schema version {version!r}")
    config = info["config"]
    extra = {"config": config, "run_metadata": info["run_metadata"], "software_version": info["software_version"],
             "ledger_id": info["ledger_id"], "dataset": info["dataset"]}
    head = store.head()
    if head is None:
        return VerificationResult(False, 0, None, None, "the ledger's head row is missing", **extra)
    head_rows, head_hash, run_count, run_last_hash = head
    extra["head_hash"] = head_hash
    runs, problem = verify_runs(store, meta, run_count, run_last_hash)
    if problem is not None:
        return VerificationResult(False, 0, None, None, problem, **extra)

    accountant = None
    confidential = False
    if config is not None:
        extra["kind"] = config.get("kind") if isinstance(config, dict) else None
        try:
            accountant = accountant_from_config(config)
            rebuilt = json.loads(canonical_json(accountant.config()))
        except Exception as exc:  # an unknown kind or a config the class refuses
            return VerificationResult(False, 0, None, 1 if head_rows else None,
                                      f"cannot rebuild the accountant from the stored config: {exc}", **extra)
        if rebuilt != config:
            return VerificationResult(False, 0, None, None,
                                      f"the stored config does not round-trip: {_config_difference(config, rebuilt)}",
                                      **extra)
        extra["budget"] = accountant.budget
        confidential = _keeps_confidential(accountant)
    full = not confidential or store.has_confidential  # can the budget be replayed?
    if confidential:
        extra["confidential"] = "verified" if full else "absent"
        extra["confidential_path"] = confidential_location
    runs_by_id = {run["id"]: run for run in runs}

    def result(ok, row, message, rows, spent=None, queries=None, hits=None):
        return VerificationResult(ok, rows, spent, row, message, runs=tuple(runs), queries=queries, hits=hits,
                                  **extra)

    links = totals = None
    conf_id, conf_prev = 0, None
    group_charges: dict = {}  # (run, group) -> that group's own charges, for each group's spend alone
    if confidential and full:
        links = iter(store.confidential_rows(0, head_rows))
        conf_prev = _confidential_genesis_hash(store.confidential_meta())
        totals = {share_row: (share_hash, eps, delta)
                  for share_row, share_hash, eps, delta in store.confidential_totals(head_rows)}
    genesis = _genesis_hash(meta)
    prev, expected = genesis, 1
    queries = hits = 0
    # Rows carry their run's start time (or, without a run, the ledger's creation time); rows written by earlier
    # versions carry their own commit time, which can depend on the data: counted and reported, not refused.
    ledger_created = None
    with contextlib.suppress(TypeError, ValueError):
        ledger_created = json.loads(meta.get("created") or "null")
    own_times = 0
    spent = (0.0, 0.0) if accountant is None or not full else tuple(float(x) for x in accountant.spent())
    for raw in store.rows():
        rows = expected - 1
        if accountant is None:
            return result(False, expected, "the ledger has rows but no accountant config", rows)
        try:
            row = _check_row(codec, raw, expected, prev)
            charge = row.charge
            if row.run is not None:
                run = runs_by_id.get(row.run)
                if run is None or run["first_row"] >= expected:
                    raise _RowError(expected, f"row {expected} names run {row.run}, which does not exist or began "
                                              "after it")
                run["rows"] += 1
            if confidential and row.spent is not None:
                raise _RowError(expected, f"row {expected} stores spent totals in the shareable file, but a "
                                          f"{accountant.kind} accountant's totals are confidential")
            if links is not None:
                charge, conf_step = _link(row, expected, links, conf_id, conf_prev)
                if conf_step is not None:
                    conf_id, conf_prev = conf_step
            elif confidential:
                if (charge.outcome in HIT_OUTCOMES) != (row.commitment is not None):
                    raise _RowError(expected, f"row {expected}: a hit must carry a teacher-set commitment and "
                                              "any other row none")
            elif row.commitment is not None:
                raise _RowError(expected, f"row {expected} carries a teacher-set commitment but a "
                                          f"{accountant.kind} accountant keeps no confidential charges")
        except _RowError as exc:
            return result(False, exc.row, exc.message, rows, spent if full else None)
        queries += charge.count if charge.outcome is not None else 0
        hits += charge.count if charge.outcome == TARGET else 0
        if charge.group is not None:
            group_charges.setdefault((row.run, charge.group[1]), []).append(attr.evolve(charge, group=None))
        if raw[9] != (runs_by_id[row.run]["created"] if row.run is not None else ledger_created):
            own_times += 1
        prev = row.hash
        if not full:  # shareable part only: check the event is one this accountant accounts for
            try:
                accountant.replay([charge])
            except Exception as exc:
                return result(False, expected, f"row {expected} cannot be replayed: {type(exc).__name__}: {exc}",
                              rows)
            expected += 1
            continue
        try:
            accountant.replay([charge], enforce_budget=True)  # checked against the budget, as a live charge
        except BudgetExhaustedError as exc:
            return result(False, expected, f"row {expected} exceeds the budget: {exc}", rows, spent)
        except Exception as exc:  # an event this accountant cannot account for, ...
            return result(False, expected, f"row {expected} cannot be replayed: {type(exc).__name__}: {exc}",
                          rows, spent)
        stored = row.spent
        if totals is not None:
            entry = totals.pop(expected, None)
            if entry is not None:
                if entry[0] != row.hash:
                    return result(False, expected, f"the confidential totals for row {expected} name another "
                                                   "row hash: they do not belong to this ledger", expected, spent)
                stored = (entry[1], entry[2])
        spent = None
        if stored is None:
            expected += 1
            continue
        spent = tuple(float(x) for x in accountant.spent())
        if not (_totals_close(spent[0], stored[0]) and _totals_close(spent[1], stored[1])):
            return result(False, expected, f"totals disagree at row {expected}: the ledger stores spent "
                                           f"(epsilon={stored[0]!r}, delta={stored[1]!r}) but replaying gives "
                                           f"(epsilon={spent[0]!r}, delta={spent[1]!r})", expected, spent)
        expected += 1
    rows = expected - 1
    final = None
    if full and accountant is not None:
        final = spent if spent is not None else tuple(float(x) for x in accountant.spent())
    elif accountant is None:
        final = (0.0, 0.0)
    if head_rows != rows:
        if isinstance(head_rows, int) and head_rows > rows:
            missing = f"row {rows + 1}" if head_rows == rows + 1 else f"rows {rows + 1}-{head_rows}"
            return result(False, rows + 1, f"{missing} missing: the head records {head_rows} rows but the table "
                                           f"ends at row {rows} (the last rows were dropped)", rows, final)
        return result(False, rows, f"the head records {head_rows!r} rows but the table has {rows}: the head was "
                                   "edited", rows, final)
    if head_hash != (prev if rows else None):
        return result(False, rows or None, f"the head hash does not match row {rows}'s hash: the head or the "
                                           "last row was edited", rows, final)
    if full and rows and spent is None:  # every transaction stores totals on its last row
        where = "the confidential file stores" if confidential else "stores"
        return result(False, rows, f"row {rows}, the last row, has no spent totals ({where} them for the last "
                                   "row of every transaction): the rows of a transaction were dropped", rows, final)
    notes = []
    if links is not None:
        extra_rows = list(links)
        if extra_rows:
            return result(False, rows, f"the confidential file has {len(extra_rows)} row(s) that no hit row names "
                                       "(rows were added to it)", rows, final)
        if totals:
            return result(False, min(totals), "the confidential file stores totals for a row that is not the last "
                                              "of its transaction", rows, final)
        conf_head = confidential_head(store)
        orphans = store.confidential_orphans(head_rows)
        if orphans:
            notes.append(f"{orphans} confidential row(s) of an interrupted, uncommitted charge ignored")
        elif conf_head != ((conf_id, conf_prev) if conf_id else (0, None)):
            return result(False, rows, f"the confidential file's head (row {conf_head[0]}) does not match its rows "
                                       f"(last row {conf_id}): confidential rows were dropped", rows, final)
    if own_times:
        notes.append(f"{own_times} row(s) carry their own commit time instead of their run's start (written by an "
                     "earlier version: such times can depend on the data, see docs/ledger.md)")
    if not full:
        message = (f"shareable part verified: {rows} rows, {len(runs)} runs, hash chains and heads intact, every "
                   f"event accounted by {accountant.kind}; the confidential file {confidential_location!r} was not "
                   "found, so the per-teacher charges and the spent budget were not checked")
        if notes:
            message += "; " + "; ".join(notes)
        return result(True, None, message, rows, None, queries, hits)
    _group_spends(runs_by_id, group_charges, config)
    what = "shareable and confidential parts" if confidential else "shareable part (no confidential part)"
    message = (f"verified: {rows} rows, {len(runs)} runs, {what}: hash chains and heads intact, totals agree, "
               "within budget")
    if notes:
        message += "; " + "; ".join(notes)
    return result(True, None, message, rows, final, queries, hits)

