"""Private tokens per epsilon on the real model: the embedded SmolLM2 on the bundled sample, run until the budget
is spent (issue 23, item 5; the synthetic sweep is ``pate-accountant experiment tokens-per-epsilon``).

Each configuration is one :class:`pate_app.spec.RunSpec` run through :func:`pate_app.run.synthesize`, on a fresh
ledger in a temporary ledger home, with more records requested than the budget pays for, so that the run stops by
refusal.  Printed per configuration: private tokens per budget epsilon and per record of the data set, teacher
forward passes per private token, distinct-1/2 of the generated records, the audit verdict and the wall time.

    .venv/bin/python benchmarks/bench_real_model_tokens.py [--teachers 192] [--groups 2] [--budget-epsilon 10]
        [--quick]

``--quick`` (48 teachers, budget epsilon 2) checks the script in a few minutes; the figures in docs/results.md
come from the full run.  Noise comes from the operating system (no seed): figures vary from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pate_app.run import synthesize  # noqa: E402
from pate_app.spec import RunInputError, RunSpec  # noqa: E402

RECORDS_IN_SAMPLE = 201


def configurations(teachers: int, groups: int) -> dict[str, dict]:
    """The rows: thresholded GNMax under PLD, with and without groups, with and without a public top-50 support."""
    base = {"mechanism": "gaussian-threshold-argmax", "accountant": "pld", "step_epsilon": 0.5, "step_delta": 1e-7}
    return {
        f"gnmax-threshold, {teachers} teachers": {**base, "teachers": teachers, "public_top_k": 50},
        f"gnmax-threshold, {groups} groups of {teachers // groups}": {**base, "teachers": teachers, "groups": groups,
                                                                        "public_top_k": 50},
        f"gnmax-threshold, {groups} groups, no support": {**base, "teachers": teachers, "groups": groups},
    }


def distinct(texts: list[str], order: int) -> float | None:
    grams = [tuple(words[i:i + order]) for text in texts for words in [text.split()]
             for i in range(len(words) - order + 1)]
    return len(set(grams)) / len(grams) if grams else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, default=192)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--budget-epsilon", type=float, default=10.0)
    parser.add_argument("--budget-delta", type=float, default=1e-6)
    parser.add_argument("--records", type=int, default=200, help="requested: more than the budget pays for")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help="run only the configurations whose name contains this")
    args = parser.parse_args()
    if args.quick:
        args.teachers, args.budget_epsilon, args.records = 48, 2.0, 40
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs; budget ({args.budget_epsilon:g}, {args.budget_delta:g}), replace-one")
    for name, options in configurations(args.teachers, args.groups).items():
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "records.jsonl"
            spec = RunSpec(data="bundled", budget_epsilon=args.budget_epsilon, budget_delta=args.budget_delta,
                           records=args.records, max_tokens=24, out=str(out), ledger=str(Path(folder) / "l.sqlite"),
                           threads=1, **options)
            started = time.perf_counter()
            try:
                result = synthesize(spec, ledger_home=Path(folder) / "home")
            except RunInputError as exc:  # noise that decides the releases: refused before anything runs
                print(f"{name}: refused: {exc}")
                continue
            wall = time.perf_counter() - started
            texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
        private = result["private_tokens"]
        per_step = spec.teachers // spec.groups  # one group's teachers answer each charged step
        forward = result["charged_runs"] * per_step / private if private else None
        d1, d2 = distinct(texts, 1), distinct(texts, 2)
        print(f"{name}: {private} private tokens ({result['fallback_tokens']} public) for epsilon "
              f"{result['spent']['epsilon']:.3f} of {args.budget_epsilon:g}: "
              f"{private / args.budget_epsilon:.1f} per budget epsilon, "
              f"{private / args.budget_epsilon / RECORDS_IN_SAMPLE:.3f} per epsilon per record; "
              f"{'-' if forward is None else f'{forward:.0f}'} teacher forward passes per private token; "
              f"{len(texts)} complete records, distinct-1 {d1 or 0:.2f}, distinct-2 {d2 or 0:.2f}; "
              f"audit {'OK' if result['audit']['ok'] else 'FAILED'}; {wall:.0f} s")


if __name__ == "__main__":
    main()
