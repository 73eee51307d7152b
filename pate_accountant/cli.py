"""The ``pate-accountant`` command line (also ``python -m pate_accountant``); see docs/cli.md.

A thin dispatcher: the commands, runs and experiments live in the application wing (:mod:`pate_app`), above
the library layers, and :func:`main` is the library's single door into it, imported only when called.
``main(argv)`` returns the exit status instead of raising ``SystemExit``: 0 on success, 2 for a usage
error (argparse prints the message, which names the option, to stderr), 130 on Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    from pate_app.cli import main as application  # the one door upward: pate_accountant never imports pate_app

    return application(argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
