"""The utility benchmark's metrics (pate_app.evaluation, docs/utility.md): each on inputs whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from pate_app import evaluation as ev


@pytest.mark.parametrize("raw, clean", [
    ('"Write a poem about rain."', "Write a poem about rain."),
    ("\u201cWrite a poem.\u201d  ", "Write a poem."),
    ("  two   spaces\nand a line ", "two spaces and a line"),
    ("'\"nested\"'", "nested"),
    ('"a" and "b"', '"a" and "b"'),        # two quotations, not one wrapped text
    ("He said \"no\".", "He said \"no\"."),
    ('""', ""),
    ("e\u0301", "\u00e9"),                   # NFC
])
def test_normalise(raw, clean):
    assert ev.normalise(raw) == clean


def test_scorable_drops_and_counts_empty_and_cut_records():
    records = [{"text": '"One."', "complete": True}, {"text": "  ", "complete": True},
               {"text": "cut", "complete": False}, "Two.", '""']
    texts, dropped = ev.scorable(records)
    assert texts == ["One.", "Two."] and dropped == {"empty": 2, "cut_by_budget": 1}


def test_distinct_n_counts_each_texts_own_ngrams():
    assert ev.distinct_n(["a b a b", "A b"], 1) == 2 / 6
    assert ev.distinct_n(["a b a b", "a b"], 2) == 2 / 4  # (a b), (b a), (a b) | (a b)
    assert ev.distinct_n(["a"], 2) is None
    with pytest.raises(ValueError, match="n must be"):
        ev.distinct_n(["a"], 0)


def test_knn_precision_and_recall_on_points_worked_by_hand():
    real = np.array([[0.0], [1.0], [2.0], [3.0]])
    synthetic = np.array([[0.5], [10.0]])
    # k = 1: every real point's radius is 1, so 0.5 is inside and 10 is not; the synthetic radii are 9.5 each,
    # so every real point is inside
    assert ev.knn_precision_recall(real, synthetic, k=1) == (0.5, 1.0)
    # one good record repeated: precise, and it covers little of the real set
    repeated = np.array([[0.0], [0.0], [0.0]])
    assert ev.knn_precision_recall(real, repeated, k=1) == (1.0, 0.25)
    with pytest.raises(ValueError, match="more than 3 points"):
        ev.knn_precision_recall(real, synthetic, k=3)


def test_two_sample_auc_is_a_half_for_one_law_and_one_for_two_apart():
    """400 points a set in 8 dimensions.  One law: the AUC's standard error under the null is about
    sqrt((n+m+1)/(12 n m)) = 0.02, and 0.5 +- 0.08 is four of them.  Two laws 6 standard deviations apart: 1."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(400, 8)), rng.normal(size=(400, 8))
    assert abs(ev.two_sample_auc(a, b, seed=1) - 0.5) < 0.08
    assert ev.two_sample_auc(a, b + 6.0, seed=1) > 0.999


def test_mauve_is_near_one_for_one_law_and_near_zero_for_two_apart():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(300, 8)), rng.normal(size=(300, 8))
    same, apart = ev.mauve_score(a, b, seed=2), ev.mauve_score(a, b + 4.0, seed=2)
    assert same > 0.9 and apart < 0.1
    assert ev.mauve_score(a, b, seed=2) == same  # seeded
    with pytest.raises(ValueError, match="at least 2"):
        ev.mauve_score(a[:1], b)


def test_train_on_synthetic_test_on_real():
    rng = np.random.default_rng(5)
    centres = {"x": np.array([5.0, 0.0]), "y": np.array([0.0, 5.0])}
    labels = ["x", "y"] * 20
    synthetic = np.array([centres[label] + rng.normal(size=2) * 0.3 for label in labels])
    real_labels = ["x", "y", "y", "y"] * 5
    real = np.array([centres[label] + rng.normal(size=2) * 0.3 for label in real_labels])
    assert ev.tstr_accuracy(synthetic, labels, real, real_labels) == 1.0
    # one label only: the classifier always says it
    assert ev.tstr_accuracy(synthetic[::2], labels[::2], real, real_labels) == 0.25
    with pytest.raises(ValueError, match="one label"):
        ev.tstr_accuracy(synthetic, labels[:-1], real, real_labels)


def test_spread():
    assert ev.spread([1.0]) == (1.0, 0.0)
    mean, sd = ev.spread([1.0, 2.0, 3.0])
    assert mean == 2.0 and sd == 1.0


@pytest.mark.slow
def test_the_packaged_sentence_model_embeds_offline():
    """all-MiniLM-L6-v2 from its wheel: unit vectors of 384 numbers, a paraphrase nearer than an unrelated text."""
    embed = ev.Embedder()
    vectors = embed(["The cat sat on the mat.", "A cat was sitting on the mat.", "Stock prices fell sharply today."])
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    with pytest.raises(ValueError, match="must be one of"):
        ev.Embedder("no-such-model")


def test_generate_normalise_writes_records_as_the_benchmark_scores_them():
    """``generate --normalise`` (issue 33, item 6): the option reaches the spec, and a record's text is then the
    benchmark's normalised text; without it the text is only trimmed."""
    from pate_app import run
    from pate_app.cli import build_parser
    from pate_app.spec import RunSpec

    args = build_parser("generate").parse_args(["generate", "--data", "bundled", "--budget-epsilon", "1",
                                                "--budget-delta", "1e-6", "--normalise"])
    spec = RunSpec.from_args(args)
    assert spec.normalise and spec.shareable()["output"]["normalise"] is True
    raw = '  "Write   a poem\nabout rain."  '
    assert run._record_text(spec, raw) == "Write a poem about rain."
    plain = RunSpec(data="bundled", budget_epsilon=1.0, budget_delta=1e-6)
    assert run._record_text(plain, raw) == '"Write   a poem\nabout rain."'
