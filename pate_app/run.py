"""One private generation run, shared by ``pate-accountant demo`` and ``pate-accountant generate`` (docs/demo.md).

:func:`private_run` partitions instruction records between ``n`` in-context teachers, builds the mechanism and
the accountant, claims the data set's SQLite ledger (creating it, or joining it when it exists: a ledger
belongs to one data set and its budget spans every run over that data set) before the slow start, loads a
local causal LM (:class:`~ensembles.backends.transformers_backend.TransformersBackend`), records the run's metadata
(mechanism parameters, accountant, budget, whether the run was seeded, software version: never the seed),
generates ``K`` records with :class:`~ensembles.generation.PrivateGenerator` (public fallback: the same
model with only the shared prefix, so records always complete), verifies the ledger and returns a
JSON-able dict.

Every check on the inputs (records, teachers, mechanism and whether its release threshold is within reach
of ``n`` teachers, accountant, model path, an existing ledger's data set, accountant and remaining budget)
happens before anything is written, so a bad input never spends budget and never creates a ledger file.
The ledger is claimed before the model loads (data set, accountant and budget stored in a new ledger, checked
against an existing one), so a second run given the same path with another budget is refused at once; a run
that is refused after the claim (its prompts do not fit the model, the model does not load) removes the
ledger it created, unless another run has joined it meanwhile.
The returned dict and the ledger hold no prompt text and no seed: only the generated records, outcome
classes, counts of charged runs and parameters.

Seeds.  A seed makes a run reproducible, and for the same reason removes its privacy against anyone who
knows the seed: they can re-run both neighbouring data sets and compare.  A seeded run prints a warning on
stderr, and the seed is never written into a shareable artifact (ledger, JSON result, stdout).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import inspect
import ipaddress
import math
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
from pathlib import Path

import attr
import numpy as np

from ensembles.backends import transformers_backend as tb
from ensembles.backends.sharded import (
    BackendSpec,
    RayExecutor,
    ShardedBackend,
    TransformersSpec,
)
from ensembles.backends.transformers_backend import TransformersBackend
from ensembles.data import (
    RecordsTooLongError,
    fit_records,
    place_records,
    record_token_limit,
    split_by_label,
    teacher_prompts,
)
from ensembles.templates import INSTRUCTIONS, PromptTemplate
from ensembles.generation import PrivateGenerator, check_between_thresholds_reachable, public_generate_many
from ensembles.support_size import measure_top_k
from mechanisms import (
    BetweenThresholds,
    BoundaryWrapper,
    DPArgMax,
    DPWeightedSampling,
    GaussianAveragedDistributions,
    GaussianNoisyArgMax,
)
from mechanisms import registry as mechanisms_registry
from mechanisms.base import reads_distributions
from mechanisms.subsampled import SubsampledTeachers
from pate_accountant import __version__, planning
from pate_accountant.tct import largest_fitting
from pate_accountant import registry as accountants_registry
from pate_accountant.checkpoints import (
    CheckpointError,
    append_checkpoint,
    checkpoints_file,
    load_private_key,
    sign_checkpoint,
)
from pate_accountant.errors import PateAccountantError, UnsupportedEventError
from pate_accountant.events import ADD_REMOVE_ONE
from pate_accountant.ledger import (
    STORAGE_ERRORS,
    Ledger,
    VerificationResult,
    describe_mechanism,
    is_ledger_url,
    shown_location,
)
from pate_accountant.ledger_home import (
    DatabaseIndex,
    LedgerHome,
    dataset_fingerprint,
    ledger_name_of,
    with_ledger_name,
)
from pate_app.evaluation import normalise
from pate_app.library_output import quiet_libraries
from pate_app.records_out import RecordsOut, check_out_path
from pate_app.options import DEFAULT_RAY_TIMEOUT
from pate_app.privacy_unit import (
    RECORD_RELATIONS,
    TEACHER_RELATION,
    default_teachers,
    record_relation,
    records_per_teacher,
)
from pate_app.spec import RunInputError, RunSpec, load_public_examples, load_task, model_label, task_from_records

__all__ = [
    "RECORD_RELATIONS",
    "TEACHER_RELATION",
    "RunInputError",
    "build_accountant",
    "build_mechanism",
    "check_groups",
    "check_inputs",
    "check_reachable",
    "check_workers",
    "demo_model_path",
    "group_prompts",
    "private_run",
    "record_relation",
    "records_per_teacher",
    "run_prompts",
]

RELATIONS = ("replace-one", "add-remove-one")


def build_mechanism(name: str, epsilon: float, delta: float, relation: str = "replace-one",
                    num_teachers: int | None = None, subsample: float | None = None):
    """The per-step mechanism registered as ``name`` (:mod:`mechanisms.registry`, one a run may use) with
    per-step ``(epsilon, delta)`` under ``relation`` (and the run's ``num_teachers``, for a mechanism whose
    threshold is set from them).  ``subsample``: the rate ``q`` of ``--subsample-teachers``
    (:func:`subsampled_mechanism`)."""

    names = mechanisms_registry.run_mechanism_names()
    if name not in names:
        raise RunInputError(f"mechanism must be one of {names}, got {name!r}")
    if relation not in RELATIONS:
        raise RunInputError(f"relation must be one of {RELATIONS}, got {relation!r}")
    try:
        if subsample is not None:
            return subsampled_mechanism(name, epsilon, delta, relation, num_teachers, subsample)
        return mechanisms_registry.build_mechanism(name, epsilon, delta, relation, num_teachers=num_teachers)
    except (TypeError, ValueError) as exc:
        raise RunInputError(f"mechanism {name}: {exc}") from None


def spec_mechanism(spec, num_teachers: int):
    """The per-step mechanism of ``spec`` (its name, step epsilon and delta, ``--subsample-teachers``) for
    ``num_teachers`` teachers a group, stated under the teachers' relation."""
    return build_mechanism(spec.mechanism, spec.step_epsilon, spec.step_delta, TEACHER_RELATION,
                           num_teachers=num_teachers, subsample=spec.subsample_teachers)


def kept_teachers(num_teachers: int | None, rate: float) -> int | None:
    """The teachers a Poisson draw at ``rate`` keeps on average, rounded (at least one): the ``n`` a subsampled
    step's inner mechanism is built and judged for (its threshold, its noise rule); public settings only."""
    return None if num_teachers is None else max(1, round(float(rate) * int(num_teachers)))


def subsampled_mechanism(name: str, epsilon: float, delta: float, relation: str, num_teachers: int | None,
                         rate: float) -> SubsampledTeachers:
    """``--subsample-teachers Q`` (issue 34, lever 5): the mechanism ``name`` calibrated to the per-step
    ``(epsilon, delta)`` under add-remove-one, for the :func:`kept_teachers` a step keeps on average, run on the
    votes of the teachers a Poisson draw at ``rate`` keeps at each step; the run is charged the amplified bound
    under ``relation`` (:mod:`mechanisms.subsampled`, docs/mechanisms/subsampled.md).  A ``ValueError`` for a
    mechanism it cannot wrap: one over the teachers' distributions (it reads rows, not votes), BetweenThresholds
    (it counts teachers included at a random rate already) and a boundary wrapper (its target counts the whole
    ensemble's hits)."""
    if not 0.0 < float(rate) < 1.0:
        raise ValueError(f"--subsample-teachers must be in (0, 1), got {rate!r}")
    inner = mechanisms_registry.build_mechanism(name, epsilon, delta, ADD_REMOVE_ONE,
                                                num_teachers=kept_teachers(num_teachers, rate))
    if reads_distributions(inner):
        raise ValueError("--subsample-teachers keeps teachers' votes, and this mechanism reads the teachers' "
                         "distributions")
    if isinstance(inner, (BetweenThresholds, BoundaryWrapper)):
        why = ("it counts teachers included at a random rate already" if isinstance(inner, BetweenThresholds) else
               "a boundary wrapper's target counts the whole ensemble's hits")
        raise ValueError(f"--subsample-teachers does not wrap {type(inner).__name__}: {why}")
    return SubsampledTeachers(inner, rate, relation)


def voters(mechanism, num_teachers: int) -> int:
    """The teachers whose votes one step of ``mechanism`` counts: :func:`kept_teachers` for subsampled teachers,
    else all ``num_teachers``."""
    if isinstance(mechanism, SubsampledTeachers):
        return kept_teachers(num_teachers, mechanism.rate)
    return int(num_teachers)


def build_accountant(name: str, budget, ledger=None, *, mechanism=None, num_teachers: int | None = None):
    """The accountant registered as ``name`` (:mod:`pate_accountant.registry`, one a run may use) with
    ``budget=(epsilon, delta)``, for a run of ``mechanism`` with ``num_teachers`` teachers (what individual
    charging needs: ``Accountant.for_run``)."""

    names = accountants_registry.run_accountant_names()
    if name not in names:
        raise RunInputError(f"accountant must be one of {names}, got {name!r}")
    try:
        return accountants_registry.accountant_class(name).for_run(budget=budget, ledger=ledger, mechanism=mechanism,
                                                                   num_teachers=num_teachers)
    except (TypeError, ValueError) as exc:  # UnsupportedEventError too: individual charging without BetweenThresholds
        raise RunInputError(f"accountant {name}: {exc}") from None


def _inner(mechanism):
    """The mechanism a boundary wrapper or subsampled teachers wrap, or the mechanism itself."""
    return mechanism.inner if isinstance(mechanism, (BoundaryWrapper, SubsampledTeachers)) else mechanism


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
    """The teachers of each group for ``--groups`` (:func:`private_run`), or of each label's group with ``labels``
    (the groups are then the labels of ``--labels``): ``num_teachers`` must split evenly, so every group runs the
    same mechanism (the groups then share its envelope, docs/groups.md), and the accountant must take the envelope
    of parallel groups (one that declares none would charge every group in full: refused rather than silently
    costing ``groups`` times more)."""
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
    ``public_blocks`` (:func:`teacher_public_blocks`): each group's public examples, appended to its shared prefix
    (public: the placement of the records does not move)."""
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


def _check_record_relation(ledger: Ledger, relation: str, where: str) -> None:
    """One ledger states one guarantee: every run on it under the same record-level relation (the run metadata's
    ``record_relation``; runs written before it was recorded are not compared: their events say what they
    charged).  A :class:`RunInputError` naming both relations otherwise."""
    kept = {run["metadata"].get("record_relation") for run in ledger.runs} - {None}
    if kept and relation not in kept:
        raise RunInputError(
            f"{where} states its guarantee for {', '.join(sorted(kept))} of records, and this run's relation is "
            f"{relation}: one ledger keeps one relation (run with that --relation and --labels-public setting, or "
            "give another ledger; docs/privacy_unit.md)")


def _check_existing_ledger(location, dataset: str, accountant_name: str, budget, mechanism,
                           num_teachers: int, relation: str = "replace-one") -> None:
    """An existing ``--ledger``: it must belong to ``dataset``, be kept by the same accountant (kind and
    budget), verify as far as its rows replay, and have budget left for one step.  Read-only: nothing is
    written.  A ledger another run has only just created (no data set, no run, no row yet) passes: the claim
    (:func:`_claim_ledger`) decides under the write lock.  ``location``: a file's path or a PostgreSQL URL."""

    shown = shown_location(location)
    where = f"--ledger {shown!r}"
    try:
        ledger = Ledger.open(location, read_only=True)
    except FileNotFoundError:
        return  # removed meanwhile by the run that created it: the claim creates a new one
    except (PateAccountantError, OSError, ValueError) as exc:
        raise RunInputError(f"{where}: cannot open it as a ledger: {exc}") from None
    try:
        stored = ledger.dataset
        if stored is None:
            if _just_created(ledger):
                return
            raise RunInputError(f"{where} names no data set, so it cannot take runs over {dataset!r} "
                                "(give a new ledger path)")
        if stored != dataset:
            raise RunInputError(f"{where} belongs to the data set {stored!r}, not {dataset!r}: a ledger keeps one "
                                "data set's budget (give that data set's ledger, or --dataset)")
        try:
            acct = build_accountant(accountant_name, budget, ledger, mechanism=mechanism,
                                    num_teachers=num_teachers)
        except RunInputError as exc:
            fixed = (" (a data set's budget is fixed when its ledger is created: run with the ledger's budget, shown "
                     f"by `pate-accountant audit {shown}`)") if "budget" in str(exc) else ""
            raise RunInputError(f"{where} is kept by another accountant or budget: {exc}{fixed}") from None
        except PateAccountantError as exc:
            raise RunInputError(f"{where}: {exc}") from None
        _check_affords(acct, mechanism, where, dataset, budget)
        _check_record_relation(ledger, relation, where)
    finally:
        ledger.close()


def _just_created(ledger: Ledger) -> bool:
    """A complete ledger with no data set, run or row: another run created it an instant ago and is claiming it."""
    try:
        return ledger.row_count == 0 and not ledger.runs
    except (PateAccountantError, *STORAGE_ERRORS):  # no head or runs table: not a ledger's layout
        return False


def _check_affords(acct, mechanism, where: str, dataset: str, budget) -> None:
    try:
        affordable = acct.can_afford(mechanism.event)
    except UnsupportedEventError:  # a ledger kept under the other neighbouring relation (issue 22, item 4)
        kept = acct.neighboring_relation
        stated = getattr(mechanism.event, "relation", None)
        raise RunInputError(
            f"{where} holds events stated under the {kept} relation of teachers, and this run's are stated under "
            f"{stated} (one record moves one teacher's vote): one ledger composes one relation. A ledger whose events "
            "are add-remove-one of teachers was written by an earlier version, which under-counted records under "
            "--relation add-remove-one; give another ledger (docs/privacy_unit.md)") from None
    if not affordable:
        spent = acct.spent()
        raise RunInputError(
            f"{where}: the budget of data set {dataset!r} (epsilon {budget[0]:g}, delta {budget[1]:g}) cannot pay "
            f"for another step: epsilon {float(spent[0]):.6g}, delta {float(spent[1]):.3g} already spent")


def _claim_ledger(location, dataset: str, accountant_name: str, budget, mechanism, num_teachers: int,
                  relation: str = "replace-one"):
    """Claim the data set's ledger for this run before any slow work (loading the model): open it, creating it
    when missing; name its data set and attach the run's accountant (which stores the accountant and budget in
    a new ledger, and replays an existing one's rows); check that one step is affordable.  From here a second
    run given the same path with another data set, accountant or budget is refused at once, whichever of the
    two started first.  Returns ``(ledger, accountant)``.  On a refusal nothing is left behind: an existing
    ledger is unchanged, and one created here is removed (:meth:`Ledger.discard_if_unused`)."""

    where = f"--ledger {shown_location(location)!r}"
    try:
        ledger = Ledger.open(location)
    except (PateAccountantError, OSError, ValueError) as exc:
        raise RunInputError(f"{where}: cannot open it as a ledger: {exc}") from None
    try:
        try:
            ledger.set_dataset(dataset)
            acct = build_accountant(accountant_name, budget, ledger, mechanism=mechanism, num_teachers=num_teachers)
        except ValueError as exc:  # another run claimed the ledger since the read-only check, for another budget
            raise RunInputError(f"{where}: {exc}") from None
        except PateAccountantError as exc:
            raise RunInputError(f"{where}: {exc}") from None
        _check_affords(acct, mechanism, where, dataset, budget)
        _check_record_relation(ledger, relation, where)
        _check_one_partition(acct, ledger, where)
    except BaseException:
        _discard(ledger)
        raise
    return ledger, acct


def _check_one_partition(acct, ledger: Ledger, where: str, run_id: int | None = None) -> None:
    """Individual charging counts charges per teacher, and a teacher is one part of one run's random partition
    of the records: another run's teacher ``i`` holds other records, so adding up two runs' counters by teacher
    index could under-count a record.  So a data set's ledger under individual charging takes one run (checked
    at the claim, and again once the run has begun, against a run that began meanwhile)."""
    if not acct.confidential_charges:
        return
    runs = len(ledger.runs) if run_id is None else run_id - 1
    if runs:
        raise RunInputError(
            f"{where} already holds {runs} run(s) under individual charging, whose counters belong to those runs' "
            "teachers: a data set's ledger under individual charging takes one run (docs/tct_and_individual.md, "
            "'In generate'); use another accountant to run again on these records")


def _discard(ledger: Ledger) -> None:
    """Close ``ledger`` after a refusal, removing it when this run created it and nobody used it; a failure of
    the clean-up never hides the refusal itself."""
    try:
        ledger.discard_if_unused()
    except (*STORAGE_ERRORS, OSError):
        with contextlib.suppress(*STORAGE_ERRORS):
            ledger.close()


#: A host name of ``--ray-address``: DNS labels, or an IPv4 address (an IPv6 address goes in brackets).
_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}"
                   r"[A-Za-z0-9])?)*")
_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>[0-9]+)")


def _ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def parse_ray_address(address) -> tuple[str, int] | None:
    """``(host, port)`` of a ``--ray-address`` ``HOST:PORT`` or ``ray://HOST:PORT``; ``None`` for ``local`` and
    ``auto``.  A :class:`RunInputError` naming ``--ray-address`` for anything else (a port outside 1..65535, a
    host that is no DNS name or IP address)."""
    if address in ("local", "auto"):
        return None
    form = "--ray-address must be 'local', 'auto', HOST:PORT or ray://HOST:PORT"
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if match is None:
        raise RunInputError(f"{form}, got {address!r}")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise RunInputError(f"--ray-address {address}: the port must lie in 1..65535, got {port}")
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            raise RunInputError(f"--ray-address {address}: {match['ipv6']!r} is not an IPv6 address") from None
        return match["ipv6"], port
    if not _HOST.fullmatch(match["host"]):
        raise RunInputError(f"{form}, got {address!r} (the host must be a DNS name or an IP address)")
    return match["host"], port


def probe_ray_address(address: str, timeout: float) -> None:
    """Open (and close) a TCP connection to the host and port of ``--ray-address`` within ``timeout`` seconds, so
    that an address nobody answers on is refused at once, before the ledger is claimed, instead of Ray retrying
    for many minutes; ``local`` and ``auto`` are not probed."""
    where = parse_ray_address(address)
    if where is None:
        return
    try:
        with socket.create_connection(where, timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (getattr(exc, "strerror", None) or str(exc))
        raise RunInputError(f"--ray-address {address}: cannot reach {where[0]}:{where[1]} within --ray-timeout "
                            f"{timeout:g} s ({reason})") from None


def check_workers(workers: int, num_teachers: int, ray_address: str | None,
                  ray_timeout: float = DEFAULT_RAY_TIMEOUT) -> None:
    """Refuse, before anything is written: ``--workers`` that is not a positive integer or exceeds
    ``--teachers`` (every shard needs a teacher), a malformed ``--ray-address``, ``--ray-address`` without
    Ray installed, or a cluster address that does not answer within ``ray_timeout`` seconds."""

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RunInputError(f"--workers must be a positive integer, got {workers!r}")
    if workers > num_teachers:
        raise RunInputError(f"--workers {workers} exceeds --teachers {num_teachers}: every worker needs at least "
                            "one teacher")
    if ray_address is None:
        return
    if isinstance(ray_timeout, bool) or not isinstance(ray_timeout, (int, float)) or not 0 < ray_timeout <= 600:
        raise RunInputError(f"--ray-timeout must be a number of seconds in (0, 600], got {ray_timeout!r}")
    parse_ray_address(ray_address)
    if not _ray_installed():
        raise RunInputError(f"--ray-address {ray_address}: Ray is not installed; install the distributed extra: "
                            "pip install 'pate-accountant[distributed]'")
    probe_ray_address(ray_address, float(ray_timeout))


def _backends(stack: contextlib.ExitStack, model, threads, workers: int, ray_address: str | None):
    """The teachers' backend and the public fallback backend (closed by ``stack``).

    One worker and no Ray: today's single :class:`TransformersBackend`.  ``workers > 1`` in this process: the
    model is loaded once and shared by ``workers`` shards (:class:`ShardedBackend`).  Ray: every actor loads
    the model itself (``TransformersSpec``), the coordinator keeps only the tokenizer, and the public
    fallback is one more actor."""

    if ray_address is None and workers == 1:
        backend = TransformersBackend(model, threads=threads, top_p=None, temperature=1.0)  # ValueError: bad path
        return backend, TransformersBackend(backend.model, backend.tokenizer, threads=threads)
    if ray_address is None:
        base = TransformersBackend(model, threads=threads, top_p=None, temperature=1.0)
        backend = ShardedBackend(BackendSpec(TransformersBackend, base.model, base.tokenizer, threads=threads),
                                 workers)
        stack.callback(backend.close)
        return backend, TransformersBackend(base.model, base.tokenizer, threads=threads)
    spec = TransformersSpec.for_model(model, threads=threads)  # ValueError: bad path, before Ray starts
    executor = RayExecutor(ray_address)
    try:  # what fails here is the address, not the model (issue 22, item 12)
        executor.connect()
    except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
        raise RunInputError(f"--ray-address {ray_address}: cannot connect to the Ray cluster: {_first_line(exc)}"
                            ) from None
    stack.callback(executor.close)  # closed last: it started Ray, if one was started
    try:
        backend = ShardedBackend(spec, workers, executor=executor)
        stack.callback(backend.close)
        public = ShardedBackend(spec, 1, executor=RayExecutor(ray_address))
        stack.callback(public.close)
    except (ConnectionError, TimeoutError) as exc:  # no room on the cluster, actors that never started
        raise RunInputError(f"--ray-address {ray_address}: the Ray cluster did not start the workers: {exc}") from None
    return backend, public


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


def private_run(spec, *, records=None, progress: bool = False, command: str = "generate", ledger_home=None) -> dict:
    """Run the private generation ``spec`` (a :class:`~pate_app.spec.RunSpec`) end to end and return a JSON-able
    result (module docstring); :func:`pate_app.synthesize` is the public name of this call.

    ``records``: records held in memory (dicts the template shows; :func:`~pate_app.spec.task_from_records`)
    instead of the file ``spec.data``; ``progress``: the progress bar and one-line notices on stderr;
    ``command``: the command named in the run metadata; ``ledger_home``: the ledger home (a
    :class:`~pate_accountant.ledger_home.LedgerHome` or its folder; default the user's) whose index finds the data
    set's ledger (by any record it shares with a registered data set) and refuses another; ``False``: the caller
    manages its budgets itself (the documented opt-out, docs/ledger.md): no index is read or written, and
    ``spec.ledger`` is required.

    The spec's values were checked when it was built.  What is checked here comes in order of cost, and all of
    it before anything is written: the data and task alone (records, labels, template, teachers, mechanism,
    accountant and budget; :func:`_plan_run`), then the model's path (the embedded one converted once), then the
    records against the model's window with its tokenizer only (``spec.long_records``: refuse, truncate or skip
    a record too long for its share of the window; counts on stderr, never a text), then the ledger, which is
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
    ``spec.seed``: for reproducible tests only (module docstring).

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
    # 1. the data and the task alone
    task = load_task(spec) if records is None else task_from_records(spec, records)
    if spec.public_only:
        return public_only_run(spec, task, progress=progress, command=command)
    spec = fit_teachers(spec, task)
    plan = _plan_run(spec, task)
    records, template, dataset, labels = list(task.records), task.template, task.dataset, plan.labels
    num_records, groups, group_teachers, mech = spec.requested, plan.groups, plan.group_teachers, plan.mechanism
    budget, seed = (float(spec.budget_epsilon), float(spec.budget_delta)), spec.seed
    try:
        out_file = None if spec.out is None else check_out_path(spec.out)
    except ValueError as exc:
        raise RunInputError(str(exc)) from None
    check_workers(spec.workers, spec.teachers, spec.ray_address, spec.ray_timeout)
    # 2. the model's path; 3. the records against its window (its tokenizer only)
    model, model_label = _resolve_model(spec, announce=progress)
    spec, support = _size_public_support(spec, task, model, labels, announce=progress)
    public_examples = load_public_examples(spec, task)
    blocks = teacher_public_blocks(spec, task.template, public_examples, labels, groups)
    shown = _fit_to_window(spec, task, plan, model, announce=progress, public_blocks=blocks)
    public_prompts = public_prompt_list(task.template, public_examples, labels, groups, model, spec.max_tokens)
    # 4. the ledger, claimed before the model loads
    register = spec.ledger is None or not bundled
    place = _dataset_ledger(ledger_home, records, dataset, spec.ledger, check=register, text_key=task.text_key)
    if spec.ledger is None:  # the index chose the ledger: the data set is the one it keeps
        dataset = _routed_dataset(place, dataset, spec.dataset, announce=progress)
    ledger_path, fingerprint, where = place.location, place.fingerprint, f"--ledger {place.shown!r}"
    try:
        if not place.is_url and not ledger_path.parent.is_dir():
            raise RunInputError(f"ledger folder {str(ledger_path.parent)!r} does not exist")
        key, checkpoints = _signing(spec.signing_key, spec.checkpoints, ledger_path)
        accountant = spec.accountant
        if place.is_url or ledger_path.exists():
            _check_existing_ledger(ledger_path, dataset, accountant, budget, mech, group_teachers,  # read-only
                                   plan.relation)
        ledger, acct = _claim_ledger(ledger_path, dataset, accountant, budget, mech, group_teachers,  # before the model
                                     plan.relation)
        try:  # the index learns the data set's ledger once it is claimed; of two runs racing, the first one wins
            if register:
                place.register()
        except (PateAccountantError, OSError, sqlite3.Error) as exc:
            _discard(ledger)
            raise RunInputError(f"{where}: {exc}") from None
    finally:
        place.close()
    existing = not ledger.created_here
    try:
        with contextlib.ExitStack() as stack:  # stops the shards' workers, whatever happens
            if progress:
                print("pate-accountant: loading the model ...", file=sys.stderr, flush=True)
            with quiet_libraries(drop_stderr=True):
                try:
                    backend, public = _backends(stack, model, spec.threads, spec.workers, spec.ray_address)
                except OSError as exc:  # unreadable weights, a broken config file: a usage error, no traceback
                    raise RunInputError(f"--model: cannot load the model: {_first_line(exc)}") from None

            rng = np.random.default_rng(seed)
            ensembles = run_prompts(shown, spec, plan, rng, template, announce=progress, public_blocks=blocks)
            try:  # prompts that do not fit the context window: refused before the run begins
                for shared_prefix, prompts in ensembles:
                    backend.check_prompts(prompts, shared_prefix)
            except ValueError as exc:
                raise RunInputError(f"--teachers {spec.teachers}: {exc} (use more teachers or shorter records)"
                                    ) from None

            metadata = {
                "command": command,
                "mechanism": describe_mechanism(mech),
                "mechanism_name": spec.mechanism,
                "release_rule": release_rule(mech, group_teachers),
                "accountant": accountant,
                "budget": {"epsilon": budget[0], "delta": budget[1]},
                "seeded": seed is not None,
                "software_version": __version__,
                "dataset": dataset,
                "dataset_fingerprint": fingerprint,
                "model": model_label,
                "data": task.data_label,
                "num_teachers": spec.teachers,
                "groups": groups,
                "teachers_per_group": group_teachers,
                "labels": labels,
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
                "public_examples": len(public_examples),
                "teachers_see_public": spec.teachers_see_public,
                "records_requested": num_records,
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

            looser = zcdp_charge_warning(mech, spec.accountant)
            if looser is not None:
                print(f"pate-accountant: warning: {looser}", file=sys.stderr, flush=True)
            if seed is not None:
                print("pate-accountant: warning: this run is seeded, so it has no privacy against anyone who knows "
                      "the seed (they can re-run both neighbouring data sets and compare); the seed is not recorded. "
                      "Leave --seed out for a private run.", file=sys.stderr, flush=True)
            # can_afford catches up on runs that charged the ledger while the model loaded
            _check_affords(acct, mech, where, dataset, budget)
            spent_before = tuple(float(x) for x in acct.spent())
            try:
                run_id = ledger.begin_run(metadata)
            except STORAGE_ERRORS as exc:  # a read-only file or folder, a full disk: nothing is charged yet
                raise RunInputError(f"{where}: cannot write to it: {exc}") from None
            _check_one_partition(acct, ledger, where, run_id)
            accountants = [acct] if groups == 1 else list(acct.parallel_groups(groups, touches=plan.touches))
            stop = _StopOnInterrupt(on_request=ledger.interrupt)  # entered once the generation begins
            # a first Ctrl-C inside a model call (a long prefill) stops the run at once
            backend, public = _Interruptible(backend, stop), _Interruptible(public, stop)
            generators = [PrivateGenerator(
                backend, mech, group_acct, histograms=spec.histograms, fallback="public", public_backend=public,
                public_prompt=public_prompts[g], max_tokens=spec.max_tokens, stop_strings=(template.stop,),
                top_p=None if reads_distributions(mech) else spec.top_p, temperature=spec.temperature,
                public_mix=spec.public_mix,
                public_support=spec.public_top_k,
            ) for g, group_acct in enumerate(accountants)]
            bar = RunProgress(num_records, progress)
            out_records, storage_error, interrupted = [], None, False
            writer = _open_out(stack, out_file, spec, labels)
            stack.enter_context(stop)

            def on_step(outcome: str) -> None:
                bar.step(outcome)
                stop.check()  # a Ctrl-C: stop here, after this step's charge

            # the charged runs one record may take at most (one per token position: the fallback is public), in the
            # counts of each group's accountant (a plain one counts a labelled step twice itself; a view scales)
            record_steps = [spec.max_tokens * (plan.touches if a is acct else 1) for a in accountants]
            try:
                turns = collections.deque(range(groups))  # groups whose budget is not spent, taken in turn
                made = [0] * groups
                while len(out_records) < num_records and turns:
                    g = turns.popleft()
                    if not spec.cut_records and not _pays_for_records(accountants[g], mech.event, record_steps[g]):
                        continue  # its budget may not pay for a whole record: the group ends between records
                    bar.record_starts()
                    shared_prefix, prompts = ensembles[g]
                    result = generators[g].generate(prompts, shared_prefix=shared_prefix, rng=rng,
                                                    mechanism_rng=rng if seed is not None else None,
                                                    on_step=on_step)
                    counts = result.outcome_counts()
                    out_records.append({
                        "text": _record_text(spec, result.text),
                        **({"group": g} if groups > 1 else {}),
                        **({"label": labels[g]} if labels is not None else {}),
                        "stop_reason": result.stop_reason,
                        "complete": result.stop_reason != "budget",
                        "num_tokens": counts.get("token", 0) + counts.get("fallback", 0),  # end of text included
                        "charged_runs": result.num_charged_runs,
                        "outcomes": counts,
                        "private_tokens": counts.get("token", 0),
                        "fallback_tokens": counts.get("fallback", 0),
                    })
                    bar.record_ends()
                    if writer is not None:
                        writer.write(out_records[-1])
                    made[g] += 1
                    if result.stop_reason != "budget" and (spec.per_label is None or made[g] < spec.per_label):
                        turns.append(g)  # its next turn comes after every other group's
                    stop.check()  # a Ctrl-C between records
            except _Interrupted:
                interrupted = True  # the record under way is dropped; its charges stay in the ledger
            except STORAGE_ERRORS as exc:
                # The ledger could not take a charge (a full disk, a file made read-only meanwhile, a database
                # server gone): the failed charge released nothing (the accountant raised before its mechanism's
                # output left), so the run stops here, keeping the finished records; the ledger holds every charge
                # made before.
                storage_error = (f"the ledger {place.shown!r} could not be written ({exc}): the run stopped "
                                 f"after {len(out_records)} finished record(s)")
            finally:
                bar.close()
            spent = tuple(float(x) for x in acct.spent())
            try:  # whether the data set's budget pays for one more step of this mechanism (a next run)
                another_step = bool(acct.can_afford(mech.event, plan.touches))  # a step of a labelled run counts twice
            except (PateAccountantError, *STORAGE_ERRORS):
                another_step = False
            try:  # the whole records the groups' budgets still pay for, every step charged
                records_afforded = sum(_records_afforded(a, mech.event, k) for a, k in zip(accountants, record_steps))
            except (PateAccountantError, *STORAGE_ERRORS):
                records_afforded = None
            try:
                heads, run_rows, verdict = _ledger_state(ledger, run_id)
            except STORAGE_ERRORS as exc:  # the connection to a database ledger is gone: read it afresh
                heads, run_rows, verdict = _reread_ledger(ledger_path, run_id, exc)
            checkpoint, checkpoint_error = None, None
            if key is not None and storage_error is not None:
                checkpoint_error = ("the run stopped on a ledger that could not be written, so nothing was signed: "
                                    "sign its head once it audits")
            elif key is not None and verdict.ok:
                try:
                    checkpoint = _sign(ledger, key, verdict, checkpoints)
                except (OSError, PateAccountantError) as exc:  # the budget is spent: report, never lose the run
                    checkpoint_error = (f"the signed checkpoint was not written to {str(checkpoints)!r}: "
                                        f"{getattr(exc, 'strerror', None) or exc}")
    except BaseException:
        _discard(ledger)  # a ledger this run created and nobody used is removed; any other is closed
        raise
    try:
        ledger.close()
    except STORAGE_ERRORS:  # closing checkpoints the write-ahead log; on a full disk its rows stay in the log,
        pass  # where the next open of the ledger finds them

    complete = sum(1 for r in out_records if r["complete"])
    cut = len(out_records) - complete
    return {
        "command": command,
        "records": out_records,
        "summary": {"requested": num_records, "complete": complete, "cut_by_budget": cut,
                    "missing": num_records - complete - cut},
        "interrupted": interrupted,
        "out": None if out_file is None else {"path": str(out_file), "written": writer.written,
                                              "keep_partial": bool(spec.keep_partial)},
        "spent": {"epsilon": spent[0], "delta": spent[1]},
        "spent_before": {"epsilon": spent_before[0], "delta": spent_before[1]},
        "remaining": {**acct.remaining_budget().as_dict(), "another_step": another_step,
                      "records_afforded": records_afforded},
        "budget": {"epsilon": budget[0], "delta": budget[1]},
        "within_budget": bool(spent[0] <= budget[0] * (1 + 1e-9) and spent[1] <= budget[1] * (1 + 1e-9)),
        # every charged run of this run, those of a record a Ctrl-C or a ledger failure dropped included
        "charged_runs": max(bar.charged, sum(r["charged_runs"] for r in out_records)),
        "private_tokens": sum(r["private_tokens"] for r in out_records),
        "fallback_tokens": sum(r["fallback_tokens"] for r in out_records),
        "ledger": {"path": place.shown, "rows": heads["rows"], "head_hash": heads["head_hash"], "run": run_id,
                   "runs": heads["runs"], "run_head_hash": heads["run_head_hash"], "run_rows": run_rows,
                   "appended": existing, "dataset": dataset, "checkpoint": checkpoint,
                   "checkpoint_error": checkpoint_error, "write_error": storage_error},
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


#: The most whole records :func:`_records_afforded` counts for one group.
MAX_RECORDS_AFFORDED = 100_000


def _pays_for_records(accountant, event, steps: int, records: int = 1) -> bool:
    """Whether ``accountant`` pays for ``records`` whole records of ``steps`` charged runs each of ``event``, every
    run charged at its worst (a q-target a hit)."""
    return bool(accountant.can_afford(event, steps * records))


def _records_afforded(accountant, event, steps: int) -> int:
    """How many whole records of ``steps`` charged runs ``accountant``'s budget still pays for (at most
    :data:`MAX_RECORDS_AFFORDED`)."""
    if not _pays_for_records(accountant, event, steps):
        return 0
    return largest_fitting(lambda k: k <= MAX_RECORDS_AFFORDED and _pays_for_records(accountant, event, steps, k),
                           start=1)


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


#: The records of one label the public model alone writes side by side (:func:`public_only_run`).
PUBLIC_ROWS = 32


def public_only_run(spec, task, *, progress: bool = False, command: str = "generate") -> dict:
    """The public model alone (``spec.public_only``; docs/generation.md, "The public model alone"): each record is
    written by the model from the template's shared prefix, the public examples (``--public-examples``, the label's
    own with labels) and the open slot, which hold no private record (:func:`public_prompt_list`;
    :func:`~ensembles.generation.public_generate_many`, the draw a private run's public fallback makes; up
    to :data:`PUBLIC_ROWS` records of a label side by side), with no teacher, mechanism or ledger, so nothing is charged and no record reaches the model.  The records are read only
    to check the task as a private run does (the labels, the template); with labels, the records are asked for per
    label in turn and carry their label (the public model knows which label it writes for only from a template
    that names it, ``{label}``, and from the label's public examples).  The result has the shape of :func:`private_run`'s, with ``"public_only":
    true``, nothing spent and no ledger."""
    labels, _ = _check_task(spec, task)
    try:
        out_file = None if spec.out is None else check_out_path(spec.out)
    except ValueError as exc:
        raise RunInputError(str(exc)) from None
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
        if progress:
            print("pate-accountant: loading the model ...", file=sys.stderr, flush=True)
        with quiet_libraries(drop_stderr=True):
            try:
                public = _public_backend(model, spec.threads)
            except OSError as exc:
                raise RunInputError(f"--model: cannot load the model: {_first_line(exc)}") from None
        writer = _open_out(stack, out_file, spec, labels)
        stop = stack.enter_context(_StopOnInterrupt())
        public = _Interruptible(public, stop)
        bar = RunProgress(num_records, progress)
        rng = np.random.default_rng(spec.seed)
        turns = [None] if labels is None else labels
        order = [turns[k % len(turns)] for k in range(num_records)]  # the labels in turn, as a private run asks
        try:
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
        except _Interrupted:
            interrupted = True
        finally:
            bar.close()
    return {
        "command": command, "public_only": True, "records": out_records,
        "summary": {"requested": num_records, "complete": len(out_records), "cut_by_budget": 0,
                    "missing": num_records - len(out_records)},
        "interrupted": interrupted,
        "out": None if out_file is None else {"path": str(out_file), "written": writer.written,
                                              "keep_partial": bool(spec.keep_partial)},
        "spent": {"epsilon": 0.0, "delta": 0.0}, "charged_runs": 0, "private_tokens": 0,
        "fallback_tokens": sum(r["fallback_tokens"] for r in out_records),
        "ledger": None, "parameters": metadata, "spec": metadata["spec"],
    }


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
    with quiet_libraries(drop_stderr=True):
        try:
            backend = _public_backend(model, threads)
        except OSError as exc:
            raise RunInputError(f"--model: cannot load the model: {_first_line(exc)}") from None
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


def _public_backend(model, threads):
    """The public model of a ``--public-only`` run: one backend, no teacher."""
    return TransformersBackend(model, threads=threads)


def _public_count(spec, task) -> int | None:
    """The number of records when it is public (under replace-one, docs/privacy_unit.md), else ``None``."""
    return task.num_records if spec.relation == "replace-one" else None


def _resolve_model(spec, *, announce: bool) -> tuple:
    """``(model folder or file, its label)``: ``embedded`` converted once into its cache folder, else the local
    path ``spec.model``, which must exist (model hubs are not used)."""
    if spec.model == "embedded":
        try:
            return demo_model_path(announce=announce), model_label("embedded")
        except ValueError as exc:
            raise RunInputError(f"argument --model: {exc}") from None
        except OSError as exc:  # a cache folder that cannot be written (a read-only home)
            raise RunInputError(f"argument --model: cannot convert the embedded model into its cache folder: "
                                f"{exc.strerror or exc} ({exc.filename or ''}; set PATE_ACCOUNTANT_CACHE to a "
                                "writable folder)") from None
    model = os.path.expanduser(spec.model)
    if not os.path.exists(model):
        raise RunInputError(f"argument --model: model path {spec.model!r} does not exist (model hubs are not used: "
                            "give a local folder or .gguf file, or 'embedded')")
    return model, model_label(model)


def _fit_to_window(spec, task, plan: _RunPlan, model, *, announce: bool, public_blocks: list[str] | None = None) -> list:
    """The records as the teachers will see them, in their places: each record's text fitted to its share of
    the model's window (:func:`~ensembles.data.record_token_limit`: the window less the template and
    ``spec.max_tokens`` new tokens, over the public number of records one teacher shows, ``plan.per_teacher``,
    never a count of the records) by ``spec.long_records``, each record on its own; a skipped record's place holds
    ``None`` (so the placement moves no other record).  Only the tokenizer and
    the config are read.  A refusal counts the records, never shows one; with ``announce``, what was done is one
    line on stderr (counts only: they describe the data, so they stay on this screen and out of the ledger and
    the result).  The vocabulary's size is checked against a Gaussian mechanism's noise here too
    (:func:`check_noise_floor`).  ``public_blocks``: the public examples the teachers show too
    (:func:`teacher_public_blocks`), whose tokens (the longest group's) leave the records' share of the window."""
    records = task.records
    try:
        with quiet_libraries(drop_stderr=True):
            count_tokens, window, vocab_size = tb.token_window(model)
    except (OSError, ValueError) as exc:
        raise RunInputError(f"argument --model: cannot read its tokenizer or config: {_first_line(exc)}") from None
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


def plural_of(count: int, noun: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _Interrupted(Exception):
    """Raised at a step boundary after a Ctrl-C, or at once inside a model call (:class:`_StopOnInterrupt`)."""


class _Interruptible:
    """A backend whose every method call is a :meth:`_StopOnInterrupt.safe` model call (attributes pass
    through), so that a first Ctrl-C during a long prefill stops the run within one batch."""

    def __init__(self, inner, stop: _StopOnInterrupt):
        self._inner, self._stop = inner, stop

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not inspect.isroutine(value):  # data, and callable objects such as a tokenizer, pass as they are
            return value
        stop = self._stop

        def call(*args, **kwargs):
            with stop.safe():
                return value(*args, **kwargs)

        return call


class _StopOnInterrupt:
    """While a run generates: the first SIGINT only asks the run to stop at the next step boundary (the run
    calls :meth:`check` there) and calls ``on_request`` (the ledger's :meth:`~pate_accountant.ledger.Ledger.interrupt`:
    a database statement the server leaves unanswered then fails within a second instead of at its deadline); a
    second one interrupts at once.  Does nothing outside the main thread."""

    def __init__(self, on_request=None):
        self.requested = False
        self._previous = None
        self._on_request = on_request
        self._safe = 0  # inside a model call (:meth:`safe`), where stopping at once loses nothing

    @contextlib.contextmanager
    def safe(self):
        """A model call (a prefill of the teachers' prompts, a forward, the votes): nothing is charged inside, so a
        first Ctrl-C stops the run there at once instead of waiting for the step to end (a prefill of many long
        prompts takes minutes on a CPU; the backends work in batches, between which Python handles the signal)."""
        self._safe += 1
        try:
            yield
        finally:
            self._safe -= 1

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self._on_request is not None:
            self._on_request()
        if self._safe:
            raise _Interrupted

    def check(self) -> None:
        if self.requested:
            raise _Interrupted

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def _ledger_state(ledger: Ledger, run_id: int):
    """``(heads, rows of run run_id, verdict)`` of ``ledger``: its heads read together, then its audit."""
    heads = ledger.head_record  # rows, head hash, runs and run head hash, read together
    run_rows = sum(1 for row in ledger.rows() if row.run == run_id)
    return heads, run_rows, ledger.verify()


def _reread_ledger(location, run_id: int, failure: BaseException):
    """:func:`_ledger_state` through a new read-only connection, after ``failure`` broke the run's own (a
    database server restarted, a connection cut); when that fails too, unknown heads and a failed audit saying
    why (the ledger keeps every committed charge: ``pate-accountant audit`` checks it once it can be reached)."""
    try:
        with Ledger.open(location, read_only=True) as again:
            return _ledger_state(again, run_id)
    except (PateAccountantError, OSError, *STORAGE_ERRORS) as exc:
        heads = {"rows": None, "head_hash": None, "runs": None, "run_head_hash": None}
        verdict = VerificationResult(False, 0, None, None, f"the ledger could not be read after the run stopped "
                                     f"({_first_line(failure)}; then {_first_line(exc)}): audit it once it can be "
                                     "reached")
        return heads, None, verdict


def _first_line(exc: BaseException) -> str:
    """The first line of a library's error message (its name when it has none), for a one-line usage error."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _routed_dataset(place, dataset: str, asked: str | None, *, announce: bool) -> str:
    """The data set a run without ``--ledger`` charges: when the ledger the index found for these records (by any
    record they share) keeps a data set of another name (the file was renamed, or grew), that data set, said on
    stderr; a ``--dataset`` that names another one is refused, saying which ledger holds the records and why."""
    try:
        with Ledger.open(place.location, read_only=True) as existing:
            stored = existing.dataset
    except (FileNotFoundError, PateAccountantError, OSError, ValueError, *STORAGE_ERRORS):
        return dataset  # a new ledger (or one that cannot be read: the claim says why)
    if stored is None or stored == dataset:
        return dataset
    if asked is not None:
        place.close()
        raise RunInputError(f"--dataset {asked!r}: these records (or some of them) are the data set {stored!r}, whose "
                            f"budget the ledger {place.shown!r} keeps (this installation's index found them there by "
                            "their records' identities): leave --dataset out to charge that budget")
    if announce:
        print(f"pate-accountant: these records (or some of them) are the data set {stored!r}: charged to its ledger "
              f"{place.shown!r}", file=sys.stderr, flush=True)
    return stored


@attr.s(frozen=True, auto_attribs=True)
class _LedgerPlace:
    """Where a run's data set keeps its budget (:func:`_dataset_ledger`)."""

    #: A file's :class:`~pathlib.Path`, or a PostgreSQL ledger's URL (credentials included: never shown).
    location: object
    #: The location as messages and results show it (no password).
    shown: str
    #: The records' fingerprint: under the installation's key for a file, the database's key for PostgreSQL.
    fingerprint: str
    #: Enter the ledger in the index(es) once it is claimed.
    register: object
    #: Let go of the database index's connection (nothing to do for a file).
    close: object = lambda: None

    @property
    def is_url(self) -> bool:
        return not isinstance(self.location, Path)


def _dataset_ledger(ledger_home, records, dataset: str, ledger, *, check: bool = True,
                    text_key: str | None = None) -> _LedgerPlace:
    """Where the budget of ``records`` is kept.  A file: ``ledger`` when given and the installation's ledger home
    knows no other ledger for the records (else, with ``check``, a :class:`RunInputError` naming that ledger),
    else the ledger the home has registered for them, else a new one in the home.  A PostgreSQL URL: the database's
    own data-set index (:class:`~pate_accountant.ledger_home.DatabaseIndex`) decides in the same way across hosts
    (a URL without a ``ledger`` parameter takes the registered ledger, else a new one named after the data set),
    and the installation's home must not know the records under another ledger.  Nothing is registered here
    (:attr:`_LedgerPlace.register`, after the claim)."""
    if ledger_home is False:  # the caller manages its budgets itself: no index is read or written
        if ledger is None:
            raise RunInputError("ledger_home=False (budgets managed by the caller) needs the ledger: give spec.ledger")
        fingerprint = dataset_fingerprint(records, text_key=text_key)
        location = ledger if is_ledger_url(ledger) else Path(ledger)
        return _LedgerPlace(location, shown_location(location), fingerprint, lambda: None)
    home = ledger_home if isinstance(ledger_home, LedgerHome) else LedgerHome(ledger_home)
    local = None  # the records under this installation's key, once
    if ledger is None or not is_ledger_url(ledger):
        where = "--ledger" if ledger is None else f"--ledger {str(ledger)!r}"
        try:
            local = home.identify(records, text_key=text_key)
            registered = home.check(local, ledger) if check else None
            if ledger is None:
                home.prepare()
        except (PateAccountantError, OSError, sqlite3.Error) as exc:
            raise RunInputError(f"{where}: {exc}") from None
        if ledger is not None or not is_ledger_url(registered):
            path = Path(ledger if ledger is not None else registered or home.default_path(dataset, local.fingerprint))
            return _LedgerPlace(path, str(path), local.fingerprint, lambda: home.register(local, dataset, path))
        # the installation knows these records' ledger in a database: run there, reached as the run that registered
        # it reached it (its user and parameters; the password from libpq's files or PGPASSWORD)
        ledger = home.reach(registered) or registered
    where = f"--ledger {shown_location(ledger)!r}"
    try:
        named = ledger_name_of(ledger)
        index = DatabaseIndex(ledger)
    except PateAccountantError as exc:
        raise RunInputError(f"{where}: {exc}") from None
    try:
        shared = index.identify(records, text_key=text_key)
        registered = index.check(shared, named) if check else None
        name = named or registered or index.default_name(dataset, shared.fingerprint)
        identity = index.identity(name)
        local = local or home.identify(records, text_key=text_key)
        if check:
            home.check(local, identity)
    except (PateAccountantError, OSError, sqlite3.Error) as exc:
        index.close()
        raise RunInputError(f"{where}: {exc}") from None

    def register():
        index.register(shared, dataset, name)
        home.register(local, dataset, identity, reach=shown_location(with_ledger_name(ledger, name)))

    location = with_ledger_name(ledger, name)
    return _LedgerPlace(location, shown_location(location), shared.fingerprint, register, index.close)


def _signing(signing_key, checkpoints, ledger_path: Path):
    """The loaded signing key (or ``None``) and the checkpoints file, checked before anything is written."""
    if signing_key is None:  # checkpoints without a key: refused by RunSpec
        return None, None
    try:
        key = load_private_key(signing_key)
    except CheckpointError as exc:
        raise RunInputError(f"--signing-key: {exc}") from None
    try:
        return key, checkpoints_file(ledger_path, checkpoints)
    except CheckpointError as exc:
        raise RunInputError(f"--checkpoints: {exc}") from None


def _sign(ledger: Ledger, key, verdict, checkpoints: Path) -> dict:
    """Sign the ledger's verified head and append the checkpoint; what the result reports of it."""
    try:  # stamped with the start of the last run it covers: the run's duration depends on the data
        checkpoint = sign_checkpoint(ledger, key, verification=verdict, at_run_start=True)
    except PateAccountantError:  # another run charged since the audit: audit the ledger again, then sign
        checkpoint = sign_checkpoint(ledger, key, at_run_start=True)
    append_checkpoint(checkpoints, checkpoint)
    return {"file": str(checkpoints), "key_id": checkpoint["key_id"], "rows": checkpoint["rows"],
            "head_hash": checkpoint["head_hash"]}


def demo_model_path(announce: bool = True) -> Path:
    """The embedded SmolLM2 as a converted safetensors folder (converting the GGUF once; with ``announce``, a
    one-line message on stderr says so, and nothing else is printed: transformers' own conversion bars are
    silenced)."""
    gguf = tb.smollm2_path()
    cached = tb.converted_gguf_path(gguf)
    if announce and not (cached / "config.json").is_file():
        print("pate-accountant: converting the embedded SmolLM2 model once (about 20 s; cached in "
              f"{tb.default_cache_dir()})", file=sys.stderr, flush=True)
    with quiet_libraries(drop_stderr=True):
        return tb.convert_gguf(gguf)

