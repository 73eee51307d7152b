"""benchmarks/corpora.py (issue 33, item 4): a fortune file's records, and the CSV the run path then reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ensembles.data import load_records

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "corpora.py"
_spec = importlib.util.spec_from_file_location("corpora", _PATH)
corpora = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpora)


def test_a_fortune_file_splits_on_lines_of_a_percent_sign():
    text = "First one\n  on two lines\n%\nSecond.\n%\n%\nThird, 100% sure.\n"
    assert corpora.split_fortunes(text) == ["First one on two lines", "Second.", "Third, 100% sure."]


def test_the_csv_holds_short_records_of_each_category_and_the_run_path_reads_it(tmp_path):
    folder = tmp_path / "fortunes"
    folder.mkdir()
    (folder / "food").write_text("\n%\n".join([f"Eat {i}." for i in range(6)] + ["x" * 300]) + "\n")
    (folder / "pets").write_text("\n%\n".join([f"A cat {i}." for i in range(5)]) + "\n")
    out = tmp_path / "corpus.csv"
    assert corpora.main(["fortunes", "--categories", "food,pets", "--per-label", "4", "--max-chars", "50",
                         "--folder", str(folder), "--out", str(out)]) == 0
    loaded = load_records(str(out), label_field="label")
    labels = [record["label"] for record in loaded.records]
    assert labels.count("food") == 4 and labels.count("pets") == 4
    assert all(len(record["text"]) <= 50 for record in loaded.records)
    again = corpora.fortunes(["food", "pets"], folder=folder, per_label=4, max_chars=50)
    assert [r["text"] for r in again] == [r["text"] for r in loaded.records]  # seeded
    with pytest.raises(ValueError, match="pets has 5 records"):
        corpora.fortunes(["pets"], folder=folder, per_label=6, max_chars=50)
    with pytest.raises(ValueError, match="no fortune file"):
        corpora.fortunes(["nothing"], folder=folder, per_label=1, max_chars=50)
