"""The exponential-race vote kernel against the float64 probability form (docs/performance.md, "Vote kernel on
logits").

For ``n`` teachers x ``V`` tokens of random logits and shared noise keyed by token id, times
(a) the probability form of Algorithm 1 in float64: softmax, then ``argmax_j p_ij / u_j``;
(b) :func:`ensembles.keyed_votes.race_votes` in float32: ``argmax_j (logit_ij / T - log u_j)``;
(c) the same race with the top-p cut and the tail vote,
(d) the device kernel (:func:`ensembles.backends.device_votes.device_votes`, torch on the CPU here), dense and
with top-p, what ``TransformersBackend.votes`` runs,
and counts how many votes (a) and (b) share.  Usage: ``python benchmarks/bench_race_votes.py [--teachers 128]
[--vocab 49152] [--draws 6] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ensembles.backends.device_votes import device_votes
from ensembles.keyed_votes import StepKey, race_votes, shared_noise


def _probability_form(logits: np.ndarray, u: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return np.argmax(p / u[None, :], axis=1)


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--scale", type=float, default=3.0,
                        help="standard deviation of the random logits (larger: peakier rows, smaller top-p sets)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=args.scale, size=(args.teachers, args.vocab)).astype(np.float32)
    keys = [StepKey(2026, step) for step in range(args.draws)]
    noises = [shared_noise(key, args.vocab) for key in keys]
    t_noise = _best(lambda: shared_noise(keys[0], args.vocab), args.repeats)
    t_exact = _best(lambda: _probability_form(logits, noises[0][0], args.temperature), args.repeats)
    t_race = _best(lambda: race_votes(logits, noises[0][0], temperature=args.temperature), args.repeats)
    t_top_p = _best(lambda: race_votes(logits, noises[0][0], noises[0][1], temperature=args.temperature,
                                       top_p=args.top_p), args.repeats)
    import torch

    torch.set_num_threads(2)
    tensor = torch.from_numpy(logits)
    t_device = _best(lambda: device_votes(tensor, keys[0], temperature=args.temperature), args.repeats)
    t_device_top_p = _best(lambda: device_votes(tensor, keys[0], temperature=args.temperature, top_p=args.top_p),
                           args.repeats)
    same_device = sum(int((device_votes(tensor, key, temperature=args.temperature, top_p=args.top_p)
                           == race_votes(logits, u, u_tail, temperature=args.temperature, top_p=args.top_p)).sum())
                      for key, (u, u_tail) in zip(keys, noises))
    same = sum(int((_probability_form(logits, u, args.temperature)
                    == race_votes(logits, u, temperature=args.temperature)).sum()) for u, _ in noises)
    print(f"vote kernels, {args.teachers} teachers x {args.vocab} tokens, logit sd {args.scale:g}, "
          f"T={args.temperature}, best of "
          f"{args.repeats}, load average {os.getloadavg()[0]:.2f}")
    print(f"  shared noise for the vocabulary (Philox, keyed)     : {t_noise * 1e3:8.1f} ms")
    print(f"  probability form, float64 (softmax, p/u, argmax)    : {t_exact * 1e3:8.1f} ms")
    print(f"  exponential race, float32 (logit/T - log u, argmax) : {t_race * 1e3:8.1f} ms")
    print(f"  exponential race with top-p {args.top_p:g} and the tail vote : {t_top_p * 1e3:8.1f} ms")
    print(f"  votes equal to the probability form                  : {same} of {args.teachers * args.draws}")
    print(f"  device kernel (torch, CPU, 2 threads), dense         : {t_device * 1e3:8.1f} ms")
    print(f"  device kernel with top-p {args.top_p:g} and the tail vote   : {t_device_top_p * 1e3:8.1f} ms")
    print(f"  device votes equal to the host race with top-p       : {same_device} of {args.teachers * args.draws}")


if __name__ == "__main__":
    main()
