"""``pate-accountant demo``: a few synthetic records generated privately from the bundled sample on the
embedded model, with an audited ledger (docs/demo.md)."""

from __future__ import annotations

import argparse
import os

from pate_app.commands.run_options import (
    DEMO_DEFAULTS,
    add_budget_options,
    add_run_options,
    run_and_report,
)

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
    from ensembles.data import bundled_sample
    from pate_app.run import demo_model_path

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ledger = args.ledger  # None: the sample's ledger in the ledger home
    try:
        model = demo_model_path(announce=not (args.json or args.no_progress))
    except ValueError as exc:
        args.parser.error(str(exc))
    except OSError as exc:  # a cache folder that cannot be written (a read-only home)
        args.parser.error(f"cannot convert the embedded model into its cache folder: {exc.strerror or exc} "
                          f"({exc.filename or ''}; set PATE_ACCOUNTANT_CACHE to a writable folder)")
    return run_and_report(args, command="demo", model=model, records=bundled_sample(), ledger=ledger,
                          model_label="SmolLM2-135M-Instruct (embedded)", data_label="bundled sample",
                          dataset=args.dataset, public_records=True)
