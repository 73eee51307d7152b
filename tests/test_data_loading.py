"""Data in and the task in the user's words (docs/data.md): loading JSON lines, JSON and CSV records, Dolly
files as before, records too long for a window, prompt templates (built-in and from files) and label groups.
Records are private: every error message and repr is checked never to contain a record's text."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ensembles.data import (
    DEFAULT_HEADER,
    DEFAULT_TEMPLATE,
    OPEN_SLOT,
    FittedRecords,
    RecordsTooLongError,
    bundled_sample,
    fit_records,
    load_bundled,
    load_dolly_jsonl,
    load_records,
    partition_records,
    record_token_limit,
    split_by_label,
    teacher_prompts,
)
from ensembles.templates import (
    BUILTIN_TEMPLATES,
    INSTRUCTIONS,
    RECORDS,
    PromptTemplate,
    TemplateError,
    get_template,
    load_template,
)
from pate_accountant.ledger_home import dataset_fingerprint

ROOT = Path(__file__).resolve().parent.parent
MARKER = "Zebrafinch"  # in every private record below; never in a message
KEY = b"k" * 32


def words(text: str) -> int:
    """A stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _csv(path, header, rows, *, encoding="utf-8", newline="\n"):
    with path.open("w", encoding=encoding, newline="") as handle:
        writer = csv.writer(handle, lineterminator=newline)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# The same records in three formats: commas, quotes, a line break, non-ASCII text, an extra field.
ROWS = [
    {"id": 1, "message": f"{MARKER} says: my order, #12, never came", "topic": "shipping"},
    {"id": 2, "message": f'A "quoted" word from {MARKER}', "topic": "billing"},
    {"id": 3, "message": f"{MARKER} writes over\ntwo lines", "topic": "shipping"},
    {"id": 4, "message": f"Café crème for {MARKER} ☕", "topic": "account"},
]


def _three_formats(tmp_path):
    jsonl = _jsonl(tmp_path / "m.jsonl", ROWS)
    array = tmp_path / "m.json"
    array.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    table = _csv(tmp_path / "m.csv", ["id", "message", "topic"],
                 [[r["id"], r["message"], r["topic"]] for r in ROWS])
    return jsonl, array, table


# -- loading -----------------------------------------------------------------------------------------------
def test_jsonl_json_and_csv_of_the_same_records_load_equally(tmp_path):
    loads = [load_records(p, text_field="message", label_field="topic") for p in _three_formats(tmp_path)]
    expected = tuple({"text": r["message"], "label": r["topic"]} for r in ROWS)  # the id is dropped
    for loaded in loads:
        assert loaded.records == expected
        assert loaded.layout == "records" and loaded.fields == ("text", "label")
        assert (loaded.read, loaded.skipped_empty, loaded.skipped_dolly) == (4, 0, 0)
        assert loaded.label_counts == (("account", 1), ("billing", 1), ("shipping", 2))
        assert loaded.default_template is RECORDS
    assert [loaded.format for loaded in loads] == ["jsonl", "json", "csv"]
    fingerprints = {dataset_fingerprint(loaded.records, key=KEY) for loaded in loads}
    assert len(fingerprints) == 1
    # the fingerprint covers the records' texts, and only those: read without labels they are the same data set
    # (issue 31: a label never makes a record another record)
    plain = load_records(tmp_path / "m.csv", text_field="message")
    assert plain.records == tuple({"text": r["message"]} for r in ROWS)
    assert dataset_fingerprint(plain.records, key=KEY) in fingerprints


_TEXTS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_TEXTS, st.sampled_from(["billing", "shipping"])), min_size=1, max_size=6))
def test_any_texts_load_equally_from_csv_and_json_lines(rows):
    """Commas, quotes, line breaks of every kind, blank texts: a CSV that Python's csv module writes and the same
    records as JSON lines load into the same records, with the same counts."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        jsonl = _jsonl(Path(folder) / "r.jsonl", [{"text": t, "label": label} for t, label in rows])
        table = _csv(Path(folder) / "r.csv", ["text", "label"], rows, newline="\r\n")
        if not any(t.strip() for t, _ in rows):
            for path in (jsonl, table):
                with pytest.raises(ValueError, match="no records left"):
                    load_records(path, label_field="label")
            return
        a, b = (load_records(p, label_field="label") for p in (jsonl, table))
    assert a.records == b.records == tuple({"text": t, "label": label} for t, label in rows if t.strip())
    assert (a.read, a.skipped_empty, a.label_counts) == (b.read, b.skipped_empty, b.label_counts)
    assert a.read == len(rows)


@settings(max_examples=60, deadline=None)
@given(st.text(st.sampled_from("ab \n"), max_size=60), st.integers(1, 6))
def test_a_token_cut_is_the_longest_beginning_that_fits(text, max_tokens):
    records = [{"text": "x " + text}]  # never blank
    fitted = fit_records(records, max_tokens=max_tokens, count_tokens=words, on_long="truncate")
    [cut] = [r["text"] for r in fitted]
    assert records[0]["text"].startswith(cut) and cut == cut.rstrip() or cut == records[0]["text"]
    assert words(cut) == min(max_tokens, words(records[0]["text"]))
    assert fitted.truncated == (words(records[0]["text"]) > max_tokens)


def test_csv_with_a_byte_order_mark_and_windows_line_ends_loads(tmp_path):
    rows = [["first message"], ["second, with a comma"], ["third\r\nover two lines"]]
    path = _csv(tmp_path / "bom.csv", ["text"], rows, encoding="utf-8-sig", newline="\r\n")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    loaded = load_records(path)
    assert [r["text"] for r in loaded] == ["first message", "second, with a comma", "third\r\nover two lines"]
    assert len(loaded) == 3


def test_format_from_the_suffix_or_given(tmp_path):
    path = _jsonl(tmp_path / "records.txt", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ValueError, match=r"format: cannot tell the format of 'records.txt'"):
        load_records(path)
    assert len(load_records(path, format="jsonl")) == 2
    with pytest.raises(ValueError, match=r"format must be 'jsonl', 'json' or 'csv', got 'xml'"):
        load_records(path, format="xml")
    with pytest.raises(FileNotFoundError, match="no such data file"):
        load_records(tmp_path / "missing.jsonl")
    lines_as_json = _jsonl(tmp_path / "lines.json", [{"text": "a"}])  # .json holding JSON lines
    assert load_records(lines_as_json).records == ({"text": "a"},)


def test_empty_texts_are_skipped_and_counted_or_refused(tmp_path):
    path = _jsonl(tmp_path / "e.jsonl", [{"text": "one"}, {"text": "  "}, {"text": ""}, {"text": "two"}])
    loaded = load_records(path)
    assert [r["text"] for r in loaded] == ["one", "two"]
    assert (loaded.read, loaded.skipped_empty) == (4, 2)
    assert "4 read, 2 empty skipped" in loaded.summary()
    with pytest.raises(ValueError, match=r"e.jsonl, line 2: the text \(field 'text'\) is empty"):
        load_records(path, on_empty="refuse")
    with pytest.raises(ValueError, match="on_empty must be 'skip' or 'refuse', got 'drop'"):
        load_records(path, on_empty="drop")
    nothing = _jsonl(tmp_path / "n.jsonl", [{"text": ""}])
    with pytest.raises(ValueError, match=r"no records left \(1 read, 1 with empty text"):
        load_records(nothing)
    header_only = tmp_path / "h.csv"
    header_only.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no records in the file"):
        load_records(header_only)


def test_field_names_are_checked(tmp_path):
    path = _jsonl(tmp_path / "f.jsonl", [{"text": "a", "label": "x"}])
    with pytest.raises(ValueError, match="label_field 'text' is the text field too"):
        load_records(path, label_field="text")
    with pytest.raises(ValueError, match="text_field must be a non-empty field name, got ''"):
        load_records(path, text_field="")


# -- Dolly files, as before ------------------------------------------------------------------------------
def _dolly(instruction, context="", response="r", category="open_qa"):
    return {"instruction": instruction, "context": context, "response": response, "category": category}


def test_a_dolly_file_loads_as_before(tmp_path):
    rows = [_dolly("Name three birds."), _dolly("Summarise this.", context="some context"),
            _dolly("x" * 256), _dolly("Why is the sky blue?", category="general_qa")]
    path = _jsonl(tmp_path / "dolly.jsonl", rows)
    loaded = load_records(path)
    assert loaded.layout == "dolly" and loaded.text_key == "instruction" and loaded.default_template is INSTRUCTIONS
    assert list(loaded.records) == load_dolly_jsonl(path)
    assert (loaded.read, len(loaded), loaded.skipped_dolly) == (4, 2, 2)
    assert dataset_fingerprint(loaded.records, key=KEY) == dataset_fingerprint(load_dolly_jsonl(path), key=KEY)
    by_category = load_records(path, label_field="category")
    assert by_category.label_key == "category"
    assert by_category.label_counts == (("general_qa", 1), ("open_qa", 1))
    with pytest.raises(ValueError, match="label_field 'topic': a Dolly record's fields are"):
        load_records(path, label_field="topic")
    # naming the instruction as the text field reads plain records instead
    as_text = load_records(path, text_field="instruction")
    assert as_text.layout == "records" and len(as_text) == 4 and set(as_text.fields) == {"text"}


def test_the_bundled_dolly_sample_loads_as_before():
    loaded = load_bundled()
    assert list(loaded.records) == bundled_sample()
    assert (loaded.read, len(loaded), loaded.skipped_dolly) == (210, 201, 9)
    with pytest.raises(ValueError, match="name must be one of"):
        load_bundled("other.jsonl")


def test_the_support_sample_loads():
    loaded = load_bundled("support_sample.csv", label_field="label")
    assert len(loaded) == 30 and loaded.read == 30 and loaded.layout == "records"
    assert loaded.label_counts == (("account", 10), ("billing", 10), ("shipping", 10))
    texts = [r["text"] for r in loaded]
    assert len(set(texts)) == 30
    assert all("\n" not in t and 20 <= len(t) <= 120 for t in texts)
    # the file on disk reads the same through load_records
    assert load_records(ROOT / "ensembles" / "data" / "support_sample.csv", label_field="label") \
        .records == loaded.records


# -- errors name where and which field, never the text -----------------------------------------------------
def _bad_inputs(tmp_path):
    """(call, expected message pattern) for each kind of bad input; every record holds MARKER."""
    good = {"text": f"{MARKER} is fine", "label": "billing"}
    cases = []

    def jsonl(name, lines, **kwargs):
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return lambda: load_records(path, **kwargs)

    def raw(name, data: bytes, **kwargs):
        path = tmp_path / name
        path.write_bytes(data)
        return lambda: load_records(path, **kwargs)

    dump = json.dumps
    cases.append((jsonl("a.jsonl", [dump(good), dump({"body": MARKER})]), r"a.jsonl, line 2: no field 'text'"))
    cases.append((jsonl("b.jsonl", [dump(good), dump({"text": [MARKER]})]),
                  r"b.jsonl, line 2: field 'text' must be a string, got an array"))
    cases.append((jsonl("c.jsonl", [dump(good), dump({"text": MARKER, "label": 7})], label_field="label"),
                  r"c.jsonl, line 2: field 'label' must be a string, got a number"))
    cases.append((jsonl("d.jsonl", [dump({"text": MARKER, "label": " "})], label_field="label"),
                  r"d.jsonl, line 1: the label \(field 'label'\) is empty"))
    cases.append((jsonl("e.jsonl", [dump(good), "", '{"text": "' + MARKER + '",}']),
                  r"e.jsonl, line 3: not valid JSON"))
    cases.append((jsonl("f.jsonl", [dump([MARKER])]), r"f.jsonl, line 1: expected a JSON object, got an array"))
    cases.append((jsonl("g.jsonl", [dump({"text": MARKER}), dump({"text": "   "})], on_empty="refuse"),
                  r"g.jsonl, line 2: the text \(field 'text'\) is empty"))
    cases.append((jsonl("h.json", [dump([good, MARKER])]), r"h.json, record 2: expected a JSON object, got a string"))
    cases.append((jsonl("i.json", ["[" + dump(good) + ",", dump({"text": MARKER}) + ",]"]),
                  r"i.json, line 2: not valid JSON"))
    cases.append((raw("j.csv", f"text,label\n{MARKER} ok,billing\n{MARKER}, unquoted,billing\n".encode()),
                  r"j.csv, row 2 \(line 3\): 3 field\(s\), the header has 2"))
    cases.append((raw("k.csv", f"text,label\n{MARKER} ok\n".encode()),
                  r"k.csv, row 1 \(line 2\): 1 field\(s\), the header has 2"))
    cases.append((raw("l.csv", f"message\n{MARKER}\n".encode()), r"l.csv: the header has no column 'text'"))
    cases.append((raw("m.csv", f"text,topic\n{MARKER},x\n".encode(), label_field="label"),
                  r"m.csv: the header has no column 'label'"))
    cases.append((raw("n.csv", f'text\n{MARKER}\n"{MARKER} never closed\n'.encode()),
                  r"n.csv, line \d+: not valid CSV"))
    cases.append((raw("o.csv", f"text\n{MARKER}\n{MARKER} caf\xe9\n".encode("latin-1")),
                  r"o.csv, line 3: not UTF-8 text"))
    cases.append((raw("p.csv", f'text,label\n"{MARKER}\nline two",billing\n,account\n'.encode(), on_empty="refuse"),
                  r"p.csv, row 2 \(line 4\): the text \(column 'text'\) is empty"))
    cases.append((raw("q.csv", f"text,text\n{MARKER},{MARKER}\n".encode()),
                  r"q.csv: the header names the column 'text' 2 times"))
    cases.append((jsonl("r.jsonl", [dump(_dolly(MARKER)), dump({"instruction": MARKER})]),
                  r"r.jsonl, line 2: missing field\(s\) context, response, category"))
    return cases


def test_errors_name_the_line_or_row_and_field_never_the_text(tmp_path):
    cases = _bad_inputs(tmp_path)
    assert len(cases) == 18
    for call, pattern in cases:
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert re.search(pattern, message), (pattern, message)
        assert MARKER not in message and "\n" not in message, message


def test_reprs_and_summaries_never_show_a_record(tmp_path):
    loaded = load_records(_three_formats(tmp_path)[0], text_field="message", label_field="topic")
    fitted = fit_records(loaded, max_tokens=3, count_tokens=words, on_long="truncate")
    for text in (repr(loaded), loaded.summary(), repr(fitted), fitted.summary()):
        assert MARKER not in text and "Café" not in text
    assert MARKER in loaded.records[0]["text"]  # the records themselves are intact


# -- long records --------------------------------------------------------------------------------------------
def _long_records():
    texts = ["one two three", f"{MARKER} a b c d e f g", "x y", f"{MARKER} 1 2 3 4 5 6 7 8 9"]
    return [{"text": t, "label": "billing"} for t in texts]


def test_long_records_refused_with_their_count():
    with pytest.raises(RecordsTooLongError) as info:
        fit_records(_long_records(), max_tokens=4, count_tokens=words)
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.count, error.total, error.limit) == (2, 4, "4 tokens")
    assert str(error).startswith("2 of 4 records are longer than 4 tokens (on_long='refuse')")
    assert MARKER not in str(error)
    fitted = fit_records(_long_records(), max_tokens=11, count_tokens=words)  # nothing too long: kept as is
    assert (fitted.too_long, fitted.truncated, fitted.skipped) == (0, 0, 0) and list(fitted) == _long_records()


def test_long_records_truncated_by_tokens_keep_a_beginning_of_each_text():
    records = _long_records()
    fitted = fit_records(records, max_tokens=4, count_tokens=words, on_long="truncate")
    assert isinstance(fitted, FittedRecords)
    assert (fitted.total, fitted.too_long, fitted.truncated, fitted.skipped) == (4, 2, 2, 0)
    assert [r["text"] for r in fitted] == ["one two three", f"{MARKER} a b c", "x y", f"{MARKER} 1 2 3"]
    for before, after in zip(records, fitted):
        assert before["text"].startswith(after["text"]) and words(after["text"]) <= 4
        assert after["label"] == "billing"
    assert records[1]["text"] == f"{MARKER} a b c d e f g"  # the input is not changed
    assert fitted.summary() == "2 of 4 records longer than 4 tokens: truncated"


def test_long_records_truncated_by_a_given_cut_or_by_characters():
    calls = []

    def cut(text, max_tokens):
        calls.append(max_tokens)
        return " ".join(text.split()[:max_tokens])

    fitted = fit_records(_long_records(), max_tokens=2, count_tokens=words, on_long="truncate", truncate=cut)
    assert [r["text"] for r in fitted] == ["one two", f"{MARKER} a", "x y", f"{MARKER} 1"] and calls == [2, 2, 2]
    with pytest.raises(ValueError, match="truncate: its result for record 1 is not a text of at most 2 tokens"):
        fit_records(_long_records(), max_tokens=2, count_tokens=words, on_long="truncate",
                    truncate=lambda text, n: text)
    by_chars = fit_records(_long_records(), max_chars=9, on_long="truncate")
    assert [r["text"] for r in by_chars] == ["one two t", MARKER[:9], "x y", MARKER[:9]]
    assert by_chars.truncated == 3
    assert by_chars.summary() == "3 of 4 records longer than 9 characters: truncated"
    # both limits: characters first, then tokens
    both = fit_records(_long_records(), max_chars=12, max_tokens=2, count_tokens=words, on_long="truncate")
    assert [r["text"] for r in both] == ["one two", f"{MARKER} a", "x y", f"{MARKER} 1"]


def test_long_records_skipped_and_counted():
    fitted = fit_records(_long_records(), max_tokens=4, count_tokens=words, on_long="skip")
    assert [r["text"] for r in fitted] == ["one two three", "x y"]
    assert (fitted.too_long, fitted.truncated, fitted.skipped) == (2, 0, 2)
    with pytest.raises(ValueError, match=r"on_long='skip': all 4 records are longer than 1 tokens"):
        fit_records(_long_records(), max_tokens=1, count_tokens=words, on_long="skip")


def test_length_limit_arguments_are_checked():
    records = _long_records()
    with pytest.raises(ValueError, match="on_long must be 'refuse', 'truncate' or 'skip', got 'cut'"):
        fit_records(records, max_tokens=4, count_tokens=words, on_long="cut")
    with pytest.raises(ValueError, match="needs a limit"):
        fit_records(records)
    with pytest.raises(TypeError, match="count_tokens must be a callable"):
        fit_records(records, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        fit_records(records, max_tokens=0, count_tokens=words)
    with pytest.raises(ValueError, match="field: record 1 has no string field 'instruction'"):
        fit_records(records, max_chars=5, field="instruction")


def test_a_loaded_dolly_file_is_limited_on_its_instructions(tmp_path):
    path = _jsonl(tmp_path / "dolly.jsonl", [_dolly("Name three birds of prey please."), _dolly("Why?")])
    fitted = fit_records(load_records(path), max_tokens=3, count_tokens=words, on_long="truncate")
    assert [r["instruction"] for r in fitted] == ["Name three birds", "Why?"]
    assert fitted.text_key == "instruction"


def test_record_token_limit_leaves_room_for_the_template_and_new_tokens():
    template = PromptTemplate(header="one two three\n\n", example="Message: {text}\n", open_slot="Message:")
    # header 3 + open slot 1 + 10 new tokens = 14; each example: "Message: \n" is 1 word, + 1 margin = 2
    assert record_token_limit(template, window=100, records_per_teacher=4, max_new_tokens=10,
                              count_tokens=words) == (100 - 14 - 4 * 2) // 4
    with pytest.raises(ValueError, match="window 20: no room for 4 records per teacher"):
        record_token_limit(template, window=20, records_per_teacher=4, max_new_tokens=10, count_tokens=words)


# -- templates -----------------------------------------------------------------------------------------------
def _parts():
    records = [{"instruction": f"Instruction number {i}.", "context": "", "response": "r", "category": "c"}
               for i in range(7)]
    return partition_records(records, 3, np.random.default_rng(3))


def test_the_instructions_template_reproduces_todays_prompts_byte_for_byte():
    assert DEFAULT_HEADER == ("Here are examples of instructions that people gave to an assistant. "
                              "Write one new instruction of the same kind.\n\n")
    assert DEFAULT_TEMPLATE == "Instruction: {instruction}\n" and OPEN_SLOT == "Instruction:"
    assert (INSTRUCTIONS.header, INSTRUCTIONS.example, INSTRUCTIONS.open_slot, INSTRUCTIONS.stop) == \
        (DEFAULT_HEADER, DEFAULT_TEMPLATE, OPEN_SLOT, "\n")
    part = [{"instruction": "Name a bird.", "context": "", "response": "", "category": "c"},
            {"instruction": "Add 2 and 3.", "context": "", "response": "", "category": "c"}]
    expected = ("Here are examples of instructions that people gave to an assistant. Write one new instruction of "
                "the same kind.\n\n", ["Instruction: Name a bird.\nInstruction: Add 2 and 3.\nInstruction:"])
    assert teacher_prompts([part]) == expected
    assert teacher_prompts([part], INSTRUCTIONS) == expected
    parts = partition_records(bundled_sample(), 16, np.random.default_rng(5))
    assert teacher_prompts(parts, INSTRUCTIONS) == teacher_prompts(parts)


def test_the_old_signature_still_takes_a_format_string_header_and_open_slot():
    parts = _parts()
    prefix, prompts = teacher_prompts(parts, "- {instruction}\n", "Header.\n", "-")
    assert prefix == "Header.\n" and all(p.endswith("\n-") and p.startswith("- Instruction") for p in prompts)
    with pytest.raises(ValueError, match="template names a field 'nope'"):
        teacher_prompts(parts, template="{nope}")
    with pytest.raises(TypeError, match="shared_prefix and open_slot come from the PromptTemplate"):
        teacher_prompts(parts, INSTRUCTIONS, shared_prefix="Other header")


def test_records_template_prompts_hold_each_teachers_records_and_end_with_the_open_slot():
    loaded = load_bundled("support_sample.csv", label_field="label")
    parts = partition_records(loaded.records, 6, np.random.default_rng(11))
    header, prompts = teacher_prompts(parts, RECORDS)
    assert header == RECORDS.header and "{" not in header
    assert len(prompts) == 6
    for part, prompt in zip(parts, prompts):
        assert prompt.endswith("\nRecord:")
        lines = prompt.split("\n")
        assert lines[:-1] == [f"Record: {r['text']}" for r in part]
    others = {r["text"] for part in parts[1:] for r in part}
    assert not any(text in prompts[0] for text in others)


def test_a_record_with_line_breaks_is_shown_on_one_line_under_a_line_break_stop():
    part = [{"text": "first line\n\n  second line \r\nthird"}, {"text": "plain  spaced "},
            {"text": " lead\u2028tail\n\n"}]
    _, [prompt] = teacher_prompts([part], RECORDS)
    assert prompt == "Record: first line second line third\nRecord: plain  spaced \nRecord:  lead tail\nRecord:"


MULTILINE = """\
header = "Here are e-mails. Each ends with a line that holds only ###.\\n\\n"
example = "E-mail:\\n{text}\\n###\\n"
open_slot = "E-mail:\\n"
stop = "\\n###"
"""


def test_a_multiline_template_keeps_line_breaks_and_refuses_records_holding_its_stop(tmp_path):
    path = tmp_path / "emails.toml"
    path.write_text(MULTILINE, encoding="utf-8")
    template = load_template(path)
    assert template.name == "emails" and template.multiline and template.fields == ("text",)
    part = [{"text": "Hello,\r\nmy order is late.\rThanks"}, {"text": "One line"}]
    header, [prompt] = teacher_prompts([part], template)
    assert prompt == "E-mail:\nHello,\nmy order is late.\nThanks\n###\nE-mail:\nOne line\n###\nE-mail:\n"
    bad = [{"text": f"{MARKER}\n### in the middle"}, {"text": f"{MARKER} fine"}, {"text": "end\n###"}]
    with pytest.raises(TemplateError) as info:
        teacher_prompts([bad], template)
    assert "2 record(s) contain the stop string" in str(info.value) and MARKER not in str(info.value)


def test_template_files_round_trip_and_the_builtins_resolve(tmp_path):
    assert set(BUILTIN_TEMPLATES) == {"instructions", "records", "labelled-records"}
    for template in (INSTRUCTIONS, RECORDS, PromptTemplate(header='Odd "quotes" \\ \t\x7f\n', example="{text}\n",
                                                           open_slot="New:", name="odd")):
        path = tmp_path / f"{template.name}.toml"
        path.write_text(template.to_toml(), encoding="utf-8")
        assert load_template(path) == template
        assert get_template(str(path)) == template
    assert get_template("records") is RECORDS and get_template(INSTRUCTIONS) is INSTRUCTIONS
    assert INSTRUCTIONS.describe()["example"] == "Instruction: {instruction}\n"
    with pytest.raises(FileNotFoundError, match="no such template file"):
        get_template(str(tmp_path / "nope.toml"))
    with pytest.raises(TypeError, match="template must be a PromptTemplate"):
        get_template(3)


TEMPLATE_ERRORS = [
    ('header = "About {text}\\n"\nexample = "{text}\\n"\nopen_slot = "New:"\n',
     r"header holds the format field \{text\}"),
    ('header = "H"\nexample = "{text}\\n"\nopen_slot = "New {text}:"\n',
     r"open_slot holds the format field \{text\}"),
    ('header = "H {{label}}"\nexample = "{text}\\n"\nopen_slot = "New:"\n', r"header holds a brace"),
    ('header = "H {"\nexample = "{text}\\n"\nopen_slot = "New:"\n', r"header holds a brace"),
    ('header = "H"\nexample = "Record\\n"\nopen_slot = "New:"\n', r"example has no field"),
    ('header = "H"\nexample = "{0}\\n"\nopen_slot = "New:"\n', r"example has the field \{0\}"),
    ('header = "H"\nexample = "{text!r}\\n"\nopen_slot = "New:"\n', r"conversion or format spec on \{text\}"),
    ('header = "H"\nexample = "{text:>9}\\n"\nopen_slot = "New:"\n', r"conversion or format spec on \{text\}"),
    ('header = "H"\nexample = "{text\\n"\nopen_slot = "New:"\n', r"example is not a valid format string"),
    ('header = "H"\nexample = "{text}"\nopen_slot = "New:"\n', r"stop '\\n' does not follow the last field"),
    ('header = "H"\nexample = "{text}\\n"\nopen_slot = "New:"\nstop = ""\n', r"stop is empty"),
    ('header = "H"\nexample = "{text}\\n"\nopen_slot = "  "\n', r"open_slot is empty"),
    ('header = "H"\nexample = "{text}\\n"\n', r"missing key 'open_slot'"),
    ('header = "H"\nexample = "{text}\\n"\nopen_slot = "New:"\nopenslot = "x"\n', r"unknown key 'openslot'"),
    ('header = "H"\nexample = "{text}\\n"\nopen_slot = "New:"\nstop = 1\n', r"stop must be a string, got int"),
    ('header = "H\nexample = 1\n', r"not valid TOML"),
]


@pytest.mark.parametrize("text, pattern", TEMPLATE_ERRORS)
def test_bad_template_files_are_refused_naming_the_key(tmp_path, text, pattern):
    path = tmp_path / "mine.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TemplateError, match=pattern) as info:
        load_template(path)
    assert str(info.value).startswith(f"template {str(path)!r}: ") and "\n" not in str(info.value)


def test_a_template_may_name_the_label_in_its_header_and_open_slot(tmp_path):
    """Issue 34, lever 2: ``{label}`` is the one field of the header and the open slot; ``for_label`` fills it for
    one label (the teachers' shared prefix and the public model's prompt of that label), a template that does not
    name it is its own filling, a label with a brace is refused; the built-in ``labelled-records`` reads back from
    its file."""
    from ensembles.templates import LABELLED_RECORDS

    template = PromptTemplate(header="Write a {label} note.\n", example="Note: {text}\n", open_slot="Note ({label}):")
    assert template.names_label and not RECORDS.names_label and RECORDS.for_label("x") is RECORDS
    filled = template.for_label("kids")
    assert filled.header == "Write a kids note.\n" and filled.open_slot == "Note (kids):" and not filled.names_label
    shared, prompts = teacher_prompts([[{"text": "a"}]], filled)
    assert shared == "Write a kids note.\n" and prompts == ["Note: a\nNote (kids):"]
    with pytest.raises(TemplateError, match="the label 'a}b' holds a brace"):
        template.for_label("a}b")
    assert get_template("labelled-records") is LABELLED_RECORDS
    assert LABELLED_RECORDS.for_label("food").header.count('"food"') == 2
    path = tmp_path / "labelled.toml"
    path.write_text(LABELLED_RECORDS.to_toml(), encoding="utf-8")
    assert load_template(path).header == LABELLED_RECORDS.header


def test_an_example_field_the_records_lack_is_refused_naming_the_field():
    support = load_bundled("support_sample.csv")
    with pytest.raises(TemplateError, match=r"example shows the field \{instruction\}, which the records do not "
                                            r"have \(they have: text\)"):
        INSTRUCTIONS.check_fields(support.fields)
    with pytest.raises(TemplateError, match=r"\{label\}, which record 1 does not have"):
        teacher_prompts([list(support.records[:2])], PromptTemplate("H", "{text} ({label})\n", "New:"))
    labelled = load_bundled("support_sample.csv", label_field="label")
    RECORDS.check_fields(labelled.fields)
    _, [prompt] = teacher_prompts([list(labelled.records[:1])], PromptTemplate("H", "{label}: {text}\n", "x:"))
    assert prompt.startswith("billing: I was charged twice")


# -- labels ---------------------------------------------------------------------------------------------------
def test_split_by_label_in_sorted_order_with_the_labels_given():
    loaded = load_bundled("support_sample.csv", label_field="label")
    groups = split_by_label(loaded)
    assert list(groups) == ["account", "billing", "shipping"]
    assert all(len(g) == 10 and {r["label"] for r in g} == {label} for label, g in groups.items())
    assert groups["billing"] == [r for r in loaded.records if r["label"] == "billing"]  # record order kept
    given = split_by_label(loaded.records, labels=["shipping", "refunds", "billing", "account"])
    assert list(given) == ["account", "billing", "refunds", "shipping"] and given["refunds"] == []
    with pytest.raises(ValueError, match=r"labels: 10 record\(s\) have a label outside the 2 labels given"):
        split_by_label(loaded, labels=["billing", "account"])
    secret = [{"text": "t", "label": MARKER}, {"text": "u", "label": "billing"}]
    with pytest.raises(ValueError) as info:
        split_by_label(secret, labels=["billing"])
    assert MARKER not in str(info.value)
    with pytest.raises(ValueError, match="key: these records have no label"):
        split_by_label(load_bundled("support_sample.csv"))
    with pytest.raises(ValueError, match="key: record 1 has no string field 'label'"):
        split_by_label([{"text": "t"}])
    with pytest.raises(TypeError, match="labels must be a collection"):
        split_by_label(loaded, labels="billing")


# -- the documentation's examples --------------------------------------------------------------------------
def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "docs" / "data.md").read_text(), re.S)


def test_the_documented_builtin_templates_are_the_builtins(tmp_path):
    tomls = {re.search(r"# prompt template '([\w-]+)'", block).group(1): block
             for block in _blocks("toml") if block.startswith("# prompt template")}
    assert set(tomls) == {"instructions", "records", "labelled-records"}
    for name, block in tomls.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(block, encoding="utf-8")
        assert load_template(path) == BUILTIN_TEMPLATES[name]


def test_the_worked_example_prints_what_the_page_shows(tmp_path, monkeypatch, capsys):
    support = next(b for b in _blocks("toml") if b.startswith("# support.toml"))
    emails = next(b for b in _blocks("toml") if b.startswith("# emails.toml"))
    (tmp_path / "support.toml").write_text(support, encoding="utf-8")
    (tmp_path / "emails.toml").write_text(emails, encoding="utf-8")
    assert load_template(tmp_path / "emails.toml").stop == "\n###"
    monkeypatch.chdir(tmp_path)
    code = next(b for b in _blocks("python") if "load_template(\"support.toml\")" in b)
    exec(compile(code, "docs/data.md", "exec"), {})
    shown = next(b for b in _blocks("text") if b.startswith("30 records from support_sample.csv"))
    assert capsys.readouterr().out == shown
