"""One description of a private run: :class:`RunSpec` (docs/data.md, "One run description").

The command line builds it from its flags, ``generate --config FILE`` reads it from a TOML file, and Python code
builds it directly; :func:`synthesize` runs it.  Its values are checked once, here, when it is built (one line
naming the key and the value), and its shareable part (:meth:`RunSpec.shareable`: everything but the seed and the
local paths, which are reduced to their file names) is what the ledger's run metadata and ``--json`` echo.

The TOML file has one table per part of the run (every key optional, the defaults are ``generate``'s)::

    [data]        path, text_field, label_field, labels, labels_public, dataset, long_records, public_examples,
                  teachers_see_public
    [task]        template, records, per_label, max_tokens, temperature, top_p, cut_records
    [model]       path, teachers, records_per_teacher, groups, threads, workers, ray_address, ray_timeout
    [mechanism]   name, step_epsilon, step_delta, relation, public_mix, public_top_k, public_only, histograms,
                  subsample_teachers
    [accountant]  name
    [budget]      epsilon, delta
    [output]      out, keep_partial, normalise, ledger
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

from ensembles.data import UnknownFormatError, load_bundled, load_records
from ensembles.templates import INSTRUCTIONS, get_template
from mechanisms import registry as mechanisms_registry
from pate_accountant import registry as accountants_registry
from pate_accountant.validation import check_delta, check_epsilon, check_int, check_real, read_regular_file
from pate_app.defaults import DEMO_DEFAULTS as _D
from pate_app.errors import RunInputError
from pate_app.options import DEFAULT_RAY_TIMEOUT

__all__ = ["LONG_RECORDS", "SECTIONS", "RunInputError", "RunSpec", "SpecError", "Task", "load_public_examples",
           "load_task", "task_from_records"]

#: How the run header, the result and the ledger name the embedded model.
EMBEDDED_LABEL = "SmolLM2-135M-Instruct (embedded)"


def model_label(model: str) -> str:
    """A short name of ``--model`` for the run header, the JSON result and the ledger: the folder's or file's own
    name, never the path leading to it."""
    return EMBEDDED_LABEL if model == "embedded" else Path(os.path.expanduser(model)).resolve().name


#: What ``--long-records`` does with a record too long for its share of the model's window (docs/data.md).
LONG_RECORDS = ("refuse", "truncate", "skip")


#: The TOML tables and, for each key, the ``RunSpec`` field it sets.
SECTIONS = {
    "data": {"path": "data", "text_field": "text_field", "label_field": "label_field", "labels": "labels",
             "labels_public": "labels_public", "dataset": "dataset", "long_records": "long_records",
             "public_examples": "public_examples", "teachers_see_public": "teachers_see_public"},
    "task": {"template": "template", "records": "records", "per_label": "per_label", "max_tokens": "max_tokens",
             "temperature": "temperature", "top_p": "top_p", "cut_records": "cut_records"},
    "model": {"path": "model", "teachers": "teachers", "records_per_teacher": "records_per_teacher",
              "groups": "groups", "threads": "threads", "workers": "workers", "ray_address": "ray_address",
              "ray_timeout": "ray_timeout"},
    "mechanism": {"name": "mechanism", "step_epsilon": "step_epsilon", "step_delta": "step_delta",
                  "relation": "relation", "public_mix": "public_mix", "public_top_k": "public_top_k",
                  "public_only": "public_only", "histograms": "histograms",
                  "subsample_teachers": "subsample_teachers"},
    "accountant": {"name": "accountant"},
    "budget": {"epsilon": "budget_epsilon", "delta": "budget_delta"},
    "output": {"out": "out", "keep_partial": "keep_partial", "normalise": "normalise", "ledger": "ledger"},
    "signing": {"key": "signing_key", "checkpoints": "checkpoints"},
}
_KEY_OF = {field: f"{table}.{key}" for table, keys in SECTIONS.items() for key, field in keys.items()}


def is_ledger_url(location) -> bool:
    """:func:`pate_accountant.ledger.is_ledger_url`, imported when a spec is checked (the command line's start
    imports no accountant)."""
    from pate_accountant.ledger import is_ledger_url as check

    return check(location)


#: Fields that name a local file or folder: the shareable part keeps only the name.
_PATHS = ("data", "model", "out", "ledger", "signing_key", "checkpoints", "template", "public_examples")


class SpecError(RunInputError):
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
            elif kind == "epsilon":
                check_epsilon(_name(attribute), value)
            elif kind == "delta":
                check_delta(_name(attribute), value)
            elif kind == "top_k":  # a size, or "auto": sized on the public examples when the run starts
                if value != "auto":
                    check_int(_name(attribute), value, minimum=1)
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


def _check_dataset(instance, attribute, value):
    if value is None:
        return
    if not isinstance(value, str) or not value.strip() or len(value) > 200 or not value.isprintable():
        raise SpecError(f"{_name(attribute)} must be a printable name of 1 to 200 characters, got {value!r}")


def _choice(*choices):
    def validator(instance, attribute, value):
        if value not in choices:
            raise SpecError(f"{_name(attribute)} must be one of {', '.join(choices)}, got {value!r}")
    return validator


def _registered(names):
    """A validator: the value is one of ``names()`` (a registry's, read when the spec is built, so that names
    registered by the user's own modules count)."""
    def validator(instance, attribute, value):
        if value not in names():
            raise SpecError(f"{_name(attribute)} must be one of {', '.join(names())}, got {value!r}")
    return validator


@attr.s(frozen=True, kw_only=True)
class RunSpec:
    """Everything a private run needs but the records themselves (module docstring).  Built from keywords (the
    ``generate`` flags' names), :meth:`from_toml` or :meth:`from_args`; frozen and checked."""

    # data
    data: str = attr.ib(validator=_check("text"))
    text_field: str = attr.ib(default="text", validator=_check("text"))
    label_field: str | None = attr.ib(default=None, validator=_check("text"))
    labels: tuple | None = attr.ib(default=None, converter=_labels, validator=_check_labels)
    labels_public: bool = attr.ib(default=False, validator=_check("bool"))
    dataset: str | None = attr.ib(default=None, validator=_check_dataset)
    long_records: str = attr.ib(default="refuse", validator=_choice(*LONG_RECORDS))
    #: A data file of records the user declares public, shown to the public model only (``--public-examples``).
    public_examples: str | None = attr.ib(default=None, validator=_check("text"))
    #: Every teacher's prompt shows the public examples too, after the header and before its own records
    #: (``--teachers-see-public``; public data, no privacy cost).
    teachers_see_public: bool = attr.ib(default=False, validator=_check("bool"))
    # task
    template: str | None = attr.ib(default=None, validator=_check("text"))
    records: int = attr.ib(default=_D["records"], validator=_check("int", minimum=1))
    per_label: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    max_tokens: int = attr.ib(default=_D["max_tokens"], validator=_check("int", minimum=1))
    temperature: float = attr.ib(default=_D["temperature"], validator=_check("real", minimum=0.0, min_open=True))
    top_p: float | None = attr.ib(default=_D["top_p"], validator=_check("real", minimum=0.0, maximum=1.0, min_open=True))
    #: Let a record start when its group's budget may not pay for all of its steps (``--cut-records``); by default
    #: a record starts only when the worst case of its ``max_tokens`` steps is affordable, so that the budget
    #: ends between records, never inside one (docs/generation.md, "Whole records").
    cut_records: bool = attr.ib(default=False, validator=_check("bool"))
    # model
    model: str = attr.ib(default="embedded", validator=_check("text"))
    #: ``None``: fitted to the data (:func:`pate_app.privacy_unit.default_teachers`).
    teachers: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    records_per_teacher: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    groups: int = attr.ib(default=1, validator=_check("int", minimum=1))
    threads: int | None = attr.ib(default=None, validator=_check("int", minimum=1))
    workers: int = attr.ib(default=1, validator=_check("int", minimum=1))
    ray_address: str | None = attr.ib(default=None, validator=_check("text"))
    ray_timeout: float = attr.ib(default=DEFAULT_RAY_TIMEOUT, validator=_check("real", minimum=0.0, min_open=True))
    # mechanism
    mechanism: str = attr.ib(default=_D["mechanism"], validator=_registered(mechanisms_registry.run_mechanism_names))
    step_epsilon: float = attr.ib(default=_D["step_epsilon"], validator=_check("epsilon"))
    step_delta: float = attr.ib(default=_D["step_delta"], validator=_check("delta"))
    relation: str = attr.ib(default=_D["relation"], validator=_choice("replace-one", "add-remove-one"))
    public_mix: float = attr.ib(default=0.0, validator=_check("real", minimum=0.0, maximum=1.0))
    public_top_k: int | str | None = attr.ib(default=None, validator=_check("top_k"))
    #: How the teachers' votes are drawn: ``coordinated`` (Hot PATE, shared noise) or ``independent`` (Cold PATE,
    #: the paper's baseline); the mechanism and its charge do not depend on it (``--histograms``).
    histograms: str = attr.ib(default="coordinated", validator=_choice("coordinated", "independent"))
    #: Each step counts the votes of the teachers a Poisson draw at this rate keeps (``--subsample-teachers``;
    #: ``None``: every teacher), the mechanism calibrated under add-remove-one and charged its amplified bound.
    subsample_teachers: float | None = attr.ib(default=None, validator=_check("real", minimum=0.0, maximum=1.0,
                                                                               min_open=True, max_open=True))
    #: The public model alone: no private record reaches a model, nothing is charged (``--public-only``).
    public_only: bool = attr.ib(default=False, validator=_check("bool"))
    # accountant and budget
    accountant: str = attr.ib(default=_D["accountant"], validator=_registered(accountants_registry.run_accountant_names))
    budget_epsilon: float = attr.ib(validator=_check("real", minimum=0.0, min_open=True))
    budget_delta: float = attr.ib(validator=_check("real", minimum=0.0, maximum=1.0, min_open=True, max_open=True))
    # output
    out: str | None = attr.ib(default=None, validator=_check("text"))
    keep_partial: bool = attr.ib(default=False, validator=_check("bool"))
    #: Each record's text as the utility benchmark scores it (``--normalise``, docs/utility.md).
    normalise: bool = attr.ib(default=False, validator=_check("bool"))
    ledger: str | None = attr.ib(default=None, validator=_check("text"))
    # signing
    signing_key: str | None = attr.ib(default=None, validator=_check("text"))
    checkpoints: str | None = attr.ib(default=None, validator=_check("text"))
    # tests only: never read from a file, never written anywhere shareable
    seed: int | None = attr.ib(default=None, validator=_check("int", minimum=0), repr=False)

    def __attrs_post_init__(self):
        """The checks that join two keys (one line naming both)."""
        if self.labels is not None and self.groups != 1:
            raise SpecError(f"--groups {self.groups} (model.groups): with --labels the groups are the labels (leave "
                            "--groups out)")
        if self.labels_public and self.labels is None:
            raise SpecError("--labels-public (data.labels_public) needs --label-field and --labels (data.label_field, "
                            "data.labels): it declares those labels public")
        if self.relation == "add-remove-one" and self.records_per_teacher is None:
            raise SpecError("--relation add-remove-one (mechanism.relation) needs --records-per-teacher K "
                            "(model.records_per_teacher): under add/remove the number of records is private, so it "
                            "cannot set how many records a teacher shows (docs/privacy_unit.md)")
        if self.per_label is not None and self.labels is None:
            raise SpecError("--per-label (task.per_label) needs --label-field and --labels (data.label_field, "
                            "data.labels): records per label")
        if self.teachers_see_public and self.public_examples is None:
            raise SpecError("--teachers-see-public (data.teachers_see_public) needs --public-examples FILE "
                            "(data.public_examples): the examples the teachers are shown")
        if self.checkpoints is not None and self.signing_key is None:
            raise SpecError("--checkpoints (signing.checkpoints) needs --signing-key (signing.key): the checkpoints a "
                            "run appends are signed")
        if self.signing_key is not None and self.checkpoints is None and is_ledger_url(self.ledger):
            raise SpecError("--signing-key (signing.key) with a postgresql:// --ledger (output.ledger) needs "
                            "--checkpoints FILE (signing.checkpoints): a database ledger has no folder to keep them "
                            "beside it")

    @property
    def requested(self) -> int:
        """The records the run is asked for: ``per_label`` of each label, else ``records``."""
        return self.per_label * len(self.labels) if self.per_label is not None else self.records

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
            data = read_regular_file(os.path.expanduser(str(path)), "--config file")
            tables = tomllib.loads(data.decode("utf-8"))
        except FileNotFoundError:
            raise SpecError(f"{where}: no such file") from None
        except OSError as exc:
            raise SpecError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SpecError(f"{where}: not UTF-8 text (byte {exc.start + 1}; save the file as UTF-8)") from None
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{where}: not valid TOML ({exc})") from None
        except ValueError as exc:  # a folder, a device, a pipe, a huge file
            raise SpecError(f"argument --config: {exc}") from None
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
    def from_args(cls, args, parser=None, **fixed) -> RunSpec:
        """The run the ``generate`` flags in ``args`` describe; with ``--config FILE``, the file's run with every
        flag given on the command line (one whose value differs from its default) taking precedence; ``fixed``
        (field names: ``demo``'s data and model) over both."""
        values = {field.name: getattr(args, _FLAG.get(field.name, field.name))
                  for field in attr.fields(cls) if hasattr(args, _FLAG.get(field.name, field.name))}
        config = getattr(args, "config", None)
        if config is None:
            return cls(**{**values, **fixed})
        given = {name: value for name, value in values.items()
                 if parser is None or value != parser.get_default(_FLAG.get(name, name))}
        return cls.from_toml(config, **given, **fixed)

    # -- what may be shown ---------------------------------------------------------------------------------------
    def shareable(self) -> dict:
        """The description without the seed and with every local path reduced to its file name (run metadata,
        ``--json``), in its TOML tables."""
        out = {table: {} for table in SECTIONS}
        for table, keys in SECTIONS.items():
            for key, name in keys.items():
                value = getattr(self, name)
                if name == "ledger" and is_ledger_url(value):  # the database and ledger: no user, no password
                    value = _shareable_url(value)
                elif name in _PATHS and value not in (None, "embedded", "bundled", "instructions", "records"):
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


def _shareable_url(url: str) -> str:
    """A ledger URL as the shareable run description keeps it: scheme, host, port, database and ledger name."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "ledger"])
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}" + (f"?{query}" if query else "")


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
    #: The record field the template shows as the record's text (what ``--long-records`` fits).
    text_key: str = "text"
    #: How many records the data set has as the neighbouring relation counts them: the records the file holds
    #: (those the loader leaves out included), so that under replace-one it is public; ``None``: ``len(records)``.
    size: int | None = None

    @property
    def num_records(self) -> int:
        return len(self.records) if self.size is None else self.size


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
    except (ValueError, OSError) as exc:
        hint = " (`plan` prints DATA where your records' file goes)" if spec.data == "DATA" else ""
        raise _unreadable(exc, "argument --data", missing=f"{exc}{hint}", cannot=f"cannot read {spec.data!r}") from None
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
    return Task(records, template, data_label, spec.dataset if spec.dataset is not None else dataset,
                loaded.text_key, loaded.read)


def _unreadable(exc: Exception, where: str, *, missing: str = "no such file", cannot: str = "cannot read it"
                ) -> RunInputError:
    """The one-line usage error for ``exc``, raised reading the records file that the option ``where`` names
    (:func:`~ensembles.data.load_records`): a suffix that names no format, a missing file (``missing`` says so), a
    record the loader refuses, or a file the system cannot read (``cannot``, then why: no permission, an I/O
    error).  In the command line's words, not the Python argument's."""
    if isinstance(exc, UnknownFormatError):
        return RunInputError(f"{where}: cannot tell the format of {exc.name!r} from its suffix: name the file "
                             "*.jsonl, *.json or *.csv")
    if isinstance(exc, FileNotFoundError):
        return RunInputError(f"{where}: {missing}")
    if isinstance(exc, ValueError):
        return RunInputError(f"{where}: {exc}")
    return RunInputError(f"{where}: {cannot}: {exc.strerror or exc}")


def task_from_records(spec: RunSpec, records) -> Task:
    """The task of ``spec`` over records given in memory (dicts the template shows; default template the built-in
    ``instructions``, for Dolly records): for Python callers that hold their records already.  The data's label
    and data set name are ``spec.data`` (a name here, not a file) unless ``spec.dataset`` names the data set."""
    records = tuple(records)
    try:
        template = INSTRUCTIONS if spec.template is None else get_template(spec.template)
    except (OSError, ValueError) as exc:
        raise RunInputError(f"argument --template: {getattr(exc, 'strerror', None) or exc}") from None
    text_key = spec.text_field if spec.text_field in template.fields else template.fields[0]
    return Task(records, template, spec.data, spec.dataset if spec.dataset is not None else spec.data, text_key)


def load_public_examples(spec: RunSpec, task: Task) -> tuple:
    """The records of ``spec.public_examples`` (``()`` without it), read as ``--data`` is read (the same text and
    label fields) and checked against the task's template; with labels, each carries ``"label"`` and only the
    run's labels are kept.  They are public by the user's declaration, shown to the public model only
    (docs/generation.md, "Public examples"), and must not be private records: a record of the file whose shown
    text is also a record of ``task`` is refused (counted, never quoted).  :class:`RunInputError` naming
    ``--public-examples``, before anything is charged."""
    if spec.public_examples is None:
        return ()
    where = f"argument --public-examples {spec.public_examples!r}"
    field = spec.text_field if task.text_key == "text" else task.text_key  # Dolly records: their instruction
    try:
        loaded = load_records(os.path.expanduser(spec.public_examples), text_field=field,
                              label_field=spec.label_field)
    except (ValueError, OSError) as exc:
        raise _unreadable(exc, where) from None
    records = loaded.records
    if task.text_key != "text":
        records = tuple({**{k: v for k, v in r.items() if k != "text"}, task.text_key: r["text"]} for r in records)
    if spec.labels is not None:
        key = loaded.label_key
        records = tuple({**record, "label": record[key]} for record in records if record[key] in spec.labels)
        if not records:
            raise RunInputError(f"{where}: no record has one of the labels {', '.join(spec.labels)}")
    template = task.template
    try:
        template.check_records(records)
    except ValueError as exc:
        raise RunInputError(f"{where}: {exc}") from None
    private = {template.format_example(record) for record in task.records}
    shared = sum(template.format_example(record) in private for record in records)
    if shared:
        raise RunInputError(f"{where}: {shared} of its {len(records)} records are also records of --data; a public "
                            "example must not be a private record")
    return tuple(records)
