"""The paper's results, regenerated from scratch: ``pate-accountant experiment NAME`` (docs/results.md).

Every experiment is a module in this package, named in the application's one table
(:data:`pate_app.EXPERIMENTS`), with the same small interface, so the command line (and the tests) treat
them alike:

* ``NAME`` (the command's name), ``HELP`` (one line), ``DESCRIPTION`` (a paragraph), ``SIZES``
  (``{"full": {...}, "quick": {...}}``: the sizes that ``--quick`` switches between) and ``FULL_RUNTIME``
  (what the full size took on our machine, for the help text and docs/results.md);
* ``add_arguments(parser)``: the experiment's own options (may add none);
* ``run(*, quick, seed, progress, **options) -> dict``: the whole experiment, deterministic for a seed,
  returning plain JSON data (``{"experiment": NAME, "parameters": {...}, ...}``); ``options`` are the
  experiment's own parsed options, by their ``dest`` names; bad values raise ``ValueError`` naming them;
* ``UNSEEDED_ON_USER_DATA`` (optional, ``True`` where set): ``run`` also takes ``seed=None``, which the command
  passes when ``--seed`` is not given; the experiment then draws the mechanism noise of a user's ``--data``
  from the operating system, warns on stderr when a run on a user's data is seeded, and never writes the seed
  (``end-to-end``).  Every other experiment gets seed 0 by default;
* ``plot(result, out_dir) -> list[pathlib.Path]``: PNG figures (matplotlib, imported lazily, Agg canvas);
* ``summary(result) -> str``: a short human-readable report (tables, the claims checked).

Module-level imports stay light (numpy, scipy; no torch, no matplotlib): the parser imports every module
to learn its options, and the model-based experiments import torch only when run.

What the experiments share is here: the options every model-based one reads (:func:`records_option`,
:func:`model_option`), an integer option sized by ``--quick`` (:func:`size_option`), a comma-separated list of
reals (:func:`parse_float_list`), and the summaries' pieces (:func:`claim_lines`, :func:`formatted`,
:func:`ratio`).
"""

from __future__ import annotations

from pathlib import Path

from ensembles.data import bundled_sample, load_dolly_jsonl
from pate_accountant.validation import check_real
from pate_app import EXPERIMENTS, load_module

__all__ = ["EXPERIMENTS", "claim_lines", "formatted", "load", "model_option", "parse_float_list", "ratio",
           "records_option", "size_option"]

_REQUIRED = ("NAME", "HELP", "DESCRIPTION", "SIZES", "FULL_RUNTIME", "add_arguments", "run", "plot", "summary")


def load(name: str):
    """The experiment module ``name`` (a key of :data:`EXPERIMENTS`), checked for the interface above."""
    return load_module("experiment", EXPERIMENTS, name, _REQUIRED)


def claim_lines(claims) -> list[str]:
    """The ``summary`` lines of checked claims: ``{"claim", "holds", "detail"}`` dicts, after a header.  A dict
    with ``"finding": True`` is a measured comparison the project does not claim either way (printed as
    ``[finding]``, whichever way it came out), not a claim that can fail."""
    def mark(c) -> str:
        return "finding" if c.get("finding") else "ok" if c["holds"] else "FAILS"

    return ["", "claims:"] + [f"  [{mark(c)}] {c['claim']}: {c['detail']}" for c in claims]


def size_option(parser, sizes: dict, flag: str, metavar: str, what: str) -> None:
    """The integer option ``flag`` whose default is the size's (``sizes["full"]``, or ``sizes["quick"]`` with
    ``--quick``, under the option's name: ``--max-tokens`` reads ``"max_tokens"``): ``None`` when it is not
    given, and its help is ``what`` followed by ``(default F, --quick Q)``."""
    key = flag.lstrip("-").replace("-", "_")
    parser.add_argument(flag, metavar=metavar, type=int, default=None,
                        help=f"{what} (default {sizes['full'][key]}, --quick {sizes['quick'][key]})")


def formatted(value, spec: str) -> str:
    """``value`` formatted by ``spec`` for a summary's table; ``-`` for ``None`` (no number to show)."""
    return "-" if value is None else format(value, spec)


def ratio(numerator, denominator):
    """``numerator / denominator``, or ``None`` when the denominator is zero (no ratio to report)."""
    return numerator / denominator if denominator else None


def parse_float_list(option: str, value, default, *, maximum: float | None = None) -> list[float]:
    """A list of reals in ``(0, maximum]`` from ``None`` (the default), a comma-separated string or a
    sequence; sorted, without repeats.  ``ValueError`` names ``option`` and the value."""

    if value is None:
        value = default
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            value = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{option} must be comma-separated numbers, got {value!r}") from None
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{option} must be a list of numbers, got {value!r}") from None
    if not items:
        raise ValueError(f"{option} must not be empty, got {value!r}")
    checked = [check_real(option, v, minimum=0.0, maximum=maximum, min_open=True) for v in items]
    return sorted(set(checked))


def records_option(data):
    """``(records, label)`` for a ``--data`` option: the bundled sample for ``None``, else a Dolly-format
    JSONL file read by :func:`ensembles.data.load_dolly_jsonl`; errors become ``ValueError("--data: ...")``."""
    if data is None:
        records = bundled_sample()
        return records, f"bundled sample ({len(records)} records)"
    path = Path(data).expanduser()
    try:
        records = load_dolly_jsonl(path)
    except FileNotFoundError:
        raise ValueError(f"--data: no such file {str(path)!r}") from None
    except ValueError as exc:
        raise ValueError(f"--data: {exc}") from None
    return records, f"{path.name} ({len(records)} records after filtering)"


def model_option(model):
    """``(path, label)`` for a ``--model`` option: the embedded SmolLM2 (converted once) for ``None``, else an
    existing local path (``ValueError("--model: ...")`` otherwise)."""
    from pate_app.run import (
        demo_model_path,  # loads the model machinery: only when a model is needed
    )

    if model is None:
        return demo_model_path(), "SmolLM2-135M-Instruct (embedded)"
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"--model: path {str(path)!r} does not exist (give a local model folder or .gguf file)")
    return path, path.name
