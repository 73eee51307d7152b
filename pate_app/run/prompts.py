"""The records as a run's teachers see them: each record fitted to its share of the model's window
(:func:`_fit_to_window`, ``--long-records``), then placed at random in the teachers' public slots and the
teachers taken into groups (:func:`group_prompts`; with labels, each label's own teachers: :func:`run_prompts`).
One record changed, added or removed changes at most one teacher's prompt (docs/privacy_unit.md)."""

from __future__ import annotations

import math
import sys

import numpy as np

from ensembles.backends import transformers_backend as tb
from ensembles.data import (
    RecordsTooLongError,
    fit_records,
    place_records,
    record_token_limit,
    teacher_prompts,
)
from ensembles.templates import INSTRUCTIONS, PromptTemplate
from pate_app.errors import RunInputError, first_line
from pate_app.library_output import quiet_libraries
from pate_app.run.checks import (
    _public_count,
    _RunPlan,
    check_noise_floor,
    nearest_configurations,
    plural_of,
)

__all__ = ["group_prompts", "run_prompts"]


def _fit_to_window(spec, task, plan: _RunPlan, model, *, announce: bool, public_blocks: list[str] | None = None) -> list:
    """The records as the teachers will see them, in their places: each record's text fitted to its share of
    the model's window (:func:`~ensembles.data.record_token_limit`: the window less the template and
    ``spec.max_tokens`` new tokens, over the public number of records one teacher shows, ``plan.per_teacher``,
    never a count of the records) by ``spec.long_records``, each record on its own; a skipped record's place holds
    ``None`` (so the placement moves no other record).  Only the tokenizer and
    the config are read.  A refusal counts the records, never shows one; with ``announce``, what was done is one
    line on stderr (counts only: they describe the data, so they stay on this screen and out of the ledger and
    the result).  The vocabulary's size is checked against a Gaussian mechanism's noise here too
    (:func:`~pate_app.run.checks.check_noise_floor`).  ``public_blocks``: the public examples the teachers show
    too (:func:`~pate_app.run.public.teacher_public_blocks`), whose tokens (the longest group's) leave the records'
    share of the window."""
    records = task.records
    try:
        with quiet_libraries(drop_stderr=True):
            count_tokens, window, vocab_size = tb.token_window(model)
    except (OSError, ValueError) as exc:
        raise RunInputError(f"argument --model: cannot read its tokenizer or config: {first_line(exc)}") from None
    per_teacher = plan.per_teacher  # public (records_per_teacher): never the records' own counts
    shown_public = max(map(count_tokens, public_blocks)) if public_blocks else 0  # public examples only
    try:
        limit = min(record_token_limit(task.template.for_label(label) if label is not None else task.template,
                                       window=max(1, window - shown_public), records_per_teacher=per_teacher, max_new_tokens=spec.max_tokens,
                                       count_tokens=count_tokens) for label in (plan.labels or [None]))
    except ValueError:
        seen = f", the {shown_public} tokens of the public examples" if shown_public else ""
        raise RunInputError(f"--teachers {spec.teachers}: the model's context window of {window} tokens has no room "
                            f"for {per_teacher} records per teacher with the template{seen} and --max-tokens "
                            f"{spec.max_tokens}: use more teachers or a smaller --max-tokens") from None
    try:  # public parameters only
        check_noise_floor(plan.mechanism, plan.group_teachers, vocab_size, spec.public_top_k)
    except RunInputError as exc:
        nearest = nearest_configurations(spec, plan.groups, plan.touches, labels=plan.labels is not None,
                                         records=_public_count(spec, task), vocab_size=vocab_size)
        raise RunInputError(f"{exc}{nearest}") from None
    share = (f"each record's share of the model's context window of {window} tokens with "
             f"{plural_of(per_teacher, 'record')} per teacher" + (f", {shown_public} tokens of public examples"
                                                                   if shown_public else "")
             + f" and --max-tokens {spec.max_tokens}")
    try:
        fitted = fit_records(records, max_tokens=limit, count_tokens=count_tokens, on_long=spec.long_records,
                             field=task.text_key, keep_places=True)
    except RecordsTooLongError as exc:
        raise RunInputError(f"argument --long-records refuse: {exc.count} of {len(records)} records are longer than "
                            f"{limit} tokens, {share}; use --long-records truncate or skip, more teachers or a "
                            "smaller --max-tokens") from None
    except ValueError as exc:
        raise RunInputError(f"argument --long-records {spec.long_records}: {exc}") from None
    if announce and fitted.too_long:
        done = "truncated to" if spec.long_records == "truncate" else "skipped: longer than"
        print(f"pate-accountant: {fitted.too_long} of {len(records)} records {done} {limit} tokens ({share})",
              file=sys.stderr, flush=True)
    return list(fitted.records)


def group_prompts(records, num_teachers: int, groups: int, rng: np.random.Generator,
                  template: PromptTemplate = INSTRUCTIONS, records_per_teacher: int | None = None,
                  placement: list | None = None) -> list[tuple[str, list[str]]]:
    """``(shared_prefix, prompts)`` of each group's teachers: the records placed at random in the public slots of
    ``num_teachers`` teachers, ``records_per_teacher`` each (:func:`~ensembles.data.place_records`; default
    ``ceil(len(records) / num_teachers)``, for callers whose number of records is public), the teachers taken in
    order into ``groups`` equal groups.  A record's teacher and group depend on the random draw only, never on the
    records' contents, and one record changed, added or removed changes at most one teacher's prompt, in one group
    (docs/privacy_unit.md).  A ``None`` holds the place of a record skipped for its length
    (:func:`_fit_to_window`): its teacher shows the others only.  ``placement``: a list that receives the
    :class:`~ensembles.data.Placement` (counts for the operator's screen)."""
    records = list(records)
    if records_per_teacher is None:
        records_per_teacher = max(1, math.ceil(len(records) / num_teachers))
    placed = place_records(records, num_teachers, records_per_teacher, rng)
    if placement is not None:
        placement.append(placed)
    parts = [[record for record in part if record is not None] for part in placed.parts]  # a skipped record's place
    size = num_teachers // groups
    return [teacher_prompts(parts[g * size:(g + 1) * size], template, allow_empty=True) for g in range(groups)]


def run_prompts(shown, spec, plan: _RunPlan, rng: np.random.Generator, template: PromptTemplate,
                announce: bool = False, public_blocks: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """Each group's ``(shared_prefix, prompts)`` for a run: without labels, the records (``shown``, fitted to the
    window, ``None`` for a skipped one) placed among all ``spec.teachers`` teachers (:func:`group_prompts`); with
    labels, each label's records among its own ``plan.group_teachers`` teachers, from a random stream of its own
    (``rng.spawn``), so a record that changes label changes its old and its new label's placement only.  Every
    teacher shows at most ``plan.per_teacher`` records.  With ``announce``, one line on stderr counts records left
    out for want of a place and teachers left without a record (counts describe the data: this screen only).
    ``public_blocks`` (:func:`~pate_app.run.public.teacher_public_blocks`): each group's public examples, appended to
    its shared prefix (public: the placement of the records does not move)."""
    placements: list = []
    if plan.places is None:
        ensembles = group_prompts(shown, spec.teachers, plan.groups, rng, template, plan.per_teacher, placements)
    else:
        streams = rng.spawn(len(plan.labels))
        ensembles = [group_prompts([shown[i] for i in plan.places[label]], plan.group_teachers, 1, stream,
                                   template.for_label(label), plan.per_teacher, placements)[0]
                     for label, stream in zip(plan.labels, streams)]
    if announce:
        real = sum(1 for record in shown if record is not None)
        dropped = real - sum(1 for p in placements for part in p.parts for r in part if r is not None)
        left = sum(1 for p in placements for part in p.parts if not any(r is not None for r in part))
        if dropped or left:
            where = "a label's" if plan.places is not None else "the"
            print(f"pate-accountant: {dropped} record(s) found no place in {where} teachers' "
                  f"{plan.per_teacher} record(s) each, and {left} teacher(s) show no record (--records-per-teacher "
                  "K sets the places)", file=sys.stderr, flush=True)
    if public_blocks is not None:
        ensembles = [(prefix + block, prompts) for (prefix, prompts), block in zip(ensembles, public_blocks)]
    return ensembles
