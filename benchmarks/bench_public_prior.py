"""Public-prior mixing and public supports: what they gain, what bias they add, what kernel time they save
(docs/performance.md, "Public prior"; docs/generation.md, "Public prior").

(a) Utility and bias, on synthetic teachers (:func:`ensembles.synthetic.alpha_mixture`: a shared part ``s`` over
    ``--common`` tokens, weight ``alpha``, and each teacher's own tokens) with a public distribution that knows
    ``s`` only roughly (its weights shifted by one token, weight 0.6) and spreads the rest over ``--generic``
    tokens no teacher uses.  For each mixing weight ``lambda``, over ``--draws`` coordinated histograms (Algorithm 1 on the mixed
    distributions): the mean top count as a fraction of ``n``; the fraction of steps that DPArgMax at
    ``--epsilon`` would release (its exact yield probability, averaged); among released tokens, the fraction
    equal to the public argmax (agreement with the public model) and to the teachers' own argmax (the most
    likely token of their average), the mass on tokens no teacher lists (what only the public model proposes);
    the number of distinct released tokens and the effective number ``exp(entropy)`` of the released-token law
    (diversity); its total variation distance to the shared part ``s``.
(b) Vote-kernel time with and without a public top-k support, for ``--teachers`` rows of random logits over a
    49,152-token (SmolLM2) and a 128,000-token vocabulary: the device kernel
    (:func:`ensembles.backends.device_votes.device_votes`, torch on the CPU, ``--threads``; dense and with top-p)
    and the host kernel (:func:`ensembles.keyed_votes.keyed_votes` on the transformed distributions, the
    toy/API backends' path; the support's own cost included), best and median of ``--repeats`` runs, the two
    variants interleaved.

Usage: ``python benchmarks/bench_public_prior.py [--teachers 64] [--draws 2000] [--skip-kernels]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ensembles import TeacherDistributions, batch_from_votes, coordinated_votes
from ensembles.keyed_votes import StepKey, keyed_votes
from ensembles.public_prior import (
    PublicPrior,
    PublicSupport,
    for_sampling,
    mix_with_public,
)
from ensembles.synthetic import alpha_mixture
from mechanisms import DPArgMax


def _interleaved(first, second, repeats: int) -> tuple[float, float, float, float]:
    """Run ``first`` and ``second`` alternately ``repeats`` times each (so that a burst of load on a shared
    machine hits both alike); return their best and median times."""
    times = ([], [])
    for _ in range(repeats):
        for fn, out in zip((first, second), times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return min(times[0]), min(times[1]), float(np.median(times[0])), float(np.median(times[1]))


# -- (a) utility and bias ------------------------------------------------------------------------------------
def _public_distribution(teachers: TeacherDistributions, common: int, generic: int) -> np.ndarray:
    """What a public model without the private data might say: 0.6 on the shared tokens with the shared part's
    weights shifted by one token (so it prefers another shared token than the teachers do), 0.4 spread over
    ``generic`` tokens at the end of the vocabulary that no teacher lists."""
    vocab = teachers.vocab_size
    shared = teachers.average()[:common]
    public = np.zeros(vocab)
    public[:common] = 0.6 * np.roll(shared / shared.sum(), 1)
    public[vocab - generic:] = 0.4 / generic
    return public


def utility_table(args) -> None:
    rng = np.random.default_rng(args.seed)
    n, vocab = args.ensemble, args.vocab
    teachers = alpha_mixture(n, vocab, args.alpha, rng, common_size=args.common, private_size=args.private,
                             common_concentration=1.0)
    public = _public_distribution(teachers, args.common, args.generic)
    shared = teachers.average()[: args.common]
    shared = shared / shared.sum()
    public_argmax, ensemble_argmax = int(np.argmax(public)), int(np.argmax(teachers.average()))
    listed = np.zeros(vocab, dtype=bool)
    listed[teachers.token_ids] = True
    mechanism = DPArgMax(args.epsilon, args.delta)
    print(f"(a) alpha-mixture teachers: n={n}, V={vocab}, alpha={args.alpha}, {args.common} shared tokens "
          f"(Dirichlet(1) weights), {args.private} own tokens each.  Public: 0.6 on the shared tokens, weights "
          f"shifted by one (its argmax {public_argmax}, the teachers' {ensemble_argmax}), 0.4 on {args.generic} "
          f"generic tokens no teacher lists.  {args.draws} coordinated histograms per row; "
          f"DPArgMax(epsilon={args.epsilon:g}, delta={args.delta:g}), L={mechanism.error_bound}")
    header = ("lambda", "top count / n", "DPArgMax yield", "= public argmax", "= teachers' argmax",
              "public-only tokens", "distinct", "exp(entropy)", "TV to shared")
    print("  " + " | ".join(f"{h:>18}" for h in header))
    for weight in args.weights:
        mixed = mix_with_public(teachers, public, weight)
        votes = coordinated_votes(mixed, args.draws, rng)
        batch = batch_from_votes(votes, vocab)
        top_count, _ = batch.top()
        _, tokens, probability = mechanism.batch_distributions(batch)
        released = probability.sum()
        law = np.bincount(tokens, weights=probability, minlength=vocab) / max(released, 1e-300)
        nonzero = law[law > 0]
        row = (
            f"{weight:g}",
            f"{top_count.mean() / n:.3f}",
            f"{released / args.draws:.3f}",
            f"{law[public_argmax]:.3f}",
            f"{law[ensemble_argmax]:.3f}",
            f"{law[~listed].sum():.3f}",
            f"{int((law > 1e-3).sum())}",
            f"{np.exp(-(nonzero * np.log(nonzero)).sum()):.2f}" if nonzero.size else "-",
            f"{0.5 * np.abs(law[: args.common] - shared).sum() + 0.5 * law[args.common:].sum():.3f}",
        )
        print("  " + " | ".join(f"{c:>18}" for c in row))
    print("  (columns after the yield describe the law of the released token, given a release; distinct: tokens "
          "above probability 0.001; public-only tokens: mass on tokens no teacher lists)")


# -- (b) kernel time -----------------------------------------------------------------------------------------
def _softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def kernel_table(args) -> None:
    import torch

    from ensembles.backends.device_votes import device_votes

    torch.set_num_threads(args.threads)
    temperature, top_p, k = args.temperature, args.top_p, args.top_k
    print(f"(b) vote kernels, {args.teachers} teachers of random logits (sd {args.scale:g}), T={temperature}, "
          f"torch on the CPU with {args.threads} thread(s), "
          f"public top-{k} support, {args.repeats} interleaved runs each; load average {os.getloadavg()[0]:.2f} at the start")
    print(f"  {'vocabulary':>10} | {'kernel':<44} | {'no support: best (median)':>25} | "
          f"{'top-' + str(k) + ': best (median)':>25} | {'best ratio':>6}")
    for vocab in args.vocabs:
        rng = np.random.default_rng(vocab)
        logits = rng.normal(scale=args.scale, size=(args.teachers, vocab)).astype(np.float32)
        public = _softmax(rng.normal(scale=args.scale, size=vocab) / temperature)
        prior = PublicPrior(public, support=PublicSupport(top_k=k))
        tensor = torch.from_numpy(logits)
        keys = [StepKey(7, step) for step in range(args.repeats)]
        rows = []
        for label, options in (("device, dense", {}), (f"device, top-p {top_p}", {"top_p": top_p})):
            def run(public=None, options=options, tensor=tensor, key=keys[0]):
                extra = {} if public is None else {"public": public}
                return device_votes(tensor, key, temperature=temperature, **options, **extra)

            rows.append((label, *_interleaved(run, lambda run=run, prior=prior: run(prior), args.repeats)))
        # The host path: distributions (dense rows) at the temperature, then the vote kernel; a new position
        # builds its vote plan afresh, so each repeat starts from a fresh copy.
        dists = TeacherDistributions.from_dense(_softmax(logits / temperature))
        copies = [dists.subset(np.arange(args.teachers)) for _ in range(2 * args.repeats)]
        rows.append(("host (keyed_votes on distributions), dense", *_interleaved(
            lambda copies=copies, key=keys[0]: keyed_votes(copies.pop(), key),
            lambda copies=copies, key=keys[0], prior=prior: keyed_votes(for_sampling(copies.pop(), 1.0, None, prior),
                                                                        key),
            args.repeats)))
        for label, plain, support, plain_median, support_median in rows:
            print(f"  {vocab:>10} | {label:<44} | {plain * 1e3:7.1f} ({plain_median * 1e3:7.1f}) ms | "
                  f"{support * 1e3:7.1f} ({support_median * 1e3:7.1f}) ms | {plain / support:5.2f}x")
    print(f"  load average {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ensemble", type=int, default=256, help="teachers of the utility table")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary of the utility table")
    parser.add_argument("--alpha", type=float, default=0.35)
    parser.add_argument("--common", type=int, default=8)
    parser.add_argument("--private", type=int, default=4)
    parser.add_argument("--generic", type=int, default=20)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--teachers", type=int, default=64, help="teachers of the kernel table")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[49_152, 128_000])
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--scale", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the device kernel on the CPU")
    parser.add_argument("--skip-kernels", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    utility_table(args)
    if not args.skip_kernels:
        kernel_table(args)


if __name__ == "__main__":
    main()
