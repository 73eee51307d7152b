"""What the public model is shown, and the public support it is measured on (docs/generation.md, "Public
examples"): the public examples as the template shows records (:func:`public_block`; with
``--teachers-see-public``, every teacher's too: :func:`teacher_public_blocks`), the public model's prompt of each
group (:func:`public_prompt_list`), and ``--public-top-k auto`` (:func:`_size_public_support`,
:func:`measure_public_support`, :func:`public_support_contexts`).  Public records only: nothing here is charged."""

from __future__ import annotations

import sys

import attr

from ensembles.backends import transformers_backend as tb
from ensembles.support_size import measure_top_k
from pate_app.errors import RunInputError
from pate_app.library_output import quiet_libraries
from pate_app.run.backends import _public_backend, loading_model
from pate_app.spec import load_public_examples

__all__ = ["measure_public_support", "public_block", "public_prompt_list", "public_support_contexts",
           "teacher_public_blocks"]


def public_block(template, examples, label=None) -> str:
    """The public examples (with a label, that label's only) as ``template`` shows a record, one after another: what
    the public model's prompt shows before its open slot, and with ``--teachers-see-public`` what every teacher's
    prompt shows before its own records."""
    own = template if label is None else template.for_label(label)
    return "".join(own.format_example(r) for r in examples if label is None or r["label"] == label)


def teacher_public_blocks(spec, template, examples, labels, groups: int) -> list[str] | None:
    """``--teachers-see-public``: the public block each group's teachers show after the template's header (with
    labels, the group's label's own examples); ``None`` when the option is off.  Public data only: every teacher
    of a group shows the same block, so one record still changes one teacher's prompt (docs/privacy_unit.md)."""
    if not spec.teachers_see_public:
        return None
    if labels is None:
        return [public_block(template, examples)] * groups
    return [public_block(template, examples, label) for label in labels]


def public_prompt_list(template, examples, labels, groups: int, model, max_tokens: int) -> list[str]:
    """The public model's prompt (after the template's header, its shared prefix, the label's own with labels) of
    each group: the public
    examples (:func:`~pate_app.spec.load_public_examples`; with labels, the group's label's only) shown as the
    template shows a record, then the open slot (docs/generation.md, "Public examples").  Without examples, the
    open slot alone.  No private record is ever in it.  A prompt that leaves no room for ``max_tokens`` new tokens
    in the model's window is refused (its tokenizer only, before the ledger is claimed)."""
    def prompt(label) -> str:
        return public_block(template, examples, label) + (template if label is None else
                                                          template.for_label(label)).open_slot

    prompts = [prompt(None)] * groups if labels is None else [prompt(label) for label in labels]
    if examples:
        with quiet_libraries(drop_stderr=True):
            count_tokens, window, _ = tb.token_window(model)
        headers = [template.header] * len(prompts) if labels is None else [template.for_label(x).header
                                                                          for x in labels]
        longest = max(count_tokens(h + p) for h, p in zip(headers, prompts))
        if longest + max_tokens > window:
            raise RunInputError(f"argument --public-examples: the public model's prompt takes {longest} tokens, which "
                                f"with --max-tokens {max_tokens} does not fit the model's window of {window}: use "
                                "fewer or shorter public examples")
    return prompts


def _size_public_support(spec, task, model, labels, *, announce: bool):
    """``spec`` with ``public_top_k = "auto"`` replaced by the size measured on its public examples
    (:func:`measure_public_support`), and the :class:`~ensembles.support_size.SupportSize`; any other spec as it
    is, and ``None``.  Before the noise is checked against the support and before the ledger."""
    if spec.public_top_k != "auto":
        return spec, None
    size = measure_public_support(task.template, load_public_examples(spec, task), labels, model, spec.threads)
    if announce:
        print(f"pate-accountant: the public support: the top {size.top_k} tokens hold {size.covered:.0%} of the "
              f"{size.positions} tokens of the public examples (a top 50: {size.covered_by_50:.0%})",
              file=sys.stderr, flush=True)
    return attr.evolve(spec, public_top_k=size.top_k), size


def measure_public_support(template, examples, labels, model, threads=None):
    """The public top-k of ``--public-top-k auto``: the smallest that holds 90 % of the tokens of the public
    ``examples``, each continued from its label's public prompt without it
    (:func:`~ensembles.support_size.measure_top_k` over :func:`public_support_contexts`).  Public records only, so
    nothing is charged and the size is public.  :class:`RunInputError` for too few examples (two of each label)."""
    groups = [examples] if labels is None else [[e for e in examples if e["label"] == label] for label in labels]
    if any(len(group) < 2 for group in groups):
        raise RunInputError("--public-top-k auto sizes the support on the public examples, each continued from the "
                            "others: it needs --public-examples with at least two records"
                            + (" of each label" if labels is not None else ""))
    try:
        contexts = public_support_contexts(template, examples, labels)
    except ValueError as exc:
        raise RunInputError(f"--public-top-k auto: {exc}") from None
    with loading_model(announce=False):
        backend = _public_backend(model, threads)
    with quiet_libraries(drop_stderr=True):
        return measure_top_k(backend, contexts)


def public_support_contexts(template, examples, labels) -> list[tuple[str, str, str]]:
    """The public examples as :func:`~ensembles.support_size.measure_top_k` measures the public support on them:
    for each example, ``(header, prompt, continuation)``, the prompt the public model writes its label's records
    from (:func:`public_prompt_list`) without that example, and the example as the template shows it after the open
    slot (the text the model would have to write, the stop included).  Public records only.  A template whose
    example does not start with its open slot has no such continuation: ``ValueError`` naming it."""
    out = []
    for label in [None] if labels is None else labels:
        own = template if label is None else template.for_label(label)
        shown = [r for r in examples if label is None or r["label"] == label]
        for k, example in enumerate(shown):
            text = own.format_example(example)
            if not text.startswith(own.open_slot):
                raise ValueError(f"template {template.name!r}: its example does not start with its open slot, so a "
                                 "public example's continuation is not known; give the public support a size")
            prompt = "".join(map(own.format_example, shown[:k] + shown[k + 1:])) + own.open_slot
            out.append((own.header, prompt, text[len(own.open_slot):]))
    return out
