"""What ``pate-accountant plan best`` compares runs with (docs/planning.md, "The best run: plan best").

* :func:`agreement_count_pmf`: the agreement model's count law (Section 6's alpha mixture, coordinated votes);
* :func:`step_limits`: the limits a run's own accountant puts on it at its budget;
* :func:`expected_steps_to_hits`, :func:`steps_to_hits_quantile`, :func:`run_expectation`: the expected steps and
  private tokens of a run (in groups, docs/groups.md);
* :func:`included_count_pmf`, :func:`individual_charges`, :func:`individual_charging_hits`: the public-candidate
  query's counted teachers and what individual charging allows.

The mechanisms' per-step laws live in the application wing (:mod:`pate_app.planning`), which may import them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pate_accountant import registry
from pate_accountant.accountants.target_charging import target_class
from pate_accountant.planning.comparison import _per_teacher
from pate_accountant.planning.ranges import MAX_PLAN_QUERIES, _check_budget, _check_count, _Result
from pate_accountant.tct import largest_fitting, target_charging_split
from pate_accountant.validation import MAX_COUNT, check_int, check_real

#: The most teachers (in all groups together) a run plan takes: the count law is a vector of ``n + 1`` floats
#: per group size, evaluated for every configuration and step parameter compared.
MAX_PLAN_TEACHERS = 10**6
#: The most steps :func:`step_limits` counts for plain composition (the exact composition of that many steps
#: holds a law of about that many weights); a budget that affords more is reported at this limit, ``capped``.
MAX_PLAN_STEPS = MAX_PLAN_QUERIES


def agreement_count_pmf(num_teachers: int, alpha: float) -> np.ndarray:
    """The law of the shared token's vote count ``c`` (index ``0..n``) in one coordinated histogram of the
    paper's alpha-mixture teachers (Section 6: ``p^(i) = alpha s + (1 - alpha) r^(i)``, one shared token and
    one token of each teacher's own).

    Coordinated votes (Algorithm 1) share one ``u_j ~ Exp(1)`` per token; teacher ``i`` votes for the shared
    token when ``alpha / u_s > (1 - alpha) / u_i``.  Given ``y = u_s / alpha`` this happens with probability
    ``exp(-y (1 - alpha))`` independently over teachers, and ``y ~ Exp(alpha)``, so ``c`` is the beta-binomial
    ``BetaBin(n, alpha / (1 - alpha), 1)`` (``c = n`` when ``alpha = 1``).  The other ``n - c`` teachers vote
    for their own tokens, one vote each.  ``scipy.stats.betabinom``; ``n <= MAX_PLAN_TEACHERS``."""
    from scipy.stats import betabinom

    n = _check_count("num_teachers", num_teachers, 1, MAX_PLAN_TEACHERS,
                     "the count law is a vector of num_teachers + 1 floats for every configuration compared")
    alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0, min_open=True)
    if alpha == 1.0:
        pmf = np.zeros(n + 1)
        pmf[n] = 1.0
        return pmf
    pmf = betabinom.pmf(np.arange(n + 1), n, alpha / (1.0 - alpha), 1.0)
    return pmf / math.fsum(pmf)


def expected_steps_to_hits(hits: int, hit_probability: float, max_steps: int) -> float:
    """``E[min(max_steps, T)]``, ``T`` the step of the ``hits``-th target hit when every step hits independently
    with probability ``p = hit_probability``: the expected number of queries a target-charged run makes before
    its accountant stops it (at ``hits`` hits or ``max_steps`` queries, whichever comes first).

    The hits among the first ``min(max_steps, T)`` steps are ``min(hits, X)`` with ``X ~ Bin(max_steps, p)``, and
    that number of steps is a stopping time, so by Wald's identity ``p E[min(max_steps, T)] = E[min(hits, X)] =
    sum_{h < hits} P[X > h]``.  ``p = 0`` gives ``max_steps``; ``hits = 0`` gives 0 (no query runs)."""
    hits = check_int("hits", hits, minimum=0)
    p = check_real("hit_probability", hit_probability, minimum=0.0, maximum=1.0)
    max_steps = check_int("max_steps", max_steps, minimum=0)
    if hits == 0 or max_steps == 0:
        return 0.0
    if p == 0.0:
        return float(max_steps)
    from scipy.stats import binom

    below = float(np.sum(binom.sf(np.arange(hits), max_steps, p)))
    return min(float(max_steps), below / p)


def steps_to_hits_quantile(hits: int, hit_probability: float, level: float, max_steps: int) -> int:
    """The ``level`` quantile of ``min(max_steps, T)`` (:func:`expected_steps_to_hits`): ``T - hits`` is negative
    binomial.  Used to give a run enough records that they rarely end it before its budget does."""
    hits = check_int("hits", hits, minimum=0)
    p = check_real("hit_probability", hit_probability, minimum=0.0, maximum=1.0)
    level = check_real("level", level, minimum=0.0, maximum=1.0, min_open=True, max_open=True)
    max_steps = check_int("max_steps", max_steps, minimum=0)
    if hits == 0 or max_steps == 0:
        return 0
    if p == 0.0:
        return max_steps
    from scipy.stats import nbinom

    failures = float(nbinom.ppf(level, hits, p))
    return max_steps if not math.isfinite(failures) or hits + failures >= max_steps else hits + int(failures)


@dataclasses.dataclass(frozen=True)
class StepLimits(_Result):
    """What :func:`step_limits` returns: how far the budget ``(epsilon, delta)`` lets one group of a run go with
    one mechanism under one accountant, as that accountant (built by ``generate``) counts it.

    Plain composition (every step charged): ``max_steps`` (``capped`` when the budget affords at least
    :data:`MAX_PLAN_STEPS`); target charging: ``max_hits`` target hits and ``max_queries`` queries, hits or not.
    """

    accountant: str
    epsilon: float
    delta: float
    max_steps: int | None
    max_hits: int | None
    max_queries: int | None
    capped: bool


def step_limits(accountant: str, event, epsilon: float, delta: float) -> StepLimits:
    """The limits the ``accountant`` registered under that name (:mod:`pate_accountant.registry`, with its
    defaults, as ``generate`` builds it) puts on a run of steps that each announce ``event``, at budget
    ``(epsilon, delta)``.

    * ``"target-charging"``: the split the accountant makes at its first query
      (:func:`pate_accountant.tct.target_charging_split` of the event's class, checked as the accountant checks
      it, :func:`~pate_accountant.accountants.target_charging.target_class`): its ``max_hits`` and
      ``max_queries``.
    * any other accountant: the largest ``k`` such that ``can_afford(event, k)`` on a fresh budgeted accountant
      (doubling, then bisection; the accountant's own composition, so the count is never above what it allows).

    Raises ``UnsupportedEventError`` when the accountant cannot account for the event."""
    epsilon, delta = _check_budget(epsilon, delta)
    cls = registry.accountant_class(accountant)
    if accountant == "target-charging":
        probe = cls()
        target = target_class(event)
        split = target_charging_split(epsilon, delta, target.epsilon0, target.q, target.query_delta,
                                      share=probe.query_delta_share, composition=probe.composition)
        return StepLimits(accountant, epsilon, delta, None, split.max_hits, split.max_queries, False)

    build = getattr(cls, "for_run", cls)  # as generate builds it (Accountant.for_run), where the class has that

    def fits(k: int) -> bool:
        return build(budget=(epsilon, delta)).can_afford(event, k)

    if not fits(1):
        return StepLimits(accountant, epsilon, delta, 0, None, None, False)
    # never probe beyond the cap: an accountant composing that many steps at once needs memory in proportion
    steps = largest_fitting(lambda k: k <= MAX_PLAN_STEPS and fits(k), start=1)
    return StepLimits(accountant, epsilon, delta, steps, None, None, steps == MAX_PLAN_STEPS)


@dataclasses.dataclass(frozen=True)
class RunExpectation(_Result):
    """What :func:`run_expectation` returns: ``steps`` (charged mechanism runs, all groups), ``tokens`` (private
    tokens released) and ``exact``: whether they are expected values under the model, or lower bounds."""

    steps: float
    tokens: float
    exact: bool


def run_expectation(limits: StepLimits, token_probability: float, target_probability: float = 0.0, *,
                    groups: int = 1, steps_per_group: int | None = None) -> RunExpectation:
    """The expected charged steps and private tokens of a run of ``groups`` disjoint groups, each step of which
    independently releases a private token with probability ``token_probability`` (and, under target charging,
    hits the target with probability ``target_probability``).  ``steps_per_group``: the most steps a group's
    records leave it (``None``: no limit but the budget's).

    Groups compose in parallel (docs/groups.md): under plain composition each group may make ``max_steps`` steps;
    under target charging each group may reach ``max_hits`` hits, while the queries of all groups together pay
    the one query reserve (``max_queries`` in all).  With one group the figure is the expected value
    (:func:`expected_steps_to_hits`); with several groups under target charging it is a lower bound, each group
    counted up to ``max_queries // groups`` queries (``min(Q, sum x_g) >= sum min(Q/G, x_g)``), exact when the
    records cap the groups below that."""
    groups = check_int("groups", groups, minimum=1)
    p = check_real("token_probability", token_probability, minimum=0.0, maximum=1.0)
    t = check_real("target_probability", target_probability, minimum=0.0, maximum=1.0)
    cap = None if steps_per_group is None else check_int("steps_per_group", steps_per_group, minimum=0)
    if limits.max_steps is not None:  # plain composition: every step charged, each group its own envelope
        per_group = limits.max_steps if cap is None else min(limits.max_steps, cap)
        return RunExpectation(float(groups * per_group), groups * per_group * p, True)
    share = limits.max_queries // groups
    per_group_cap = share if cap is None else min(share, cap)
    steps = groups * expected_steps_to_hits(limits.max_hits, t, per_group_cap)
    exact = groups == 1 or (cap is not None and groups * cap <= limits.max_queries)
    return RunExpectation(steps, steps * p, exact)


# -- the public-candidate query and individual charging (``plan best``) --------------------------------------


def included_count_pmf(count_pmf, num_teachers: int) -> np.ndarray:
    """The law of ``c'``, the number of teachers counted by one individual-charging query on a candidate token
    whose vote count ``c`` has the law ``count_pmf`` (index ``0..m``), with ``n = num_teachers`` teachers: the
    generator includes each teacher independently with probability ``nu ~ U[1/n, 1]``
    (``ensembles.generation.individual_charging_draws``), so ``c' | c, nu ~ Bin(c, nu)``.

    Integrating over ``nu``: ``P[c' = k | c] = (1 - P[Bin(c + 1, 1/n) >= k + 1]) / ((c + 1)(1 - 1/n))`` for
    ``0 <= k <= c`` (over ``U[0, 1]`` the binomial mixture is uniform on ``0..c``; the part of ``nu`` below ``1/n``
    is taken off through ``I_{1/n}(k + 1, c - k + 1) = P[Bin(c + 1, 1/n) >= k + 1]``).  The binomial of mean at
    most ``(m + 1)/n`` has a short tail, which is summed up to where it is below ``1e-30``.  ``n = 1``: ``nu = 1``,
    ``c' = c``.  Returns an array of ``m + 1`` probabilities."""
    pmf = np.asarray(count_pmf, dtype=np.float64)
    if pmf.ndim != 1 or pmf.size < 1 or not np.all(np.isfinite(pmf)) or (pmf < 0).any():
        raise ValueError("count_pmf must be a non-empty vector of non-negative probabilities")
    n = _check_count("num_teachers", num_teachers, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    if n == 1:
        return pmf.copy()
    m = pmf.size - 1
    c = np.arange(m + 1, dtype=np.float64)
    weight = pmf / ((c + 1.0) * (1.0 - 1.0 / n))
    out = np.cumsum(weight[::-1])[::-1]  # W(k) = sum_{c >= k} w(c)
    # u_k = sum_c w(c) P[Bin(c + 1, x) >= k + 1] = sum_{j > k} v_j with v_j = sum_c w(c) P[Bin(c + 1, x) = j],
    # x = 1/n: the binomials' laws by their ratio recurrence, until past their mode and below 1e-40.
    x = 1.0 / n
    ratio = x / (1.0 - x)
    law = np.exp((c + 1.0) * math.log1p(-x))  # P[Bin(c + 1, x) = 0]
    v = [float(weight @ law)]
    mode = (m + 2) * x
    for j in range(m + 1):
        law = law * np.maximum(c - j + 1.0, 0.0) / (j + 1.0) * ratio  # P[Bin(c + 1, x) = j + 1]
        v.append(float(weight @ law))
        if j + 1 > mode and float(law.max()) < 1e-40:
            break
    tail = np.cumsum(np.asarray(v)[::-1])[::-1]  # tail[j] = sum_{i >= j} v_i
    k = min(m + 1, tail.size - 1)
    out[:k] -= tail[1:k + 1]
    return np.clip(out, 0.0, None)


def individual_charges(hits: int, charged_per_hit: int, num_teachers: int, spread: str = "worst") -> int:
    """The worst teacher's charges after ``hits`` individual-charging hits that each charge
    ``charged_per_hit`` of ``num_teachers`` teachers: ``"worst"``, every hit charges the same teachers (the
    worst teacher is charged on every hit: ``hits``, the sound assumption when nothing is known of who is
    counted); ``"even"``, the charges are spread evenly, :func:`compare_accounting`'s rule
    ``min(hits, ceil(hits g / n))`` (optimistic)."""
    hits = check_int("hits", hits, minimum=0)
    n = _check_count("num_teachers", num_teachers, 1, MAX_COUNT, "2^53, the largest integer float64 holds exactly")
    g = check_int("charged_per_hit", charged_per_hit, minimum=1, maximum=n)
    if spread == "worst":
        return hits
    if spread == "even":
        return _per_teacher(hits, g, n)
    raise ValueError(f"spread must be 'worst' or 'even', got {spread!r}")


def individual_charging_hits(per_teacher_limit: int, charged_per_hit: int, num_teachers: int,
                             spread: str = "worst", *, max_hits: int = MAX_PLAN_STEPS) -> int:
    """The most hits a run under individual charging makes before its worst teacher reaches
    ``per_teacher_limit`` charges, under the ``spread`` of :func:`individual_charges` (at most ``max_hits``):
    ``"worst"`` gives the limit itself (a sound plan: whoever is counted, no teacher is charged more often than
    every hit), ``"even"`` about ``limit x n / g`` (what the run could reach if the counted teachers changed
    evenly from hit to hit)."""
    limit = check_int("per_teacher_limit", per_teacher_limit, minimum=0)
    max_hits = check_int("max_hits", max_hits, minimum=0)
    individual_charges(0, charged_per_hit, num_teachers, spread)  # checks the arguments
    if spread == "worst":
        return min(limit, max_hits)
    return largest_fitting(lambda h: h <= max_hits and _per_teacher(h, charged_per_hit, num_teachers) <= limit)
