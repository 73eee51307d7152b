"""The application wing's planning (docs/planning.md): the planner behind ``pate-accountant plan best`` and the
runs every ``plan`` answer prints.  It lives in the wing because it builds the run mechanisms (``mechanisms``) and
checks runs as ``generate`` does (:mod:`pate_app.run`), which the library's own planning
(:mod:`pate_accountant.planning`, the budget questions and the agreement model's laws) may not import.

Its modules, each name re-exported here (``from pate_app.planning import BestPlanner`` is the path to use):

* :mod:`~pate_app.planning.configurations`: what ``plan best`` compares: the (mechanism, accountant)
  configurations, the grid of step epsilons and deltas, the group counts;
* :mod:`~pate_app.planning.outcomes`: the mechanisms' per-step laws on the agreement model (Section 6's alpha
  mixture): :func:`per_count_outcomes`, :func:`public_candidate_outcomes`;
* :mod:`~pate_app.planning.planner`: :class:`BestPlanner`, which compares the configurations for one budget and
  agreement, and :func:`needed_teachers`;
* :mod:`~pate_app.planning.best`: :func:`plan_best`, the answer of ``plan best``: the runs ``generate`` would
  accept (:func:`check_best_run`) with their commands (:func:`best_run_argv`), what was not compared and why, the
  assumptions;
* :mod:`~pate_app.planning.runs`: the ``generate`` command a target-charging or plain plan prints, and what that
  exact run is charged and can release (:func:`run_plan`, :func:`plain_run_plan`).

The command (:mod:`pate_app.commands.plan`) parses, calls these and prints.
"""

from pate_app.options import DEFAULT_VOCAB_SIZE, PUBLIC_AGREEMENT_OPTION
from pate_app.planning.best import (
    INDIVIDUAL_CHARGING_WHY,
    PUBLIC_AGREEMENT_WHY,
    best_run_argv,
    check_best_run,
    plan_best,
)
from pate_app.planning.configurations import (
    BEST_CONFIGURATIONS,
    BEST_STEP_DELTA_DECADES,
    BEST_STEP_EPSILONS,
    GAUSSIAN,
    GAUSSIAN_MAX_SIGMA,
    PUBLIC_CANDIDATE,
    PUBLIC_CANDIDATE_CONFIGURATIONS,
    RECORDS_QUANTILE,
    SUBSAMPLE_RATES,
    SUBSAMPLED_CONFIGURATIONS,
    best_step_deltas,
    gaussian_step_delta,
    group_counts,
)
from pate_app.planning.outcomes import per_count_outcomes, public_candidate_outcomes
from pate_app.planning.planner import BestPlanner, needed_teachers
from pate_app.planning.runs import (
    RUN_ACCOUNTANT,
    RUN_MECHANISM,
    RUN_PLACEHOLDERS,
    RUN_RELATION,
    plain_run_plan,
    run_accountant_composition,
    run_plan,
)

__all__ = [
    "BEST_CONFIGURATIONS",
    "BEST_STEP_DELTA_DECADES",
    "BEST_STEP_EPSILONS",
    "DEFAULT_VOCAB_SIZE",
    "GAUSSIAN",
    "GAUSSIAN_MAX_SIGMA",
    "INDIVIDUAL_CHARGING_WHY",
    "PUBLIC_AGREEMENT_OPTION",
    "PUBLIC_AGREEMENT_WHY",
    "PUBLIC_CANDIDATE",
    "PUBLIC_CANDIDATE_CONFIGURATIONS",
    "RECORDS_QUANTILE",
    "RUN_ACCOUNTANT",
    "RUN_MECHANISM",
    "RUN_PLACEHOLDERS",
    "RUN_RELATION",
    "SUBSAMPLED_CONFIGURATIONS",
    "SUBSAMPLE_RATES",
    "BestPlanner",
    "best_run_argv",
    "best_step_deltas",
    "check_best_run",
    "gaussian_step_delta",
    "group_counts",
    "needed_teachers",
    "per_count_outcomes",
    "plain_run_plan",
    "plan_best",
    "public_candidate_outcomes",
    "run_accountant_composition",
    "run_plan",
]
