"""Real corpora for the utility benchmark that a fresh machine obtains offline (issue 33, item 4; docs/utility.md):
text that a Debian package ships, written by people outside this project, turned into a CSV file the run path
reads (``text``, ``label``).

``fortunes``: the fortune cookies of Debian's ``fortunes`` package, one file a category, records separated by a line
holding ``%``; the category is the label.  Short records only (``--max-chars``), whitespace collapsed, an equal
number drawn from each category with a fixed seed::

    apt-get install fortunes
    .venv/bin/python benchmarks/corpora.py fortunes --categories food,love,kids,education --per-label 90 \\
        --out fortunes.csv
    .venv/bin/pate-accountant experiment utility --data fortunes.csv --label-field label --quick --plot

``manpages``: the one-line descriptions (the NAME section) of the Linux man-pages project's pages that Debian's
``manpages-dev`` package ships, labelled by section (``syscalls``: section 2, ``library``: section 3); pages that
only point to another page (``.so`` and links) and pages from other projects (their ``.TH`` line does not name
Linux man-pages) are left out, troff's escapes undone, an equal number drawn from each section with a fixed seed::

    apt-get install manpages-dev
    .venv/bin/python benchmarks/corpora.py manpages --per-label 90 --out manpages.csv
    .venv/bin/pate-accountant experiment utility --data manpages.csv --label-field label --quick --plot

Nothing is downloaded here: the script reads the packages' files where Debian puts them (``--folder``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import re
import sys
from pathlib import Path

import numpy as np

#: Where Debian's fortunes package puts its files.
FORTUNES = Path("/usr/share/games/fortunes")

_SPACE = re.compile(r"\s+")


def split_fortunes(text: str) -> list[str]:
    """The records of one fortune file: the blocks between lines that hold ``%`` alone, whitespace collapsed,
    empty ones left out."""
    records, block = [], []
    for line in text.splitlines():
        if line.strip() == "%":
            records.append(" ".join(block))
            block = []
        else:
            block.append(line)
    records.append(" ".join(block))
    return [_SPACE.sub(" ", record).strip() for record in records if record.strip()]


def fortunes(categories, *, folder: Path = FORTUNES, per_label: int, max_chars: int, seed: int = 0) -> list[dict]:
    """``per_label`` records of at most ``max_chars`` characters from each category's file, drawn with ``seed``
    (``ValueError`` naming a category that is missing or too small)."""
    rng = np.random.default_rng(seed)
    out = []
    for category in categories:
        path = Path(folder) / category
        if not path.is_file():
            raise ValueError(f"--categories: no fortune file {str(path)!r} (apt-get install fortunes)")
        short = [r for r in split_fortunes(path.read_text(encoding="utf-8", errors="replace")) if len(r) <= max_chars]
        if len(short) < per_label:
            raise ValueError(f"--categories: {category} has {len(short)} records of at most {max_chars} characters, "
                             f"fewer than --per-label {per_label}")
        out += [{"text": short[i], "label": category} for i in sorted(rng.choice(len(short), per_label, replace=False))]
    return out


#: Where Debian puts the man pages, and the sections ``manpages`` reads (folder and page suffix) by label.
MANPAGES = Path("/usr/share/man")
SECTIONS = {"syscalls": "2", "library": "3"}
_TROFF = [(re.compile(r"\\f(\[[^]]*\]|\(..|.)"), ""), (re.compile(r"\\[&:%]"), ""), (re.compile(r"\\ "), " "),
          (re.compile(r"\\\(em|\\\[em\]"), "\u2014"), (re.compile(r"\\\(aq"), "'"), (re.compile(r"\\\(dq"), '"'),
          (re.compile(r"\\\(.."), ""), (re.compile(r"\\-"), "-"), (re.compile(r"\\e"), r"\\")]


def man_name_line(source: str) -> str | None:
    """The NAME section of a man page's troff ``source`` as one line (``read, pread - read from a file``), or
    ``None`` for a page with no NAME section or one that is not the Linux man-pages project's."""
    lines = source.splitlines()
    if not any(line.startswith(".TH") and "Linux man-pages" in line for line in lines):
        return None
    try:
        start = next(i for i, line in enumerate(lines) if line.strip().upper() in (".SH NAME", '.SH "NAME"'))
    except StopIteration:
        return None
    body = []
    for line in lines[start + 1:]:
        if line.startswith(".SH"):
            break
        if line.startswith(('.\\"', "'\\\"")):
            continue  # a comment
        body.append(line.split(None, 1)[1] if line.startswith(".") and " " in line else
                    "" if line.startswith(".") else line)
    text = " ".join(body)
    for pattern, replacement in _TROFF:
        text = pattern.sub(replacement, text)
    text = _SPACE.sub(" ", text).strip()
    return text or None


def manpages(labels=tuple(SECTIONS), *, folder: Path = MANPAGES, per_label: int, max_chars: int,
             seed: int = 0) -> list[dict]:
    """``per_label`` NAME lines of at most ``max_chars`` characters from each section of ``labels`` (keys of
    :data:`SECTIONS`), drawn with ``seed`` (``ValueError`` naming a section that is missing or too small)."""
    rng = np.random.default_rng(seed)
    out = []
    for label in labels:
        if label not in SECTIONS:
            raise ValueError(f"--sections: unknown section {label!r} (known: {', '.join(SECTIONS)})")
        number = SECTIONS[label]
        where = Path(folder) / f"man{number}"
        pages = sorted(p for p in where.glob(f"*.{number}.gz") if p.is_file() and not p.is_symlink()) \
            if where.is_dir() else []
        lines = []
        for page in pages:
            with gzip.open(page, "rt", encoding="utf-8", errors="replace") as handle:
                line = man_name_line(handle.read())
            if line is not None and len(line) <= max_chars:
                lines.append(line)
        lines = sorted(set(lines))
        if len(lines) < per_label:
            raise ValueError(f"--sections: {label} has {len(lines)} pages of Linux man-pages of at most {max_chars} "
                             f"characters in {str(where)!r}, fewer than --per-label {per_label} (apt-get install "
                             "manpages-dev)")
        out += [{"text": lines[i], "label": label} for i in sorted(rng.choice(len(lines), per_label, replace=False))]
    return out


def write_csv(records, path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(records)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write a real corpus a Debian package ships as a CSV file.")
    sub = parser.add_subparsers(dest="corpus", required=True)
    p = sub.add_parser("fortunes", help="Debian's fortune cookies, labelled by category")
    p.add_argument("--categories", default="food,love,kids,education")
    p.add_argument("--per-label", type=int, default=90)
    p.add_argument("--max-chars", type=int, default=200)
    p.add_argument("--folder", default=str(FORTUNES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    m = sub.add_parser("manpages", help="the Linux man-pages' NAME lines (Debian's manpages-dev), labelled by section")
    m.add_argument("--sections", default=",".join(SECTIONS), help=f"of {', '.join(SECTIONS)}")
    m.add_argument("--per-label", type=int, default=90)
    m.add_argument("--max-chars", type=int, default=200)
    m.add_argument("--folder", default=str(MANPAGES))
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.corpus == "fortunes":
            labels = args.categories
            records = fortunes(labels.split(","), folder=Path(args.folder), per_label=args.per_label,
                               max_chars=args.max_chars, seed=args.seed)
        else:
            labels = args.sections
            records = manpages(labels.split(","), folder=Path(args.folder), per_label=args.per_label,
                               max_chars=args.max_chars, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    write_csv(records, args.out)
    print(f"wrote {len(records)} records ({args.per_label} a label: {labels}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
