"""Speed and memory of the coordinated (Hot PATE) vote kernel; run by hand, not by pytest.

    .venv/bin/python benchmarks/bench_votes.py            # full run (a few minutes at most)
    .venv/bin/python benchmarks/bench_votes.py --quick    # smoke test, a few seconds
    .venv/bin/python benchmarks/bench_votes.py --json     # JSON object on stdout (table on stderr)

What it measures (docs/performance.md has the figures and the targets):

* Workload A: ``pooled_supports(512, 49_152, pool_size=3000, support_size=300)``, 1,000 samples.
  ``coordinated_votes``: the first call (it builds the cached plan) and the median of ``--repeats``
  calls after it; ``independent_votes``: median of ``--repeats`` calls.  The literal dense algorithm
  (``literal_coordinated_votes``: the full ``n x V`` matrix divided by the noise row, one sample at a
  time) is timed on ``--literal-samples`` samples only and its per-sample cost extrapolated to 1,000
  samples; on those samples, with the same noise, ``coordinated_votes_from_noise`` must return exactly
  the literal votes.
* Memory of the coordinated call: ``tracemalloc`` peak (numpy reports its buffers to tracemalloc) from
  the start of the call, and the process ``ru_maxrss``.
* Workload B: ``pooled_supports(10_000, 128_000, ...)``, 1,000 samples: first call (plan included),
  one call with the plan cached, and the tracemalloc peak of a first call.

Each part runs in its own child process (``--phase``), so that ``ru_maxrss`` (a process high-water
mark) belongs to that part alone: the literal algorithm's dense matrices do not inflate the figures of
the coordinated kernel.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import ensembles  # noqa: E402
from ensembles.histograms import literal_coordinated_votes  # noqa: E402
from ensembles.synthetic import pooled_supports  # noqa: E402

MB = 1 << 20

FULL = {
    "a": {"num_teachers": 512, "vocab_size": 49_152, "num_samples": 1_000, "pool_size": 3_000, "support_size": 300},
    "b": {"num_teachers": 10_000, "vocab_size": 128_000, "num_samples": 1_000, "pool_size": 3_000, "support_size": 300},
    "literal_samples": 20,
}
QUICK = {
    "a": {"num_teachers": 64, "vocab_size": 4_096, "num_samples": 100, "pool_size": 1_000, "support_size": 100},
    "b": {"num_teachers": 512, "vocab_size": 16_384, "num_samples": 100, "pool_size": 1_000, "support_size": 100},
    "literal_samples": 5,
}
TARGET_SPEEDUP = 200.0
TARGET_A_PEAK_BYTES = 1 << 30  # 1 GiB
TARGET_B_SECONDS = 60.0


# --------------------------------------------------------------------------------------------------
# Helpers


def max_rss_bytes() -> int:
    """Process high-water resident set size (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(value) if sys.platform == "darwin" else int(value) * 1024


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def traced_peak(fn, *args) -> int:
    """Peak bytes traced by tracemalloc while ``fn`` runs (allocations made during the call only)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn(*args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return int(peak)


def make_teachers(spec: dict, seed: int):
    rng = np.random.default_rng(seed)
    return pooled_supports(
        spec["num_teachers"],
        spec["vocab_size"],
        rng,
        pool_size=spec["pool_size"],
        support_size=spec["support_size"],
    )


def stored_entries(teachers) -> int:
    return int(np.asarray(teachers.support_sizes).sum())


def machine_facts() -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "date": datetime.date.today().isoformat(),
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": load,
    }


# --------------------------------------------------------------------------------------------------
# Phases (each run in its own child process)


def phase_a_coordinated(cfg: dict) -> dict:
    spec, seed, repeats = cfg["a"], cfg["seed"], cfg["repeats"]
    n_samples = spec["num_samples"]
    teachers = make_teachers(spec, seed)
    rss_before = max_rss_bytes()
    rng = np.random.default_rng(seed + 1)

    first, votes = timed(ensembles.coordinated_votes, teachers, n_samples, rng)  # warm-up: builds the plan
    assert votes.shape == (n_samples, teachers.num_teachers)
    runs = [timed(ensembles.coordinated_votes, teachers, n_samples, rng)[0] for _ in range(repeats)]
    single = [
        timed(lambda: ensembles.coordinated_votes(teachers, n_samples, rng, num_threads=1))[0] for _ in range(repeats)
    ]
    rss_after = max_rss_bytes()

    peak_cached = traced_peak(ensembles.coordinated_votes, teachers, n_samples, rng)
    fresh = make_teachers(spec, seed)  # same teachers, empty plan cache
    peak_first = traced_peak(ensembles.coordinated_votes, fresh, n_samples, rng)
    del fresh

    independent = [timed(ensembles.independent_votes, teachers, n_samples, rng)[0] for _ in range(repeats)]
    return {
        "stored_entries": stored_entries(teachers),
        "coordinated_first_s": first,
        "coordinated_runs_s": runs,
        "coordinated_median_s": statistics.median(runs),
        "coordinated_threads": ensembles.histograms._threads(None),
        "coordinated_single_thread_runs_s": single,
        "coordinated_single_thread_median_s": statistics.median(single),
        "independent_runs_s": independent,
        "independent_median_s": statistics.median(independent),
        "tracemalloc_peak_cached_plan_bytes": peak_cached,
        "tracemalloc_peak_first_call_bytes": peak_first,
        "max_rss_before_calls_bytes": rss_before,
        "max_rss_after_coordinated_bytes": rss_after,
    }


def phase_a_literal(cfg: dict) -> dict:
    spec, seed, repeats, k = cfg["a"], cfg["seed"], cfg["repeats"], cfg["literal_samples"]
    teachers = make_teachers(spec, seed)
    rng = np.random.default_rng(seed + 2)
    noise = rng.standard_exponential((k, teachers.vocab_size))
    tail_noise = rng.standard_exponential(k)

    dense_runs = [timed(teachers.to_dense)[0] for _ in range(repeats)]
    literal_runs = []
    literal = None
    for _ in range(repeats):
        seconds, literal = timed(literal_coordinated_votes, teachers, noise, tail_noise)
        literal_runs.append(seconds)
    fast_runs = []
    fast = None
    for _ in range(repeats):
        seconds, fast = timed(ensembles.coordinated_votes_from_noise, teachers, noise, tail_noise)
        fast_runs.append(seconds)
    literal_peak = traced_peak(literal_coordinated_votes, teachers, noise, tail_noise)

    literal_median = statistics.median(literal_runs)
    dense_median = statistics.median(dense_runs)
    # Per-sample cost with the one-off dense-matrix build taken out (conservative: the literal
    # algorithm is charged the build once for the whole extrapolated run).
    per_sample = max(0.0, literal_median - dense_median) / k
    return {
        "samples": k,
        "to_dense_median_s": dense_median,
        "literal_runs_s": literal_runs,
        "literal_median_s": literal_median,
        "literal_per_sample_s": per_sample,
        "literal_tracemalloc_peak_bytes": literal_peak,
        "from_noise_median_s": statistics.median(fast_runs),
        "votes_identical": bool(np.array_equal(fast, literal)),
        "votes_compared": int(literal.size),
        "votes_differing": int((fast != literal).sum()),
    }


def phase_b(cfg: dict) -> dict:
    spec, seed = cfg["b"], cfg["seed"]
    n_samples = spec["num_samples"]
    start = time.perf_counter()
    teachers = make_teachers(spec, seed)
    build = time.perf_counter() - start
    rss_before = max_rss_bytes()
    rng = np.random.default_rng(seed + 1)

    first, votes = timed(ensembles.coordinated_votes, teachers, n_samples, rng)
    assert votes.shape == (n_samples, teachers.num_teachers)
    del votes
    rss_after_first = max_rss_bytes()
    cached, _ = timed(ensembles.coordinated_votes, teachers, n_samples, rng)
    rss_after = max_rss_bytes()

    del teachers
    fresh = make_teachers(spec, seed)
    peak_first = traced_peak(ensembles.coordinated_votes, fresh, n_samples, rng)
    peak_cached = traced_peak(ensembles.coordinated_votes, fresh, n_samples, rng)
    return {
        "stored_entries": stored_entries(fresh),
        "teachers_build_s": build,
        "coordinated_first_s": first,
        "coordinated_cached_s": cached,
        "tracemalloc_peak_first_call_bytes": peak_first,
        "tracemalloc_peak_cached_plan_bytes": peak_cached,
        "output_bytes": n_samples * spec["num_teachers"] * 8,
        "dense_matrix_bytes": spec["num_teachers"] * spec["vocab_size"] * 8,
        "max_rss_before_calls_bytes": rss_before,
        "max_rss_after_first_bytes": rss_after_first,
        "max_rss_after_coordinated_bytes": rss_after,
    }


PHASES = {"a_coordinated": phase_a_coordinated, "a_literal": phase_a_literal, "b": phase_b}


def run_phase(name: str, cfg: dict, isolate: bool) -> dict:
    if not isolate:
        return PHASES[name](cfg)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--phase-config", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"phase {name} failed with exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# Report


def summarise(cfg: dict, a: dict, lit: dict, b: dict) -> dict:
    n_a = cfg["a"]["num_samples"]
    literal_extrapolated = lit["to_dense_median_s"] + lit["literal_per_sample_s"] * n_a
    speedup = literal_extrapolated / a["coordinated_median_s"]
    speedup_first = literal_extrapolated / a["coordinated_first_s"]
    a_peak = max(a["tracemalloc_peak_first_call_bytes"], a["tracemalloc_peak_cached_plan_bytes"])
    return {
        "literal_extrapolated_s": literal_extrapolated,
        "speedup_vs_literal": speedup,
        "speedup_vs_literal_first_call": speedup_first,
        "targets": {
            "a_speedup_ge_200": {"target": TARGET_SPEEDUP, "measured": speedup, "met": speedup >= TARGET_SPEEDUP},
            "a_tracemalloc_peak_lt_1GiB": {
                "target": TARGET_A_PEAK_BYTES,
                "measured": a_peak,
                "met": a_peak < TARGET_A_PEAK_BYTES,
            },
            "a_max_rss_lt_1GiB": {
                "target": TARGET_A_PEAK_BYTES,
                "measured": a["max_rss_after_coordinated_bytes"],
                "met": a["max_rss_after_coordinated_bytes"] < TARGET_A_PEAK_BYTES,
            },
            "b_first_call_lt_60s": {
                "target": TARGET_B_SECONDS,
                "measured": b["coordinated_first_s"],
                "met": b["coordinated_first_s"] < TARGET_B_SECONDS,
            },
            "literal_votes_identical": {"target": True, "measured": lit["votes_identical"], "met": lit["votes_identical"]},
        },
    }


def render(result: dict) -> str:
    m, cfg, a, lit, b, s = (result[k] for k in ("machine", "config", "a", "a_literal", "b", "summary"))
    sa, sb = cfg["a"], cfg["b"]
    lines = []
    add = lines.append
    add(f"bench_votes  ({'quick' if cfg['quick'] else 'full'} run, {m['date']})")
    add(f"  machine : {m['nproc']} usable cores (cpu_count {m['cpu_count']}), {m['cpu_model'] or 'unknown CPU'}")
    add(f"            numpy {m['numpy']}, Python {m['python']}, load average at start {m['loadavg_at_start']}")
    add(f"  repeats : median of {cfg['repeats']} runs unless said otherwise; seed {cfg['seed']}")
    add("")

    def fmt_mb(x):
        return f"{x / MB:,.1f} MiB"

    rows = []
    wa = f"A: n={sa['num_teachers']:,} V={sa['vocab_size']:,} S={sa['num_samples']:,} support~{sa['support_size']}/pool {sa['pool_size']:,}"
    add(wa + f"  ({a['stored_entries']:,} stored entries)")
    rows.append(("coordinated_votes, first call (builds plan)", f"{a['coordinated_first_s']:.3f} s"))
    rows.append(("coordinated_votes, median (plan cached)", f"{a['coordinated_median_s']:.3f} s   runs " + ", ".join(f"{x:.3f}" for x in a["coordinated_runs_s"])))
    rows.append(("  per sample", f"{a['coordinated_median_s'] / sa['num_samples'] * 1e3:.3f} ms"))
    rows.append((
        "coordinated_votes, num_threads=1, median",
        f"{a['coordinated_single_thread_median_s']:.3f} s   (default uses {a['coordinated_threads']} threads)",
    ))
    rows.append(("independent_votes, median", f"{a['independent_median_s']:.3f} s   runs " + ", ".join(f"{x:.3f}" for x in a["independent_runs_s"])))
    rows.append((f"literal (dense), {lit['samples']} samples, median", f"{lit['literal_median_s']:.3f} s   runs " + ", ".join(f"{x:.3f}" for x in lit["literal_runs_s"])))
    rows.append(("  of which to_dense() build (one-off)", f"{lit['to_dense_median_s']:.3f} s"))
    rows.append(("  per sample (build excluded)", f"{lit['literal_per_sample_s'] * 1e3:.1f} ms"))
    rows.append((f"  extrapolated to {sa['num_samples']:,} samples", f"{s['literal_extrapolated_s']:.1f} s"))
    rows.append(("speed-up vs literal (median coordinated)", f"{s['speedup_vs_literal']:.0f}x"))
    rows.append(("speed-up vs literal (first call incl. plan)", f"{s['speedup_vs_literal_first_call']:.0f}x"))
    rows.append((f"coordinated_votes_from_noise == literal ({lit['samples']} samples)",
                 f"{'IDENTICAL' if lit['votes_identical'] else 'DIFFERENT'} ({lit['votes_differing']} of {lit['votes_compared']:,} votes differ)"))
    rows.append(("  coordinated_votes_from_noise time, same samples", f"{lit['from_noise_median_s'] * 1e3:.1f} ms"))
    rows.append(("tracemalloc peak, coordinated first call", fmt_mb(a["tracemalloc_peak_first_call_bytes"])))
    rows.append(("tracemalloc peak, coordinated (plan cached)", fmt_mb(a["tracemalloc_peak_cached_plan_bytes"])))
    rows.append(("max RSS before calls / after coordinated", f"{fmt_mb(a['max_rss_before_calls_bytes'])} / {fmt_mb(a['max_rss_after_coordinated_bytes'])}"))
    rows.append((f"tracemalloc peak, literal ({lit['samples']} samples)", fmt_mb(lit["literal_tracemalloc_peak_bytes"])))
    width = max(len(r[0]) for r in rows) + 2
    lines.extend(f"  {k:<{width}}{v}" for k, v in rows)
    add("")

    rows = []
    add(f"B: n={sb['num_teachers']:,} V={sb['vocab_size']:,} S={sb['num_samples']:,} support~{sb['support_size']}/pool {sb['pool_size']:,}  ({b['stored_entries']:,} stored entries)")
    rows.append(("pooled_supports build (not in the call)", f"{b['teachers_build_s']:.2f} s"))
    rows.append(("coordinated_votes, first call (builds plan)", f"{b['coordinated_first_s']:.2f} s"))
    rows.append(("coordinated_votes, second call (plan cached)", f"{b['coordinated_cached_s']:.2f} s"))
    rows.append(("tracemalloc peak, first call", fmt_mb(b["tracemalloc_peak_first_call_bytes"])))
    rows.append(("tracemalloc peak, plan cached", fmt_mb(b["tracemalloc_peak_cached_plan_bytes"])))
    rows.append(("  of which the returned votes (S x n int64)", fmt_mb(b["output_bytes"])))
    rows.append(("  for scale: one dense n x V float64 matrix", fmt_mb(b["dense_matrix_bytes"])))
    rows.append(("max RSS before calls / after both calls", f"{fmt_mb(b['max_rss_before_calls_bytes'])} / {fmt_mb(b['max_rss_after_coordinated_bytes'])}"))
    width = max(len(r[0]) for r in rows) + 2
    lines.extend(f"  {k:<{width}}{v}" for k, v in rows)
    add("")

    add("targets" + ("  (they apply to the full sizes; --quick is a smoke test only)" if cfg["quick"] else ""))
    t = s["targets"]
    add(f"  A speed-up >= 200x              : {t['a_speedup_ge_200']['measured']:.0f}x  -> {'met' if t['a_speedup_ge_200']['met'] else 'NOT MET'}")
    add(f"  A tracemalloc peak < 1 GiB      : {fmt_mb(t['a_tracemalloc_peak_lt_1GiB']['measured'])}  -> {'met' if t['a_tracemalloc_peak_lt_1GiB']['met'] else 'NOT MET'}")
    add(f"  A max RSS < 1 GiB               : {fmt_mb(t['a_max_rss_lt_1GiB']['measured'])}  -> {'met' if t['a_max_rss_lt_1GiB']['met'] else 'NOT MET'}")
    add(f"  B first call < 60 s             : {t['b_first_call_lt_60s']['measured']:.2f} s  -> {'met' if t['b_first_call_lt_60s']['met'] else 'NOT MET'}")
    add(f"  literal votes reproduced exactly: {'yes' if t['literal_votes_identical']['met'] else 'NO'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds (smoke test)")
    parser.add_argument("--json", action="store_true", help="print a JSON object on stdout (the table goes to stderr)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the teachers and the noise (default 0)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per median (default 3)")
    parser.add_argument("--literal-samples", type=int, default=None, help="samples for the literal algorithm (default 20; 5 with --quick)")
    parser.add_argument("--no-isolate", action="store_true", help="run every part in this process (max RSS then mixes parts)")
    parser.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--phase-config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase:
        result = PHASES[args.phase](json.loads(args.phase_config))
        print(json.dumps(result))
        return 0

    sizes = QUICK if args.quick else FULL
    cfg = {
        "quick": args.quick,
        "seed": args.seed,
        "repeats": max(1, args.repeats),
        "a": sizes["a"],
        "b": sizes["b"],
        "literal_samples": args.literal_samples or sizes["literal_samples"],
        "isolated_processes": not args.no_isolate,
    }
    machine = machine_facts()
    start = time.perf_counter()
    a = run_phase("a_coordinated", cfg, not args.no_isolate)
    lit = run_phase("a_literal", cfg, not args.no_isolate)
    b = run_phase("b", cfg, not args.no_isolate)
    result = {"machine": machine, "config": cfg, "a": a, "a_literal": lit, "b": b}
    result["summary"] = summarise(cfg, a, lit, b)
    result["wall_s"] = time.perf_counter() - start
    table = render(result) + f"\n\n(total wall time {result['wall_s']:.1f} s)"
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(result, indent=2))
    else:
        print(table)
    return 0 if result["summary"]["targets"]["literal_votes_identical"]["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
