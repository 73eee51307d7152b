"""``pate-accountant generate``: synthetic records generated privately from your records (JSON lines, JSON or CSV) on a local
model (the embedded SmolLM2 by default), charged to the data set's ledger and audited (docs/demo.md)."""

from __future__ import annotations

import argparse
import os

from mechanisms import registry as mechanisms_registry
from pate_accountant import registry as accountants_registry
from pate_app.commands.run_options import (
    add_budget_options,
    add_defaulted,
    add_run_options,
    require,
    run_and_report,
    spec_from_args,
)
from pate_app.options import DEFAULT_RAY_TIMEOUT, positive_float, positive_int
from pate_app.spec import EMBEDDED_LABEL, LONG_RECORDS, model_label  # noqa: F401  (the model's names, kept here)

NAME = "generate"
HELP = "generate synthetic records privately from your records (JSON lines, JSON or CSV) on a local model"
DESCRIPTION = (
    "Partition the records of --data between --teachers in-context teachers of the model --model (the "
    "embedded SmolLM2 unless a local path is given), prompted by --template, generate --records synthetic "
    "records of the same kind privately (per label with --label-field/--labels), "
    "charge the data set's ledger (--ledger, or the one the ledger home keeps for these records; created, or "
    "appended to when it exists: a ledger keeps one data set's budget across runs) and audit it (docs/demo.md). --budget-epsilon/--budget-delta are the data set's "
    "total budget; --step-epsilon/--step-delta the mechanism's parameters for one step. `plan` prints the "
    "generate command that runs a plan (docs/tutorial.md)."
)
#: ``--model embedded`` (the default) and ``--data bundled`` name what ships with the package.
EMBEDDED, BUNDLED = "embedded", "bundled"


def add_arguments(p) -> None:
    """``--model``, ``--data``, the mechanism and accountant (from the registries), the budget, the ledger,
    and the run options shared with ``demo``."""
    p.add_argument("--data", metavar="FILE", default=None,
                   help=f"your records: JSON lines, JSON or CSV (by the suffix), the text in --text-field; Dolly-"
                        f"format records are still understood; or '{BUNDLED}' for the invented Dolly sample shipped "
                        "with the package (required, here or in --config; docs/data.md)")
    p.add_argument("--text-field", metavar="NAME", default="text",
                   help="the field (CSV: column) holding each record's text (default text)")
    p.add_argument("--label-field", metavar="NAME", default=None,
                   help="the field holding each record's label: label-conditional generation, one group of "
                        "teachers per label of --labels (docs/groups.md)")
    p.add_argument("--labels", metavar="A,B,...", default=None,
                   help="the labels to generate for, comma-separated (needed with --label-field: the labels are "
                        "part of the task and public, while the ones found in the data are not)")
    p.add_argument("--labels-public", action="store_true",
                   help="declare the records' labels public: the privacy unit becomes one record replaced within its "
                        "label (recorded in the ledger, shown by audit), and each label group pays alone; by default "
                        "a label is private and a replaced record may move between two label groups, so both pay "
                        "(docs/privacy_unit.md)")
    p.add_argument("--per-label", metavar="K", type=positive_int, default=None,
                   help="with --labels: generate K records of each label (instead of --records in turn)")
    p.add_argument("--long-records", choices=LONG_RECORDS, default="refuse",
                   help="a record too long for its share of the model's window (the window less the template and "
                        "--max-tokens, over the records one teacher holds): refuse the run, truncate the record, or "
                        "skip it; counted on stderr, never shown (default refuse; docs/data.md)")
    p.add_argument("--template", metavar="NAME|FILE", default=None,
                   help="the prompt template: 'instructions' (write a new instruction; the default for Dolly "
                        "records), 'records' (write a new record of the same kind; the default otherwise), or a "
                        "template file (TOML with header, example, open_slot and optional stop; docs/data.md)")
    p.add_argument("--ledger", metavar="FILE|URL", default=None,
                   help="the data set's ledger: created if missing; an existing one must belong to the same data "
                        "set, accountant and budget, and the run is appended to it (default: the ledger the ledger "
                        "home keeps for these records, found by their fingerprint; a FILE other than that one is "
                        "refused). A postgresql://USER@HOST:PORT/DB URL keeps the budget in that database, shared by "
                        "every host: its data-set index finds these records' ledger (give ?ledger=NAME to name it; "
                        "another name than the registered one is refused); the password comes from the URL, PG* "
                        "variables or ~/.pgpass and is never shown (docs/ledger.md, \"PostgreSQL\")")
    add_budget_options(p, default=False)
    p.add_argument("--model", metavar="PATH", default=EMBEDDED,
                   help=f"local model folder, .gguf file, or folder with one; '{EMBEDDED}' is the SmolLM2-135M-"
                        f"Instruct model shipped with the package (default {EMBEDDED}; model hubs are not used)")
    add_defaulted(p, "--mechanism", "per-step aggregation mechanism, by its name in mechanisms.registry",
                  choices=mechanisms_registry.run_mechanism_names())
    add_defaulted(p, "--accountant", "privacy accountant, by its name in pate_accountant.registry",
                  choices=accountants_registry.run_accountant_names())
    p.add_argument("--dataset", metavar="NAME", default=None,
                   help="name of the data set the ledger belongs to (default: the --data file's name, or "
                        "bundled-sample); it is stored in the shareable ledger, so choose a name that reveals "
                        "nothing private")
    add_run_options(p)
    p.add_argument("--workers", metavar="N", type=positive_int, default=1,
                   help="split the teachers into N contiguous shards, each its own backend: in this process (one "
                        "model, shared), or one Ray actor each with --ray-address (default 1: no sharding; "
                        "docs/distributed.md)")
    p.add_argument("--ray-address", metavar="ADDRESS", default=None,
                   help="run the shards as Ray actors on the cluster at ADDRESS (HOST:PORT, ray://HOST:PORT or auto; "
                        "'local' starts a local cluster); needs the distributed extra")
    p.add_argument("--ray-timeout", metavar="SECONDS", type=positive_float, default=DEFAULT_RAY_TIMEOUT,
                   help="seconds a HOST:PORT or ray://HOST:PORT --ray-address has to accept a connection, checked "
                        f"before the ledger is claimed (default {DEFAULT_RAY_TIMEOUT:g}; at most 600)")


def main(args: argparse.Namespace) -> int:
    """Run the generation; 0 when its ledger audits."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require(args, "data", "budget_epsilon", "budget_delta")
    return run_and_report(args, spec_from_args(args), command="generate")
