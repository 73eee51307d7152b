"""``OpenAICompatibleBackend``: next-token distributions from a remote model server's top-k logprobs.

The server speaks the OpenAI ``/v1/completions`` dialect as vLLM does (docs/remote_backend.md).  Each step
sends the teachers' token-id contexts in batches (``"prompt": [[ids], ...]``) with ``max_tokens=1``,
``logprobs=k``, ``echo=false`` and vLLM's ``return_tokens_as_token_ids=true``, and reads
``choices[i].logprobs.top_logprobs[0]``, a map ``"token_id:N" -> logprob``.

What a row means.  Teacher ``i``'s row lists the ``k`` tokens with the highest logprobs the server reported
(ties broken by token id) with probabilities ``exp(logprob)``; its tail is ``1 -`` their sum (a tiny
negative rounding is clipped to 0).  The server computes ``softmax(logits / T_s)`` where ``T_s`` is the
declared ``logprobs_temperature`` (1.0 for raw logprobs, vLLM's default; ``T_s`` for processed logprobs at
the request's temperature, which the backend sends, with top-k, top-p, min-p and penalties switched off).
So the row is exactly ``TeacherDistributions.top_k(k)`` of the teacher's distribution at temperature
``T_s``.  The backend applies no temperature itself, and refuses host temperature in :meth:`votes`: a
temperature applied to a truncated row with a tail of unknown shape would be approximate, and on top of a
server's temperature it would be a second one.  Top-p on the host is fine (the tail counts as dropped mass).

Privacy (paper Section 3, "Implementation"; Observation 1): teacher ``i``'s truncated row and tail are a
deterministic function of teacher ``i``'s own context, so changing one teacher's data still changes only that
teacher's vote, and Algorithm 1's coordination and every guarantee of the aggregator hold unchanged.  The
prompts are private: no error message quotes a prompt, a prompt token id, a reply's token or value, or the
server's own error message (which may echo the prompt).  Of a refusal's ``type`` field only the names in
``KNOWN_ERROR_TYPES`` are shown, and of its "max allowed: N" only a number the request itself sent.
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import math
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from http import HTTPStatus

import numpy as np

from ensembles.backends.base import ContextBackend
from ensembles.backends.callable_tokenizer import CallableTokenizer
from ensembles.distributions import SUM_TOLERANCE, TeacherDistributions
from pate_accountant.validation import check_int, check_real

__all__ = ["OpenAICompatibleBackend"]

#: Request fields the backend owns; ``extra_body`` may not override them.
OWNED_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "logprobs", "echo", "n", "stream", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "frequency_penalty", "presence_penalty", "return_tokens_as_token_ids",
})
#: The smallest ``logprobs_temperature``: servers treat a temperature near 0 as greedy decoding (vLLM below
#: 1e-5) and then report logprobs at temperature 1.
MIN_TEMPERATURE = 0.01
#: Logprobs at or below this are servers' stand-ins for -inf (vLLM clamps to -9999.0).
CLAMPED_LOGPROB = -1000.0
MAX_BACKOFF = 30.0
_TOKEN_KEY = re.compile(r"token_id:([0-9]{1,12})")
_CAP = re.compile(r"greater than max allowed: ?(-?[0-9]{1,12})")
#: Error ``type`` values that OpenAI-compatible servers send, the only ones an error message names; any other
#: value (a server could echo a prompt into it) is reported as an unnamed server error.  vLLM's
#: ``create_error_response`` sends BadRequestError, NotFoundError, NotImplementedError and
#: InternalServerError, named after the OpenAI Python client's exception classes (all listed here); its
#: handlers of HTTP and request-validation errors send the status's reason phrase ("Bad Request", "Not
#: Found"); OpenAI's own API sends snake-case types.
KNOWN_ERROR_TYPES = frozenset({
    "BadRequestError", "AuthenticationError", "PermissionDeniedError", "NotFoundError", "ConflictError",
    "UnprocessableEntityError", "RateLimitError", "InternalServerError", "NotImplementedError",
    "invalid_request_error", "authentication_error", "rate_limit_error", "insufficient_quota", "server_error",
    "service_unavailable_error",
    *(status.phrase for status in HTTPStatus if status >= 400),
})
#: The most of an error reply that is read.
ERROR_BODY_BYTES = 65536


class OpenAICompatibleBackend(CallableTokenizer, ContextBackend):
    """``OpenAICompatibleBackend(base_url, model, *, vocab_size, logprobs_temperature, tokenizer=None,
    encode=None, decode=None, eos_token_id=None, top_logprobs=20, batch_size=32, timeout=60.0,
    max_retries=3, backoff=0.5, api_key=None, extra_body=None, check_temperature=True, probe_prompt=None)``.

    * ``base_url``: the server's API root, e.g. ``"http://127.0.0.1:8000/v1"`` (requests go to
      ``base_url + "/completions"``, directly: environment proxy settings are ignored); ``model``: the name
      sent in each request.
    * ``vocab_size``: the model's output vocabulary size (its logits' length, which can exceed the
      tokenizer's length).
    * ``logprobs_temperature`` (required): the temperature at which the server reports logprobs.  1.0 for a
      server reporting raw logprobs (vLLM's default ``--logprobs-mode raw_logprobs``); ``T`` for a server
      reporting processed logprobs (vLLM ``--logprobs-mode processed_logprobs``) at the request's temperature,
      which the backend sets to ``T``.  Unless ``check_temperature=False``, a ``T`` other than 1 is checked
      once against the server on a public probe (:meth:`check_server_temperature`).
    * ``tokenizer``: a Hugging Face tokenizer (``encode(text, add_special_tokens=False)``,
      ``decode(ids, skip_special_tokens=True)``, ``eos_token_id``), or else ``encode``/``decode`` callables
      (without ``encode`` prompts must be token-id lists; without ``decode`` text is the ids, space-separated).
    * ``top_logprobs``: ``k``, at most the server's cap (vLLM ``--max-logprobs``, 20 by default);
      ``batch_size``: prompts per request.
    * ``timeout``: the seconds one request may take in all, from connecting to the last byte of the reply (a
      server that trickles its reply is cut off, not waited for); ``max_retries`` and ``backoff``: connection
      errors, timeouts and HTTP 429/5xx are retried after ``backoff * 2**attempt`` seconds (at most 30), each
      try with its own ``timeout``; other HTTP errors are not retried.
    * ``api_key``: sent as ``Authorization: Bearer``; ``extra_body``: further request fields (say
      ``cache_salt``), which may not override the backend's own.
    * ``probe_prompt``: the public token ids of the temperature check (default ``[eos_token_id]``, else
      ``[0]``); never a private prompt.
    """

    _NO_ENCODE = "this OpenAICompatibleBackend has no tokenizer: give prompts as token-id lists"

    def __init__(self, base_url: str, model: str, *, vocab_size: int, logprobs_temperature: float,
                 tokenizer=None, encode: Callable | None = None, decode: Callable | None = None,
                 eos_token_id: int | None = None, top_logprobs: int = 20, batch_size: int = 32,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.5, api_key: str | None = None,
                 extra_body: dict | None = None, check_temperature: bool = True,
                 probe_prompt: Sequence[int] | None = None):
        if not isinstance(base_url, str):
            raise TypeError(f"base_url must be a str, got {type(base_url).__name__}")
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', got {base_url!r}")
        self._url = base_url.rstrip("/") + "/completions"
        self._where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        self._address = (parts.hostname, parts.port)
        self._path = urllib.parse.urlsplit(self._url).path
        self._connection = _BoundedHTTPSConnection if parts.scheme == "https" else _BoundedHTTPConnection
        if not isinstance(model, str):
            raise TypeError(f"model must be a str, got {type(model).__name__}")
        if not model:
            raise ValueError("model must be a non-empty str, got ''")
        self._model = model
        self._vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self._temperature = check_real("logprobs_temperature", logprobs_temperature, minimum=MIN_TEMPERATURE)
        self._k = check_int("top_logprobs", top_logprobs, minimum=1)
        self._batch_size = check_int("batch_size", batch_size, minimum=1)
        self._timeout = check_real("timeout", timeout, minimum=0.0, min_open=True)
        self._max_retries = check_int("max_retries", max_retries, minimum=0)
        self._backoff = check_real("backoff", backoff, minimum=0.0)
        if api_key is not None and not isinstance(api_key, str):
            raise TypeError(f"api_key must be None or a str, got {type(api_key).__name__}")
        if api_key is not None and (not api_key or not api_key.isprintable()):
            raise ValueError("api_key must be None or a non-empty printable str")  # never quote a key
        self._api_key = api_key
        extra_body = {} if extra_body is None else extra_body
        if not isinstance(extra_body, dict):
            raise TypeError(f"extra_body must be a dict, got {type(extra_body).__name__}")
        clash = sorted(OWNED_FIELDS.intersection(extra_body))
        if clash:
            raise ValueError(f"extra_body may not set {clash}: the backend sets these fields itself")
        self._extra = dict(extra_body)
        self._encode, self._decode = _tokenizer_functions(tokenizer, encode, decode)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if eos_token_id is not None:
            eos_token_id = check_int("eos_token_id", eos_token_id, minimum=0, maximum=self._vocab_size - 1)
        self._eos = eos_token_id
        self._check_temperature = bool(check_temperature)
        if probe_prompt is None:
            probe_prompt = [0 if eos_token_id is None else eos_token_id]
        probe = [check_int("probe_prompt token", t, minimum=0, maximum=self._vocab_size - 1) for t in probe_prompt]
        if not probe:
            raise ValueError("probe_prompt must hold at least one token id")
        self._probe = probe
        self._temperature_checked = self._temperature == 1.0 or not self._check_temperature

    # -- the protocol's tokenizer side (vocab_size, eos_token_id, encode: CallableTokenizer) ----------
    @property
    def top_logprobs(self) -> int:
        return self._k

    @property
    def logprobs_temperature(self) -> float:
        """The temperature of the server's logprobs, hence of :meth:`distributions` (module docstring)."""
        return self._temperature

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def decode(self, token_ids) -> str:
        if self._decode is None:
            return " ".join(str(int(t)) for t in token_ids)
        return self._decode([int(t) for t in token_ids])

    def __repr__(self):
        return (f"OpenAICompatibleBackend({self._where!r}, model={self._model!r}, vocab_size={self._vocab_size}, "
                f"logprobs_temperature={self._temperature}, top_logprobs={self._k})")

    # -- distributions -------------------------------------------------------------------------------
    def next_token_distributions(self, contexts) -> TeacherDistributions:
        """Each context's top-``k`` row plus tail (module docstring), ``batch_size`` contexts per request."""
        contexts = [_checked_context(self, i, c) for i, c in enumerate(contexts)]
        if not contexts:
            raise ValueError("contexts must hold at least one token-id context")
        if not self._temperature_checked:
            self.check_server_temperature()
        ids, probs, tails = [], [], []
        for start in range(0, len(contexts), self._batch_size):
            batch = contexts[start:start + self._batch_size]
            for offset, (tokens, logprobs) in enumerate(self._query(batch, self._temperature)):
                where = f"choice {offset} (context {start + offset})"
                kept = np.exp(logprobs[:self._k])
                mass = math.fsum(kept)
                if mass > 1.0 + SUM_TOLERANCE:
                    raise ValueError(f"{where}: the top-{self._k} probabilities sum to more than 1 + {SUM_TOLERANCE}")
                ids.append(tokens[:self._k])
                probs.append(kept)
                tails.append(max(0.0, 1.0 - mass))
        return TeacherDistributions.from_sparse(ids, probs, self._vocab_size, tail=tails)

    def votes(self, key, *, temperature: float = 1.0, top_p: float | None = None, histograms: str = "coordinated",
              teacher_ids=None, public=None) -> np.ndarray:
        """:meth:`ContextBackend.votes`, but only at temperature 1: a temperature belongs on the server
        (``logprobs_temperature``), where it acts before the top-``k`` cut.  ``public``: the step's public prior
        (mixing, support), applied on the host like every other transform."""
        self.check_sampling(temperature, top_p)
        return super().votes(key, temperature=temperature, top_p=top_p, histograms=histograms,
                             teacher_ids=teacher_ids, public=public)

    def check_sampling(self, temperature: float, top_p: float | None = None) -> None:
        """Refuse a host temperature other than 1 (``PrivateGenerator`` asks when it is built, before any run)."""
        if temperature != 1.0:
            raise ValueError(
                f"temperature={temperature} would be applied on the host to top-{self._k} rows with a tail, only "
                f"approximately (and on top of logprobs_temperature={self._temperature}); have the server apply "
                "it (logprobs_temperature, docs/remote_backend.md) and keep PrivateGenerator(temperature=1.0)")

    def check_server_temperature(self) -> None:
        """Check on the public probe prompt that the server's logprobs are at ``logprobs_temperature``.

        Asks for the probe's logprobs at temperature 1 and at ``T``: a server reporting processed logprobs
        divides every logprob gap by ``T``, one reporting raw logprobs leaves them alone.  Raises
        ``ValueError`` when the gaps follow temperature 1 (the server ignores the temperature) or neither.
        Temperatures within a few percent of 1 cannot be told apart from 1 this way.
        """
        (ids_t, lp_t), = self._query([self._probe], self._temperature)
        (ids_1, lp_1), = self._query([self._probe], 1.0)
        at_t = {int(t): v for t, v in zip(ids_t, lp_t) if v > CLAMPED_LOGPROB}
        at_1 = {int(t): v for t, v in zip(ids_1, lp_1) if v > CLAMPED_LOGPROB}
        common = sorted(set(at_t) & set(at_1), key=lambda t: (-at_1[t], t))
        gap_1 = at_1[common[0]] - at_1[common[-1]] if len(common) >= 2 else 0.0
        if gap_1 < 1e-2:
            raise ValueError("check_server_temperature is inconclusive: the probe's reported tokens have nearly "
                             "equal logprobs; pass another probe_prompt, or check_temperature=False")
        ratio = (at_t[common[0]] - at_t[common[-1]]) / gap_1
        processed, raw = abs(math.log(max(ratio, 1e-12) * self._temperature)), abs(math.log(max(ratio, 1e-12)))
        if processed <= raw and processed < 0.05:
            self._temperature_checked = True
            return
        if raw < 0.05:
            raise ValueError(
                f"the server reports logprobs at temperature 1 whatever the request's temperature (raw logprobs, "
                f"vLLM's default --logprobs-mode raw_logprobs), not at logprobs_temperature={self._temperature}: "
                "build with logprobs_temperature=1.0, or start the server with --logprobs-mode processed_logprobs")
        raise ValueError(f"the server's logprobs follow neither temperature 1 nor logprobs_temperature="
                         f"{self._temperature} (other processing such as penalties?); see docs/remote_backend.md")

    # -- the wire ------------------------------------------------------------------------------------
    def _query(self, prompts: list, temperature: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """One request: per prompt, every reported ``(token ids, logprobs)``, sorted by decreasing logprob
        (then token id)."""
        body = {
            **self._extra, "model": self._model, "prompt": prompts, "max_tokens": 1, "logprobs": self._k,
            "echo": False, "n": 1, "stream": False, "temperature": temperature, "top_p": 1.0, "top_k": -1,
            "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "return_tokens_as_token_ids": True,
        }
        choices = _choices(self._post(json.dumps(body, allow_nan=False).encode()), len(prompts))
        return [self._entries(choice, position) for position, choice in enumerate(choices)]

    def _entries(self, choice: dict, position: int) -> tuple[np.ndarray, np.ndarray]:
        where = f"choice {position}"
        logprobs = choice.get("logprobs")
        top = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(top, list) or not top or not isinstance(top[0], dict) or not top[0]:
            raise ValueError(f"{where}: the reply has no non-empty logprobs.top_logprobs[0] map (does the server "
                             "return logprobs on /v1/completions?)")
        tokens, values = [], []
        for entry, (key, value) in enumerate(top[0].items()):
            match = _TOKEN_KEY.fullmatch(key)
            if match is None:  # the key may be a private token's text: never quote it
                raise ValueError(f"{where}: top_logprobs entry {entry} is not keyed 'token_id:N' (the server must "
                                 "support return_tokens_as_token_ids, as vLLM does)")
            token = int(match.group(1))
            if token >= self._vocab_size:
                raise ValueError(f"{where}: top_logprobs entry {entry} has a token id outside [0, {self._vocab_size})")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: the logprob of top_logprobs entry {entry} is not a number")
            if math.isnan(value) or value > SUM_TOLERANCE:
                raise ValueError(f"{where}: the logprob of top_logprobs entry {entry} is NaN or positive")
            tokens.append(token)
            values.append(float(value))
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{where}: top_logprobs lists a token id twice")
        order = sorted(range(len(tokens)), key=lambda j: (-values[j], tokens[j]))
        return np.asarray(tokens, dtype=np.int64)[order], np.asarray(values)[order]

    def _post(self, data: bytes) -> bytes:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempts = self._max_retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(min(self._backoff * 2 ** (attempt - 1), MAX_BACKOFF))
            try:
                status, body = self._exchange(data, headers)
            except (OSError, http.client.HTTPException) as error:
                if isinstance(error, TimeoutError):
                    failure, kind = f"did not complete the request within timeout={self._timeout} s", TimeoutError
                else:
                    why = getattr(error, "strerror", None) or type(error).__name__  # never the server's bytes
                    failure, kind = f"could not be reached ({why})", ConnectionError
                continue
            if 200 <= status < 300:
                return body
            if status != 429 and status < 500:
                raise self._refusal(status, body) from None
            failure, kind = f"answered HTTP {status}", RuntimeError
        raise kind(f"the server at {self._where} {failure} ({attempts} attempts, max_retries={self._max_retries})")

    def _exchange(self, data: bytes, headers: dict) -> tuple[int, bytes]:
        """One ``POST`` on a fresh connection, ``(status, body)``, all of it within ``timeout`` seconds: connecting,
        the TLS handshake, sending and every read of the reply wait only for the time left (the system's lookup
        of the host name aside), so a server that trickles its reply raises ``TimeoutError``.  No proxy is used.
        Of an error reply at most ``ERROR_BODY_BYTES`` are read, and a failure to read it leaves it empty."""
        deadline = _Deadline(self._timeout)
        connection = self._connection(*self._address, deadline=deadline)
        try:
            connection.request("POST", self._path, body=data, headers=headers)
            response = connection.getresponse()
            if 200 <= response.status < 300:
                return response.status, response.read()
            try:
                body = response.read(ERROR_BODY_BYTES)
            except (OSError, http.client.HTTPException):
                body = b""
            return response.status, body
        finally:
            connection.close()

    def _field(self, name: str) -> bool:
        return name in OWNED_FIELDS or name in self._extra

    def _refusal(self, status: int, detail: bytes) -> ValueError:
        """A 4xx answer as a one-line error that never quotes the server's message (it may echo the prompt);
        the error's ``type`` is named only when it is in ``KNOWN_ERROR_TYPES`` (else it is an unnamed server
        error), its ``param`` only when it is a request field, and the number of a "max allowed: N" only when
        the request sent that number itself (``max_tokens`` and ``n``, 1, or ``logprobs``, ``top_logprobs``)."""
        info = _error_info(detail)
        message = info.get("message") if isinstance(info.get("message"), str) else ""
        cap = _CAP.search(message)
        if cap and "logprobs" in message and "prompt logprobs" not in message:
            limit = int(cap.group(1))
            said = f"its limit is {limit}" if limit in (1, self._k) else "that is above the server's limit"
            return ValueError(f"the server refused top_logprobs={self._k}: {said} (vLLM --max-logprobs, 20 by "
                              f"default); restart it with --max-logprobs {self._k} or more, or lower top_logprobs")
        fields = []
        if info.get("type") is not None:
            known = isinstance(info["type"], str) and info["type"] in KNOWN_ERROR_TYPES
            fields.append(f"type {info['type']!r}" if known else "an unnamed server error")
        if isinstance(info.get("param"), str) and self._field(info["param"]):
            fields.append(f"param {info['param']!r}")
        hint = {401: "; check api_key", 403: "; check api_key", 404: "; check base_url and model"}.get(status, "")
        if "context length" in message:
            hint += "; a prompt is longer than the model's context"
        return ValueError(f"the server at {self._where} refused the request: HTTP {status}"
                          f"{' (' + ', '.join(fields) + ')' if fields else ''}{hint} (its message is not shown: "
                          "it may quote the prompt)")


class _Deadline:
    """When one request's time runs out (``time.monotonic`` seconds)."""

    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        """The seconds left; ``TimeoutError`` when none are."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request ran out of time")
        return left


class _BoundedReader(io.RawIOBase):
    """A response's socket reader whose every read waits only for the time left before ``deadline``."""

    def __init__(self, raw, sock, deadline: _Deadline):
        super().__init__()
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._sock.settimeout(self._deadline.left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _BoundedResponse(http.client.HTTPResponse):
    """An ``HTTPResponse`` that reads its status line, headers and body through a :class:`_BoundedReader`."""

    def __init__(self, sock, *args, deadline: _Deadline, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_BoundedReader(self.fp.detach(), sock, deadline))


class _BoundedHTTPConnection(http.client.HTTPConnection):
    """An ``HTTPConnection`` on which connecting, sending and reading the reply all end by ``deadline``: each
    socket operation gets the time left as its timeout, so no number of slow bytes can stretch a request."""

    def __init__(self, host: str, port: int | None, *, deadline: _Deadline):
        super().__init__(host, port, timeout=deadline.left())
        self._deadline = deadline
        self._create_connection = self._open_socket
        self.response_class = functools.partial(_BoundedResponse, deadline=deadline)

    def _open_socket(self, address, timeout=None, source_address=None) -> socket.socket:
        """``socket.create_connection``, but each address tried gets only the time left (``timeout`` unused)."""
        failure: OSError = OSError("the host name has no address")
        for family, kind, protocol, _, where in socket.getaddrinfo(*address, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, protocol)
            try:
                sock.settimeout(self._deadline.left())
                if source_address:
                    sock.bind(source_address)
                sock.connect(where)
                sock.settimeout(self._deadline.left())  # the TLS handshake (https) waits at most this long
                return sock
            except OSError as error:
                sock.close()
                failure = error
        raise failure

    def send(self, data) -> None:
        """Send ``data`` (bytes: the request line and headers, then the body) within the time left."""
        if self.sock is None:
            self.connect()
        view = memoryview(data)
        while view:
            self.sock.settimeout(self._deadline.left())
            view = view[self.sock.send(view):]


class _BoundedHTTPSConnection(_BoundedHTTPConnection, http.client.HTTPSConnection):
    """:class:`_BoundedHTTPConnection` over TLS (the default context: certificates and host name checked)."""


def _tokenizer_functions(tokenizer, encode, decode) -> tuple:
    """``(encode, decode)`` from a Hugging Face tokenizer (no special tokens added, special tokens skipped
    when decoding, as ``TransformersBackend`` does) or from the two callables."""
    if tokenizer is not None and (encode is not None or decode is not None):
        raise ValueError("give tokenizer or encode/decode, not both")
    for name, fn in (("encode", encode), ("decode", decode)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    if tokenizer is None:
        return encode, decode
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
        raise TypeError("tokenizer must have encode and decode methods (a Hugging Face tokenizer)")
    return (lambda text: tokenizer.encode(text, add_special_tokens=False),
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


def _checked_context(backend, i: int, context) -> list[int]:
    """Context ``i`` as a list of ``int`` token ids (errors name positions, never ids)."""
    context = list(context)
    if not context:
        raise ValueError(f"context {i} is empty: the server needs at least one token")
    for position, token in enumerate(context):
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < backend.vocab_size:
            raise ValueError(f"context {i}: token at position {position} is not an id in [0, {backend.vocab_size})")
    return [int(t) for t in context]


def _choices(raw: bytes, expected: int) -> list[dict]:
    """The reply's choices in prompt order (by ``index``), checked against the number of prompts."""
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("the server's reply is not JSON") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list):
        raise ValueError("the server's reply has no 'choices' list")
    if len(choices) != expected:
        raise ValueError(f"the server's reply has {len(choices)} choices for {expected} prompts (one each)")
    by_index: dict = {}
    for position, choice in enumerate(choices):
        index = choice.get("index") if isinstance(choice, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < expected or index in by_index:
            raise ValueError(f"choice {position} of the reply has a missing, out-of-range or repeated 'index'")
        by_index[index] = choice
    return [by_index[i] for i in range(expected)]


def _error_info(detail: bytes) -> dict:
    """``message``/``type``/``param`` of an OpenAI-style error body (``{"error": {...}}``, or vLLM's older
    flat form); ``{}`` when the body is not one."""
    try:
        body = json.loads(detail)
    except (ValueError, RecursionError):
        return {}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    return body if isinstance(body, dict) else {}
