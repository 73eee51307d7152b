"""End-to-end private runs (pate_app/run.py, ``pate-accountant generate``) on a tiny random Llama.

The model and its tokenizer are built in the test and saved to a folder, so ``--model PATH`` works as for
a real model.  A marker word placed in every record must never reach the ledger file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

#: Model lane (``-m slow``, run by the README's test command): private runs on a model through the command line.
pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from pate_app.run import RunInputError, private_run  # noqa: E402
import pate_app.run as run_module  # noqa: E402
from pate_accountant.cli import main  # noqa: E402
from pate_accountant.ledger import Ledger  # noqa: E402

MARKER = "zanzibarquokka"
WORDS = ["write", "a", "short", "poem", "about", "the", "sea", "list", "three", "ideas", "for", "dinner",
         "explain", "how", "rain", "forms", "name", "some", "birds", "give", "me", "tips"]


def _records(count: int) -> list[dict]:
    out = []
    for i in range(count):
        words = [WORDS[(i * 3 + j) % len(WORDS)] for j in range(5)]
        out.append({"instruction": " ".join(words[:3]) + f" {MARKER} " + " ".join(words[3:]),
                    "context": "", "response": f"{MARKER} answer", "category": "open_qa"})
    return out


def _write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [" ".join(WORDS), "Here are examples of instructions Instruction : Write one new of kind ."] * 3
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<pad>", "</s>"],
                                                        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.ndim == 2 else 1.0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


#: The test's short names of RunSpec fields.
_SPEC_NAMES = {"num_teachers": "teachers", "ledger_path": "ledger", "epsilon": "budget_epsilon",
               "delta": "budget_delta", "num_records": "records"}


def _run(model_dir, ledger, seed=0, records=None, ledger_home=None, progress=False, **kwargs):
    """One run of the tiny model over in-memory records (default: 12 of them), through a RunSpec."""
    from pate_app.spec import RunSpec

    params = dict(model=str(model_dir), teachers=6, ledger=None if ledger is None else str(ledger),
                  mechanism="dp-argmax", accountant="basic", step_epsilon=8.0, step_delta=1e-3,
                  relation="replace-one", budget_epsilon=200.0, budget_delta=0.5, records=2, max_tokens=6,
                  seed=seed, threads=1, data="records")
    params.update({_SPEC_NAMES.get(name, name): value for name, value in kwargs.items()})
    return private_run(RunSpec(**params), records=_records(12) if records is None else records,
                       ledger_home=ledger_home, progress=bool(progress))


def test_private_run_end_to_end(model_dir, tmp_path):
    ledger = tmp_path / "run.sqlite"
    result = _run(model_dir, ledger)
    assert result["audit"]["ok"], result["audit"]
    assert result["within_budget"]
    assert result["spent"]["epsilon"] <= result["budget"]["epsilon"]
    assert result["spent"]["delta"] <= result["budget"]["delta"]
    assert len(result["records"]) == 2
    assert result["charged_runs"] == result["ledger"]["rows"] > 0
    # a random tiny model rarely has a majority: fallbacks happen and are recorded
    assert result["fallback_tokens"] > 0
    assert sum(r["outcomes"].get("fallback", 0) for r in result["records"]) == result["fallback_tokens"]
    with Ledger.open(str(ledger), read_only=True) as opened:
        check = opened.verify()
        assert check.ok
        (run,) = opened.runs
        assert run["metadata"]["seeded"] is True and "seed" not in run["metadata"]
        assert run["metadata"]["mechanism"]["parameters"]["epsilon"] == 8.0
        assert opened.dataset == "records"
    # no prompt text anywhere in the ledger (WAL included) or the returned parameters
    for path in tmp_path.iterdir():
        assert MARKER.encode() not in path.read_bytes(), path
    assert MARKER not in json.dumps(result["parameters"])
    json.dumps(result, allow_nan=False)


def test_equal_seeds_equal_records(model_dir, tmp_path):
    first = _run(model_dir, tmp_path / "a.sqlite", seed=7)
    second = _run(model_dir, tmp_path / "b.sqlite", seed=7, ledger_home=tmp_path / "another-installation")
    assert [r["text"] for r in first["records"]] == [r["text"] for r in second["records"]]
    assert first["spent"] == second["spent"]


def test_unseeded_run_records_seeded_false_and_warns_nothing(model_dir, tmp_path, capsys):
    ledger = tmp_path / "c.sqlite"
    result = _run(model_dir, ledger, seed=None, num_records=1, max_tokens=2)
    assert result["parameters"]["seeded"] is False
    assert "seeded" not in capsys.readouterr().err
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert opened.runs[0]["metadata"]["seeded"] is False


def test_seeded_run_warns_on_stderr(model_dir, tmp_path, capsys):
    result = _run(model_dir, tmp_path / "w.sqlite", seed=5, num_records=1, max_tokens=2)
    assert result["parameters"]["seeded"] is True and "seed" not in result["parameters"]
    err = capsys.readouterr().err
    assert "warning" in err and "no privacy against anyone who knows the seed" in err


@pytest.mark.parametrize("kwargs, message", [
    ({"records": []}, "empty"),
    ({"num_teachers": 13}, "only 12"),
    ({"model": "/no/such/model"}, "does not exist"),
    ({"accountant": "target-charging"}, "cannot account"),
])
def test_bad_inputs_refused_before_the_ledger(model_dir, tmp_path, kwargs, message):
    ledger = tmp_path / "bad.sqlite"
    with pytest.raises(ValueError, match=message):
        _run(model_dir, ledger, **kwargs)
    assert not ledger.exists()


def test_prompt_longer_than_context_window_refused_before_the_ledger(model_dir, tmp_path, capsys):
    long_records = [dict(r, instruction=" ".join([r["instruction"]] * 80)) for r in _records(12)]
    ledger = tmp_path / "long.sqlite"
    with pytest.raises(RunInputError, match=r"^argument --long-records refuse: 12 of 12 records are longer than "
                                            r"\d+ tokens, .*context window of 512 tokens") as caught:
        _run(model_dir, ledger, records=long_records)
    assert not ledger.exists()
    assert MARKER not in str(caught.value)
    with pytest.raises(RunInputError, match="on_long='skip': all 12 records"):
        _run(model_dir, ledger, records=long_records, long_records="skip")
    assert not ledger.exists()
    # Truncated, every record fits its share of the window: the run goes through, and says how many were cut.
    capsys.readouterr()
    result = _run(model_dir, ledger, records=long_records, long_records="truncate", progress=True)
    assert result["audit"]["ok"] and result["parameters"]["long_records"] == "truncate"
    err = capsys.readouterr().err
    assert "pate-accountant: 12 of 12 records truncated to " in err and MARKER not in err
    assert "12 of 12" not in json.dumps(result)  # the counts describe the data: on screen only
    # Half of them long, skipped in their places: the other six make the prompts.
    mixed = long_records[:6] + _records(12)[6:]
    skipped = _run(model_dir, tmp_path / "mixed.sqlite", records=mixed, long_records="skip", num_records=1,
                   ledger_home=tmp_path / "other-home")
    assert skipped["audit"]["ok"] and skipped["summary"]["requested"] == 1


def test_tokenizer_without_pad_or_eos_refused_before_the_ledger(model_dir, tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = tmp_path / "no-pad"
    LlamaForCausalLM.from_pretrained(model_dir).save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    tokenizer.save_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).pad_token_id is None
    ledger = tmp_path / "nopad.sqlite"
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        _run(folder, ledger)
    assert not ledger.exists()


def test_existing_file_that_is_no_data_set_ledger_refused(model_dir, tmp_path):
    ledger = tmp_path / "exists.sqlite"
    ledger.write_bytes(b"")
    with pytest.raises(RunInputError, match="cannot open it as a ledger"):  # issue 22, item 16
        _run(model_dir, ledger)
    assert ledger.read_bytes() == b""
    other = tmp_path / "garbage.sqlite"
    other.write_bytes(b"not a database at all " * 50)
    with pytest.raises(RunInputError, match="cannot open it as a ledger"):
        _run(model_dir, other)


def _generate_argv(model_dir, data, ledger, *extra):
    return ["generate", "--model", str(model_dir), "--data", str(data), "--teachers", "4",
            "--mechanism", "dp-argmax", "--accountant", "basic", "--budget-epsilon", "500", "--budget-delta", "0.5",
            "--step-epsilon", "8", "--step-delta", "0.001", "--ledger", str(ledger), "--records", "2",
            "--max-tokens", "4", "--seed", "3", "--threads", "1", *extra]


def test_cli_generate_json(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "cli.sqlite"
    assert main(_generate_argv(model_dir, data, ledger, "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audit"]["ok"] and len(out["records"]) == 2
    assert out["parameters"]["seeded"] is True and "seed" not in out["parameters"]
    assert MARKER.encode() not in ledger.read_bytes()
    assert main(["audit", str(ledger), "--json"]) == 0


def test_cli_generate_with_clipped_logit_sampling_charges_bounded_range_steps(model_dir, tmp_path, capsys):
    """InvisibleInk's mechanism through generate: RDP charges each token epsilon^2/8-zCDP (the ledger replays
    it), the default --top-p (a vote option) does not refuse the run, and no record text reaches the outputs."""
    from pate_accountant.events import BoundedRangeEvent, EpsilonDeltaEvent
    from pate_accountant.ledger import Ledger

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "ink.sqlite"
    argv = _generate_argv(model_dir, data, ledger, "--json", "--public-top-k", "5")
    for option, value in (("--mechanism", "clipped-logit-sampling"), ("--accountant", "rdp"),
                          ("--budget-epsilon", "50"), ("--budget-delta", "1e-6"), ("--step-epsilon", "1")):
        argv[argv.index(option) + 1] = value
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audit"]["ok"] and len(out["records"]) == 2 and MARKER not in json.dumps(out)
    read = Ledger.open(ledger, read_only=True)
    try:
        events = [row.event for row in read.rows()]
    finally:
        read.close()
    charged = [e for e in events if isinstance(e, BoundedRangeEvent)]
    # record level: a record changed, added or removed changes one teacher's distribution, so every step is
    # calibrated for one teacher replaced (the wider clip's half), whatever --relation the run states
    assert charged and all(e.epsilon == 1.0 and e.relation == "replace-one" for e in charged)
    assert not [e for e in events if isinstance(e, EpsilonDeltaEvent) and not isinstance(e, BoundedRangeEvent)]
    assert MARKER.encode() not in ledger.read_bytes()
    other = tmp_path / "other.jsonl"
    _write_jsonl(other, [dict(r, instruction=r["instruction"] + " added") for r in _records(8)])
    argv[argv.index("--data") + 1], argv[argv.index("--ledger") + 1] = str(other), str(tmp_path / "ink-add.sqlite")
    assert main([*argv, "--relation", "add-remove-one", "--records-per-teacher", "2"]) == 0
    capsys.readouterr()
    read = Ledger.open(tmp_path / "ink-add.sqlite", read_only=True)
    try:
        relations = {row.event.relation for row in read.rows() if isinstance(row.event, BoundedRangeEvent)}
    finally:
        read.close()
    assert relations == {"replace-one"}


@pytest.mark.parametrize("mechanism, charged", [("gaussian-averaged-distributions", "DiscreteGaussianSumEvent"),
                                                 ("svt-public-agreement", "SparseVectorEpisodeEvent")])
def test_cli_generate_with_the_peers_charges_one_teacher_replaced_at_record_level(model_dir, tmp_path, capsys,
                                                                                  mechanism, charged):
    """Tang et al.'s and Amin et al.'s mechanisms through generate under --relation add-remove-one with two records
    a teacher: a record added or removed changes one teacher's distribution, so every charged step is calibrated
    for one teacher replaced; the ledger replays (audit), and no record text reaches the outputs."""
    from pate_accountant import events
    from pate_accountant.ledger import Ledger

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "peer.sqlite"
    argv = _generate_argv(model_dir, data, ledger, "--json", "--public-top-k", "5", "--relation", "add-remove-one",
                          "--records-per-teacher", "2")
    for option, value in (("--mechanism", mechanism), ("--accountant", "rdp")):
        argv[argv.index(option) + 1] = value
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audit"]["ok"] and MARKER not in json.dumps(out)
    read = Ledger.open(ledger, read_only=True)
    try:
        rows = [row.event for row in read.rows()]
    finally:
        read.close()
    steps = [e for e in rows if isinstance(e, getattr(events, charged))]
    assert steps and {e.relation for e in steps} == {"replace-one"}
    assert MARKER.encode() not in ledger.read_bytes()


def test_cli_generate_text(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    assert main(_generate_argv(model_dir, data, tmp_path / "t.sqlite", "--no-progress")) == 0
    out = capsys.readouterr().out
    assert "audit       : OK" in out and "record 1" in out and MARKER not in out
    # 8 records over 4 teachers: 2 places each, the number of records being public under replace-one
    assert "privacy unit: one record, replace-one; each teacher shows at most 2 record(s)" in out
    assert "wall time   : " in out


#: Run in a child process: makes the tiny Llama's forward raise a library FutureWarning and log a transformers
#: warning on every step (as a deprecation in a new release would), then runs the command line.
_NOISY_LIBRARY = """
import functools, sys, warnings
import transformers.models.llama.modeling_llama as llama
from transformers.utils import logging as hf_logging
plain = llama.LlamaForCausalLM.forward
@functools.wraps(plain)
def forward(self, *args, **kwargs):
    warnings.warn_explicit("a deprecation of the library's", FutureWarning, llama.__file__, 1)
    hf_logging.get_logger(llama.__name__).warning("a log line of the library's")
    return plain(self, *args, **kwargs)
llama.LlamaForCausalLM.forward = forward
from pate_accountant.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("noisy", [False, True], ids=["as-installed", "noisy-library"])
def test_generate_json_leaves_stderr_empty_with_warnings_forced_on(model_dir, tmp_path, noisy):
    """``python -W default`` shows every warning Python would otherwise hide; a ``generate --json`` run still
    writes nothing at all on stderr, and ``--verbose`` (without ``--json``) shows each library warning once."""
    import subprocess
    import sys

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    argv = _generate_argv(model_dir, data, tmp_path / "quiet.sqlite", "--json")
    del argv[argv.index("--seed") : argv.index("--seed") + 2]  # an unseeded run: no warning of our own to give
    launch = ["-c", _NOISY_LIBRARY] if noisy else ["-m", "pate_accountant"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-W", "default", *launch, *argv], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    assert json.loads(done.stdout)["audit"]["ok"] is True
    if noisy:  # the same run, shown: one line per distinct library warning, each once, then the report
        argv[argv.index("--json")] = "--verbose"
        shown = subprocess.run([sys.executable, "-W", "default", *launch, *argv, "--no-progress"],
                               capture_output=True, text=True, env=env, timeout=600)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert shown.stderr.splitlines() == [
            "pate-accountant: library warning: FutureWarning: a deprecation of the library's",
            "pate-accountant: library warning: Warning: a log line of the library's",
        ]


@pytest.mark.parametrize("case", ["unknown-model", "empty-data", "too-many-teachers", "existing-ledger",
                                  "unreachable-threshold"])
def test_cli_generate_bad_inputs_exit_2(model_dir, tmp_path, capsys, case):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(3))
    ledger = tmp_path / "bad.sqlite"
    model = model_dir
    if case == "unknown-model":
        model = tmp_path / "missing-model"
    elif case == "empty-data":
        data.write_text("", encoding="utf-8")
    elif case == "existing-ledger":
        ledger.write_bytes(b"")
    argv = _generate_argv(model, data, ledger)
    if case == "too-many-teachers":
        argv[argv.index("--teachers") + 1] = "9"
    if case == "unreachable-threshold":  # DPArgMax(1, 1e-6, add/remove) has L = 14: 3 teachers never clear n/2 + L
        argv[argv.index("--step-epsilon") + 1] = "1"
        argv[argv.index("--step-delta") + 1] = "1e-6"
        argv[argv.index("--teachers") + 1] = "3"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and MARKER not in err
    if case == "unreachable-threshold":
        assert "n=3" in err and "n/2 + L" in err and "2L = 28" in err
    if case != "existing-ledger":
        assert not ledger.exists()
    else:
        assert ledger.read_bytes() == b""


def test_every_mechanism_name_builds_and_target_charging_takes_the_wrapped_ones():
    from pate_app.run import build_accountant, build_mechanism
    from mechanisms import BoundaryWrapper, registry

    names = registry.run_mechanism_names()
    assert names == ("dp-argmax", "boundary-dp-argmax", "dp-weighted-sampling", "boundary-dp-weighted-sampling",
                     "between-thresholds", "gaussian-argmax", "gaussian-threshold-argmax", "clipped-logit-sampling",
                     "gaussian-averaged-distributions", "svt-public-agreement")
    for name in names:
        mech = build_mechanism(name, 2.0, 1e-6, num_teachers=8)
        assert isinstance(mech, BoundaryWrapper) == name.startswith("boundary-")
        if name.startswith("boundary-"):
            assert build_accountant("target-charging", (1e4, 1e-3)).can_afford(mech.event)


# -- seeds never reach a shareable artifact ------------------------------------------------------------------

SEED = 987654321  # distinctive digits: they cannot appear by accident in the outputs checked below


def _ledger_bytes(ledger) -> bytes:
    """The ledger database with its WAL and shared-memory files (and a confidential file, if any)."""
    return b"".join(p.read_bytes() for p in sorted(ledger.parent.glob(ledger.name + "*")))


def _ledger_content(ledger) -> tuple:
    """The database file and its write-ahead log (empty or absent when nothing is pending).  SQLite's
    shared-memory index, which even a read-only reader may create, is not content."""
    wal = ledger.with_name(ledger.name + "-wal")
    return ledger.read_bytes(), wal.read_bytes() if wal.exists() else b""


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_cli_generate_seed_reaches_no_shareable_output(model_dir, tmp_path, capsys, json_output):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "seeded.sqlite"
    argv = _generate_argv(model_dir, data, ledger, *(["--json"] if json_output else ["--no-progress"]))
    argv[argv.index("--seed") + 1] = str(SEED)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert str(SEED) not in captured.out
    assert str(SEED).encode() not in _ledger_bytes(ledger)
    assert "warning" in captured.err and "no privacy against anyone who knows the seed" in captured.err
    assert str(SEED) not in captured.err  # the warning does not repeat it either
    if json_output:
        assert json.loads(captured.out)["parameters"]["seeded"] is True
    assert main(["audit", str(ledger)]) == 0
    audit = capsys.readouterr().out
    seeded = [line for line in audit.splitlines() if line.strip().startswith("seeded ")]
    assert seeded and seeded[0].endswith(": true") and str(SEED) not in audit


def test_cli_demo_seed_reaches_no_shareable_output(model_dir, tmp_path, capsys, monkeypatch):
    import pate_app.run.backends

    monkeypatch.setattr(pate_app.run.backends, "demo_model_path", lambda announce=True: model_dir)  # tiny, not SmolLM2
    ledger = tmp_path / "demo.sqlite"
    argv = ["demo", "--ledger", str(ledger), "--teachers", "64", "--records", "1", "--max-tokens", "3",
            "--step-epsilon", "8", "--step-delta", "0.001", "--budget-delta", "0.5", "--threads", "1", "--seed", str(SEED),
            "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["parameters"]["seeded"] is True and result["ledger"]["dataset"] == "bundled-sample"
    assert str(SEED) not in captured.out and str(SEED).encode() not in _ledger_bytes(ledger)
    assert "no privacy against anyone who knows the seed" in captured.err


# -- runs whose threshold is out of reach ---------------------------------------------------------------------


def test_unreachable_threshold_refused_before_anything_is_written(model_dir, tmp_path):
    # DPArgMax(1, 1e-6, add/remove) has L = 14: even 6 unanimous teachers never clear n/2 + L = 17 without noise
    ledger = tmp_path / "unreachable.sqlite"
    with pytest.raises(RunInputError, match=r"n/2 \+ L = 3 \+ 14 .* n=6 teachers") as caught:
        _run(model_dir, ledger, step_epsilon=1.0, step_delta=1e-6)
    assert "\n" not in str(caught.value)
    assert not ledger.exists()
    # on an existing ledger nothing changes either
    _run(model_dir, ledger, num_records=1, max_tokens=1)
    before = _ledger_content(ledger)
    with pytest.raises(RunInputError, match="out of reach"):
        _run(model_dir, ledger, step_epsilon=1.0, step_delta=1e-6)
    assert _ledger_content(ledger) == before
    # weighted sampling: counts below 2L need noise to survive
    from pate_app.run import build_mechanism

    bound = build_mechanism("dp-weighted-sampling", 1.0, 1e-6, "replace-one").error_bound
    assert 2 * bound > 6
    with pytest.raises(RunInputError, match=rf"2L = {2 * bound} .* n=6"):
        _run(model_dir, tmp_path / "ws.sqlite", mechanism="dp-weighted-sampling", step_epsilon=1.0, step_delta=1e-6,
             relation="replace-one")
    assert not (tmp_path / "ws.sqlite").exists()


def test_check_reachable_for_every_mechanism():
    from pate_app.run import build_mechanism, check_reachable
    from mechanisms import BetweenThresholds

    for name in ("dp-argmax", "boundary-dp-argmax"):
        mech = build_mechanism(name, 1.0, 1e-6, "add-remove-one")  # L = 14
        with pytest.raises(RunInputError, match="n=28"):
            check_reachable(mech, 28)
        check_reachable(mech, 29)
    check_reachable(BetweenThresholds(0.5, 5, 9), 5)
    with pytest.raises(RunInputError, match="low=5 .* n=4"):
        check_reachable(BetweenThresholds(0.5, 5, 9), 4)


# -- a ledger belongs to a data set: runs append and share its budget ------------------------------------------


def test_second_run_appends_and_spends_the_same_budget(model_dir, tmp_path, capsys):
    ledger = tmp_path / "dataset.sqlite"
    first = _run(model_dir, ledger, num_records=1, max_tokens=3, dataset="toy-records")
    assert first["ledger"]["appended"] is False and first["ledger"]["run"] == 1
    second = _run(model_dir, ledger, num_records=1, max_tokens=3, dataset="toy-records", seed=None)
    assert second["ledger"]["appended"] is True and second["ledger"]["run"] == 2
    assert second["spent_before"] == first["spent"]
    rows = first["charged_runs"] + second["charged_runs"]
    assert second["ledger"]["rows"] == rows and second["ledger"]["run_rows"] == second["charged_runs"]
    assert second["spent"]["epsilon"] == pytest.approx(8.0 * rows)  # basic composition over both runs
    assert second["audit"]["ok"]
    with Ledger.open(str(ledger), read_only=True) as opened:
        runs = opened.runs
        assert [r["id"] for r in runs] == [1, 2]
        assert [r["metadata"]["seeded"] for r in runs] == [True, False]
        assert [r["first_row"] for r in runs] == [0, first["charged_runs"]]
        assert [row.run for row in opened.rows()] == [1] * first["charged_runs"] + [2] * second["charged_runs"]
    assert main(["audit", str(ledger), "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    assert audit["dataset"] == "toy-records" and len(audit["runs"]) == 2
    for run in audit["runs"]:
        meta = run["metadata"]
        assert {"mechanism", "accountant", "budget", "seeded", "software_version"} <= set(meta)
        assert "seed" not in meta
    assert main(["audit", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert "run 1 (" in text and "run 2 (" in text and "data set    : toy-records" in text


@pytest.mark.parametrize("change, message", [
    ({"dataset": "other-records"}, "belongs to the data set 'toy-records', not 'other-records'"),
    ({"accountant": "pld"}, "another accountant or budget.*kind"),
    ({"epsilon": 300.0}, "another accountant or budget.*budget"),
    ({"relation": "add-remove-one", "records_per_teacher": 2},
     "states its guarantee for replace-one of records, and this run's relation is add-remove-one"),
])
def test_other_data_set_or_accountant_refused_before_the_run(model_dir, tmp_path, change, message):
    ledger = tmp_path / "dataset.sqlite"
    _run(model_dir, ledger, num_records=1, max_tokens=2, dataset="toy-records")
    before = _ledger_content(ledger)
    with pytest.raises(RunInputError, match=message) as caught:
        _run(model_dir, ledger, **{"num_records": 1, "max_tokens": 2, "dataset": "toy-records", **change})
    assert "\n" not in str(caught.value)
    assert _ledger_content(ledger) == before


def test_other_relation_on_an_existing_ledger_is_a_usage_error(model_dir, tmp_path, capsys):
    """Issue 22, item 4 (issue 31: the relation is of records): a ledger kept under one relation, a run stated
    under the other: exit 2 with one line naming --relation, no traceback, nothing charged."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "relation.sqlite"
    assert main(_generate_argv(model_dir, data, ledger, "--json", "--relation", "add-remove-one",
                               "--records-per-teacher", "2")) == 0
    capsys.readouterr()
    before = _ledger_content(ledger)
    assert main(_generate_argv(model_dir, data, ledger, "--relation", "replace-one")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--relation" in err and "add-remove-one" in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    assert _ledger_content(ledger) == before


def test_one_data_set_one_ledger_on_an_installation(model_dir, tmp_path, capsys):
    """Issue 22, item 3, the attack transcript: three ledgers for one data set used to spend three budgets (epsilon
    30 while each reported at most 10).  Now the first run registers its ledger under the records' fingerprint;
    a run that names another ledger for the same records is refused in one line naming the first ledger, before
    anything is written, and a run without --ledger charges the registered one."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    first, second = tmp_path / "first.sqlite", tmp_path / "second.sqlite"
    budget = ["--budget-epsilon", "10", "--budget-delta", "0.5"]

    def argv(ledger, *extra):
        out = _generate_argv(model_dir, data, ledger, *extra)
        at = out.index("--budget-epsilon")
        out[at : at + 4] = budget
        return out

    assert main(argv(first, "--json", "--cut-records")) == 0  # a record the budget cuts: one step is charged
    spent = json.loads(capsys.readouterr().out)["spent"]["epsilon"]
    assert spent == pytest.approx(8.0)  # one step of epsilon 8 fits a budget of 10
    assert main(argv(second, "--json")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"these records (or some of them) are already charged to the ledger {str(first)!r}" in err
    assert not second.exists()
    shuffled = tmp_path / "shuffled.jsonl"  # the same records in another order are the same data set
    _write_jsonl(shuffled, list(reversed(_records(8))))
    moved = argv(second, "--json")
    moved[moved.index("--data") + 1] = str(shuffled)
    moved += ["--dataset", "data.jsonl"]
    assert main(moved) == 2 and not second.exists()
    capsys.readouterr()
    without = argv(first, "--json")
    del without[without.index("--ledger") : without.index("--ledger") + 2]
    assert main(without) == 2  # the registered ledger: its budget of 10 cannot pay for a second step of 8
    assert f"--ledger {str(first)!r}: the budget of data set 'data.jsonl'" in capsys.readouterr().err
    with Ledger.open(str(first), read_only=True) as opened:
        assert opened.row_count == 1 and len(opened.runs) == 1
        fingerprint = opened.runs[0]["metadata"]["dataset_fingerprint"]
    assert fingerprint.startswith("hmac-sha256:") and MARKER not in fingerprint


def test_demos_from_two_folders_share_one_budget(model_dir, tmp_path, capsys, monkeypatch):
    """Issue 22, item 3: demo's default ledger was ./pate-demo.sqlite, so a demo run from another folder spent
    another budget; now both runs charge the sample's one ledger in the ledger home."""
    import pate_app.run.backends

    monkeypatch.setattr(pate_app.run.backends, "demo_model_path", lambda announce=True: model_dir)  # tiny, not SmolLM2
    argv = ["demo", "--teachers", "64", "--records", "1", "--max-tokens", "2", "--step-epsilon", "8",
            "--step-delta", "0.001", "--budget-delta", "0.5", "--threads", "1", "--json"]
    results = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        assert main(argv) == 0
        results.append(json.loads(capsys.readouterr().out))
        assert list((tmp_path / folder).iterdir()) == []  # nothing written into the current folder
    assert results[0]["ledger"]["path"] == results[1]["ledger"]["path"]
    assert results[1]["ledger"]["runs"] == 2 and results[1]["ledger"]["appended"] is True
    assert results[1]["spent_before"] == results[0]["spent"]
    # The sample is public: the tutorial's own ledger for it is not refused after the demos.
    tutorial = ["generate", "--model", str(model_dir), "--data", "bundled", "--ledger", str(tmp_path / "t.sqlite"),
                *argv[1:], "--budget-epsilon", "96"]
    assert main(tutorial) == 0
    assert json.loads(capsys.readouterr().out)["ledger"]["runs"] == 1


@pytest.mark.parametrize("mechanism", ["gaussian-argmax", "gaussian-threshold-argmax"])
def test_gaussian_aggregators_run_and_are_charged_by_pld(model_dir, tmp_path, mechanism):
    """Issue 23, item 1: GNMax, plain and thresholded at a strict majority of the configured teachers, runs in
    generate under the PLD accountant; the thresholded form fails (public fallback) where the plain one always
    releases; the ledger audits and records the mechanism's noise and threshold, never a vote."""
    result = _run(model_dir, tmp_path / "gnmax.sqlite", mechanism=mechanism, accountant="pld", step_epsilon=20.0,
                  step_delta=1e-6, relation="replace-one", epsilon=50.0, delta=1e-5, num_records=1, max_tokens=4)
    assert result["audit"]["ok"] and 0 < result["spent"]["epsilon"] <= 50.0
    described = result["parameters"]["mechanism"]
    expected = "GaussianNoisyArgMax" if mechanism == "gaussian-argmax" else "GaussianThresholdArgMax"
    assert described["class"].endswith(expected)
    record = result["records"][0]
    assert record["private_tokens"] + record["fallback_tokens"] == record["num_tokens"]
    if mechanism == "gaussian-argmax":
        assert record["fallback_tokens"] == 0  # the argmax of the noisy histogram is always released
    else:
        assert described["parameters"]["threshold"] == 6 // 2 + 1


def test_spent_budget_refused_before_the_run(model_dir, tmp_path):
    ledger = tmp_path / "small.sqlite"
    first = _run(model_dir, ledger, epsilon=24.0, num_records=2, max_tokens=6,
                 cut_records=True)  # three steps of epsilon 8: the record is cut
    assert first["records"][-1]["stop_reason"] == "budget" and first["spent"]["epsilon"] == pytest.approx(24.0)
    before = _ledger_content(ledger)
    with pytest.raises(RunInputError, match="cannot pay for another step"):
        _run(model_dir, ledger, epsilon=24.0)
    assert _ledger_content(ledger) == before


def test_cli_generate_twice_on_one_ledger(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "twice.sqlite"
    for expected_runs in (1, 2):
        assert main(_generate_argv(model_dir, data, ledger, "--json")) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["ledger"]["runs"] == expected_runs and out["ledger"]["dataset"] == "data.jsonl"
    argv = _generate_argv(model_dir, data, ledger, "--dataset", "another")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "belongs to the data set 'data.jsonl'" in err


@pytest.mark.parametrize("ray", [False, True], ids=["in-process", "ray-local"])
def test_cli_generate_on_worker_shards_equals_the_unsharded_run(model_dir, tmp_path, capsys, ray, monkeypatch):
    """``--workers 2`` (in this process, one shared model; or two Ray actors of a local cluster that each load the
    model, plus one for the public fallback) releases the same records and spends the same budget."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    assert main(_generate_argv(model_dir, data, tmp_path / "one.sqlite", "--json")) == 0
    plain = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "another-installation"))  # the same records again
    extra = ("--workers", "2") + (("--ray-address", "local") if ray else ())
    assert main(_generate_argv(model_dir, data, tmp_path / "two.sqlite", "--json", *extra)) == 0
    sharded = json.loads(capsys.readouterr().out)
    assert sharded["audit"]["ok"]
    assert sharded["records"] == plain["records"] and sharded["spent"] == plain["spent"]
    assert sharded["parameters"]["workers"] == 2
    assert sharded["parameters"]["executor"] == ("ray" if ray else "in-process")
    if ray:
        import ray as ray_module

        assert not ray_module.is_initialized()  # the run's executor started Ray and shut it down


def test_two_processes_racing_on_one_new_ledger_with_different_budgets(model_dir, tmp_path):
    """Issue 14, item 1, with two real processes: both are given the same new --ledger, one with budget
    epsilon 40 and one with 30.  The ledger is created once (complete), one run charges it, and the other is
    refused (exit 2) without writing anything: every row belongs to the run whose budget the ledger keeps,
    and that run's metadata is its own row."""
    import subprocess
    import sys

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "raced.sqlite"

    def start(budget):
        argv = [sys.executable, "-m", "pate_accountant", *_generate_argv(model_dir, data, ledger, "--json",
                                                                         "--cut-records")]
        argv[argv.index("--budget-epsilon") + 1] = budget
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    racers = [start("40"), start("30")]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=600)
        outcomes.append((racer.returncode, out, err))
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], outcomes
    winner = next(json.loads(out) for code, out, _ in outcomes if code == 0)
    loser_err = next(err for code, _, err in outcomes if code == 2)
    assert "budget" in loser_err and MARKER not in loser_err
    with Ledger.open(ledger, read_only=True) as opened:
        result = opened.verify()
        assert result.ok and len(result.runs) == 1
        assert result.budget == (winner["budget"]["epsilon"], winner["budget"]["delta"])
        assert result.runs[0]["metadata"]["budget"] == winner["budget"]
        assert opened.row_count == winner["ledger"]["rows"] > 0
    assert sorted(p.name for p in tmp_path.iterdir() if ".creating" in p.name) == []


_HELD_RUN = """
import sys, time
from pathlib import Path
import pate_app.run.stages as run

claimed, go = Path(sys.argv[1]), Path(sys.argv[2])
load = run._backends

def held_load(*args, **kwargs):  # the run has claimed its ledger; its model load waits for the test
    claimed.touch()
    while not go.exists():
        time.sleep(0.02)
    return load(*args, **kwargs)

run._backends = held_load
if "--no-fit" in sys.argv:  # the early fit to the window passes (an estimate): the prompts' own check refuses later
    sys.argv.remove("--no-fit")
    run._fit_to_window = lambda spec, task, plan, model, announce, public_blocks=None: list(task.records)
from pate_accountant.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("second", ["other budget", "same budget", "first refused later"])
def test_a_run_claims_its_ledger_before_the_model_loads(model_dir, tmp_path, second):
    """Issue 14, item 1, with two real processes.  The first run is held while its model loads (after its
    claim); the second is started on the same new --ledger meanwhile.  Another budget is refused at once,
    while the first is still loading, and writes nothing; the same budget joins, and both runs charge the one
    ledger.  A first run that is refused after its claim (its prompts do not fit the model) does not remove
    the ledger the second run joined (the early fit of records to the window is bypassed there, so that the
    prompts' own check after the claim is what refuses)."""
    import subprocess
    import sys

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    short_window = tmp_path / "short-window"  # the same model with a context window the prompts do not fit
    shutil.copytree(model_dir, short_window)
    config = json.loads((short_window / "config.json").read_text())
    (short_window / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=16)))
    ledger = tmp_path / "claimed.sqlite"
    claimed, go = tmp_path / "claimed", tmp_path / "go"
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def argv(budget, model):
        args = _generate_argv(model, data, ledger, "--json", "--dataset", "sample")
        args[args.index("--budget-epsilon") + 1] = budget
        return args

    first_model = short_window if second == "first refused later" else model_dir
    no_fit = ["--no-fit"] if second == "first refused later" else []
    first = subprocess.Popen([sys.executable, "-c", _HELD_RUN, str(claimed), str(go), *no_fit,
                              *argv("500", first_model)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(3000):
            if claimed.exists() or first.poll() is not None:
                break
            time.sleep(0.02)
        assert claimed.exists(), first.communicate()
        with Ledger.open(ledger, read_only=True) as opened:  # claimed: data set and budget stored, no run yet
            assert opened.dataset == "sample" and opened.config["budget"] == [500.0, 0.5] and not opened.runs
        before = ledger.read_bytes()
        budget = "400" if second == "other budget" else "500"
        other = subprocess.run([sys.executable, "-m", "pate_accountant", *argv(budget, model_dir)],
                               capture_output=True, text=True, env=env, timeout=600)
        if second == "other budget":
            assert other.returncode == 2 and first.poll() is None  # refused while the first still loads
            assert "budget" in other.stderr and MARKER not in other.stderr
            assert ledger.read_bytes() == before
        else:
            assert other.returncode == 0, other.stderr
            assert json.loads(other.stdout)["ledger"]["appended"] is True  # it joined the first run's ledger
    finally:
        go.touch()
        out, err = first.communicate(timeout=600)
    with Ledger.open(ledger, read_only=True) as opened:
        result = opened.verify()
        assert result.ok and result.budget == (500.0, 0.5)
        runs = [run["metadata"]["budget"]["epsilon"] for run in result.runs]
    if second == "first refused later":
        assert first.returncode == 2 and "context window" in err and MARKER not in err
        assert runs == [500.0]  # the second run's, kept
    else:
        assert first.returncode == 0, err
        assert runs == ([500.0] if second == "other budget" else [500.0, 500.0])
    assert sorted(p.name for p in tmp_path.iterdir() if ".creating" in p.name) == []


def test_cli_generate_signs_a_checkpoint_that_the_audit_checks(model_dir, tmp_path, capsys):
    """Issue 14, item 2: a run given --signing-key ends with a signed checkpoint of its ledger's head; every run
    appends one, and `audit --public-key` checks the ledger against all of them."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger, key = tmp_path / "signed.sqlite", tmp_path / "operator.key"
    assert main(["keygen", str(key)]) == 0
    heads = []
    for _ in range(2):
        capsys.readouterr()
        assert main(_generate_argv(model_dir, data, ledger, "--json", "--signing-key", str(key))) == 0
        result = json.loads(capsys.readouterr().out)
        checkpoint = result["ledger"]["checkpoint"]
        assert checkpoint["rows"] == result["ledger"]["rows"] and checkpoint["head_hash"] == result["ledger"]["head_hash"]
        heads.append(checkpoint["head_hash"])
    lines = (tmp_path / "signed.sqlite.checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(line)["head_hash"] for line in lines] == heads
    # Issue 22, item 6: a run's checkpoint is stamped with the run's start, so the shareable file does not tell
    # how long the run took (which depends on the data).
    with Ledger.open(str(ledger), read_only=True) as opened:
        starts = [run["created"] for run in opened.runs]
    assert [json.loads(line)["signed_at"] for line in lines] == starts
    assert main(["audit", str(ledger), "--public-key", f"{key}.pub"]) == 0
    assert "2 signed checkpoint(s)" in capsys.readouterr().out
    assert main(_generate_argv(model_dir, data, ledger, "--signing-key", str(key))) == 0  # text output
    assert "signed      : checkpoint of the first" in capsys.readouterr().out


def test_a_checkpoint_that_cannot_be_written_keeps_the_run(model_dir, tmp_path, capsys, monkeypatch):
    """Issue 22, item 11: a checkpoints file that is no regular file (``/dev/full``) is refused before the
    claim; one that fails at the end (a full disk) still prints the records and the pin, says in one line that
    the checkpoint was not written, and exits 1 with the ledger charged and auditing."""
    import errno

    import pate_app.run.ledger

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger, key = tmp_path / "unsigned.sqlite", tmp_path / "operator.key"
    assert main(["keygen", str(key)]) == 0
    capsys.readouterr()
    if os.path.exists("/dev/full"):
        argv = _generate_argv(model_dir, data, ledger, "--signing-key", str(key), "--checkpoints", "/dev/full")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--checkpoints" in err and "/dev/full" in err and "Traceback" not in err
        assert not ledger.exists()

    def disk_full(path, checkpoint):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(pate_app.run.ledger, "append_checkpoint", disk_full)
    assert main(_generate_argv(model_dir, data, ledger, "--no-progress", "--signing-key", str(key))) == 1
    out = capsys.readouterr().out
    assert "record 1:" in out and "pin         : pate-accountant audit" in out
    failed = [line for line in out.splitlines() if line.startswith("signed      : NOT WRITTEN")]
    assert len(failed) == 1 and "No space left on device" in failed[0]
    assert "audit       : OK" in out
    assert main(_generate_argv(model_dir, data, ledger, "--json", "--signing-key", str(key))) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["ledger"]["checkpoint"] is None and "not written" in result["ledger"]["checkpoint_error"]
    assert result["spent"]["epsilon"] > 0 and result["audit"]["ok"] is True
    assert main(["audit", str(ledger)]) == 0


def test_a_ledger_that_stops_taking_charges_ends_the_run_with_its_finished_records(model_dir, tmp_path, capsys,
                                                                                    monkeypatch):
    """Issue 22, item 15: a charge that SQLite refuses mid-run (a full disk, a file made read-only) stops the run
    in one line with exit 1; the finished records are printed, the ledger holds every charge made before and
    audits, and nothing is charged twice."""
    import sqlite3

    from pate_accountant.ledger import Ledger as LedgerClass

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "full.sqlite"
    plain = LedgerClass.transaction
    charges = {"n": 0}

    def transaction(self, accountant):
        charges["n"] += 1
        if charges["n"] > 5:
            raise sqlite3.OperationalError("database or disk is full")
        return plain(self, accountant)

    monkeypatch.setattr(LedgerClass, "transaction", transaction)
    argv = _generate_argv(model_dir, data, ledger, "--no-progress")
    argv[argv.index("--max-tokens") + 1] = "3"  # records of at most 3 charged steps: the first one finishes
    argv[argv.index("--records") + 1] = "3"
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "record 1:" in captured.out
    stopped = [line for line in captured.out.splitlines() if line.startswith("stopped     :")]
    assert len(stopped) == 1 and "database or disk is full" in stopped[0] and "finished record" in stopped[0]
    monkeypatch.setattr(LedgerClass, "transaction", plain)
    assert main(["audit", str(ledger), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 5


def test_a_model_that_cannot_load_is_a_usage_error(model_dir, tmp_path, capsys):
    """Issue 22, item 15: a model folder whose config.json is broken: one line under --model, exit 2, and the
    ledger this run created for its claim is removed again."""
    broken = tmp_path / "broken-model"
    shutil.copytree(model_dir, broken)
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "never.sqlite"
    assert main(_generate_argv(broken, data, ledger)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--model" in err.strip().splitlines()[-1]
    assert not ledger.exists()


def test_an_unusable_signing_key_is_refused_before_the_ledger(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger, key = tmp_path / "never.sqlite", tmp_path / "not-a-key.pem"
    key.write_text("hello\n")
    assert main(_generate_argv(model_dir, data, ledger, "--signing-key", str(key))) == 2
    err = capsys.readouterr().err
    assert "--signing-key" in err and "not-a-key.pem" in err
    assert not ledger.exists()
    assert main(_generate_argv(model_dir, data, ledger, "--checkpoints", str(tmp_path / "c.jsonl"))) == 2
    assert "--checkpoints (signing.checkpoints) needs --signing-key" in capsys.readouterr().err
    assert not ledger.exists()


def test_the_pin_a_run_prints_is_an_audit_command_that_catches_a_rewrite(model_dir, tmp_path, capsys):
    """Issue 14, item 2: the `pin` line of a run is a complete `audit` command (rows, head, runs and run head);
    it passes on the ledger as the run left it and after later honest runs, and fails once the run's metadata
    (which the row chain does not cover) is rewritten consistently."""
    import shlex
    import sqlite3

    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "pinned.sqlite"
    assert main(_generate_argv(model_dir, data, ledger)) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("pin "))
    argv = shlex.split(line.split(":", 1)[1].split("  (", 1)[0])
    assert argv[:3] == ["pate-accountant", "audit", str(ledger)] and "--expect-run-head" in argv
    assert main(argv[1:]) == 0
    assert main(_generate_argv(model_dir, data, ledger)) == 0  # a later run extends the pin
    capsys.readouterr()
    assert main(argv[1:]) == 0
    capsys.readouterr()

    from test_checkpoints import _rehash_runs

    conn = sqlite3.connect(ledger, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    metadata = json.loads(conn.execute("SELECT metadata FROM runs WHERE id = 1").fetchone()[0])
    assert metadata["seeded"] is True
    metadata["seeded"] = False  # the forger hides that the first run was seeded (no privacy)
    conn.execute("UPDATE runs SET metadata = ? WHERE id = 1", (json.dumps(metadata),))
    _rehash_runs(conn)
    conn.close()
    assert main(["audit", str(ledger)]) == 0  # consistent: the chain alone cannot tell
    capsys.readouterr()
    assert main(argv[1:]) == 1
    assert "run 1 does not have the pinned hash" in capsys.readouterr().err


def test_groups_each_spend_the_budget_and_the_run_costs_the_costliest(model_dir, tmp_path):
    """Issue 23, item 3: with --groups 2 each group of 3 teachers spends the whole budget (3 steps of epsilon 8
    for epsilon 24), in turn; the ledger holds each group's own charges, and the data set's spend is one
    group's, not the sum."""
    ledger = tmp_path / "groups.sqlite"
    result = _run(model_dir, ledger, epsilon=24.0, num_records=4, max_tokens=6, groups=2, cut_records=True)
    assert result["audit"]["ok"] and result["spent"]["epsilon"] == pytest.approx(24.0)
    assert [r["group"] for r in result["records"]] == [0, 1]
    assert [r["stop_reason"] for r in result["records"]] == ["budget", "budget"]
    assert [r["charged_runs"] for r in result["records"]] == [3, 3]
    assert result["parameters"]["groups"] == 2 and result["parameters"]["teachers_per_group"] == 3
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert [row.group for row in opened.rows()] == [0, 0, 0, 1, 1, 1]
        assert opened.verify().ok
    single = _run(model_dir, tmp_path / "single.sqlite", epsilon=24.0, num_records=4, max_tokens=6,
                  ledger_home=tmp_path / "another-installation", cut_records=True)
    assert single["charged_runs"] == 3  # without groups the same budget pays for one group's steps only
    whole = _run(model_dir, tmp_path / "whole.sqlite", epsilon=24.0, num_records=4, max_tokens=6, groups=2,
                 ledger_home=tmp_path / "a-third-installation")
    # by default no group starts a record its 3 affordable steps may not finish (6 tokens at most)
    assert whole["charged_runs"] == 0 and whole["records"] == [] and whole["remaining"]["records_afforded"] == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"groups": 4}, r"does not split evenly over --groups 4 equal groups \(use a multiple of 4: 4 or 8\)"),
    ({"groups": 0}, r"^model\.groups must be >= 1, got 0"),
    ({"groups": 6}, "out of reach"),
])
def test_bad_groups_refused_before_the_ledger(model_dir, tmp_path, kwargs, message):
    ledger = tmp_path / "never.sqlite"
    with pytest.raises(RunInputError, match=message):
        _run(model_dir, ledger, **kwargs)
    assert not ledger.exists()


def test_a_replaced_record_changes_one_group_only():
    """The attack transcript of parallel composition: neighbouring data sets (one record replaced) give every
    group but one the same teacher prompts, whatever the record; so only that group's answers can differ."""
    import numpy as np

    from pate_app.run import group_prompts

    records = _records(24)
    for j in range(len(records)):
        other = list(records)
        other[j] = {**records[j], "instruction": "an entirely different request", "response": "another answer"}
        first = group_prompts(records, 12, 4, np.random.default_rng(5))
        second = group_prompts(other, 12, 4, np.random.default_rng(5))
        assert sum(a != b for a, b in zip(first, second)) == 1


def test_individual_charging_with_the_public_candidate_runs_once_per_data_set(model_dir, tmp_path, capsys):
    """Issue 23, item 2: generate offers the individual-charging scheme with the public model's token as the
    BetweenThresholds candidate.  The teacher sets stay in the confidential file, the ledger audits, the spend is
    the worst teacher's; a second run on the data set's ledger is refused before the model loads (another run's
    teacher i holds other records, so counters added up by teacher index could under-count a record)."""
    ledger = tmp_path / "individual.sqlite"
    result = _run(model_dir, ledger, mechanism="between-thresholds", accountant="individual-charging",
                  step_epsilon=0.2, relation="replace-one", epsilon=30.0, delta=1e-5, num_records=1, max_tokens=6)
    assert result["audit"]["ok"], result["audit"]
    described = result["parameters"]["mechanism"]
    assert described["class"].endswith("BetweenThresholds")
    assert (described["parameters"]["low"], described["parameters"]["high"]) == (2, 12)  # n = 6: ceil(6/5), + 2/0.2
    from pate_accountant.ledger import confidential_path

    assert Path(confidential_path(ledger)).is_file()
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert opened.config["kind"] == "individual-charging" and opened.config["num_teachers"] == 6
        assert all(not row.charged_teachers for row in opened.rows())  # the shareable file names no teacher
    before = _ledger_content(ledger)
    with pytest.raises(RunInputError, match="takes one run"):
        _run(model_dir, ledger, mechanism="between-thresholds", accountant="individual-charging", step_epsilon=0.2,
             relation="replace-one", epsilon=30.0, delta=1e-5, num_records=1, max_tokens=6)
    assert _ledger_content(ledger) == before


@pytest.mark.parametrize("accountant", ["pld", "target-charging"])
def test_the_public_candidate_query_runs_under_other_accountants(model_dir, tmp_path, accountant):
    result = _run(model_dir, tmp_path / f"{accountant}.sqlite", mechanism="between-thresholds", accountant=accountant,
                  step_epsilon=0.2, relation="replace-one", epsilon=30.0, delta=1e-5, num_records=1, max_tokens=4)
    assert result["audit"]["ok"] and result["spent"]["epsilon"] <= 30.0


def test_individual_charging_refuses_another_mechanism_and_groups(model_dir, tmp_path):
    with pytest.raises(RunInputError, match="needs a BetweenThresholds mechanism"):
        _run(model_dir, tmp_path / "a.sqlite", accountant="individual-charging", relation="replace-one")
    with pytest.raises(RunInputError, match="does not compose groups in parallel"):
        _run(model_dir, tmp_path / "b.sqlite", mechanism="between-thresholds", accountant="individual-charging",
             step_epsilon=0.2, relation="replace-one", groups=2)
    assert not (tmp_path / "a.sqlite").exists() and not (tmp_path / "b.sqlite").exists()


def _support_csv(path, per_label: int = 4) -> None:
    """Invented support messages with a label column, each carrying the marker word."""
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["message", "topic"])
        for i in range(per_label):
            for topic, words in (("billing", "charged twice for"), ("shipping", "parcel is late for"),
                                 ("account", "cannot log in for")):
                writer.writerow([f"I was {words} order {i} {MARKER}, please help", topic])


def test_cli_generate_per_label_from_a_csv_of_free_text(model_dir, tmp_path, capsys):
    """Issue 24 items 1-2 through the command line: a CSV of free text with a label column, the records
    template, one group of teachers per label (parallel groups), records generated in turn over the labels;
    the ledger holds each label group's charges and no record text, and audits."""
    data, ledger = tmp_path / "support.csv", tmp_path / "support.sqlite"
    _support_csv(data)
    argv = ["generate", "--data", str(data), "--text-field", "message", "--label-field", "topic",
            "--labels", "account,billing,shipping", "--model", str(model_dir), "--ledger", str(ledger),
            "--teachers", "12", "--records", "3", "--max-tokens", "4", "--step-epsilon", "8", "--step-delta", "1e-3",
            "--budget-epsilon", "200", "--budget-delta", "0.5", "--seed", "0", "--threads", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in out["records"]] == ["account", "billing", "shipping"]
    assert out["parameters"]["template"] == "records" and out["parameters"]["labels"] == ["account", "billing",
                                                                                            "shipping"]
    assert out["parameters"]["groups"] == 3 and out["parameters"]["teachers_per_group"] == 4
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert {row.group for row in opened.rows()} <= {0, 1, 2} and opened.verify().ok
    assert MARKER.encode() not in ledger.read_bytes()
    per_label = list(argv)
    per_label[per_label.index("--records"):per_label.index("--records") + 2] = ["--per-label", "2"]
    per_label[per_label.index("--ledger") + 1] = str(ledger)
    assert main(per_label) == 0  # two of each label, in turn
    out2 = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in out2["records"]] == ["account", "billing", "shipping"] * 2, \
        [(r["label"], r["stop_reason"]) for r in out2["records"]]
    assert out2["summary"]["requested"] == 6
    # the labels are the user's public list: a label field without it, or a label outside it, is refused
    assert main(argv[:6] + argv[8:]) == 2
    assert "give the labels to generate for with --labels" in capsys.readouterr().err
    bad = list(argv)
    bad[bad.index("account,billing,shipping")] = "account,billing"
    assert main(bad) == 2
    assert "outside the 2 labels given" in capsys.readouterr().err


def test_the_public_prior_options_run_and_are_recorded(model_dir, tmp_path, capsys):
    """Issue 23, item 2: --public-mix and --public-top-k reach the generator (a mixed run at the same seed
    differs from the plain one) and the run's shareable metadata; bad values are one-line usage errors."""
    data, ledger = tmp_path / "data.jsonl", tmp_path / "prior.sqlite"
    _write_jsonl(data, _records(8))
    assert main(_generate_argv(model_dir, data, ledger, "--json", "--public-mix", "0.5", "--public-top-k", "20")) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert mixed["audit"]["ok"]
    assert mixed["parameters"]["public_mix"] == 0.5 and mixed["parameters"]["public_top_k"] == 20
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert opened.runs[0]["metadata"]["public_mix"] == 0.5
    assert main(_generate_argv(model_dir, data, ledger, "--json")) == 0  # the data set's one ledger, run 2
    plain = json.loads(capsys.readouterr().out)
    assert plain["parameters"]["public_mix"] == 0.0 and plain["ledger"]["runs"] == 2
    assert [r["outcomes"] for r in mixed["records"]] != [r["outcomes"] for r in plain["records"]] or \
        [r["text"] for r in mixed["records"]] != [r["text"] for r in plain["records"]]
    assert main(_generate_argv(model_dir, data, tmp_path / "bad.sqlite", "--public-mix", "1.5")) == 2
    assert "argument --public-mix: must be a number in [0, 1], got 1.5" in capsys.readouterr().err


def test_out_file_keeps_finished_records_and_marks_a_budget_cut(model_dir, tmp_path, capsys):
    """Issue 24, item 3: --out gets each finished record as a JSON line (text, token counts, stop reason,
    complete); a record the budget cut is left out unless --keep-partial; the summary says it in words; an
    existing --out file is refused before anything is charged."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    out, ledger = tmp_path / "synthetic.jsonl", tmp_path / "out.sqlite"
    argv = _generate_argv(model_dir, data, ledger, "--out", str(out), "--records", "3", "--max-tokens", "6",
                          "--budget-epsilon", "72", "--cut-records")  # nine steps of epsilon 8: the second is cut
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["complete"] is True
    assert set(lines[0]) == {"text", "complete", "private_tokens", "public_tokens", "num_tokens", "stop_reason"}
    assert "1 of 3 requested records; 1 cut by the budget; 1 missing; 1 record written to" in text
    assert "remaining   : none: the budget (epsilon 72, delta 0.5) is spent" in text
    assert MARKER not in out.read_text()
    before = _ledger_content(ledger)
    assert main(argv) == 2  # the file exists: refused before the ledger is touched
    assert "already exists" in capsys.readouterr().err and _ledger_content(ledger) == before
    partial = tmp_path / "partial.csv"
    argv = _generate_argv(model_dir, data, tmp_path / "p.sqlite", "--out", str(partial), "--keep-partial",
                          "--records", "3", "--max-tokens", "6", "--budget-epsilon", "72", "--json", "--cut-records")
    argv[argv.index("--ledger") + 1] = str(ledger)  # one data set, one ledger: its budget is spent now
    assert main(argv) == 2
    assert "cannot pay for another step" in capsys.readouterr().err and not partial.exists()


def test_a_record_starts_only_when_its_budget_pays_for_all_of_it(model_dir, tmp_path, capsys):
    """Issue 34, lever 6: by default the budget ends between records.  Nine steps of epsilon 8 and records of at
    most 6 steps: the first record is made, the second is not started (its worst case, 6 more steps, is not paid
    for), nothing is cut, and the run says how many whole records the rest of the budget pays for."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "whole.sqlite"
    argv = _generate_argv(model_dir, data, ledger, "--records", "3", "--max-tokens", "6", "--budget-epsilon", "72",
                          "--json")
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["cut_by_budget"] == 0 and out["summary"]["complete"] == 1
    assert all(r["complete"] for r in out["records"]) and out["charged_runs"] <= 6
    left = 72 - out["spent"]["epsilon"]
    assert out["remaining"]["records_afforded"] == int(left // 48 + 1e-9) == 0
    other = tmp_path / "other.jsonl"  # another data set: the first one's budget is its ledger's
    _write_jsonl(other, [dict(r, instruction=r["instruction"] + " again") for r in _records(8)])
    argv = _generate_argv(model_dir, other, tmp_path / "more.sqlite", "--records", "1", "--max-tokens", "6",
                          "--budget-epsilon", "400", "--no-progress")
    assert main(argv) == 0
    text = capsys.readouterr().out
    spent = float(text.split("spent       : epsilon ")[1].split(",")[0])
    afforded = int((400 - spent) // 48 + 1e-9)
    assert afforded >= 6 and f"pays for {afforded} more whole records (every step charged)" in text


def test_ctrl_c_stops_at_a_step_boundary_and_keeps_the_finished_records(model_dir, tmp_path, capsys, monkeypatch):
    """Issue 24, item 3: a Ctrl-C after the first record stops the run at the next step boundary; the finished
    record is in --out, the ledger audits with every charge made, and the command exits 130 with one line."""
    import signal

    from pate_app.run import RunProgress

    data, out, ledger = tmp_path / "data.jsonl", tmp_path / "kept.jsonl", tmp_path / "ctrl-c.sqlite"
    _write_jsonl(data, _records(8))
    ends = RunProgress.record_ends

    def record_ends(self):
        ends(self)
        signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C as the first record finishes

    monkeypatch.setattr(RunProgress, "record_ends", record_ends)
    assert main(_generate_argv(model_dir, data, ledger, "--out", str(out), "--records", "3")) == 130
    captured = capsys.readouterr()
    assert len(out.read_text().splitlines()) == 1
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("generate: interrupted: stopped at a step boundary; 1 of 3 requested records")
    assert "audit OK" in last
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert opened.verify().ok
        rows = opened.row_count
    # the summary counts the charges of the record the Ctrl-C dropped too (issue 32, item 7: 32 said, 35 rows)
    assert f"({rows} charged runs in this run;" in captured.out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_a_config_file_and_the_python_api_run_the_same_spec(model_dir, tmp_path, capsys):
    """Issue 24, item 5: one RunSpec, from a TOML file (generate --config) or from Python
    (pate_app.synthesize): the run's metadata and --json carry its shareable part (no seed, no local paths)."""
    import pate_app

    data = tmp_path / "support.csv"
    _support_csv(data)
    spec = pate_app.RunSpec(data=str(data), text_field="message", template="records", model=str(model_dir),
                            teachers=4, records=1, max_tokens=4, mechanism="dp-argmax", accountant="basic",
                            step_epsilon=8.0, step_delta=1e-3, relation="add-remove-one", records_per_teacher=3,
                            budget_epsilon=200.0,
                            budget_delta=0.5, threads=1, ledger=str(tmp_path / "spec.sqlite"), seed=987654321)
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    assert main(["generate", "--config", str(config), "--seed", "987654321", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audit"]["ok"] and out["spec"] == spec.shareable()
    assert out["spec"]["data"]["path"] == "support.csv" and str(tmp_path) not in json.dumps(out["spec"])
    with Ledger.open(str(tmp_path / "spec.sqlite"), read_only=True) as opened:
        assert opened.runs[0]["metadata"]["spec"] == spec.shareable()
    again = pate_app.synthesize(spec)
    assert again["spec"] == spec.shareable() and again["ledger"]["runs"] == 2
    assert [r["text"] for r in again["records"]] == [r["text"] for r in out["records"]]  # the same seed
    assert b"987654321" not in (tmp_path / "spec.sqlite").read_bytes()


# -- the public model never sees a private record (issue 31, item 5) ---------------------------------------------
class _RecordingBackend:
    """The public backend, recording as text everything it is given: the prompts and shared prefix of ``begin``,
    the tokens appended, the contexts of ``next_token_distributions`` (the fallback, the public prior's support
    and mix, the public candidate all read the public model through these)."""

    def __init__(self, inner, seen: list):
        self._inner, self._seen = inner, seen

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def vocab_size(self):
        return self._inner.vocab_size

    @property
    def eos_token_id(self):
        return self._inner.eos_token_id

    def encode(self, text):
        self._seen.append(text)
        return self._inner.encode(text)

    def decode(self, token_ids):
        return self._inner.decode(token_ids)

    def begin(self, teacher_prompts, shared_prefix=None):
        self._seen.extend([*teacher_prompts, shared_prefix or ""])
        return self._inner.begin(teacher_prompts, shared_prefix=shared_prefix)

    def append(self, token_id):
        self._seen.append(self._inner.decode([int(token_id)]))
        return self._inner.append(token_id)

    def distributions(self):
        return self._inner.distributions()

    def next_token_distributions(self, contexts):
        self._seen.extend(self._inner.decode(list(c)) for c in contexts)
        return self._inner.next_token_distributions(contexts)


def _public_inputs(monkeypatch, model_dir, tmp_path, name, **kwargs) -> list:
    seen: list = []
    original = run_module._backends

    def recording(stack, model, threads, workers, ray_address):
        backend, public = original(stack, model, threads, workers, ray_address)
        return backend, _RecordingBackend(public, seen)

    monkeypatch.setattr(run_module.stages, "_backends", recording)
    result = _run(model_dir, tmp_path / f"{name}.sqlite", num_records=2, max_tokens=5, **kwargs)
    assert result["audit"]["ok"] and result["charged_runs"] > 0
    return seen


PUBLIC_CONTEXT_RUNS = {
    "fallback, support and mix": {"public_top_k": 8, "public_mix": 0.3},
    "public candidate": {"mechanism": "between-thresholds", "accountant": "pld", "step_epsilon": 0.2,
                         "epsilon": 30.0, "delta": 1e-5},
}


@pytest.mark.parametrize("name", sorted(PUBLIC_CONTEXT_RUNS))
def test_the_public_model_never_sees_a_private_record(model_dir, tmp_path, monkeypatch, name):
    """Every record holds a canary; everything the public model is given in a whole run (its prompt and shared
    prefix, each token appended, each context it scores) is recorded, and the canary is in none of it."""
    seen = _public_inputs(monkeypatch, model_dir, tmp_path, name.replace(" ", "-").replace(",", ""),
                          **PUBLIC_CONTEXT_RUNS[name])
    assert seen and not any(MARKER in text for text in seen)


def test_the_public_context_guard_catches_a_leaking_run(model_dir, tmp_path, monkeypatch):
    """The mutant the audit wrote passed every test: a run that shows the public model the first teacher's private
    prompt.  The guard above catches it."""
    original = run_module.PrivateGenerator.generate

    def leaking(self, teacher_prompts, *args, **kwargs):
        self.public_prompt = list(teacher_prompts)[0]
        return original(self, teacher_prompts, *args, **kwargs)

    monkeypatch.setattr(run_module.PrivateGenerator, "generate", leaking)
    seen = _public_inputs(monkeypatch, model_dir, tmp_path, "leaking", public_top_k=8)
    assert any(MARKER in text for text in seen)


def test_generate_and_audit_tell_one_remaining_budget(model_dir, tmp_path, capsys):
    """Issue 32, item 3: after a PLD run, ``generate`` and ``audit`` print the same remaining line (epsilon left
    at the budget's delta; it once said "delta 0" here and "no budget left" in audit while the next run was
    accepted), and the JSON result holds the same numbers."""
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "pld.sqlite"
    argv = _generate_argv(model_dir, data, ledger, "--mechanism", "gaussian-argmax", "--accountant", "pld",
                          "--step-epsilon", "20", "--step-delta", "1e-6", "--budget-epsilon", "400",
                          "--budget-delta", "1e-5", "--public-top-k", "4", "--no-progress")
    assert main(argv) == 0
    generated = [line.split("; pays for ")[0] for line in capsys.readouterr().out.splitlines()
                 if line.startswith("remaining   :")]  # generate adds the whole records the rest pays for
    assert main(["audit", str(ledger)]) == 0
    audited = [line for line in capsys.readouterr().out.splitlines() if line.startswith("remaining   :")]
    assert generated == audited and "at delta 1e-05" in audited[0] and "none:" not in audited[0]
    assert main([*argv[:-1], "--json", "--seed", "4"]) == 0
    remaining = json.loads(capsys.readouterr().out)["remaining"]
    assert remaining["delta"] is None and remaining["at_delta"] == 1e-5 and remaining["another_step"]


def test_a_first_ctrl_c_during_a_long_prefill_stops_the_run_at_once(model_dir, tmp_path, monkeypatch):
    """Issue 32, item 1: a first Ctrl-C waited for the step to end, about 2 minutes during a long prefill.  Inside
    a model call nothing is charged, so it now stops the run at once (within one batch of the prefill): here a
    60 s prefill, interrupted half a second in, ends the run within seconds, marked interrupted, its ledger
    audited."""
    import signal
    import threading

    original = run_module._backends

    def slow(stack, model, threads, workers, ray_address):
        backend, public = original(stack, model, threads, workers, ray_address)
        real_begin = backend.begin

        def begin(prompts, shared_prefix=None):
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            for _ in range(600):  # a prefill in batches of 0.1 s
                time.sleep(0.1)
            return real_begin(prompts, shared_prefix=shared_prefix)

        backend.begin = begin
        return backend, public

    monkeypatch.setattr(run_module.stages, "_backends", slow)
    began = time.monotonic()
    result = _run(model_dir, tmp_path / "prefill.sqlite", num_records=2, max_tokens=4)
    assert result["interrupted"] and time.monotonic() - began < 15
    assert result["audit"]["ok"] and result["records"] == []


def test_a_renamed_and_grown_data_set_is_charged_to_its_ledger_and_told_why(model_dir, tmp_path, monkeypatch,
                                                                           capsys):
    """Issue 32, item 4 (issue 31, item 4): without --ledger, records the index knows (here a copy of the file
    under another name, with one record more) are charged to their data set's ledger, under its name, with one line
    saying so; a --dataset naming another data set is refused saying which ledger holds the records and why."""
    monkeypatch.setenv("PATE_ACCOUNTANT_HOME", str(tmp_path / "home"))
    first, grown = tmp_path / "notes.jsonl", tmp_path / "notes-v2.jsonl"
    _write_jsonl(first, _records(8))
    _write_jsonl(grown, _records(9))

    def argv(data, *extra):
        return ["generate", "--model", str(model_dir), "--data", str(data), "--teachers", "4", "--mechanism",
                "dp-argmax", "--accountant", "basic", "--budget-epsilon", "500", "--budget-delta", "0.5",
                "--step-epsilon", "8", "--step-delta", "0.001", "--records", "1", "--max-tokens", "3", "--seed", "3",
                "--threads", "1", *extra]

    assert main(argv(first, "--json")) == 0
    before = json.loads(capsys.readouterr().out)["ledger"]
    assert main(argv(grown, "--json")) == 0
    captured = capsys.readouterr()
    after = json.loads(captured.out)["ledger"]
    assert after["path"] == before["path"] and after["dataset"] == "notes.jsonl" and after["runs"] == 2
    assert "these records (or some of them) are the data set 'notes.jsonl'" not in captured.err  # --json: quiet
    assert main(argv(grown)) == 0  # with the progress shown, one line says where the records went
    assert "these records (or some of them) are the data set 'notes.jsonl': charged to its ledger" in \
        capsys.readouterr().err
    assert main(argv(grown, "--dataset", "elsewhere")) == 2
    err = capsys.readouterr().err
    assert "--dataset 'elsewhere': these records (or some of them) are the data set 'notes.jsonl'" in err
    assert "leave --dataset out" in err


def test_the_public_model_alone_sees_no_record_charges_nothing_and_writes_no_ledger(model_dir, tmp_path, monkeypatch):
    """``--public-only`` (issue 32, item 6: what a refusal offers when no private configuration runs; issue 33's
    epsilon = 0 floor): the model is given the template's header and open slot and its own tokens only (the
    records' canary is in nothing it sees), the records are asked for per label in turn, nothing is spent, and no
    ledger, ledger home entry or teacher exists."""
    seen: list = []
    original = run_module._public_backend
    monkeypatch.setattr(run_module.public_only, "_public_backend",
                        lambda model, threads: _RecordingBackend(original(model, threads), seen))
    monkeypatch.setattr(run_module.stages, "_backends", lambda *a, **k: pytest.fail("a teachers' backend was built"))
    home = tmp_path / "home"
    records = [{**record, "label": ("a", "b")[i % 2]} for i, record in enumerate(_records(12))]
    out = tmp_path / "public.jsonl"
    result = _run(model_dir, None, records=records, ledger_home=home, public_only=True, labels=("a", "b"),
                  label_field="label", num_records=3, max_tokens=5, out=str(out))
    assert result["public_only"] and result["spent"] == {"epsilon": 0.0, "delta": 0.0} and result["ledger"] is None
    assert result["charged_runs"] == 0 and result["private_tokens"] == 0
    assert [r["label"] for r in result["records"]] == ["a", "b", "a"]
    assert all(r["fallback_tokens"] == r["num_tokens"] > 0 and r["complete"] for r in result["records"])
    assert seen and not any(MARKER in text for text in seen)
    assert not home.exists() or not any(home.rglob("*.sqlite"))
    assert len(out.read_text().splitlines()) == 3
    assert "seed" not in json.dumps(result["parameters"]["spec"])


# -- public examples: records the user declares public, shown to the public model only (issue 33, issue 34 lever 3)
PUBLIC_WORD = "kumquatlantern"


def _public_examples(path, labels=(None,), each=2):
    rows = [{"instruction": f"{PUBLIC_WORD} {label or 'any'} example number {i}", **({"label": label} if label else {})}
            for label in labels for i in range(each)]
    _write_jsonl(path, rows)
    return path


def test_public_examples_reach_the_public_model_and_no_private_record_does(model_dir, tmp_path, monkeypatch):
    """A private run with ``--public-examples``: the public model's prompt (fallback, top-K support) shows the
    public examples, the records' canary is still in nothing it sees, and the ledger's metadata counts the
    examples without holding their text."""
    examples = _public_examples(tmp_path / "public.jsonl")
    seen = _public_inputs(monkeypatch, model_dir, tmp_path, "examples", public_top_k=8,
                          public_examples=str(examples))
    assert any(PUBLIC_WORD in text for text in seen)
    assert not any(MARKER in text for text in seen)
    with Ledger.open(str(tmp_path / "examples.sqlite"), read_only=True) as opened:
        (run,) = opened.runs
    assert run["metadata"]["public_examples"] == 2
    assert run["metadata"]["spec"]["data"]["public_examples"] == "public.jsonl"


def test_public_top_k_auto_is_sized_on_the_public_examples_alone(model_dir, tmp_path, monkeypatch):
    """``--public-top-k auto``: the support is sized on the public examples (everything the measuring model is
    given is recorded: public words, no record's canary), before the ledger; the run then runs with the measured
    size, and the ledger records it and the measurement (counts of public tokens).  Without enough public examples
    it is refused in one line before any ledger exists."""
    from pate_app.spec import RunInputError

    seen: list = []
    original = run_module._public_backend
    monkeypatch.setattr(run_module.public, "_public_backend",
                        lambda model, threads: _RecordingBackend(original(model, threads), seen))
    examples = _public_examples(tmp_path / "public.jsonl", each=3)
    ledger = tmp_path / "auto.sqlite"
    result = _run(model_dir, ledger, num_records=1, max_tokens=4, public_top_k="auto", public_examples=str(examples))
    assert result["audit"]["ok"]
    assert any(PUBLIC_WORD in text for text in seen) and not any(MARKER in text for text in seen)
    with Ledger.open(str(ledger), read_only=True) as opened:
        (run,) = opened.runs
    measured = run["metadata"]["public_support_measured"]
    assert isinstance(measured["top_k"], int) and 1 <= measured["top_k"] <= 512
    assert run["metadata"]["public_top_k"] == measured["top_k"] == run["metadata"]["spec"]["mechanism"]["public_top_k"]
    assert measured["coverage"] == 0.9 and measured["covered"] >= 0.9 and measured["positions"] > 0
    refused = tmp_path / "refused.sqlite"
    with pytest.raises(RunInputError, match=r"--public-top-k auto .* at least two records") as caught:
        _run(model_dir, refused, public_top_k="auto", public_examples=str(_public_examples(tmp_path / "one.jsonl",
                                                                                             each=1)))
    assert "\n" not in str(caught.value) and not refused.exists()
    with pytest.raises(RunInputError, match="at least two records"):
        _run(model_dir, refused, public_top_k="auto")
    assert not refused.exists()


def test_public_only_shows_each_label_its_own_public_examples(model_dir, tmp_path, monkeypatch):
    """``--public-only --public-examples``: with labels, the public model writing a label's record is shown that
    label's public examples and no other's; no private record reaches it."""
    prompts: list = []
    original = run_module.public_generate_many

    def recording(backend, prompt, count, **kwargs):
        prompts.extend([prompt] * count)
        return original(backend, prompt, count, **kwargs)

    monkeypatch.setattr(run_module.public_only, "public_generate_many", recording)
    examples = tmp_path / "public.jsonl"
    _write_jsonl(examples, [{"instruction": f"{PUBLIC_WORD} about {label} {i}", "label": label}
                            for label in ("a", "b", "c") for i in range(2)])
    records = [{**record, "label": ("a", "b")[i % 2]} for i, record in enumerate(_records(12))]
    result = _run(model_dir, None, records=records, public_only=True, labels=("a", "b"), label_field="label",
                  num_records=4, max_tokens=4, public_examples=str(examples))
    assert [r["label"] for r in result["records"]] == ["a", "b", "a", "b"]
    assert result["parameters"]["public_examples"] == 4  # label c is not the run's
    assert len(prompts) == 4  # two records of each label, written side by side
    for prompt, label in zip(prompts, "aabb"):
        other = "b" if label == "a" else "a"
        assert f"about {label} 0" in prompt and f"about {label} 1" in prompt and f"about {other}" not in prompt
        assert "about c" not in prompt and MARKER not in prompt and prompt.endswith("Instruction:")


def test_a_private_record_among_the_public_examples_is_refused_before_any_ledger(model_dir, tmp_path):
    """A public example that is also a private record (the user mixed the files up) is refused with a count, never
    the record, before a ledger exists; so are a missing file and a file without the run's labels."""
    from pate_app.spec import RunInputError

    mixed = tmp_path / "mixed.jsonl"
    _write_jsonl(mixed, [_records(12)[3], {"instruction": f"{PUBLIC_WORD} one"}])
    ledger = tmp_path / "run.sqlite"
    with pytest.raises(RunInputError) as caught:
        _run(model_dir, ledger, public_examples=str(mixed))
    message = str(caught.value)
    assert "--public-examples" in message and "1 of its 2 records are also records of --data" in message
    assert MARKER not in message and "\n" not in message and not ledger.exists()
    with pytest.raises(RunInputError, match="--public-examples .*no such file"):
        _run(model_dir, ledger, public_examples=str(tmp_path / "absent.jsonl"))
    labelled = [{**record, "label": "a"} for record in _records(12)]
    other = _public_examples(tmp_path / "other.jsonl", labels=("z",))
    with pytest.raises(RunInputError, match="no record has one of the labels a"):
        _run(model_dir, ledger, records=labelled, labels=("a",), label_field="label", public_examples=str(other))
    assert not ledger.exists()


def test_public_examples_too_long_for_the_window_are_refused_before_any_ledger(model_dir, tmp_path):
    """Public examples that leave no room in the model's window for ``--max-tokens`` new tokens are refused with
    the token count, before the ledger is claimed."""
    from pate_app.spec import RunInputError

    long = _public_examples(tmp_path / "long.jsonl", each=1)
    _write_jsonl(long, [{"instruction": " ".join([PUBLIC_WORD] * 3000)}])
    ledger = tmp_path / "run.sqlite"
    with pytest.raises(RunInputError, match=r"--public-examples: the public model's prompt takes \d+ tokens"):
        _run(model_dir, ledger, public_examples=str(long))
    assert not ledger.exists()


def test_public_examples_in_a_run_description(tmp_path):
    """``[data] public_examples`` in a TOML run description; the shareable part keeps the file's name only."""
    from pate_app.spec import RunSpec

    config = tmp_path / "run.toml"
    config.write_text('[data]\npath = "notes.jsonl"\npublic_examples = "/home/someone/public notes.jsonl"\n'
                      '[budget]\nepsilon = 3.0\ndelta = 1e-6\n', encoding="utf-8")
    spec = RunSpec.from_toml(config)
    assert spec.public_examples == "/home/someone/public notes.jsonl"
    assert spec.shareable()["data"]["public_examples"] == "public notes.jsonl"
    assert spec.to_toml().count("public_examples = ") == 1


def test_a_template_naming_the_label_shows_each_label_its_own_to_teachers_and_public_model(model_dir, tmp_path,
                                                                                       monkeypatch):
    """Issue 34, lever 2: with ``{label}`` in the header, each label's teachers' shared prefix and its public model's
    context name that label and no other; the same template in a run without labels is refused before any ledger
    exists; a public-only run names each label in its public model's shared prefix."""
    from pate_app.spec import RunInputError

    template = tmp_path / "per-label.toml"
    template.write_text('header = "Write one new instruction about {label}.\\n\\n"\nexample = "Instruction: '
                        '{instruction}\\n"\nopen_slot = "Instruction ({label}):"\n', encoding="utf-8")
    seen, prefixes = [], []
    original = run_module._backends

    def recording(stack, model, threads, workers, ray_address):
        backend, public = original(stack, model, threads, workers, ray_address)
        real_begin = backend.begin

        def begin(prompts, shared_prefix=None):
            prefixes.append((shared_prefix, list(prompts)))
            return real_begin(prompts, shared_prefix=shared_prefix)

        backend.begin = begin
        return backend, _RecordingBackend(public, seen)

    monkeypatch.setattr(run_module.stages, "_backends", recording)
    records = [{**record, "label": ("oranges", "bicycles")[i % 2]} for i, record in enumerate(_records(12))]
    result = _run(model_dir, tmp_path / "labels.sqlite", records=records, labels=("oranges", "bicycles"),
                  label_field="label", per_label=1, max_tokens=3, template=str(template), public_top_k=8)
    assert [r["label"] for r in result["records"]] == ["oranges", "bicycles"]
    assert [p for p, _ in prefixes] == ["Write one new instruction about oranges.\n\n",
                                        "Write one new instruction about bicycles.\n\n"]
    assert all(prompt.endswith("Instruction (oranges):") for prompt in prefixes[0][1])
    assert "Write one new instruction about oranges.\n\n" in seen and "Instruction (bicycles):" in seen
    assert not any(MARKER in text for text in seen)
    ledger = tmp_path / "plain.sqlite"
    with pytest.raises(RunInputError, match=r"names the label \(\{label\}\), which needs a run per label"):
        _run(model_dir, ledger, template=str(template))
    assert not ledger.exists()
    calls: list = []
    original_public = run_module.public_generate_many
    monkeypatch.setattr(run_module.public_only, "public_generate_many",
                        lambda backend, prompt, count, **kw: calls.append(kw["shared_prefix"]) or original_public(
                            backend, prompt, count, **kw))
    _run(model_dir, None, records=records, labels=("oranges", "bicycles"), label_field="label", public_only=True,
         num_records=2, max_tokens=3, template=str(template))
    assert calls == ["Write one new instruction about oranges.\n\n", "Write one new instruction about bicycles.\n\n"]


def test_subsampled_teachers_run_through_the_pld_accountant(model_dir, tmp_path):
    """``--subsample-teachers Q`` (issue 34, lever 5): GNMax calibrated under add-remove-one for the teachers a step
    keeps on average, each step charged as one event of subsampled teachers that keeps its inner event; the PLD
    accountant charges its exact PLD (below the stated bound composed), the ledger audits and records the rate."""
    from pate_accountant.accountants import BasicCompositionAccountant, PldAccountant
    from pate_accountant.events import DiscreteGaussianArgMaxEvent, SubsampledTeachersEvent

    ledger = tmp_path / "sub.sqlite"
    result = _run(model_dir, ledger, num_teachers=12, mechanism="gaussian-argmax", accountant="pld",
                  step_epsilon=4.0, step_delta=1e-4, budget_epsilon=60.0, budget_delta=1e-2, num_records=1,
                  max_tokens=4, public_top_k=8, subsample_teachers=0.5)
    assert result["audit"]["ok"], result["audit"]
    with Ledger.open(str(ledger), read_only=True) as opened:
        (run,) = opened.runs
        rows = list(opened.rows())
    assert run["metadata"]["subsample_teachers"] == 0.5
    assert "probability 0.5 (about 6 of 12)" in run["metadata"]["release_rule"]
    events = [row.event for row in rows]
    assert all(row.count == 1 for row in rows)
    assert events and all(isinstance(e, SubsampledTeachersEvent) and e.rate == 0.5 and e.relation == "replace-one"
                          and isinstance(e.inner, DiscreteGaussianArgMaxEvent) for e in events)
    steps = len(events)
    pld, basic = PldAccountant(), BasicCompositionAccountant()
    pld.compose(events[0], steps)
    basic.compose(events[0], steps)
    assert result["spent"]["epsilon"] == pytest.approx(pld.get_epsilon(result["spent"]["delta"]), rel=1e-6)
    assert result["spent"]["epsilon"] < basic.spent()[0]


def test_subsample_teachers_refusals_name_the_option_before_any_ledger(model_dir, tmp_path):
    from pate_app.spec import RunInputError, SpecError

    refused = tmp_path / "refused.sqlite"
    for value in (0.0, 1.0, 1.5):
        with pytest.raises(SpecError, match=f"mechanism.subsample_teachers .*{value:g}"):
            _run(model_dir, refused, subsample_teachers=value)
    for mechanism, why in (("between-thresholds", "counts teachers included at a random rate already"),
                           ("clipped-logit-sampling", "reads the teachers' distributions"),
                           ("boundary-dp-argmax", "target counts the whole ensemble's hits")):
        with pytest.raises(RunInputError, match=why) as caught:
            _run(model_dir, refused, mechanism=mechanism, subsample_teachers=0.5)
        assert "\n" not in str(caught.value) and "--subsample-teachers" in str(caught.value)
    assert not refused.exists()
