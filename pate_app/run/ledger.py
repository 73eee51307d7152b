"""A run's side of the data set's ledger: where the budget of its records is kept (:func:`_dataset_ledger`, the
ledger home's index, :class:`_LedgerPlace`; :func:`_routed_dataset`), the read-only checks of an existing ledger
and the claim made before the model loads (:func:`_check_existing_ledger`, :func:`_claim_ledger`), what the
budget still pays for (:func:`_check_affords`, :func:`_records_afforded`), the signed checkpoint of its head
(:func:`_signing`, :func:`_sign`), and the ledger as the run leaves it (:func:`_ledger_state`,
:func:`_reread_ledger`; :func:`_discard` after a refusal)."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from pathlib import Path

import attr

from pate_accountant.checkpoints import (
    CheckpointError,
    append_checkpoint,
    checkpoints_file,
    load_private_key,
    sign_checkpoint,
)
from pate_accountant.errors import PateAccountantError, UnsupportedEventError
from pate_accountant.ledger import (
    STORAGE_ERRORS,
    Ledger,
    VerificationResult,
    is_ledger_url,
    shown_location,
)
from pate_accountant.ledger_home import (
    DatabaseIndex,
    LedgerHome,
    dataset_fingerprint,
    ledger_name_of,
    with_ledger_name,
)
from pate_accountant.tct import largest_fitting
from pate_app.errors import RunInputError, first_line
from pate_app.run.mechanism import build_accountant

__all__ = ["MAX_RECORDS_AFFORDED"]


@attr.s(frozen=True, auto_attribs=True)
class _LedgerPlace:
    """Where a run's data set keeps its budget (:func:`_dataset_ledger`)."""

    #: A file's :class:`~pathlib.Path`, or a PostgreSQL ledger's URL (credentials included: never shown).
    location: object
    #: The location as messages and results show it (no password).
    shown: str
    #: The records' fingerprint: under the installation's key for a file, the database's key for PostgreSQL.
    fingerprint: str
    #: Enter the ledger in the index(es) once it is claimed.
    register: object
    #: Let go of the database index's connection (nothing to do for a file).
    close: object = lambda: None

    @property
    def is_url(self) -> bool:
        return not isinstance(self.location, Path)

    @property
    def where(self) -> str:
        """The ledger as a refusal names it: ``--ledger 'PATH'``."""
        return f"--ledger {self.shown!r}"


def _dataset_ledger(ledger_home, records, dataset: str, ledger, *, check: bool = True,
                    text_key: str | None = None) -> _LedgerPlace:
    """Where the budget of ``records`` is kept.  A file: ``ledger`` when given and the installation's ledger home
    knows no other ledger for the records (else, with ``check``, a :class:`RunInputError` naming that ledger),
    else the ledger the home has registered for them, else a new one in the home.  A PostgreSQL URL: the database's
    own data-set index (:class:`~pate_accountant.ledger_home.DatabaseIndex`) decides in the same way across hosts
    (a URL without a ``ledger`` parameter takes the registered ledger, else a new one named after the data set),
    and the installation's home must not know the records under another ledger.  Nothing is registered here
    (:attr:`_LedgerPlace.register`, after the claim)."""
    if ledger_home is False:  # the caller manages its budgets itself: no index is read or written
        if ledger is None:
            raise RunInputError("ledger_home=False (budgets managed by the caller) needs the ledger: give spec.ledger")
        fingerprint = dataset_fingerprint(records, text_key=text_key)
        location = ledger if is_ledger_url(ledger) else Path(ledger)
        return _LedgerPlace(location, shown_location(location), fingerprint, lambda: None)
    home = ledger_home if isinstance(ledger_home, LedgerHome) else LedgerHome(ledger_home)
    local = None  # the records under this installation's key, once
    if ledger is None or not is_ledger_url(ledger):
        where = "--ledger" if ledger is None else f"--ledger {str(ledger)!r}"
        try:
            local = home.identify(records, text_key=text_key)
            registered = home.check(local, ledger) if check else None
            if ledger is None:
                home.prepare()
        except (PateAccountantError, OSError, sqlite3.Error) as exc:
            raise RunInputError(f"{where}: {exc}") from None
        if ledger is not None or not is_ledger_url(registered):
            path = Path(ledger if ledger is not None else registered or home.default_path(dataset, local.fingerprint))
            return _LedgerPlace(path, str(path), local.fingerprint, lambda: home.register(local, dataset, path))
        # the installation knows these records' ledger in a database: run there, reached as the run that registered
        # it reached it (its user and parameters; the password from libpq's files or PGPASSWORD)
        ledger = home.reach(registered) or registered
    where = f"--ledger {shown_location(ledger)!r}"
    try:
        named = ledger_name_of(ledger)
        index = DatabaseIndex(ledger)
    except PateAccountantError as exc:
        raise RunInputError(f"{where}: {exc}") from None
    try:
        shared = index.identify(records, text_key=text_key)
        registered = index.check(shared, named) if check else None
        name = named or registered or index.default_name(dataset, shared.fingerprint)
        identity = index.identity(name)
        local = local or home.identify(records, text_key=text_key)
        if check:
            home.check(local, identity)
    except (PateAccountantError, OSError, sqlite3.Error) as exc:
        index.close()
        raise RunInputError(f"{where}: {exc}") from None

    def register():
        index.register(shared, dataset, name)
        home.register(local, dataset, identity, reach=shown_location(with_ledger_name(ledger, name)))

    location = with_ledger_name(ledger, name)
    return _LedgerPlace(location, shown_location(location), shared.fingerprint, register, index.close)


def _routed_dataset(place, dataset: str, asked: str | None, *, announce: bool) -> str:
    """The data set a run without ``--ledger`` charges: when the ledger the index found for these records (by any
    record they share) keeps a data set of another name (the file was renamed, or grew), that data set, said on
    stderr; a ``--dataset`` that names another one is refused, saying which ledger holds the records and why."""
    try:
        with Ledger.open(place.location, read_only=True) as existing:
            stored = existing.dataset
    except (FileNotFoundError, PateAccountantError, OSError, ValueError, *STORAGE_ERRORS):
        return dataset  # a new ledger (or one that cannot be read: the claim says why)
    if stored is None or stored == dataset:
        return dataset
    if asked is not None:
        place.close()
        raise RunInputError(f"--dataset {asked!r}: these records (or some of them) are the data set {stored!r}, whose "
                            f"budget the ledger {place.shown!r} keeps (this installation's index found them there by "
                            "their records' identities): leave --dataset out to charge that budget")
    if announce:
        print(f"pate-accountant: these records (or some of them) are the data set {stored!r}: charged to its ledger "
              f"{place.shown!r}", file=sys.stderr, flush=True)
    return stored


def _check_existing_ledger(location, dataset: str, accountant_name: str, budget, mechanism,
                           num_teachers: int, relation: str = "replace-one") -> None:
    """An existing ``--ledger``: it must belong to ``dataset``, be kept by the same accountant (kind and
    budget), verify as far as its rows replay, and have budget left for one step.  Read-only: nothing is
    written.  A ledger another run has only just created (no data set, no run, no row yet) passes: the claim
    (:func:`_claim_ledger`) decides under the write lock.  ``location``: a file's path or a PostgreSQL URL."""

    shown = shown_location(location)
    where = f"--ledger {shown!r}"
    try:
        ledger = Ledger.open(location, read_only=True)
    except FileNotFoundError:
        return  # removed meanwhile by the run that created it: the claim creates a new one
    except (PateAccountantError, OSError, ValueError) as exc:
        raise RunInputError(f"{where}: cannot open it as a ledger: {exc}") from None
    try:
        stored = ledger.dataset
        if stored is None:
            if _just_created(ledger):
                return
            raise RunInputError(f"{where} names no data set, so it cannot take runs over {dataset!r} "
                                "(give a new ledger path)")
        if stored != dataset:
            raise RunInputError(f"{where} belongs to the data set {stored!r}, not {dataset!r}: a ledger keeps one "
                                "data set's budget (give that data set's ledger, or --dataset)")
        try:
            acct = build_accountant(accountant_name, budget, ledger, mechanism=mechanism,
                                    num_teachers=num_teachers)
        except RunInputError as exc:
            fixed = (" (a data set's budget is fixed when its ledger is created: run with the ledger's budget, shown "
                     f"by `pate-accountant audit {shown}`)") if "budget" in str(exc) else ""
            raise RunInputError(f"{where} is kept by another accountant or budget: {exc}{fixed}") from None
        except PateAccountantError as exc:
            raise RunInputError(f"{where}: {exc}") from None
        _check_affords(acct, mechanism, where, dataset, budget)
        _check_record_relation(ledger, relation, where)
    finally:
        ledger.close()


def _just_created(ledger: Ledger) -> bool:
    """A complete ledger with no data set, run or row: another run created it an instant ago and is claiming it."""
    try:
        return ledger.row_count == 0 and not ledger.runs
    except (PateAccountantError, *STORAGE_ERRORS):  # no head or runs table: not a ledger's layout
        return False


def _check_affords(acct, mechanism, where: str, dataset: str, budget) -> None:
    try:
        affordable = acct.can_afford(mechanism.event)
    except UnsupportedEventError:  # a ledger kept under the other neighbouring relation (issue 22, item 4)
        kept = acct.neighboring_relation
        stated = getattr(mechanism.event, "relation", None)
        raise RunInputError(
            f"{where} holds events stated under the {kept} relation of teachers, and this run's are stated under "
            f"{stated} (one record moves one teacher's vote): one ledger composes one relation. A ledger whose events "
            "are add-remove-one of teachers was written by an earlier version, which under-counted records under "
            "--relation add-remove-one; give another ledger (docs/privacy_unit.md)") from None
    if not affordable:
        spent = acct.spent()
        raise RunInputError(
            f"{where}: the budget of data set {dataset!r} (epsilon {budget[0]:g}, delta {budget[1]:g}) cannot pay "
            f"for another step: epsilon {float(spent[0]):.6g}, delta {float(spent[1]):.3g} already spent")


def _check_record_relation(ledger: Ledger, relation: str, where: str) -> None:
    """One ledger states one guarantee: every run on it under the same record-level relation (the run metadata's
    ``record_relation``; runs written before it was recorded are not compared: their events say what they
    charged).  A :class:`RunInputError` naming both relations otherwise."""
    kept = {run["metadata"].get("record_relation") for run in ledger.runs} - {None}
    if kept and relation not in kept:
        raise RunInputError(
            f"{where} states its guarantee for {', '.join(sorted(kept))} of records, and this run's relation is "
            f"{relation}: one ledger keeps one relation (run with that --relation and --labels-public setting, or "
            "give another ledger; docs/privacy_unit.md)")


def _claim_ledger(location, dataset: str, accountant_name: str, budget, mechanism, num_teachers: int,
                  relation: str = "replace-one"):
    """Claim the data set's ledger for this run before any slow work (loading the model): open it, creating it
    when missing; name its data set and attach the run's accountant (which stores the accountant and budget in
    a new ledger, and replays an existing one's rows); check that one step is affordable.  From here a second
    run given the same path with another data set, accountant or budget is refused at once, whichever of the
    two started first.  Returns ``(ledger, accountant)``.  On a refusal nothing is left behind: an existing
    ledger is unchanged, and one created here is removed (:meth:`Ledger.discard_if_unused`)."""

    where = f"--ledger {shown_location(location)!r}"
    try:
        ledger = Ledger.open(location)
    except (PateAccountantError, OSError, ValueError) as exc:
        raise RunInputError(f"{where}: cannot open it as a ledger: {exc}") from None
    try:
        try:
            ledger.set_dataset(dataset)
            acct = build_accountant(accountant_name, budget, ledger, mechanism=mechanism, num_teachers=num_teachers)
        except ValueError as exc:  # another run claimed the ledger since the read-only check, for another budget
            raise RunInputError(f"{where}: {exc}") from None
        except PateAccountantError as exc:
            raise RunInputError(f"{where}: {exc}") from None
        _check_affords(acct, mechanism, where, dataset, budget)
        _check_record_relation(ledger, relation, where)
        _check_one_partition(acct, ledger, where)
    except BaseException:
        _discard(ledger)
        raise
    return ledger, acct


def _check_one_partition(acct, ledger: Ledger, where: str, run_id: int | None = None) -> None:
    """Individual charging counts charges per teacher, and a teacher is one part of one run's random partition
    of the records: another run's teacher ``i`` holds other records, so adding up two runs' counters by teacher
    index could under-count a record.  So a data set's ledger under individual charging takes one run (checked
    at the claim, and again once the run has begun, against a run that began meanwhile)."""
    if not acct.confidential_charges:
        return
    runs = len(ledger.runs) if run_id is None else run_id - 1
    if runs:
        raise RunInputError(
            f"{where} already holds {runs} run(s) under individual charging, whose counters belong to those runs' "
            "teachers: a data set's ledger under individual charging takes one run (docs/tct_and_individual.md, "
            "'In generate'); use another accountant to run again on these records")


def _discard(ledger: Ledger) -> None:
    """Close ``ledger`` after a refusal, removing it when this run created it and nobody used it; a failure of
    the clean-up never hides the refusal itself."""
    try:
        ledger.discard_if_unused()
    except (*STORAGE_ERRORS, OSError):
        with contextlib.suppress(*STORAGE_ERRORS):
            ledger.close()


def _close(ledger: Ledger) -> None:
    """Close ``ledger`` once the run has ended."""
    try:
        ledger.close()
    except STORAGE_ERRORS:  # closing checkpoints the write-ahead log; on a full disk its rows stay in the log,
        pass  # where the next open of the ledger finds them


def _signing(signing_key, checkpoints, ledger_path: Path):
    """The loaded signing key (or ``None``) and the checkpoints file, checked before anything is written."""
    if signing_key is None:  # checkpoints without a key: refused by RunSpec
        return None, None
    try:
        key = load_private_key(signing_key)
    except CheckpointError as exc:
        raise RunInputError(f"--signing-key: {exc}") from None
    try:
        return key, checkpoints_file(ledger_path, checkpoints)
    except CheckpointError as exc:
        raise RunInputError(f"--checkpoints: {exc}") from None


def _sign(ledger: Ledger, key, verdict, checkpoints: Path) -> dict:
    """Sign the ledger's verified head and append the checkpoint; what the result reports of it."""
    try:  # stamped with the start of the last run it covers: the run's duration depends on the data
        checkpoint = sign_checkpoint(ledger, key, verification=verdict, at_run_start=True)
    except PateAccountantError:  # another run charged since the audit: audit the ledger again, then sign
        checkpoint = sign_checkpoint(ledger, key, at_run_start=True)
    append_checkpoint(checkpoints, checkpoint)
    return {"file": str(checkpoints), "key_id": checkpoint["key_id"], "rows": checkpoint["rows"],
            "head_hash": checkpoint["head_hash"]}


def _ledger_state(ledger: Ledger, run_id: int):
    """``(heads, rows of run run_id, verdict)`` of ``ledger``: its heads read together, then its audit."""
    heads = ledger.head_record  # rows, head hash, runs and run head hash, read together
    run_rows = sum(1 for row in ledger.rows() if row.run == run_id)
    return heads, run_rows, ledger.verify()


def _reread_ledger(location, run_id: int, failure: BaseException):
    """:func:`_ledger_state` through a new read-only connection, after ``failure`` broke the run's own (a
    database server restarted, a connection cut); when that fails too, unknown heads and a failed audit saying
    why (the ledger keeps every committed charge: ``pate-accountant audit`` checks it once it can be reached)."""
    try:
        with Ledger.open(location, read_only=True) as again:
            return _ledger_state(again, run_id)
    except (PateAccountantError, OSError, *STORAGE_ERRORS) as exc:
        heads = {"rows": None, "head_hash": None, "runs": None, "run_head_hash": None}
        verdict = VerificationResult(False, 0, None, None, f"the ledger could not be read after the run stopped "
                                     f"({first_line(failure)}; then {first_line(exc)}): audit it once it can be "
                                     "reached")
        return heads, None, verdict


#: The most whole records :func:`_records_afforded` counts for one group.
MAX_RECORDS_AFFORDED = 100_000


def _pays_for_records(accountant, event, steps: int, records: int = 1) -> bool:
    """Whether ``accountant`` pays for ``records`` whole records of ``steps`` charged runs each of ``event``, every
    run charged at its worst (a q-target a hit)."""
    return bool(accountant.can_afford(event, steps * records))


def _records_afforded(accountant, event, steps: int) -> int:
    """How many whole records of ``steps`` charged runs ``accountant``'s budget still pays for (at most
    :data:`MAX_RECORDS_AFFORDED`)."""
    if not _pays_for_records(accountant, event, steps):
        return 0
    return largest_fitting(lambda k: k <= MAX_RECORDS_AFFORDED and _pays_for_records(accountant, event, steps, k),
                           start=1)
