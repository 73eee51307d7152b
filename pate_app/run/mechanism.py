"""A run's mechanism and accountant, built from their registered names: :func:`build_mechanism` (with
``--subsample-teachers``, :func:`subsampled_mechanism`), :func:`spec_mechanism` for a
:class:`~pate_app.spec.RunSpec`, :func:`build_accountant`, and the teachers one step counts (:func:`voters`)."""

from __future__ import annotations

from mechanisms import BetweenThresholds, BoundaryWrapper
from mechanisms import registry as mechanisms_registry
from mechanisms.base import reads_distributions
from mechanisms.subsampled import SubsampledTeachers
from pate_accountant import registry as accountants_registry
from pate_accountant.events import ADD_REMOVE_ONE
from pate_app.errors import RunInputError
from pate_app.privacy_unit import TEACHER_RELATION

__all__ = ["RELATIONS", "build_accountant", "build_mechanism", "kept_teachers", "spec_mechanism",
           "subsampled_mechanism", "voters"]

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


def _inner(mechanism):
    """The mechanism a boundary wrapper or subsampled teachers wrap, or the mechanism itself."""
    return mechanism.inner if isinstance(mechanism, (BoundaryWrapper, SubsampledTeachers)) else mechanism


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
