"""One description of a private run: :class:`RunSpec` (docs/data.md, "One run description").

The command line builds it from its flags, ``generate --config FILE`` reads it from a TOML file, and Python code
builds it directly; :func:`synthesize` runs it.  Its values are checked once, here, when it is built (one line
naming the key and the value), and its shareable part (:meth:`RunSpec.shareable`: everything but the seed and the
local paths, which are reduced to their file names) is what the ledger's run metadata and ``--json`` echo.

The TOML file has one table per part of the run (every key optional, the defaults are ``generate``'s)::

    [data]        path, text_field, label_field, labels, dataset
    [task]        template, records, per_label, max_tokens, temperature, top_p
    [model]       path, teachers, groups, threads, workers, ray_address, ray_timeout
    [mechanism]   name, step_epsilon, step_delta, relation, public_mix, public_top_k
    [accountant]  name
    [budget]      epsilon, delta
    [output]      out, keep_partial, ledger
    [signing]     key, checkpoints

A seed is never read from a file: a file gets shared, and a seeded run has no privacy against anyone who knows
the seed (``--seed`` on the command line, for tests, still works).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attr

from ensembles.data import load_bundled, load_records
from ensembles.templates import get_template
from pate_accountant.validation import MAX_STEP_EPSILON, MIN_DELTA, check_int, check_real
from pate_app.commands.run_options import DEMO_DEFAULTS as _D
from pate_app.options import DEFAULT_RAY_TIMEOUT
from pate_app.run import RunInputError, demo_model_path, private_run

__all__ = ["SECTIONS", "RunSpec", "SpecError", "Task", "load_task", "synthesize"]

#: The TOML tables and, for each key, the ``RunSpec`` field it sets.
SECTIONS = {
    "data": {"path": "data", "text_field": "text_field", "label_field": "label_field", "labels": "labels",
             "dataset": "dataset"},
    "task": {"template": "template", "records": "records", "per_label": "per_label", "max_tokens": "max_tokens",
             "temperature": "temperature", "top_p": "top_p"},
    "model": {"path": "model", "teachers": "teachers", "groups": "groups", "threads": "threads",
              "workers": "workers", "ray_address": "ray_address", "ray_timeout": "ray_timeout"},
    "mechanism": {"name": "mechanism", "step_epsilon": "step_epsilon", "step_delta": "step_delta",
                  "relation": "relation", "public_mix": "public_mix", "public_top_k": "public_top_k"},
    "accountant": {"name": "accountant"},
    "budget": {"epsilon": "budget_epsilon", "delta": "budget_delta"},
    "output": {"out": "out", "keep_partial": "keep_partial", "ledger": "ledger"},
    "signing": {"key": "signing_key", "checkpoints": "checkpoints"},
}
_KEY_OF = {field: f"{table}.{key}" for table, keys in SECTIONS.items() for key, field in keys.items()}
#: Fields that name a local file or folder: the shareable part keeps only the name.
_PATHS = ("data", "model", "out", "ledger", "signing_key", "checkpoints", "template")


class SpecError(ValueError):
    """A bad value in a run description: one line naming the key (``budget.epsilon``) and the value."""


def _name(attribute) -> str:
    return _KEY_OF.get(attribute.name, attribute.name)


def _check(kind, **limits):
    def validator(instance, attribute, value):
        if value is None and attribute.default is None:
            return
        try:
            if kind == "int":
                check_int(_name(attribute), value, **limits)
            elif kind == "real":
                check_real(_name(attribute), value, **limits)
            elif kind == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"{_name(attribute)} must be true or false, got {value!r}")
            elif kind == "text":
                if not isinstance(value, str) or not value.strip():
                    raise ValueError(f"{_name(attribute)} must be a non-empty string, got {value!r}")
        except (TypeError, ValueError) as exc:
            raise SpecError(str(exc)) from None
    return validator


def _labels(value):
    if value is None:
        return None
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    return tuple(value)


def _check_labels(instance, attribute, value):
    if value is None:
        return
    if not value or any(not isinstance(v, str) or not v.strip() for v in value) or len(set(value)) != len(value):
        raise SpecError(f"data.labels must be distinct non-empty labels, got {list(value)!r}")
    if instance.label_field is None:
        raise SpecError("data.labels needs data.label_field (the field holding each record's label)")


def _text(default=None, optional=True):
    return attr.ib(default=default, validator=None if optional and default is None else _check("text"))


@attr.s(frozen=True, kw_only=True)
class RunSpec:
    """Everything a private run needs but the records themselves (module docstring).  Built from keywords (the
    ``generate`` flags' names), :meth:`from_toml` or :meth:`from_args`; frozen and checked."""

    # data
    data: str = attr.ib(validator=_check("text"))
    text_field: str = attr.ib(default="text", validator=_check("text"))
    label_field: str | None = attr.ib(default=None, validator=_check("text"))
    labels: tuple | None = attr.ib(default=None, converter=_labels, validator=_check_labels)
    dataset: str | None = attr.ib(default=None, validator=_check("text"))
    # task
    template: str | None = attr.ib(default=None, validator=_check("text"))
    records: int = attr.ib(default=_D["records"], validator=_check("int", minimum=1))
    per_label: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    max_tokens: int = attr.ib(default=_D["max_tokens"], validator=_check("int", minimum=1))
    temperature: float = attr.ib(default=_D["temperature"], validator=_check("real", minimum=0.0, min_open=True))
    top_p: float | None = attr.ib(default=_D["top_p"], validator=_check("real", minimum=0.0, maximum=1.0, min_open=True))
    # model
    model: str = attr.ib(default="embedded", validator=_check("text"))
    teachers: int = attr.ib(default=_D["teachers"], validator=_check("int", minimum=1))
    groups: int = attr.ib(default=1, validator=_check("int", minimum=1))
    threads: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    workers: int = attr.ib(default=1, validator=_check("int", minimum=1))
    ray_address: str | None = attr.ib(default=None, validator=_check("text"))
    ray_timeout: float = attr.ib(default=DEFAULT_RAY_TIMEOUT, validator=_check("real", minimum=0.0, min_open=True))
    # mechanism
    mechanism: str = attr.ib(default=_D["mechanism"], validator=_check("text"))
    step_epsilon: float = attr.ib(default=_D["step_epsilon"], validator=_check("real", minimum=0.0, maximum=MAX_STEP_EPSILON,
                                                                min_open=True))
    step_delta: float = attr.ib(default=_D["step_delta"], validator=_check("real", minimum=MIN_DELTA, maximum=1.0,
                                                               max_open=True))
    relation: str = attr.ib(default=_D["relation"], validator=attr.validators.in_(("replace-one", "add-remove-one")))
    public_mix: float = attr.ib(default=0.0, validator=_check("real", minimum=0.0, maximum=1.0))
    public_top_k: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    # accountant and budget
    accountant: str = attr.ib(default=_D["accountant"], validator=_check("text"))
    budget_epsilon: float = attr.ib(validator=_check("real", minimum=0.0, min_open=True))
    budget_delta: float = attr.ib(validator=_check("real", minimum=0.0, maximum=1.0, min_open=True, max_open=True))
    # output
    out: str | None = attr.ib(default=None, validator=_check("text"))
    keep_partial: bool = attr.ib(default=False, validator=_check("bool"))
    ledger: str | None = attr.ib(default=None, validator=_check("text"))
    # signing
    signing_key: str | None = attr.ib(default=None, validator=_check("text"))
    checkpoints: str | None = attr.ib(default=None, validator=_check("text"))
    # tests only: never read from a file, never written anywhere shareable
    seed: int | None = attr.ib(default=None, validator=_check("int", minimum=0), repr=False)

    # -- building --------------------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path, **overrides) -> RunSpec:
        """The run described by the TOML file ``path`` (module docstring); ``overrides`` (field names) win."""
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        where = f"--config {str(path)!r}"
        try:
            with open(os.path.expanduser(str(path)), "rb") as handle:
                tables = tomllib.load(handle)
        except FileNotFoundError:
            raise SpecError(f"{where}: no such file") from None
        except OSError as exc:
            raise SpecError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{where}: not valid TOML ({exc})") from None
        values = {}
        for table, content in tables.items():
            if table not in SECTIONS or not isinstance(content, dict):
                raise SpecError(f"{where}: unknown table [{table}] (the tables are {', '.join(SECTIONS)})")
            for key, value in content.items():
                if key not in SECTIONS[table]:
                    raise SpecError(f"{where}: unknown key {table}.{key} (known: "
                                    f"{', '.join(f'{table}.{k}' for k in SECTIONS[table])})")
                values[SECTIONS[table][key]] = value
        values.update(overrides)
        for required in ("data", "budget_epsilon", "budget_delta"):
            if required not in values:
                raise SpecError(f"{where}: {_KEY_OF[required]} is required")
        try:
            return cls(**values)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{where}: {exc}") from None

    @classmethod
    def from_args(cls, args, parser=None) -> RunSpec:
        """The run the ``generate`` flags in ``args`` describe; with ``--config FILE``, the file's run with every
        flag given on the command line (one whose value differs from its default) taking precedence."""
        values = {field.name: getattr(args, _FLAG.get(field.name, field.name))
                  for field in attr.fields(cls) if hasattr(args, _FLAG.get(field.name, field.name))}
        config = getattr(args, "config", None)
        if config is None:
            return cls(**values)
        given = {name: value for name, value in values.items()
                 if parser is None or value != parser.get_default(_FLAG.get(name, name))}
        return cls.from_toml(config, **given)

    # -- what may be shown ---------------------------------------------------------------------------------------
    def shareable(self) -> dict:
        """The description without the seed and with every local path reduced to its file name (run metadata,
        ``--json``), in its TOML tables."""
        out = {table: {} for table in SECTIONS}
        for table, keys in SECTIONS.items():
            for key, name in keys.items():
                value = getattr(self, name)
                if name in _PATHS and value not in (None, "embedded", "bundled", "instructions", "records"):
                    value = Path(os.path.expanduser(str(value))).name
                out[table][key] = list(value) if isinstance(value, tuple) else value
        return out

    def to_toml(self) -> str:
        """The description as a ``--config`` file (seed left out), which :meth:`from_toml` reads back equal."""
        lines = ["# a pate-accountant run (generate --config FILE; docs/data.md)"]
        for table, keys in SECTIONS.items():
            lines.append(f"\n[{table}]")
            for key, name in keys.items():
                value = getattr(self, name)
                if value is not None:
                    lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


#: ``RunSpec`` fields whose ``generate`` flag has another ``dest``.
_FLAG = {"data": "data", "records": "records", "out": "out", "signing_key": "signing_key"}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


@attr.s(frozen=True, auto_attribs=True)
class Task:
    """What a run's data and task resolve to (:func:`load_task`): the records as the teachers see them (a label
    run's records carry ``"label"``), the prompt template, and the data's label and data set name."""

    records: tuple
    template: object
    data_label: str
    dataset: str


def load_task(spec: RunSpec) -> Task:
    """Load ``spec``'s records (``bundled``: the shipped Dolly sample) and its template (default: the one that
    fits the records' layout), checked against each other; :class:`~pate_app.run.RunInputError` naming the option
    (``argument --data: ...``), before anything is charged.  Never quotes a record."""
    if (spec.labels is None) != (spec.label_field is None):
        if spec.labels is None:
            raise RunInputError("argument --label-field: give the labels to generate for with --labels A,B,... (they "
                                "are part of the task, and public; the labels found in the data are not)")
        raise RunInputError("argument --labels: needs --label-field NAME (the field holding each record's label)")
    try:
        if spec.data == "bundled":
            loaded = load_bundled(text_field=spec.text_field, label_field=spec.label_field)
            data_label, dataset = "bundled sample", "bundled-sample"
        else:
            loaded = load_records(os.path.expanduser(spec.data), text_field=spec.text_field,
                                  label_field=spec.label_field)
            data_label = dataset = os.path.basename(spec.data)
    except (FileNotFoundError, ValueError) as exc:
        raise RunInputError(f"argument --data: {exc}") from None
    except OSError as exc:  # unreadable: no permission, a folder, an I/O error
        raise RunInputError(f"argument --data: cannot read {spec.data!r}: {exc.strerror or exc}") from None
    if not loaded.records:
        raise RunInputError(f"argument --data: no records left in {spec.data!r} (every text was empty)")
    try:
        template = loaded.default_template if spec.template is None else get_template(spec.template)
        template.check_fields(loaded.fields)
    except (OSError, ValueError) as exc:
        raise RunInputError(f"argument --template: {getattr(exc, 'strerror', None) or exc}") from None
    records = loaded.records
    if spec.labels is not None and loaded.label_key != "label":  # a Dolly field named as the label
        records = tuple({**record, "label": record[loaded.label_key]} for record in records)
    return Task(records, template, data_label, spec.dataset if spec.dataset is not None else dataset)


def synthesize(spec: RunSpec, *, progress: bool = False, ledger_home=None) -> dict:
    """Run ``spec``: load its records and template, resolve its model (``embedded``: the shipped SmolLM2) and run
    private generation (:func:`pate_app.run.private_run`); the JSON-able result, with ``"spec"`` its shareable
    part.  Raises :class:`~pate_app.run.RunInputError` (or :class:`SpecError`) for bad input, before anything is
    charged."""
    if not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec, got {type(spec).__name__}")
    task = load_task(spec)
    if spec.model == "embedded":
        model, model_label = demo_model_path(announce=progress), "SmolLM2-135M-Instruct (embedded)"
    else:
        model = os.path.expanduser(spec.model)
        if not os.path.exists(model):
            raise RunInputError(f"--model: no model at {spec.model!r} (model hubs are not used: give a local path)")
        model_label = Path(model).resolve().name
    result = private_run(
        model=model, records=task.records, num_teachers=spec.teachers, ledger_path=spec.ledger,
        mechanism=spec.mechanism, accountant=spec.accountant, step_epsilon=spec.step_epsilon,
        step_delta=spec.step_delta, relation=spec.relation, epsilon=spec.budget_epsilon, delta=spec.budget_delta,
        num_records=spec.records, max_tokens=spec.max_tokens, seed=spec.seed, temperature=spec.temperature,
        top_p=spec.top_p, threads=spec.threads, workers=spec.workers, ray_address=spec.ray_address,
        ray_timeout=spec.ray_timeout, progress=progress, model_label=model_label, data_label=task.data_label,
        dataset=task.dataset, signing_key=spec.signing_key,
        checkpoints=spec.checkpoints, ledger_home=ledger_home, public_records=spec.data == "bundled",
        groups=spec.groups, template=task.template, labels=spec.labels, public_mix=spec.public_mix,
        public_top_k=spec.public_top_k, out_path=spec.out, keep_partial=spec.keep_partial,
        spec=spec.shareable(), per_label=spec.per_label,
    )
    return result
