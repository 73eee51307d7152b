"""The planner of ``pate-accountant plan best`` (docs/planning.md, "The best run: plan best"): for one budget,
relation and agreement ``alpha``, every configuration of :mod:`pate_app.planning.configurations` at its best step
on the grid, in one group and in groups, ranked by the private tokens it is expected to release
(:class:`BestPlanner`); and about the fewest teachers for which some run releases one (:func:`needed_teachers`).

Each figure is a limit of the run's own accountant (:func:`pate_accountant.planning.step_limits`) and a per-step
law of its mechanism (:mod:`pate_app.planning.outcomes`) on the agreement model's count law
(:func:`pate_accountant.planning.agreement_count_pmf`).
"""

from __future__ import annotations

import math

from mechanisms import GaussianThresholdArgMax
from pate_accountant import planning, registry
from pate_accountant.accountants.individual import individual_epsilon
from pate_accountant.errors import PateAccountantError
from pate_accountant.tct import NO_LIMIT
from pate_app.options import DEFAULT_VOCAB_SIZE
from pate_app.planning.configurations import (
    BEST_CONFIGURATIONS,
    BEST_STEP_EPSILONS,
    GAUSSIAN,
    GAUSSIAN_MAX_SIGMA,
    PUBLIC_CANDIDATE,
    PUBLIC_CANDIDATE_CONFIGURATIONS,
    RECORDS_QUANTILE,
    SUBSAMPLED_CONFIGURATIONS,
    best_step_deltas,
    gaussian_step_delta,
)
from pate_app.planning.outcomes import per_count_outcomes, public_candidate_outcomes
from pate_app.run import (
    TEACHER_RELATION,
    RunInputError,
    SubsampledTeachers,
    build_mechanism,
    check_noise_floor,
    check_reachable,
    kept_teachers,
)


def _sigma_guess(e: float, d: float) -> float:
    """About the noise ``calibrate_sigma(e, d)`` finds under replace-one (the classical Gaussian mechanism's
    ``sqrt(2 ln(1.25/d) x 2) / e``; two counts move), to skip a calibration that cannot pay off."""
    return math.sqrt(4.0 * math.log(1.25 / d)) / e


class BestPlanner:
    """Compares the runs of :data:`BEST_CONFIGURATIONS` for one budget, relation and agreement ``alpha``
    (docs/planning.md, ``plan best``).  What does not depend on the number of teachers (the mechanisms, the
    accountants' limits) is computed once and reused for every group size."""

    def __init__(self, *, budget_epsilon: float, budget_delta: float, relation: str, alpha: float,
                 max_tokens: int, records: int | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 public_agreement: float | None = None):
        self.budget = (float(budget_epsilon), float(budget_delta))
        self.vocab_size = int(vocab_size)
        self.relation, self.alpha, self.max_tokens, self.records = relation, float(alpha), int(max_tokens), records
        #: ``--public-agreement``: the probability that the public model's candidate is the shared token (``None``:
        #: not stated, and the public-candidate query is not compared).
        self.public_agreement = None if public_agreement is None else float(public_agreement)
        pairs = BEST_CONFIGURATIONS + (PUBLIC_CANDIDATE_CONFIGURATIONS if self.public_agreement is not None else ())
        #: ``(mechanism, accountant, rate)``: ``rate`` that of ``--subsample-teachers`` (``None``: every teacher).
        self.configurations = tuple((name, accountant, None) for name, accountant in pairs) + SUBSAMPLED_CONFIGURATIONS
        self._included: dict = {}
        self._mechanisms: dict = {}
        self._limits: dict = {}
        self._pmfs: dict = {}
        self._inclusion: dict = {}
        self.refused: dict = {}  # mechanism -> why generate refuses to build it (at some step on the grid)
        self.built: set = set()  # the mechanisms built at some step

    # -- what does not depend on n ------------------------------------------------------------------------------
    def grid(self, name: str) -> list[tuple[float, float]]:
        if name in GAUSSIAN:
            deltas = (gaussian_step_delta(self.budget[1]),)
        elif name == PUBLIC_CANDIDATE:  # a pure query: generate checks its step delta and leaves it unused
            deltas = best_step_deltas(self.budget[1])[:1]
        else:
            deltas = best_step_deltas(self.budget[1])
        return [(e, d) for e in BEST_STEP_EPSILONS for d in deltas]

    def mechanism(self, name: str, e: float, d: float, num_teachers: int | None = None, rate: float | None = None):
        """The mechanism ``name`` at step ``(e, d)`` as ``generate`` builds it (``None`` when it refuses); ``rate``:
        on teachers subsampled at that rate (``--subsample-teachers``).  The threshold form of GNMax is the
        calibrated ``gaussian-argmax`` (the same noise and event) with the threshold ``n//2 + 1`` of the teachers a
        step counts (``num_teachers``, or the :func:`~pate_app.run.kept_teachers` of them when subsampled; without
        them, the plain form): what ``for_teachers`` builds, calibrated once."""
        built = "gaussian-argmax" if name == "gaussian-threshold-argmax" else name
        key = (built, e, d, num_teachers) if name == PUBLIC_CANDIDATE else (built, e, d, rate)
        if key not in self._mechanisms:
            try:  # BetweenThresholds: its thresholds from the teachers of one group; one record moves one vote
                self._mechanisms[key] = build_mechanism(built, e, d, TEACHER_RELATION, num_teachers=(
                    num_teachers if name == PUBLIC_CANDIDATE else None), subsample=rate)
            except RunInputError as exc:
                self._mechanisms[key] = None
                self.refused.setdefault(built, str(exc))
            else:
                self.built.add(built)
        base = self._mechanisms[key]
        if base is None or built == name or num_teachers is None:  # (BetweenThresholds: built == name)
            return base

        plain, votes = (base, num_teachers) if rate is None else (base.inner, kept_teachers(num_teachers, rate))
        thresholded = GaussianThresholdArgMax(plain.sigma, relation=plain.relation, epsilon=plain.epsilon,
                                              threshold=votes // 2 + 1)
        return thresholded if rate is None else SubsampledTeachers(thresholded, rate, base.relation)

    def within_planning_limit(self, level: float) -> bool:
        """Whether a budget search at ``level`` stays within the planning limit (docs/ranges.md)."""
        key = ("level", level)
        if key not in self._limits:
            epsilon, delta = self.budget
            self._limits[key] = planning.estimated_steps(epsilon, delta, level) <= planning.MAX_SEARCH_STEPS
        return self._limits[key]

    def limits(self, accountant: str, mechanism):
        """:func:`pate_accountant.planning.step_limits` of ``mechanism`` under ``accountant`` (``None``: refused)."""
        key = (accountant, mechanism.event)
        if key not in self._limits:
            try:
                if accountant == "individual-charging":
                    self._limits[key] = self._individual_limits(mechanism)
                else:
                    self._limits[key] = planning.step_limits(accountant, mechanism.event, *self.budget)
            except (PateAccountantError, ValueError):
                self._limits[key] = None
        return self._limits[key]

    def individual_accountant(self, mechanism, num_teachers: int):
        """The individual-charging accountant ``generate`` builds for the public-candidate ``mechanism`` with
        ``num_teachers`` teachers (``Accountant.for_run``): its per-teacher limit is derived from the budget for the
        query's epsilon and gap.  Raises ``ValueError`` when the budget affords no charge."""
        return registry.accountant_class("individual-charging").for_run(
            budget=self.budget, mechanism=mechanism, num_teachers=num_teachers)

    def _individual_limits(self, mechanism):
        """Individual charging planned for the worst teacher charged on every hit: the run's hits are at most the
        per-teacher limit (a sound plan whoever is counted), and a pure query has no query limit."""
        accountant = self.individual_accountant(mechanism, 1)  # the limit does not depend on the teachers
        tau = accountant.per_teacher_limit
        return planning.StepLimits("individual-charging", *self.budget, None, int(tau), NO_LIMIT, False)

    def included(self, n: int):
        """``(shared, other)``: the laws of the counted teachers ``c'`` (:func:`pate_accountant.planning.
        included_count_pmf`) when the candidate is the shared token (its count from the agreement model) and
        when it is another token (one vote: a token of one teacher's own, the most any other token has in the
        model)."""
        if n not in self._included:
            self._included = {n: (planning.included_count_pmf(self.count_pmf(n), n),
                                  planning.included_count_pmf([0.0, 1.0], n))}
        return self._included[n]

    def count_pmf(self, n: int):
        if n not in self._pmfs:
            self._pmfs = {n: planning.agreement_count_pmf(n, self.alpha)}  # one size at a time
        return self._pmfs[n]

    # -- one configuration at one group size --------------------------------------------------------------------
    def evaluate(self, name: str, accountant: str, num_teachers: int, groups: int, floor: float = 0.0,
                 rate: float | None = None) -> dict | None:
        """The best step ``(epsilon, delta)`` of one configuration with ``groups`` groups of ``num_teachers //
        groups`` teachers (``rate``: subsampled at it): the entry with the most expected private tokens, or ``None``
        when no step releases more than ``floor``.  A step whose charged steps alone (each releasing at most one
        token) cannot beat the best so far is not evaluated."""
        n = num_teachers // groups
        if n < 1:
            return None
        best = None
        for e, d, mechanism, limits, bound in self._candidates(name, accountant, n, groups, rate):
            if bound <= max(floor, 0.0 if best is None else best["expected_private_tokens"]):
                continue
            if name == PUBLIC_CANDIDATE:
                law = public_candidate_outcomes(mechanism, n, *self.included(n), self.public_agreement)
                p_token, p_target, exact = law["token"], law["target"], False
                if p_token <= 0.0:
                    continue
                records, cap = self._records(limits, p_target, groups)
                expectation = planning.run_expectation(limits, p_token, p_target, groups=groups, steps_per_group=cap)
                entry = self._entry(name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target,
                                    exact, records, limits, mechanism)
                entry["counted_per_hit"] = law["counted_per_hit"]
                entry["public_agreement"] = self.public_agreement
                if entry["expected_private_tokens"] > max(floor, 0.0 if best is None else
                                                          best["expected_private_tokens"]):
                    best = entry
                continue
            inclusion = None
            if name.endswith("dp-weighted-sampling"):  # the plain and the wrapped DPWS share their inner's table
                inner = getattr(mechanism, "inner", mechanism)
                key = (inner.epsilon, inner.delta, n)
                if key not in self._inclusion:
                    self._inclusion = {key: inner.inclusion_probabilities(n),
                                       **{k: v for k, v in self._inclusion.items() if k[2] == n}}
                inclusion = self._inclusion[key]
            token, target, exact = per_count_outcomes(name, self.mechanism(name, e, d, n, rate) if rate else mechanism,
                                                      n, self.vocab_size, inclusion=inclusion)
            pmf = self.count_pmf(n)
            p_token, p_target = float(pmf @ token), float(pmf @ target)
            if p_token <= 0.0:
                continue
            records, cap = self._records(limits, p_target, groups)
            expectation = planning.run_expectation(limits, p_token, p_target, groups=groups, steps_per_group=cap)
            entry = self._entry(name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target, exact,
                                records, limits, mechanism)
            entry["subsample_teachers"] = rate
            if entry["expected_private_tokens"] > max(floor, 0.0 if best is None else best["expected_private_tokens"]):
                best = entry
        if best is not None:
            best["built"] = self.mechanism(name, best["step_epsilon"], best["step_delta"], n, rate)
        return best

    def _entry(self, name, accountant, num_teachers, groups, e, d, expectation, p_token, p_target, exact, records,
               limits, mechanism) -> dict:
        return {
            "mechanism": name, "accountant": accountant, "groups": groups, "teachers": num_teachers,
            "teachers_per_group": num_teachers // groups, "step_epsilon": e, "step_delta": d,
            "expected_private_tokens": expectation.tokens, "expected_steps": expectation.steps,
            "token_probability": p_token, "target_probability": p_target,
            "figure": "expected value" if exact and expectation.exact else "lower bound",
            "law_exact": bool(exact), "records": records, "max_tokens": self.max_tokens,
            "limits": _limits_dict(limits), "level": mechanism.event.epsilon, "subsample_teachers": None,
        }

    def _candidates(self, name: str, accountant: str, n: int, groups: int, rate: float | None = None) -> list:
        """``(e, d, mechanism, limits, bound)`` of every step on the grid that ``generate`` would run with ``n``
        teachers per group and whose budget pays for a step, ``bound`` being the most tokens it could release (its
        charged steps, each releasing at most one), largest first."""
        out = []
        cap = None if self.records is None else self.records * self.max_tokens // groups
        for e, d in self.grid(name):
            if e > 2.0 * self.budget[0] or not self.within_planning_limit(
                    2.0 * e if name.startswith("boundary-") else e):  # a wrapper's target level is 2e
                continue  # one step would spend the budget; a search past the planning limit
            if name in GAUSSIAN and _sigma_guess(e, d) > min(GAUSSIAN_MAX_SIGMA, 2.0 * n):
                continue  # more noise than GNMax takes, or than twice the votes: it would release next to nothing
            if name == PUBLIC_CANDIDATE and 1.0 / e > 2.0 * n:
                continue  # Laplace noise of scale 1/e above twice the votes: the noise, not the teachers, decides
            mechanism = self.mechanism(name, e, d, n if name == PUBLIC_CANDIDATE else None, rate)
            if mechanism is None:
                continue
            try:
                check_reachable(mechanism, n)
                if name in GAUSSIAN:  # noise that decides the releases over the vocabulary: generate refuses it
                    check_noise_floor(self.mechanism(name, e, d, n, rate), n, self.vocab_size)
            except RunInputError:
                continue
            limits = self.limits(accountant, mechanism)
            if limits is None:
                continue
            if limits.max_steps is not None:
                bound = groups * (limits.max_steps if cap is None else min(limits.max_steps, cap))
            else:
                share = _query_share(limits, groups) if cap is None else min(_query_share(limits, groups), cap)
                bound = 0 if limits.max_hits == 0 else groups * share
            if bound > 0:
                out.append((e, d, mechanism, limits, bound))
        out.sort(key=lambda item: -item[4])
        return out

    def _records(self, limits, p_target: float, groups: int) -> tuple[int, int]:
        """``(records, steps per group)``: ``--records`` (the user's, else enough for the budget to end the run
        first with probability :data:`RECORDS_QUANTILE`, rounded up to whole records of ``--max-tokens`` per
        group) and the steps each group is counted for: an even share of them (``generate`` gives the records to
        the groups in turn and drops a group whose budget is spent, so no group gets fewer while the others run)."""
        if self.records is None:
            if limits.max_steps is not None:
                need = limits.max_steps
            else:  # a pure query has no query limit: at most the planning limit on steps, per group
                need = planning.steps_to_hits_quantile(limits.max_hits, p_target, RECORDS_QUANTILE,
                                                       _query_share(limits, groups))
            records = groups * max(1, math.ceil(need / self.max_tokens))
        else:
            records = self.records
        return records, records * self.max_tokens // groups

    def compare(self, num_teachers: int, group_sizes) -> list[dict]:
        """Every configuration at every group count of ``group_sizes``, best first: each configuration's best step
        at each group count (a group count that cannot beat the configuration's best at fewer groups is left
        out)."""
        entries, floors = [], {}
        for groups in group_sizes:
            for name, accountant, rate in self.configurations:
                if groups > 1 and accountant == "individual-charging":
                    continue  # generate runs individual charging in one group (its charges are per teacher)
                key = (name, accountant, rate)
                entry = self.evaluate(name, accountant, num_teachers, groups, floors.get(key, 0.0), rate)
                if entry is not None:
                    entries.append(entry)
                    floors[key] = max(floors.get(key, 0.0), entry["expected_private_tokens"])
        entries.sort(key=lambda x: -x["expected_private_tokens"])
        return entries

    def individual_details(self, entry: dict, mechanism) -> dict:
        """What an individual-charging entry assumes and what the other assumption would give: the per-teacher
        limit of the accountant ``generate`` builds; the ranked, conservative plan (the worst teacher charged on
        every hit: the run planned to that many hits); and the optimistic one (the charges spread evenly, about
        ``E[c' | hit]`` teachers a hit, :func:`pate_accountant.planning.individual_charges`, the rule of ``plan
        compare``): its hits, tokens (with records enough for them) and, at the planned hits, each plan's worst
        teacher's epsilon (:func:`pate_accountant.accountants.individual.individual_epsilon`)."""
        n = entry["teachers_per_group"]
        accountant = self.individual_accountant(mechanism, n)
        tau = int(accountant.per_teacher_limit)
        g = min(n, max(1, math.ceil(entry["counted_per_hit"] * (1 - 1e-12))))
        config = accountant.config()

        def epsilon(charges: int) -> float:
            return individual_epsilon(charges, accountant.epsilon0, accountant.q, self.budget[1],
                                      relation=accountant.relation, composition=config["composition"])

        even_hits = planning.individual_charging_hits(tau, g, n, "even")
        limits = planning.StepLimits("individual-charging", *self.budget, None, even_hits, NO_LIMIT, False)
        records, cap = self._records(limits, entry["target_probability"], 1)
        even = planning.run_expectation(limits, entry["token_probability"], entry["target_probability"],
                                        steps_per_group=cap)
        worst_charges = planning.individual_charges(tau, g, n, "worst")
        even_charges = planning.individual_charges(tau, g, n, "even")
        return {
            "per_teacher_limit": tau, "charged_per_hit": g, "relation": accountant.relation, "ranked": "worst_teacher",
            "worst_teacher": {"hits": planning.individual_charging_hits(tau, g, n, "worst"),
                              "charges_at_planned_hits": worst_charges, "epsilon_at_planned_hits": epsilon(worst_charges)},
            "even_spread": {"hits": even_hits, "expected_private_tokens": even.tokens, "expected_steps": even.steps,
                            "records": records, "charges_at_planned_hits": even_charges,
                            "epsilon_at_planned_hits": epsilon(even_charges)},
        }

    def releases(self, num_teachers: int, at_least: float = 1.0) -> dict | None:
        """The first configuration found (one group of ``num_teachers``) expected to release at least
        ``at_least`` private tokens, or ``None``."""
        cheap_first = sorted(self.configurations, key=lambda triple: triple[0].endswith("weighted-sampling"))
        for name, accountant, rate in cheap_first:  # DPWS's inclusion table is the slowest law to compute
            entry = self.evaluate(name, accountant, num_teachers, 1, floor=at_least * (1.0 - 1e-12), rate=rate)
            if entry is not None and entry["expected_private_tokens"] >= at_least:
                return entry
        return None


def _limits_dict(limits) -> dict:
    """An entry's ``limits``: ``queries`` is ``None`` for a pure query, which its accountant does not limit."""
    if limits.max_steps is not None:
        return {"steps_per_group": limits.max_steps, "capped": limits.capped}
    return {"hits_per_group": limits.max_hits,
            "queries": None if limits.max_queries >= NO_LIMIT else limits.max_queries}


def _query_share(limits, groups: int) -> int:
    """The queries one of ``groups`` groups is counted for when its records are sized: an even share of the query
    limit, or for a pure query (no query limit) the planning limit on steps."""
    if limits.max_queries >= NO_LIMIT:
        return planning.MAX_PLAN_STEPS
    return limits.max_queries // groups


def needed_teachers(planner: BestPlanner, num_teachers: int) -> int | None:
    """About the fewest teachers (one group) for which some configuration is expected to release at least one
    private token: doubling from ``num_teachers``, then bisection (``None`` when even
    :data:`pate_accountant.planning.MAX_PLAN_TEACHERS` do not)."""
    lo, hi = num_teachers, None
    candidate = num_teachers
    while hi is None:
        candidate = min(2 * candidate, planning.MAX_PLAN_TEACHERS)
        if planner.releases(candidate) is not None:
            hi = candidate
        elif candidate == planning.MAX_PLAN_TEACHERS:
            return None
        else:
            lo = candidate
    while hi - lo > max(1, lo // 100):  # to about 1%
        middle = (lo + hi) // 2
        if planner.releases(middle) is not None:
            hi = middle
        else:
            lo = middle
    return hi
