"""The answer of ``pate-accountant plan best`` (docs/planning.md, "The best run: plan best"): :func:`plan_best`
ranks what :class:`~pate_app.planning.planner.BestPlanner` compares, keeps only the runs ``generate`` would accept
(:func:`check_best_run`, its own pre-run checks) with their commands (:func:`best_run_argv`), says which runnable
pairs were not compared and why, and states what every figure assumes.
"""

from __future__ import annotations

from mechanisms import registry as mechanisms_registry
from pate_accountant import planning, registry
from pate_app.options import DEFAULT_VOCAB_SIZE, PUBLIC_AGREEMENT_OPTION
from pate_app.planning.configurations import (
    PUBLIC_CANDIDATE,
    RECORDS_QUANTILE,
    best_step_deltas,
    gaussian_step_delta,
    group_counts,
)
from pate_app.planning.planner import BestPlanner, needed_teachers
from pate_app.planning.runs import RUN_PLACEHOLDERS, _number
from pate_app.run import (
    NOISE_RELEASE_LIMIT,
    TEACHER_RELATION,
    RunInputError,
    build_mechanism,
    check_groups,
    check_inputs,
    check_noise_floor,
    check_reachable,
)

#: Why the public-candidate query is not compared without ``--public-agreement``.
PUBLIC_AGREEMENT_WHY = (
    "BetweenThresholds asks whether the teachers back the public model's candidate token, and the agreement model "
    "does not say how often that candidate is the teachers' shared token: give --public-agreement P (your "
    "assumption, in [0, 1]) to compare it under target charging, individual charging and pld")
#: Why ``plan best`` does not compare individual charging with a mechanism other than the public-candidate query.
INDIVIDUAL_CHARGING_WHY = (
    "the individual-charging accountant charges only BetweenThresholds queries (the paper's individual-charging "
    "scheme, generate's public-candidate query): generate refuses it with any other mechanism")


def best_run_argv(entry: dict, relation: str) -> list[str]:
    """The ``generate`` command of a ``plan best`` entry (``DATA`` and ``LEDGER`` left to fill in); ``--groups``
    only with more than one group."""
    budget = entry["budget"]
    argv = ["pate-accountant", "generate", "--data", "DATA", "--ledger", "LEDGER", "--mechanism", entry["mechanism"],
            "--accountant", entry["accountant"], "--relation", relation, "--teachers", str(entry["teachers"])]
    if relation == "add-remove-one":  # the number of records is private: a teacher's places are given
        argv += ["--records-per-teacher", "K"]
    if entry["groups"] > 1:
        argv += ["--groups", str(entry["groups"])]
    if entry.get("subsample_teachers") is not None:
        argv += ["--subsample-teachers", _number(entry["subsample_teachers"])]
    argv += ["--step-epsilon", _number(entry["step_epsilon"]), "--step-delta", _number(entry["step_delta"]),
             "--budget-epsilon", _number(budget["epsilon"]), "--budget-delta", _number(budget["delta"]),
             "--records", str(entry["records"]), "--max-tokens", str(entry["max_tokens"])]
    return argv


def check_best_run(entry: dict, relation: str, mechanism=None, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
    """``generate``'s own pre-run checks (:mod:`pate_app.run`) on a ``plan best`` entry, without a model: its
    mechanism builds as ``generate`` builds it (the threshold form with each group's teachers; ``mechanism``: the
    one already built so), its accountant accounts for it and affords one step, its release threshold is within
    reach of each group, and its noise does not decide the releases over a vocabulary of ``vocab_size`` tokens.
    Raises ``RunInputError``."""
    n = check_groups(entry["groups"], entry["teachers"], entry["accountant"])
    budget = (entry["budget"]["epsilon"], entry["budget"]["delta"])
    if mechanism is None:
        mechanism = build_mechanism(entry["mechanism"], entry["step_epsilon"], entry["step_delta"], TEACHER_RELATION,
                                    num_teachers=n, subsample=entry.get("subsample_teachers"))
    check_inputs(range(entry["teachers"]), n, mechanism, entry["accountant"], budget)
    check_reachable(mechanism, n)
    check_noise_floor(mechanism, n, vocab_size)


def _not_compared(planner: BestPlanner, entries: list[dict]) -> list[dict]:
    """Every runnable (mechanism, accountant) pair ``plan best`` does not compare, with why; and every compared
    pair that has no entry (``entries``), with why."""
    compared = {(name, accountant) for name, accountant, _rate in planner.configurations}
    found = {(entry["mechanism"], entry["accountant"]) for entry in entries}
    out = []
    for name in mechanisms_registry.run_mechanism_names():
        for accountant in registry.run_accountant_names():
            if (name, accountant) in compared:
                if (name, accountant) not in found:
                    built = "gaussian-argmax" if name == "gaussian-threshold-argmax" else name
                    if built not in planner.built and built in planner.refused:
                        why = planner.refused[built]
                    elif name == PUBLIC_CANDIDATE and planner.public_agreement == 0.0:
                        why = (f"{PUBLIC_AGREEMENT_OPTION} 0: the public model's candidate is never the teachers' "
                               "shared token, so BetweenThresholds releases no token the teachers back")
                    else:
                        why = ("no step epsilon and delta on the grid that generate would run with these teachers, in "
                               "any number of groups, releases a private token within this budget")
                    out.append({"mechanism": name, "accountant": accountant, "why": why})
                continue
            if name == PUBLIC_CANDIDATE and planner.public_agreement is None:
                why = PUBLIC_AGREEMENT_WHY
            elif accountant == "individual-charging":
                why = INDIVIDUAL_CHARGING_WHY
            elif accountant in ("basic", "advanced"):
                why = ("composes the same steps as pld by a looser bound on their (epsilon, delta): never more steps "
                       "than pld's exact privacy loss distribution, up to its discretisation")
            elif accountant == "target-charging":
                why = ("the target-charging accountant charges only q-target queries (a boundary-wrapped mechanism or "
                       "BetweenThresholds)")
            elif name.startswith("boundary-"):
                why = ("as a plain step the wrapper costs (2 epsilon, 2 delta) of its inner and releases less than it: "
                       "its plain inner is compared instead")
            elif (name, "pld") not in compared:
                why = "plan best has no law of this mechanism on the agreement model"
            elif accountant == "rdp":
                why = ("its steps carry a delta, which an RDP curve cannot: generate refuses the pair (rdp takes the "
                       "pure steps)")
            else:
                why = "not compared"
            out.append({"mechanism": name, "accountant": accountant, "why": why})
    if "individual-charging" not in registry.run_accountant_names():
        out.append({"mechanism": "between-thresholds", "accountant": "individual-charging",
                    "why": f"generate does not run individual charging; {INDIVIDUAL_CHARGING_WHY}"})
    return out


def _finish_entry(entry: dict, budget_epsilon: float, budget_delta: float, relation: str) -> None:
    """The figures derived from an entry, and its ``generate`` command."""
    entry["budget"] = {"epsilon": budget_epsilon, "delta": budget_delta}
    entry["relation"] = relation
    entry["tokens_per_epsilon"] = entry["expected_private_tokens"] / budget_epsilon
    entry["tokens_per_record"] = entry["max_tokens"] * entry["token_probability"]
    argv = best_run_argv(entry, relation)
    entry["run"] = {"command": " ".join(argv), "argv": argv, "placeholders": RUN_PLACEHOLDERS}


def _best_assumptions(planner: BestPlanner) -> list[str]:
    """What every figure of a ``plan best`` answer assumes, in the planner's numbers."""
    deltas = ", ".join(_number(d) for d in best_step_deltas(planner.budget[1]))
    return [
        (f"agreement (paper Section 6, the alpha mixture): every teacher puts mass alpha = {planner.alpha:g} on one "
        "shared token and the rest on a token of its own; with coordinated votes the shared token's count is "
        "BetaBin(n, alpha/(1-alpha), 1) and each other teacher votes for its own token, at every step independently. "
        "Real text agrees more at some steps and less at others: the token figures hold for this model, not for your "
        "data."),
        ("privacy: the hits, queries and steps are the limits the printed run's own accountant puts on it at this "
        "budget (generate stops the run there"
        + ("; individual charging: below" if planner.public_agreement is not None else "")
        + "), computed by that accountant's code: no figure assumes more."),
        ("tokens: private tokens (released by the mechanism; public fallbacks are not counted), from the "
        "mechanisms' exact laws on the model's histograms; an 'expected value' is the expectation under the "
        "model, a 'lower bound' is less than it: GNMax counted only where the top voted token wins outright against "
        f"the other {planner.vocab_size - 1} tokens of the vocabulary (a union bound; GNMax also releases tokens "
        "nobody voted for), and several groups under target charging counted up to an even share each of the one query "
        "limit they share. 'No run releases a private token' means none is expected to release one."),
        (f"records: each record runs to --max-tokens ({planner.max_tokens}); a record that stops earlier at a newline "
        "leaves steps, and budget, unused. Without --records the run gets enough records for its budget to end it "
        f"first with probability {RECORDS_QUANTILE:g}. With groups, generate gives the records to the groups in turn "
        "(a group whose budget is spent drops out); the plan counts each group up to an even share of them."),
        ("groups: --groups G (a divisor of --teachers) splits the records at random into G disjoint groups, each an "
        "ensemble of teachers / G teachers; the run's guarantee is the largest of the groups' (parallel composition, "
        "docs/groups.md), so each group may spend the budget while the tokens add up. Target charging shares its "
        "query limit between the groups."),
        (f"step parameters: each configuration's best step epsilon on the 1-2-5 grid from 1e-5 to 50 and step delta "
        f"among {deltas} (the Gaussian ones at {_number(gaussian_step_delta(planner.budget[1]))}: PLD charges a GNMax "
        "step by its noise alone, which the step epsilon sweeps). Skipped: a step epsilon above twice the budget's, "
        f"a budget search past the planning limit ({planning.MAX_SEARCH_STEPS:.0e} steps), a step generate would "
        "refuse (a release threshold out of the teachers' reach, or GNMax noise that alone releases a token no teacher "
        f"voted for with probability above {NOISE_RELEASE_LIMIT:.0%} over the vocabulary of --vocab-size: "
        "docs/generation.md), "
        "GNMax noise above twice the votes (BetweenThresholds: "
        "its noise scale 1/epsilon), and a step whose "
        "charged steps alone could not beat the best found."),
        *_public_candidate_assumptions(planner),
    ]


def _public_candidate_assumptions(planner: BestPlanner) -> list[str]:
    """What the public-candidate entries assume (``--public-agreement``), or that they were not compared."""
    if planner.public_agreement is None:
        return [f"public candidate: not compared; {PUBLIC_AGREEMENT_OPTION} P states how often the public model's "
                "candidate is the teachers' shared token, which the agreement model does not say."]
    return [
        (f"public candidate ({PUBLIC_CANDIDATE}, {PUBLIC_AGREEMENT_OPTION} {planner.public_agreement:g}): at every "
         "step the public model's candidate is the teachers' shared token with probability "
         f"P = {planner.public_agreement:g}, independently of the votes, and then has the shared token's count above; "
         "otherwise it is a token of one teacher's own (one vote, the most any other token has in this model). The "
         "query counts the teachers included at a rate nu ~ U[1/n, 1] who vote for it (exact law of that count), with "
         "the thresholds generate sets from the teachers of a group (low = ceil(n/5), high = low + ceil(2/epsilon)). "
         "Its tokens are a lower bound: releases of the shared token, less those the noise alone gives a candidate no "
         "teacher votes for; a released candidate the teachers do not share is the public model's token, as a fallback "
         "would be, and is not counted. Every 'between' outcome is a hit, whichever the candidate."),
        ("individual charging: the ranked figure plans for the worst teacher charged on every hit (as if every hit "
         "counted the same teachers), so the run is planned to the per-teacher limit of the accountant generate "
         "builds (under replace-one the limit of half the budget, by group privacy: docs/tct_and_individual.md, "
         "section 4): sound whoever is counted. generate does not stop there: it removes each teacher at its limit "
         "and goes on with the others while the records last, tokens the figure does not count. The optimistic "
         "figure, not ranked, spreads each hit's charges (E[c' | hit] teachers, rounded up) evenly over the teachers, "
         "the rule of `plan compare`; the real overlap lies between the two."),
        (f"pure queries: {PUBLIC_CANDIDATE} pays no per-query delta, so target and individual charging put no limit on "
         f"its queries and the plan counts at most {planning.MAX_PLAN_QUERIES:.0e} steps per group; its --step-delta "
         "is checked by generate and unused."),
    ]


def _checked_entries(planner: BestPlanner, entries, budget_epsilon: float, budget_delta: float, relation: str,
                     vocab_size: int):
    """The ``entries`` (:meth:`BestPlanner.compare`) that ``generate`` would run, in turn, each finished with its
    figures and command (and, under individual charging, :meth:`BestPlanner.individual_details`); one that
    ``generate`` would refuse is never offered."""
    for entry in entries:
        built = entry.pop("built")
        _finish_entry(entry, budget_epsilon, budget_delta, relation)
        try:
            check_best_run(entry, relation, built, vocab_size)
        except RunInputError:  # generate would refuse it: never printed
            continue
        if entry["accountant"] == "individual-charging":
            entry["individual"] = planner.individual_details(entry, built)
        yield entry


def plan_best(num_teachers: int, *, alpha: float, budget_epsilon: float, budget_delta: float, relation: str,
              max_tokens: int, runners_up: int, records: int | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
              public_agreement: float | None = None) -> dict:
    """The answer of ``pate-accountant plan best`` for ``num_teachers`` teachers (its JSON but for ``command``):
    every configuration :class:`BestPlanner` compares at every group count (:func:`group_counts`) that ``generate``
    would run, best first (``configurations``); the best of each (mechanism, accountant, subsampling rate)
    ranked, ``best`` and up to ``runners_up`` runners-up when the best is expected to release at least one
    private token (``fits``), else about how many teachers would (``needed_teachers``, and the best run with
    them, ``with_needed_teachers``); the runnable pairs not compared, and why; and the assumptions."""
    planner = BestPlanner(budget_epsilon=budget_epsilon, budget_delta=budget_delta, relation=relation, alpha=alpha,
                          max_tokens=max_tokens, records=records, vocab_size=vocab_size,
                          public_agreement=public_agreement)
    entries = list(_checked_entries(planner, planner.compare(num_teachers, group_counts(num_teachers)), budget_epsilon,
                                    budget_delta, relation, vocab_size))
    ranking, seen = [], set()
    for entry in entries:  # the best of each (mechanism, accountant, subsampling rate), best first
        key = (entry["mechanism"], entry["accountant"], entry.get("subsample_teachers"))
        if key not in seen:
            seen.add(key)
            ranking.append(entry)
    fits = bool(ranking) and ranking[0]["expected_private_tokens"] >= 1.0
    payload = {
        "teachers": num_teachers, "alpha": alpha,
        "budget": {"epsilon": budget_epsilon, "delta": budget_delta}, "relation": relation,
        "records": records, "max_tokens": max_tokens, "vocab_size": vocab_size,
        "public_agreement": public_agreement, "fits": fits,
        "best": ranking[0] if fits else None, "runners_up": ranking[1:1 + runners_up] if fits else [],
        "configurations": entries, "needed_teachers": None, "with_needed_teachers": None,
        "not_compared": _not_compared(planner, entries), "assumptions": _best_assumptions(planner),
    }
    if not fits:
        m = needed_teachers(planner, num_teachers)
        payload["needed_teachers"] = m
        if m is not None:
            payload["with_needed_teachers"] = next(_checked_entries(
                planner, planner.compare(m, (1,)), budget_epsilon, budget_delta, relation, vocab_size), None)
    return payload
