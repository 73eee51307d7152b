"""A private run in named stages (docs/demo.md): :func:`private_run` checks the task, fits the records, claims the
ledger, builds the ensemble, begins the run, generates, seals and reports, in that order, each stage a function of
the previous stage's value, which carries the spec as settled so far:

1. :func:`check_task` (:class:`Checked`): what the spec and the records alone decide, nothing written;
2. :func:`fit_records` (:class:`Fitted`): the model's path, the public support and examples, the records fitted to
   the model's window (its tokenizer only);
3. :func:`claim_ledger` (:class:`Claimed`): the data set's ledger found, checked and claimed before the model loads;
4. :func:`build_ensemble` (:class:`Built`): the model loaded, the records placed in the teachers' prompts;
5. :func:`begin_run` (:class:`Begun`): the run's metadata written to the ledger;
6. :func:`generate_records` (:class:`Generated`): the records, the groups taken in turn;
7. :func:`seal` (:class:`Sealed`): what the budget still pays for, the ledger's heads, audit and signed checkpoint;
8. :func:`report`: the JSON-able result.

:func:`synthesize` is the Python API's name of :func:`private_run` (``pate_app.synthesize``).
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
import sys
from pathlib import Path

import attr
import numpy as np

from ensembles.generation import PrivateGenerator
from mechanisms.base import reads_distributions
from pate_accountant import __version__
from pate_accountant.errors import PateAccountantError
from pate_accountant.ledger import STORAGE_ERRORS, describe_mechanism
from pate_app.errors import RunInputError
from pate_app.privacy_unit import TEACHER_RELATION
from pate_app.run.backends import _backends, _resolve_model, check_workers, loading_model
from pate_app.run.checks import _plan_run, _RunPlan, fit_teachers, release_rule, zcdp_charge_warning
from pate_app.run.interrupt import _Interrupted, _Interruptible, _StopOnInterrupt
from pate_app.run.ledger import (
    _check_affords,
    _check_existing_ledger,
    _check_one_partition,
    _claim_ledger,
    _close,
    _dataset_ledger,
    _discard,
    _LedgerPlace,
    _ledger_state,
    _pays_for_records,
    _records_afforded,
    _reread_ledger,
    _routed_dataset,
    _sign,
    _signing,
)
from pate_app.run.output import RunProgress, _open_out, _out_entry, _out_file, _record_text, _summary
from pate_app.run.prompts import _fit_to_window, run_prompts
from pate_app.run.public import _size_public_support, public_prompt_list, teacher_public_blocks
from pate_app.run.public_only import public_only_run
from pate_app.spec import RunSpec, Task, load_public_examples, load_task, task_from_records

__all__ = ["Begun", "Built", "Checked", "Claimed", "Fitted", "Generated", "Sealed", "begin_run", "build_ensemble",
           "check_task", "claim_ledger", "fit_records", "generate_records", "private_run", "report", "run_metadata",
           "seal", "synthesize"]


def private_run(spec, *, records=None, progress: bool = False, command: str = "generate", ledger_home=None) -> dict:
    """Run the private generation ``spec`` (a :class:`~pate_app.spec.RunSpec`) end to end and return a JSON-able
    result (:mod:`pate_app.run`); :func:`pate_app.synthesize` is the public name of this call.

    ``records``: records held in memory (dicts the template shows; :func:`~pate_app.spec.task_from_records`)
    instead of the file ``spec.data``; ``progress``: the progress bar and one-line notices on stderr;
    ``command``: the command named in the run metadata; ``ledger_home``: the ledger home (a
    :class:`~pate_accountant.ledger_home.LedgerHome` or its folder; default the user's) whose index finds the data
    set's ledger (by any record it shares with a registered data set) and refuses another; ``False``: the caller
    manages its budgets itself (the documented opt-out, docs/ledger.md): no index is read or written, and
    ``spec.ledger`` is required.

    The spec's values were checked when it was built.  What is checked here comes in order of cost, and all of it
    before anything is written: the data and task alone (records, labels, template, teachers, mechanism, accountant
    and budget; :func:`~pate_app.run.checks._plan_run`), then the model's path (the embedded one converted once),
    then the records against the model's window with its tokenizer only (``spec.long_records``: refuse, truncate or
    skip a record too long for its share of the window; counts on stderr, never a text), then the ledger, which is
    claimed before the model loads.

    The data set's ledger: ``spec.ledger`` (created if missing, appended to if it exists); ``None``: the one the
    ledger home keeps for these records, found by their fingerprint.  A ledger other than the one the home has
    registered for the same records is refused (one budget per data set, docs/ledger.md), except for the bundled
    sample (public and invented, so a second budget harms nobody; without ``spec.ledger`` its runs still share
    the home's one ledger).  An existing ledger must have the same data set name, accountant and budget.

    ``spec.groups``: the records split at random into that many disjoint groups of ``teachers / groups`` teachers,
    each with its own share of the records requested (taken in turn); the data set's accountant charges each as a
    parallel group (:meth:`~pate_accountant.accountants.base.Accountant.parallel_groups`: the run costs what its
    costliest group costs), docs/groups.md.  ``spec.labels``: one group per label of this public list (each
    label's records make its own teachers; ``spec.per_label`` records of each, else ``spec.records`` in turn).
    ``spec.workers``/``spec.ray_address``: teacher shards (docs/distributed.md).  ``spec.public_mix``/
    ``spec.public_top_k``: the public prior, data-independent, so free.  ``spec.out``: a new file (JSON lines,
    or CSV by its name) that gets each record as it finishes (:mod:`pate_app.records_out`).
    ``spec.signing_key``: a run whose ledger verifies ends with a signed checkpoint of its head.
    ``spec.seed``: for reproducible tests only (:mod:`pate_app.run`, "Seeds").

    Interrupts: the first Ctrl-C (SIGINT, in the main thread) stops the run at the next step boundary, or at once
    inside a model call (nothing is charged there), keeping every finished record and the charges made; the result
    then says ``"interrupted": true``.  A second one interrupts at once.

    The result's ``spent`` is the data set's total spent after this run (every run in the ledger) and
    ``spent_before`` what it was when this run started.  Raises :class:`RunInputError` before anything is
    written.
    """
    if not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec, got {type(spec).__name__}")
    bundled = records is None and spec.data == "bundled"  # public and invented: a second budget harms nobody
    task = load_task(spec) if records is None else task_from_records(spec, records)
    if spec.public_only:
        return public_only_run(spec, task, progress=progress, command=command)
    checked = check_task(spec, task)
    fitted = fit_records(checked, announce=progress)
    claimed = claim_ledger(fitted, ledger_home, bundled=bundled, announce=progress)
    try:
        with contextlib.ExitStack() as stack:  # stops the shards' workers, whatever happens
            built = build_ensemble(claimed, stack, announce=progress)
            begun = begin_run(built, command=command)
            generated = generate_records(begun, stack, progress=progress)
            sealed = seal(generated)
    except BaseException:
        _discard(claimed.ledger)  # a ledger this run created and nobody used is removed; any other is closed
        raise
    _close(sealed.ledger)
    return report(sealed, command=command)


def synthesize(spec: RunSpec, *, records=None, progress: bool = False, ledger_home=None) -> dict:
    """Run ``spec``: load its records (or take ``records``, dicts, held in memory:
    :func:`~pate_app.spec.task_from_records`) and its template, resolve its model (``embedded``: the shipped SmolLM2)
    and generate privately (:func:`private_run`); the JSON-able result, with ``"spec"`` its shareable part.  Raises
    :class:`~pate_app.spec.RunInputError` (or :class:`~pate_app.spec.SpecError`) for bad input, before anything is
    charged.

    One budget per data set holds here as in ``generate``: the ledger home (``ledger_home``, default the user's)
    charges records it has seen to their ledger.  ``ledger_home=False`` is the explicit opt-out for callers that
    manage budgets themselves (``spec.ledger`` is then required and no index is read or written)."""
    return private_run(spec, records=records, progress=progress, ledger_home=ledger_home)


def _then(kind, previous, **values):
    """The next stage's value: ``previous``'s fields, with ``values`` added (or, for ``spec``, replaced), as
    ``kind``."""
    return kind(**{**{field.name: getattr(previous, field.name) for field in attr.fields(type(previous))}, **values})


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Checked:
    """What :func:`check_task` settles from the spec and the records alone."""

    #: The run's description, its teachers fitted to the data.
    spec: RunSpec
    task: Task
    plan: _RunPlan
    #: The ``--out`` file, checked to be new (``None`` without ``--out``).
    out_file: Path | None

    @property
    def budget(self) -> tuple:
        """The data set's budget ``(epsilon, delta)``."""
        return float(self.spec.budget_epsilon), float(self.spec.budget_delta)


def check_task(spec, task) -> Checked:
    """Check the task: what the spec and the records alone decide, cheapest first and before anything is written (no
    model, no ledger): the teachers fitted to the data when ``--teachers`` was not given
    (:func:`~pate_app.run.checks.fit_teachers`), the labels, groups, template, mechanism and its threshold,
    accountant and budget (:func:`~pate_app.run.checks._plan_run`), the ``--out`` file and the shards
    (:func:`~pate_app.run.backends.check_workers`)."""
    spec = fit_teachers(spec, task)
    plan = _plan_run(spec, task)
    out_file = _out_file(spec)
    check_workers(spec.workers, spec.teachers, spec.ray_address, spec.ray_timeout)
    return Checked(spec=spec, task=task, plan=plan, out_file=out_file)


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Fitted(Checked):
    """What :func:`fit_records` adds with the model's path and tokenizer (``spec``: its public support sized)."""

    #: The model's folder or file (the embedded one converted).
    model: object
    #: The model's name for the header, the result and the ledger.
    model_label: str
    #: The public support measured for ``--public-top-k auto`` (else ``None``).
    support: object
    public_examples: tuple
    #: Each group's public block with ``--teachers-see-public`` (else ``None``).
    blocks: list | None
    #: The records fitted to the window in their places (``None`` for a skipped one).
    shown: list
    #: The public model's prompt of each group.
    public_prompts: list


def fit_records(checked: Checked, *, announce: bool) -> Fitted:
    """Fit the records: the model's path (the embedded model converted once), the public support of
    ``--public-top-k auto`` measured on the public examples, the public examples, and each record fitted to its
    share of the model's window by ``--long-records`` with the tokenizer only
    (:func:`~pate_app.run.prompts._fit_to_window`, which also checks the noise against the vocabulary); the public
    model's prompts.  Still nothing written; with ``announce``, what was done is said on stderr (counts only)."""
    spec, task, plan = checked.spec, checked.task, checked.plan
    model, label = _resolve_model(spec, announce=announce)
    spec, support = _size_public_support(spec, task, model, plan.labels, announce=announce)
    examples = load_public_examples(spec, task)
    blocks = teacher_public_blocks(spec, task.template, examples, plan.labels, plan.groups)
    shown = _fit_to_window(spec, task, plan, model, announce=announce, public_blocks=blocks)
    public_prompts = public_prompt_list(task.template, examples, plan.labels, plan.groups, model, spec.max_tokens)
    return _then(Fitted, checked, spec=spec, model=model, model_label=label, support=support,
                 public_examples=examples, blocks=blocks, shown=shown, public_prompts=public_prompts)


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Claimed(Fitted):
    """What :func:`claim_ledger` adds: the data set's ledger, claimed."""

    place: _LedgerPlace
    #: The data set charged (the one the ledger home keeps for these records, when it chose the ledger).
    dataset: str
    ledger: object
    #: The data set's accountant, attached to the ledger.
    acct: object
    #: The signing key (``None`` without ``--signing-key``) and the checkpoints file.
    key: object
    checkpoints: Path | None
    #: Whether the ledger existed before this run (appended to).
    existing: bool


def claim_ledger(fitted: Fitted, ledger_home, *, bundled: bool, announce: bool) -> Claimed:
    """Claim the ledger, before the model loads: the data set's ledger, found by the ledger home's index
    (``ledger_home``; ``spec.ledger`` refused when the home keeps these records elsewhere, except for the ``bundled``
    sample), its folder and the signing key checked, an existing ledger checked read-only (data set, accountant,
    budget, relation), then claimed (:func:`~pate_app.run.ledger._claim_ledger`: created, or joined) and registered
    in the index.  A refusal leaves nothing behind."""
    spec, task, plan = fitted.spec, fitted.task, fitted.plan
    register = spec.ledger is None or not bundled
    place = _dataset_ledger(ledger_home, list(task.records), task.dataset, spec.ledger, check=register,
                            text_key=task.text_key)
    dataset = task.dataset
    if spec.ledger is None:  # the index chose the ledger: the data set is the one it keeps
        dataset = _routed_dataset(place, dataset, spec.dataset, announce=announce)
    location, budget = place.location, fitted.budget
    try:
        if not place.is_url and not location.parent.is_dir():
            raise RunInputError(f"ledger folder {str(location.parent)!r} does not exist")
        key, checkpoints = _signing(spec.signing_key, spec.checkpoints, location)
        if place.is_url or location.exists():
            _check_existing_ledger(location, dataset, spec.accountant, budget, plan.mechanism,  # read-only
                                   plan.group_teachers, plan.relation)
        ledger, acct = _claim_ledger(location, dataset, spec.accountant, budget, plan.mechanism, plan.group_teachers,
                                     plan.relation)
        try:  # the index learns the data set's ledger once it is claimed; of two runs racing, the first one wins
            if register:
                place.register()
        except (PateAccountantError, OSError, sqlite3.Error) as exc:
            _discard(ledger)
            raise RunInputError(f"{place.where}: {exc}") from None
    finally:
        place.close()
    return _then(Claimed, fitted, place=place, dataset=dataset, ledger=ledger, acct=acct, key=key,
                 checkpoints=checkpoints, existing=not ledger.created_here)


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Built(Claimed):
    """What :func:`build_ensemble` adds: the loaded model and the teachers' prompts."""

    #: The teachers' backend and the public fallback's.
    backend: object
    public: object
    #: The run's random stream (seeded only by ``spec.seed``).
    rng: np.random.Generator
    #: Each group's ``(shared_prefix, prompts)``.
    ensembles: list


def build_ensemble(claimed: Claimed, stack: contextlib.ExitStack, *, announce: bool) -> Built:
    """Build the ensemble: load the model (the teachers' backend, in shards or Ray actors, and the public fallback's,
    closed by ``stack``), place the fitted records in each group's teachers' prompts
    (:func:`~pate_app.run.prompts.run_prompts`), and refuse prompts that do not fit the model's window before the run
    begins."""
    spec = claimed.spec
    with loading_model(announce):
        backend, public = _backends(stack, claimed.model, spec.threads, spec.workers, spec.ray_address)
    rng = np.random.default_rng(spec.seed)
    ensembles = run_prompts(claimed.shown, spec, claimed.plan, rng, claimed.task.template, announce=announce,
                            public_blocks=claimed.blocks)
    try:  # prompts that do not fit the context window: refused before the run begins
        for shared_prefix, prompts in ensembles:
            backend.check_prompts(prompts, shared_prefix)
    except ValueError as exc:
        raise RunInputError(f"--teachers {spec.teachers}: {exc} (use more teachers or shorter records)") from None
    return _then(Built, claimed, backend=backend, public=public, rng=rng, ensembles=ensembles)


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Begun(Built):
    """What :func:`begin_run` adds: the run, written to the ledger."""

    metadata: dict
    #: The data set's total spent when this run began.
    spent_before: tuple
    run_id: int
    #: Each group's accountant (the data set's own with one group).
    accountants: list


def begin_run(built: Built, *, command: str) -> Begun:
    """Begin the run: its metadata (:func:`run_metadata`), the warnings a user should hear (a zCDP step charged as
    epsilon-delta, a seeded run), a last check that the budget pays for a step (runs that charged the ledger while
    the model loaded count), the run written to the ledger, and each group's accountant."""
    spec, plan, acct, ledger, where = built.spec, built.plan, built.acct, built.ledger, built.place.where
    metadata = run_metadata(built, command)
    looser = zcdp_charge_warning(plan.mechanism, spec.accountant)
    if looser is not None:
        print(f"pate-accountant: warning: {looser}", file=sys.stderr, flush=True)
    if spec.seed is not None:
        print("pate-accountant: warning: this run is seeded, so it has no privacy against anyone who knows "
              "the seed (they can re-run both neighbouring data sets and compare); the seed is not recorded. "
              "Leave --seed out for a private run.", file=sys.stderr, flush=True)
    # can_afford catches up on runs that charged the ledger while the model loaded
    _check_affords(acct, plan.mechanism, where, built.dataset, built.budget)
    spent_before = tuple(float(x) for x in acct.spent())
    try:
        run_id = ledger.begin_run(metadata)
    except STORAGE_ERRORS as exc:  # a read-only file or folder, a full disk: nothing is charged yet
        raise RunInputError(f"{where}: cannot write to it: {exc}") from None
    _check_one_partition(acct, ledger, where, run_id)
    accountants = [acct] if plan.groups == 1 else list(acct.parallel_groups(plan.groups, touches=plan.touches))
    return _then(Begun, built, metadata=metadata, spent_before=spent_before, run_id=run_id, accountants=accountants)


def run_metadata(built: Built, command: str) -> dict:
    """The run's metadata as the ledger records it: the mechanism's parameters, accountant, budget, whether the
    run was seeded (never the seed), the software version, the data set, the model, the teachers and groups, the
    privacy unit, the options and the shareable spec.  No record, no count of records."""
    spec, plan, template, support = built.spec, built.plan, built.task.template, built.support
    return {
        "command": command,
        "mechanism": describe_mechanism(plan.mechanism),
        "mechanism_name": spec.mechanism,
        "release_rule": release_rule(plan.mechanism, plan.group_teachers),
        "accountant": spec.accountant,
        "budget": {"epsilon": built.budget[0], "delta": built.budget[1]},
        "seeded": spec.seed is not None,
        "software_version": __version__,
        "dataset": built.dataset,
        "dataset_fingerprint": built.place.fingerprint,
        "model": built.model_label,
        "data": built.task.data_label,
        "num_teachers": spec.teachers,
        "groups": plan.groups,
        "teachers_per_group": plan.group_teachers,
        "labels": plan.labels,
        "privacy_unit": "record",
        "record_relation": plan.relation,
        "teacher_relation": TEACHER_RELATION,
        "groups_a_record_touches": plan.touches,
        "records_per_teacher": plan.per_teacher,
        "template": template.name,
        "long_records": spec.long_records,
        "public_mix": spec.public_mix,
        "public_top_k": spec.public_top_k,
        "public_support_measured": None if support is None else support.as_dict(),
        "public_examples": len(built.public_examples),
        "teachers_see_public": spec.teachers_see_public,
        "records_requested": spec.requested,
        "max_tokens": spec.max_tokens,
        "histograms": spec.histograms,
        "subsample_teachers": spec.subsample_teachers,
        "fallback": "public (same model, shared prefix only)",
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "stop": template.stop,
        "workers": spec.workers,
        "executor": "ray" if spec.ray_address is not None else "in-process",
        "spec": spec.shareable(),
    }


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Generated(Begun):
    """What :func:`generate_records` adds: the records and how the generation ended."""

    records: list
    #: The ``--out`` writer (``None`` without ``--out``).
    writer: object
    #: The charged runs one whole record may take, in each group's accountant's counts.
    record_steps: list
    #: Every charged run of this run, those of a record a Ctrl-C or a ledger failure dropped included.
    charged: int
    interrupted: bool
    #: Why the ledger could not take a charge, when it could not (the run stopped there).
    storage_error: str | None


def generate_records(begun: Begun, stack: contextlib.ExitStack, *, progress: bool) -> Generated:
    """Generate: each group's :class:`~ensembles.generation.PrivateGenerator` on the teachers' backend (the public
    model's fallback beside it), the progress bar, the ``--out`` file (closed by ``stack``) and Ctrl-C
    (:class:`~pate_app.run.interrupt._StopOnInterrupt`, entered here), then the records, the groups taken in turn
    (:func:`_take_turns`).  A Ctrl-C keeps the finished records (the one under way is dropped, its charges stay in the
    ledger); a ledger that cannot take a charge stops the run, keeping the finished records."""
    spec, plan, mech = begun.spec, begun.plan, begun.plan.mechanism
    stop = _StopOnInterrupt(on_request=begun.ledger.interrupt)  # entered once the generation begins
    # a first Ctrl-C inside a model call (a long prefill) stops the run at once
    backend, public = _Interruptible(begun.backend, stop), _Interruptible(begun.public, stop)
    generators = [PrivateGenerator(
        backend, mech, group_acct, histograms=spec.histograms, fallback="public", public_backend=public,
        public_prompt=begun.public_prompts[g], max_tokens=spec.max_tokens, stop_strings=(begun.task.template.stop,),
        top_p=None if reads_distributions(mech) else spec.top_p, temperature=spec.temperature,
        public_mix=spec.public_mix,
        public_support=spec.public_top_k,
    ) for g, group_acct in enumerate(begun.accountants)]
    bar = RunProgress(spec.requested, progress)
    out_records, storage_error, interrupted = [], None, False
    writer = _open_out(stack, begun.out_file, spec, plan.labels)
    stack.enter_context(stop)
    # the charged runs one record may take at most (one per token position: the fallback is public), in the
    # counts of each group's accountant (a plain one counts a labelled step twice itself; a view scales)
    record_steps = [spec.max_tokens * (plan.touches if a is begun.acct else 1) for a in begun.accountants]
    try:
        _take_turns(begun, generators, record_steps, bar, stop, writer, out_records)
    except _Interrupted:
        interrupted = True  # the record under way is dropped; its charges stay in the ledger
    except STORAGE_ERRORS as exc:
        # The ledger could not take a charge (a full disk, a file made read-only meanwhile, a database
        # server gone): the failed charge released nothing (the accountant raised before its mechanism's
        # output left), so the run stops here, keeping the finished records; the ledger holds every charge
        # made before.
        storage_error = (f"the ledger {begun.place.shown!r} could not be written ({exc}): the run stopped "
                         f"after {len(out_records)} finished record(s)")
    finally:
        bar.close()
    return _then(Generated, begun, records=out_records, writer=writer, record_steps=record_steps,
                 charged=bar.charged, interrupted=interrupted, storage_error=storage_error)


def _take_turns(begun: Begun, generators, record_steps, bar, stop, writer, out_records: list) -> None:
    """The records, appended to ``out_records`` (and ``writer``'s ``--out``) as each ends: the groups whose budget
    is not spent taken in turn, each group's record from its own teachers, until ``spec.requested`` records (with
    ``--per-label``, that many of each label) or no group's budget pays for another; without ``--cut-records`` a
    record starts only when its group's budget pays for all of its steps.  ``stop`` is checked after every step
    and between records."""
    spec, plan, mech, rng = begun.spec, begun.plan, begun.plan.mechanism, begun.rng

    def on_step(outcome: str) -> None:
        bar.step(outcome)
        stop.check()  # a Ctrl-C: stop here, after this step's charge

    turns = collections.deque(range(plan.groups))  # groups whose budget is not spent, taken in turn
    made = [0] * plan.groups
    while len(out_records) < spec.requested and turns:
        g = turns.popleft()
        if not spec.cut_records and not _pays_for_records(begun.accountants[g], mech.event, record_steps[g]):
            continue  # its budget may not pay for a whole record: the group ends between records
        bar.record_starts()
        shared_prefix, prompts = begun.ensembles[g]
        result = generators[g].generate(prompts, shared_prefix=shared_prefix, rng=rng,
                                        mechanism_rng=rng if spec.seed is not None else None,
                                        on_step=on_step)
        out_records.append(_private_record(spec, plan, g, result))
        bar.record_ends()
        if writer is not None:
            writer.write(out_records[-1])
        made[g] += 1
        if result.stop_reason != "budget" and (spec.per_label is None or made[g] < spec.per_label):
            turns.append(g)  # its next turn comes after every other group's
        stop.check()  # a Ctrl-C between records


def _private_record(spec, plan: _RunPlan, group: int, result) -> dict:
    """One record of the result (and of ``--out``) from group ``group``'s generation ``result``: its text, group or
    label, stop reason, whether it is complete, and its token counts (outcome classes only)."""
    counts = result.outcome_counts()
    return {
        "text": _record_text(spec, result.text),
        **({"group": group} if plan.groups > 1 else {}),
        **({"label": plan.labels[group]} if plan.labels is not None else {}),
        "stop_reason": result.stop_reason,
        "complete": result.stop_reason != "budget",
        "num_tokens": counts.get("token", 0) + counts.get("fallback", 0),  # end of text included
        "charged_runs": result.num_charged_runs,
        "outcomes": counts,
        "private_tokens": counts.get("token", 0),
        "fallback_tokens": counts.get("fallback", 0),
    }


@attr.s(frozen=True, auto_attribs=True, kw_only=True)
class Sealed(Generated):
    """What :func:`seal` adds: the budget and the ledger as the run leaves them."""

    #: The data set's total spent after this run (every run in the ledger).
    spent: tuple
    #: Whether the budget pays for one more step of this mechanism, and the whole records it pays for.
    another_step: bool
    records_afforded: int | None
    #: The ledger's heads, this run's rows and the ledger's audit.
    heads: dict
    run_rows: int | None
    verdict: object
    #: What the result reports of the signed checkpoint, or why none was written.
    checkpoint: dict | None
    checkpoint_error: str | None


def seal(generated: Generated) -> Sealed:
    """Seal: what the data set's budget has spent and still pays for (one more step; whole records, every step
    charged), the ledger's heads and audit (read afresh when the run's connection broke), and with
    ``--signing-key`` a signed checkpoint of its verified head (none when the run stopped on a ledger that could
    not be written; a checkpoint that cannot be written is reported, never loses the run)."""
    acct, plan, mech, key = generated.acct, generated.plan, generated.plan.mechanism, generated.key
    spent = tuple(float(x) for x in acct.spent())
    try:  # whether the data set's budget pays for one more step of this mechanism (a next run)
        another_step = bool(acct.can_afford(mech.event, plan.touches))  # a step of a labelled run counts twice
    except (PateAccountantError, *STORAGE_ERRORS):
        another_step = False
    try:  # the whole records the groups' budgets still pay for, every step charged
        records_afforded = sum(_records_afforded(a, mech.event, k)
                               for a, k in zip(generated.accountants, generated.record_steps))
    except (PateAccountantError, *STORAGE_ERRORS):
        records_afforded = None
    try:
        heads, run_rows, verdict = _ledger_state(generated.ledger, generated.run_id)
    except STORAGE_ERRORS as exc:  # the connection to a database ledger is gone: read it afresh
        heads, run_rows, verdict = _reread_ledger(generated.place.location, generated.run_id, exc)
    checkpoint, checkpoint_error = None, None
    if key is not None and generated.storage_error is not None:
        checkpoint_error = ("the run stopped on a ledger that could not be written, so nothing was signed: "
                            "sign its head once it audits")
    elif key is not None and verdict.ok:
        try:
            checkpoint = _sign(generated.ledger, key, verdict, generated.checkpoints)
        except (OSError, PateAccountantError) as exc:  # the budget is spent: report, never lose the run
            checkpoint_error = (f"the signed checkpoint was not written to {str(generated.checkpoints)!r}: "
                                f"{getattr(exc, 'strerror', None) or exc}")
    return _then(Sealed, generated, spent=spent, another_step=another_step, records_afforded=records_afforded,
                 heads=heads, run_rows=run_rows, verdict=verdict, checkpoint=checkpoint,
                 checkpoint_error=checkpoint_error)


def report(sealed: Sealed, *, command: str) -> dict:
    """Report: the run's JSON-able result (the module docstring of :mod:`pate_app.run`): the records and their
    summary, what was spent before and after and what remains, the ledger's heads and audit, the parameters.  No
    prompt text, no seed."""
    spent, before, budget, verdict, heads = (sealed.spent, sealed.spent_before, sealed.budget, sealed.verdict,
                                             sealed.heads)
    out_records, metadata = sealed.records, sealed.metadata
    return {
        "command": command,
        "records": out_records,
        "summary": _summary(out_records, sealed.spec.requested),
        "interrupted": sealed.interrupted,
        "out": _out_entry(sealed.out_file, sealed.writer, sealed.spec),
        "spent": {"epsilon": spent[0], "delta": spent[1]},
        "spent_before": {"epsilon": before[0], "delta": before[1]},
        "remaining": {**sealed.acct.remaining_budget().as_dict(), "another_step": sealed.another_step,
                      "records_afforded": sealed.records_afforded},
        "budget": {"epsilon": budget[0], "delta": budget[1]},
        "within_budget": bool(spent[0] <= budget[0] * (1 + 1e-9) and spent[1] <= budget[1] * (1 + 1e-9)),
        # every charged run of this run, those of a record a Ctrl-C or a ledger failure dropped included
        "charged_runs": max(sealed.charged, sum(r["charged_runs"] for r in out_records)),
        "private_tokens": sum(r["private_tokens"] for r in out_records),
        "fallback_tokens": sum(r["fallback_tokens"] for r in out_records),
        "ledger": {"path": sealed.place.shown, "rows": heads["rows"], "head_hash": heads["head_hash"],
                   "run": sealed.run_id, "runs": heads["runs"], "run_head_hash": heads["run_head_hash"],
                   "run_rows": sealed.run_rows, "appended": sealed.existing, "dataset": sealed.dataset,
                   "checkpoint": sealed.checkpoint, "checkpoint_error": sealed.checkpoint_error,
                   "write_error": sealed.storage_error},
        "audit": {
            "ok": bool(verdict.ok),
            "message": verdict.message,
            "rows": verdict.rows,
            "spent": None if verdict.spent is None else {"epsilon": float(verdict.spent[0]),
                                                         "delta": float(verdict.spent[1])},
            "head_hash": verdict.head_hash,
        },
        "parameters": metadata,
        "spec": metadata["spec"],
    }
