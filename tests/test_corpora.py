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


def _page(folder, name, section, source, link_to=None):
    import gzip

    where = folder / f"man{section}"
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.{section}.gz"
    if link_to is not None:
        path.symlink_to(link_to)
        return
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(source)


MAN_PAGE = """.\\" Copyright someone
.TH {name} {section} 2023-02-05 "Linux man-pages 6.03"
.SH NAME
{name}, {name}at \\- do \\fBthings\\fP with a file\\(emquietly
.SH SYNOPSIS
.nf
.B #include <unistd.h>
"""


def test_a_man_page_name_line_undoes_troff_and_skips_other_projects():
    source = MAN_PAGE.format(name="open", section=2)
    assert corpora.man_name_line(source) == "open, openat - do things with a file\u2014quietly"
    assert corpora.man_name_line(source.replace("Linux man-pages 6.03", "OpenSSL 3.0")) is None
    assert corpora.man_name_line(".TH x 3 2023 \"Linux man-pages 6.03\"\n.SH SYNOPSIS\nx\n") is None
    two_lines = '.TH a 3 2023 "Linux man-pages 6.03"\n.SH NAME\nalpha, beta \\-\n.B compute\nboth\n.SH SEE\n'
    assert corpora.man_name_line(two_lines) == "alpha, beta - compute both"


def test_the_manpages_csv_draws_each_section_and_leaves_links_out(tmp_path):
    folder = tmp_path / "man"
    for i in range(5):
        _page(folder, f"call{i}", 2, MAN_PAGE.format(name=f"call{i}", section=2))
        _page(folder, f"func{i}", 3, MAN_PAGE.format(name=f"func{i}", section=3))
    _page(folder, "alias", 3, None, link_to="func0.3.gz")
    _page(folder, "pointer", 3, ".so man3/func1.3\n")
    _page(folder, "ssl", 3, MAN_PAGE.format(name="ssl", section=3).replace("Linux man-pages 6.03", "OpenSSL"))
    out = tmp_path / "manpages.csv"
    assert corpora.main(["manpages", "--per-label", "4", "--folder", str(folder), "--out", str(out)]) == 0
    loaded = load_records(str(out), label_field="label")
    labels = [record["label"] for record in loaded.records]
    assert labels.count("syscalls") == 4 and labels.count("library") == 4
    assert all(" - do things with a file" in record["text"] for record in loaded.records)
    assert not any(record["text"].startswith(("alias", "pointer", "ssl")) for record in loaded.records)
    again = corpora.manpages(["syscalls", "library"], folder=folder, per_label=4, max_chars=200)
    assert [r["text"] for r in again] == [r["text"] for r in loaded.records]  # seeded
    with pytest.raises(ValueError, match="library has 5 pages"):
        corpora.manpages(["library"], folder=folder, per_label=6, max_chars=200)
    with pytest.raises(ValueError, match="unknown section 'games'"):
        corpora.manpages(["games"], folder=folder, per_label=1, max_chars=200)
