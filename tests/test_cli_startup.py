"""The command line starts fast: ``pate-accountant --help`` lists the commands from the table without importing
any of them, numpy, scipy or dp-accounting; a command's parser imports that command alone.  The figures are
measured by ``benchmarks/bench_cli_startup.py`` (docs/performance.md, "Command-line start-up")."""

import subprocess
import sys

import pytest

import pate_app
from pate_app.cli import build_parser, load_command

HEAVY = ("numpy", "scipy", "dp_accounting", "torch", "matplotlib")


def _modules_after(argv: list) -> set:
    """The modules a fresh interpreter has imported after ``pate_accountant.cli.main(argv)``."""
    probe = ("import sys\nfrom pate_accountant.cli import main\n"
             f"code = main({argv!r})\nprint(code, ' '.join(sorted(sys.modules)))")
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    code, modules = completed.stdout.strip().splitlines()[-1].split(" ", 1)
    assert code == "0", completed.stderr
    return set(modules.split())


def test_top_level_help_imports_no_command_and_no_heavy_library():
    modules = _modules_after(["--help"])
    assert not {m.split(".")[0] for m in modules} & set(HEAVY)
    assert not [m for m in modules if m.startswith("pate_app.commands.")]


def test_a_commands_help_imports_that_command_alone():
    modules = _modules_after(["audit", "--help"])
    assert [m for m in modules if m.startswith("pate_app.commands.")] == ["pate_app.commands.audit"]


def test_the_tables_help_lines_are_the_commands_own():
    for name in pate_app.COMMANDS:
        assert pate_app.COMMAND_HELP[name] == load_command(name).HELP
    assert list(pate_app.COMMAND_HELP) == list(pate_app.COMMANDS)
    # build_parser(only=...) builds that command in full and lists the others.
    commands = next(a for a in build_parser("plan")._actions if a.dest == "command").choices
    assert list(commands) == list(pate_app.COMMANDS)
    assert commands["plan"]._actions[1:] and not commands["audit"]._actions[1:]


#: Every parser of the command line (command, plan subcommand, experiment), with ``--help`` and with an
#: argument error: none may import dp-accounting, scipy, torch, transformers, ray or matplotlib (numpy, about
#: 0.1 s, is allowed: the option types check ranges with the library's validation helpers).
SLOW = ("scipy", "dp_accounting", "torch", "transformers", "ray", "matplotlib")
PARSERS = ([[name] for name in pate_app.COMMANDS if name not in ("plan", "experiment")]
           + [["plan", sub] for sub in ("hits", "yields", "for-tokens", "compare", "margin", "figures")]
           + [["experiment", name] for name in pate_app.EXPERIMENTS])


def _modules_after_any(argv: list) -> tuple:
    probe = ("import sys\nfrom pate_accountant.cli import main\n"
             f"code = main({argv!r})\nprint(code, ' '.join(sorted(sys.modules)))")
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    code, modules = completed.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(code), {m.split(".")[0] for m in modules.split()}


@pytest.mark.parametrize("words", PARSERS, ids=" ".join)
def test_help_and_argument_errors_import_nothing_slow(words):
    code, roots = _modules_after_any([*words, "--help"])
    assert code == 0 and not roots & set(SLOW), sorted(roots & set(SLOW))
    code, roots = _modules_after_any([*words, "--no-such-option"])
    assert code == 2 and not roots & set(SLOW), sorted(roots & set(SLOW))
