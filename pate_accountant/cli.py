"""The ``pate-accountant`` command line (also ``python -m pate_accountant``); see docs/cli.md.

Commands are registered in :func:`build_parser`; each leaf command sets a ``handler(args, parser) -> int``.
Importing this module is cheap: it never imports ``ensembles``, matplotlib or torch.  A command that
needs them imports them inside its handler (``pate_accountant`` must not depend on ``ensembles``; only
this application layer may reach it, lazily).

``main(argv)`` returns the exit status instead of raising ``SystemExit``: 0 on success, 2 for a usage
error (argparse prints the message, which names the option, to stderr), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from pate_accountant import __version__

__all__ = ["build_parser", "main"]

#: ``experiment histograms`` sizes: the full run and ``--quick``.
HISTOGRAMS_FULL = {"teachers": 2000, "samples": 1000}
HISTOGRAMS_QUICK = {"teachers": 300, "samples": 200}
HISTOGRAMS_COMMON_SIZE = 20
HISTOGRAMS_OUT = "results/histograms"


# -- argument types (errors become "argument --opt: message", exit status 2) -----------------------------


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "a non-negative integer")


# -- parser ------------------------------------------------------------------------------------------------


#: The paper experiments of ``ensembles.reproduce`` (name -> one-line help).  Their options live in their
#: modules, which are imported only when the command line is ``experiment ...`` (building the parser for any
#: other command must not import ensembles); tests check this list against ``ensembles.reproduce``.
REPRODUCE_EXPERIMENTS = {
    "alpha-sweep": "Section 6: max counts, token/fail/target and yields of alpha-mixture teachers",
    "tct-budget": "Section 6: target hits for a total budget against eps0, vs plain composition",
    "planet-z": "Section 5.2: Hot vs Cold on the Planet Z task, on a real model and at the paper's scale",
    "instructions": "Section 5.1: Hot vs Cold next-token histograms of in-context instruction teachers",
    "end-to-end": "private generation of K records: target and individual charging, Hot vs Cold",
}


def build_parser(*, load_experiments: bool = False) -> argparse.ArgumentParser:
    """The full ``pate-accountant`` parser (top-level commands, then their subcommands).

    ``load_experiments`` imports the ``ensembles.reproduce`` experiments to add their own options (what
    :func:`main` does for ``experiment ...``); without it they are listed with their help only."""
    parser = argparse.ArgumentParser(
        prog="pate-accountant",
        description="Hot PATE: coordinated teacher ensembles, DP aggregation and privacy accounting.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_experiment_command(commands, load_experiments)
    _add_audit_mechanism_command(commands)
    _add_audit_command(commands)
    _add_plan_command(commands)
    _add_demo_command(commands)
    _add_generate_command(commands)
    return parser


def _add_experiment_command(commands, load_experiments: bool) -> None:
    experiment = commands.add_parser(
        "experiment",
        help="run a reproducible experiment from the paper",
        description="Run a reproducible experiment from the paper (docs/cli.md).",
    )
    experiments = experiment.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    _add_histograms_experiment(experiments)
    if not load_experiments:
        for name, help_text in REPRODUCE_EXPERIMENTS.items():
            experiments.add_parser(name, help=help_text, add_help=False)
        return
    from ensembles import reproduce  # lazy: pate_accountant must not depend on ensembles at import time

    for name in reproduce.available():
        _add_reproduce_experiment(experiments, reproduce.load(name))


def _add_reproduce_experiment(experiments, module) -> None:
    """``experiment NAME [--quick] [--plot] [--out DIR] [--seed S] [--json] [--no-progress]`` plus the
    experiment's own options (the interface of :mod:`ensembles.reproduce`)."""
    out_default = f"results/{module.NAME}"
    quick, full = module.SIZES["quick"], module.SIZES["full"]

    def sizes(values: dict) -> str:
        return ", ".join(f"{key}={value}" for key, value in values.items())

    p = experiments.add_parser(
        module.NAME, help=module.HELP, description=module.DESCRIPTION,
        epilog=f"Sizes: full run {sizes(full)} ({module.FULL_RUNTIME}); --quick {sizes(quick)}.",
    )
    p.add_argument("--quick", action="store_true", help=f"small run ({sizes(quick)})")
    p.add_argument("--plot", action="store_true", help="also write PNG figures into --out")
    p.add_argument("--out", metavar="DIR", default=out_default,
                   help=f"output folder for the JSON of the figures and the plots (default: {out_default})")
    p.add_argument("--seed", metavar="S", type=_nonnegative_int, default=0, help="random seed (default: 0)")
    p.add_argument("--json", action="store_true", help="print only the JSON result to stdout")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    own = p.add_argument_group(f"{module.NAME} options")
    before = {action.dest for action in p._actions}
    module.add_arguments(own)
    own_dests = [action.dest for action in p._actions if action.dest not in before]
    p.set_defaults(handler=_run_reproduce_experiment, parser=p, module=module, own_dests=own_dests)


def _run_reproduce_experiment(args: argparse.Namespace) -> int:
    from pathlib import Path

    module = args.module
    options = {dest: getattr(args, dest) for dest in args.own_dests}
    try:
        result = module.run(quick=args.quick, seed=args.seed, progress=not args.no_progress, **options)
    except (TypeError, ValueError) as exc:
        args.parser.error(str(exc))
    out = Path(args.out)
    json_path = out / f"{module.NAME}.json"
    try:
        out.mkdir(parents=True, exist_ok=True)
        plots = module.plot(result, out) if args.plot else []
        result["files"] = {"json": str(json_path), "plots": [str(path) for path in plots]}
        json_path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"pate-accountant: error: cannot write into --out {str(out)!r}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0
    print(module.summary(result))
    for path in [*plots, json_path]:
        print(f"wrote {path}")
    return 0


def _add_histograms_experiment(experiments) -> None:
    p = experiments.add_parser(
        "histograms",
        help="Hot vs Cold vote histograms on a Planet Z-like ensemble (coverage, support, yield)",
        description=(
            "Draw coordinated (Hot PATE) and independent (Cold PATE) vote histograms from a synthetic "
            "Planet Z-like ensemble and sweep the threshold T: coverage, support size and average "
            "yield, with the tau-robust mass P(T) of Remark D.1."
        ),
        epilog=(
            f"Sizes: full run n={HISTOGRAMS_FULL['teachers']}, r={HISTOGRAMS_FULL['samples']}; "
            f"--quick n={HISTOGRAMS_QUICK['teachers']}, r={HISTOGRAMS_QUICK['samples']}; "
            "--teachers/--samples override either."
        ),
    )
    p.add_argument("--quick", action="store_true", help="small run (n=300 teachers, r=200 samples)")
    p.add_argument("--plot", action="store_true", help="write PNG figures and the JSON result into --out")
    p.add_argument(
        "--out", metavar="DIR", default=HISTOGRAMS_OUT, help=f"output folder for --plot (default: {HISTOGRAMS_OUT})"
    )
    p.add_argument("--seed", metavar="S", type=_nonnegative_int, default=0, help="random seed (default: 0)")
    p.add_argument("--json", action="store_true", help="print only the JSON result to stdout")
    p.add_argument(
        "--teachers", metavar="N", type=_positive_int, default=None,
        help=f"number of teachers n (default: {HISTOGRAMS_FULL['teachers']}, --quick: {HISTOGRAMS_QUICK['teachers']})",
    )
    p.add_argument(
        "--samples", metavar="R", type=_positive_int, default=None,
        help=f"histograms drawn per ensemble r (default: {HISTOGRAMS_FULL['samples']}, "
        f"--quick: {HISTOGRAMS_QUICK['samples']})",
    )
    p.add_argument(
        "--common-size", metavar="K", type=_positive_int, default=HISTOGRAMS_COMMON_SIZE,
        help=f"size k of the common set C of answers (default: {HISTOGRAMS_COMMON_SIZE})",
    )
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    p.set_defaults(handler=_run_histograms, parser=p)


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {value}")
    return value


def _noise_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0.0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def _audit_mechanism_name(value: str) -> str:
    """A mechanism with an audit case in :mod:`mechanisms.registry` (earlier names accepted), canonical name."""
    from mechanisms import registry  # the one mechanism registry, read by runs and the auditor alike

    name = registry.ALIASES.get(value, value)
    if name not in registry.audit_names():
        raise argparse.ArgumentTypeError(f"unknown mechanism {value!r}; choose one of {', '.join(registry.audit_names())}")
    return name


def _add_audit_mechanism_command(commands) -> None:
    p = commands.add_parser(
        "audit-mechanism",
        help="empirically lower-bound a mechanism's epsilon on a worst-case neighbouring pair",
        description=(
            "Run a mechanism many times on a neighbouring pair of histograms where its privacy claim is "
            "tight, and report a Clopper-Pearson lower bound on its epsilon (docs/mechanisms/audit.md). "
            "Exit status 1 when the bound exceeds the claimed epsilon."
        ),
    )
    from mechanisms import registry

    p.add_argument("name", type=_audit_mechanism_name, metavar="NAME",
                   help="one of: " + ", ".join(registry.audit_names()))
    p.add_argument("--epsilon", type=_positive_float, default=None, help="claimed total epsilon (default: per mechanism)")
    p.add_argument("--delta", type=_probability, default=None, help="claimed total delta (default 1e-6 where used)")
    p.add_argument("--runs", type=_positive_int, default=200_000, help="runs on each histogram (default 200000)")
    p.add_argument("--seed", type=_nonnegative_int, default=None, help="seed (default: fresh OS entropy)")
    p.add_argument(
        "--noise-scale", type=_noise_scale, default=1.0,
        help="run a broken variant with its noise scaled by this factor in (0, 1] (0.5 = noise halved)",
    )
    p.add_argument("--confidence", type=_probability, default=0.95, help="confidence of the bound (default 0.95)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")
    p.set_defaults(handler=_run_audit_mechanism, parser=p)


def _add_audit_command(commands) -> None:
    p = commands.add_parser(
        "audit",
        help="verify a privacy ledger and print the budget it spent",
        description=(
            "Open a ledger read-only, check its hash chains, heads and runs, replay every row through a fresh "
            "accountant rebuilt from the stored configuration, and print the spent budget and each run's "
            "metadata (docs/ledger.md). An accountant that keeps confidential charges (individual charging) "
            "is checked in full when its confidential file PATH.confidential.sqlite is present, and its "
            "shareable part alone otherwise; the output says which. Exit status 1, naming the offending row, "
            "when a row was edited, dropped or reordered, when the totals disagree or when the budget was "
            "exceeded; 2 when PATH is missing."
        ),
    )
    p.add_argument("path", metavar="PATH", help="the ledger file (SQLite)")
    p.add_argument("--confidential", metavar="FILE", default=None,
                   help="the confidential file (default PATH.confidential.sqlite, used when it exists)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")
    p.set_defaults(handler=_run_audit, parser=p)


# -- handlers ----------------------------------------------------------------------------------------------


def _run_histograms(args: argparse.Namespace) -> int:
    from ensembles import experiments  # lazy: numpy-heavy, and pate_accountant must not depend on ensembles

    parser: argparse.ArgumentParser = args.parser
    sizes = HISTOGRAMS_QUICK if args.quick else HISTOGRAMS_FULL
    num_teachers = args.teachers if args.teachers is not None else sizes["teachers"]
    num_samples = args.samples if args.samples is not None else sizes["samples"]
    if args.common_size > experiments.MAX_COMMON_SIZE:
        parser.error(f"argument --common-size: must be <= {experiments.MAX_COMMON_SIZE}, got {args.common_size}")

    result = experiments.histograms_experiment(
        num_teachers, num_samples, args.common_size, args.seed, progress=not args.no_progress
    )

    written = []
    if args.plot:
        from pathlib import Path

        out = Path(args.out)
        try:
            plots = experiments.plot_histograms_experiment(result, out)
            json_path = out / "histograms.json"
            result["files"] = {"json": str(json_path), "plots": [str(path) for path in plots]}
            json_path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"pate-accountant: error: cannot write into --out {str(out)!r}: {exc}", file=sys.stderr)
            return 1
        written = [*plots, json_path]

    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0

    p = result["parameters"]
    print(
        f"Hot vs Cold histograms: Planet Z-like ensemble, n={p['num_teachers']} teachers, "
        f"k={p['common_size']} common answers, r={p['num_samples']} samples per ensemble, seed={p['seed']}"
    )
    print(
        f"max average token probability {result['max_average_probability']:.4f} "
        f"(n x that = {p['num_teachers'] * result['max_average_probability']:.1f} votes); "
        f"average mass on C {result['common_mass']:.3f}"
    )
    for name in ("hot", "cold"):
        stats = result[name]
        label = "Hot  (coordinated)" if name == "hot" else "Cold (independent)"
        print(
            f"{label}: top count mean {stats['max_count']['mean']:.1f} median {stats['max_count']['median']:.1f}; "
            f"margin mean {stats['margin']['mean']:.1f} median {stats['margin']['median']:.1f}"
        )
    print()
    print(experiments.format_table(result))
    print()
    print(experiments.format_summary(result))
    for path in written:
        print(f"wrote {path}")
    return 0


def _run_audit_mechanism(args: argparse.Namespace) -> int:
    import numpy as np  # lazy, like the mechanisms

    from mechanisms import audit

    try:
        case = audit.audit_case(args.name, args.epsilon, args.delta, args.noise_scale)
    except (TypeError, ValueError) as exc:
        args.parser.error(str(exc))
    rng = np.random.default_rng(args.seed)
    result = audit.run_audit_case(case, args.runs, rng, confidence=args.confidence)
    exact = audit.exact_pair_epsilon(case.mechanism, case.histogram, case.neighbour, case.claimed_delta)
    payload = {
        "mechanism": args.name,
        "noise_scale": args.noise_scale,
        "seeded": args.seed is not None,  # the seed itself is never printed
        "pair": {"histogram": case.histogram.as_dict(), "neighbour": case.neighbour.as_dict(),
                 "num_teachers": case.histogram.num_teachers, "note": case.note},
        "exact_pair_epsilon": exact,
        **result.as_dict(),
    }
    if args.json:
        print(json.dumps(payload, indent=2, allow_nan=False, default=str))
    else:
        verdict = "VIOLATION: the claim is exceeded" if result.violation else "consistent with the claim"
        print(f"audit of {args.name} (noise scale {args.noise_scale:g}), {args.runs:,} runs per histogram, "
              f"{'OS entropy' if args.seed is None else 'seeded'}")
        print(f"  pair            : {case.histogram.as_dict()} vs {case.neighbour.as_dict()} (n={case.histogram.num_teachers})")
        print(f"  why this pair   : {case.note}")
        print(f"  claimed         : epsilon {result.claimed_epsilon:g}, delta {result.claimed_delta:g}")
        print(f"  exact on pair   : epsilon {exact:.4f} (from the mechanism's exact output distribution)")
        print(f"  lower bound     : epsilon >= {result.epsilon_lower_bound:.4f} at {result.confidence:.0%} confidence "
              f"(outcome {result.worst_outcome}, {result.direction})")
        print(f"  verdict         : {verdict}")
    return 1 if result.violation else 0


def _run_audit(args: argparse.Namespace) -> int:
    import sqlite3

    from pate_accountant.ledger import Ledger, LedgerError, VerificationResult

    if not os.path.isfile(args.path):
        args.parser.error(f"argument PATH: no ledger file at {args.path!r}")
    if args.confidential is not None and not os.path.isfile(args.confidential):
        args.parser.error(f"argument --confidential: no file at {args.confidential!r}")
    try:
        with Ledger.open(args.path, read_only=True, confidential=args.confidential) as ledger:
            result = ledger.verify()
    except (LedgerError, sqlite3.Error, OSError, UnicodeDecodeError, ValueError) as exc:  # not a ledger, unreadable, ...
        result = VerificationResult(False, 0, None, None, f"{type(exc).__name__}: {exc}")
    checked = {
        "verified": "shareable and confidential parts",
        "absent": f"shareable part only (confidential file {result.confidential_path} not found: per-teacher "
                  "charges and the spent budget not checked)",
        "unusable": f"nothing beyond the metadata (the confidential file {result.confidential_path} is unusable)",
        "none": "shareable part (this accountant keeps no confidential data)",
    }[result.confidential]
    if args.json:
        print(json.dumps({"path": args.path, "checked": checked, **result.as_dict()}, indent=2, default=str))
    else:
        budget = "none" if result.budget is None else f"epsilon {result.budget[0]:g}, delta {result.budget[1]:g}"
        if result.spent is not None:
            spent = f"epsilon {result.spent[0]:.6g}, delta {result.spent[1]:.6g}"
            if result.confidential == "verified":
                spent += " (confidential: a function of who was charged; do not share)"
        elif result.confidential == "absent":
            spent = "confidential (kept in the confidential file); the guarantee is the budget"
        else:
            spent = "unknown"
        print(f"ledger      : {args.path}")
        print(f"checked     : {checked}")
        print(f"data set    : {result.dataset if result.dataset is not None else 'not named'}")
        print(f"accountant  : {result.kind or 'none attached'}")
        print(f"rows        : {result.rows}{'' if result.ok else ' verified before the failure'}")
        if result.queries is not None:
            print(f"queries     : {result.queries} with an outcome, {result.hits} target hits")
        print(f"spent       : {spent}{'' if result.ok or result.spent is None else ' (up to the first bad row)'}")
        print(f"budget      : {budget}")
        if result.run_metadata is not None:
            print(f"metadata    : {json.dumps(result.run_metadata, sort_keys=True)}")
        print(f"runs        : {len(result.runs)}")
        for run in result.runs:
            print(f"  run {run['id']} ({run['rows']} rows from row {run['first_row'] + 1}): "
                  f"{json.dumps(run['metadata'], sort_keys=True)}")
        if result.software_version is not None:
            print(f"created by  : pate-accountant {result.software_version}")
        if result.head_hash is not None:
            print(f"head hash   : {result.head_hash}")
        print(f"verdict     : {'OK' if result.ok else 'FAILED'}: {result.message}")
    if not result.ok:
        where = f" at row {result.first_bad_row}" if result.first_bad_row is not None else ""
        print(f"pate-accountant audit: ledger does not verify{where}: {result.message}", file=sys.stderr)
    return 0 if result.ok else 1


# -- plan: budget planning (docs/planning.md) ---------------------------------------------------------------

#: ``plan --plot`` / ``plan figures --plot`` output folder.
PLAN_OUT = "results/plan"
PLAN_SUBCOMMANDS = ("hits", "yields", "for-tokens", "compare", "margin", "figures")


def _plan_real(what: str, minimum: float, maximum: float | None = None, *, min_open: bool = False,
               max_open: bool = False):
    """A float type for argparse in an interval; accepts a fraction such as ``1/3``."""

    def parse(text: str) -> float:
        from fractions import Fraction

        try:
            value = float(Fraction(text.strip())) if "/" in text else float(text)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        bad = value != value or value in (float("inf"), float("-inf"))
        bad = bad or value < minimum or (min_open and value == minimum)
        if maximum is not None:
            bad = bad or value > maximum or (max_open and value == maximum)
        if bad:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value:g}")
        return value

    return parse


_plan_positive = _plan_real("a positive number", 0.0, min_open=True)
_plan_open_unit = _plan_real("a number in (0, 1)", 0.0, 1.0, min_open=True, max_open=True)
_plan_q = _plan_real("a number in (0, 1] (a fraction such as 1/3 is fine)", 0.0, 1.0, min_open=True)
_plan_unit = _plan_real("a number in [0, 1]", 0.0, 1.0)
_plan_delta0 = _plan_real("a number in [0, 1)", 0.0, 1.0, max_open=True)


def _plan_int(what: str, minimum: int):
    def parse(text: str) -> int:
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if isinstance(value, float):  # allow 1e6, refuse 2.5
            if value != value or value in (float("inf"), float("-inf")) or value != int(value):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
            value = int(value)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


_plan_count = _plan_int("a positive integer", 1)
_plan_count0 = _plan_int("a non-negative integer", 0)


def _add_plan_command(commands) -> None:
    plan = commands.add_parser(
        "plan",
        help="answer budget questions before a run (target hits, yields, teachers, accounting, margin)",
        description=(
            "Budget planning (docs/planning.md): how many target hits / yields a budget buys, which eps0 and "
            "how many teachers for a wanted number of tokens, plain vs target vs individual charging for one "
            "run shape, and the BassilyTT margin condition. `pate-accountant plan --plot` draws the "
            "Section 6 figures (target hits vs eps0; the alpha sweep of token / fail / target probabilities)."
        ),
    )
    plan.add_argument("--plot", dest="plan_plot", action="store_true",
                      help="without a subcommand: draw both Section 6 figures (same as `plan figures --plot`)")
    plan.add_argument("--out", dest="plan_out", metavar="DIR", default=PLAN_OUT,
                      help=f"output folder for --plot (default: {PLAN_OUT})")
    plan.add_argument("--quick", dest="plan_quick", action="store_true", help="small, fast figures")
    plan.add_argument("--seed", dest="plan_seed", metavar="S", type=_plan_count0, default=0,
                      help="seed of the alpha sweep (default: 0)")
    plan.add_argument("--json", dest="plan_json", action="store_true", help="print only the JSON result")
    plan.add_argument("--no-progress", dest="plan_no_progress", action="store_true",
                      help="do not show the progress bar (stderr)")
    plan.set_defaults(handler=_run_plan_top, parser=plan)
    sub = plan.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=False)

    def common(p, *, eps0=True, budget=True, tct=True):
        if budget:
            p.add_argument("--epsilon", type=_plan_positive, default=1.0, help="total epsilon (default 1)")
        p.add_argument("--delta", type=_plan_open_unit, default=1e-6, help="total delta (default 1e-6)")
        if eps0:
            p.add_argument("--eps0", type=_plan_positive, required=True,
                           help="privacy level of one query's target (TCT level; 2 eps_A for a BoundaryWrapper)")
        if tct:
            p.add_argument("--q", type=_plan_q, default=1.0 / 3.0, help="q of the q-target (default 1/3)")
            p.add_argument("--delta0", type=_plan_delta0, default=0.0,
                           help="delta_A of a boundary-wrapped approximate inner (default 0: a pure inner, the "
                           "paper's figure). With delta0 > 0 every query, hit or not, pays w = 1-(1-delta0)^2 in "
                           "delta; half of --delta is reserved for them, so the budget also limits the queries "
                           "(max_queries; docs/tct_and_individual.md, section 1). Plain composition reads it as "
                           "each query's delta")
            p.add_argument("--composition", choices=("optimal", "drv"), default="optimal",
                           help="composition inside the TCT bound (default optimal)")
        p.add_argument("--json", action="store_true", help="print only the JSON result")

    p = sub.add_parser("hits", help="target hits a budget buys (and plain eps0-DP queries for comparison)",
                       description="Largest number of target hits with TCT epsilon <= --epsilon "
                       "(planning.target_hits), next to plain composition of eps0-DP queries.")
    common(p)
    p.set_defaults(handler=_run_plan_hits, parser=p)

    p = sub.add_parser("yields", help="expected yields (tokens) a budget buys (paper: eps0 n / 2 per hit)",
                       description="Expected yields = hits x eps0 n / 2 (planning.yields), the paper's relation "
                       "for alpha <= T/n; n defaults to C_delta/eps0, C_delta = 2 ln(1/aggregator delta).")
    common(p)
    p.add_argument("--teachers", type=_plan_count, default=None, help="number of teachers n (default C_delta/eps0)")
    p.add_argument("--aggregator-delta", type=_plan_open_unit, default=1e-6,
                   help="delta0 of the aggregator in C_delta = 2 ln(1/delta0) (default 1e-6)")
    p.set_defaults(handler=_run_plan_yields, parser=p)

    p = sub.add_parser("for-tokens", help="which eps0 and how many teachers for a wanted number of tokens",
                       description="Largest eps0 (fewest teachers n = C_delta/eps0) whose budget buys at least "
                       "--tokens yields (planning.plan_for_tokens); never overshoots the budget.")
    p.add_argument("--tokens", type=_plan_count, required=True, help="wanted number of yields (tokens)")
    common(p, eps0=False)
    p.add_argument("--aggregator-delta", type=_plan_open_unit, default=1e-6,
                   help="delta0 of the aggregator in C_delta = 2 ln(1/delta0) (default 1e-6)")
    p.set_defaults(handler=_run_plan_for_tokens, parser=p)

    p = sub.add_parser("compare", help="plain composition vs target charging vs individual charging",
                       description="Epsilon of one run shape under plain composition, target charging and "
                       "individual charging (planning.compare_accounting).")
    p.add_argument("--queries", type=_plan_count0, required=True, help="number of queries in the run")
    p.add_argument("--target-rate", type=_plan_unit, required=True, help="fraction of queries that hit the target")
    p.add_argument("--teachers", type=_plan_count, required=True, help="number of teachers n")
    p.add_argument("--charged-per-hit", type=_plan_count, default=None,
                   help="teachers charged per hit (default min(n, ceil(C_delta/eps0)), about 2L)")
    p.add_argument("--individual-q", type=_plan_q, default=None, help="q for individual charging (default --q)")
    p.add_argument("--budget-epsilon", type=_plan_positive, default=None,
                   help="also report how many queries each accounting affords within this epsilon")
    p.add_argument("--aggregator-delta", type=_plan_open_unit, default=1e-6,
                   help="delta0 in C_delta = 2 ln(1/delta0), for the default --charged-per-hit (default 1e-6)")
    common(p, budget=False)
    p.set_defaults(handler=_run_plan_compare, parser=p)

    p = sub.add_parser("margin", help="BassilyTT margin condition: teachers for m tokens, or tokens for n teachers",
                       description="eta n >= 32 sqrt(2)/eps ln(4m/delta) sqrt(ln(2/delta)) (paper Appendix D; "
                       "planning.bassily_tt_teachers / bassily_tt_tokens).")
    p.add_argument("--eta", type=_plan_q, default=0.4, help="margin as a fraction of n (default 0.4)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokens", type=_plan_count, help="tokens m: report the teachers needed")
    which.add_argument("--teachers", type=_plan_count, help="teachers n: report the most tokens m")
    common(p, eps0=False, tct=False)
    p.set_defaults(handler=_run_plan_margin, parser=p)

    p = sub.add_parser("figures", help="the Section 6 figures' data; --plot writes the PNGs",
                       description="Target hits for total epsilon 1 vs eps0, and the alpha sweep of "
                       "BoundaryWrapper(DPArgMax) outcome probabilities (ensembles.plan_figures).")
    p.add_argument("--plot", action="store_true", help="write the PNG figures and the JSON data into --out")
    p.add_argument("--out", metavar="DIR", default=PLAN_OUT, help=f"output folder (default: {PLAN_OUT})")
    p.add_argument("--quick", action="store_true", help="small, fast figures")
    p.add_argument("--seed", metavar="S", type=_plan_count0, default=0, help="seed of the alpha sweep (default: 0)")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")
    p.set_defaults(handler=_run_plan_figures, parser=p)


#: planning parameter -> the ``plan`` option that sets it (for error messages).
_PLAN_OPTIONS = {
    "epsilon": "--epsilon", "delta": "--delta", "eps0": "--eps0", "q": "--q", "delta0": "--delta0",
    "num_teachers": "--teachers", "tokens": "--tokens", "num_queries": "--queries", "target_rate": "--target-rate",
    "charged_per_hit": "--charged-per-hit", "individual_q": "--individual-q", "budget_epsilon": "--budget-epsilon",
    "aggregator_delta": "--aggregator-delta", "eta": "--eta", "composition": "--composition",
}


def _plan_call(args, function, **kwargs):
    """Run a planning function; a ValueError/TypeError it raises becomes a usage error (exit 2) that names
    the option."""
    try:
        return function(**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        name = message.split(" ", 1)[0]
        if name in _PLAN_OPTIONS:
            message = f"argument {_PLAN_OPTIONS[name]}: {message}"
        args.parser.error(message)


def _plan_print(args, command: str, result, lines) -> int:
    if args.json:
        print(json.dumps({"command": f"plan {command}", **result.as_dict()}, indent=2, allow_nan=False))
        return 0
    for line in lines:
        print(line)
    print("assumptions:")
    for item in result.assumptions:
        print(f"  - {item}")
    return 0


def _run_plan_top(args: argparse.Namespace) -> int:
    if not args.plan_plot:
        args.parser.error("a subcommand (" + ", ".join(PLAN_SUBCOMMANDS) + ") or --plot is required")
    args.plot, args.out, args.quick, args.seed = True, args.plan_out, args.plan_quick, args.plan_seed
    args.json, args.no_progress = args.plan_json, args.plan_no_progress
    return _run_plan_figures(args)


def _plan_no_top_plot(args) -> None:
    if getattr(args, "plan_plot", False):
        args.parser.error("argument --plot: `plan --plot` draws the figures and takes no subcommand "
                          "(use `plan --plot` or `plan figures --plot`)")


def _plan_query_lines(r) -> list[str]:
    """The query limit of a plan with a per-query delta (``delta0 > 0``); nothing for a pure inner."""
    if getattr(r, "max_queries", None) is None:
        return []
    return [
        f"queries, hit or not  : at most {r.max_queries} (each pays w = {r.per_query_delta:.4g}; "
        f"{r.reserved_delta:.4g} of delta reserved)"
    ]


def _run_plan_hits(args: argparse.Namespace) -> int:
    from pate_accountant import planning

    _plan_no_top_plot(args)
    r = _plan_call(args, planning.target_hits, epsilon=args.epsilon, delta=args.delta, eps0=args.eps0, q=args.q,
                   delta0=args.delta0, composition=args.composition)
    plain = ", ".join(f"{m} {k}" for m, k in r.plain_queries.items())
    return _plan_print(args, "hits", r, [
        f"budget (epsilon {r.epsilon:g}, delta {r.delta:g}), target level eps0 {r.eps0:g}, q {r.q:.4g}, "
        f"{r.composition} composition inside",
        f"target hits          : {r.hits} (epsilon spent {r.epsilon_spent:.6f}; one more hit: {r.epsilon_next_hit:.6f})",
        f"private draws bound  : k = {r.private_draws}",
        *_plan_query_lines(r),
        f"paper (10 eps0)^-2   : {r.paper_hits:.1f} (ours / paper = {r.hits / r.paper_hits:.3f})",
        f"plain eps0-DP queries: {plain}",
    ])


def _run_plan_yields(args: argparse.Namespace) -> int:
    from pate_accountant import planning

    _plan_no_top_plot(args)
    r = _plan_call(args, planning.yields, epsilon=args.epsilon, delta=args.delta, eps0=args.eps0,
                   num_teachers=args.teachers, q=args.q, delta0=args.delta0, composition=args.composition,
                   aggregator_delta=args.aggregator_delta)
    return _plan_print(args, "yields", r, [
        f"budget (epsilon {r.epsilon:g}, delta {r.delta:g}), eps0 {r.eps0:g}, q {r.q:.4g}, n = {r.num_teachers:.1f} "
        f"teachers (C_delta/eps0 = {r.min_teachers:.1f}, C_delta = {r.c_delta:.4f})",
        f"target hits (ours)      : {r.hits}",
        *([] if r.max_queries is None else [f"queries, hit or not     : at most {r.max_queries} (delta0 {r.delta0:g})"]),
        f"yields per hit eps0 n/2 : {r.yields_per_hit:.2f}",
        f"expected yields (ours)  : {r.yields:.1f}",
        f"paper: (10 eps0)^-2 hits: {r.paper_hits:.1f} -> {r.paper_yields:.1f} yields "
        f"(0.005 n^2/C_delta = {r.paper_formula_yields:.1f})",
    ])


def _run_plan_for_tokens(args: argparse.Namespace) -> int:
    from pate_accountant import planning

    _plan_no_top_plot(args)
    r = _plan_call(args, planning.plan_for_tokens, tokens=args.tokens, epsilon=args.epsilon, delta=args.delta,
                   q=args.q, delta0=args.delta0, composition=args.composition,
                   aggregator_delta=args.aggregator_delta)
    return _plan_print(args, "for-tokens", r, [
        f"wanted {r.tokens} yields within (epsilon {r.epsilon:g}, delta {r.delta:g}), q {r.q:.4g}, "
        f"{r.composition} composition inside",
        f"hits needed          : {r.hits_needed} (C_delta/2 = {r.c_delta / 2:.3f} yields per hit)",
        f"eps0                 : {r.eps0:.6g}",
        f"teachers             : {r.num_teachers} (C_delta/eps0 = {r.num_teachers_exact:.1f})",
        f"budgeted hits        : {r.hits} (epsilon spent {r.epsilon_spent:.6f}; one more: {r.epsilon_next_hit:.6f})",
        *_plan_query_lines(r),
        f"expected yields      : {r.expected_yields:.1f}",
        f"paper's formula      : eps0 {r.paper_eps0:.6g}, {r.paper_num_teachers:.1f} teachers",
    ])


def _run_plan_compare(args: argparse.Namespace) -> int:
    from pate_accountant import planning

    _plan_no_top_plot(args)
    r = _plan_call(args, planning.compare_accounting, num_queries=args.queries, eps0=args.eps0, delta=args.delta,
                   num_teachers=args.teachers, target_rate=args.target_rate, charged_per_hit=args.charged_per_hit,
                   q=args.q, individual_q=args.individual_q, delta0=args.delta0, composition=args.composition,
                   aggregator_delta=args.aggregator_delta, budget_epsilon=args.budget_epsilon)
    plain = ", ".join(f"{m} {e:.4f}" for m, e in r.plain.items())
    lines = [
        f"{r.num_queries} queries at eps0 {r.eps0:g}, delta {r.delta:g}, {r.num_teachers} teachers, "
        f"target rate {r.target_rate:g} -> {r.hits} hits, {r.charged_per_hit} teachers charged per hit",
        f"plain composition    : epsilon {plain}",
        *([] if r.per_query_delta == 0.0 else [
            f"per-query delta      : w = {r.per_query_delta:.4g} on every query, Delta = {r.total_query_delta:.4g}"
        ]),
        f"target charging      : epsilon {r.target_charging:.4f}",
        f"individual charging  : epsilon {r.individual_charging:.4f} (worst teacher: {r.charges_per_teacher} charges)",
    ]
    if r.max_queries is not None:
        mq = ", ".join(f"{k} {'unlimited' if v is None else v}" for k, v in r.max_queries.items())
        lines.append(f"queries within epsilon {r.budget_epsilon:g}: {mq}")
    return _plan_print(args, "compare", r, lines)


def _run_plan_margin(args: argparse.Namespace) -> int:
    from pate_accountant import planning

    _plan_no_top_plot(args)
    if args.tokens is not None:
        r = _plan_call(args, planning.bassily_tt_teachers, eta=args.eta, epsilon=args.epsilon, delta=args.delta,
                       tokens=args.tokens)
        lines = [f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): {r.tokens} tokens need "
                 f"n >= {r.n_required:.2f} teachers ({r.num_teachers})"]
    else:
        r = _plan_call(args, planning.bassily_tt_tokens, eta=args.eta, epsilon=args.epsilon, delta=args.delta,
                       num_teachers=args.teachers)
        m = f"{r.m_max}" if r.m_max is not None else f"about 10^{r.log10_m_max:.1f}"
        lines = [f"BassilyTT margin eta {r.eta:g}, (epsilon {r.epsilon:g}, delta {r.delta:g}): "
                 f"{r.num_teachers:g} teachers afford m_max = {m} tokens"]
    return _plan_print(args, "margin", r, lines)


def _run_plan_figures(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ensembles import plan_figures  # lazy: pate_accountant must not depend on ensembles

    out = Path(args.out)
    try:
        result = plan_figures.plan_figures(out if args.plot else None, quick=args.quick, seed=args.seed,
                                           progress=not args.no_progress)
        if args.plot:
            json_path = out / "plan_figures.json"
            result["files"].append(str(json_path))
            json_path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"pate-accountant: error: cannot write into --out {str(out)!r}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"command": "plan figures", **result}, indent=2, allow_nan=False))
        return 0
    hits, sweep = result["target_hits"], result["alpha_sweep"]
    print(f"Target hits for total epsilon {hits['epsilon']:g}, delta {hits['delta']:g} (TCT, optimal, q=1/3) "
          "vs the paper's (10 eps0)^-2:")
    for e, h, p, k in zip(hits["eps0"], hits["tct"]["optimal q=1/3"], hits["paper"], hits["plain"]["optimal"]):
        print(f"  eps0 {e:<9.4g} hits {h:>7}  paper {p:>9.1f}  plain queries {k:>7}")
    print(f"Alpha sweep: {sweep['parameters']['mechanism']}, n={sweep['parameters']['num_teachers']}, "
          f"{sweep['parameters']['num_samples']} histograms per alpha (T/n = {sweep['threshold_fraction']:.2f})")
    for a, t, f, g in zip(sweep["alphas"], sweep["token"], sweep["fail"], sweep["target"]):
        print(f"  alpha {a:<7.4g} token {t:.4f}  fail {f:.4f}  target {g:.5f}")
    s = sweep["summary"]
    mq = s["min_queries_per_hit"]
    print(f"  fewest queries per target hit: {'none' if mq is None else f'{mq:.1f}'}; "
          f"paper eps0 n = {sweep['paper_queries_per_hit']:g}")
    for path in result.get("files", []):
        print(f"wrote {path}")
    return 0


# -- demo / generate: private generation runs (docs/demo.md) ------------------------------------------------

#: ``demo`` defaults (docs/demo.md explains the choice).
DEMO_DEFAULTS = {
    "teachers": 64, "records": 3, "max_tokens": 24, "mechanism": "dp-argmax", "accountant": "basic",
    "step_epsilon": 2.0, "step_delta": 1e-6, "relation": "replace-one", "epsilon": 150.0, "delta": 1e-4,
    "temperature": 0.7, "top_p": 0.9,
}


def _run_options(p, *, demo: bool) -> None:
    d = DEMO_DEFAULTS
    p.add_argument("--teachers", metavar="N", type=_positive_int, default=d["teachers"] if demo else None,
                   required=not demo, help="number of teachers n" + (f" (default {d['teachers']})" if demo else ""))
    p.add_argument("--records", metavar="K", type=_positive_int, default=d["records"],
                   help=f"synthetic records to generate (default {d['records']})")
    p.add_argument("--max-tokens", metavar="T", type=_positive_int, default=d["max_tokens"],
                   help=f"at most T tokens per record; a record also stops at a newline (default {d['max_tokens']})")
    p.add_argument("--step-epsilon", metavar="E", type=_positive_float, default=d["step_epsilon"],
                   help=f"per-step epsilon of the mechanism (default {d['step_epsilon']:g})")
    p.add_argument("--step-delta", metavar="D", type=_probability, default=d["step_delta"],
                   help=f"per-step delta of the mechanism (default {d['step_delta']:g})")
    p.add_argument("--relation", choices=("replace-one", "add-remove-one"), default=d["relation"],
                   help=f"neighbouring relation of the mechanism (default {d['relation']})")
    p.add_argument("--temperature", metavar="T", type=_positive_float, default=d["temperature"],
                   help=f"teacher temperature (default {d['temperature']:g})")
    p.add_argument("--top-p", metavar="P", type=_noise_scale, default=d["top_p"],
                   help=f"teacher top-p in (0, 1] (default {d['top_p']:g})")
    p.add_argument("--seed", metavar="S", type=_nonnegative_int, default=None,
                   help="seed, for reproducible tests only: a seeded run has no privacy against anyone who knows "
                        "the seed (default: fresh OS entropy; the ledger records only whether a seed was given)")
    p.add_argument("--threads", metavar="K", type=_positive_int, default=None, help="CPU threads (default 2)")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar (stderr)")


def _add_demo_command(commands) -> None:
    d = DEMO_DEFAULTS
    p = commands.add_parser(
        "demo",
        help="generate a few synthetic records privately from the bundled sample on the embedded model",
        description=(
            "Generate a few synthetic instructions privately (Hot PATE) from the bundled Dolly-format sample "
            "on the embedded SmolLM2-135M-Instruct model, charge the sample's ledger and audit it (docs/demo.md). "
            f"Defaults: {d['teachers']} teachers, DPArgMax(epsilon {d['step_epsilon']:g}, delta {d['step_delta']:g}, "
            f"{d['relation']}) per step, basic composition with budget (epsilon {d['epsilon']:g}, delta {d['delta']:g})."
        ),
    )
    p.add_argument("--ledger", metavar="PATH", default=None,
                   help="the bundled sample's ledger (default ./pate-demo.sqlite); an existing one of the same "
                        "data set is appended to, so repeated demos share one budget")
    p.add_argument("--dataset", metavar="NAME", default="bundled-sample",
                   help="name of the data set the ledger belongs to (default bundled-sample)")
    p.add_argument("--epsilon", type=_positive_float, default=d["epsilon"], help=f"total budget epsilon (default {d['epsilon']:g})")
    p.add_argument("--delta", type=_probability, default=d["delta"], help=f"total budget delta (default {d['delta']:g})")
    _run_options(p, demo=True)
    p.set_defaults(handler=_run_demo, parser=p)


def _add_generate_command(commands) -> None:
    p = commands.add_parser(
        "generate",
        help="generate synthetic records privately from a Dolly-format JSONL file on a local model",
        description=(
            "Partition the records of --data between --teachers in-context teachers of the local model "
            "--model, generate --records synthetic instructions privately, charge the data set's ledger --ledger "
            "(created, or appended to when it exists: a ledger keeps one data set's budget across runs) and "
            "audit it (docs/demo.md). --epsilon/--delta are the data set's total budget; --step-epsilon/"
            "--step-delta the mechanism's per-step parameters."
        ),
    )
    p.add_argument("--model", metavar="PATH", required=True, help="local model folder, .gguf file, or folder with one")
    p.add_argument("--data", metavar="FILE", required=True, help="Dolly-format JSON lines (records with a context are skipped)")
    from mechanisms import registry as mechanisms_registry
    from pate_accountant import registry as accountants_registry

    p.add_argument("--mechanism", choices=mechanisms_registry.run_mechanism_names(), required=True,
                   help="per-step aggregation mechanism (mechanisms.registry)")
    p.add_argument("--accountant", choices=accountants_registry.run_accountant_names(), required=True,
                   help="privacy accountant (pate_accountant.registry)")
    p.add_argument("--epsilon", type=_positive_float, required=True, help="total budget epsilon")
    p.add_argument("--delta", type=_probability, required=True, help="total budget delta")
    p.add_argument("--ledger", metavar="FILE", required=True,
                   help="the data set's ledger: created if missing; an existing one must belong to the same data "
                        "set, accountant and budget, and the run is appended to it")
    p.add_argument("--dataset", metavar="NAME", default=None,
                   help="name of the data set the ledger belongs to (default: the --data file's name); it is "
                        "stored in the shareable ledger, so choose a name that reveals nothing private")
    _run_options(p, demo=False)
    p.set_defaults(handler=_run_generate, parser=p)


def _private_run(args, *, command: str, model, records, ledger, model_label: str, data_label: str,
                 dataset: str) -> int:
    from ensembles.run import RunInputError, private_run

    try:
        result = private_run(
            model=model, records=records, num_teachers=args.teachers, ledger_path=ledger,
            mechanism=getattr(args, "mechanism", DEMO_DEFAULTS["mechanism"]),
            accountant=getattr(args, "accountant", DEMO_DEFAULTS["accountant"]),
            step_epsilon=args.step_epsilon, step_delta=args.step_delta, relation=args.relation,
            epsilon=args.epsilon, delta=args.delta, num_records=args.records, max_tokens=args.max_tokens,
            seed=args.seed, temperature=args.temperature, top_p=args.top_p, threads=args.threads,
            progress=not args.no_progress and not args.json, command=command,
            model_label=model_label, data_label=data_label, dataset=dataset,
        )
    except RunInputError as exc:
        args.parser.error(str(exc))
    except ValueError as exc:  # the backend: unknown model path, no tokenizer, ...
        args.parser.error(f"argument --model: {exc}" if command == "generate" else str(exc))
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0 if result["audit"]["ok"] else 1
    p = result["parameters"]
    print(f"{command}: {p['num_teachers']} teachers, data set {p['dataset']!r} ({p['data']}), "
          f"model {p['model']}, {p['mechanism_name']} (step epsilon {args.step_epsilon:g}, delta "
          f"{args.step_delta:g}), {p['accountant']} accountant, {'seeded' if p['seeded'] else 'OS entropy'}")
    for i, record in enumerate(result["records"], start=1):
        print(f"  record {i}: {record['text']!r}")
        print(f"            {record['num_tokens']} tokens: {record['private_tokens']} private, "
              f"{record['fallback_tokens']} public fallbacks; stop: {record['stop_reason']}")
    s, b, before = result["spent"], result["budget"], result["spent_before"]
    print(f"spent       : epsilon {s['epsilon']:.6g}, delta {s['delta']:.3g} of the data set's budget epsilon "
          f"{b['epsilon']:g}, delta {b['delta']:g} ({result['charged_runs']} charged runs in this run; epsilon "
          f"{before['epsilon']:.6g} was spent before it)")
    led = result["ledger"]
    print(f"ledger      : {led['path']} ({led['rows']} rows; run {led['run']} of {led['runs']}"
          f"{', appended' if led['appended'] else ', new'})")
    audit = result["audit"]
    print(f"audit       : {'OK' if audit['ok'] else 'FAILED'}: {audit['message']}")
    print(f"wall time   : {result['wall_seconds']:.1f} s")
    return 0 if audit["ok"] else 1


def _run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ensembles.data import bundled_sample
    from ensembles.run import default_demo_ledger, demo_model_path

    ledger = default_demo_ledger() if args.ledger is None else args.ledger
    try:
        model = demo_model_path()
    except ValueError as exc:
        args.parser.error(str(exc))
    return _private_run(args, command="demo", model=model, records=bundled_sample(), ledger=ledger,
                        model_label="SmolLM2-135M-Instruct (embedded)", data_label="bundled sample",
                        dataset=args.dataset)


def _run_generate(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ensembles.data import load_dolly_jsonl

    if not os.path.exists(os.path.expanduser(args.model)):
        args.parser.error(f"argument --model: no model at {args.model!r} (model hubs are not used: give a local path)")
    try:
        records = load_dolly_jsonl(args.data)
    except FileNotFoundError as exc:
        args.parser.error(f"argument --data: {exc}")
    except ValueError as exc:
        args.parser.error(f"argument --data: {exc}")
    dataset = args.dataset if args.dataset is not None else os.path.basename(args.data)
    return _private_run(args, command="generate", model=args.model, records=records, ledger=args.ledger,
                        model_label=args.model, data_label=os.path.basename(args.data), dataset=dataset)


# -- entry point -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(load_experiments=argv[:1] == ["experiment"])
    try:
        args = parser.parse_args(argv)
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
