"""``pate-accountant experiment NAME``: run one of the paper's experiments (docs/results.md, docs/cli.md).

Every experiment of :data:`pate_app.EXPERIMENTS` gets the same options here (``--quick --plot --out --seed
--json --no-progress``) beside its own, and the same output: the JSON result always written into ``--out``,
the PNG figures with ``--plot``, and the experiment's summary (or the JSON with ``--json``) on stdout.
``--seed`` defaults to 0, except for an experiment that runs mechanisms on a user's ``--data``
(``UNSEEDED_ON_USER_DATA``): it gets ``None`` and draws that noise from the operating system.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pate_app import EXPERIMENTS
from pate_app.experiments import load
from pate_app.options import add_verbose_option, cannot_write, nonnegative_int, print_json, write_json

NAME = "experiment"
HELP = "run a reproducible experiment from the paper"
DESCRIPTION = "Run a reproducible experiment from the paper (docs/results.md, docs/cli.md)."


def add_arguments(p) -> None:
    """One subcommand per experiment of the table, each with the shared options and its own."""
    experiments = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for name in EXPERIMENTS:
        _add_experiment(experiments, load(name))


def _sizes(values: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in values.items())


def _seed_help(module) -> str:
    if getattr(module, "UNSEEDED_ON_USER_DATA", False):
        return ("random seed (default: 0 on the bundled sample and synthetic teachers; on your --data the "
                "mechanism noise comes from the operating system unless --seed is given, and a seeded run warns)")
    return "random seed (default: 0)"


def _seed(module, seed):
    """The seed ``module.run`` gets: ``--seed``, else 0, except that a module with ``UNSEEDED_ON_USER_DATA``
    gets ``None`` (it chooses: 0 on public data, the operating system's noise on a user's ``--data``)."""
    if seed is None and not getattr(module, "UNSEEDED_ON_USER_DATA", False):
        return 0
    return seed


def _add_experiment(experiments, module) -> None:
    out_default = f"results/{module.NAME}"
    quick, full = module.SIZES["quick"], module.SIZES["full"]
    p = experiments.add_parser(
        module.NAME, help=module.HELP, description=module.DESCRIPTION,
        epilog=f"Sizes: full run {_sizes(full)} ({module.FULL_RUNTIME}); --quick {_sizes(quick)}.",
    )
    p.add_argument("--quick", action="store_true", help=f"small run ({_sizes(quick)})")
    p.add_argument("--plot", action="store_true", help="also write PNG figures into --out")
    p.add_argument("--out", metavar="DIR", default=out_default,
                   help=f"output folder for the JSON result and the plots (default: {out_default})")
    p.add_argument("--seed", metavar="S", type=nonnegative_int, default=None, help=_seed_help(module))
    p.add_argument("--json", action="store_true", help="print only the JSON result to stdout")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    add_verbose_option(p)
    own = p.add_argument_group(f"{module.NAME} options")
    before = {action.dest for action in p._actions}
    module.add_arguments(own)
    own_dests = [action.dest for action in p._actions if action.dest not in before]
    p.set_defaults(handler=main, parser=p, module=module, own_dests=own_dests)


def run_and_write(module, args: argparse.Namespace, out: Path, options: dict) -> tuple[dict, list[Path]]:
    """Run ``module`` with the shared options of ``args`` and its own ``options``; write its JSON result
    (and with ``args.plot`` its figures) into ``out``.  A bad option becomes a usage error (exit 2) before
    anything is written; ``OSError`` from writing propagates."""
    from pate_app.library_output import quiet_libraries  # the libraries' bars and warnings: the experiment
    # shows its own progress bar

    try:
        with quiet_libraries(verbose=getattr(args, "verbose", False)):
            result = module.run(quick=args.quick, seed=_seed(module, args.seed), progress=not args.no_progress,
                                **options)
    except (TypeError, ValueError) as exc:
        args.parser.error(str(exc))
    json_path = out / f"{module.NAME}.json"
    out.mkdir(parents=True, exist_ok=True)
    plots = module.plot(result, out) if args.plot else []
    result["files"] = {"json": str(json_path), "plots": [str(path) for path in plots]}
    write_json(json_path, result)
    return result, [*plots, json_path]


def main(args: argparse.Namespace) -> int:
    """Run the chosen experiment, write its results, print its summary (or ``--json``)."""
    out = Path(args.out)
    try:
        result, written = run_and_write(args.module, args, out, {dest: getattr(args, dest) for dest in args.own_dests})
    except OSError as exc:
        return cannot_write(out, exc)
    if args.json:
        print_json(result)
        return 0
    print(args.module.summary(result))
    for path in written:
        print(f"wrote {path}")
    return 0
