"""Quiet runs (issue 21, items 1, 3 and 4): the libraries' warnings and log lines are routed off the user's
stderr (to the ``pate_app.library_warnings`` logger, and once each under ``--verbose``) while the warning
filters still decide what raises; the KV cache is fed and read under the name the model declares."""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings

import pytest

from ensembles.backends.hf_cache import cache_keyword, forward_with_cache
from pate_app import run as run_module
from pate_app.library_output import LOGGER_NAME, library_warnings, quiet_libraries

LIBRARY_FILE = "/somewhere/site-packages/somelib/module.py"


def _library_warns(text="a library's deprecation", category=FutureWarning):
    warnings.warn_explicit(text, category, LIBRARY_FILE, 7)


def test_a_library_warning_goes_to_the_log_not_stderr(capsys, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with library_warnings():
            _library_warns()
    assert capsys.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records] == [
        f"FutureWarning: a library's deprecation ({LIBRARY_FILE}:7)"
    ]


def test_verbose_shows_each_library_warning_once_as_one_line(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with library_warnings(verbose=True):
            _library_warns("first line\nsecond line of the same warning")
            _library_warns("first line\nsecond line of the same warning")
            _library_warns("another", UserWarning)
    assert capsys.readouterr().err.splitlines() == [
        "pate-accountant: library warning: FutureWarning: first line",
        "pate-accountant: library warning: UserWarning: another",
    ]


def test_the_filters_still_decide_a_library_warning_set_to_error_raises(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with library_warnings(verbose=True), pytest.raises(FutureWarning, match="a library's deprecation"):
            _library_warns()
    assert capsys.readouterr().err == ""


def test_our_own_warnings_are_shown_as_usual(capsys):
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest: shown.append(f"{category.__name__}: {message}")
        with library_warnings(verbose=True):
            warnings.warn_explicit("ours", UserWarning, run_module.__file__, 1)
            _library_warns()
    assert shown == ["UserWarning: ours"]  # handed to whatever showed warnings before; the library's was routed
    assert capsys.readouterr().err == "pate-accountant: library warning: FutureWarning: a library's deprecation\n"


def test_routing_is_restored_and_nested_contexts_show_a_line_once(capsys):
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with library_warnings(verbose=True):
            with quiet_libraries(drop_stderr=True):  # a model load inside a run: its stderr is dropped
                _library_warns()
            _library_warns()
    assert warnings.showwarning is before
    assert capsys.readouterr().err == "pate-accountant: library warning: FutureWarning: a library's deprecation\n"


def test_transformers_log_lines_are_routed_and_its_logger_restored(capsys, caplog):
    hf_logging = pytest.importorskip("transformers.utils.logging")
    hf_logging.get_verbosity()  # transformers sets up its logger on first use
    root = logging.getLogger("transformers")
    handlers, level = list(root.handlers), root.level
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with quiet_libraries(verbose=True):
        hf_logging.get_logger("transformers.models.llama").warning("a log line of theirs")
        hf_logging.get_logger("transformers.models.llama").warning("a log line of theirs")
        hf_logging.get_logger("transformers.models.llama").info("chatter below the warning level")
    assert capsys.readouterr().err == "pate-accountant: library warning: Warning: a log line of theirs\n"
    assert [r.getMessage() for r in caplog.records].count(
        "Warning: a log line of theirs (transformers.models.llama)") == 2
    assert root.handlers == handlers and root.level == level


# -- the cache adapter ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class _NewOutput:
    logits: object = None
    cache: object = None


@dataclasses.dataclass
class _OldOutput:
    logits: object = None
    past_key_values: object = None


class _NewModel:
    """transformers 5.24 and later: ``cache``, with the old keyword wrapped by a deprecation decorator."""

    def _forward(self, input_ids=None, cache=None, use_cache=False):
        return _NewOutput(logits=input_ids, cache=(cache, "extended"))

    @functools.wraps(_forward)
    def forward(self, *args, **kwargs):
        if "past_key_values" in kwargs:
            warnings.warn("`past_key_values` is deprecated", FutureWarning, stacklevel=2)
            kwargs["cache"] = kwargs.pop("past_key_values")
        return _NewModel._forward(self, *args, **kwargs)

    __call__ = forward


class _OldModel:
    """transformers 5.0 to 5.23: ``past_key_values``."""

    def forward(self, input_ids=None, past_key_values=None, use_cache=False):
        assert use_cache
        return _OldOutput(logits=input_ids, past_key_values=(past_key_values, "extended"))

    __call__ = forward


def test_the_adapter_uses_the_name_each_release_declares():
    assert cache_keyword(_NewModel()) == "cache" and cache_keyword(_OldModel()) == "past_key_values"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecated alias would raise here
        out, cache = forward_with_cache(_NewModel(), "kv", input_ids=3)
    assert out.logits == 3 and cache == ("kv", "extended")
    out, cache = forward_with_cache(_OldModel(), "kv", input_ids=4)
    assert out.logits == 4 and cache == ("kv", "extended")


def test_the_adapter_refuses_an_output_without_a_cache_field():
    class NoCache:
        def forward(self, input_ids=None, past_key_values=None, use_cache=False):
            return {"logits": input_ids}

        __call__ = forward

    with pytest.raises(TypeError, match="has no cache field"):
        forward_with_cache(NoCache(), None, input_ids=1)


def test_the_adapter_matches_the_installed_transformers():
    """On the installed release, a tiny Llama takes the keyword its forward declares and hands back a cache
    that grew by the tokens fed, with no warning (every warning is an error here)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import inspect

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    declared = inspect.signature(type(model).forward).parameters
    assert cache_keyword(model) in declared
    assert cache_keyword(model) == ("cache" if "cache" in declared else "past_key_values")
    with torch.inference_mode():
        out, cache = forward_with_cache(model, transformers.DynamicCache(config=config),
                                        input_ids=torch.tensor([[1, 2, 3]]))
        assert cache.get_seq_length() == 3 and out.logits.shape == (1, 3, 32)
        _, cache = forward_with_cache(model, cache, input_ids=torch.tensor([[4]]))
    assert cache.get_seq_length() == 4
