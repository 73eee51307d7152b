"""``pate-accountant generate``: synthetic records generated privately from a Dolly-format file on a local
model, charged to the data set's ledger and audited (docs/demo.md)."""

from __future__ import annotations

import argparse
import os

from ensembles.data import load_dolly_jsonl
from mechanisms import registry as mechanisms_registry
from pate_accountant import registry as accountants_registry
from pate_app.commands.run_options import add_run_options, run_and_report
from pate_app.options import open_unit, positive_float, positive_int

NAME = "generate"
HELP = "generate synthetic records privately from a Dolly-format JSONL file on a local model"
DESCRIPTION = (
    "Partition the records of --data between --teachers in-context teachers of the local model "
    "--model, generate --records synthetic instructions privately, charge the data set's ledger --ledger "
    "(created, or appended to when it exists: a ledger keeps one data set's budget across runs) and "
    "audit it (docs/demo.md). --epsilon/--delta are the data set's total budget; --step-epsilon/"
    "--step-delta the mechanism's per-step parameters."
)


def add_arguments(p) -> None:
    """``--model``, ``--data``, the mechanism and accountant (from the registries), the budget, the ledger,
    and the run options shared with ``demo``."""
    p.add_argument("--model", metavar="PATH", required=True, help="local model folder, .gguf file, or folder with one")
    p.add_argument("--data", metavar="FILE", required=True,
                   help="Dolly-format JSON lines (records with a context are skipped)")
    p.add_argument("--mechanism", choices=mechanisms_registry.run_mechanism_names(), required=True,
                   help="per-step aggregation mechanism (mechanisms.registry)")
    p.add_argument("--accountant", choices=accountants_registry.run_accountant_names(), required=True,
                   help="privacy accountant (pate_accountant.registry)")
    p.add_argument("--epsilon", type=positive_float, required=True, help="total budget epsilon")
    p.add_argument("--delta", type=open_unit, required=True, help="total budget delta")
    p.add_argument("--ledger", metavar="FILE", required=True,
                   help="the data set's ledger: created if missing; an existing one must belong to the same data "
                        "set, accountant and budget, and the run is appended to it")
    p.add_argument("--dataset", metavar="NAME", default=None,
                   help="name of the data set the ledger belongs to (default: the --data file's name); it is "
                        "stored in the shareable ledger, so choose a name that reveals nothing private")
    add_run_options(p, demo=False)
    p.add_argument("--workers", metavar="N", type=positive_int, default=1,
                   help="split the teachers into N contiguous shards, each its own backend: in this process (one "
                        "model, shared), or one Ray actor each with --ray-address (default 1: no sharding; "
                        "docs/distributed.md)")
    p.add_argument("--ray-address", metavar="ADDRESS", default=None,
                   help="run the shards as Ray actors on the cluster at ADDRESS (HOST:PORT, ray://HOST:PORT or auto; "
                        "'local' starts a local cluster); needs the distributed extra")


def main(args: argparse.Namespace) -> int:
    """Run the generation; 0 when its ledger audits."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not os.path.exists(os.path.expanduser(args.model)):
        args.parser.error(f"argument --model: no model at {args.model!r} (model hubs are not used: give a local path)")
    try:
        records = load_dolly_jsonl(args.data)
    except (FileNotFoundError, ValueError) as exc:
        args.parser.error(f"argument --data: {exc}")
    dataset = args.dataset if args.dataset is not None else os.path.basename(args.data)
    return run_and_report(args, command="generate", model=args.model, records=records, ledger=args.ledger,
                          model_label=args.model, data_label=os.path.basename(args.data), dataset=dataset)
