"""``pate-accountant audit-mechanism NAME``: an empirical lower bound on a mechanism's epsilon
(docs/mechanisms/audit.md)."""

from __future__ import annotations

import argparse
import json

from mechanisms import registry
from pate_app.options import (
    add_option,
    delta,
    int_in,
    nonnegative_int,
    open_unit,
    real_in,
    scale,
)

NAME = "audit-mechanism"
HELP = "empirically lower-bound a mechanism's epsilon on a worst-case neighbouring pair"
DESCRIPTION = (
    "Run a mechanism many times on a neighbouring pair of histograms where its privacy claim is "
    "tight, and report a Clopper-Pearson lower bound on its epsilon (docs/mechanisms/audit.md). "
    "Exit status 1 when the bound exceeds the claimed epsilon."
)


#: ``--step-epsilon``: the ready-made cases' claims, ``(0, mechanisms.audit.MAX_AUDIT_EPSILON]`` (docs/ranges.md).
#: ``mechanisms.audit``'s limits, written out so that building the parser imports no mechanism (fast --help);
#: ``tests/test_cli_grammar.py`` keeps them equal.
MAX_AUDIT_EPSILON, MAX_AUDIT_RUNS = 15.0, 100_000_000
audit_epsilon = real_in(f"a number in (0, {MAX_AUDIT_EPSILON:g}] (no audit can show more; docs/ranges.md)",
                        0.0, MAX_AUDIT_EPSILON, min_open=True)
#: ``--runs``: ``[1, mechanisms.audit.MAX_AUDIT_RUNS]`` (about a microsecond and a half per run and histogram).
audit_runs = int_in(1, MAX_AUDIT_RUNS, "10^8 runs per histogram take a few minutes")
#: An exact pair epsilon below this share of the claim means the pair says little at this epsilon.
_TIGHT_SHARE = 0.25


def mechanism_name(value: str) -> str:
    """A mechanism with an audit case in :mod:`mechanisms.registry` (earlier names accepted), canonical name."""
    name = registry.ALIASES.get(value, value)
    if name not in registry.audit_names():
        raise argparse.ArgumentTypeError(f"unknown mechanism {value!r}; choose one of {', '.join(registry.audit_names())}")
    return name


def add_arguments(p) -> None:
    """``NAME`` and the claim, size, seed, noise-scale and confidence options."""
    p.add_argument("name", type=mechanism_name, metavar="NAME", help="one of: " + ", ".join(registry.audit_names()))
    add_option(p, "--step-epsilon", "--epsilon", metavar="E", type=audit_epsilon, default=None,
               help=f"the epsilon one run of the mechanism claims, in (0, {MAX_AUDIT_EPSILON:g}] (default: per "
                    "mechanism)")
    add_option(p, "--step-delta", "--delta", metavar="D", type=delta, default=None,
               help="the delta one run of the mechanism claims, in [1e-300, 1) (default: per mechanism, 1e-6 for "
                    "most; 0.05 for the GNMax cases, whose telling outcomes are too rare to measure at 1e-6)")
    p.add_argument("--runs", type=audit_runs, default=200_000,
                   help=f"runs on each histogram, at most {MAX_AUDIT_RUNS:.0e} (default 200000)")
    p.add_argument("--seed", type=nonnegative_int, default=None, help="seed (default: fresh OS entropy)")
    p.add_argument(
        "--noise-scale", type=scale, default=1.0,
        help="run a broken variant with its noise scaled by this factor in (0, 1] (0.5 = noise halved)",
    )
    p.add_argument("--confidence", type=open_unit, default=0.95, help="confidence of the bound (default 0.95)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")


def main(args: argparse.Namespace) -> int:
    """Audit the mechanism ``args.name``; 1 when the lower bound exceeds the claim."""
    import numpy as np

    from mechanisms import audit

    try:
        case = audit.audit_case(args.name, args.step_epsilon, args.step_delta, args.noise_scale)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        option = {"epsilon": "--step-epsilon", "delta": "--step-delta"}.get(message.split(" ", 1)[0])
        args.parser.error(f"argument {option}: {message}" if option else message)
    rng = np.random.default_rng(args.seed)
    result = audit.run_audit_case(case, args.runs, rng, confidence=args.confidence)
    exact = audit.exact_pair_epsilon(case.mechanism, case.histogram, case.neighbour, case.claimed_delta)
    notes = audit_notes(case, exact, args.runs, args.confidence)
    payload = {
        "mechanism": args.name,
        "noise_scale": args.noise_scale,
        "seeded": args.seed is not None,  # the seed itself is never printed
        "pair": {"histogram": case.histogram.as_dict(), "neighbour": case.neighbour.as_dict(),
                 "num_teachers": case.histogram.num_teachers, "note": case.note},
        "exact_pair_epsilon": exact,
        **result.as_dict(),
        "notes": notes,
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
        for note in notes:
            print(f"  note            : {note}")
    return 1 if result.violation else 0


def audit_notes(case, exact: float, runs: int, confidence: float) -> list[str]:
    """What limits this audit's reach, in words (empty when nothing does): a claim above what ``runs`` runs can
    ever show, and a pair that is far from tight at this epsilon (its exact epsilon far below the claim)."""
    from mechanisms import audit

    notes = []
    reach = audit.largest_showable_epsilon(runs, confidence)
    if case.claimed_epsilon >= reach:
        notes.append(f"{runs} runs per histogram cannot show an epsilon above about {reach:.2f}, so no violation of "
                     f"the claim {case.claimed_epsilon:g} can be caught: use more --runs")
    if exact < _TIGHT_SHARE * case.claimed_epsilon:
        notes.append(f"the pair is not tight at this epsilon (exact pair epsilon {exact:.4f} against the claim "
                     f"{case.claimed_epsilon:g}: the probability that moves is below delta), so this audit says little "
                     "about the claim")
    return notes
