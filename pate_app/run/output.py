"""What a run gives back as it goes and when it ends, on both paths (a private run and the public model alone):
its progress on stderr (:class:`RunProgress`), its ``--out`` file (:func:`_out_file`, checked before anything is
written, then :func:`_open_out`), each record's text (:func:`_record_text`), and the parts of the result the two
paths share (:func:`_summary`, :func:`_out_entry`)."""

from __future__ import annotations

import contextlib

from pate_app.errors import RunInputError
from pate_app.evaluation import normalise
from pate_app.records_out import RecordsOut, check_out_path

__all__ = ["RunProgress"]


class RunProgress:
    """The run's progress on stderr: one bar over the records (so its total never jumps when a record stops
    early, and no ETA is shown before the first record ends), whose postfix names the phase (the prefill of
    the teachers' prompts, then the tokens) and counts private and public-fallback tokens apart.  Silent when
    ``enabled`` is false.  It sees only public outcome classes, never votes or counts."""

    def __init__(self, num_records: int, enabled: bool):
        self.private = self.fallback = self.charged = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=num_records, desc="records", unit="record", leave=False, dynamic_ncols=True,
                            bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")

    def _show(self, phase: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{phase}; private {self.private}, fallback {self.fallback} "
                                     f"({self.charged} charged runs)")

    def record_starts(self) -> None:
        self._show("prefill of the teachers' prompts")

    def step(self, outcome: str, charged: bool = True) -> None:
        self.charged += charged
        self.private += outcome == "token"
        self.fallback += outcome == "fallback"
        self._show("tokens")

    def record_ends(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _out_file(spec):
    """The ``--out`` file of ``spec``, checked to be a new file before anything is written
    (:func:`~pate_app.records_out.check_out_path`; a :class:`RunInputError` otherwise), or ``None``."""
    try:
        return None if spec.out is None else check_out_path(spec.out)
    except ValueError as exc:
        raise RunInputError(str(exc)) from None


def _open_out(stack: contextlib.ExitStack, out_file, spec, labels) -> RecordsOut | None:
    """The ``--out`` writer of a run, opened and closed by ``stack`` (``None`` without ``--out``); a file that
    cannot be created is a :class:`RunInputError`."""
    if out_file is None:
        return None
    writer = RecordsOut(out_file, labels=labels is not None, keep_partial=spec.keep_partial)
    try:
        writer.open()
    except OSError as exc:
        raise RunInputError(f"--out {str(out_file)!r}: cannot create it: {exc.strerror or exc}") from None
    stack.callback(writer.close)
    return writer


def _record_text(spec, text: str) -> str:
    """A record's text as the result and ``--out`` give it: trimmed, or with ``spec.normalise`` as the utility
    benchmark scores it (:func:`pate_app.evaluation.normalise`)."""
    return normalise(text) if spec.normalise else text.strip()


def _summary(records: list, requested: int) -> dict:
    """The result's ``summary``: the records ``requested``, those complete, those the budget cut short and those
    missing."""
    complete = sum(1 for r in records if r["complete"])
    cut = len(records) - complete
    return {"requested": requested, "complete": complete, "cut_by_budget": cut,
            "missing": requested - complete - cut}


def _out_entry(out_file, writer, spec) -> dict | None:
    """The result's ``out``: the ``--out`` file and the records written to it (``None`` without ``--out``)."""
    return None if out_file is None else {"path": str(out_file), "written": writer.written,
                                          "keep_partial": bool(spec.keep_partial)}
