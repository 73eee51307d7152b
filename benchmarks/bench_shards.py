"""Per-step cost of teacher shards (ensembles/backends/sharded.py): one backend vs 1/2/4 in-process shards vs
Ray actors, on the tiny random Llama of bench_backend.py (docs/distributed.md).

    python benchmarks/bench_shards.py                      # 64 teachers x ~300 tokens, 16 steps
    python benchmarks/bench_shards.py --teachers 32 --steps 8 --no-ray
    python benchmarks/bench_shards.py --json               # one JSON object on stdout, the table on stderr

A step is what the generator asks of the backend per charged run: ``votes(key)`` at temperature 0.7 and
top-p 0.9 (on every shard's device, ``n`` int32 back), ``append(token)`` and ``decode(tokens so far)``.
In-process shards share one model (loaded once) and run one after the other (``seq``) or each from its own
thread (``threads``); Ray shards are actors of a local cluster that each build the model from the same seed.
Also measured: the local cluster's start (``ray.init``), the actors' start (process, imports, model), and
the round trip of an empty fan-out (``active_teachers`` on every shard: the executor's fixed cost per call).
Every configuration must give the unsharded votes (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ensembles.backends.sharded import (
    BackendSpec,
    InProcessExecutor,
    RayExecutor,
    ShardedBackend,
)
from ensembles.backends.transformers_backend import TransformersBackend
from ensembles.keyed_votes import StepKey

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent


def tiny_backend(threads: int, batch_size: int = 32, model=None, tokenizer=None):
    """The tiny random Llama of bench_backend.py (seeded: every worker builds identical weights), or a backend on
    an already-loaded ``model`` (shared by in-process shards)."""
    from bench_backend import tiny_model

    if model is None:
        model, tokenizer = tiny_model(1024)
    return TransformersBackend(model, tokenizer, threads=threads, batch_size=batch_size)


def workload(vocab: int, teachers: int, prefix_len: int, prompt_len: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, vocab, prefix_len).tolist()
    prompts = [rng.integers(3, vocab, prompt_len + int(rng.integers(-prompt_len // 4, prompt_len // 4 + 1))).tolist()
               for _ in range(teachers)]
    return prefix, prompts, rng.integers(3, vocab, steps).tolist()


def fan_out_round_trip(backend, repeats: int = 50) -> float:
    """Median seconds of one empty call on every shard at once (the executor's own cost)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend._fan_out("active_teachers", {k: () for k in range(backend.num_shards)})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(backend, prefix, prompts, released) -> tuple[dict, list]:
    t0 = time.perf_counter()
    backend.begin(prompts, shared_prefix=prefix)
    begin = time.perf_counter() - t0
    votes, times, tokens = [], [], []
    for step, token in enumerate(released):
        t0 = time.perf_counter()
        votes.append(backend.votes(StepKey(1, step), temperature=0.7, top_p=0.9))
        backend.append(token)
        tokens.append(token)
        backend.decode(tokens)
        times.append(time.perf_counter() - t0)
    return {"begin_s": begin, "step_ms": 1e3 * statistics.median(times)}, votes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=100, help="shared prefix tokens")
    parser.add_argument("--prompt", type=int, default=200, help="own prompt tokens per teacher (+-25%%)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in this process (Ray: split per actor)")
    parser.add_argument("--ray-workers", type=int, default=2, help="Ray actors (default 2)")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print

    base = tiny_backend(args.threads)
    prefix, prompts, released = workload(base.vocab_size, args.teachers, args.prefix, args.prompt, args.steps)
    rows, ok = [], True
    reference, want = run(base, prefix, prompts, released)
    rows.append({"config": "unsharded", **reference})
    for shards in (1, 2, 4):
        for parallel in (False, True):
            if shards == 1 and parallel:
                continue
            spec = BackendSpec(tiny_backend, args.threads, model=base.model, tokenizer=base.tokenizer)
            with ShardedBackend(spec, shards, executor=InProcessExecutor(parallel=parallel)) as sharded:
                row, got = run(sharded, prefix, prompts, released)
                row["fan_out_ms"] = 1e3 * fan_out_round_trip(sharded)
            ok &= all(np.array_equal(a, b) for a, b in zip(got, want))
            rows.append({"config": f"in-process x{shards} {'threads' if parallel else 'seq'}", **row})
    ray_info = {}
    if not args.no_ray:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"PYTHONPATH": str(HERE), "HF_HUB_OFFLINE": "1"}})
        ray_info["ray_init_s"] = time.perf_counter() - t0
        try:
            threads = max(1, args.threads // args.ray_workers)
            t0 = time.perf_counter()
            with ShardedBackend(BackendSpec(tiny_backend, threads), args.ray_workers, executor=RayExecutor()) as sharded:
                ray_info["actors_start_s"] = time.perf_counter() - t0
                row, got = run(sharded, prefix, prompts, released)
                row["fan_out_ms"] = 1e3 * fan_out_round_trip(sharded)
            ok &= all(np.array_equal(a, b) for a, b in zip(got, want))
            rows.append({"config": f"ray x{args.ray_workers} actors ({threads} thread each)", **row})
        finally:
            t0 = time.perf_counter()
            ray.shutdown()
            ray_info["ray_shutdown_s"] = time.perf_counter() - t0

    out = {
        "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "loadavg": [round(x, 2) for x in os.getloadavg()], "teachers": args.teachers,
        "context": args.prefix + args.prompt, "steps": args.steps, "threads": args.threads,
        "rows": rows, **ray_info, "votes_equal": bool(ok),
    }
    say(f"{args.teachers} teachers x ~{args.prefix + args.prompt} tokens, {args.steps} steps, tiny Llama, "
        f"{out['machine']}, load {out['loadavg']}, {out['date']}")
    say(f"{'configuration':<36} {'begin s':>8} {'step ms':>8} {'fan-out ms':>11}")
    for r in rows:
        fan = f"{r['fan_out_ms']:.2f}" if "fan_out_ms" in r else "-"
        say(f"{r['config']:<36} {r['begin_s']:>8.2f} {r['step_ms']:>8.1f} {fan:>11}")
    if ray_info:
        say(f"Ray: local cluster start {ray_info['ray_init_s']:.1f} s, actors start {ray_info['actors_start_s']:.1f} s, "
            f"shutdown {ray_info['ray_shutdown_s']:.1f} s")
    say(f"votes equal to the unsharded backend's: {ok}")
    if args.json:
        print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
