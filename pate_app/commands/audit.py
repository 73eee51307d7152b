"""``pate-accountant audit PATH``: verify a privacy ledger and print the budget it spent (docs/ledger.md)."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys

NAME = "audit"
HELP = "verify a privacy ledger and print the budget it spent"
DESCRIPTION = (
    "Open a ledger read-only, check its hash chains, heads and runs, replay every row through a fresh "
    "accountant rebuilt from the stored configuration, and print the spent budget and each run's "
    "metadata (docs/ledger.md). An accountant that keeps confidential charges (individual charging) "
    "is checked in full when its confidential file PATH.confidential.sqlite is present, and its "
    "shareable part alone otherwise; the output says which. Exit status 1, naming the offending row, "
    "when a row was edited, dropped or reordered, when the totals disagree or when the budget was "
    "exceeded; 2 when PATH is missing."
)


def add_arguments(p) -> None:
    """``PATH``, ``--confidential FILE``, ``--json``."""
    p.add_argument("path", metavar="PATH", help="the ledger file (SQLite)")
    p.add_argument("--confidential", metavar="FILE", default=None,
                   help="the confidential file (default PATH.confidential.sqlite, used when it exists)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")


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


def main(args: argparse.Namespace) -> int:
    """Verify the ledger ``args.path`` and print what it spent; 0 when it verifies, 1 otherwise."""
    from pate_accountant.ledger import Ledger, LedgerError, VerificationResult

    if not os.path.isfile(args.path):
        args.parser.error(f"argument PATH: no ledger file at {args.path!r}")
    if args.confidential is not None and not os.path.isfile(args.confidential):
        args.parser.error(f"argument --confidential: no file at {args.confidential!r}")
    try:
        with Ledger.open(args.path, read_only=True, confidential=args.confidential) as ledger:
            result = ledger.verify()
    except (LedgerError, sqlite3.Error, OSError, UnicodeDecodeError, ValueError) as exc:  # not a ledger, unreadable, ...
        result = VerificationResult(False, 0, None, None, f"{type(exc).__name__}: {exc}")
    checked = {
        "verified": "shareable and confidential parts",
        "absent": f"shareable part only (confidential file {result.confidential_path} not found: per-teacher "
                  "charges and the spent budget not checked)",
        "unusable": f"nothing beyond the metadata (the confidential file {result.confidential_path} is unusable)",
        "none": "shareable part (this accountant keeps no confidential data)",
    }[result.confidential]
    if args.json:
        print(json.dumps({"path": args.path, "checked": checked, **result.as_dict()}, indent=2, default=str))
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
        print(f"ledger      : {args.path}")
        print(f"checked     : {checked}")
        print(f"data set    : {result.dataset if result.dataset is not None else 'not named'}")
        print(f"accountant  : {result.kind or 'none attached'}")
        print(f"rows        : {result.rows}{'' if result.ok else ' verified before the failure'}")
        if result.queries is not None:
            print(f"queries     : {result.queries} with an outcome, {result.hits} target hits")
        print(f"spent       : {spent}{'' if result.ok or result.spent is None else ' (up to the first bad row)'}")
        print(f"budget      : {budget}")
        if result.run_metadata is not None:
            print("metadata    :")
            for line in metadata_lines(result.run_metadata, "  "):
                print(line)
        print(f"runs        : {len(result.runs)}")
        for run in result.runs:
            print(f"  run {run['id']} ({run['rows']} rows from row {run['first_row'] + 1}):")
            for line in metadata_lines(run["metadata"], "    "):
                print(line)
        if result.software_version is not None:
            print(f"created by  : pate-accountant {result.software_version}")
        if result.head_hash is not None:
            print(f"head hash   : {result.head_hash}")
        print(f"verdict     : {'OK' if result.ok else 'FAILED'}: {result.message}")
    if not result.ok:
        where = f" at row {result.first_bad_row}" if result.first_bad_row is not None else ""
        print(f"pate-accountant audit: ledger does not verify{where}: {result.message}", file=sys.stderr)
    return 0 if result.ok else 1
