"""``experiment utility`` (issue 33): its pieces on inputs worked by hand, and a whole run on a tiny model that
checks the harness (rows, counts, the headline, the figure) and that no record's text reaches its result."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import test_run
from pate_app.experiments import utility

#: test_run's tiny model, as a fixture of this module too (built once for it).
model_dir = test_run.model_dir


def _row(kind, name, values, epsilon=None):
    return {"row": name, "kind": kind, "epsilon": epsilon, "scorable": True,
            "repetitions": [{"scores": {"mauve": v}} for v in values],
            "mean": {"mauve": float(np.mean(values))}, "spread": {"mauve": float(np.std(values, ddof=1))}}


def test_the_headline_is_the_best_private_row_against_the_best_floor():
    rows = [_row("floor", "public", [0.40, 0.50]), _row("floor", "public with examples", [0.60, 0.70]),
            _row("noiseless", "no noise", [0.90, 1.00]), _row("private", "eps 3", [0.60, 0.62], 3.0),
            _row("private", "eps 10", [0.80, 0.90], 10.0), _row("ceiling", "real", [0.99, 0.99])]
    rows.append({**_row("private", "eps 30", [0.99, 0.99], 30.0), "scorable": False})  # not scorable: left out
    h = utility.headline(rows, seed=1)
    assert h["private_row"] == "eps 10" and h["floor_row"] == "public with examples"
    assert h["gain"] == pytest.approx(0.20)
    # the standard error of the difference of two means of two runs each: sqrt(0.005/2 + 0.005/2)
    assert h["gain_spread"] == pytest.approx(math.sqrt(0.005 / 2 + 0.005 / 2))
    assert h["beats_floor_by_two_spreads"] == (0.20 > 2 * h["gain_spread"])
    assert h["share"] == pytest.approx(0.20 / (0.95 - 0.65))
    assert 0 < h["share_spread"] < 1
    assert utility.headline([r for r in rows if r["kind"] != "private"]) is None
    # noiseless teachers no better than the floor (fortune cookies, MAUVE 0.94 against 0.97): no share, said so
    below = [r if r["kind"] != "noiseless" else _row("noiseless", "no noise", [0.60, 0.62]) for r in rows]
    h = utility.headline(below, seed=1)
    assert h["share"] is None and h["noiseless_above_floor"] is False and h["gain"] == pytest.approx(0.20)
    result = {"parameters": {"data": "d", "private": 1, "held_out": 1, "texts": 2, "repetitions": 2,
                             "teachers_per_group": 4, "embedding": "e"}, "rows": [], "headline": h}
    assert "no share: the noiseless teachers are not above the public model here by more than twice" in \
        utility.summary(result)
    # man pages (session 16): noiseless 0.99 against the floor's 0.99; a share of that way is noise (it read 265 %)
    level = [r if r["kind"] != "noiseless" else _row("noiseless", "no noise", [0.66, 0.71]) for r in rows]
    h = utility.headline(level, seed=1)
    assert h["share"] is None and h["noiseless_above_floor"] is False


def test_a_private_row_that_copies_the_public_examples_more_than_the_floor_is_not_credited():
    """Teachers shown the public examples released copies of them (session 19, fortunes: MAUVE 1.00, distinct-2
    0.42): the best private row is the best of those copying no more than the floor; when all copy more, the best is
    shown and not credited (no share either)."""
    def copying(row, copies):
        return {**row, "mean": {**row["mean"], "copies": copies}}

    floor = copying(_row("floor", "public with examples", [0.60, 0.70]), 0.10)
    noiseless = _row("noiseless", "no noise", [0.90, 1.00])
    copier = copying(_row("private", "copier", [0.99, 1.00], 10.0), 0.60)
    honest = copying(_row("private", "honest", [0.70, 0.72], 3.0), 0.05)
    h = utility.headline([floor, noiseless, copier, honest], seed=1)
    assert h["private_row"] == "honest" and not h["copies_more_than_floor"] and h["private_copies"] == 0.05
    h = utility.headline([floor, noiseless, copier], seed=1)
    assert h["private_row"] == "copier" and h["copies_more_than_floor"] and h["gain"] > 2 * h["gain_spread"]
    assert not h["beats_floor_by_two_spreads"] and h["share"] is None
    result = {"parameters": {"data": "d", "private": 1, "held_out": 1, "texts": 2, "repetitions": 2,
                             "teachers_per_group": 4, "embedding": "e"}, "rows": [], "headline": h}
    text = utility.summary(result)
    assert "not credited: every private row copies the public examples more than the floor does (60% of its " \
           "texts against 10%)" in text and "no share" not in text


def test_copy_share_counts_texts_whose_word_grams_run_in_one_source():
    from pate_app.evaluation import copy_share

    sources = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine"]
    texts = ["The quick brown fox jumps over a sleeping cat",  # 2 of 5 five-grams in the first source: no
             "quick brown fox jumps over the lazy dog today",   # 4 of 5: a copy
             "a stitch in time",                                # shorter than 5 words: all of it runs in a source
             "a stitch of time"]                                # not contiguous in any source
    assert copy_share(texts, sources) == pytest.approx(2 / 4)
    assert copy_share(texts[:1], sources, share=0.4) == 1.0
    assert copy_share([], sources) is None and copy_share(texts, []) == 0.0
    # grams from two sources do not add up to a copy of either
    assert copy_share(["the lazy dog saves nine lives today now"], ["over the lazy dog saves", "dog saves nine lives"],
                      n=4, share=0.4) == 0.0  # one of five 4-grams in each, two in both
    with pytest.raises(ValueError, match="n must be"):
        copy_share(texts, sources, n=0)


def test_the_quiet_step_epsilon_is_the_smallest_on_the_grid_whose_noise_does_not_decide():
    from pate_app.run import _STEP_GRID, NOISE_RELEASE_LIMIT, build_mechanism, noise_release

    for n, support in ((64, 50), (30, 50), (64, None)):
        e = utility.quiet_step_epsilon("gaussian-threshold-argmax", n, 1e-7, 49152, support)
        assert e is not None
        mech = build_mechanism("gaussian-threshold-argmax", e, 1e-7, num_teachers=n)
        assert noise_release(mech, n, 49152, support) <= NOISE_RELEASE_LIMIT
        below = _STEP_GRID[_STEP_GRID.index(e) - 1]
        louder = build_mechanism("gaussian-threshold-argmax", below, 1e-7, num_teachers=n)
        assert noise_release(louder, n, 49152, support) > NOISE_RELEASE_LIMIT
    assert utility.quiet_step_epsilon("gaussian-threshold-argmax", 1, 1e-7, 49152, None) is None


def test_the_split_is_seeded_disjoint_and_keeps_enough_out():
    records = [{"text": f"r{i}"} for i in range(100)]
    private, real = utility._split(records, 0.35, 24, np.random.default_rng(0))
    assert len(real) == 35 and len(private) == 65
    assert {r["text"] for r in private}.isdisjoint(r["text"] for r in real)
    again = utility._split(records, 0.35, 24, np.random.default_rng(0))
    assert again == (private, real)
    with pytest.raises(ValueError, match="cannot give 60 held-out and 60 private"):
        utility._split(records, 0.35, 60, np.random.default_rng(0))


def test_a_labelled_split_keeps_each_labels_share_out_and_the_ceiling_takes_labels_in_turn():
    """With labels the split is stratified: each label loses the same share to the held-out records (an
    unstratified split of 2 man-page sections left 19 of one and 41 of the other out, and real against real then
    scored a two-sample AUC of 0.76 and a train-on-synthetic accuracy of 0.32, below chance); the ceiling's draw
    takes the labels in turn, as a run per label makes its records."""
    records = [{"text": f"r{i}", "label": "ab"[i < 40]} for i in range(100)]  # 40 b, 60 a
    private, real = utility._split(records, 0.35, 24, np.random.default_rng(0), labels=["a", "b"])
    assert sum(r["label"] == "a" for r in real) == 21 and sum(r["label"] == "b" for r in real) == 14
    assert len(private) == 65 and {r["text"] for r in private}.isdisjoint(r["text"] for r in real)
    turns = utility._by_label_in_turn(private, ["a", "b"])
    assert [r["label"] for r in turns[:10]] == list("ababababab") and sorted(map(str, turns)) == sorted(map(str, private))
    assert utility._by_label_in_turn(private, None) == private


def test_public_examples_are_drawn_per_label_and_kept_out_of_the_split(tmp_path):
    """Without --public-examples, PUBLIC_EXAMPLES records of each label are drawn with the seed and none of them is
    left for the private or held-out records; with a file, its records are the examples and a corpus record with
    an example's text is left out."""
    records = [{"text": f"record {i}", "label": "abc"[i % 3]} for i in range(60)]
    examples, rest = utility._public_examples(records, ["a", "b", "c"], "text", None, "text", "label",
                                              np.random.default_rng(0))
    assert sorted(e["label"] for e in examples) == sorted("abc" * utility.PUBLIC_EXAMPLES)
    assert len(rest) == 60 - 3 * utility.PUBLIC_EXAMPLES and not {e["text"] for e in examples} & {r["text"] for r in rest}
    again, _ = utility._public_examples(records, ["a", "b", "c"], "text", None, "text", "label",
                                        np.random.default_rng(0))
    assert again == examples
    path = tmp_path / "public.csv"
    path.write_text("message,kind\nrecord 5,c\nwritten for everyone,a\n", encoding="utf-8")
    examples, rest = utility._public_examples(records, ["a", "b", "c"], "text", str(path), "message", "kind",
                                              np.random.default_rng(0))
    assert examples == [{"text": "record 5", "label": "c"}, {"text": "written for everyone", "label": "a"}]
    assert len(rest) == 59 and all(r["text"] != "record 5" for r in rest)
    with pytest.raises(ValueError, match="--public-examples: no such file"):
        utility._public_examples(records, None, "text", str(tmp_path / "absent.csv"), "text", None,
                                 np.random.default_rng(0))


MARKER = "quokkazanzibar"


@pytest.mark.slow
def test_a_whole_utility_run_on_a_tiny_model(model_dir, tmp_path):
    """80 labelled records (2 labels), 8 drawn as public examples, of which 24 are held out, 10 texts a row, 2 runs a row, one budget: every row
    is there, the ceiling and the noiseless and public rows are scored with every metric, a private row is scored
    or says how many texts it made, the headline and the figure exist, and no record's text is in the result."""
    data = tmp_path / "records.csv"
    words = test_run.WORDS
    with open(data, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label"])
        writer.writeheader()
        for i in range(80):
            text = " ".join(words[(i * 5 + j) % len(words)] for j in range(4)) + f" {MARKER} {i}"
            writer.writerow({"text": text, "label": "ab"[i % 2]})
    result = utility.run(quick=True, seed=3, progress=False, data=str(data), label_field="label", model=str(model_dir),
                         held_out=0.35, budget_epsilons="200", texts=10, repetitions=2, teachers=8, max_tokens=5)
    kinds = [row["kind"] for row in result["rows"]]
    assert kinds == ["ceiling", "floor", "floor", "noiseless"] + ["private"] * len(utility.CONFIGURATIONS)
    assert result["parameters"]["public_examples"] == 2 * utility.PUBLIC_EXAMPLES
    for row in result["rows"][:4]:
        assert row["scorable"], row["row"]
        assert set(row["mean"]) == set(utility.METRICS)
        assert 0.0 <= row["mean"]["mauve"] <= 1.0 and 0.0 <= row["mean"]["auc"] <= 1.0
    for row in result["rows"][4:]:
        assert row["configuration"]["public_examples"] == 2 * utility.PUBLIC_EXAMPLES
        for rep in row["repetitions"]:
            assert rep["scores"] is not None or rep.get("scorable_texts", 0) < 10 or "refused" in rep
    assert result["parameters"]["held_out"] == 24 and result["parameters"]["vocab_size"] == 128  # 12 of each 36
    # the public model alone is asked for half as many records again (its bare prompt leaves some empty), the
    # teachers for a tenth more (each of their records costs an ensemble's forwards): 15 and 11, the labels in turn
    assert [rep["records"] for row in result["rows"][1:3] for rep in row["repetitions"]] == [15] * 4
    assert [rep["records"] for rep in result["rows"][3]["repetitions"]] == [11, 11]
    assert result["headline"] is None or result["headline"]["metric"] == "mauve"
    floor = result["rows"][2]  # the public model with the public examples: the expected length of every fitted row
    assert result["parameters"]["expected_tokens"] == utility.expected_tokens(floor, 5)
    assert MARKER not in json.dumps(result)
    text = utility.summary(result)
    assert "ceiling: real records" in text and "epsilon = 0: the public model alone, bare prompt" in text
    assert "epsilon = 0: the public model with 8 public examples" in text
    (path,) = utility.plot(result, tmp_path / "out")
    assert path.stat().st_size > 10_000



def test_the_expected_record_length_comes_from_the_public_models_records():
    """The fitted rows pay for every record at the public model's length (its longest run's mean, a quarter longer,
    rounded up) and for the last at its worst case: what the whole-records rule of generate needs to start them."""
    floor = {"repetitions": [{"tokens_per_record": 10.2}, {"tokens_per_record": 11.0}, {"tokens_per_record": None}]}
    assert utility.expected_tokens(floor, 24) == 14  # ceil(11.0 * 1.25)
    assert utility.expected_tokens(floor, 12) == 12  # never above the records' cap
    assert utility.expected_tokens({"repetitions": [{"refused": "x", "scores": None}]}, 24) == 24  # no record made
    assert utility.expected_tokens(None, 24) == 24
    assert utility.steps_needed(15, 14, 24) == 14 * 14 + 24
    assert utility.steps_needed(1, 14, 24) == 24 and utility.steps_needed(0, 14, 24) == 24
    # fitted to fewer steps, the step epsilon is larger (or equal, on the grid): the budget is spent, not left
    short = utility.fitted_step_epsilon("between-thresholds", "pld", 16, 1e-7, (3.0, 1e-6),
                                        utility.steps_needed(15, 14, 24))
    worst = utility.fitted_step_epsilon("between-thresholds", "pld", 16, 1e-7, (3.0, 1e-6), 15 * 24)
    assert short is not None and worst is not None and short > worst


def test_the_steps_table_of_docs_utility_is_the_tools():
    """docs/utility.md ("First measurement"): the quietest step epsilon, its sigma and the steps PLD affords."""
    from pathlib import Path

    from pate_accountant import planning
    from pate_app.run import build_mechanism

    text = (Path(__file__).resolve().parent.parent / "docs" / "utility.md").read_text()
    for n in (16, 32, 64, 128):
        e = utility.quiet_step_epsilon("gaussian-threshold-argmax", n, 1e-7, 49152, 50)
        mech = build_mechanism("gaussian-threshold-argmax", e, 1e-7, num_teachers=n)
        steps = [planning.step_limits("pld", mech.event, budget, 1e-6).max_steps for budget in (1.0, 3.0, 10.0)]
        line = f"| {n} | {e:g} | {mech.sigma:.2f} | {' / '.join(map(str, steps))} |"
        assert line in text, line


def test_configurations_from_a_file_are_checked_and_kept_in_order(tmp_path):
    """``--configurations FILE``: each table is a private row of generate's options, in the file's order; a key a
    row may not set, a bad value, and a non-Gaussian row without its step epsilon are refused naming the row."""
    path = tmp_path / "rows.toml"
    path.write_text('["few-shot teachers"]\nmechanism = "gaussian-threshold-argmax"\naccountant = "pld"\n'
                    'public_top_k = 50\nrecords_per_teacher = 4\n\n'
                    '["DPArgMax, basic"]\nmechanism = "dp-argmax"\naccountant = "basic"\nstep_epsilon = 2.0\n',
                    encoding="utf-8")
    rows = utility.load_configurations(path)
    assert list(rows) == ["few-shot teachers", "DPArgMax, basic"] and rows["few-shot teachers"]["records_per_teacher"] == 4
    for text, pattern in [('["x"]\nmechanism = "dp-argmax"\n', r"\[x\] sets no step_epsilon"),
                          ('["x"]\nbudget_epsilon = 3.0\n', r"\[x\] has the key 'budget_epsilon'"),
                          ('["x"]\nmechanism = "gaussian-argmax"\npublic_top_k = 0\n', r"\[x\] .*public_top_k"),
                          ('["x"]\nmechanism = "no-such"\nstep_epsilon = 1.0\n', r"\[x\] .*mechanism"),
                          ("", "no row"), ("x = 1\n", "'x' is not a table")]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=pattern):
            utility.load_configurations(path)
    with pytest.raises(ValueError, match="no such file"):
        utility.load_configurations(tmp_path / "absent.toml")


def test_the_configurations_example_of_docs_utility_loads(tmp_path):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "utility.md").read_text(encoding="utf-8")
    first, *measured = re.findall(r"```toml\n(.*?)```", page, re.S)  # the example, then the measured runs' files
    path = tmp_path / "rows.toml"
    path.write_text(first, encoding="utf-8")
    rows = utility.load_configurations(path)
    assert list(rows)[0] in utility.CONFIGURATIONS and rows[list(rows)[1]]["template"] == "labelled-records"
    assert len(measured) >= 2
    for block in measured:  # every file a measurement quotes loads as it was run
        path.write_text(block, encoding="utf-8")
        assert utility.load_configurations(path)


def test_an_unscorable_private_row_says_how_many_steps_its_records_would_need():
    """The summary of a private row with too few complete records names the steps the texts would take at the
    noiseless teachers' record length (each token a charged step)."""
    def rep(**extra):
        return {"records": 4, "scorable_texts": 0, "dropped": {"cut_by_budget": 4}, "charged_runs": 16,
                "private_tokens": 10, "scores": None, **extra}

    rows = [{"row": "epsilon = infinity", "kind": "noiseless", "scorable": False, "mean": {}, "spread": {},
             "repetitions": [rep(tokens_per_record=13.0), rep(tokens_per_record=15.0)]},
            {"row": "private", "kind": "private", "scorable": False, "mean": {}, "spread": {}, "repetitions": [rep()]}]
    result = {"parameters": {"data": "d", "private": 1, "held_out": 1, "texts": 24, "repetitions": 1,
                             "teachers_per_group": 16, "embedding": "e"}, "rows": rows, "headline": None}
    line = [x for x in utility.summary(result).splitlines() if x.startswith("private")][0]
    assert "in at most 16 charged steps; 24 records of the noiseless teachers' 14 tokens need about 336 steps" in line


def test_the_fitted_step_epsilon_is_the_largest_whose_budget_pays_for_the_tokens():
    """BetweenThresholds' row runs at the largest grid step epsilon at which PLD pays for every token of the
    records asked for (a label's steps counted twice): the budget pays for them there and not one grid value up."""
    from pate_accountant import planning
    from pate_app.run import _STEP_GRID, build_mechanism

    def steps(e, n):
        mech = build_mechanism("between-thresholds", e, 1e-7, num_teachers=n)
        return planning.step_limits("pld", mech.event, 10.0, 1e-6).max_steps

    for n, need, touches in ((16, 192, 2), (64, 720, 1)):
        e = utility.fitted_step_epsilon("between-thresholds", "pld", n, 1e-7, (10.0, 1e-6), need, touches)
        assert steps(e, n) // touches >= need
        up = _STEP_GRID[_STEP_GRID.index(e) + 1]
        assert steps(up, n) // touches < need
    assert utility.fitted_step_epsilon("between-thresholds", "pld", 16, 1e-7, (0.01, 1e-6), 10 ** 9) is None
