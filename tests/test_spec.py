"""One run description (issue 24, item 5): pate_app.spec.RunSpec from flags, from a TOML file, and its shareable
part; checked once, one line naming the key and the value."""

from __future__ import annotations

import pytest

from pate_app.cli import build_parser
from pate_app.spec import SECTIONS, RunSpec, SpecError

BASE = {"data": "records.csv", "budget_epsilon": 8.0, "budget_delta": 1e-6}


def test_defaults_are_generates():
    args = build_parser().parse_args(["generate", "--data", "records.csv", "--budget-epsilon", "8",
                                      "--budget-delta", "1e-6"])
    assert RunSpec.from_args(args, args.parser) == RunSpec(**BASE)


def test_a_toml_file_round_trips_and_flags_take_precedence(tmp_path):
    spec = RunSpec(**BASE, text_field="message", label_field="topic", labels=("a", "b"), template="records",
                   teachers=12, groups=1, mechanism="gaussian-threshold-argmax", accountant="pld", step_epsilon=0.5,
                   public_top_k=50, out="synthetic.jsonl", keep_partial=True, seed=987654321)
    path = tmp_path / "run.toml"
    path.write_text(spec.to_toml())
    assert "seed" not in path.read_text() and "987654321" not in path.read_text()
    again = RunSpec.from_toml(path)
    assert again == RunSpec(**{**attr_dict(spec), "seed": None})
    args = build_parser().parse_args(["generate", "--config", str(path), "--teachers", "24"])
    from_cli = RunSpec.from_args(args, args.parser)
    assert from_cli.teachers == 24 and from_cli.mechanism == "gaussian-threshold-argmax" and from_cli.labels == ("a", "b")


def attr_dict(spec):
    import attr

    return attr.asdict(spec, recurse=False)


@pytest.mark.parametrize("content, message", [
    ("[data]\npath = 'x.csv'\n[budget]\nepsilon = 8\ndelta = 1e-6\n[task]\nrecords = 0\n",
     "task.records must be >= 1, got 0"),
    ("[data]\npath = 'x.csv'\n[budget]\nepsilon = -1\ndelta = 1e-6\n", "budget.epsilon must be > 0"),
    ("[data]\npath = 'x.csv'\n[budget]\nepsilon = 8\ndelta = 1e-6\n[data2]\nx = 1\n", "unknown table [data2]"),
    ("[data]\npath = 'x.csv'\nseed = 3\n[budget]\nepsilon = 8\ndelta = 1e-6\n", "unknown key data.seed"),
    ("[budget]\nepsilon = 8\ndelta = 1e-6\n", "data.path is required"),
    ("[data]\npath = 'x.csv'\nlabels = ['a']\n[budget]\nepsilon = 8\ndelta = 1e-6\n", "needs data.label_field"),
    ("[data]\npath = 'x.csv'\n[budget]\nepsilon = 8\ndelta = 1e-6\n[output]\nkeep_partial = 'yes'\n",
     "output.keep_partial must be true or false"),
    ("not toml at all [", "not valid TOML"),
])
def test_bad_files_are_one_line_naming_the_key(tmp_path, content, message):
    path = tmp_path / "run.toml"
    path.write_text(content)
    with pytest.raises(SpecError, match=None) as caught:
        RunSpec.from_toml(path)
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith(f"--config {str(path)!r}")


def test_the_shareable_part_has_no_seed_and_no_local_paths():
    spec = RunSpec(**{**BASE, "data": "/home/someone/private/records.csv"}, out="/home/someone/out/x.jsonl",
                   ledger="/home/someone/l.sqlite", template="/home/someone/task.toml", seed=123456789)
    shared = spec.shareable()
    text = repr(shared)
    assert "123456789" not in text and "/home/someone" not in text
    assert shared["data"]["path"] == "records.csv" and shared["task"]["template"] == "task.toml"
    assert set(shared) == set(SECTIONS)
    assert "seed" not in repr(spec)
