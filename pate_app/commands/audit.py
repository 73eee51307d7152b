"""``pate-accountant audit PATH``: verify a privacy ledger and print the budget it spent (docs/ledger.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pate_app.options import positive_int

NAME = "audit"
HELP = "verify a privacy ledger and print the budget it spent"
DESCRIPTION = (
    "Open a ledger read-only, check its hash chains, heads and runs, replay every row through a fresh "
    "accountant rebuilt from the stored configuration, and print the spent budget and each run's "
    "metadata (docs/ledger.md). An accountant that keeps confidential charges (individual charging) "
    "is checked in full when its confidential file PATH.confidential.sqlite is present, and its "
    "shareable part alone otherwise; the output says which. --expect-head/--expect-rows and "
    "--expect-run-head/--expect-runs check the ledger against heads written down earlier (every run prints the "
    "command). Exit status 0 when "
    "it verifies; 1, naming the offending row, when a row was edited, dropped or reordered, when the "
    "totals disagree, when the budget was exceeded, when the ledger does not extend the pinned head, or "
    "(with --public-key) when a signed checkpoint is missing, forged or not extended; "
    "3 when the file cannot be checked at all (unreadable, not a ledger: an empty file or an SQLite database "
    "with no tables included, an interrupted write); 2 when PATH is missing or a key file is unusable (not a "
    "regular file, larger than a key, not a PEM key). PATH may be a postgresql:// URL (docs/ledger.md, "
    "\"PostgreSQL\"): its confidential part is its schema NAME_confidential, --checkpoints is then required with "
    "--public-key, and no output shows its password. The audit never writes to the ledger nor creates files "
    "beside it."
)
#: Exit status when the file cannot be checked at all (distinct from 1, "it does not verify").
CANNOT_CHECK = 3


def add_arguments(p) -> None:
    """``PATH``, ``--confidential FILE``, ``--json``."""
    p.add_argument("path", metavar="PATH", help="the ledger file (SQLite), or a postgresql://USER@HOST:PORT/DB?ledger=NAME "
                                             "URL (docs/ledger.md, \"PostgreSQL\")")
    p.add_argument("--confidential", metavar="FILE", default=None,
                   help="the confidential file (default PATH.confidential.sqlite, used when it exists)")
    p.add_argument("--expect-head", metavar="HASH", type=head_hash, default=None,
                   help="a head hash written down earlier (every run prints it): the ledger must extend it, i.e. "
                        "one of its rows (row --expect-rows, if given) has this hash; exit 1 otherwise")
    p.add_argument("--expect-rows", metavar="N", type=positive_int, default=None,
                   help="a row count written down earlier: the ledger must have at least N rows (and, with "
                        "--expect-head, row N must have that hash); exit 1 otherwise")
    p.add_argument("--expect-run-head", metavar="HASH", type=head_hash, default=None,
                   help="the last run's hash written down earlier (every run prints it): the ledger must extend it "
                        "(run --expect-runs, if given, has this hash); covers the runs' metadata, which the row "
                        "chain does not; exit 1 otherwise")
    p.add_argument("--expect-runs", metavar="N", type=positive_int, default=None,
                   help="a run count written down earlier: the ledger must have at least N runs; exit 1 otherwise")
    p.add_argument("--public-key", metavar="FILE", default=None,
                   help="an Ed25519 public key (PEM): every signed checkpoint in --checkpoints must be signed by it "
                        "and extended by the ledger, and there must be one; exit 1 otherwise (docs/ledger.md)")
    p.add_argument("--checkpoints", metavar="FILE", default=None,
                   help="the signed checkpoints to check with --public-key (default PATH.checkpoints.jsonl; required "
                        "for a postgresql:// ledger)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")


def scrub(text, *locations: str) -> str:
    """``text`` with the passwords of every URL in ``locations`` replaced by ``***`` (a path has none): the one
    place the commands (``audit``, ``sign``, ``ledger copy``) remove them from what they print, behind
    :func:`pate_accountant.ledger.shown_location` and the ledger's own messages."""
    from pate_accountant.ledger import hide_passwords

    return hide_passwords(text, *locations)


def check_ledger_arguments(args, name: str, *, checkpoints_needed: bool, needed_with: str = "") -> bool:
    """The usage errors ``audit`` and ``sign`` share on their ledger argument ``args.path`` (shown as ``name``) and
    its ``--confidential`` and ``--checkpoints``: a PostgreSQL ledger keeps its confidential part in its database,
    and has no folder to default its checkpoints file to when ``checkpoints_needed`` (``needed_with``: the option
    that needs them); a file must exist, and so must a given ``--confidential`` file.  Whether the ledger is a
    PostgreSQL URL."""
    from pate_accountant.ledger import is_ledger_url

    url = is_ledger_url(args.path)
    if url and args.confidential is not None:
        args.parser.error("argument --confidential: a PostgreSQL ledger keeps its confidential part in the schema "
                          "NAME_confidential of its database")
    if url and checkpoints_needed and args.checkpoints is None:
        args.parser.error(f"argument --checkpoints: required{needed_with} for a postgresql:// ledger (there is no "
                          "file beside it to default to)")
    if not url and not os.path.isfile(args.path):
        args.parser.error(f"argument {name}: no ledger file at {args.path!r}")
    if args.confidential is not None and not os.path.isfile(args.confidential):
        args.parser.error(f"argument --confidential: no file at {args.confidential!r}")
    return url


def head_hash(text: str) -> str:
    """A row hash: 64 hexadecimal digits (SHA-256), as runs print it."""
    value = text.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise argparse.ArgumentTypeError(f"must be a head hash of 64 hexadecimal digits, got {text!r}")
    return value


def pin_problem(ledger, head: str | None, rows: int | None, run_head: str | None = None,
                runs: int | None = None) -> str | None:
    """Why ``ledger`` does not extend the pinned history, or ``None`` when it does: its row ``rows`` has hash
    ``head`` (without ``rows``: some row has), it has at least ``rows`` rows, and the same for ``runs`` and
    ``run_head`` (:func:`pate_accountant.checkpoints.history_problem`)."""
    from pate_accountant.checkpoints import history_problem

    return history_problem(ledger, rows=rows, head_hash=head, runs=runs, run_head_hash=run_head, record="pinned")


def _check_signed(ledger, checkpoints: str, public_key):
    """:func:`pate_accountant.checkpoints.check_checkpoints` on the file ``checkpoints`` (a missing or unreadable
    file is a failed check: the auditor asked for signatures)."""
    from pate_accountant.checkpoints import (
        CheckpointError,
        CheckpointsResult,
        check_checkpoints,
        key_id,
        read_checkpoints,
    )

    try:
        found = read_checkpoints(checkpoints)
    except CheckpointError as exc:  # missing; or refused unread (not a regular file, an overlong line, not JSON)
        rows = ledger.head_record["rows"]
        what = "no signed checkpoint to check the ledger against" if not os.path.lexists(checkpoints) else \
            "the signed checkpoints cannot be read"
        return CheckpointsResult(False, f"{what}: {exc}", 0, key_id(public_key), 0, rows)
    return check_checkpoints(ledger, found, public_key)


def metadata_lines(metadata, indent: str) -> list[str]:
    """A run's metadata as one ``key: value`` line per field, nested fields as ``outer.inner`` (keys sorted)."""
    if not isinstance(metadata, dict):
        return [f"{indent}{json.dumps(metadata, sort_keys=True)}"]
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict) and value:
            for key in sorted(value):
                walk(f"{prefix}.{key}" if prefix else str(key), value[key])
        else:
            flat[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("", metadata)
    width = max(map(len, flat), default=0)
    return [f"{indent}{key:<{width}} : {value}" for key, value in flat.items()]


def reason(exc: BaseException) -> str:
    """Why a ledger cannot be checked, in words: our own errors' messages as they are, an operating-system error's
    description and file, a text that is not UTF-8 said so; never an internal class name or a driver's SQL."""
    from pate_accountant.errors import PateAccountantError

    if isinstance(exc, PateAccountantError):
        return " ".join(str(exc).split())
    if isinstance(exc, UnicodeDecodeError):
        return "not a ledger: its text is not UTF-8"
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or exc}{where}"
    return " ".join(str(exc).split()) or type(exc).__name__


def privacy_unit_line(runs) -> str | None:
    """What the ledger's guarantee is stated for, from its runs' metadata (``record_relation``): one line, or
    ``None`` when no run recorded it (ledgers written before issue 31)."""
    from pate_app.privacy_unit import RECORD_RELATIONS

    kept = list(dict.fromkeys(run["metadata"].get("record_relation") for run in runs
                              if isinstance(run.get("metadata"), dict) and run["metadata"].get("record_relation")))
    if not kept:
        return None
    return "one record: " + "; ".join(f"{name} ({RECORD_RELATIONS.get(name, 'unknown')})" for name in kept)


def main(args: argparse.Namespace) -> int:
    """Verify the ledger ``args.path`` and print what it spent; 0 when it verifies, 1 otherwise."""
    import attr

    from pate_accountant.accountants import remaining_of

    from pate_accountant.checkpoints import (
        CheckpointError,
        default_checkpoints_path,
        load_public_key,
    )
    from pate_accountant.ledger import (
        STORAGE_ERRORS,
        Ledger,
        LedgerError,
        LedgerIntegrityError,
        VerificationResult,
        shown_location,
    )

    location = shown_location(args.path)

    def _print(*values, **kwargs):  # nothing printed shows a password of the URL
        print(*(scrub(value, args.path) for value in values), **kwargs)

    url = check_ledger_arguments(args, "PATH", checkpoints_needed=args.public_key is not None,
                                 needed_with=" with --public-key")
    if args.checkpoints is not None and args.public_key is None:
        args.parser.error("argument --checkpoints: needs --public-key (the key the checkpoints must be signed by)")
    pins = (args.expect_head, args.expect_rows, args.expect_run_head, args.expect_runs)
    pinned = any(value is not None for value in pins)
    pin = signed = public_key = checkpoints = None
    if args.public_key is not None:
        try:
            public_key = load_public_key(args.public_key)
        except CheckpointError as exc:
            args.parser.error(f"argument --public-key: {exc}")
        checkpoints = args.checkpoints if args.checkpoints is not None else default_checkpoints_path(args.path)
    try:
        with Ledger.open(args.path, read_only=True, confidential=args.confidential) as ledger:
            result = ledger.verify()
            if result.ok and pinned:
                pin = pin_problem(ledger, *pins)
            if result.ok and public_key is not None:
                signed = _check_signed(ledger, checkpoints, public_key)
    except LedgerIntegrityError as exc:  # a ledger of ours whose stored layout or metadata was tampered with
        result = VerificationResult(False, 0, None, None, f"tampered layout or metadata: {reason(exc)}")
    except (LedgerError, *STORAGE_ERRORS, OSError, UnicodeDecodeError, ValueError) as exc:  # cannot be checked
        message = scrub(reason(exc), args.path)
        if args.json:
            _print(json.dumps({"path": location, "ok": False, "verdict": "cannot check", "message": message},
                             indent=2))
        else:
            _print(f"ledger      : {location}")
            _print(f"verdict     : CANNOT CHECK: {message}")
        _print(f"pate-accountant audit: cannot check {location!r}: {message}", file=sys.stderr)
        return CANNOT_CHECK
    if pin is not None:
        result = attr.evolve(result, ok=False, message=f"the chain verifies, but {pin}")
    elif signed is not None and not signed.ok:
        result = attr.evolve(result, ok=False, message=f"the chain verifies, but {signed.message}")
    checked = {
        "verified": "shareable and confidential parts",
        "absent": f"shareable part only (confidential file {result.confidential_path} not found: per-teacher "
                  "charges and the spent budget not checked)",
        "unusable": f"nothing beyond the metadata (the confidential file {result.confidential_path} is unusable)",
        "none": "shareable part (this accountant keeps no confidential data)",
    }[result.confidential]
    if args.json:
        payload = {"path": location, "checked": checked, **result.as_dict()}
        if pinned:
            payload["pinned"] = {"head": args.expect_head, "rows": args.expect_rows, "run_head": args.expect_run_head,
                                 "runs": args.expect_runs, "extends": pin is None}
        if signed is not None:
            payload["signed"] = {"checkpoints_file": checkpoints, **signed.as_dict()}
        _print(json.dumps(payload, indent=2, default=str))
    else:
        budget = "none" if result.budget is None else f"epsilon {result.budget[0]:g}, delta {result.budget[1]:g}"
        if result.spent is not None:
            spent = f"epsilon {result.spent[0]:.6g}, delta {result.spent[1]:.6g}"
            if result.confidential == "verified":
                spent += " (confidential: a function of who was charged; do not share)"
        elif result.confidential == "absent":
            spent = "confidential (kept in the confidential file); the guarantee is the budget"
        else:
            spent = "unknown"
        _print(f"ledger      : {location}")
        _print(f"checked     : {checked}")
        _print(f"data set    : {result.dataset if result.dataset is not None else 'not named'}")
        _print(f"accountant  : {result.kind or 'none attached'}")
        unit = privacy_unit_line(result.runs)
        if unit is not None:
            _print(f"privacy unit: {unit}")
        chain_ok = result.ok or pin is not None or signed is not None  # the chain itself verified in full
        _print(f"rows        : {result.rows}{'' if chain_ok else ' verified before the failure'}")
        if result.queries is not None:
            _print(f"queries     : {result.queries} with an outcome, {result.hits} target hits")
        _print(f"spent       : {spent}{'' if chain_ok or result.spent is None else ' (up to the first bad row)'}")
        _print(f"budget      : {budget}")
        if result.budget is not None and result.spent is not None and result.kind is not None:
            try:  # one computation with generate and ledger list (pate_accountant.accountants.Remaining)
                _print(f"remaining   : {remaining_of(result.kind, result.spent, result.budget).words()}")
            except (KeyError, ValueError):  # an accountant kind this installation does not register
                pass
        if result.run_metadata is not None:
            _print("metadata    :")
            for line in metadata_lines(result.run_metadata, "  "):
                _print(line)
        _print(f"runs        : {len(result.runs)}")
        for run in result.runs:
            _print(f"  run {run['id']} ({run['rows']} rows from row {run['first_row'] + 1}):")
            for line in metadata_lines(run["metadata"], "    "):
                _print(line)
            groups = run.get("groups") or []
            if groups:
                touches = run["metadata"].get("groups_a_record_touches", 1) if isinstance(run["metadata"], dict) else 1
                rule = ("each event's largest count over the groups" if touches == 1 else
                        f"each event's largest count over the groups, counted {touches} times (a record can change "
                        f"{touches} groups: docs/privacy_unit.md)")
                _print(f"    groups: {len(groups)} groups of records (parallel composition); each alone spent epsilon "
                       + ", ".join(f"{g['spent'][0]:.6g}" for g in groups)
                       + f"; the data set pays {rule} (docs/groups.md)")
        if result.software_version is not None:
            _print(f"created by  : pate-accountant {result.software_version}")
        if result.head_hash is not None:
            _print(f"head hash   : {result.head_hash}")
        if pinned:
            shown = ", ".join(x for x in (args.expect_head and f"head {args.expect_head[:16]}...",
                                          args.expect_rows and f"{args.expect_rows} rows",
                                          args.expect_run_head and f"run head {args.expect_run_head[:16]}...",
                                          args.expect_runs and f"{args.expect_runs} runs") if x)
            _print(f"pinned      : {shown}: {'extended' if pin is None and result.ok else 'NOT extended'}")
        if signed is not None:
            _print(f"signed      : {'OK' if signed.ok else 'FAILED'}: {signed.message} ({checkpoints})")
        elif not url and os.path.isfile(default_checkpoints_path(args.path)):
            _print(f"signed      : not checked: {default_checkpoints_path(args.path)} holds signed checkpoints; give "
                  "the signer's public key with --public-key FILE to check the ledger against them")
        _print(f"verdict     : {'OK' if result.ok else 'FAILED'}: {result.message}")
    if not result.ok:
        where = f" at row {result.first_bad_row}" if result.first_bad_row is not None else ""
        _print(f"pate-accountant audit: ledger does not verify{where}: {result.message}", file=sys.stderr)
    return 0 if result.ok else 1
