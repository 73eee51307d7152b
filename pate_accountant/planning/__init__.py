"""Budget planning: the questions a user asks before a run (docs/planning.md).

Every function validates its arguments (``TypeError`` / ``ValueError`` naming the parameter) and returns
a frozen dataclass holding the numbers *and* the assumptions behind them; ``.as_dict()`` gives a
JSON-able dict (``None`` for an infinite or undefined value).

* :func:`target_hits`: how many target hits a budget ``(epsilon, delta)`` buys for ``q``-target queries at
  level ``eps0`` (the TCT bound of docs/tct_and_individual.md section 1, split as :func:`pate_accountant.tct.target_charging_split`
  splits it), next to the number of plain ``eps0``-DP queries basic / DRV / KOV / exact optimal
  composition allows.
* :func:`teachers_for`, :func:`c_delta`: the paper's ensemble size ``n = C_delta / eps0`` with
  ``C_delta = 2 ln(1/delta0)`` (Section "Privacy analysis considerations").
* :func:`yields`: the expected number of yields (tokens) the budget buys, by the paper's relation
  "yields per target hit ~ eps0 n / 2" (regime ``alpha <= T/n``, the worst case over alpha);
  :func:`yields_for_hits` gives the same for the hits of a :func:`target_hits` plan already made.
* :func:`plan_for_tokens`: the largest ``eps0`` (fewest teachers ``n = C_delta / eps0``) that buys at
  least a wanted number of yields, calibrated so the plan never overshoots the budget.
* :func:`compare_accounting`: one run shape accounted three ways: plain composition of every query,
  target charging (TCT), individual (per-teacher) charging.
* :func:`bassily_tt_teachers`, :func:`bassily_tt_tokens`: the BassilyTT margin condition
  ``eta n >= 32 sqrt(2)/eps ln(4m/delta) sqrt(ln(2/delta))`` of Appendix D (docs/planning.md).
* :func:`agreement_count_pmf`, :func:`step_limits`, :func:`expected_steps_to_hits`, :func:`run_expectation`: what
  ``pate-accountant plan best`` compares runs with: the agreement model's count law (Section 6's alpha mixture),
  the limits a run's own accountant puts on it, and the expected steps and private tokens of a run (the
  mechanisms' per-step laws live in the application wing, :mod:`pate_app.planning`).

``delta0`` (every target-charging function): the ``delta_A`` of a boundary-wrapped approximate-DP inner
aggregator (``0``, the default and the paper's figure, for a pure inner).  Every query of such an inner, hit
or not, pays the mixture weight ``w = 1 - (1 - delta0)^2`` in delta
(:func:`pate_accountant.tct.wrapped_query_delta`; docs/tct_and_individual.md, section 1), so a share
``query_delta_share`` of ``delta`` (default one half) is reserved for them and the budget also limits the
number of queries (``max_queries``), exactly as a budgeted ``TargetChargingAccountant`` does.

Ranges (docs/ranges.md): the budget epsilon lies in ``(0, MAX_BUDGET_EPSILON]``, ``eps0`` in ``[MIN_EPS0, MAX_EPS0]``,
deltas in ``[1e-300, 1)``, ``q`` in ``[MIN_Q, 1]``; the work a plan would do is estimated first and a search past
``MAX_SEARCH_STEPS`` composed steps (or one bound past ``MAX_BOUND_DRAWS`` draws, or ``MAX_PLAN_QUERIES``
queries) is refused with a ``ValueError`` naming the parameter, before it starts.

Neighbouring relation: the one the per-query level ``eps0`` is stated under (by default one teacher's
vote changes, paper Observation 1); planning itself does not change it.  This package imports only the
standard library, numpy, scipy and ``pate_accountant`` (never ``mechanisms`` or ``ensembles``).

Its modules, each name re-exported here (``from pate_accountant.planning import target_hits`` and
``planning.target_hits`` are the paths to use):

* :mod:`~pate_accountant.planning.ranges`: the documented ranges, the defaults, the argument checks and the
  results' base;
* :mod:`~pate_accountant.planning.bounds`: target hits (the TCT bound), plain composition, the paper's relations;
* :mod:`~pate_accountant.planning.step_deltas`: the per-query delta a run is given;
* :mod:`~pate_accountant.planning.tokens`: yields, and the plan for a wanted number of tokens;
* :mod:`~pate_accountant.planning.comparison`: plain vs target vs individual charging;
* :mod:`~pate_accountant.planning.margin`: the BassilyTT margin condition;
* :mod:`~pate_accountant.planning.agreement`: the agreement model and a run's limits (``plan best``).
"""

from pate_accountant.planning.agreement import (
    MAX_PLAN_STEPS,
    MAX_PLAN_TEACHERS,
    RunExpectation,
    StepLimits,
    agreement_count_pmf,
    expected_steps_to_hits,
    included_count_pmf,
    individual_charges,
    individual_charging_hits,
    run_expectation,
    step_limits,
    steps_to_hits_quantile,
)
from pate_accountant.planning.bounds import (
    PLAIN_METHODS,
    TargetHitsPlan,
    c_delta,
    paper_target_hits,
    plain_epsilon,
    plain_max_queries,
    target_hits,
    teachers_for,
)
from pate_accountant.planning.comparison import (
    AccountingComparison,
    compare_accounting,
)
from pate_accountant.planning.margin import (  # noqa: F401  (BTT_CONSTANT: re-exported)
    BTT_CONSTANT,
    BassilyTTTeachers,
    BassilyTTTokens,
    bassily_tt_teachers,
    bassily_tt_tokens,
)
from pate_accountant.planning.ranges import (  # noqa: F401  (the defaults: re-exported)
    DEFAULT_AGGREGATOR_DELTA,
    DEFAULT_QUERY_DELTA_SHARE,
    MAX_BOUND_DRAWS,
    MAX_BUDGET_EPSILON,
    MAX_EPS0,
    MAX_PLAN_QUERIES,
    MAX_SEARCH_STEPS,
    MIN_EPS0,
    MIN_Q,
    MIN_TARGET_RATE,
    estimated_steps,
)
from pate_accountant.planning.step_deltas import (  # noqa: F401  (re-exported)
    MIN_STEP_DELTA,
    QUERY_MARGIN,
    expected_queries,
    step_delta_for_queries,
)
from pate_accountant.planning.tokens import (
    TokensPlan,
    YieldsPlan,
    max_plannable_tokens,
    plan_for_tokens,
    yields,
    yields_for_hits,
)

__all__ = [
    "MAX_BOUND_DRAWS",
    "MAX_BUDGET_EPSILON",
    "MAX_EPS0",
    "MAX_PLAN_QUERIES",
    "MAX_PLAN_STEPS",
    "MAX_PLAN_TEACHERS",
    "MAX_SEARCH_STEPS",
    "MIN_EPS0",
    "MIN_Q",
    "MIN_TARGET_RATE",
    "PLAIN_METHODS",
    "AccountingComparison",
    "BassilyTTTeachers",
    "BassilyTTTokens",
    "RunExpectation",
    "StepLimits",
    "TargetHitsPlan",
    "TokensPlan",
    "YieldsPlan",
    "agreement_count_pmf",
    "bassily_tt_teachers",
    "bassily_tt_tokens",
    "c_delta",
    "compare_accounting",
    "estimated_steps",
    "expected_queries",
    "expected_steps_to_hits",
    "included_count_pmf",
    "individual_charges",
    "individual_charging_hits",
    "max_plannable_tokens",
    "paper_target_hits",
    "plain_epsilon",
    "plain_max_queries",
    "plan_for_tokens",
    "run_expectation",
    "step_delta_for_queries",
    "step_limits",
    "steps_to_hits_quantile",
    "target_hits",
    "teachers_for",
    "yields",
    "yields_for_hits",
]
