"""The command line starts fast: ``pate-accountant --help`` lists the commands from the table without importing
any of them, numpy, scipy or dp-accounting; a command's parser imports that command alone.  The figures are
measured by ``benchmarks/bench_cli_startup.py`` (docs/performance.md, "Command-line start-up")."""

import subprocess
import sys

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
