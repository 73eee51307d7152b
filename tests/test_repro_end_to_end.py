"""``experiment end-to-end``: full private generation (paper Framework 2) under target and individual charging.

The claim (paper Sections 4-6: coordinated ensembles transfer what independent ones cannot) is tested on a
table of teacher distributions where it must hold: the synthetic alpha mixture of the experiment, where an
independent histogram spreads the common mass ``alpha`` over ``k`` words (every count near
``alpha n / k``, far below each mechanism's threshold) while a coordinated one puts it on one word.  Margins
come from the counts (normal approximation of the private-token rates at family level 1e-4 over the three
configurations, conftest.z_bound).  The SmolLM2 quick run is a smoke test of the pipeline: structure,
budgets, determinism for a seed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import z_bound

from pate_accountant.cli import main
from pate_app.experiments import end_to_end as e2e
from pate_app.experiments import load

#: Model lane (``-m slow``, run by the README's test command): whole private-generation experiments on a model.
pytestmark = pytest.mark.slow

FAMILY = 1e-4
#: Records per synthetic run in the claim tests (BetweenThresholds releases in about 1 run in 10 there).
RECORDS = 40


# -- diversity -------------------------------------------------------------------------------------------


def test_diversity_by_hand():
    texts = ["a b c", "a b c ", "a b d", ""]
    d = e2e.diversity(texts)
    assert d["records"] == 4
    assert d["distinct_records"] == 3  # "a b c" twice (after stripping), "a b d", ""
    # unigrams: 3 + 3 + 3 + 0 = 9, distinct {a, b, c, d}
    assert (d["distinct_1"], d["total_1"]) == (4, 9)
    assert d["distinct_1_ratio"] == pytest.approx(4 / 9)
    # bigrams: (a b) x3, (b c) x2, (b d): 6 in all, 3 distinct
    assert (d["distinct_2"], d["total_2"]) == (3, 6)
    assert d["distinct_2_ratio"] == pytest.approx(0.5)


def test_ngrams_do_not_cross_records_and_empty_sets():
    assert e2e.distinct_ngrams(["a", "b"], 2) == (0, 0)
    assert e2e.distinct_ngrams(["x y", "y x"], 2) == (2, 2)
    d = e2e.diversity([])
    assert d["records"] == d["distinct_records"] == 0
    assert d["distinct_1_ratio"] is None and d["distinct_2_ratio"] is None
    with pytest.raises(ValueError, match="n"):
        e2e.distinct_ngrams(["a"], 0)


# -- the claim on the synthetic table ------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_runs():
    """Every configuration, Hot and Cold, on the experiment's synthetic table with enough records for the
    rarest release (BetweenThresholds: the public candidate must be the coordinated word, 1 in k)."""
    n = e2e.SIZES["quick"]["synthetic_teachers"]
    teachers, public = e2e.synthetic_backends(n)
    return n, e2e.run_part(teachers, public, setting=e2e.SYNTHETIC_SETTING, num_teachers=n,
                           prompts=[[] for _ in range(n)], num_records=RECORDS, max_tokens=e2e.SYNTHETIC_MAX_TOKENS,
                           seed=0, part_index=1)


def _rate_margin(hot: dict, cold: dict, z: float) -> tuple[float, float]:
    """``(difference of the private-token rates per charged run, z times its standard error)``."""
    h, rh = hot["private_tokens"], hot["charged_runs"]
    c, rc = cold["private_tokens"], cold["charged_runs"]
    return h / rh - c / rc, z * math.sqrt(h / rh**2 + c / rc**2)


def test_hot_releases_more_private_tokens_than_cold(synthetic_runs):
    _, runs = synthetic_runs
    pairs = e2e._pairs(runs)
    assert set(pairs) == set(e2e.CONFIGURATIONS)
    z = z_bound(len(pairs), FAMILY)
    for configuration, pair in pairs.items():
        hot, cold = pair["hot"], pair["cold"]
        assert hot["budget"] == cold["budget"], configuration  # same total budget
        assert hot["private_tokens"] >= cold["private_tokens"], configuration
        difference, margin = _rate_margin(hot, cold, z)
        assert difference > margin, (configuration, hot["private_tokens"], cold["private_tokens"])


def test_cold_cannot_pass_dp_argmax_on_the_table(synthetic_runs):
    """Independent counts of a common word are Bin(n, alpha/k) (mean 345 for n = 4000) and never reach the
    release threshold n/2 + L; a coordinated top count is about alpha n."""
    n, runs = synthetic_runs
    pairs = e2e._pairs(runs)
    cold = pairs["target-dp-argmax"]["cold"]
    assert cold["private_tokens"] == 0 and cold["fail_rate"] == 1.0
    hot = pairs["target-dp-argmax"]["hot"]
    assert hot["private_tokens"] / hot["charged_runs"] > 0.9


def test_synthetic_runs_stay_within_budget_and_add_up(synthetic_runs):
    n, runs = synthetic_runs
    for entry in runs:
        budget = entry["budget"]
        assert entry["within_budget"]
        assert entry["spent"]["epsilon"] <= budget["epsilon"] and entry["spent"]["delta"] <= budget["delta"]
        # public fallback: every run that released nothing was followed by a public token
        assert entry["charged_runs"] == entry["private_tokens"] + entry["failed_runs"]
        assert entry["fallback_tokens"] == entry["failed_runs"]
        assert entry["fail_rate"] == pytest.approx(entry["failed_runs"] / entry["charged_runs"])
        assert entry["records_produced"] == entry["records_requested"] == RECORDS
        assert entry["records_per_epsilon"] == pytest.approx(RECORDS / entry["spent"]["epsilon"])
        state = entry["accountant"]
        if entry["configuration"].startswith("target-"):
            assert state["kind"] == "target-charging"
            assert state["queries"] == entry["charged_runs"]
            assert state["target_hits"] == entry["target_hits"] == entry["target_runs"] <= state["max_hits"]
            assert entry["plain_composition_epsilon"] > 0
        else:
            assert state["kind"] == "individual-charging"
            assert state["queries"] == entry["charged_runs"]
            # only DP outputs and public parameters: no per-teacher counter reaches the result
            assert set(state) == {"kind", "between_hits", "queries", "per_teacher_limit"}
            assert entry["spent_is"] == "guarantee"
            assert state["between_hits"] == entry["target_hits"] and entry["target_runs"] == 0
        # no teacher's own word is ever released privately (its count is at most 1)
        for text in entry["records"]:
            assert all(not word.startswith("t") for word in text.split())


def test_run_part_is_deterministic_for_a_seed():
    n = 2000
    teachers, public = e2e.synthetic_backends(n)

    def once(seed):
        return e2e.run_part(teachers, public, setting=e2e.SYNTHETIC_SETTING, num_teachers=n,
                            prompts=[[] for _ in range(n)], num_records=2, max_tokens=6, seed=seed, part_index=1)

    def strip(runs):
        return [{k: v for k, v in entry.items() if k != "wall_seconds"} for entry in runs]

    a, b, c = once(3), once(3), once(4)
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_build_configuration_refuses_budgets_that_pay_for_nothing():
    setting = {**e2e.SYNTHETIC_SETTING, "target": {**e2e.SYNTHETIC_SETTING["target"], "budget": (1.0, 1e-6)}}
    with pytest.raises(ValueError, match="single step"):
        e2e.build_configuration("target-dp-argmax", setting, 4000)
    setting = {**e2e.SYNTHETIC_SETTING, "individual": {**e2e.SYNTHETIC_SETTING["individual"], "budget": (0.5, 1e-6)}}
    with pytest.raises(ValueError, match="single charge"):
        e2e.build_configuration("individual-between-thresholds", setting, 4000)
    with pytest.raises(ValueError, match="configuration"):
        e2e.build_configuration("nope", e2e.SYNTHETIC_SETTING, 10)


# -- the language-model quick run (smoke test) -------------------------------------------------------------


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick run through the real CLI (both parts, with --plot)."""
    out = tmp_path_factory.mktemp("end_to_end")
    code = main(["experiment", "end-to-end", "--quick", "--no-progress", "--plot", "--out", str(out)])
    return code, out


def test_interface():
    assert load("end-to-end") is e2e
    assert e2e.NAME == "end-to-end"
    assert set(e2e.SIZES) == {"full", "quick"}


def test_cli_writes_json_and_plots(quick):
    code, out = quick
    assert code == 0
    result = json.loads((out / "end-to-end.json").read_text())
    assert result["experiment"] == "end-to-end"
    assert result["parameters"]["parts"] == ["model", "synthetic"]
    plots = result["files"]["plots"]
    assert len(plots) == 3
    for path in plots:
        assert path.split("/")[-1].startswith("end_to_end") and path.endswith(".png")
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_model_quick_run_structure_and_budget(quick):
    _, out = quick
    result = json.loads((out / "end-to-end.json").read_text())
    model = result["model"]
    size = e2e.SIZES["quick"]
    assert model["teachers"] == size["teachers"]
    assert model["records_per_teacher"] == [1] * size["teachers"]  # --quick: one record each
    runs = model["runs"]
    assert [(r["configuration"], r["ensemble"]) for r in runs] == [
        (c, label) for c in e2e.CONFIGURATIONS for label, _ in e2e.ENSEMBLES
    ]
    for entry in runs:
        assert entry["within_budget"]
        assert entry["spent"]["epsilon"] <= entry["budget"]["epsilon"]
        assert entry["charged_runs"] == entry["private_tokens"] + entry["failed_runs"]
        assert entry["fallback_tokens"] == entry["failed_runs"]
        assert entry["tokens"] <= entry["private_tokens"] + entry["fallback_tokens"]
        assert 1 <= entry["charged_runs"] <= size["records"] * size["max_tokens"]
        assert entry["records_produced"] <= size["records"]
        assert len(entry["records"]) == entry["records_produced"]
        assert entry["diversity"]["records"] == entry["records_produced"]
    # the per-step parameters let something through privately on the quick size
    assert sum(entry["private_tokens"] for entry in runs) >= 1
    assert result["claims"]["model"]["all_within_budget"]


def test_model_quick_run_is_deterministic(quick):
    _, out = quick
    first = json.loads((out / "end-to-end.json").read_text())["model"]
    again = e2e.run(quick=True, seed=0, progress=False, part="model")["model"]
    for a, b in zip(first["runs"], again["runs"]):
        a = {k: v for k, v in a.items() if k != "wall_seconds"}
        b = json.loads(json.dumps({k: v for k, v in b.items() if k != "wall_seconds"}))
        assert a == b


def test_summary_reports_both_parts(quick):
    _, out = quick
    result = json.loads((out / "end-to-end.json").read_text())
    text = e2e.summary(result)
    assert "model part" in text and "synthetic part" in text
    assert "Hot minus Cold" in text


def test_bad_options_are_usage_errors(tmp_path, capsys):
    out = tmp_path / "bad"
    for bad, name in ((["--teachers", "0"], "--teachers"), (["--records", "0"], "--records"),
                      (["--max-tokens", "0"], "--max-tokens"), (["--synthetic-teachers", "100"], "--synthetic-teachers"),
                      (["--target-budget-epsilon", "10"], "--target-budget-epsilon"),
                      (["--individual-budget-epsilon", "4"], "--individual-budget-epsilon"),
                      (["--threads", "0"], "--threads"), (["--data", str(tmp_path / "missing.jsonl")], "--data")):
        assert main(["experiment", "end-to-end", "--quick", "--no-progress", "--out", str(out), *bad]) == 2, bad
        assert name in capsys.readouterr().err
    assert not (out / "end-to-end.json").exists()


def test_run_rejects_bad_values_directly():
    with pytest.raises(ValueError, match="--part"):
        e2e.run(quick=True, seed=0, progress=False, part="everything")
    with pytest.raises(ValueError, match="--synthetic-records"):
        e2e.run(quick=True, seed=0, progress=False, part="synthetic", synthetic_records=0)
    with pytest.raises(ValueError, match="--seed"):
        e2e.run(quick=True, seed=-1, progress=False, part="synthetic")


def test_plain_composition_reference_is_pld_of_the_inner_mechanism():
    from mechanisms import BoundaryWrapper, DPArgMax
    from pate_accountant.accountants import PldAccountant

    mechanism = BoundaryWrapper(DPArgMax(0.05, 1e-10))
    reference = PldAccountant()
    reference.compose(DPArgMax(0.05, 1e-10).event, count=40)
    assert e2e._plain_composition(mechanism, 40, 1e-6) == pytest.approx(reference.get_epsilon(1e-6))
    assert e2e._plain_composition(mechanism, 0, 1e-6) == 0.0
    assert np.isfinite(e2e._plain_composition(mechanism, 40, 1e-6))


def test_model_part_on_the_users_data_is_unseeded_without_seed(tmp_path, capsys, mechanism_rngs):
    # The embedded model on a user's data file: the mechanisms get no generator (the operating system's
    # noise), the result says seeded false and nothing warns; docs/results.md, end-to-end, "Randomness".
    seen = mechanism_rngs
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Name a colour, number {i}.", "context": "",
                                        "response": "Blue.", "category": "open_qa"}) + "\n" for i in range(12)),
                    encoding="utf-8")
    out = tmp_path / "out"
    assert main(["experiment", "end-to-end", "--quick", "--no-progress", "--part", "model", "--data", str(data),
                 "--teachers", "12", "--max-tokens", "2", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    result = json.loads((out / "end-to-end.json").read_text())
    assert result["parameters"]["seeded"] is False and result["model"]["seeded"] is False
    assert result["model"]["data"].startswith("mine.jsonl")
    assert len(seen) == len(e2e.CONFIGURATIONS) * len(e2e.ENSEMBLES) and all(rng is None for rng in seen)
    assert "warning" not in captured.err
