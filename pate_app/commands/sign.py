"""``pate-accountant sign LEDGER --key KEY``: append a signed checkpoint of a ledger's head (docs/ledger.md)."""

from __future__ import annotations

import argparse
import json
import sys

from pate_app.commands.audit import CANNOT_CHECK, check_ledger_arguments, reason, scrub

NAME = "sign"
HELP = "verify a ledger and append a signed checkpoint of its head"
DESCRIPTION = (
    "Verify the ledger LEDGER (read-only, as `audit` does) and, when it verifies, sign its head (ledger id, data "
    "set, accountant and budget, row and run counts with their last hashes) with the Ed25519 private key KEY, "
    "appending the checkpoint to LEDGER.checkpoints.jsonl (or --checkpoints). `audit --public-key` later checks "
    "that the ledger still extends every checkpoint. A run can do the same at its end with --signing-key. The "
    "checkpoint holds only what the shareable ledger holds, so it may be published. Exit status 0 when signed; "
    "1 when the ledger does not verify (nothing is signed); 2 for a usage error (a missing --confidential file "
    "included), an unusable key or a checkpoints file that cannot be appended to; 3 when the file cannot be "
    "checked (not a ledger: an empty file included). LEDGER may be a postgresql:// URL (docs/ledger.md, "
    "\"PostgreSQL\"): --checkpoints is then required, and no output shows its password."
)


def add_arguments(p) -> None:
    """``LEDGER``, ``--key``, ``--checkpoints``, ``--confidential``, ``--json``."""
    p.add_argument("path", metavar="LEDGER", help="the ledger file (SQLite), or a postgresql:// ledger URL (then "
                                                 "--checkpoints is required)")
    p.add_argument("--key", metavar="KEY", required=True,
                   help="the Ed25519 private key (PEM; `pate-accountant keygen` makes one) (required)")
    p.add_argument("--checkpoints", metavar="FILE", default=None,
                   help="the checkpoints file to append to (default LEDGER.checkpoints.jsonl)")
    p.add_argument("--confidential", metavar="FILE", default=None,
                   help="the confidential file, for the verification (default LEDGER.confidential.sqlite, when it "
                        "exists)")
    p.add_argument("--json", action="store_true", help="print only the checkpoint (JSON)")


def main(args: argparse.Namespace) -> int:
    """Verify, sign and append; see DESCRIPTION for the exit status."""
    from pate_accountant.checkpoints import (
        CheckpointError,
        append_checkpoint,
        checkpoints_file,
        load_private_key,
        sign_checkpoint,
    )
    from pate_accountant.ledger import STORAGE_ERRORS, Ledger, LedgerError, shown_location

    location = shown_location(args.path)
    check_ledger_arguments(args, "LEDGER", checkpoints_needed=True)  # as `audit` refuses them
    try:
        checkpoints = checkpoints_file(args.path, args.checkpoints)
    except CheckpointError as exc:
        args.parser.error(f"argument --checkpoints: {exc}")
    try:
        key = load_private_key(args.key)
    except CheckpointError as exc:
        args.parser.error(f"argument --key: {exc}")
    try:
        with Ledger.open(args.path, read_only=True, confidential=args.confidential) as ledger:
            verification = ledger.verify()
            if not verification.ok:
                print(f"pate-accountant sign: {location!r} does not verify, so it is not signed: "
                      f"{scrub(verification.message, args.path)}", file=sys.stderr)
                return 1
            checkpoint = sign_checkpoint(ledger, key, verification=verification)
    except CheckpointError as exc:  # the ledger grew (another process) between the check and the signature
        print(f"pate-accountant sign: not signed: {scrub(exc, args.path)}", file=sys.stderr)
        return 1
    except (LedgerError, *STORAGE_ERRORS, OSError, ValueError) as exc:
        print(f"pate-accountant sign: cannot check {location!r}: {scrub(reason(exc), args.path)}",
              file=sys.stderr)
        return CANNOT_CHECK
    try:
        append_checkpoint(checkpoints, checkpoint)
    except CheckpointError as exc:  # replaced by a FIFO or a device, a full disk, ... since the check above
        print(f"pate-accountant sign: argument --checkpoints: not signed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(checkpoint, indent=2, sort_keys=True))
        return 0
    print(f"ledger      : {location} ({checkpoint['rows']} rows, {checkpoint['runs']} runs)")
    print(f"head hash   : {checkpoint['head_hash']}")
    print(f"signed by   : key {checkpoint['key_id']}")
    print(f"appended to : {checkpoints}")
    return 0
