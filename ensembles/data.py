"""Data sets and in-context teacher prompts (docs/data.md; docs/generation.md, "Data and prompts").

Two record layouts:

* **records** (any text): a JSON lines, JSON or CSV file whose records have a text field (``text`` by default)
  and optionally a label field.  Each record is loaded as ``{"text": ...}`` or ``{"text": ..., "label": ...}``
  whatever the file calls its fields, and nothing else of the file is kept: the records are exactly what the
  teachers can be shown, so a fingerprint of them (``pate_accountant.ledger_home.dataset_fingerprint``) covers
  what the teachers see and does not depend on the file's format or field names.
* **Dolly** (``instruction``, ``context``, ``response``, ``category``): the paper's natural task (Section 6)
  partitions instructions between teachers and asks each teacher, prompted with its part as few-shot examples,
  to write a *new* instruction.  A Dolly record keeps its four fields, as it always has.

:func:`load_records` reads either (a Dolly file is recognised when no text field name is given and the
records have Dolly's fields instead of ``text``); :func:`fit_records` applies a model's window to the records'
length; :func:`split_by_label` makes the label groups; :func:`teacher_prompts` writes the prompts through a
:class:`~ensembles.templates.PromptTemplate`.  Records are private: no error message or ``repr`` here quotes
a record's contents (field names, line and row numbers and counts only).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field as dataclass_field
from importlib import resources
from pathlib import Path

import numpy as np

from ensembles.templates import BUILTIN_TEMPLATES, INSTRUCTIONS, PromptTemplate
from pate_accountant.validation import check_int, check_regular_file, read_regular_file

__all__ = [
    "BUNDLED_FILES",
    "DEFAULT_HEADER",
    "DEFAULT_TEMPLATE",
    "FIELDS",
    "OPEN_SLOT",
    "FittedRecords",
    "LoadedRecords",
    "RecordsTooLongError",
    "UnknownFormatError",
    "bundled_sample",
    "fit_records",
    "load_bundled",
    "load_dolly_jsonl",
    "load_records",
    "partition_records",
    "Placement",
    "place_records",
    "record_token_limit",
    "split_by_label",
    "teacher_prompts",
]

FIELDS = ("instruction", "context", "response", "category")
DEFAULT_HEADER = INSTRUCTIONS.header
DEFAULT_TEMPLATE = INSTRUCTIONS.example
OPEN_SLOT = INSTRUCTIONS.open_slot
#: The paper keeps Dolly instructions shorter than 256 characters.
DOLLY_MAX_INSTRUCTION_CHARS = 255
#: The data files shipped with the package (``ensembles/data/``), for :func:`load_bundled`.
BUNDLED_FILES = ("dolly_sample.jsonl", "support_sample.csv")
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv"}
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def _json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


# -- rows: (where, object) from each format ----------------------------------------------------------------
def _jsonl_rows(lines, source: str) -> Iterator[tuple[str, dict]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}, line {number}: not valid JSON ({error.msg})") from None
        except RecursionError:
            raise ValueError(f"{source}, line {number}: JSON nested too deeply to read") from None
        if not isinstance(record, dict):
            raise ValueError(f"{source}, line {number}: expected a JSON object, got {_json_type(record)}")
        yield f"{source}, line {number}", record


def _json_array_rows(text: str, source: str) -> Iterator[tuple[str, dict]]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}, line {error.lineno}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to read") from None
    if not isinstance(items, list):
        raise ValueError(f"{source}: expected a JSON array of objects, got {_json_type(items)}")
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise ValueError(f"{source}, record {number}: expected a JSON object, got {_json_type(item)}")
        yield f"{source}, record {number}", item


def _csv_rows(text: str, source: str, used: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header, row_number, line = None, 0, 1
    try:
        for row in reader:
            start, line = line, reader.line_num + 1  # the line this row began on; the next row's first line
            if not row:  # a blank line
                continue
            if header is None:
                header = row
                for name in used:
                    if header.count(name) > 1:
                        raise ValueError(f"{source}: the header names the column {name!r} {header.count(name)} "
                                         "times")
                continue
            row_number += 1
            where = f"{source}, row {row_number} (line {start})"
            if len(row) != len(header):
                raise ValueError(f"{where}: {len(row)} field(s), the header has {len(header)} (is a field with a "
                                 "comma or a line break left unquoted?)")
            yield where, dict(zip(header, row))
    except csv.Error as error:
        raise ValueError(f"{source}, line {reader.line_num}: not valid CSV ({error})") from None


def _decode(data: bytes, source: str) -> str:
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ValueError(f"{source}, line {line}: not UTF-8 text (save the file as UTF-8)") from None


class UnknownFormatError(ValueError):
    """A data file whose suffix names no format (:func:`load_records`); ``name`` is the file's name."""

    def __init__(self, message: str, *, name: str):
        super().__init__(message)
        self.name = name


def _format_of(path: Path, format: str | None) -> str:
    if format is not None:
        if format not in ("jsonl", "json", "csv"):
            raise ValueError(f"format must be 'jsonl', 'json' or 'csv', got {format!r}")
        return format
    found = _FORMATS.get(path.suffix.lower())
    if found is None:
        raise UnknownFormatError(f"format: cannot tell the format of {path.name!r} from its suffix (.jsonl, .json or "
                                 ".csv); give format='jsonl', 'json' or 'csv'", name=path.name)
    return found


# -- Dolly records -------------------------------------------------------------------------------------------
def _dolly_record(record: dict, where: str) -> dict:
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    bad = [f for f in FIELDS if not isinstance(record[f], str)]
    if bad:
        raise ValueError(f"{where}: field(s) {', '.join(bad)} must be strings")
    return {f: record[f] for f in FIELDS}


def _parse_lines(lines, source: str, *, no_context: bool, max_instruction_chars: int | None) -> list[dict]:
    records = []
    for where, raw in _jsonl_rows(lines, source):
        record = _dolly_record(raw, where)
        if not record["instruction"].strip():
            raise ValueError(f"{where}: empty instruction")
        if no_context and record["context"].strip():
            continue
        if max_instruction_chars is not None and len(record["instruction"]) > max_instruction_chars:
            continue
        records.append(record)
    return records


def load_dolly_jsonl(path, *, no_context: bool = True, max_instruction_chars: int | None = 255) -> list[dict]:
    """Read Dolly-format JSON lines; keep records without context (``no_context``) whose instruction has at
    most ``max_instruction_chars`` characters (``None``: no limit).  Blank lines are skipped.

    Raises ``FileNotFoundError`` for a missing file, ``ValueError`` naming the line number for bad JSON, a
    non-object line, a missing or non-string field or an empty instruction, and ``ValueError`` when no record
    is left.
    """
    if max_instruction_chars is not None:
        max_instruction_chars = check_int("max_instruction_chars", max_instruction_chars, minimum=1)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path}")
    with path.open(encoding="utf-8") as handle:
        records = _parse_lines(handle, str(path), no_context=no_context, max_instruction_chars=max_instruction_chars)
    if not records:
        raise ValueError(f"{path}: no records left (empty file, or all filtered out)")
    return records


def bundled_sample(*, no_context: bool = True, max_instruction_chars: int | None = 255) -> list[dict]:
    """The small invented Dolly-format sample shipped with the package (``ensembles/data/dolly_sample.jsonl``)."""
    resource = resources.files("ensembles").joinpath("data", "dolly_sample.jsonl")
    text = resource.read_text(encoding="utf-8")
    records = _parse_lines(text.splitlines(), "dolly_sample.jsonl", no_context=no_context,
                           max_instruction_chars=max_instruction_chars)
    if not records:
        raise ValueError("dolly_sample.jsonl: no records left after filtering")
    return records


# -- any records ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedRecords:
    """A loaded data set: its records and counts about them, never their text (``repr`` leaves the records out).

    * ``records``: a tuple of dicts.  Layout ``"records"``: ``{"text": ...}``, plus ``"label"`` when a label
      field was asked for.  Layout ``"dolly"``: Dolly's four fields.
    * ``source``: the file's path as given (or a bundled file's name); ``format``: ``"jsonl"``, ``"json"`` or
      ``"csv"``; ``layout``: ``"records"`` or ``"dolly"``.
    * ``text_key``: the record key of the text (``"text"``, or ``"instruction"`` for Dolly); ``label_key``:
      the record key of the label (``"label"``, a Dolly field) or ``None``.
    * ``read``: records in the file (blank lines not counted); ``skipped_empty``: records skipped because their
      text was empty or blank; ``skipped_dolly``: Dolly records left out as the paper leaves them out (with a
      context, or an instruction of 256 characters or more); ``read == len(records) + skipped_empty +
      skipped_dolly``.
    * ``label_counts``: ``((label, count), ...)`` sorted by label; empty without a label field.

    The counts are for the data's owner (they are not differentially private): print them to the user, keep
    them out of the shareable ledger.  Iterating over it, or ``len``, goes over ``records``.
    """

    records: tuple = dataclass_field(repr=False)
    source: str
    format: str
    layout: str
    text_key: str
    label_key: str | None
    read: int
    skipped_empty: int
    skipped_dolly: int = 0
    label_counts: tuple = ()

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def fields(self) -> tuple[str, ...]:
        """The keys of every record (what a template's example may show)."""
        if self.layout == "dolly":
            return FIELDS
        return ("text", "label") if self.label_key else ("text",)

    @property
    def default_template(self) -> PromptTemplate:
        """The built-in template that fits the layout: ``instructions`` for Dolly, ``records`` otherwise."""
        return BUILTIN_TEMPLATES["instructions" if self.layout == "dolly" else "records"]

    def summary(self) -> str:
        """One line of counts, e.g. ``30 records from support_sample.csv (30 read, 0 empty skipped); labels:
        account 10, billing 10, shipping 10``."""
        line = f"{len(self.records)} records from {Path(self.source).name} ({self.read} read, " \
               f"{self.skipped_empty} empty skipped"
        if self.layout == "dolly":
            line += f", {self.skipped_dolly} Dolly records with a context or a long instruction left out"
        line += ")"
        if self.label_counts:
            line += "; labels: " + ", ".join(f"{label} {count}" for label, count in self.label_counts)
        return line


def _text_value(record: dict, name: str, where: str, noun: str) -> str:
    if name not in record:
        raise ValueError(f"{where}: no {noun} {name!r}")
    value = record[name]
    if not isinstance(value, str):
        raise ValueError(f"{where}: {noun} {name!r} must be a string, got {_json_type(value)}")
    return value


def _load_text(text: str, source: str, fmt: str, *, text_field: str, label_field: str | None,
               on_empty: str) -> LoadedRecords:
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"text_field must be a non-empty field name, got {text_field!r}")
    if label_field is not None and (not isinstance(label_field, str) or not label_field):
        raise ValueError(f"label_field must be a non-empty field name or None, got {label_field!r}")
    if label_field == text_field:
        raise ValueError(f"label_field {label_field!r} is the text field too; the label must be another field")
    if on_empty not in ("skip", "refuse"):
        raise ValueError(f"on_empty must be 'skip' or 'refuse', got {on_empty!r}")
    used = (text_field,) + ((label_field,) if label_field else ()) + FIELDS
    if fmt == "csv":
        rows = _csv_rows(text, source, used)
    elif fmt == "json" and text.lstrip().startswith("["):
        rows = _json_array_rows(text, source)
    else:
        rows = _jsonl_rows(text.split("\n"), source)

    noun = "column" if fmt == "csv" else "field"
    records, read, empty, dolly_skipped, layout = [], 0, 0, 0, None
    for where, raw in rows:
        read += 1
        if layout is None:  # decided by the first record (a CSV's first row has the header's names)
            dolly = text_field == "text" and "text" not in raw and all(f in raw for f in FIELDS)
            layout = "dolly" if dolly else "records"
            if dolly and label_field is not None and label_field not in FIELDS:
                raise ValueError(f"label_field {label_field!r}: a Dolly record's fields are {', '.join(FIELDS)}")
            if fmt == "csv" and not dolly:  # every row has the header's columns: name what the header lacks
                for name in (text_field, label_field):
                    if name is not None and name not in raw:
                        raise ValueError(f"{source}: the header has no column {name!r}")
        if layout == "dolly":
            record = _dolly_record(raw, where)
            text_value, label = record["instruction"], record[label_field] if label_field else None
        else:
            text_value = _text_value(raw, text_field, where, noun)
            label = _text_value(raw, label_field, where, noun) if label_field else None
            record = {"text": text_value} if label is None else {"text": text_value, "label": label}
        if not text_value.strip():
            if on_empty == "refuse":
                raise ValueError(f"{where}: the text ({noun} {'instruction' if layout == 'dolly' else text_field!r}) "
                                 "is empty (on_empty='skip' skips such records)")
            empty += 1
            continue
        if layout == "dolly" and (record["context"].strip()
                                  or len(record["instruction"]) > DOLLY_MAX_INSTRUCTION_CHARS):
            dolly_skipped += 1
            continue
        if label is not None and not label.strip():
            raise ValueError(f"{where}: the label ({noun} {label_field!r}) is empty")
        records.append(record)
    if not records:
        if not read:
            raise ValueError(f"{source}: no records in the file")
        dolly_note = (f", {dolly_skipped} Dolly records with a context or a long instruction"
                      if layout == "dolly" else "")
        raise ValueError(f"{source}: no records left ({read} read, {empty} with empty text{dolly_note})")
    text_key = "instruction" if layout == "dolly" else "text"
    label_key = None if label_field is None else (label_field if layout == "dolly" else "label")
    counts = tuple(sorted(Counter(r[label_key] for r in records).items())) if label_key else ()
    return LoadedRecords(records=tuple(records), source=source, format=fmt, layout=layout, text_key=text_key,
                         label_key=label_key, read=read, skipped_empty=empty, skipped_dolly=dolly_skipped,
                         label_counts=counts)


def load_records(path, *, text_field: str = "text", label_field: str | None = None, format: str | None = None,
                 on_empty: str = "skip") -> LoadedRecords:
    """Read a data set: JSON lines (``.jsonl``), JSON (``.json``: an array of objects, or JSON lines) or CSV
    (``.csv``, comma-separated, a header row first, fields with commas, quotes or line breaks in double
    quotes); ``format=`` overrides the suffix.  UTF-8, a byte-order mark tolerated.

    Each record's ``text_field`` (a string) becomes ``"text"`` and, when ``label_field`` is given, that field
    (a non-empty string) becomes ``"label"``; other fields are dropped.  A record whose text is empty or blank
    is skipped and counted (``on_empty="skip"``) or refused (``"refuse"``).  With ``text_field`` left at
    ``"text"``, a file whose first record has no ``text`` but Dolly's four fields is read as Dolly records, as
    :func:`load_dolly_jsonl` reads them (records without a context and with instructions of at most 255
    characters; ``label_field`` may then name one of Dolly's fields, e.g. ``"category"``).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the line (JSON lines), record
    (JSON array) or row and line (CSV) and the field for: bad JSON or CSV, a record that is not an object, a
    missing or non-string field, an empty label, a row with the wrong number of fields, text that is not
    UTF-8, and no record left.  Messages never contain a record's contents.
    """
    path = Path(path)
    check_regular_file(path, "data file")  # a folder, a device or a pipe: said so, before its suffix is read
    fmt = _format_of(path, format)
    text = _decode(read_regular_file(path, "data file", max_bytes=None), str(path))
    return _load_text(text, str(path), fmt, text_field=text_field, label_field=label_field, on_empty=on_empty)


def load_bundled(name: str = "dolly_sample.jsonl", *, text_field: str = "text", label_field: str | None = None,
                 on_empty: str = "skip") -> LoadedRecords:
    """A data file shipped with the package (:data:`BUNDLED_FILES`), read as :func:`load_records` reads a file:
    ``"dolly_sample.jsonl"`` (invented Dolly records; the same records as :func:`bundled_sample`) or
    ``"support_sample.csv"`` (30 invented customer-support messages with a ``label`` column)."""
    if name not in BUNDLED_FILES:
        raise ValueError(f"name must be one of {', '.join(BUNDLED_FILES)}, got {name!r}")
    data = resources.files("ensembles").joinpath("data", name).read_bytes()
    return _load_text(_decode(data, name), name, _FORMATS[Path(name).suffix], text_field=text_field,
                      label_field=label_field, on_empty=on_empty)


# -- length ---------------------------------------------------------------------------------------------------
class RecordsTooLongError(ValueError):
    """Records longer than the limit, with ``on_long="refuse"``: ``count`` of ``total`` records exceed
    ``limit`` (a phrase such as ``"200 tokens"``)."""

    def __init__(self, message: str, *, count: int, total: int, limit: str):
        super().__init__(message)
        self.count, self.total, self.limit = count, total, limit


@dataclass(frozen=True)
class FittedRecords:
    """Records after :func:`fit_records`: ``records`` (``repr`` leaves them out), ``total`` (records given),
    ``too_long`` (records over the limit), ``truncated`` and ``skipped`` (what was done to them), the limits,
    and the keys ``text_key``/``label_key`` carried over from a :class:`LoadedRecords`."""

    records: tuple = dataclass_field(repr=False)
    total: int
    too_long: int
    truncated: int
    skipped: int
    on_long: str
    max_tokens: int | None
    max_chars: int | None
    text_key: str = "text"
    label_key: str | None = None

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def summary(self) -> str:
        """One line, e.g. ``3 of 30 records longer than 200 tokens: truncated``."""
        if not self.too_long:
            return f"no record of {self.total} is longer than {_limit_phrase(self.max_tokens, self.max_chars)}"
        done = "truncated" if self.truncated else "skipped"
        return f"{self.too_long} of {self.total} records longer than " \
               f"{_limit_phrase(self.max_tokens, self.max_chars)}: {done}"


def _limit_phrase(max_tokens, max_chars) -> str:
    parts = ([f"{max_tokens} tokens"] if max_tokens is not None else []) + \
            ([f"{max_chars} characters"] if max_chars is not None else [])
    return " or ".join(parts)


def _token_prefix(text: str, max_tokens: int, count_tokens) -> str:
    """The longest prefix of ``text`` (cut between characters) that ``count_tokens`` puts at ``max_tokens`` or
    fewer, by bisection; every prefix returned has been counted."""
    good, bad = 0, len(text)  # text[:good] fits (the empty prefix), text[:bad] does not
    while bad - good > 1:
        middle = (good + bad) // 2
        if count_tokens(text[:middle]) <= max_tokens:
            good = middle
        else:
            bad = middle
    return text[:good]


def fit_records(records, *, max_tokens: int | None = None, count_tokens: Callable[[str], int] | None = None,
                max_chars: int | None = None, on_long: str = "refuse",
                truncate: Callable[[str, int], str] | None = None, field: str | None = None,
                keep_places: bool = False) -> FittedRecords:
    """Apply a length limit to each record's text (``field``: a :class:`LoadedRecords`' ``text_key``, else
    ``"text"``): at most ``max_tokens`` tokens as ``count_tokens(text) -> int`` counts them, and/or at most
    ``max_chars`` characters.  Records over a limit are, by ``on_long``:

    * ``"refuse"``: :class:`RecordsTooLongError` (a ``ValueError``), one line with their count, never a text;
    * ``"truncate"``: cut to the limit.  Characters: the first ``max_chars``.  Tokens: ``truncate(text,
      max_tokens)`` when given (its result is counted again and must fit), else the longest prefix of the text,
      cut between characters, that ``count_tokens`` puts within ``max_tokens`` (found by bisection, so a cut
      may fall inside a word).  Whitespace at the end of a cut is removed; other fields are kept.
    * ``"skip"``: left out; with ``keep_places``, its place holds ``None`` instead, so that every other record
      keeps its position (a partition by position, :func:`partition_records`, then gives each teacher the same
      records as before minus the skipped ones: replacing one record still changes one teacher's prompt only).

    Returns a :class:`FittedRecords` with the counts.  ``ValueError`` when nothing is left or a truncation
    keeps no visible text; every message names the parameter and gives counts only.
    """
    if on_long not in ("refuse", "truncate", "skip"):
        raise ValueError(f"on_long must be 'refuse', 'truncate' or 'skip', got {on_long!r}")
    if max_tokens is None and max_chars is None:
        raise ValueError("fit_records needs a limit: max_tokens (with count_tokens) or max_chars")
    if max_tokens is not None:
        max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        if not callable(count_tokens):
            raise TypeError(f"count_tokens must be a callable text -> int when max_tokens is given, got "
                            f"{type(count_tokens).__name__}")
    if max_chars is not None:
        max_chars = check_int("max_chars", max_chars, minimum=1)
    if truncate is not None and (not callable(truncate) or max_tokens is None):
        raise TypeError("truncate must be a callable (text, max_tokens) -> text, and needs max_tokens")
    text_key = getattr(records, "text_key", "text")
    label_key = getattr(records, "label_key", None)
    field = text_key if field is None else field
    records = list(records)
    limit = _limit_phrase(max_tokens, max_chars)

    def fits(text: str) -> bool:
        return (max_chars is None or len(text) <= max_chars) and \
            (max_tokens is None or count_tokens(text) <= max_tokens)

    kept, too_long, blank = [], 0, 0
    for position, record in enumerate(records, start=1):
        if field not in record or not isinstance(record[field], str):
            raise ValueError(f"field: record {position} has no string field {field!r}")
        text = record[field]
        if fits(text):
            kept.append(record)
            continue
        too_long += 1
        if on_long == "truncate":
            cut = text[:max_chars] if max_chars is not None else text
            if max_tokens is not None and count_tokens(cut) > max_tokens:
                cut = truncate(cut, max_tokens) if truncate is not None else _token_prefix(cut, max_tokens,
                                                                                            count_tokens)
                if not isinstance(cut, str) or count_tokens(cut) > max_tokens:
                    raise ValueError(f"truncate: its result for record {position} is not a text of at most "
                                     f"{max_tokens} tokens")
            cut = cut.rstrip()
            if not cut:
                blank += 1
                continue
            kept.append({**record, field: cut})
        elif keep_places:  # skipped, its place kept
            kept.append(None)
    if on_long == "refuse" and too_long:
        raise RecordsTooLongError(
            f"{too_long} of {len(records)} records are longer than {limit} (on_long='refuse'); truncate or "
            "skip them (on_long='truncate' or 'skip'), or allow longer records",
            count=too_long, total=len(records), limit=limit)
    if blank:
        raise ValueError(f"max_tokens/max_chars: truncating to {limit} leaves no visible text of {blank} "
                         "record(s); allow longer records")
    if not any(record is not None for record in kept):
        raise ValueError(f"on_long='skip': all {len(records)} records are longer than {limit}; nothing is left")
    return FittedRecords(records=tuple(kept), total=len(records), too_long=too_long,
                         truncated=too_long if on_long == "truncate" else 0,
                         skipped=too_long if on_long == "skip" else 0, on_long=on_long, max_tokens=max_tokens,
                         max_chars=max_chars, text_key=text_key, label_key=label_key)


def record_token_limit(template: PromptTemplate, *, window: int, records_per_teacher: int, max_new_tokens: int,
                       count_tokens: Callable[[str], int]) -> int:
    """The most tokens one record may have so that a teacher's whole context fits ``window`` tokens: the header,
    ``records_per_teacher`` examples (the largest part: ``ceil(records / teachers)``), the open slot and
    ``max_new_tokens`` generated tokens.  Each example costs its record's tokens plus the example's own text
    (counted with every field empty) plus one token of margin for the joins.  Other fields an example shows
    (a label) count as empty here, and tokens of joined strings may differ slightly from the sum of their
    parts, so the run's check of the whole prompts stays the final word; this limit is for
    :func:`fit_records`.  ``ValueError`` (naming ``window``) when not even one token per record is left."""
    if not isinstance(template, PromptTemplate):
        raise TypeError(f"template must be a PromptTemplate, got {type(template).__name__}")
    window = check_int("window", window, minimum=1)
    per_teacher = check_int("records_per_teacher", records_per_teacher, minimum=1)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    fixed = count_tokens(template.header) + count_tokens(template.open_slot) + max_new_tokens
    overhead = count_tokens(template.example.format(**dict.fromkeys(template.fields, ""))) + 1
    limit = (window - fixed - per_teacher * overhead) // per_teacher
    if limit < 1:
        raise ValueError(f"window {window}: no room for {per_teacher} records per teacher after the template "
                         f"({fixed - max_new_tokens} tokens, {overhead} per example) and {max_new_tokens} new "
                         "tokens; use more teachers or a shorter template")
    return limit


# -- groups, partitions, prompts -----------------------------------------------------------------------------
def split_by_label(records, *, key: str | None = None, labels=None) -> dict[str, list[dict]]:
    """The records grouped by label, ``{label: [records]}`` with the labels in sorted order (each group keeps
    the records' order).  ``key``: the label's record key (default: a :class:`LoadedRecords`' or
    :class:`FittedRecords`' ``label_key``, else ``"label"``).

    ``labels``: the labels to generate for, known before the data are seen.  The set of labels found in the
    records depends on the records (one record can add a label, and with it a group), so a private run should
    give it: every listed label gets a group (an empty list when no record has it) and a record with a label
    outside the list is refused (counted, never named).  Without ``labels``, the labels found are used.
    """
    if key is None:
        key = records.label_key if hasattr(records, "label_key") else "label"
        if key is None:
            raise ValueError("key: these records have no label; load them with label_field=NAME")
    records = list(records)
    if labels is not None:
        if isinstance(labels, str):
            raise TypeError("labels must be a collection of label strings, not one string")
        labels = list(labels)
        bad = [label for label in labels if not isinstance(label, str) or not label.strip()]
        if bad or not labels:
            raise ValueError(f"labels must be non-empty strings, at least one, got {labels!r}")
    groups: dict[str, list[dict]] = {}
    for position, record in enumerate(records, start=1):
        if key not in record or not isinstance(record[key], str):
            raise ValueError(f"key: record {position} has no string field {key!r}")
        groups.setdefault(record[key], []).append(record)
    if labels is not None:
        outside = sum(len(group) for label, group in groups.items() if label not in labels)
        if outside:
            raise ValueError(f"labels: {outside} record(s) have a label outside the {len(set(labels))} labels given")
        for label in labels:
            groups.setdefault(label, [])
    return {label: groups[label] for label in sorted(groups)}


def partition_records(records, num_teachers: int, rng: np.random.Generator) -> list[list[dict]]:
    """Randomly partition ``records`` into ``num_teachers`` disjoint, non-empty parts of near-equal size."""
    num_teachers = check_int("num_teachers", num_teachers, minimum=1)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy Generator")
    records = list(records)
    if not records:
        raise ValueError("records is empty: nothing to partition")
    if num_teachers > len(records):
        raise ValueError(f"cannot give {num_teachers} teachers a record each: only {len(records)} records")
    order = rng.permutation(len(records))
    return [[records[i] for i in part] for part in np.array_split(order, num_teachers)]


@dataclass(frozen=True)
class Placement:
    """Where :func:`place_records` put the records: ``parts[t]`` the records teacher ``t`` shows, in the order of
    its slots (``repr`` leaves them out); ``records_per_teacher`` its slots; ``dropped`` the records left out
    because every slot was taken (counts describe the data: the operator's screen only, never the ledger)."""

    parts: tuple = dataclass_field(repr=False)
    records_per_teacher: int
    dropped: int

    @property
    def num_teachers(self) -> int:
        return len(self.parts)

    @property
    def placed(self) -> int:
        return sum(len(part) for part in self.parts)


#: The most slots a placement may have (teachers x records per teacher; drawn without listing them all).
MAX_SLOTS = 2 ** 53


def place_records(records, num_teachers: int, records_per_teacher: int, rng: np.random.Generator) -> Placement:
    """Place ``records`` in ``num_teachers * records_per_teacher`` slots, ``records_per_teacher`` slots a teacher:
    a uniformly random set of ``min(n, slots)`` of the ``n`` records, each in its own uniformly random slot, the
    rest left out (counted in :attr:`Placement.dropped`).  Teacher ``t`` holds slots ``t*k .. t*k + k - 1`` and
    shows its records in the order of its slots; a teacher may be left with fewer records, or none.

    Why slots (docs/privacy_unit.md).  The law of the placement is the same whatever order the records come in,
    and it can be built one record at a time (reservoir sampling): a record joins a free slot drawn uniformly, or,
    when every slot is taken, takes a uniformly drawn slot with probability ``slots / (n + 1)`` and is left out
    otherwise.  So the placements of two data sets that differ in one record (added, removed or replaced) can be
    coupled so that **at most one slot, so one teacher, differs**: the other records keep their slots.  A
    partition into near-equal parts of ``ceil(n / teachers)`` records would not do this: adding one record changes
    ``n`` and re-deals every part.  With ``n == slots`` the placement is a uniformly random partition into equal
    parts.  ``records_per_teacher`` must therefore come from public parameters only (never from ``n`` when the
    number of records is private, as it is under add/remove-one).  ``tests/test_privacy_unit.py`` checks the
    coupling exactly on small data sets, the sampler against that exact law, and that a record appended or removed
    last changes one teacher's records, byte for byte, with the same draws.

    ``records`` may hold any objects (``None`` included); ``rng`` is the run's randomness."""
    num_teachers = check_int("num_teachers", num_teachers, minimum=1, maximum=MAX_SLOTS)
    per_teacher = check_int("records_per_teacher", records_per_teacher, minimum=1, maximum=MAX_SLOTS)
    if num_teachers * per_teacher > MAX_SLOTS:
        raise ValueError(f"num_teachers x records_per_teacher must be at most {MAX_SLOTS:,} slots, got "
                         f"{num_teachers:,} x {per_teacher:,}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy Generator")
    records = list(records)
    slots = num_teachers * per_teacher
    # The construction itself, one record at a time in the order given, each with its own draw: a sparse
    # Fisher-Yates shuffle of the slots while some are free (record j takes a uniformly drawn free slot), then
    # reservoir sampling (record j takes slot r when its draw r in [0, j] falls below the number of slots).  So a
    # record appended to the data set, or the last one removed, changes one slot and nothing else even with the
    # same random draws; and no slot is listed, so a large records_per_teacher costs no memory.
    swapped: dict = {}  # the shuffled order of the slots, where it differs from 0, 1, 2, ...
    holder: dict = {}  # slot -> the index of the record in it
    for j in range(len(records)):
        if j < slots:
            r = int(rng.integers(j, slots))
            slot, swapped[r] = swapped.get(r, r), swapped.get(j, j)
            holder[slot] = j
        else:
            r = int(rng.integers(0, j + 1))
            if r < slots:
                holder[r] = j
    placed = len(holder)
    by_teacher: dict = {}
    for slot in sorted(holder):
        by_teacher.setdefault(slot // per_teacher, []).append(records[holder[slot]])
    parts = tuple(tuple(by_teacher.get(t, ())) for t in range(num_teachers))
    return Placement(parts=parts, records_per_teacher=per_teacher, dropped=len(records) - placed)


def teacher_prompts(parts, template: PromptTemplate | str = DEFAULT_TEMPLATE, shared_prefix: str | None = None,
                    open_slot: str | None = None, *, allow_empty: bool = False) -> tuple[str, list[str]]:
    """Few-shot in-context prompts: ``(shared_prefix, prompts)`` where teacher ``i``'s prompt lists its part's
    records as examples and ends with the open slot (the place for the new record).  The full context of
    teacher ``i`` is ``shared_prefix + prompts[i]``.

    ``template`` is a :class:`~ensembles.templates.PromptTemplate` (its header is the shared prefix, its open
    slot ends each prompt, each record is shown by ``template.format_example``; ``shared_prefix`` and
    ``open_slot`` must then be left out), or, as before templates existed, a ``str.format`` string of one
    record, with ``shared_prefix`` (default :data:`DEFAULT_HEADER`) and ``open_slot`` (default
    :data:`OPEN_SLOT`); that form shows the fields as they are.  The built-in ``instructions`` template gives
    today's prompts byte for byte on records without line breaks.  ``allow_empty``: a part may be empty (its
    teacher sees the header and the open slot only; records skipped for their length leave such parts)."""
    parts = list(parts)
    if not parts:
        raise ValueError("parts is empty")
    for i, part in enumerate(parts):
        if not part and not allow_empty:
            raise ValueError(f"part {i} is empty")
    if isinstance(template, PromptTemplate):
        if shared_prefix is not None or open_slot is not None:
            raise TypeError("shared_prefix and open_slot come from the PromptTemplate (its header and open_slot); "
                            "leave them out")
        template.check_records(record for part in parts for record in part)
        return template.header, ["".join(map(template.format_example, part)) + template.open_slot for part in parts]
    if not isinstance(template, str):
        raise TypeError(f"template must be a PromptTemplate or a format string, got {type(template).__name__}")
    shared_prefix = DEFAULT_HEADER if shared_prefix is None else shared_prefix
    open_slot = OPEN_SLOT if open_slot is None else open_slot
    prompts = []
    for part in parts:
        try:
            examples = "".join(template.format(**record) for record in part)
        except KeyError as error:
            raise ValueError(f"template names a field {error.args[0]!r} that the records lack") from None
        prompts.append(examples + open_slot)
    return shared_prefix, prompts
