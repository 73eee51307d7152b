"""Light backends (toy, sampled API), the backend protocol, and the Dolly data helpers (no torch)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ensembles.backends import NextTokenBackend, SampledApiBackend, ToyBackend, expected_tv_bound
from ensembles.data import bundled_sample, load_dolly_jsonl, partition_records, teacher_prompts

VOCAB = ["<unk>", "<eos>", "a", "b", "c", "d"]


def test_backends_satisfy_protocol_and_do_not_import_torch():
    toy = ToyBackend(np.full((2, len(VOCAB)), 1 / len(VOCAB)), VOCAB)
    api = SampledApiBackend(lambda ctx, m, rng: [2] * m, 10, vocab_size=6)
    assert isinstance(toy, NextTokenBackend) and isinstance(api, NextTokenBackend)
    code = "import sys, ensembles.backends, ensembles.generation, ensembles.data; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_toy_tokenizer_and_state():
    seen = []

    def f(teacher, context):
        seen.append((teacher, tuple(context)))
        return ([2 + teacher], [1.0])

    toy = ToyBackend(f, VOCAB)
    assert toy.encode("a b zzz") == [2, 3, 0] and toy.decode([2, 3]) == "a b"
    assert toy.eos_token_id == 1 and toy.vocab_size == 6
    toy.begin(["a", [3]], shared_prefix="c")
    d = toy.distributions()
    assert d.num_teachers == 2 and d.row(1)[0].tolist() == [3]
    toy.append(5)
    toy.drop_teachers([0])
    assert toy.active_teachers().tolist() == [1]
    toy.distributions()
    assert seen[-1] == (1, (4, 3, 5))  # prefix, prompt, appended token; original teacher index
    with pytest.raises(ValueError):
        toy.append(99)
    strict = ToyBackend(f, ["<eos>", "a"])
    with pytest.raises(ValueError, match="not in the vocabulary") as info:
        strict.encode("a secretword")
    assert "secretword" not in str(info.value)


def test_toy_table_validation():
    with pytest.raises(ValueError):
        ToyBackend(np.ones((2, 3)), VOCAB)
    with pytest.raises(ValueError):
        ToyBackend(np.ones((2, len(VOCAB))), VOCAB, eos="<stop>")
    with pytest.raises(ValueError):
        ToyBackend(np.ones((2, 2)), ["a", "a"], eos=None)


def _true_sampler(p):
    def sample(context, m, rng):
        return rng.choice(len(p), size=m, p=p).tolist()
    return sample


def test_sampled_api_estimates_converge():
    p = np.array([0.0, 0.05, 0.4, 0.3, 0.2, 0.05])
    k = int((p > 0).sum())
    errors = {}
    for m in (100, 1000, 10000):
        api = SampledApiBackend(_true_sampler(p), m, vocab_size=6, seed=7)
        api.begin([[2]] * 20)
        dense = api.distributions().to_dense()
        tv = 0.5 * np.abs(dense - p).sum(axis=1)
        errors[m] = tv.mean()
        assert tv.mean() <= expected_tv_bound(k, m)  # E[TV] <= sqrt(k / 4m); mean of 20 is well inside
        # chi-square goodness of fit on the pooled counts (fixed seed)
        counts = dense.sum(axis=0) * m
        expected = p * m * 20
        keep = expected > 0
        chi2 = (((counts - expected) ** 2)[keep] / expected[keep]).sum()
        assert chi2 < 20.5  # chi-square(4) at 1 - 4e-4
    assert errors[10000] < errors[100]


def test_sampled_api_deterministic_and_contexts():
    got = []

    def sample(context, m, rng):
        got.append(context)
        return rng.integers(2, 6, size=m).tolist()

    api = SampledApiBackend(sample, 50, vocab_size=6, encode=lambda t: [2] * len(t.split()),
                            decode=lambda ids: "x" * len(ids), text_contexts=True, seed=3)
    api.begin(["one two", "three"])
    first = api.distributions().to_dense()
    api.append(4)
    api.distributions()
    assert got[-2:] == ["xxx", "xx"]
    api.begin(["one two", "three"])
    assert np.array_equal(api.distributions().to_dense(), first)  # re-seeded on begin


def test_sampled_api_errors():
    api = SampledApiBackend(lambda c, m, rng: [9] * m, 5, vocab_size=6)
    api.begin([[2]])
    with pytest.raises(ValueError, match="outside"):
        api.distributions()
    api = SampledApiBackend(lambda c, m, rng: [2], 5, vocab_size=6)
    api.begin([[2]])
    with pytest.raises(ValueError, match="expected 5"):
        api.distributions()
    with pytest.raises(TypeError, match="encode"):
        SampledApiBackend(lambda c, m, rng: [2] * m, 5, vocab_size=6).begin(["text prompt"])


# -- data ---------------------------------------------------------------------------------------------
def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rec(instruction="Do a thing.", context="", response="ok", category="open_qa"):
    return json.dumps({"instruction": instruction, "context": context, "response": response, "category": category})


def test_load_dolly_filters_and_errors(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_rec(), _rec(context="some context"), "", _rec("x" * 300)])
    assert len(load_dolly_jsonl(path)) == 1
    assert len(load_dolly_jsonl(path, no_context=False, max_instruction_chars=None)) == 3
    with pytest.raises(FileNotFoundError):
        load_dolly_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        load_dolly_jsonl(_write(tmp_path / "bad.jsonl", [_rec(), "{not json"]))
    with pytest.raises(ValueError, match="line 1: missing field"):
        load_dolly_jsonl(_write(tmp_path / "miss.jsonl", [json.dumps({"instruction": "x"})]))
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        load_dolly_jsonl(_write(tmp_path / "list.jsonl", ["[1, 2]"]))
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="no records"):
        load_dolly_jsonl(tmp_path / "empty.jsonl")


def test_partition_errors_and_disjointness():
    records = [{"instruction": f"i{j}", "context": "", "response": "", "category": "c"} for j in range(10)]
    parts = partition_records(records, 3, np.random.default_rng(0))
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    flat = [r["instruction"] for p in parts for r in p]
    assert sorted(flat) == sorted(r["instruction"] for r in records)
    assert parts == partition_records(records, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="only 10 records"):
        partition_records(records, 11, np.random.default_rng(0))
    with pytest.raises(ValueError, match="empty"):
        partition_records([], 1, np.random.default_rng(0))


def test_bundled_sample_loads_partitions_and_prompts():
    records = bundled_sample()
    assert len(records) >= 40 and all(not r["context"] for r in records)
    assert len(bundled_sample(no_context=False)) > len(records)
    parts = partition_records(records, 8, np.random.default_rng(1))
    prefix, prompts = teacher_prompts(parts)
    assert len(prompts) == 8 and prefix
    for part, prompt in zip(parts, prompts):
        assert all(r["instruction"] in prompt for r in part)
        assert prompt.endswith("Instruction:")
    with pytest.raises(ValueError, match="field"):
        teacher_prompts(parts, template="{nope}")


def test_dolly_loader_keeps_instructions_shorter_than_256_characters(tmp_path):
    """The paper keeps no-context instructions shorter than 256 characters: 255 stays, 256 goes."""
    import json

    path = tmp_path / "lengths.jsonl"
    rows = [{"instruction": "a" * k, "context": "", "response": "r", "category": "open_qa"} for k in (255, 256)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [len(r["instruction"]) for r in load_dolly_jsonl(path)] == [255]


def test_gguf_cache_folder_is_computed_in_one_place(tmp_path):
    """``convert_gguf`` converts into ``converted_gguf_path`` (the one cache key: name, size, mtime) and reuses a
    finished conversion there without importing torch."""
    from ensembles.backends import transformers_backend as tb

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tb.converted_gguf_path(gguf, tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" / "gguf" and folder.name.startswith("model-")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert tb.convert_gguf(gguf, tmp_path / "cache") == folder
    gguf.write_bytes(b"GGUF, changed")  # another size: another key
    assert tb.converted_gguf_path(gguf, tmp_path / "cache") != folder
    with pytest.raises(ValueError, match="does not exist"):
        tb.converted_gguf_path(tmp_path / "missing.gguf")


def test_top_p_rule_is_shared_by_host_and_device():
    from ensembles import distributions
    from ensembles.backends import transformers_backend as tb

    assert tb.top_p_keep is distributions.top_p_keep
    sorted_probs = np.array([0.5, 0.3, 0.2, 0.0])
    before = np.cumsum(sorted_probs) - sorted_probs
    assert distributions.top_p_keep(sorted_probs, before, 0.8).tolist() == [True, True, False, False]
    assert distributions.top_p_keep(sorted_probs, before, 0.8 + 1e-12).tolist() == [True, True, False, False]
    assert distributions.top_p_keep(sorted_probs, before, 1.0).tolist() == [True, True, True, False]
    teachers = distributions.TeacherDistributions.from_dense(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])).top_p(0.8)
    assert teachers.support_sizes.tolist() == [2, 1]
