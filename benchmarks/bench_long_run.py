"""Cost per token of a long private run: ``PrivateGenerator`` on ``ToyBackend`` (30 teachers, DPArgMax, basic
accountant, a ledger on disk) generating ``--tokens`` tokens in one record, timed per block of an eighth of
them.  Linear total cost means flat blocks (docs/performance.md, "Long runs").
Usage: ``python benchmarks/bench_long_run.py [--tokens 20000] [--teachers 30]``."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from ensembles.backends import ToyBackend
from ensembles.generation import PrivateGenerator
from mechanisms import DPArgMax
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.ledger import Ledger

VOCAB = ["<eos>", "a", "b", "c", "d", "e", "f", "g"]


def model(teacher, context):
    """Teachers that agree on a word that depends on the position (a context that keeps growing)."""
    p = np.full(len(VOCAB), 0.02)
    p[0] = 0.0
    p[1 + (len(context) % 7)] = 1.0
    return p / p.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--teachers", type=int, default=30)
    args = parser.parse_args()
    block = max(1, args.tokens // 8)
    marks = []

    def on_token(_token):
        on_token.count += 1
        if on_token.count % block == 0:
            marks.append(time.perf_counter())

    on_token.count = 0
    with tempfile.TemporaryDirectory() as folder, Ledger.open(os.path.join(folder, "run.sqlite")) as ledger:
        accountant = BasicCompositionAccountant(budget=(1e9, 0.5), ledger=ledger)
        generator = PrivateGenerator(ToyBackend(model, VOCAB), DPArgMax(8.0, 1e-9), accountant,
                                     max_tokens=args.tokens, seed=1, fallback="public",
                                     public_backend=ToyBackend(model, VOCAB))
        start = time.perf_counter()
        result = generator.generate(["a"] * args.teachers, on_token=on_token)
        total = time.perf_counter() - start
    blocks = np.diff([start, *marks])
    print(f"{len(result.token_ids)} tokens, {args.teachers} teachers, load average {os.getloadavg()[0]:.2f}: "
          f"{total:.1f} s, {1e3 * total / len(result.token_ids):.2f} ms per token")
    print("seconds per block of", block, "tokens:", " ".join(f"{b:.2f}" for b in blocks))
    print(f"last block / first block: {blocks[-1] / blocks[0]:.2f}")


if __name__ == "__main__":
    main()
