"""Ctrl-C during a run: the first SIGINT stops the run at the next step boundary, or at once inside a model call
where nothing is charged (:class:`_StopOnInterrupt`, :class:`_Interruptible`, :class:`_Interrupted`); a second
one interrupts at once."""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading


class _Interrupted(Exception):
    """Raised at a step boundary after a Ctrl-C, or at once inside a model call (:class:`_StopOnInterrupt`)."""


class _Interruptible:
    """A backend whose every method call is a :meth:`_StopOnInterrupt.safe` model call (attributes pass
    through), so that a first Ctrl-C during a long prefill stops the run within one batch."""

    def __init__(self, inner, stop: _StopOnInterrupt):
        self._inner, self._stop = inner, stop

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not inspect.isroutine(value):  # data, and callable objects such as a tokenizer, pass as they are
            return value
        stop = self._stop

        def call(*args, **kwargs):
            with stop.safe():
                return value(*args, **kwargs)

        return call


class _StopOnInterrupt:
    """While a run generates: the first SIGINT only asks the run to stop at the next step boundary (the run
    calls :meth:`check` there) and calls ``on_request`` (the ledger's :meth:`~pate_accountant.ledger.Ledger.interrupt`:
    a database statement the server leaves unanswered then fails within a second instead of at its deadline); a
    second one interrupts at once.  Does nothing outside the main thread."""

    def __init__(self, on_request=None):
        self.requested = False
        self._previous = None
        self._on_request = on_request
        self._safe = 0  # inside a model call (:meth:`safe`), where stopping at once loses nothing

    @contextlib.contextmanager
    def safe(self):
        """A model call (a prefill of the teachers' prompts, a forward, the votes): nothing is charged inside, so a
        first Ctrl-C stops the run there at once instead of waiting for the step to end (a prefill of many long
        prompts takes minutes on a CPU; the backends work in batches, between which Python handles the signal)."""
        self._safe += 1
        try:
            yield
        finally:
            self._safe -= 1

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self._on_request is not None:
            self._on_request()
        if self._safe:
            raise _Interrupted

    def check(self) -> None:
        if self.requested:
            raise _Interrupted

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False
