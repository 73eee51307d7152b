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

Nothing is downloaded here: the script reads the package's files where Debian puts them (``--folder``).
"""

from __future__ import annotations

import argparse
import csv
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
    args = parser.parse_args(argv)
    try:
        records = fortunes(args.categories.split(","), folder=Path(args.folder), per_label=args.per_label,
                           max_chars=args.max_chars, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    write_csv(records, args.out)
    print(f"wrote {len(records)} records ({args.per_label} a label: {args.categories}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
