"""A small standard-library HTTP server speaking vLLM's ``/v1/completions`` logprobs dialect (for tests).

``StubServer(next_token_probs, *, max_logprobs=20, processed=False)``: ``next_token_probs(context_ids)``
returns a probability vector over the vocabulary.  Each prompt of a request gets one choice whose
``logprobs.top_logprobs[0]`` maps ``"token_id:N"`` to the logprobs of the ``logprobs`` most likely tokens
(ties by token id; zero probabilities as vLLM's clamp ``-9999.0``) plus, as vLLM does, the sampled token
when it is not among them (here: the least likely token with positive probability).  With
``processed=True`` the logprobs are at the request's temperature (vLLM ``--logprobs-mode
processed_logprobs``), else at temperature 1 (raw logprobs).  A request for more than ``max_logprobs``
gets vLLM's HTTP 400.  ``actions`` is a queue of per-request overrides: callables ``action(body)`` returning
``(status, payload)`` (``payload``: bytes, a JSON-able object, ``None`` for the normal reply, or a callable
``write(handler)`` that writes the whole reply itself, as :meth:`StubServer.trickle` does).  The server
listens on 127.0.0.1 only, and every handler ends when the server stops.
"""

from __future__ import annotations

import collections
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


class StubServer:
    def __init__(self, next_token_probs, *, max_logprobs: int = 20, processed: bool = False):
        self.next_token_probs = next_token_probs
        self.max_logprobs = max_logprobs
        self.processed = processed
        self.reverse_choices = False
        self.requests: list[tuple[dict, dict]] = []  # (headers, body) of every request, in arrival order
        self.actions: collections.deque = collections.deque()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._httpd = None
        self._thread = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> "StubServer":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, payload = stub.handle(dict(self.headers.items()), body)
                if callable(payload):
                    payload(self)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # keep test output quiet
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a client that timed out and left
                pass

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01})
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def sleep(self, seconds: float) -> None:
        """Wait (in a handler) up to ``seconds``, or until the server stops."""
        self._stopping.wait(seconds)

    def trickle(self, *, interval: float, seconds: float, in_headers: bool = False):
        """An action: a 200 reply sent one byte every ``interval`` seconds, for at most ``seconds`` (or until
        the server stops or the client leaves), then the connection is closed.  The status line and headers
        come at once and the body (JSON whitespace, never complete) trickles, or with ``in_headers`` the
        status line and headers trickle too."""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"

        def write(handler):
            handler.close_connection = True
            end = time.monotonic() + seconds
            try:
                if not in_headers:
                    handler.wfile.write(head)
                for byte in (head if in_headers else b"") + b" " * 1000000:
                    if self._stopping.is_set() or time.monotonic() >= end:
                        return
                    handler.wfile.write(bytes([byte]))
                    self.sleep(interval)
            except OSError:  # the client gave up and closed the connection
                return

        return lambda body: (200, write)

    # -- the dialect -----------------------------------------------------------------------------------
    def handle(self, headers: dict, raw: bytes) -> tuple[int, bytes]:
        body = json.loads(raw)
        with self._lock:
            self.requests.append((headers, body))
            action = self.actions.popleft() if self.actions else None
        status, payload = (200, None) if action is None else action(body)
        if payload is None:
            status, payload = self.reply(body)
        if isinstance(payload, bytes) or callable(payload):
            return status, payload
        return status, json.dumps(payload).encode()

    def reply(self, body: dict) -> tuple[int, dict]:
        k = body["logprobs"]
        if k > self.max_logprobs:
            message = f"Requested sample logprobs of {k}, which is greater than max allowed: {self.max_logprobs}"
            return 400, {"error": {"message": message, "type": "BadRequestError", "param": "logprobs", "code": 400}}
        temperature = body["temperature"] if self.processed else 1.0
        choices = [{"index": i, "text": "", "logprobs": {"top_logprobs": [self.top_logprobs(p, k, temperature)]},
                    "finish_reason": "length"} for i, p in enumerate(body["prompt"])]
        if self.reverse_choices:
            choices.reverse()
        return 200, {"object": "text_completion", "model": body["model"], "choices": choices}

    def top_logprobs(self, context, k: int, temperature: float) -> dict:
        probs = np.asarray(self.next_token_probs(list(context)), dtype=np.float64)
        if temperature != 1.0:
            weights = np.where(probs > 0, probs, 0.0) ** (1.0 / temperature)
            probs = weights / weights.sum()
        order = sorted(range(probs.size), key=lambda j: (-probs[j], j))
        listed = order[:k]
        positive = [j for j in order if probs[j] > 0]
        if positive and positive[-1] not in listed:
            listed.append(positive[-1])  # the "sampled" token, as vLLM adds it
        return {f"token_id:{j}": (math.log(probs[j]) if probs[j] > 0 else -9999.0) for j in listed}
