"""What a run checks, and in which order (issue 24, items 1, 4 and 5): the spec's values once, in RunSpec; then
what needs only the data file, before any model is converted or read; then the records against the model's window
(``--long-records refuse|truncate|skip``) with the tokenizer alone; all before a ledger exists.

No model is loaded here: the model's tokenizer and window are replaced by a word counter and a small window, and
everything heavier is replaced by a function that fails the test if it is ever called.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from ensembles.templates import RECORDS
from pate_accountant.cli import main
from pate_app import run
from pate_app.spec import RunSpec, SpecError, Task

MARKER = "zanzibarquokka"


def _words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """Every step heavier than reading the data fails the test; the model's window is 60 words, its vocabulary
    50 tokens."""
    def heavy(*args, **kwargs):
        raise AssertionError("a heavy step ran before a data-only refusal")

    monkeypatch.setattr(run.backends, "demo_model_path", heavy)
    monkeypatch.setattr(run.stages, "_backends", heavy)
    monkeypatch.setattr(run.tb, "token_window", lambda model: (_words, 60, 50))
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "home"))
    return tmp_path


def _csv(path, rows) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)


def _support(path, per_label=(4, 4)) -> None:
    rows = [{"text": f"my parcel {MARKER} number {i} is late", "label": "shipping"} for i in range(per_label[0])]
    rows += [{"text": f"refund {MARKER} {i} please", "label": "refund"} for i in range(per_label[1])]
    _csv(path, rows)


#: A mechanism within reach of two teachers, so that each case below fails on its own account.
BASE = ["--teachers", "2", "--budget-epsilon", "8", "--budget-delta", "1e-4", "--mechanism", "gaussian-argmax",
        "--accountant", "pld"]


@pytest.mark.parametrize("extra, message", [
    (["--teachers", "9"], "cannot give 9 teachers a record each: the data set has only 8 usable records"),
    (["--label-field", "label", "--labels", "shipping"], "argument --labels: 4 record(s) have a label outside the 1 labels given"),
    (["--template", "instructions"], "argument --template"),
    (["--teachers", "8", "--mechanism", "dp-argmax", "--accountant", "basic", "--step-epsilon", "0.1"],
     "out of reach of n=8 teachers"),
    (["--budget-epsilon", "1"], "cannot pay for a single step"),
    (["--accountant", "target-charging"], "it takes --mechanism"),
])
def test_data_only_refusals_come_before_the_model_and_the_ledger(no_model, capsys, extra, message):
    data = no_model / "support.csv"
    _support(data, per_label=(4, 2) if "6" in extra else (4, 4))
    ledger = no_model / "never.sqlite"
    argv = ["generate", "--data", str(data), *BASE, "--ledger", str(ledger), "--model", str(no_model), "--no-progress",
            *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert MARKER not in err[0]
    assert not ledger.exists()


def test_a_model_path_that_does_not_exist_is_refused_after_the_data(no_model, capsys):
    data = no_model / "support.csv"
    _support(data)
    argv = ["generate", "--data", str(data), *BASE, "--model", str(no_model / "nothing-here")]
    assert main(argv) == 2
    assert "argument --model: model path" in capsys.readouterr().err
    assert main(argv + ["--teachers", "9"]) == 2  # the data's refusal comes first
    assert "only 8 usable records" in capsys.readouterr().err


def _task(texts, template=RECORDS):
    return Task(tuple({"text": t} for t in texts), template, "records", "records", "text")


def _spec(**kwargs):
    return RunSpec(**{"data": "records", "teachers": 2, "budget_epsilon": 80.0, "budget_delta": 1e-4,
                      "max_tokens": 10, "mechanism": "gaussian-threshold-argmax", "accountant": "pld",
                      "step_epsilon": 50.0,
                      **kwargs})


def _fit(spec, texts, capsys=None):
    task = _task(texts)
    plan = run._plan_run(spec, task)
    return run._fit_to_window(spec, task, plan, "model", announce=True)


def test_long_records_refuse_truncate_or_skip(no_model, capsys):
    short, long = f"{MARKER} a b c", " ".join([MARKER] * 40)
    texts = [short, long, short, short]  # two records per teacher: each may have (60 - 10 - template) / 2 words
    with pytest.raises(run.RunInputError) as caught:
        _fit(_spec(), texts)
    text = str(caught.value)
    assert text.startswith("argument --long-records refuse: 1 of 4 records are longer than ")
    assert "context window of 60 tokens with 2 records per teacher and --max-tokens 10" in text
    assert MARKER not in text and "\n" not in text

    truncated = _fit(_spec(long_records="truncate"), texts)
    limit = int(text.split("longer than ")[1].split()[0])
    assert [_words(r["text"]) for r in truncated] == [4, limit, 4, 4]
    err = capsys.readouterr().err
    assert f"1 of 4 records truncated to {limit} tokens" in err and MARKER not in err

    skipped = _fit(_spec(long_records="skip"), texts)
    assert skipped[1] is None and [r["text"] for r in skipped if r is not None] == [short] * 3
    assert f"1 of 4 records skipped: longer than {limit} tokens" in capsys.readouterr().err

    with pytest.raises(run.RunInputError, match=r"^argument --long-records skip: on_long='skip': all 4 records"):
        _fit(_spec(long_records="skip"), [long] * 4)
    # A larger --max-tokens leaves each record less room: the refusal names the remedy.
    with pytest.raises(run.RunInputError, match=r"^--teachers 2: the model's context window of 60 tokens has no room"):
        _fit(_spec(max_tokens=59), texts)


def test_a_skipped_record_moves_no_other_record():
    """Skipping keeps places: with the same random draw, every teacher but the one that held the skipped record
    sees exactly the prompts it saw before (replacing one record still changes one teacher only)."""
    records = [{"text": f"record {i}"} for i in range(12)]
    with_gap = list(records)
    with_gap[5] = None
    full = run.group_prompts(records, 4, 2, np.random.default_rng(3), RECORDS)
    gap = run.group_prompts(with_gap, 4, 2, np.random.default_rng(3), RECORDS)
    changed = [(g, i) for g in range(2) for i in range(2) if full[g][1][i] != gap[g][1][i]]
    assert len(changed) == 1
    g, i = changed[0]
    assert "record 5" in full[g][1][i] and "record 5" not in gap[g][1][i]
    # A teacher whose only records were skipped still votes, from the template alone.
    alone = run.group_prompts([{"text": "kept"}, None], 2, 1, np.random.default_rng(0), RECORDS)[0][1]
    assert sorted(alone) == sorted([RECORDS.format_example({"text": "kept"}) + RECORDS.open_slot, RECORDS.open_slot])


@pytest.mark.parametrize("values, message", [
    ({"groups": 2, "labels": "a,b", "label_field": "label"}, "--groups 2 (model.groups): with --labels the groups are"),
    ({"per_label": 2}, "--per-label (task.per_label) needs --label-field and --labels"),
    ({"checkpoints": "c.jsonl"}, "--checkpoints (signing.checkpoints) needs --signing-key (signing.key)"),
    ({"dataset": "x" * 201}, "data.dataset must be a printable name of 1 to 200 characters"),
    ({"mechanism": "no-such"}, "mechanism.name must be one of dp-argmax"),
    ({"accountant": "no-such"}, "accountant.name must be one of advanced, basic"),
    ({"long_records": "cut"}, "long_records"),
    ({"step_epsilon": 1000}, r"mechanism.step_epsilon must lie in (0, 50], got 1000"),
])
def test_the_spec_checks_each_value_once(values, message):
    with pytest.raises(SpecError) as caught:
        _spec(**values)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(caught.value, run.RunInputError)  # a usage error wherever it is raised


@pytest.mark.parametrize("kept, asked", [("basic", "pld"), ("basic", "target-charging"), ("pld", "basic"),
                                         ("target-charging", "pld"), ("basic", "basic")])
def test_a_ledger_kept_otherwise_is_refused_in_words(tmp_path, kept, asked):
    """Issue 24, item 4: refusing a ledger kept by another accountant or budget names what differs, without
    ``None`` or ``<missing>`` (a key one accountant has and the other lacks is said to be not set)."""
    from mechanisms import registry as mechanisms_registry
    from pate_accountant.ledger import Ledger

    def accountant(kind, budget, ledger):
        mechanism = mechanisms_registry.build_mechanism(
            "between-thresholds" if kind == "individual-charging" else "boundary-dp-argmax", 1.0, 1e-6,
            "replace-one", num_teachers=100)
        return run.build_accountant(kind, budget, ledger, mechanism=mechanism, num_teachers=100)

    path = str(tmp_path / "kept.sqlite")
    with Ledger.open(path) as ledger:
        accountant(kept, (8.0, 1e-6), ledger)
    with Ledger.open(path) as ledger, pytest.raises(run.RunInputError) as caught:
        accountant(asked, (9.0, 1e-6), ledger)
    text = str(caught.value)
    assert "None" not in text and "<missing>" not in text and "\n" not in text
    assert "budget" in text
    if kept != asked:
        assert f"kept by the {kept} accountant" in text and f"this accountant is {asked}" in text


@pytest.mark.parametrize("mechanism, epsilon, teachers, support, refused", [
    ("gaussian-threshold-argmax", 2.0, 8, None, True),    # sigma 3.2, 49,152 tokens: noise clears 5 of 8 alone
    ("gaussian-threshold-argmax", 2.0, 8, 50, True),      # 50 public candidates: still the noise's pick (71 %)
    ("gaussian-threshold-argmax", 2.0, 64, None, False),  # threshold 33: no unvoted token gets there
    ("gaussian-threshold-argmax", 8.0, 8, 50, False),     # sigma 0.93
    ("gaussian-threshold-argmax", 0.1, 300, None, True),  # a unanimous vote wins; a split one releases noise
    ("gaussian-threshold-argmax", 1.0, 30, None, True),   # plan best's pick for 30 teachers (issue 32, item 6)
    ("gaussian-argmax", 1.0, 8, None, True),
    ("gaussian-argmax", 1.0, 64, None, True),             # a bare majority of 33 loses to noise 8 % of the time
    ("gaussian-argmax", 2.0, 64, None, False),
    ("dp-argmax", 1.0, 8, None, False),                   # not Gaussian: its threshold is checked elsewhere
])
def test_gaussian_noise_that_would_pick_the_token_is_refused(mechanism, epsilon, teachers, support, refused):
    mech = run.build_mechanism(mechanism, epsilon, 1e-6, num_teachers=teachers)
    stray = run.noise_release(mech, teachers, 49152, support)
    if mechanism == "dp-argmax":
        assert stray is None
    else:
        assert (stray > run.NOISE_RELEASE_LIMIT) == refused
    if not refused:
        assert run.check_noise_floor(mech, teachers, 49152, support) is None
        return
    with pytest.raises(run.RunInputError) as caught:
        run.check_noise_floor(mech, teachers, 49152, support, nearest="; NEAREST")
    text = str(caught.value)
    assert "decides the releases" in text and "charged as private" in text and "\n" not in text
    assert ("the public top 50 tokens" if support else "a vocabulary of 49152 tokens") in text
    assert f"probability {run._percent(stray)} (at most 5% is accepted)" in text and text.endswith("; NEAREST")


def test_the_noise_release_probability_is_the_mechanisms_own_rate():
    """The exact probability behind the refusal against the mechanism itself, sampled on the histogram it is
    computed for (``noise_check_histogram``): the rate of releases the noise chose (thresholded: any release at a
    step without a majority; plain: a token other than the bare majority's) over 4,000 runs is within 4 binomial
    standard errors of it, at refused and accepted settings of each form, over the vocabulary and over 50 tokens
    (64 teachers over 50 tokens: more teachers than tokens)."""
    from ensembles.histograms import VoteHistogram
    from mechanisms.gaussian import noise_check_histogram

    rng = np.random.default_rng(5)
    cases = (("gaussian-threshold-argmax", 2.0, 8, 50), ("gaussian-threshold-argmax", 2.0, 30, 49152),
             ("gaussian-threshold-argmax", 1.0, 30, 50), ("gaussian-threshold-argmax", 0.5, 64, 50),
             ("gaussian-argmax", 1.0, 64, 49152), ("gaussian-argmax", 2.0, 30, 50))
    runs = 4000
    for name, epsilon, n, size in cases:
        mech = run.build_mechanism(name, epsilon, 1e-6, num_teachers=n)
        p = run.noise_release(mech, n, 49152, size)
        threshold = "threshold" in name
        counts = noise_check_histogram(n, size, majority=not threshold)
        tokens = np.flatnonzero(counts)
        hist = VoteHistogram(tokens, counts[tokens], vocab_size=size)
        releases = [mech(hist, rng=rng).value for _ in range(runs)]
        noise = sum(value is not None for value in releases) if threshold else sum(value != 0 for value in releases)
        se = max(np.sqrt(p * (1 - p) / runs), 1 / runs)
        assert abs(noise / runs - p) <= 4 * se, (name, epsilon, n, size, noise, p)


def _suggested(text: str) -> list[list[str]]:
    """The nearest configurations a refusal names, each as the flags it changes (the public model alone aside)."""
    tail = text.split("nearest configurations that run: ", 1)[1]
    out = []
    for option in tail.split("; "):
        words = option.split(":")[0].split(" (")[0].split()
        if option.startswith("one group"):
            out.append(["--groups", "1"])
        elif words and words[0].startswith("--") and words[0] != "--public-only" and "public model alone" not in option:
            out.append(words[:2])
    return out


@pytest.mark.parametrize("extra, private", [
    # the newcomer's 30 labelled records with every default but the mechanism: 10 teachers a label
    (["--mechanism", "gaussian-threshold-argmax", "--accountant", "pld", "--step-epsilon", "1"], True),
    (["--mechanism", "gaussian-threshold-argmax", "--accountant", "pld", "--step-epsilon", "1",
      "--public-top-k", "50"], True),
    # plain GNMax: a bare majority of 6 of 10 beats the noise of 49,151 unvoted tokens only at a step epsilon whose
    # doubled charge (private labels) the budget cannot pay: the public model alone is what is left
    (["--mechanism", "gaussian-argmax", "--accountant", "pld", "--step-epsilon", "2"], False),
    # every default: DPArgMax's threshold is out of reach of 10 teachers a label
    ([], True),
])
def test_small_data_is_refused_before_the_model_with_the_nearest_configurations_that_run(
        no_model, monkeypatch, capsys, extra, private):
    """Issue 32, item 6: 30 labelled records (3 labels), the teachers fitted to the data (one per record), a
    configuration whose releases the noise decides or whose threshold is out of reach: refused in one line before
    any model, ledger or output exists, naming the numbers and the nearest configurations; each configuration it
    names passes every check a run makes before the model loads, and the public model alone is always offered."""
    monkeypatch.setattr(run.tb, "token_window", lambda model: (_words, 4096, 49152))
    data = no_model / "small.csv"
    labels = ("billing", "shipping", "account")
    _csv(data, [{"text": f"message {MARKER} {i} about {labels[i % 3]}", "label": labels[i % 3]} for i in range(30)])
    ledger, out = no_model / "never.sqlite", no_model / "never.jsonl"
    argv = ["generate", "--data", str(data), "--label-field", "label", "--labels", ",".join(labels),
            "--budget-epsilon", "10", "--budget-delta", "1e-5", "--ledger", str(ledger), "--out", str(out),
            "--model", str(no_model), "--no-progress", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and MARKER not in err[0], err
    assert "n=10 teachers" in err[0] or "releases of 10 teachers" in err[0]
    assert "nearest configurations that run: " in err[0]
    assert err[0].endswith("the public model alone: --public-only (no private data, nothing charged) "
                           "(`pate-accountant generate --help` for the options)")
    assert not ledger.exists() and not out.exists()
    suggested = _suggested(err[0])
    assert bool(suggested) == private, err[0]
    if not private:  # not even the largest step epsilon a run takes
        spec = run.fit_teachers(RunSpec.from_args(run_options_args(argv, ["--step-epsilon", "50"])),
                                run.load_task(RunSpec.from_args(run_options_args(argv, []))))
        assert run.run_refusal(spec, 10, 3, 2, 49152) is not None
    for change in suggested:
        args = run_options_args(argv, change)
        spec = RunSpec.from_args(args)
        task = run.load_task(spec)
        spec = run.fit_teachers(spec, task)
        assert spec.teachers == 30  # one teacher per record
        plan = run._plan_run(spec, task)
        run._fit_to_window(spec, task, plan, "model", announce=False)  # no refusal


def run_options_args(argv, change):
    """``generate``'s parsed arguments for ``argv`` with the flags of ``change`` set (added or replaced)."""
    from pate_app.cli import build_parser

    argv = list(argv)
    if change and change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += change
    return build_parser("generate").parse_args(argv)


# -- bad input that escaped (issue 32, item 5) -------------------------------------------------------------------
def _special(tmp_path, kind: str) -> str:
    """A path to something that is not a regular file (or a file that is no good): ``kind`` says what."""
    import os

    if kind == "fifo":
        path = tmp_path / "pipe.toml"
        os.mkfifo(path)
        return str(path)
    if kind == "folder":
        (tmp_path / "folder.jsonl").mkdir()
        return str(tmp_path / "folder.jsonl")
    if kind == "device":
        return "/dev/zero"
    if kind == "latin1":
        path = tmp_path / "latin.toml"
        path.write_bytes("[data]\npath = 'caf\u00e9'\n".encode("latin-1"))
        return str(path)
    if kind == "deep":
        path = tmp_path / "deep.jsonl"
        path.write_text("[" * 100_000 + "\n")
        return str(path)
    raise AssertionError(kind)


@pytest.mark.parametrize("option, kind, message", [
    ("--config", "device", "argument --config: --config file '/dev/zero' is a device, not a regular file"),
    ("--config", "fifo", "is a pipe, not a regular file"),
    ("--config", "folder", "is a folder, not a regular file"),
    ("--config", "latin1", "not UTF-8 text (byte 19; save the file as UTF-8)"),
    ("--data", "fifo", "argument --data: data file"),
    ("--data", "folder", "is a folder, not a regular file"),
    ("--data", "device", "argument --data: data file '/dev/zero' is a device, not a regular file"),
    ("--data", "deep", "line 1: JSON nested too deeply to read"),
    ("--template", "folder", "argument --template: template file"),
    ("--template", "fifo", "is a pipe, not a regular file"),
])
def test_special_files_and_deep_json_are_one_line_usage_errors(no_model, capsys, option, kind, message):
    """A device is never read for ever, a pipe never blocks, a folder is not "no such file", a non-UTF-8 run
    description and JSON nested 100,000 deep are no tracebacks: exit 2 with one line naming the option."""
    path = _special(no_model, kind)
    data = no_model / "support.csv"
    _support(data)
    argv = {"--config": ["generate", "--config", path],
            "--data": ["generate", "--data", path, *BASE, "--model", str(no_model)],
            "--template": ["generate", "--data", str(data), "--template", path, *BASE, "--model", str(no_model)]}[option]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err


@pytest.mark.parametrize("name, message", [
    ("DATA", "argument --data: no such data file: DATA (`plan` prints DATA where your records' file goes)"),
    ("notes.txt", "argument --data: cannot tell the format of 'notes.txt' from its suffix: name the file *.jsonl"),
])
def test_the_data_file_errors_speak_the_command_lines_words(no_model, capsys, monkeypatch, name, message):
    """Issue 32, item 7: no advice to pass ``format='jsonl'`` (a Python argument) on the command line."""
    monkeypatch.chdir(no_model)
    if name != "DATA":
        (no_model / name).write_text("text\nhello\n")
    assert main(["generate", "--data", name, *BASE, "--model", str(no_model)]) == 2
    err = capsys.readouterr().err
    assert message in err and "format=" not in err


def test_an_unbalanced_ipv6_bracket_and_a_clashing_ledger_name_are_refused_in_words(capsys):
    code = main(["audit", "postgresql://user:hunter2@[::1/db?ledger=budget"])
    captured = capsys.readouterr()
    assert code == 3 and "Traceback" not in captured.err and "hunter2" not in captured.out + captured.err
    assert "an IPv6 host goes in brackets" in captured.out and "Error:" not in captured.out
    code = main(["audit", "postgresql://user@localhost/db?ledger=budget_confidential"])
    out = capsys.readouterr().out
    assert code == 3 and "not ending with '_confidential'" in out and "LedgerError" not in out


def test_teachers_that_do_not_split_over_the_labels_name_the_labels(no_model, capsys):
    """Issue 32, item 7: with labels and no --groups, the refusal spoke of a --groups 3 nobody gave, and suggested
    a number that the next check refused; it names the labels and the two nearest multiples."""
    data = no_model / "three.csv"
    _csv(data, [{"text": f"message {MARKER} {i}", "label": "abc"[i % 3]} for i in range(9)])
    argv = ["generate", "--data", str(data), "--label-field", "label", "--labels", "a,b,c", "--budget-epsilon", "8",
            "--budget-delta", "1e-4", "--teachers", "8", "--model", str(no_model)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--teachers 8 does not split evenly over the 3 labels of --labels (use a multiple of 3: 6 or 9)" in err
    assert "--groups" not in err


def test_the_refusal_docs_generation_quotes_is_the_tools(no_model, monkeypatch, capsys):
    """docs/generation.md ("Noise that decides") quotes the refusal of 30 labelled records over a public top-50:
    its probability and its nearest configuration are the tool's."""
    from pathlib import Path

    monkeypatch.setattr(run.tb, "token_window", lambda model: (_words, 4096, 49152))
    data = no_model / "small.csv"
    labels = ("billing", "shipping", "account")
    _csv(data, [{"text": f"message {i}", "label": labels[i % 3]} for i in range(30)])
    base = ["generate", "--data", str(data), "--label-field", "label", "--labels", ",".join(labels),
            "--budget-epsilon", "10", "--budget-delta", "1e-6", "--model", str(no_model), "--no-progress",
            "--mechanism", "gaussian-threshold-argmax", "--accountant", "pld", "--step-epsilon", "1",
            "--step-delta", "1e-7"]
    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "generation.md").read_text().split())
    assert main(base) == 2
    whole = capsys.readouterr().err
    assert "(sigma 6.62) over a vocabulary of 49152 tokens" in whole and "probability 100%" in whole
    assert "nearest configurations that run: the public model alone" in whole
    assert main([*base, "--public-top-k", "50"]) == 2
    top = capsys.readouterr().err
    assert "probability 100%" in top and "--step-epsilon 5: the budget pays for 1 step of a label group" in top
    assert "(sigma 6.6)" in text and "`p` = 100 %" in text
    assert "`--step-epsilon 5` (\"the budget pays for 1 step of a label group\"" in text


def test_the_real_model_rows_results_quotes_are_judged_as_it_says():
    """docs/results.md ("The real model: SmolLM2 on the bundled sample, in groups"): the no-support row (2 groups of
    96, step (0.5, 1e-7)) is refused for its noise at 97 %, the top-50 row runs at 0.6 %."""
    mech = run.build_mechanism("gaussian-threshold-argmax", 0.5, 1e-7, num_teachers=96)
    assert round(run.noise_release(mech, 96, 49152) * 100) == 97
    assert round(run.noise_release(mech, 96, 49152, 50) * 100, 1) == 0.6
    with pytest.raises(run.RunInputError):
        run.check_noise_floor(mech, 96, 49152)
    run.check_noise_floor(mech, 96, 49152, 50)
    # docs/generation.md: 64 teachers over the top-50 at the same step, more teachers than tokens: refused at 30 %
    fewer = run.build_mechanism("gaussian-threshold-argmax", 0.5, 1e-7, num_teachers=64)
    assert round(run.noise_release(fewer, 64, 49152, 50) * 100) == 30 and round(fewer.sigma, 1) == 12.7
    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "generation.md").read_text().split())
    assert "(sigma 12.7) release at 30 % of the steps without a majority (refused), 96 teachers at 0.6 %" in text
