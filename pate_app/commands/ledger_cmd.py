"""``pate-accountant ledger copy SRC DST``: copy a whole ledger between SQLite and PostgreSQL; ``pate-accountant
ledger list [URL]``: the data sets an installation or a database keeps budgets for (docs/ledger.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pate_app.commands.audit import CANNOT_CHECK, reason, scrub

NAME = "ledger"
HELP = "list the data sets' ledgers, or copy a ledger between SQLite and PostgreSQL"
DESCRIPTION = (
    "`ledger copy SRC DST` copies the whole ledger SRC (a SQLite file or a postgresql://USER@HOST:PORT/DB?ledger=NAME "
    "URL) to DST (either kind): its metadata, every row and run and, when SRC has one, its confidential part, as "
    "stored (byte for byte: nothing is re-charged or re-hashed, so the hashes and any signed checkpoint still "
    "hold). DST must not hold a ledger with rows or runs (it is refused and left unchanged). Both ends are then "
    "verified as `audit` does and their heads (row count, head hash, run count, run head hash) compared and "
    "printed. When they do, the data sets this installation's index charges to SRC are charged to DST from then on "
    "(the copy continues the same budget; a run naming SRC for them is refused). Exit status 0 when copied, both "
    "ends verify and the heads agree; 1 when DST is refused, the copy "
    "fails (a new DST is removed again) or a check fails; 2 for a usage error (SRC missing); 3 when SRC cannot be "
    "read as a ledger. No output shows a URL's password."
)
LIST_DESCRIPTION = (
    "`ledger list` prints the data sets whose budgets this installation keeps (its ledger home's index: "
    "$PATE_ACCOUNTANT_HOME), `ledger list postgresql://USER@HOST:PORT/DB` those a database keeps (its data-set "
    "index, shared by every host): for each, its ledger, the data set's name, when it was registered, and what the "
    "ledger holds (rows, runs, accountant and budget, read-only: `pate-accountant audit LEDGER` verifies it and "
    "says what is spent). Nothing is created or written. Exit status 0; 3 when the index cannot be read. No output "
    "shows a URL's password, nor a data set's fingerprint."
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
    listing = actions.add_parser("list", help="the data sets whose budgets an installation or a database keeps",
                                 description=LIST_DESCRIPTION)
    listing.add_argument("where", metavar="URL", nargs="?", default=None,
                         help="a postgresql://USER@HOST:PORT/DB database (default: this installation's ledger home)")
    listing.add_argument("--json", action="store_true", help="print only a JSON result")
    listing.set_defaults(list_parser=listing)


def _described(location) -> dict:
    """What the ledger at ``location`` holds, read-only and unverified: rows, runs, accountant kind and budget."""
    from pate_accountant.ledger import Ledger

    with Ledger.open(location if isinstance(location, str) else os.fspath(location), read_only=True) as ledger:
        head, config = ledger.head_record, ledger.config or {}
        budget, kind, spent = config.get("budget"), config.get("kind"), ledger.stored_spent
        return {"rows": head["rows"], "runs": head["runs"], "accountant": kind,
                "budget": None if budget is None else {"epsilon": budget[0], "delta": budget[1]},
                "spent": None if spent is None else {"epsilon": spent[0], "delta": spent[1]},
                "remaining": _remaining(kind, spent, budget)}


def _remaining(kind, spent, budget) -> dict | None:
    """What the budget has left (:func:`pate_accountant.accountants.remaining_of`, what ``generate`` and ``audit``
    print), or ``None`` when the ledger has no budget, keeps its spend confidential or names an unknown kind."""
    from pate_accountant.accountants import remaining_of

    if budget is None or spent is None or kind is None:
        return None
    try:
        return remaining_of(kind, spent, budget).as_dict()
    except (KeyError, ValueError):
        return None


def _list(args: argparse.Namespace) -> int:
    """``ledger list [URL]``: the index's registrations, each with what its ledger holds."""
    import datetime

    from pate_accountant.errors import PateAccountantError
    from pate_accountant.ledger import STORAGE_ERRORS, LedgerError, is_ledger_url, shown_location
    from pate_accountant.ledger_home import DatabaseIndex, LedgerHome, with_ledger_name

    where = args.where
    if where is not None and not is_ledger_url(where):
        getattr(args, "list_parser", args.parser).error(f"argument URL: not a postgresql:// URL: {shown_location(where)!r} (leave it out for "
                          "this installation's ledger home)")
    try:
        if where is None:
            home = LedgerHome()
            index_name, entries = str(home.index_path), home.entries()
            locations = [entry["ledger"] for entry in entries]
        else:
            index = DatabaseIndex(where)
            try:
                index_name, entries = index.location, index.entries()
            finally:
                index.close()
            locations = [with_ledger_name(where, entry["ledger"]) for entry in entries]
    except (PateAccountantError, *STORAGE_ERRORS, OSError) as exc:
        print(scrub(f"pate-accountant ledger list: cannot read the index: {exc}", where or ""), file=sys.stderr)
        return CANNOT_CHECK
    listed = []
    for entry, location in zip(entries, locations):
        item = {"ledger": shown_location(location) if where is None else entry["ledger"],
                "location": shown_location(location), "dataset": entry["dataset"],
                "registered": datetime.datetime.fromtimestamp(entry["registered"], datetime.timezone.utc)
                .strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            item.update(_described(location), readable=True, problem=None)
        except FileNotFoundError:
            item.update(readable=False, problem="no ledger there (removed, or its run was refused before a charge)")
        except (LedgerError, *STORAGE_ERRORS, OSError, ValueError) as exc:
            item.update(readable=False, problem=reason(exc))
        listed.append(item)
    if args.json:
        print(scrub(json.dumps({"index": index_name, "ledgers": listed}, indent=2), where or ""))
        return 0
    print(scrub(f"index       : {index_name} ({len(listed)} data set{'s' if len(listed) != 1 else ''})", where or ""))
    for item in listed:
        print(scrub(f"{item['ledger']}", where or ""))
        print(f"  data set  : {item['dataset']!r}, registered {item['registered']}")
        if item["readable"]:
            budget = item["budget"]
            kept = "" if budget is None else f", budget epsilon {budget['epsilon']:g}, delta {budget['delta']:g}"
            print(f"  holds     : {item['rows']} rows, {item['runs']} runs; {item['accountant'] or 'no'} accountant"
                  f"{kept}")
            if item["remaining"] is not None:
                print(f"  remaining : {item['remaining']['text']} (as stored; `pate-accountant audit` verifies it)")
        else:
            print(scrub(f"  holds     : not readable: {item['problem']}", where or ""))
    return 0


def _verified(location: str):
    """``(VerificationResult, head record)`` of the ledger at ``location``, opened read-only."""
    from pate_accountant.ledger import Ledger

    with Ledger.open(location, read_only=True) as ledger:
        return ledger.verify(), ledger.head_record


def main(args: argparse.Namespace) -> int:
    """``list``, or: copy, verify both ends, compare heads; see DESCRIPTION for the exit status."""
    if args.action == "list":
        return _list(args)
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
        message = reason(exc)
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
                         "message": reason(exc), "confidential": None,
                         **{k: None for k in HEAD_KEYS}}
    same = all(ends["source"][k] == ends["destination"][k] == copied[k] for k in HEAD_KEYS) and \
        ends["source"]["confidential"] == ends["destination"]["confidential"]
    ok = ends["source"]["ok"] and ends["destination"]["ok"] and same
    reindexed, index_error = 0, None
    if ok:  # the records' next runs charge the copy, which continues the same budget (docs/ledger.md)
        from pate_accountant.errors import PateAccountantError
        from pate_accountant.ledger_home import LedgerHome, ledger_identity

        try:
            reindexed = LedgerHome().moved(ledger_identity(src), ledger_identity(dst),
                                           reach=shown_location(dst) if is_ledger_url(dst) else None)
        except (PateAccountantError, *STORAGE_ERRORS, OSError) as exc:
            index_error = reason(exc)
    if args.json:
        say(json.dumps({"source": shown_src, "destination": shown_dst, "ok": ok, "copied": True,
                        "confidential_copied": copied["confidential"], "same_heads": same, "ends": ends,
                        "reindexed": reindexed, "index_error": index_error}, indent=2))
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
        if reindexed:
            say(f"index       : {reindexed} data set(s) this installation charged to the source now charge the "
                "destination (a run naming the source for them is refused)")
        if index_error is not None:
            say(f"index       : NOT updated ({index_error}): runs on this installation still charge the source")
        say(f"verdict     : {'OK' if ok else 'FAILED'}")
    if not ok:
        say("pate-accountant ledger copy: copied, but " + ("the heads differ" if not same else
                                                           "an end does not verify"), err=True)
    return 0 if ok else 1
