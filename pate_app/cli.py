"""The ``pate-accountant`` command line, built from the application's one table (:data:`pate_app.COMMANDS`).

:func:`pate_accountant.cli.main` (the installed entry point, also ``python -m pate_accountant``) calls
:func:`main` here.  Every command module follows the protocol of :mod:`pate_app`; its ``main(args)``
returns the exit status.  :func:`main` returns it too instead of raising ``SystemExit``: 0 on success, 2
for a usage error (argparse prints the message, which names the option, to stderr), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pate_accountant import __version__
from pate_app import COMMAND_HELP, COMMANDS, load_module
from pate_app.grammar import Parser
from pate_app.library_output import library_warnings

__all__ = ["build_parser", "load_command", "main"]

_REQUIRED = ("NAME", "HELP", "DESCRIPTION", "add_arguments", "main")


def load_command(name: str):
    """The command module ``name`` (a key of :data:`pate_app.COMMANDS`), checked for the protocol."""
    return load_module("command", COMMANDS, name, _REQUIRED)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``pate-accountant`` parser: one subparser per command of the table, in its order.

    ``only`` (what :func:`main` passes: the command word of ``argv``, or ``""`` when there is none) imports and
    builds that command alone; the others are listed with their one-line help from the table, so that
    ``pate-accountant --help`` and a command's own ``--help`` or argument errors import no other command
    (and none of the libraries behind it).  ``None``: every command, in full."""
    parser = Parser(
        prog="pate-accountant",
        description="Hot PATE: coordinated teacher ensembles, DP aggregation and privacy accounting.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is not None and name != only:
            commands.add_parser(name, help=COMMAND_HELP[name])
            continue
        module = load_command(name)
        p = commands.add_parser(module.NAME, help=COMMAND_HELP[name], description=module.DESCRIPTION)
        p.set_defaults(handler=module.main, parser=p)
        module.add_arguments(p)
    return parser


def _command_word(argv: list) -> str:
    """The command ``argv`` names (its first word that is not an option), or ``""``."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with library_warnings():  # what importing a command's libraries warns goes to the log
            parser = build_parser(_command_word(argv))
            args = parser.parse_args(argv)
        with library_warnings(getattr(args, "verbose", False)):  # docs/cli.md, "Quiet runs"
            return int(args.handler(args))
    except SystemExit as exc:  # argparse usage errors (2), --help / --version (0)
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pate-accountant: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader closed stdout (e.g. "| head"): point stdout at devnull so the flush at exit is quiet.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
