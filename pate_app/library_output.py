"""What the libraries under a run write on the user's stderr, and how the commands keep it off (docs/cli.md,
"Quiet runs").

``demo``, ``generate`` and the experiments promise a stderr that holds their own lines only: the status
lines, the progress bar, and nothing at all under ``--json``.  Two kinds of library output would break that:

* Python warnings raised inside torch, transformers, Ray and the like (a ``FutureWarning`` announcing a
  deprecation, say).  :func:`library_warnings` routes them to the ``pate_app.library_warnings`` logger at
  INFO level, so an application that configures logging still sees them, and under ``--verbose`` shows each
  distinct one once as one line on stderr.  The warning filters are left as they are: where they turn a
  warning into an error (``-W error``, the test suite's ``filterwarnings = error``) it still raises, so a
  deprecation is seen by the tests before users meet it.  A warning raised by the project's own code is
  shown as usual.
* Progress bars and log lines that transformers and huggingface_hub print while a model converts or loads:
  :func:`quiet_libraries` switches them off (and can drop whatever else reaches ``sys.stderr`` meanwhile).

This module imports nothing heavy: the command line uses it before it knows which command runs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from pathlib import Path

__all__ = ["LOGGER_NAME", "library_warnings", "quiet_libraries"]

#: The logger that receives the libraries' warnings.
LOGGER_NAME = "pate_app.library_warnings"
_log = logging.getLogger(LOGGER_NAME)

#: The folders of the project's own packages: warnings raised from files in them are shown as usual.
_OWN = tuple(str(Path(__file__).resolve().parent.parent / name) for name in
             ("pate_accountant", "mechanisms", "ensembles", "pate_app"))


#: The routers of the contexts now open (the innermost last).
_active: list = []


def _is_ours(filename) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, TypeError, ValueError):
        return False
    return path.startswith(_OWN)


def _one_line(message, category) -> str:
    text = str(message).strip().splitlines()
    return f"{category.__name__}: {text[0] if text else ''}"


class _Router:
    """Where library output goes: the ``pate_app.library_warnings`` logger (INFO), and with ``verbose`` each
    distinct line once on stderr."""

    def __init__(self, verbose: bool):
        self.verbose = bool(verbose)
        self.seen: set[str] = set()
        self.stream = sys.stderr  # the user's stderr, even where a loader's output is being dropped

    def __call__(self, text: str, where: str) -> None:
        _log.info("%s (%s)", text, where)
        if self.verbose and text not in self.seen:
            self.seen.add(text)
            print(f"pate-accountant: library warning: {text}", file=self.stream, flush=True)


class _Forward(logging.Handler):
    """A logging handler that hands a library's log records to a :class:`_Router`."""

    def __init__(self, router: _Router):
        super().__init__(logging.WARNING)
        self.router = router

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lines = record.getMessage().strip().splitlines()
        except Exception:  # a record whose arguments do not format: say so rather than fail the run
            lines = ["(unformattable log record)"]
        self.router(f"{record.levelname.title()}: {lines[0] if lines else ''}", record.name)


@contextlib.contextmanager
def library_warnings(verbose: bool = False):
    """Route the Python warnings that libraries raise meanwhile to the ``pate_app.library_warnings`` logger
    (INFO); with ``verbose``, also print each distinct one once on stderr as ``pate-accountant: library
    warning: ...``.

    Only how a warning is *shown* changes (``warnings.showwarning``): the filters decide, as before, whether it
    is ignored, shown, or raised as an error.  Restored on exit (``warnings.catch_warnings``).  Inside another
    such context, the outer one's routing serves.  Yields the router."""
    if _active:  # nested: the outer context's router (and its verbosity) serves, so a line shows once
        yield _active[-1]
        return
    router = _Router(verbose)
    _active.append(router)
    with contextlib.ExitStack() as stack:
        stack.callback(_active.pop)
        stack.enter_context(warnings.catch_warnings())
        show = warnings.showwarning

        def route(message, category, filename, lineno, file=None, line=None):
            if _is_ours(filename):
                show(message, category, filename, lineno, file, line)
            else:
                router(_one_line(message, category), f"{filename}:{lineno}")

        warnings.showwarning = route
        yield router


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False, drop_stderr: bool = False):
    """Keep what the libraries under a run print off the user's stderr meanwhile; restored on exit.

    * Python warnings raised by libraries: :func:`library_warnings`.
    * transformers' log records (WARNING and above) go to the same place instead of transformers' own stderr
      handler; its and huggingface_hub's progress bars are switched off (the run's own status line and
      progress replace them).
    * ``drop_stderr`` also drops whatever else is written on ``sys.stderr`` meanwhile (a loader's own tqdm bar
      that ignores the switches above): for model conversion and loading only, never around code whose own
      progress bar must show.  Errors still raise, with their messages."""
    with contextlib.ExitStack() as stack:
        router = stack.enter_context(library_warnings(verbose))
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:  # no llm extra: nothing of theirs will print
            hf_logging = None
        if hf_logging is not None:
            bars = hf_logging.is_progress_bar_enabled()  # also makes transformers set up its logger, once
            hf_logging.disable_progress_bar()
            if bars:
                stack.callback(hf_logging.enable_progress_bar)
            logger = logging.getLogger("transformers")
            handlers, level = list(logger.handlers), logger.level
            logger.handlers = [_Forward(router)]
            logger.setLevel(logging.WARNING)

            def restore(logger=logger, handlers=handlers, level=level):
                logger.handlers = handlers
                logger.setLevel(level)

            stack.callback(restore)
        try:
            from huggingface_hub.utils import (
                are_progress_bars_disabled,
                disable_progress_bars,
                enable_progress_bars,
            )
        except ImportError:
            pass
        else:
            if not are_progress_bars_disabled():
                disable_progress_bars()
                stack.callback(enable_progress_bars)
        if drop_stderr:
            stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        yield router
