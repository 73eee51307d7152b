"""Private tokens per budget epsilon, run until refusal, Hot/Cold PATE beside the peers: the figures of
docs/results.md (section tokens-per-epsilon), with the command that made them and the machine's load.

Run: ``.venv/bin/python benchmarks/bench_tokens_per_epsilon.py`` (the quick size, under a minute), ``--full``
(the full size: n = 4,000 teachers, alpha in {0.95, 0.7, 0.5, 0.3}, budgets epsilon in {1, 3, 8, 10} at delta
1e-6, a cap of 20,000 steps; tens of minutes on a shared 2-core CPU), or ``--from results/tokens-per-epsilon/
tokens-per-epsilon.json`` to print the figures of a run that ``pate-accountant experiment tokens-per-epsilon``
already wrote.  It prints, per budget, one Markdown table of private tokens per budget epsilon (rows x alpha;
``>`` marks a count that stopped at the step cap, a lower bound; ``*`` a configuration below the precision
floor), then per budget and alpha which row wins, and the run's machine line.  Not a test: the runtimes
depend on the machine and its load (docs/performance.md); the token counts do not (fixed seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pate_app.experiments import tokens_per_epsilon as tpe


def cell(entry: dict) -> str:
    mark = ">" if entry["capped"] else ""
    floor = "" if entry["admissible"] else "*"
    return f"{mark}{entry['tokens_per_epsilon']:,.1f}{floor}"


def tables(result: dict) -> list[str]:
    p = result["parameters"]
    alphas, lines = p["alphas"], []
    for eps in p["budgets"]:
        lines += ["", (f"budget epsilon {eps:g}, delta {p['budget_delta']:g} ({p['relation']}): private tokens per "
                      "budget epsilon"), "",
                  "| row | " + " | ".join(f"alpha {a:g}" for a in alphas) + " |",
                  "|---|" + "---:|" * len(alphas)]
        for name in p["rows"]:
            by_alpha = {r["alpha"]: r for r in result["results"] if r["row"] == name and r["budget_epsilon"] == eps}
            label = f"`{name}`" + ("" if by_alpha and next(iter(by_alpha.values()))["published"] else " (beyond published)")
            lines.append(f"| {label} | " + " | ".join(cell(by_alpha[a]) if a in by_alpha else "-" for a in alphas) + " |")
    return lines


def verdicts(result: dict) -> list[str]:
    lines = ["", "winners (best Hot/Cold PATE row against the best peer; a count at the cap is a lower bound):"]
    for c in result["comparison"]:
        lines.append(f"  eps={c['budget_epsilon']:g} alpha={c['alpha']:g}: best PATE {c['best_pate']}; "
                     f"published peers -> {c['winner_published']} ({c['best_published_peer']}); "
                     f"all peers -> {c['winner']} ({c['best_peer']})")
    return lines


def details(result: dict) -> list[str]:
    """Per setting, the winning Hot/Cold row's and the best peer's columns beyond the count."""
    lines = ["", ("per setting: row, tokens, tokens/record, forward passes per token, precision, distinct-1/2, "
                 "distinct tokens, stop, ledgers verified, chosen parameters")]
    for c in result["comparison"]:
        for name in (c["best_pate"], c["best_peer"]):
            r = next(x for x in result["results"] if x["row"] == name and x["alpha"] == c["alpha"]
                     and x["budget_epsilon"] == c["budget_epsilon"])
            d1 = "-" if r["distinct_1"] is None else f"{r['distinct_1']:.3f}"
            d2 = "-" if r["distinct_2"] is None else f"{r['distinct_2']:.3f}"
            prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
            ppt = "-" if r["passes_per_token"] is None else f"{r['passes_per_token']:.3g}"
            lines.append(f"  eps={c['budget_epsilon']:g} alpha={c['alpha']:g} {name}: {'>' if r['capped'] else ''}"
                         f"{r['private_tokens']:,} tokens, {r['tokens_per_record']:.3f}/record, {ppt} passes/token, "
                         f"precision {prec}, d1 {d1}, d2 {d2}, {r['distinct_tokens']} distinct, {r['stop']}, "
                         f"{r['ledgers']} ledger(s) {'verified' if r['ledgers_verified'] else 'NOT verified'}, "
                         f"{tpe._params(r['params'])}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the full size (tens of minutes)")
    size.add_argument("--from", dest="source", metavar="JSON", help="print the figures of an existing result file")
    args = parser.parse_args(argv)
    if args.source:
        result = json.loads(Path(args.source).read_text(encoding="utf-8"))
        command = f"pate-accountant experiment tokens-per-epsilon{'' if not result['quick'] else ' --quick'} --plot"
    else:
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} before, {os.cpu_count()} cpus", flush=True)
        started = time.time()
        result = tpe.run(quick=not args.full, progress=False)
        print(f"ran in {time.time() - started:.1f} s wall; load average {os.getloadavg()[0]:.2f} after")
        command = f"pate-accountant experiment tokens-per-epsilon{'' if args.full else ' --quick'} --plot"
    m = result["machine"]
    print(f"command: {command}")
    print(f"machine: {m['cpus']} CPUs, load average {m['load_average_before'][0]:.2f} before the run, "
          f"{m['wall_seconds']} s wall, {m['cpu_seconds']} s CPU")
    p = result["parameters"]
    print(f"world: n = {p['teachers']} teachers (one record each), K = {p['common']} common tokens, public pool "
          f"{p['pool']}, cap {p['cap']:,} steps, precision floor {p['min_precision']:g}")
    print("\n".join(tables(result) + verdicts(result) + details(result)))
    print()
    print("\n".join(f"[{'ok' if c['holds'] else 'FAILS'}] {c['claim']}: {c['detail']}" for c in result["claims"]))


if __name__ == "__main__":
    main()
