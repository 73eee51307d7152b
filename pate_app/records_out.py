"""``generate --out FILE``: the synthetic records of a run, one per line, written as each one finishes
(docs/data.md, "Data out").

JSON lines by default, CSV when the name ends in ``.csv``.  Each line holds the record's text, its label (label
runs), whether it is complete, its counts of private and public tokens and why it stopped.  A record the budget
cut short is marked ``complete: false`` and left out unless ``keep_partial``; an interrupt or a budget stop
therefore leaves every finished record in the file.  The file holds only generated text and public outcome
counts: no prompt, no record of the data set, no seed.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

__all__ = ["COLUMNS", "RecordsOut", "check_out_path"]

#: The fields of one line, in order (``label`` only in label runs).
COLUMNS = ("text", "label", "complete", "private_tokens", "public_tokens", "num_tokens", "stop_reason")


def check_out_path(path) -> Path:
    """``path`` as a new file a run may write, checked before anything is charged (``ValueError`` naming
    ``--out``): its folder exists, nothing is at the path (a run never overwrites), and the name says JSON lines
    (``.jsonl``, ``.json``) or CSV (``.csv``)."""
    out = Path(os.path.expanduser(str(path)))
    if out.suffix.lower() not in (".jsonl", ".json", ".csv"):
        raise ValueError(f"--out {str(path)!r}: the name must end in .jsonl or .json (JSON lines) or .csv")
    if out.exists() or out.is_symlink():
        raise ValueError(f"--out {str(path)!r} already exists: a run writes a new file (give another name)")
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(path)!r}: the folder {str(out.parent)!r} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise ValueError(f"--out {str(path)!r}: the folder {str(out.parent)!r} cannot be written")
    return out


class RecordsOut:
    """The output file of one run (``path`` checked by :func:`check_out_path`; created by :meth:`open`)."""

    def __init__(self, path: Path, *, labels: bool = False, keep_partial: bool = False):
        self.path, self.labels, self.keep_partial = Path(path), bool(labels), bool(keep_partial)
        self.written = 0
        self._handle = self._csv = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in COLUMNS if c != "label" or self.labels)

    def open(self) -> None:
        """Create the file (exclusively: a file that appeared since the check is never overwritten)."""
        self._handle = open(self.path, "x", encoding="utf-8", newline="")  # noqa: SIM115 (closed by close())
        if self.path.suffix.lower() == ".csv":
            self._csv = csv.writer(self._handle)
            self._csv.writerow(self.columns)
            self._handle.flush()

    def write(self, record: dict) -> bool:
        """Append one finished record (the run's record dict) unless it is partial and partial records are left
        out; flushed at once.  Returns whether it was written."""
        row = {
            "text": record["text"],
            "label": record.get("label"),
            "complete": record["complete"],
            "private_tokens": record["private_tokens"],
            "public_tokens": record["fallback_tokens"],
            "num_tokens": record["num_tokens"],
            "stop_reason": record["stop_reason"],
        }
        if not (row["complete"] or self.keep_partial):
            return False
        values = [row[c] for c in self.columns]
        if self._csv is not None:
            self._csv.writerow(["true" if v is True else "false" if v is False else v for v in values])
        else:
            self._handle.write(json.dumps(dict(zip(self.columns, values, strict=True)), ensure_ascii=False) + "\n")
        self._handle.flush()
        self.written += 1
        return True

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
