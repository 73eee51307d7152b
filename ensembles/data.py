"""Instruction data (Dolly format) and in-context teacher prompts (docs/generation.md, "Data and prompts").

A Dolly record has the fields ``instruction``, ``context``, ``response`` and ``category``.  The paper's
natural task (Section 6) partitions instructions between teachers and asks each teacher, prompted with its
part as few-shot examples, to write a *new* instruction.  Error messages never quote record contents.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np

from pate_accountant.validation import check_int

__all__ = ["DEFAULT_HEADER", "FIELDS", "bundled_sample", "load_dolly_jsonl", "partition_records", "teacher_prompts"]

FIELDS = ("instruction", "context", "response", "category")
DEFAULT_HEADER = (
    "Here are examples of instructions that people gave to an assistant. "
    "Write one new instruction of the same kind.\n\n"
)
DEFAULT_TEMPLATE = "Instruction: {instruction}\n"
OPEN_SLOT = "Instruction:"


def _parse_lines(lines, source: str, *, no_context: bool, max_instruction_chars: int | None) -> list[dict]:
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}, line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{source}, line {number}: expected a JSON object, got {type(record).__name__}")
        missing = [f for f in FIELDS if f not in record]
        if missing:
            raise ValueError(f"{source}, line {number}: missing field(s) {', '.join(missing)}")
        bad = [f for f in FIELDS if not isinstance(record[f], str)]
        if bad:
            raise ValueError(f"{source}, line {number}: field(s) {', '.join(bad)} must be strings")
        if not record["instruction"].strip():
            raise ValueError(f"{source}, line {number}: empty instruction")
        if no_context and record["context"].strip():
            continue
        if max_instruction_chars is not None and len(record["instruction"]) > max_instruction_chars:
            continue
        records.append({f: record[f] for f in FIELDS})
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


def teacher_prompts(parts, template: str = DEFAULT_TEMPLATE, shared_prefix: str = DEFAULT_HEADER,
                    open_slot: str = OPEN_SLOT) -> tuple[str, list[str]]:
    """Few-shot in-context prompts: ``(shared_prefix, prompts)`` where teacher ``i``'s prompt lists its part's
    records through ``template`` (``str.format`` with the record's fields) and ends with ``open_slot`` (the
    place for the new instruction).  The full context of teacher ``i`` is ``shared_prefix + prompts[i]``."""
    parts = list(parts)
    if not parts:
        raise ValueError("parts is empty")
    prompts = []
    for i, part in enumerate(parts):
        if not part:
            raise ValueError(f"part {i} is empty")
        try:
            examples = "".join(template.format(**record) for record in part)
        except KeyError as error:
            raise ValueError(f"template names a field {error.args[0]!r} that the records lack") from None
        prompts.append(examples + open_slot)
    return shared_prefix, prompts
