"""``pate-accountant ledger copy SRC DST``: copy a whole ledger between SQLite and PostgreSQL (docs/ledger.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pate_app.commands.audit import CANNOT_CHECK, scrub

NAME = "ledger"
HELP = "copy a ledger between SQLite and PostgreSQL, verifying both ends"
DESCRIPTION = (
    "`ledger copy SRC DST` copies the whole ledger SRC (a SQLite file or a postgresql://USER@HOST:PORT/DB?ledger=NAME "
    "URL) to DST (either kind): its metadata, every row and run and, when SRC has one, its confidential part, as "
    "stored (byte for byte: nothing is re-charged or re-hashed, so the hashes and any signed checkpoint still "
    "hold). DST must not hold a ledger with rows or runs (it is refused and left unchanged). Both ends are then "
    "verified as `audit` does and their heads (row count, head hash, run count, run head hash) compared and "
    "printed. Exit status 0 when copied, both ends verify and the heads agree; 1 when DST is refused, the copy "
    "fails (a new DST is removed again) or a check fails; 2 for a usage error (SRC missing); 3 when SRC cannot be "
    "read as a ledger. No output shows a URL's password."
)
HEAD_KEYS = ("rows", "head_hash", "runs", "run_head_hash")


def add_arguments(p) -> None:
    """``copy SRC DST [--json]``."""
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    copy = actions.add_parser("copy", help="copy a whole ledger to a new location, then verify both ends",
                              description=DESCRIPTION)
    copy.add_argument("source", metavar="SRC", help="the ledger to copy: a SQLite file or a postgresql:// URL")
    copy.add_argument("destination", metavar="DST",
                      help="where to copy it: a new SQLite file or a postgresql:// URL naming an absent ledger")
    copy.add_argument("--json", action="store_true", help="print only a JSON result")
    copy.set_defaults(copy_parser=copy)


def _verified(location: str):
    """``(VerificationResult, head record)`` of the ledger at ``location``, opened read-only."""
    from pate_accountant.ledger import Ledger

    with Ledger.open(location, read_only=True) as ledger:
        return ledger.verify(), ledger.head_record


def main(args: argparse.Namespace) -> int:
    """Copy, verify both ends, compare heads; see DESCRIPTION for the exit status."""
    from pate_accountant.ledger import STORAGE_ERRORS, LedgerError, copy_ledger, is_ledger_url, shown_location

    src, dst = args.source, args.destination
    shown_src, shown_dst = shown_location(src), shown_location(dst)
    parser = getattr(args, "copy_parser", args.parser)
    if not is_ledger_url(src) and not os.path.isfile(src):
        parser.error(f"argument SRC: no ledger file at {src!r}")

    def say(text: str, *, err: bool = False) -> None:  # nothing printed shows a password of either URL
        print(scrub(text, src, dst), file=sys.stderr if err else sys.stdout)

    try:
        copied = copy_ledger(src, dst)
    except (LedgerError, *STORAGE_ERRORS, OSError, UnicodeDecodeError, ValueError) as exc:
        message = f"{type(exc).__name__}: {exc}"
        status = 1
        try:  # which end failed: SRC not readable as a ledger is "cannot check"
            from pate_accountant.ledger import Ledger

            with Ledger.open(src, read_only=True):
                pass
        except (LedgerError, *STORAGE_ERRORS, OSError, UnicodeDecodeError, ValueError):
            status = CANNOT_CHECK
        if args.json:
            say(json.dumps({"source": shown_src, "destination": shown_dst, "ok": False, "copied": False,
                            "message": message}, indent=2))
        say(f"pate-accountant ledger copy: not copied: {message}", err=True)
        return status
    ends = {}
    for end, location in (("source", src), ("destination", dst)):
        try:
            result, head = _verified(location)
            ends[end] = {"location": shown_location(location), "ok": result.ok, "message": result.message,
                         "confidential": result.confidential, **{k: head[k] for k in HEAD_KEYS}}
        except (LedgerError, *STORAGE_ERRORS, OSError, UnicodeDecodeError, ValueError) as exc:
            ends[end] = {"location": shown_location(location), "ok": False,
                         "message": f"{type(exc).__name__}: {exc}", "confidential": None,
                         **{k: None for k in HEAD_KEYS}}
    same = all(ends["source"][k] == ends["destination"][k] == copied[k] for k in HEAD_KEYS) and \
        ends["source"]["confidential"] == ends["destination"]["confidential"]
    ok = ends["source"]["ok"] and ends["destination"]["ok"] and same
    if args.json:
        say(json.dumps({"source": shown_src, "destination": shown_dst, "ok": ok, "copied": True,
                        "confidential_copied": copied["confidential"], "same_heads": same, "ends": ends}, indent=2))
    else:
        say(f"source      : {shown_src}")
        say(f"destination : {shown_dst}")
        say(f"copied      : {copied['rows']} rows, {copied['runs']} runs"
            + (", and the confidential part" if copied["confidential"] else ""))
        if not copied["confidential"] and ends["source"]["confidential"] in ("absent", "unusable"):
            say("confidential: NOT copied: the source's confidential part is missing or not readable (the copy "
                "holds the shareable part only)")
        for end in ("source", "destination"):
            e = ends[end]
            say(f"{end:<12}: {'OK' if e['ok'] else 'FAILED'}: {e['message']}")
            say(f"  rows {e['rows']}, head hash {e['head_hash']}")
            say(f"  runs {e['runs']}, run head hash {e['run_head_hash']}")
        say(f"heads       : {'identical' if same else 'DIFFER'}")
        say(f"verdict     : {'OK' if ok else 'FAILED'}")
    if not ok:
        say("pate-accountant ledger copy: copied, but " + ("the heads differ" if not same else
                                                           "an end does not verify"), err=True)
    return 0 if ok else 1
