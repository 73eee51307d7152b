"""The public model alone (``--public-only``; docs/generation.md, "The public model alone"): :func:`public_only_run`
checks the task as a private run does and shares its pieces (the model's path, the public examples and prompts,
the model's loading, ``--out``, the progress bar and Ctrl-C), with no teacher, mechanism or ledger."""

from __future__ import annotations

import contextlib

import numpy as np

from ensembles.generation import public_generate_many
from pate_accountant import __version__
from pate_app.run.backends import _public_backend, _resolve_model, loading_model
from pate_app.run.checks import _check_task
from pate_app.run.interrupt import _Interrupted, _Interruptible, _StopOnInterrupt
from pate_app.run.output import RunProgress, _open_out, _out_entry, _out_file, _record_text, _summary
from pate_app.run.public import public_prompt_list
from pate_app.spec import load_public_examples

__all__ = ["PUBLIC_ROWS", "public_only_run"]

#: The records of one label the public model alone writes side by side (:func:`public_only_run`).
PUBLIC_ROWS = 32


def public_only_run(spec, task, *, progress: bool = False, command: str = "generate") -> dict:
    """The public model alone (``spec.public_only``; docs/generation.md, "The public model alone"): each record is
    written by the model from the template's shared prefix, the public examples (``--public-examples``, the label's
    own with labels) and the open slot, which hold no private record
    (:func:`~pate_app.run.public.public_prompt_list`; :func:`~ensembles.generation.public_generate_many`, the draw a
    private run's public fallback makes; up to :data:`PUBLIC_ROWS` records of a label side by side), with no
    teacher, mechanism or ledger, so nothing is charged and no record reaches the model.  The records are read only
    to check the task as a private run does (the labels, the template); with labels, the records are asked for per
    label in turn and carry their label (the public model knows which label it writes for only from a template
    that names it, ``{label}``, and from the label's public examples).  The result has the shape of
    :func:`~pate_app.run.private_run`'s, with ``"public_only": true``, nothing spent and no ledger."""
    labels, _ = _check_task(spec, task)
    out_file = _out_file(spec)
    model, model_label = _resolve_model(spec, announce=progress)
    template, num_records = task.template, spec.requested
    examples = load_public_examples(spec, task)
    prompts = public_prompt_list(template, examples, labels, 1, model, spec.max_tokens)
    metadata = {"command": command, "public_only": True, "model": model_label, "data": task.data_label,
                "dataset": task.dataset, "labels": labels, "template": template.name, "records_requested": num_records,
                "max_tokens": spec.max_tokens, "temperature": spec.temperature, "top_p": spec.top_p,
                "stop": template.stop, "public_examples": len(examples), "seeded": spec.seed is not None,
                "software_version": __version__, "spec": spec.shareable()}
    out_records, interrupted = [], False
    with contextlib.ExitStack() as stack:
        with loading_model(progress):
            public = _public_backend(model, spec.threads)
        writer = _open_out(stack, out_file, spec, labels)
        stop = stack.enter_context(_StopOnInterrupt())
        public = _Interruptible(public, stop)
        bar = RunProgress(num_records, progress)
        try:
            _public_records(spec, template, labels, prompts, public, bar, stop, writer, out_records)
        except _Interrupted:
            interrupted = True
        finally:
            bar.close()
    return {
        "command": command, "public_only": True, "records": out_records,
        "summary": _summary(out_records, num_records),
        "interrupted": interrupted,
        "out": _out_entry(out_file, writer, spec),
        "spent": {"epsilon": 0.0, "delta": 0.0}, "charged_runs": 0, "private_tokens": 0,
        "fallback_tokens": sum(r["fallback_tokens"] for r in out_records),
        "ledger": None, "parameters": metadata, "spec": metadata["spec"],
    }


def _public_records(spec, template, labels, prompts, public, bar, stop, writer, out_records: list) -> None:
    """The records of a public-only run, appended to ``out_records`` (and ``--out``) as they are drawn: with
    labels, asked for per label in turn, as a private run asks; up to :data:`PUBLIC_ROWS` records of a label drawn
    side by side from its prompt (``prompts``, one a label); ``stop`` checked between batches."""
    rng = np.random.default_rng(spec.seed)
    num_records = spec.requested
    turns = [None] if labels is None else labels
    order = [turns[k % len(turns)] for k in range(num_records)]  # the labels in turn, as a private run asks
    for first in range(0, num_records, PUBLIC_ROWS * len(turns)):  # PUBLIC_ROWS records a label at once
        part = order[first:first + PUBLIC_ROWS * len(turns)]
        written = {}
        for turn, label in enumerate(turns):
            if label not in part:
                continue
            bar.record_starts()
            header = template.header if label is None else template.for_label(label).header
            written[label] = iter(public_generate_many(
                public, prompts[turn], part.count(label), shared_prefix=header, rng=rng,
                max_tokens=spec.max_tokens, stop_strings=(template.stop,), temperature=spec.temperature,
                top_p=spec.top_p, on_token=lambda _: bar.step("fallback", charged=False)))
        for label in part:
            result = next(written[label])
            drawn = len(result.token_ids) + (result.stop_reason == "eos")  # the end of text included
            out_records.append({"text": _record_text(spec, result.text),
                                **({"label": label} if label is not None else {}),
                                "stop_reason": result.stop_reason, "complete": True, "num_tokens": drawn,
                                "charged_runs": 0, "outcomes": {"fallback": drawn}, "private_tokens": 0,
                                "fallback_tokens": drawn})
            bar.record_ends()
            if writer is not None:
                writer.write(out_records[-1])
        stop.check()
