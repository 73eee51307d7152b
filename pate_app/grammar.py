"""The command line's one grammar (docs/cli.md, "One grammar"): its parser class and options with deprecated
spellings.  Standard library only, so that ``pate-accountant --help`` stays fast."""

from __future__ import annotations

import argparse
import sys

__all__ = ["Parser", "add_option"]


class Parser(argparse.ArgumentParser):
    """The command line's parser (every subparser is one too): before parsing, an option's deprecated
    spellings (:func:`add_option`) are rewritten to its name, with a one-line warning on stderr each."""

    def parse_known_args(self, args=None, namespace=None):
        spellings = {old: action.option_strings[0] for action in self._actions
                     for old in getattr(action, "deprecated_spellings", ())}
        if spellings and args is not None:
            args = list(args)
            for i, word in enumerate(args):
                if word == "--":
                    break
                old, eq, value = word.partition("=")
                if old in spellings:
                    print(f"pate-accountant: warning: {old} is a deprecated spelling of {spellings[old]} "
                          "and will be removed in the next release", file=sys.stderr)
                    args[i] = spellings[old] + eq + value
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """A usage error is one line naming the option and the value, then where to read more (exit status 2):
        argparse's whole usage block buried that line.  A missing or unknown command still gets the usage, which
        is then the useful part."""
        if "invalid choice" in message or "COMMAND" in message or "EXPERIMENT" in message:  # which command
            self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` for the options)\n")


def add_option(parser, name: str, *deprecated: str, **kwargs):
    """``parser.add_argument(name, **kwargs)`` that also accepts the ``deprecated`` spellings for one release
    (docs/cli.md, "One grammar"): a :class:`Parser` rewrites them to ``name`` with a warning on stderr.  Only
    ``name`` is shown in usage, ``--help`` and messages."""
    if deprecated:
        help_text = kwargs.get("help")
        if help_text is not None and help_text is not argparse.SUPPRESS:
            kwargs["help"] = f"{help_text} (formerly {', '.join(deprecated)})"
    action = parser.add_argument(name, **kwargs)
    action.deprecated_spellings = tuple(deprecated)
    return action
