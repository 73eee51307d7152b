"""The public support sized by measurement (issue 34, lever 3): ``ensembles.support_size``."""

from __future__ import annotations

import numpy as np
import pytest

from ensembles.backends import ToyBackend
from ensembles.public_prior import PublicSupport
from ensembles.support_size import NEVER, measure_top_k, token_rank
from ensembles.templates import PromptTemplate

VOCAB = ["<eos>", "a", "b", "c", "d", "e", "f", "g"]
W = {w: i for i, w in enumerate(VOCAB)}


def test_a_tokens_rank_says_whether_every_top_k_support_holds_it():
    """Exact enumeration: on distributions with ties and zeros, a token's rank is below ``k`` exactly when
    ``PublicSupport(top_k=k).select`` chooses it, for every token and every ``k``."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        probs = rng.choice([0.0, 0.1, 0.2, 0.3], size=len(VOCAB))
        if probs.sum() == 0:
            continue
        probs = probs / probs.sum()
        ids = np.arange(len(VOCAB))
        for k in range(1, len(VOCAB) + 1):
            chosen = set(PublicSupport(top_k=k).select(probs).tolist())
            for token in ids:
                assert (token_rank(ids, probs, int(token)) < k) == (token in chosen)
    # a sparse row: no support holds an unlisted token
    assert token_rank(np.array([3, 5]), np.array([0.6, 0.4]), 1) == NEVER


def _toy(order):
    """A public model that ranks the words in ``order`` after any context (the first most likely)."""
    probs = np.zeros(len(VOCAB))
    probs[[W[w] for w in order]] = np.linspace(1.0, 0.1, len(order))
    probs /= probs.sum()
    return ToyBackend(lambda teacher, context: probs, VOCAB)


def test_the_measured_top_k_is_the_smallest_holding_the_coverage():
    """The continuations' tokens rank 0, 1, 2 and 4 under the toy public model: a top-3 holds three of four
    positions, a top-5 all; the coverage picks between them."""
    backend = _toy(["a", "b", "c", "d", "e", "f", "g"])
    contexts = [("", "g", "a b"), ("", "g g", "c e")]
    size = measure_top_k(backend, contexts, coverage=0.75)
    assert (size.top_k, size.positions, size.covered) == (3, 4, 0.75)
    size = measure_top_k(backend, contexts, coverage=0.9)
    assert (size.top_k, size.covered, size.covered_by_50) == (5, 1.0, 1.0)
    with pytest.raises(ValueError, match="coverage"):
        measure_top_k(backend, contexts, coverage=0.0)
    with pytest.raises(ValueError, match="contexts"):
        measure_top_k(backend, [("", "g")])
    with pytest.raises(ValueError, match="no token"):
        measure_top_k(backend, [("", "g", "")])


def test_the_measurement_forces_each_continuation_in_its_own_context():
    """A public model whose ranking depends on the context: the rank of a forced token is read after the prompt
    and the continuation's earlier tokens (the word after "a" is "b" at rank 0, anything else far down)."""

    def model(teacher, context):
        probs = np.full(len(VOCAB), 0.01)
        if context and context[-1] == W["a"]:
            probs[W["b"]] = 1.0
        else:
            probs[W["a"]] = 1.0
        return probs / probs.sum()

    backend = ToyBackend(model, VOCAB)
    size = measure_top_k(backend, [("", "g", "a b a b")], coverage=1.0)
    assert (size.top_k, size.positions) == (1, 4)
    size = measure_top_k(backend, [("", "g", "a c")], coverage=1.0)
    assert size.top_k == 4  # "c" after "a": below "b" and its ties of lower id, "<eos>" and "a"


def test_public_support_contexts_leave_each_example_out_of_its_own_prompt():
    from pate_app.run import public_support_contexts

    template = PromptTemplate(header="Write about {label}.\n", example="Item: {text}\n", open_slot="Item:",
                              name="items")
    examples = [{"text": "one", "label": "x"}, {"text": "two", "label": "x"}, {"text": "three", "label": "y"},
                {"text": "four", "label": "y"}, {"text": "five", "label": "z"}]
    contexts = public_support_contexts(template, examples, ("x", "y"))
    assert contexts == [("Write about x.\n", "Item: two\nItem:", " one\n"),
                        ("Write about x.\n", "Item: one\nItem:", " two\n"),
                        ("Write about y.\n", "Item: four\nItem:", " three\n"),
                        ("Write about y.\n", "Item: three\nItem:", " four\n")]
    plain = PromptTemplate(header="Items.\n", example="- {text}\n", open_slot="Item:", name="odd")
    with pytest.raises(ValueError, match="does not start with its open slot"):
        public_support_contexts(plain, examples[:2], None)


def test_auto_is_a_public_top_k_a_configuration_row_may_ask_for(tmp_path):
    from pate_app.experiments.utility import load_configurations

    path = tmp_path / "rows.toml"
    path.write_text('["InvisibleInk, measured support"]\nmechanism = "clipped-logit-sampling"\naccountant = "rdp"\n'
                    'public_top_k = "auto"\n', encoding="utf-8")
    assert load_configurations(path)["InvisibleInk, measured support"]["public_top_k"] == "auto"
    path.write_text('["x"]\nmechanism = "clipped-logit-sampling"\naccountant = "rdp"\npublic_top_k = "many"\n',
                    encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[x\].*public_top_k"):
        load_configurations(path)


def test_the_option_takes_a_size_or_auto(capsys):
    """``--public-top-k auto`` parses (any case) to the spec's ``"auto"``; another word is a one-line usage error
    naming the option, before anything is read."""
    from pate_app.cli import main
    from pate_app.options import top_k_or_auto
    from pate_app.spec import RunSpec, SpecError

    assert top_k_or_auto("AUTO") == "auto" and top_k_or_auto("7") == 7
    assert main(["generate", "--data", "absent.csv", "--budget-epsilon", "1", "--budget-delta", "1e-6",
                 "--public-top-k", "many"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--public-top-k" in err[-1] and "a positive integer or auto" in err[-1]
    assert RunSpec(data="records", budget_epsilon=1.0, budget_delta=1e-6, public_top_k="auto").public_top_k == "auto"
    with pytest.raises(SpecError, match="public_top_k"):
        RunSpec(data="records", budget_epsilon=1.0, budget_delta=1e-6, public_top_k=0)
