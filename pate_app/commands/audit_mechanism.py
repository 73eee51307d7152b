"""``pate-accountant audit-mechanism NAME``: an empirical lower bound on a mechanism's epsilon
(docs/mechanisms/audit.md)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from mechanisms import audit, registry
from pate_app.options import nonnegative_int, open_unit, positive_float, positive_int, scale

NAME = "audit-mechanism"
HELP = "empirically lower-bound a mechanism's epsilon on a worst-case neighbouring pair"
DESCRIPTION = (
    "Run a mechanism many times on a neighbouring pair of histograms where its privacy claim is "
    "tight, and report a Clopper-Pearson lower bound on its epsilon (docs/mechanisms/audit.md). "
    "Exit status 1 when the bound exceeds the claimed epsilon."
)


def mechanism_name(value: str) -> str:
    """A mechanism with an audit case in :mod:`mechanisms.registry` (earlier names accepted), canonical name."""
    name = registry.ALIASES.get(value, value)
    if name not in registry.audit_names():
        raise argparse.ArgumentTypeError(f"unknown mechanism {value!r}; choose one of {', '.join(registry.audit_names())}")
    return name


def add_arguments(p) -> None:
    """``NAME`` and the claim, size, seed, noise-scale and confidence options."""
    p.add_argument("name", type=mechanism_name, metavar="NAME", help="one of: " + ", ".join(registry.audit_names()))
    p.add_argument("--epsilon", type=positive_float, default=None, help="claimed total epsilon (default: per mechanism)")
    p.add_argument("--delta", type=open_unit, default=None, help="claimed total delta (default 1e-6 where used)")
    p.add_argument("--runs", type=positive_int, default=200_000, help="runs on each histogram (default 200000)")
    p.add_argument("--seed", type=nonnegative_int, default=None, help="seed (default: fresh OS entropy)")
    p.add_argument(
        "--noise-scale", type=scale, default=1.0,
        help="run a broken variant with its noise scaled by this factor in (0, 1] (0.5 = noise halved)",
    )
    p.add_argument("--confidence", type=open_unit, default=0.95, help="confidence of the bound (default 0.95)")
    p.add_argument("--json", action="store_true", help="print only a JSON result")


def main(args: argparse.Namespace) -> int:
    """Audit the mechanism ``args.name``; 1 when the lower bound exceeds the claim."""
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
