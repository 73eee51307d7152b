"""Prompt templates: the task, in the user's words (docs/data.md, "Templates").

A teacher's context is ``header + example(record_1) + ... + example(record_k) + open_slot`` and the model
writes a new record in the open slot until it produces the template's ``stop`` string.  The header and the
open slot are the same for every teacher and hold no record; the examples hold the teacher's own records.

The header and the open slot may name the run's label as ``{label}`` (their only field): in a run per label each
label's teachers and its public model see the label written there (:meth:`PromptTemplate.for_label`); a run
without labels refuses such a template.

A template file is TOML with four keys::

    header = "Here are messages that customers sent to a support team. Write one new message.\\n\\n"
    example = "Message: {text}\\n"   # how one record is shown: str.format fields of the record
    open_slot = "Message:"          # where the new record goes
    stop = "\\n"                     # optional (default a line break): what ends a record

How a record is shown (:meth:`PromptTemplate.show`): with a line-break stop every record is shown on one line
(each run of line breaks, with the whitespace around it, becomes one space), so the model sees records that end
where generation will stop; with another stop (say ``"\\n###"``) records keep their line breaks (``\\r\\n`` and
``\\r`` become ``\\n``) and a record that holds the stop string itself is refused, because it would end early.

Errors never quote a record: a template is the user's own text and may be named, a record may not.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, fields as dataclass_fields
from pathlib import Path

from pate_accountant.validation import read_regular_file

__all__ = [
    "BUILTIN_TEMPLATES",
    "INSTRUCTIONS",
    "LABELLED_RECORDS",
    "LABEL_FIELD",
    "RECORDS",
    "PromptTemplate",
    "TemplateError",
    "get_template",
    "load_template",
]

#: The one field a template's header and open slot may hold: the run's label (a public word of the task).
LABEL_FIELD = "{label}"
#: Every character Python's ``str.splitlines`` treats as a line boundary.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK_RUN = re.compile(rf"\s*[{_LINE_BREAKS}]\s*")
_KEYS = ("header", "example", "open_slot", "stop")
_REQUIRED = ("header", "example", "open_slot")


class TemplateError(ValueError):
    """A template that cannot be used: the message is one line naming the template and the key."""


def _parse(name: str, key: str, text: str) -> list[str]:
    """The plain field names of ``text`` as a ``str.format`` string, in order (repeats kept)."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as error:
        raise TemplateError(f"template {name!r}: {key} is not a valid format string ({error}; write a "
                            "literal brace as {{ or }})") from None
    found = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise TemplateError(f"template {name!r}: {key} has the field {{{field}}}; a field is a record's "
                                "field name, such as {text}")
        if spec or conversion:
            raise TemplateError(f"template {name!r}: {key} has a conversion or format spec on {{{field}}}; "
                                "write the plain field")
        found.append(field)
    return found


def _tail(text: str) -> str:
    """The literal text of ``text`` (a format string) after its last field, ``{{`` and ``}}`` undone."""
    tail = ""
    for literal, field, _spec, _conversion in string.Formatter().parse(text):
        tail = "" if field is not None else tail + literal
    return tail


def _toml_string(value: str) -> str:
    # JSON's escapes (\n \t \" \\ \uXXXX for control characters) are TOML basic-string escapes too; DEL must be
    # escaped in TOML but not in JSON
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


@dataclass(frozen=True)
class PromptTemplate:
    """How a teacher's prompt is written from its records.

    * ``header``: the shared prefix, the same for every teacher (of a label): what the records are and what to
      write.  It holds no record, so its one possible format field is ``{label}`` (the run's label,
      :meth:`for_label`); no other brace.
    * ``example``: how one record is shown, a ``str.format`` string of the record's fields (``{text}``,
      ``{label}``, or Dolly's ``{instruction}``, ``{context}``, ``{response}``, ``{category}``); plain field
      names only, at least one; ``{{`` and ``}}`` are literal braces.  The literal text after the last field
      must contain ``stop``, so that every record shown ends the way a generated one will.
    * ``open_slot``: the place for the new record, after the teacher's examples (no braces but ``{label}``).
    * ``stop``: the string that ends a generated record (the run's stop string); a line break by default.
    * ``name``: a label for messages and run metadata (a built-in's name, or the file's stem).

    Raises :class:`TemplateError` (a ``ValueError``) with one line naming the key.
    """

    header: str
    example: str
    open_slot: str
    stop: str = "\n"
    name: str = "custom"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TemplateError(f"template name must be a non-empty string, got {self.name!r}")
        for key in _KEYS:
            value = getattr(self, key)
            if not isinstance(value, str):
                raise TemplateError(f"template {self.name!r}: {key} must be a string, got {type(value).__name__}")
        for key in ("header", "open_slot"):
            value = getattr(self, key)
            bare = value.replace(LABEL_FIELD, "")
            if "{" in bare or "}" in bare:
                fields = [f for _l, f, _s, _c in _safe_parse(value) if f and f != "label"]
                what = f"the format field {{{fields[0]}}}" if fields else "a brace"
                raise TemplateError(f"template {self.name!r}: {key} holds {what}; the {key.replace('_', ' ')} is "
                                    "shown as written, the same for every teacher, and holds no record (its one "
                                    "field is {label}, the run's label)")
        if not self.open_slot.strip():
            raise TemplateError(f"template {self.name!r}: open_slot is empty; it marks where the new record goes")
        if not self.stop:
            raise TemplateError(f"template {self.name!r}: stop is empty; it is the string that ends a record")
        if not _parse(self.name, "example", self.example):
            raise TemplateError(f"template {self.name!r}: example has no field; it shows one record, e.g. "
                                "'Record: {text}\\n'")
        if self.stop not in _tail(self.example):
            raise TemplateError(f"template {self.name!r}: stop {self.stop!r} does not follow the last field of "
                                "example, so the examples would not show the model where a record ends "
                                f"(e.g. end example with {self.stop!r})")

    # -- the label -----------------------------------------------------------------------------------------
    @property
    def names_label(self) -> bool:
        """Whether the header or the open slot names the run's label (``{label}``): such a template is for runs
        per label (``--label-field``, ``--labels``), and each label's teachers and public model see it filled."""
        return LABEL_FIELD in self.header or LABEL_FIELD in self.open_slot

    def for_label(self, label: str) -> PromptTemplate:
        """This template with ``{label}`` in the header and the open slot replaced by ``label`` (one of the
        run's labels, public: the user names them with ``--labels``); itself when it does not name the label.
        A label holding a brace is refused (``TemplateError``)."""
        if not self.names_label:
            return self
        if "{" in label or "}" in label:
            raise TemplateError(f"template {self.name!r} names the label, and the label {label!r} holds a brace")
        return PromptTemplate(header=self.header.replace(LABEL_FIELD, label), example=self.example,
                              open_slot=self.open_slot.replace(LABEL_FIELD, label), stop=self.stop, name=self.name)

    # -- fields and records ------------------------------------------------------------------------------
    @property
    def fields(self) -> tuple[str, ...]:
        """The record fields ``example`` shows, each once, in order of first use."""
        return tuple(dict.fromkeys(_parse(self.name, "example", self.example)))

    @property
    def multiline(self) -> bool:
        """Whether records keep their line breaks (``stop`` is not a single line break)."""
        return self.stop not in ("\n", "\r\n")

    def check_fields(self, available) -> None:
        """Refuse (``TemplateError``) when ``example`` names a field not in ``available`` (field names)."""
        available = tuple(available)
        for field in self.fields:
            if field not in available:
                raise TemplateError(f"template {self.name!r}: example shows the field {{{field}}}, which the "
                                    f"records do not have (they have: {', '.join(available) or 'no fields'})")

    def show(self, value: str) -> str:
        """How one field's value appears in a prompt (see the module's docstring): unchanged without line
        breaks; with a line-break stop, on one line (each run of line breaks with the whitespace around it
        becomes one space, none at the start or the end); with another stop, ``\r\n`` and ``\r`` as ``\n``."""
        if not any(c in value for c in _LINE_BREAKS):
            return value
        if not self.multiline:
            return " ".join(part for part in _BREAK_RUN.split(value) if part)
        return value.replace("\r\n", "\n").replace("\r", "\n")

    def check_records(self, records) -> None:
        """Check before a run that every record can be shown: it has the fields ``example`` shows (the error
        names the field and the record's position) and, for a multi-line template, no record holds ``stop``
        (the error gives their count).  Never quotes a record."""
        holding = 0
        for position, record in enumerate(records, start=1):
            for field in self.fields:
                if field not in record:
                    raise TemplateError(f"template {self.name!r}: example shows the field {{{field}}}, which "
                                        f"record {position} does not have (it has: {', '.join(map(str, record))})")
                if not isinstance(record[field], str):
                    raise TemplateError(f"template {self.name!r}: record {position}'s field {field!r} is not a "
                                        "string")
            if self.multiline and any(self.stop in self.show(record[f]) for f in self.fields):
                holding += 1
        if holding:
            raise TemplateError(f"template {self.name!r}: {holding} record(s) contain the stop string "
                                f"{self.stop!r} and would end early; choose another stop")

    def format_example(self, record) -> str:
        """One record as ``example`` shows it (fields through :meth:`show`)."""
        return self.example.format(**{field: self.show(record[field]) for field in self.fields})

    # -- files --------------------------------------------------------------------------------------------
    def to_toml(self) -> str:
        """The template as a template file (``load_template`` reads it back equal, up to ``name``)."""
        lines = [f"# prompt template {self.name!r} (docs/data.md)"]
        lines += [f"{key} = {_toml_string(getattr(self, key))}" for key in _KEYS]
        return "\n".join(lines) + "\n"

    def describe(self) -> dict:
        """The template as a plain dict (``name`` and the four keys): data-independent run metadata."""
        return {f.name: getattr(self, f.name) for f in dataclass_fields(self)}


def _safe_parse(text: str):
    try:
        return list(string.Formatter().parse(text))
    except ValueError:
        return []


#: Today's Dolly-instruction prompt (the paper's Section 6 task), byte for byte.
INSTRUCTIONS = PromptTemplate(
    name="instructions",
    header=("Here are examples of instructions that people gave to an assistant. "
            "Write one new instruction of the same kind.\n\n"),
    example="Instruction: {instruction}\n",
    open_slot="Instruction:",
    stop="\n",
)

#: Free text: each record on its own line after a marker; the open slot is the marker.
RECORDS = PromptTemplate(
    name="records",
    header=("Here are examples of records of one kind, each on its own line after \"Record:\". "
            "Write one new record of the same kind.\n\n"),
    example="Record: {text}\n",
    open_slot="Record:",
    stop="\n",
)

#: Free text per label: the header and the open slot name the label, for teachers and the public model alike.
LABELLED_RECORDS = PromptTemplate(
    name="labelled-records",
    header=("Here are examples of records labelled \"{label}\", each on its own line after \"Record:\". "
            "Write one new record labelled \"{label}\".\n\n"),
    example="Record: {text}\n",
    open_slot="Record:",
    stop="\n",
)

BUILTIN_TEMPLATES = {template.name: template for template in (INSTRUCTIONS, RECORDS, LABELLED_RECORDS)}


def _read_toml(path: Path, data: bytes) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise TemplateError(f"template {str(path)!r}: reading a template file needs Python 3.11 or the tomli "
                                "package") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise TemplateError(f"template {str(path)!r}: not valid TOML ({str(error).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise TemplateError(f"template {str(path)!r}: not UTF-8 text") from None


def load_template(path) -> PromptTemplate:
    """Read a template file (TOML: ``header``, ``example``, ``open_slot``, optional ``stop``; module docstring).
    The template's name is the file's stem.  ``FileNotFoundError`` for a missing file; ``TemplateError`` (a
    ``ValueError``, one line naming the file and the key) for bad TOML, a missing, unknown or non-string key,
    and every check of :class:`PromptTemplate`."""
    path = Path(path)
    try:
        data = read_regular_file(path, "template file")
    except ValueError as error:
        raise TemplateError(str(error)) from None
    table = _read_toml(path, data)
    where = f"template {str(path)!r}"
    unknown = [key for key in table if key not in _KEYS]
    if unknown:
        raise TemplateError(f"{where}: unknown key {unknown[0]!r} (the keys are {', '.join(_KEYS)})")
    for key in _REQUIRED:
        if key not in table:
            raise TemplateError(f"{where}: missing key {key!r} (a template needs {', '.join(_REQUIRED)})")
    for key, value in table.items():
        if not isinstance(value, str):
            raise TemplateError(f"{where}: {key} must be a string, got {type(value).__name__}")
    try:
        return PromptTemplate(name=path.stem or "custom", **table)
    except TemplateError as error:  # name the file, not only its stem
        raise TemplateError(str(error).replace(f"template {path.stem!r}", where, 1)) from None


def get_template(spec) -> PromptTemplate:
    """A template from what a user typed: a :class:`PromptTemplate` as is, a built-in's name
    (``"instructions"``, ``"records"``), else a template file's path (``./records`` names a file called
    ``records``)."""
    if isinstance(spec, PromptTemplate):
        return spec
    if isinstance(spec, str) and spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec]
    if not isinstance(spec, (str, Path)):
        raise TypeError(f"template must be a PromptTemplate, a built-in name or a path, got {type(spec).__name__}")
    return load_template(spec)
