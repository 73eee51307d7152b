"""End-to-end private runs (ensembles/run.py, ``pate-accountant generate``) on a tiny random Llama.

The model and its tokenizer are built in the test and saved to a folder, so ``--model PATH`` works as for
a real model.  A marker word placed in every record must never reach the ledger file.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from ensembles.run import RunInputError, private_run  # noqa: E402
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


def _run(model_dir, ledger, seed=0, **kwargs):
    params = dict(model=str(model_dir), records=_records(12), num_teachers=6, ledger_path=ledger,
                  mechanism="dp-argmax", accountant="basic", step_epsilon=8.0, step_delta=1e-3,
                  relation="add-remove-one", epsilon=200.0, delta=0.5, num_records=2, max_tokens=6, seed=seed,
                  threads=1)
    params.update(kwargs)
    return private_run(**params)


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
        assert opened.run_metadata["seed"] == 0
        assert opened.run_metadata["mechanism"]["parameters"]["epsilon"] == 8.0
    # no prompt text anywhere in the ledger (WAL included) or the returned parameters
    for path in tmp_path.iterdir():
        assert MARKER.encode() not in path.read_bytes(), path
    assert MARKER not in json.dumps(result["parameters"])
    json.dumps(result, allow_nan=False)


def test_equal_seeds_equal_records(model_dir, tmp_path):
    first = _run(model_dir, tmp_path / "a.sqlite", seed=7)
    second = _run(model_dir, tmp_path / "b.sqlite", seed=7)
    assert [r["text"] for r in first["records"]] == [r["text"] for r in second["records"]]
    assert first["spent"] == second["spent"]


def test_os_entropy_seed_is_recorded(model_dir, tmp_path):
    ledger = tmp_path / "c.sqlite"
    _run(model_dir, ledger, seed=None, num_records=1, max_tokens=2)
    with Ledger.open(str(ledger), read_only=True) as opened:
        assert opened.run_metadata["seed"] == "OS entropy"


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


def test_prompt_longer_than_context_window_refused_before_the_ledger(model_dir, tmp_path):
    long_records = [dict(r, instruction=" ".join([r["instruction"]] * 80)) for r in _records(12)]
    ledger = tmp_path / "long.sqlite"
    with pytest.raises(RunInputError, match="context window") as caught:
        _run(model_dir, ledger, records=long_records)
    assert not ledger.exists()
    assert MARKER not in str(caught.value)


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


def test_existing_ledger_refused(model_dir, tmp_path):
    ledger = tmp_path / "exists.sqlite"
    ledger.write_bytes(b"")
    with pytest.raises(RunInputError, match="already exists"):
        _run(model_dir, ledger)


def _generate_argv(model_dir, data, ledger, *extra):
    return ["generate", "--model", str(model_dir), "--data", str(data), "--teachers", "4",
            "--mechanism", "dp-argmax", "--accountant", "basic", "--epsilon", "500", "--delta", "0.5",
            "--step-epsilon", "8", "--step-delta", "0.001", "--ledger", str(ledger), "--records", "2",
            "--max-tokens", "4", "--seed", "3", "--threads", "1", *extra]


def test_cli_generate_json(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    ledger = tmp_path / "cli.sqlite"
    assert main(_generate_argv(model_dir, data, ledger, "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audit"]["ok"] and len(out["records"]) == 2
    assert out["parameters"]["seed"] == 3
    assert MARKER.encode() not in ledger.read_bytes()
    assert main(["audit", str(ledger), "--json"]) == 0


def test_cli_generate_text(model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    _write_jsonl(data, _records(8))
    assert main(_generate_argv(model_dir, data, tmp_path / "t.sqlite", "--no-progress")) == 0
    out = capsys.readouterr().out
    assert "audit       : OK" in out and "record 1" in out and MARKER not in out


@pytest.mark.parametrize("case", ["unknown-model", "empty-data", "too-many-teachers", "existing-ledger"])
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
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and MARKER not in err
    if case != "existing-ledger":
        assert not ledger.exists()
    else:
        assert ledger.read_bytes() == b""


def test_every_mechanism_name_builds_and_target_charging_takes_the_wrapped_ones():
    from ensembles.run import MECHANISMS, build_accountant, build_mechanism
    from mechanisms import BoundaryWrapper
    from pate_accountant.cli import RUN_MECHANISMS

    assert tuple(RUN_MECHANISMS) == tuple(MECHANISMS)
    for name in MECHANISMS:
        mech = build_mechanism(name, 2.0, 1e-6)
        assert isinstance(mech, BoundaryWrapper) == name.startswith("boundary-")
        if name.startswith("boundary-"):
            assert build_accountant("target-charging", (1e4, 1e-3)).can_afford(mech.event)
