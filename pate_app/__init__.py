"""The application wing of pate-accountant: the ``pate-accountant`` commands, private runs, the paper's
experiments and their figures, built on the three library layers (``pate_accountant`` <- ``mechanisms`` <-
``ensembles``) and never imported by them.  The library's command-line entry point,
:func:`pate_accountant.cli.main`, is a thin dispatcher whose one lazy import is :func:`pate_app.cli.main`.

One command protocol (docs/cli.md, "Adding a command"): every command and every experiment is a module
named in the one table below, with

* ``NAME`` (the word that invokes it), ``HELP`` (one line) and ``DESCRIPTION`` (a paragraph); a command's
  one-line help is also in the table (:data:`COMMAND_HELP`), so that ``pate-accountant --help`` lists the
  commands without importing any of them;
* ``add_arguments(parser)``: its own options (an ``argparse`` parser or argument group);
* a command adds ``main(args) -> int`` (the exit status); an experiment adds instead
  ``SIZES``/``FULL_RUNTIME`` and ``run``/``plot``/``summary`` (:mod:`pate_app.experiments`), and the
  ``experiment`` command gives every experiment the same options (``--quick --plot --out --seed --json
  --no-progress``) and the same way of writing its results.
"""

import importlib

#: The one table: each command and each experiment, by the words that invoke it, and its module.
COMMANDS = {
    "demo": "pate_app.commands.demo",
    "generate": "pate_app.commands.generate",
    "plan": "pate_app.commands.plan",
    "audit": "pate_app.commands.audit",
    "sign": "pate_app.commands.sign",
    "keygen": "pate_app.commands.keygen",
    "ledger": "pate_app.commands.ledger_cmd",
    "audit-mechanism": "pate_app.commands.audit_mechanism",
    "experiment": "pate_app.commands.experiment",
}
#: Each command's one-line help (its module's ``HELP``; a test keeps the two equal).
COMMAND_HELP = {
    "demo": "generate a few synthetic records privately from the bundled sample on the embedded model",
    "generate": "generate synthetic records privately from your records (JSON lines, JSON or CSV) on a local model",
    "plan": "answer budget questions before a run (target hits, yields, teachers, accounting, margin)",
    "audit": "verify a privacy ledger and print the budget it spent",
    "sign": "verify a ledger and append a signed checkpoint of its head",
    "keygen": "make an Ed25519 key pair for signing ledger checkpoints",
    "ledger": "list the data sets' ledgers, or copy a ledger between SQLite and PostgreSQL",
    "audit-mechanism": "empirically lower-bound a mechanism's epsilon on a worst-case neighbouring pair",
    "experiment": "run a reproducible experiment from the paper",
}
EXPERIMENTS = {
    "histograms": "pate_app.experiments.histograms",
    "alpha-sweep": "pate_app.experiments.alpha_sweep",
    "tct-budget": "pate_app.experiments.tct_budget",
    "planet-z": "pate_app.experiments.planet_z",
    "instructions": "pate_app.experiments.instructions",
    "end-to-end": "pate_app.experiments.end_to_end",
    "tokens-per-epsilon": "pate_app.experiments.tokens_per_epsilon",
    "utility": "pate_app.experiments.utility",
}

__all__ = ["COMMANDS", "COMMAND_HELP", "EXPERIMENTS", "RunSpec", "load_module", "synthesize"]


def __getattr__(name: str):
    """``pate_app.RunSpec`` (:mod:`pate_app.spec`) and ``pate_app.synthesize`` (:mod:`pate_app.run`), imported when
    first used, so that the command line's ``--help`` stays fast."""
    if name == "RunSpec":
        from pate_app import spec

        return spec.RunSpec
    if name == "synthesize":
        from pate_app import run

        return run.synthesize
    raise AttributeError(f"module 'pate_app' has no attribute {name!r}")


def load_module(kind: str, table: dict, name: str, required: tuple):
    """The module of ``table[name]`` (``kind``: ``"command"`` or ``"experiment"``, for messages), imported and
    checked to define every name in ``required`` (the protocol above)."""
    if name not in table:
        raise ValueError(f"{kind} must be one of {sorted(table)}, got {name!r}")
    module = importlib.import_module(table[name])
    missing = [attr for attr in required if not hasattr(module, attr)]
    if missing:
        raise RuntimeError(f"{kind} module {module.__name__} lacks {', '.join(missing)}")
    return module
