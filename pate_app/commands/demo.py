"""``pate-accountant demo``: a few synthetic records generated privately from the bundled sample on the
embedded model, with an audited ledger (docs/demo.md)."""

from __future__ import annotations

import argparse
import os

from pate_app.commands.run_options import (
    add_budget_options,
    add_run_options,
    run_and_report,
    spec_from_args,
)
from pate_app.defaults import DEMO_DEFAULTS

_D = DEMO_DEFAULTS
NAME = "demo"
HELP = "generate a few synthetic records privately from the bundled sample on the embedded model"
DESCRIPTION = (
    "Generate a few synthetic instructions privately (Hot PATE) from the bundled Dolly-format sample "
    "on the embedded SmolLM2-135M-Instruct model, charge the sample's ledger and audit it (docs/demo.md); "
    "`generate --data bundled` is the same run with every option open. "
    f"Defaults: {_D['teachers']} teachers, DPArgMax(epsilon {_D['step_epsilon']:g}, delta {_D['step_delta']:g}, "
    f"{_D['relation']}) per step, basic composition with budget (epsilon {_D['epsilon']:g}, delta {_D['delta']:g})."
)


def add_arguments(p) -> None:
    """``--ledger``, ``--dataset``, the budget, and the run options shared with ``generate``."""
    p.add_argument("--ledger", metavar="PATH", default=None,
                   help="the bundled sample's ledger (default: the one the ledger home keeps for the sample, found "
                        "by its fingerprint, so demos run from any folder share one budget; docs/ledger.md)")
    p.add_argument("--dataset", metavar="NAME", default="bundled-sample",
                   help="name of the data set the ledger belongs to (default bundled-sample)")
    add_budget_options(p, default=True)
    add_run_options(p)


def main(args: argparse.Namespace) -> int:
    """Run the demo; 0 when its ledger audits."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_and_report(args, spec_from_args(args, data="bundled", model="embedded"), command="demo")
