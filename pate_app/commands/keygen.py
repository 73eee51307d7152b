"""``pate-accountant keygen KEY``: a new Ed25519 key pair for signed ledger checkpoints (docs/ledger.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "keygen"
HELP = "make an Ed25519 key pair for signing ledger checkpoints"
DESCRIPTION = (
    "Write a new Ed25519 private key to KEY (PEM, readable by its owner only) and its public key to KEY.pub "
    "(or --public-key). A run given --signing-key KEY, or `pate-accountant sign`, appends a signed checkpoint of "
    "the ledger's head; an auditor holding the public key checks the ledger against every checkpoint with "
    "`audit --public-key`. Whoever holds the private key can sign any history: keep it away from the machine "
    "that writes the ledger if you can (docs/ledger.md). Needs the signing extra (the cryptography package). "
    "Existing files are never overwritten, KEY and --public-key must be two files, and a failure leaves neither "
    "file behind (exit status 2, one line naming the file)."
)


def add_arguments(p) -> None:
    """``KEY``, ``--public-key FILE``."""
    p.add_argument("key", metavar="KEY", help="the private key file to create")
    p.add_argument("--public-key", metavar="FILE", default=None, help="the public key file (default KEY.pub)")


def _git_work_tree(path) -> Path | None:
    """The git working tree holding ``path`` (the nearest folder above it with a ``.git``), or ``None``."""
    folder = Path(path).resolve().parent
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def main(args: argparse.Namespace) -> int:
    """Make the key pair; 0 on success, 2 when a file exists or the library is missing."""
    from pate_accountant.checkpoints import (
        CheckpointError,
        generate_key,
        key_id,
        load_public_key,
    )

    try:
        private, public = generate_key(args.key, args.public_key)
    except CheckpointError as exc:
        args.parser.error(str(exc))
    print(f"private key : {private} (mode 0600: keep it secret; it signs checkpoints)")
    repository = _git_work_tree(private)
    if repository is not None:
        print(f"pate-accountant keygen: warning: the private key {str(private)!r} is inside the git working tree "
              f"{str(repository)!r}, where `git add .` would commit it: move it out (e.g. to "
              "~/.config/pate-accountant/), or make sure the repository ignores it", file=sys.stderr)
    print(f"public key  : {public} (give it to auditors: `pate-accountant audit LEDGER --public-key {public}`)")
    print(f"key id      : {key_id(load_public_key(public))}")
    return 0
