"""What a run is refused for before anything is written, from its spec and records alone (no model, no ledger).

The task (:func:`fit_teachers`, :func:`_plan_run` and the :class:`_RunPlan` it settles: labels, groups, mechanism,
accountant and budget), the records and teachers (:func:`check_inputs`), the groups (:func:`check_groups`), the
mechanism's release threshold (:func:`check_reachable`, :func:`release_rule`) and the noise that may decide its
releases (:func:`check_noise_floor`, :data:`NOISE_RELEASE_LIMIT`); a refusal of either ends with the nearest
configurations that run (:func:`run_refusal`, :func:`nearest_configurations`).  All of them read public settings
only: they never say anything about a record but counts.
"""

from __future__ import annotations

import math

import attr

from ensembles.data import split_by_label
from ensembles.generation import check_between_thresholds_reachable
from mechanisms import (
    BetweenThresholds,
    DPArgMax,
    DPWeightedSampling,
    GaussianAveragedDistributions,
    GaussianNoisyArgMax,
)
from mechanisms import registry as mechanisms_registry
from mechanisms.subsampled import SubsampledTeachers
from pate_accountant import planning
from pate_accountant import registry as accountants_registry
from pate_accountant.errors import PateAccountantError
from pate_app.errors import RunInputError
from pate_app.privacy_unit import default_teachers, record_relation, records_per_teacher
from pate_app.run.mechanism import build_accountant, _inner, spec_mechanism, voters

__all__ = ["NOISE_RELEASE_LIMIT", "check_groups", "check_inputs", "check_noise_floor", "check_reachable",
           "fit_teachers", "mechanisms_for", "nearest_configurations", "noise_release", "plural_of", "release_rule",
           "run_refusal", "zcdp_charge_warning"]


def check_inputs(records, num_teachers: int, mechanism, accountant_name: str, budget, touches: int = 1) -> None:
    """Refuse, before anything is charged: no records, more teachers than records, an accountant that does
    not support the mechanism's event, or a budget that cannot pay for a single step (``touches``: a step counted
    that many times, as a labelled run's steps are: docs/privacy_unit.md)."""

    if not records:
        raise RunInputError("the data set is empty: no records to give the teachers")
    if num_teachers < 1:
        raise RunInputError(f"--teachers must be at least 1, got {num_teachers}")
    if num_teachers > len(records):
        raise RunInputError(f"cannot give {num_teachers} teachers a record each: the data set has only "
                            f"{len(records)} usable records")
    probe = build_accountant(accountant_name, budget, mechanism=mechanism, num_teachers=num_teachers)  # in memory
    try:
        affordable = probe.can_afford(mechanism.event, touches)
    except PateAccountantError as exc:
        takes = mechanisms_for(accountant_name, mechanism, num_teachers)
        remedy = f" (it takes --mechanism {', '.join(takes)})" if takes else ""
        raise RunInputError(f"accountant {accountant_name} cannot account for this mechanism: {exc}{remedy}") from None
    if not affordable:
        stated = mechanism.event
        charge = (f" (a step is stated as epsilon {stated.epsilon:.4g}, delta {stated.delta:.3g})"
                  if isinstance(getattr(stated, "delta", None), float) else "")
        raise RunInputError(f"the budget (epsilon {budget[0]:g}, delta {budget[1]:g}) cannot pay for a single "
                            f"step of this mechanism under the {accountant_name} accountant{charge}")


def mechanisms_for(accountant_name: str, mechanism, num_teachers: int) -> list[str]:
    """The run mechanisms (at ``mechanism``'s step epsilon, delta and relation) whose events the accountant
    ``accountant_name`` accounts for, budget aside: the remedy a refusal names."""
    inner = _inner(mechanism)
    epsilon = getattr(inner, "epsilon", 1.0)
    delta = getattr(inner, "delta", None) or 1e-6
    relation = getattr(mechanism.event, "relation", None) or "replace-one"
    takes = []
    for name in mechanisms_registry.run_mechanism_names():
        try:
            candidate = mechanisms_registry.build_mechanism(name, epsilon, delta, relation, num_teachers=num_teachers)
            accountant = build_accountant(accountant_name, None, mechanism=candidate, num_teachers=num_teachers)
            accountant.can_afford(candidate.event)
        except (PateAccountantError, RunInputError, TypeError, ValueError):
            continue
        takes.append(name)
    return takes


def check_reachable(mechanism, num_teachers: int) -> None:
    """Refuse a mechanism whose release threshold is out of reach of ``n = num_teachers`` teachers, where
    every run would be charged and almost none could release (``RunInputError`` naming the threshold and n).

    * DPArgMax (plain or boundary-wrapped) releases the top token when its noisy count exceeds ``n/2 + L``
      (``L`` its error bound).  Even a unanimous vote ``c = n`` clears that only by noise when
      ``n <= n/2 + L``, i.e. ``n <= 2L``.
    * DPWeightedSampling keeps every count of at least ``2L`` once sampled (below it, survival needs noise);
      with ``n < 2L`` no count, not even a unanimous one, reaches that level.
    * BetweenThresholds releases on a noisy count of at least ``low``; the count is at most ``n``, so
      ``low > n`` is out of reach.
    """

    inner = _inner(mechanism)
    n = voters(mechanism, num_teachers)
    if isinstance(inner, DPArgMax):
        bound = int(inner.error_bound)
        if n <= 2 * bound:
            raise RunInputError(
                f"the release threshold n/2 + L = {n / 2:g} + {bound} of DPArgMax is out of reach of n={n} teachers "
                f"(n must exceed 2L = {2 * bound}): use more teachers or a larger step epsilon/delta")
    elif isinstance(inner, DPWeightedSampling):
        bound = int(inner.error_bound)
        if n < 2 * bound:
            raise RunInputError(
                f"the survival threshold 2L = {2 * bound} of DPWeightedSampling is out of reach of n={n} teachers: "
                "use more teachers or a larger step epsilon/delta")
    elif isinstance(inner, BetweenThresholds):
        try:
            check_between_thresholds_reachable(inner, n)
        except ValueError as exc:
            raise RunInputError(str(exc)) from None


#: The largest probability with which one step may release a token its noise chose, not the teachers
#: (:meth:`~mechanisms.GaussianNoisyArgMax.noise_release_probability`); a run above it is refused before anything
#: is charged: its releases would be the noise's, charged as private (docs/generation.md, "Noise that decides").
NOISE_RELEASE_LIMIT = 0.05


def noise_release(mechanism, num_teachers: int, vocab_size: int, support: int | None = None) -> float | None:
    """The probability that one step of ``mechanism`` releases a token its noise chose, not the teachers, over
    ``support`` tokens (a public top-k) or the model's ``vocab_size`` (``None``: a mechanism that releases only
    voted tokens, or the public model's)."""
    inner = _inner(mechanism)
    if not isinstance(inner, (GaussianNoisyArgMax, GaussianAveragedDistributions)):
        return None
    size = int(support) if support is not None else int(vocab_size)
    return inner.noise_release_probability(voters(mechanism, num_teachers), max(2, size))


def check_noise_floor(mechanism, num_teachers: int, vocab_size: int, support: int | None = None,
                      nearest: str = "") -> None:
    """Refuse a mechanism whose noise, not its teachers, picks the released token with probability above
    :data:`NOISE_RELEASE_LIMIT` (:func:`noise_release`): GNMax noises every token it votes over (``support``
    tokens, the tail never released; else ``vocab_size``), and among many tokens the largest noise grows like
    ``sigma sqrt(2 ln V)``, so too few teachers for the noise make a run whose releases the noise decides.  The
    probability is exact (the mechanism's own law at the step where its rule should release the teachers' token or
    nothing, :meth:`~mechanisms.GaussianNoisyArgMax.noise_release_probability`); ``nearest``: the configurations
    that pass (:func:`nearest_configurations`), appended to the one-line ``RunInputError``."""
    stray = noise_release(mechanism, num_teachers, vocab_size, support)
    if stray is None or stray <= NOISE_RELEASE_LIMIT:
        return
    inner = _inner(mechanism)
    where = f"the public top {support} tokens" if support is not None else f"a vocabulary of {vocab_size} tokens"
    n = voters(mechanism, num_teachers)
    threshold = getattr(inner, "threshold", None)
    when = (f"at a step where no token has a majority (threshold {threshold} of {n} votes) it releases a token "
            f"with probability {_percent(stray)}" if threshold is not None else
            f"at a step where one token holds a bare majority of {n // 2 + 1} of {n} votes another token wins with "
            f"probability {_percent(stray)}")
    raise RunInputError(
        f"the Gaussian noise (sigma {inner.sigma:.3g}) over {where} decides the releases of {n} teachers: {when} "
        f"(at most {NOISE_RELEASE_LIMIT:.0%} is accepted), a token the noise chose, charged as private{nearest}")


def zcdp_charge_warning(mechanism, accountant: str) -> str | None:
    """What a user should hear when ``accountant`` charges a mechanism whose step is zCDP (its event has ``rho``:
    clipped-logit sampling, Tang et al.'s Gaussian, Amin et al.'s episodes) as the ``(epsilon, delta)`` it also
    states: correct, but composed far worse than its ``rho`` under RDP.  ``None`` under RDP or for other mechanisms."""
    event = getattr(_inner(mechanism), "event", None)
    rho = getattr(event, "rho", None)
    if rho is None or accountant == "rdp":
        return None
    return (f"{type(_inner(mechanism)).__name__} is {rho:.3g}-zCDP a step; the {accountant} accountant charges it as "
            f"(epsilon {event.epsilon:g}, delta {event.delta:g}) a step, which composes far worse: --accountant rdp "
            "charges its zCDP")


def _percent(p: float) -> str:
    """``89%``; ``5.2%`` below 10 %, so that a refused value never reads as the limit itself."""
    return f"{p:.0%}" if p >= 0.1 else f"{p:.1%}"


#: The step epsilons :func:`nearest_configurations` tries: two significant figures, 1-1.2-1.5-2-2.5-3-4-5-6-8 a
#: decade, up to the largest step epsilon a run takes.
_STEP_GRID = tuple(sorted({round(m * 10.0 ** k, 6) for k in range(-3, 2)
                           for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8) if m * 10.0 ** k <= 50.0} | {50.0}))


def run_refusal(spec, group_teachers: int, groups: int, touches: int, vocab_size: int | None = None) -> str | None:
    """Why ``generate`` refuses the mechanism of ``spec`` (its name, step delta, accountant and budget) with
    ``group_teachers`` teachers in each of ``groups`` groups (a step counted ``touches`` times), at the step
    epsilon ``spec.step_epsilon``: a release threshold out of reach (:func:`check_reachable`), noise that decides
    the releases over ``spec.public_top_k`` or ``vocab_size`` tokens (:func:`check_noise_floor`; skipped when
    ``vocab_size`` is ``None``), or a budget that pays for no step; ``None`` when it runs.  Public settings only."""
    try:
        mech = spec_mechanism(spec, group_teachers)
        check_reachable(mech, group_teachers)
        if vocab_size is not None:
            check_noise_floor(mech, group_teachers, vocab_size, spec.public_top_k)
        probe = build_accountant(spec.accountant, (float(spec.budget_epsilon), float(spec.budget_delta)),
                                 mechanism=mech, num_teachers=group_teachers * groups)
        if not probe.can_afford(mech.event, touches):
            return "the budget pays for no step"
    except (RunInputError, PateAccountantError) as exc:
        return str(exc)
    return None


def nearest_configurations(spec, groups: int, touches: int, *, labels: bool, records: int | None,
                           vocab_size: int | None = None) -> str:
    """The nearest configurations that ``generate`` runs when ``spec`` is refused for its noise or its threshold
    (:func:`run_refusal`), each with the steps its budget pays for (a labelled run's steps count twice when its
    labels are private), as the tail of the refusal's one line: the smallest step epsilon on a grid of two
    significant figures that runs with these teachers; the fewest teachers per group that run at this step
    epsilon (fewer ``--groups``, or more ``--teachers`` while every teacher still gets a record: ``records`` is
    the number of records when it is public, under replace-one, else ``None``); a public top-k support for
    GNMax over the whole vocabulary; and always the public model alone (``--public-only``).  Public settings
    only: the number of records is public under replace-one (docs/privacy_unit.md)."""
    teachers = int(spec.teachers)
    n = teachers // groups
    options = []

    def trial(change: dict) -> tuple:  # the changed spec and its number of groups
        return attr.evolve(spec, **change), change.get("groups", groups)

    def runs(**change) -> bool:
        changed, count = trial(change)
        return run_refusal(changed, changed.teachers // count, count, touches, vocab_size) is None

    def pays(**change) -> str:  # what the budget affords the configuration, in its own words
        changed, count = trial(change)
        try:
            mech = spec_mechanism(changed, changed.teachers // count)
            limits = planning.step_limits(changed.accountant, mech.event, float(changed.budget_epsilon),
                                          float(changed.budget_delta))
        except (PateAccountantError, RunInputError, ValueError):
            return ""
        if limits.max_steps is not None:
            steps = limits.max_steps // touches
            return f": the budget pays for {plural_of(steps, 'step')}" + (" of a label group" if touches > 1 else "")
        return f": the budget pays for {plural_of(limits.max_hits // touches, 'hit')}"

    for e in _STEP_GRID:
        if e > float(spec.step_epsilon) and runs(step_epsilon=e):
            options.append(f"--step-epsilon {e:g}{pays(step_epsilon=e)}")
            break
    if not labels and groups > 1:
        for fewer in range(groups - 1, 0, -1):
            if teachers % fewer == 0 and runs(groups=fewer):
                options.append(("one group (leave --groups out)" if fewer == 1 else f"--groups {fewer}")
                               + pays(groups=fewer))
                break
    # more teachers: the fewest multiples of the groups that run (more teachers never hurt a threshold or the
    # noise), by bisection up to the records (public under replace-one) or 64 times as many
    low, high = n, (records if records is not None else 64 * teachers) // groups
    if high > low and runs(teachers=high * groups):
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if runs(teachers=mid * groups) else (mid, high)
        more = high * groups
        options.append((f"--teachers {more} ({high} per group)" if groups > 1 else f"--teachers {more}")
                       + pays(teachers=more))
    if spec.mechanism == "gaussian-argmax" and runs(mechanism="gaussian-threshold-argmax"):
        options.append("--mechanism gaussian-threshold-argmax (it releases only a majority's token)"
                       + pays(mechanism="gaussian-threshold-argmax"))
    gaussian = isinstance(_inner(spec_mechanism(spec, n)), GaussianNoisyArgMax)
    if spec.public_top_k is None and gaussian and runs(public_top_k=50):
        options.append(f"--public-top-k 50{pays()}")
    options.append("the public model alone: --public-only (no private data, nothing charged)")
    return "; nearest configurations that run: " + "; ".join(options)


def release_rule(mechanism, num_teachers: int) -> str:
    """When the mechanism releases a token, in words, for the run header (public: the mechanism's parameters and
    the configured teachers ``n``; under subsampled teachers, the votes a step keeps on average)."""
    rule = _inner_release_rule(_inner(mechanism), voters(mechanism, num_teachers))
    if isinstance(mechanism, SubsampledTeachers):
        return (f"{rule}; each step counts the votes of the teachers a draw keeps, each with probability "
                f"{mechanism.rate:g} (about {voters(mechanism, num_teachers)} of {int(num_teachers)})")
    return rule


def _inner_release_rule(inner, n: int) -> str:
    if isinstance(inner, DPArgMax):
        need = math.floor(n / 2 + int(inner.error_bound)) + 1
        return (f"a token needs a noisy count above n/2 + L = {n / 2:g} + {int(inner.error_bound)}, i.e. about {need} of "
                f"{n} votes")
    if isinstance(inner, DPWeightedSampling):
        return (f"a voted token is kept surely with 2L = {2 * int(inner.error_bound)} of {n} votes, by chance with "
                "fewer")
    if isinstance(inner, BetweenThresholds):
        return (f"the public model's token is released when a noisy count of the teachers included at a random rate "
                f"who vote it is at least {inner.low} (free from {inner.high})")
    threshold = getattr(inner, "threshold", None)
    if isinstance(inner, GaussianNoisyArgMax) and threshold is not None:
        return f"a token needs a noisy count of at least {threshold} of {n} votes (Gaussian noise)"
    if isinstance(inner, GaussianNoisyArgMax):
        return "the token with the largest noisy count is released at every step (Gaussian noise, no threshold)"
    return type(inner).__name__


def check_groups(groups, num_teachers: int, accountant_name: str, *, labels: bool = False) -> int:
    """The teachers of each group for ``--groups`` (:func:`~pate_app.run.private_run`), or of each label's group with
    ``labels`` (the groups are then the labels of ``--labels``): ``num_teachers`` must split evenly, so every group
    runs the same mechanism (the groups then share its envelope, docs/groups.md), and the accountant must take the
    envelope of parallel groups (one that declares none would charge every group in full: refused rather than
    silently costing ``groups`` times more)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise RunInputError(f"--groups must be a positive integer, got {groups!r}")
    what = f"the {groups} labels of --labels" if labels else f"--groups {groups} equal groups"
    if num_teachers % groups:
        below = num_teachers - num_teachers % groups
        nearest = f"{below} or {below + groups}" if below else f"{groups}"
        raise RunInputError(f"--teachers {num_teachers} does not split evenly over {what} (use a multiple of "
                            f"{groups}: {nearest})")
    if (groups > 1 and accountant_name in accountants_registry.run_accountant_names()
            and accountants_registry.accountant_class(accountant_name).parallel_composition is None):
        raise RunInputError(f"{'--labels' if labels else f'--groups {groups}'}: the {accountant_name} accountant does "
                            "not compose groups in parallel")
    return num_teachers // groups


@attr.s(frozen=True, auto_attribs=True)
class _RunPlan:
    """What :func:`_plan_run` settles from the spec and the data alone."""

    labels: list | None
    #: Each label's record positions (``None`` without labels).
    places: dict | None
    groups: int
    group_teachers: int
    mechanism: object
    #: The most records one teacher shows (public: :func:`records_per_teacher`).
    per_teacher: int = 1
    #: How many groups one record can change (:func:`record_relation`).
    touches: int = 1
    #: The record-level relation the run's guarantee is stated under (:data:`RECORD_RELATIONS`).
    relation: str = "replace-one"


def _plan_run(spec, task) -> _RunPlan:
    """The checks that need only the spec and the records (no model, no ledger; cheap): the labels and each
    label's records, the groups, the template against the records, the mechanism and whether its threshold is in
    reach, the accountant and whether the budget pays for one step."""
    records = task.records
    labels, places = _check_task(spec, task)
    groups = spec.groups if labels is None else len(labels)
    group_teachers = check_groups(groups, spec.teachers, spec.accountant, labels=labels is not None)
    relation, touches = record_relation(spec.relation, labels is not None and groups > 1, spec.labels_public)
    mech = spec_mechanism(spec, group_teachers)
    check_inputs(records, spec.teachers, mech, spec.accountant, (float(spec.budget_epsilon), float(spec.budget_delta)),
                 touches)
    try:
        check_reachable(mech, group_teachers)
    except RunInputError as exc:
        nearest = nearest_configurations(spec, groups, touches, labels=labels is not None,
                                         records=_public_count(spec, task))
        raise RunInputError(f"{exc}{nearest}") from None
    return _RunPlan(labels, places, groups, group_teachers, mech,
                    records_per_teacher(spec.records_per_teacher, spec.relation, task.num_records, spec.teachers),
                    touches, relation)


def fit_teachers(spec, task):
    """``spec`` with its teachers fitted to the data when ``--teachers`` was not given
    (:func:`~pate_app.privacy_unit.default_teachers`: public settings and, under replace-one, the number of
    records, which is public there)."""
    if spec.teachers is not None:
        return spec
    groups = len(spec.labels) if spec.labels is not None else spec.groups
    return attr.evolve(spec, teachers=default_teachers(spec.relation, task.num_records, groups))


def _check_task(spec, task) -> tuple:
    """``(labels, places)``: the labels of ``--labels`` and each label's record positions (``None, None`` without
    labels), every record's label being one of them; and the template against the records."""
    records, labels, places = task.records, None, None
    if spec.labels is not None:
        labels = list(spec.labels)
        try:
            split_by_label(records, key="label", labels=labels)  # every record's label is one of the list
        except (TypeError, ValueError) as exc:  # "labels: ..." or "key: record 3 has no ..." (the label field)
            option, _, why = str(exc).partition(": ")
            raise RunInputError(f"argument --{'labels' if option == 'labels' else 'label-field'}: {why}") from None
        places = {label: [i for i, record in enumerate(records) if record["label"] == label] for label in labels}
    try:
        task.template.check_records(records)
        for label in labels or ():
            task.template.for_label(label)  # a label the template cannot show
    except ValueError as exc:
        raise RunInputError(f"--template: {exc}") from None
    if task.template.names_label and labels is None:
        raise RunInputError(f"--template: template {task.template.name!r} names the label ({{label}}), which needs a "
                            "run per label: --label-field and --labels")
    return labels, places


def _public_count(spec, task) -> int | None:
    """The number of records when it is public (under replace-one, docs/privacy_unit.md), else ``None``."""
    return task.num_records if spec.relation == "replace-one" else None


def plural_of(count: int, noun: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
