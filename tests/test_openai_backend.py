"""OpenAICompatibleBackend against a stub vLLM-dialect server backed by ToyBackend distributions
(tests/openai_stub_server.py): distributions, batching, a full private run, temperature, errors, privacy."""

import json
import logging
import time
import zlib

import numpy as np
import pytest
from openai_stub_server import StubServer

from ensembles.backends import NextTokenBackend, ToyBackend
from ensembles.backends.openai_api import OpenAICompatibleBackend
from ensembles.generation import PrivateGenerator
from ensembles.keyed_votes import StepKey
from mechanisms import DPArgMax
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.ledger import Ledger

VOCAB = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "home", "SECRETWORD"]
W = {w: i for i, w in enumerate(VOCAB)}
CHAIN = {W["the"]: W["cat"], W["cat"]: W["sat"], W["sat"]: W["on"], W["on"]: W["the"]}
K = 4
SECRET = "SECRETWORD"


def next_token_probs(context):
    """A context's own distribution: a chained word with mass 0.6, the rest spread by a hash of the context
    (so teachers with different prompts differ, and top-4 truncation leaves a tail)."""
    rng = np.random.default_rng(zlib.crc32(np.asarray(context, dtype=np.int64).tobytes()))
    p = 0.4 * rng.dirichlet(np.full(len(VOCAB), 0.5))
    p[CHAIN.get(context[-1], W["the"])] += 0.6
    p[W["SECRETWORD"]] = 0.0  # one zero: the server reports it as -9999.0
    return p / p.sum()


def toy(k=None):
    class Truncated(ToyBackend):  # the toy, cut to its top k as the server cuts
        def next_token_distributions(self, contexts, teachers=None):
            dists = super().next_token_distributions(contexts, teachers)
            return dists if k is None else dists.top_k(k)

    return Truncated(lambda teacher, context: next_token_probs(context), VOCAB)


@pytest.fixture
def server():
    with StubServer(next_token_probs) as stub:
        yield stub


def backend(stub, **kwargs):
    words = toy()
    options = dict(vocab_size=len(VOCAB), logprobs_temperature=1.0, encode=words.encode, decode=words.decode,
                   eos_token_id=W["<eos>"], top_logprobs=K, batch_size=4, timeout=5.0, max_retries=2, backoff=0.0)
    options.update(kwargs)
    return OpenAICompatibleBackend(stub.url, "toy-model", **options)


def contexts(n):
    return [[W["the"], 2 + i % 9, W["cat"]][: 1 + i % 3] + [3 + i % 5] for i in range(n)]


def assert_same(a, b):
    np.testing.assert_allclose(a.to_dense(), b.to_dense(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.tail, b.tail, rtol=0, atol=1e-12)


def test_distributions_are_the_toys_top_k_with_tail(server):
    api = backend(server)
    assert isinstance(api, NextTokenBackend)
    got = api.next_token_distributions(contexts(3))
    assert_same(got, toy(K).next_token_distributions(contexts(3)))
    assert (got.support_sizes <= K).all() and (got.tail > 0).all()
    headers, body = server.requests[0]
    assert body["prompt"] == contexts(3) and body["max_tokens"] == 1 and body["logprobs"] == K
    assert body["echo"] is False and body["return_tokens_as_token_ids"] is True and body["temperature"] == 1.0
    assert "Authorization" not in headers


def test_choices_are_read_by_index_not_position(server):
    server.reverse_choices = True
    assert_same(backend(server).next_token_distributions(contexts(4)), toy(K).next_token_distributions(contexts(4)))


def test_batching_sends_batch_size_prompts_per_request(server):
    api = backend(server, batch_size=3)
    got = api.next_token_distributions(contexts(7))
    assert [len(body["prompt"]) for _, body in server.requests] == [3, 3, 1]
    assert sum((body["prompt"] for _, body in server.requests), []) == contexts(7)
    assert_same(got, toy(K).next_token_distributions(contexts(7)))


@pytest.mark.parametrize("top_p", [None, 0.8])
def test_private_run_equals_the_truncated_toy_run(server, top_p):
    """Same seeds, same mechanism noise: the run through the server equals the run on the toy cut to its
    top 4.  The server's logprobs are exp/log round trips, so the rows agree to ~1e-16, not bit for bit;
    votes ``argmax p_ij / u_j`` could differ only on a near-tie, which these fixed seeds do not have (the
    step-by-step votes are compared too)."""
    prompts = [f"{SECRET} the {VOCAB[2 + i % 10]}" for i in range(40)]
    results = []
    for model in (backend(server, batch_size=16), toy(K)):
        accountant = BasicCompositionAccountant(budget=(8.0, 1e-3), ledger=Ledger.in_memory())
        generator = PrivateGenerator(model, DPArgMax(1.0, 1e-5), accountant, max_tokens=6, seed=7, top_p=top_p)
        results.append(generator.generate(prompts, mechanism_rng=np.random.default_rng(11)))
    api_run, toy_run = results
    assert api_run == toy_run
    assert api_run.outcome_counts().get("token", 0) >= 2
    # the votes agree step by step on the released contexts
    api, reference = backend(server), toy(K)
    for model in (api, reference):
        model.begin(prompts)
    for position, token in enumerate(api_run.token_ids):
        key = StepKey(123, position, 0)
        np.testing.assert_array_equal(api.votes(key, top_p=top_p), reference.votes(key, top_p=top_p))
        api.append(token)
        reference.append(token)


def test_host_temperature_is_refused(server):
    api = backend(server)
    api.begin([[W["the"]], [W["cat"]]])
    with pytest.raises(ValueError, match="logprobs_temperature"):
        api.votes(StepKey(1, 0, 0), temperature=0.7)
    accountant = BasicCompositionAccountant(budget=(2.0, 1e-3))
    with pytest.raises(ValueError, match="logprobs_temperature"):  # refused when the generator is built
        PrivateGenerator(api, DPArgMax(1.0, 1e-5), accountant, temperature=0.7, seed=1)
    assert accountant.spent() == (0.0, 0.0)


def test_processed_logprobs_at_the_declared_temperature():
    with StubServer(next_token_probs, processed=True) as stub:
        api = backend(stub, logprobs_temperature=0.5)
        got = api.next_token_distributions(contexts(3))
        want = toy().next_token_distributions(contexts(3)).with_temperature(0.5).top_k(K)
        assert_same(got, want)
        probes = [body for _, body in stub.requests[:2]]
        assert [b["temperature"] for b in probes] == [0.5, 1.0] and probes[0]["prompt"] == [[W["<eos>"]]]
        assert all(b["temperature"] == 0.5 for _, b in stub.requests[2:])
        api.next_token_distributions(contexts(1))  # checked once
        assert len(stub.requests) == 4


def test_a_raw_server_with_a_declared_temperature_is_refused(server):
    api = backend(server, logprobs_temperature=0.5)
    with pytest.raises(ValueError, match="raw_logprobs"):
        api.next_token_distributions(contexts(2))
    assert all(body["prompt"] == [[W["<eos>"]]] for _, body in server.requests)  # only the public probe went out


def test_cap_exceeded_is_named_and_not_retried(server):
    api = backend(server, top_logprobs=50)
    with pytest.raises(ValueError, match=r"refused top_logprobs=50: that is above the server's limit \(vLLM "
                                         r"--max-logprobs, 20 by default\); restart it with --max-logprobs 50"):
        api.next_token_distributions(contexts(2))
    assert len(server.requests) == 1


def test_a_cap_equal_to_a_value_the_request_sent_is_shown():
    with StubServer(next_token_probs, max_logprobs=1) as stub:  # "max allowed: 1", and the request sent 1
        with pytest.raises(ValueError, match=r"refused top_logprobs=4: its limit is 1 \(vLLM --max-logprobs"):
            backend(stub).next_token_distributions(contexts(2))
    with StubServer(next_token_probs) as stub:  # the number equals the request's own logprobs
        message = f"Requested sample logprobs of {K}, which is greater than max allowed: {K}"
        stub.actions.append(lambda body: (400, {"error": {"message": message, "type": "BadRequestError"}}))
        with pytest.raises(ValueError, match=f"its limit is {K} "):
            backend(stub).next_token_distributions(contexts(2))


FOREIGN = "123456"  # a number the request never sent, as a server that echoes token ids would put it


def test_a_cap_the_request_did_not_send_is_not_echoed(server, caplog):
    caplog.set_level(logging.DEBUG)
    message = f"Requested sample logprobs of {K}, which is greater than max allowed: {FOREIGN} ({SECRET})"
    server.actions.append(lambda body: (400, {"error": {"message": message, "type": "BadRequestError"}}))
    with pytest.raises(ValueError, match=f"refused top_logprobs={K}: that is above the server's limit") as info:
        backend(server).next_token_distributions(contexts(2))
    for text in (str(info.value), caplog.text):
        assert FOREIGN not in text and SECRET not in text


@pytest.mark.parametrize("kind", ["NotFoundError", "BadRequestError", "invalid_request_error", "Bad Request",
                                  "Unprocessable Entity"])
def test_a_known_error_type_is_named(server, kind):
    server.actions.append(lambda body: (404, {"error": {"message": SECRET, "type": kind, "param": "model"}}))
    with pytest.raises(ValueError, match=rf"HTTP 404 \(type '{kind}', param 'model'\); check base_url") as info:
        backend(server).next_token_distributions(contexts(1))
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("kind", [f"{SECRET}Error", f"token_id:{FOREIGN} token_id:987654", "sk-proj-" + SECRET,
                                  f"BadRequestError {SECRET}", ["BadRequestError"], 123456],
                         ids=["marker-class-name", "token-ids", "secret-looking", "known-name-and-marker", "list",
                              "number"])
def test_an_unknown_error_type_is_unnamed(server, caplog, kind):
    """A type field that is not on the allow-list (a marker word, token ids, a secret-looking string, a list,
    a number) is reported as an unnamed server error, in the exception and in anything logged."""
    caplog.set_level(logging.DEBUG)
    message = f"bad prompt {SECRET}: max allowed: {FOREIGN}"
    server.actions.append(lambda body: (400, {"error": {"message": message, "type": kind, "param": "prompt"}}))
    with pytest.raises(ValueError, match=r"HTTP 400 \(an unnamed server error, param 'prompt'\)") as info:
        backend(server).next_token_distributions(contexts(2))
    for text in (str(info.value), caplog.text):
        assert SECRET not in text and FOREIGN not in text and "987654" not in text and "sk-" not in text
    assert "\n" not in str(info.value) and info.value.__cause__ is None


def test_timeouts_are_retried_then_named(server):
    api = backend(server, timeout=0.1, max_retries=1)
    server.actions.extend([lambda body: (server.sleep(2.0), (200, None))[1]] * 2)
    with pytest.raises(TimeoutError, match=r"did not complete the request within timeout=0.1 s \(2 attempts, "
                                           r"max_retries=1\)"):
        api.next_token_distributions(contexts(2))
    assert len(server.requests) == 2


TRICKLE = 0.05  # seconds between the bytes of a trickled reply


@pytest.mark.parametrize("in_headers", [False, True], ids=["body", "headers"])
@pytest.mark.parametrize("max_retries", [0, 1])
def test_a_trickled_reply_is_cut_off_at_the_timeout(server, in_headers, max_retries):
    """A server that sends one byte every 0.05 s (each read alone is quick) for far longer than ``timeout``:
    every try ends at ``timeout``, give or take a few trickle intervals."""
    timeout, margin = 0.6, 8 * TRICKLE
    api = backend(server, timeout=timeout, max_retries=max_retries)
    server.actions.extend([server.trickle(interval=TRICKLE, seconds=10.0, in_headers=in_headers)] * (max_retries + 1))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"did not complete the request within timeout={timeout} s "
                                           rf"\({max_retries + 1} attempts") as info:
        api.next_token_distributions([api.encode(f"{SECRET} the cat")])
    elapsed = time.monotonic() - start
    assert (max_retries + 1) * timeout <= elapsed < (max_retries + 1) * (timeout + margin)
    assert len(server.requests) == max_retries + 1
    assert SECRET not in str(info.value) and "\n" not in str(info.value)


def test_transient_errors_are_retried_with_backoff(server, monkeypatch):
    sleeps = []
    monkeypatch.setattr("ensembles.backends.openai_api.time.sleep", sleeps.append)
    api = backend(server, max_retries=3, backoff=0.25)
    server.actions.extend([lambda body: (503, b"busy"), lambda body: (429, b"{}")])
    assert_same(api.next_token_distributions(contexts(2)), toy(K).next_token_distributions(contexts(2)))
    assert len(server.requests) == 3 and sleeps == [0.25, 0.5]
    server.actions.extend([lambda body: (500, b"")] * 4)
    with pytest.raises(RuntimeError, match=r"HTTP 500 \(4 attempts"):
        api.next_token_distributions(contexts(2))


def test_connection_refused_is_a_connection_error():
    with StubServer(next_token_probs) as stub:
        url = stub.url
    api = OpenAICompatibleBackend(url, "m", vocab_size=len(VOCAB), logprobs_temperature=1.0, max_retries=1,
                                  backoff=0.0, timeout=2.0)
    with pytest.raises(ConnectionError, match="could not be reached"):
        api.next_token_distributions([[1]])


def test_api_key_is_sent_as_bearer_and_never_shown(server):
    api = backend(server, api_key="sk-test-123")
    api.next_token_distributions(contexts(1))
    assert server.requests[0][0]["Authorization"] == "Bearer sk-test-123"
    server.actions.append(lambda body: (401, {"error": {"message": "bad key", "type": "AuthenticationError"}}))
    with pytest.raises(ValueError, match="HTTP 401.*check api_key") as info:
        api.next_token_distributions(contexts(1))
    assert "sk-test" not in str(info.value) + repr(api)


def valid(server):
    """An action editing the normal reply: ``edit(reply_dict)`` returns what is sent."""
    def wrap(edit):
        return lambda body: (200, edit(server.reply(body)[1]))
    return wrap


def first_top(reply):
    return reply["choices"][0]["logprobs"]["top_logprobs"][0]


def set_top(reply, top):
    reply["choices"][0]["logprobs"]["top_logprobs"][0] = top
    return reply


MALFORMED = {
    "not JSON": (lambda r: f"<html>{SECRET}</html>".encode(), "not JSON"),
    "not an object": (lambda r: [SECRET], "no 'choices' list"),
    "no choices": (lambda r: {"error": SECRET}, "no 'choices' list"),
    "a choice short": (lambda r: {**r, "choices": r["choices"][:1]}, "1 choices for 2 prompts"),
    "repeated index": (lambda r: {**r, "choices": [r["choices"][0], r["choices"][0]]}, "repeated 'index'"),
    "no logprobs": (lambda r: {**r, "choices": [{"index": 0, "text": SECRET}, r["choices"][1]]}, "top_logprobs"),
    "empty map": (lambda r: set_top(r, {}), "non-empty logprobs"),
    "text keys": (lambda r: set_top(r, {SECRET: -0.1}), "not keyed 'token_id:N'"),
    "bad id": (lambda r: set_top(r, {"token_id:-3": -0.1}), "not keyed 'token_id:N'"),
    "id out of range": (lambda r: set_top(r, {f"token_id:{len(VOCAB)}": -0.1}), r"outside \[0, 13\)"),
    "logprob not a number": (lambda r: set_top(r, {"token_id:2": SECRET}), "not a number"),
    "positive logprob": (lambda r: set_top(r, {"token_id:2": 0.5}), "NaN or positive"),
    "mass above 1": (lambda r: set_top(r, {"token_id:2": -0.01, "token_id:3": -0.02}), "sum to more than 1"),
    "repeated id": (lambda r: set_top(r, {"token_id:2": -1.0, "token_id:02": -2.0}), "twice"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_replies_are_refused_without_quoting_them(server, case):
    edit, message = MALFORMED[case]
    server.actions.append(valid(server)(edit))
    with pytest.raises(ValueError, match=message) as info:
        backend(server).next_token_distributions(contexts(2))
    assert SECRET not in str(info.value)
    assert len(server.requests) == 1  # a malformed reply is not retried


def test_nan_logprob_is_refused(server):
    nan = {"token_id:2": float("nan")}  # json.dumps writes NaN, json.loads reads it back
    server.actions.append(lambda body: (200, json.dumps(set_top(server.reply(body)[1], nan)).encode()))
    with pytest.raises(ValueError, match="NaN or positive"):
        backend(server).next_token_distributions(contexts(2))


def test_errors_never_quote_the_prompt(server):
    """A server error that echoes the prompt (text and token ids) is reported by status alone."""
    api = backend(server)
    secret_ids = api.encode(f"{SECRET} mat dog ran far away home")
    echoed = {"error": {"message": f"bad prompt {secret_ids} {SECRET}", "type": "BadRequestError", "param": "prompt"}}
    server.actions.append(lambda body: (400, echoed))
    with pytest.raises(ValueError, match=r"HTTP 400 \(type 'BadRequestError', param 'prompt'\)") as info:
        api.next_token_distributions([secret_ids])
    text = str(info.value)
    assert SECRET not in text and str(secret_ids)[1:-1] not in text and "mat" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(ValueError) as info:  # a bad context: the position, never the id
        api.next_token_distributions([secret_ids + [999]])
    assert "999" not in str(info.value) and "position 7" in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=0), "vocab_size must be >= 1, got 0"),
    (dict(top_logprobs=0), "top_logprobs must be >= 1, got 0"),
    (dict(batch_size=0), "batch_size must be >= 1, got 0"),
    (dict(timeout=0), "timeout must be > 0.0, got 0.0"),
    (dict(max_retries=-1), "max_retries must be >= 0, got -1"),
    (dict(backoff=-1.0), "backoff must be >= 0.0, got -1.0"),
    (dict(logprobs_temperature=0.0), "logprobs_temperature must be >= 0.01, got 0.0"),
    (dict(eos_token_id=99), "eos_token_id must be <= 12, got 99"),
    (dict(api_key=""), "api_key must be None or a non-empty"),
    (dict(extra_body={"temperature": 0.3}), r"extra_body may not set \['temperature'\]"),
    (dict(tokenizer=object()), "give tokenizer or encode/decode, not both"),
    (dict(probe_prompt=[]), "probe_prompt must hold at least one token id"),
])
def test_parameters_are_checked(server, kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        backend(server, **kwargs)


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "ftp://host/v1", "http:///v1", "http://h/v1?key=1"])
def test_base_url_is_checked(url):
    with pytest.raises(ValueError, match="base_url must be an http"):
        OpenAICompatibleBackend(url, "m", vocab_size=5, logprobs_temperature=1.0)


def test_logprobs_temperature_must_be_stated():
    with pytest.raises(TypeError, match="logprobs_temperature"):
        OpenAICompatibleBackend("http://127.0.0.1:1/v1", "m", vocab_size=5)


def test_extra_body_and_tokenizer_object(server):
    class Tokenizer:
        eos_token_id = W["<eos>"]

        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return toy().encode(text)

        def decode(self, ids, skip_special_tokens=False):
            assert skip_special_tokens is True
            return toy().decode(ids)

    api = OpenAICompatibleBackend(server.url, "toy-model", vocab_size=len(VOCAB), logprobs_temperature=1.0,
                                  tokenizer=Tokenizer(), top_logprobs=K, extra_body={"cache_salt": "s" * 43})
    assert api.eos_token_id == W["<eos>"] and api.decode(api.encode("the cat")) == "the cat"
    api.next_token_distributions([api.encode("the cat")])
    assert server.requests[0][1]["cache_salt"] == "s" * 43
