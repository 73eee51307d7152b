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


def build_parser() -> argparse.ArgumentParser:
    """The full ``pate-accountant`` parser (top-level commands, then their subcommands)."""
    parser = argparse.ArgumentParser(
        prog="pate-accountant",
        description="Hot PATE: coordinated teacher ensembles, DP aggregation and privacy accounting.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_experiment_command(commands)
    _add_audit_mechanism_command(commands)
    return parser


def _add_experiment_command(commands) -> None:
    experiment = commands.add_parser(
        "experiment",
        help="run a reproducible experiment from the paper",
        description="Run a reproducible experiment from the paper (docs/cli.md).",
    )
    experiments = experiment.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    _add_histograms_experiment(experiments)


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


#: Mechanisms ``audit-mechanism`` knows (kept in step with ``mechanisms.audit.AUDIT_CASES``; a test checks).
AUDIT_MECHANISMS = ("between-thresholds", "boundary-wrapper", "dp-argmax", "noisy-argmax", "weighted-sampling")


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
    p.add_argument("name", choices=AUDIT_MECHANISMS, metavar="NAME", help="one of: " + ", ".join(AUDIT_MECHANISMS))
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
        "seed": args.seed,
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
              f"seed {'OS entropy' if args.seed is None else args.seed}")
        print(f"  pair            : {case.histogram.as_dict()} vs {case.neighbour.as_dict()} (n={case.histogram.num_teachers})")
        print(f"  why this pair   : {case.note}")
        print(f"  claimed         : epsilon {result.claimed_epsilon:g}, delta {result.claimed_delta:g}")
        print(f"  exact on pair   : epsilon {exact:.4f} (from the mechanism's exact output distribution)")
        print(f"  lower bound     : epsilon >= {result.epsilon_lower_bound:.4f} at {result.confidence:.0%} confidence "
              f"(outcome {result.worst_outcome}, {result.direction})")
        print(f"  verdict         : {verdict}")
    return 1 if result.violation else 0


# -- entry point -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
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
