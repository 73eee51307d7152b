"""A long run costs linear time in its tokens (issue 14, item 5): the generation loop decodes a bounded window
per token, and ToyBackend hands its model a view of the context, not a copy.  The work is counted, not timed
(benchmarks/bench_long_run.py times 20,000 tokens)."""

from __future__ import annotations

import numpy as np

from ensembles.backends import ToyBackend
from ensembles.backends.toy import TokenView
from ensembles.generation import PrivateGenerator
from mechanisms import DPArgMax
from pate_accountant.accountants import BasicCompositionAccountant

VOCAB = ["<eos>", "a", "b", "c", "stop"]


class CountingToy(ToyBackend):
    """A ToyBackend that counts the tokens it decodes and the context types its model sees."""

    decoded = 0

    def decode(self, token_ids):
        CountingToy.decoded += len(token_ids)
        return super().decode(token_ids)


def _model(seen):
    def f(teacher, context):
        seen.add(type(context))
        p = np.full(len(VOCAB), 0.01)
        p[0] = p[4] = 0.0
        p[1 + len(context) % 3] = 1.0
        return p / p.sum()

    return f


def _run(tokens, stop_strings=()):
    seen = set()
    CountingToy.decoded = 0
    generator = PrivateGenerator(CountingToy(_model(seen), VOCAB), DPArgMax(8.0, 1e-9),
                                 BasicCompositionAccountant(budget=(1e9, 0.5)), max_tokens=tokens, seed=3,
                                 stop_strings=stop_strings)
    result = generator.generate(["a"] * 12)
    return result, CountingToy.decoded, seen


def test_decoding_work_grows_linearly_with_the_tokens():
    short, short_work, _ = _run(200, stop_strings=("stop",))
    long, long_work, seen = _run(800, stop_strings=("stop",))
    assert len(short.token_ids) == 200 and len(long.token_ids) == 800
    # 2 windows of at most 9 tokens per token, plus one full decode at the end: at most 19 tokens decoded per
    # token (a full decode per token, as before, was 400 per token on average at 800 tokens).
    assert long_work <= 19 * 800 and short_work <= 19 * 200
    assert long_work / short_work < 4.5  # four times the tokens, about four times the work
    assert seen == {TokenView}


def test_the_text_and_stop_strings_are_those_of_a_full_decode():
    backend = ToyBackend(lambda t, c: [0.0, 0.0, 0.0, 0.0, 1.0] if len(c) >= 7 else [0, 1.0, 0, 0, 0], VOCAB)
    generator = PrivateGenerator(backend, DPArgMax(8.0, 1e-9), BasicCompositionAccountant(budget=(1e9, 0.5)),
                                 max_tokens=50, seed=1, stop_strings=("a stop",))
    result = generator.generate(["a"] * 12)
    assert result.stop_reason == "stop_string"
    full = backend.decode(list(result.token_ids))
    assert result.text == full[: full.find("a stop")] and "stop" not in result.text
