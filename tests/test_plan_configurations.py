"""``pate-accountant plan best`` (docs/planning.md): the planner that compares every run ``generate`` offers under
the agreement model and prints the best first.

* the agreement model's count law, the expected queries of a target-charged run and the accountants' own step
  limits (:mod:`pate_accountant.planning`);
* the per-step laws of every compared mechanism against the mechanism's exact ``output_distribution``;
* a Monte Carlo run of the printed best plan, through the real mechanism and accountant, against its expected
  tokens;
* every printed command parses with ``generate``'s own parser and passes ``generate``'s pre-run checks
  (:mod:`pate_app.run`), and its step limits are its accountant's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom, nbinom

from mechanisms import registry as mechanisms_registry
from mechanisms.gaussian import GaussianNoisyArgMax, GaussianThresholdArgMax
from pate_accountant import planning
from pate_accountant import registry as accountants_registry
from pate_accountant.cli import main
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.release import Release
from pate_app import planning as plan
from pate_app.cli import build_parser
from pate_app.run import check_inputs, check_reachable


def run_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def agreement_histogram(c: int, n: int) -> dict:
    """The agreement model's histogram: the shared token 0 with ``c`` votes, one vote for each other teacher's own
    token (``1 .. n - c``)."""
    hist = {0: c} if c else {}
    hist.update({1 + i: 1 for i in range(n - c)})
    return hist


# -- the library: the count law, the queries to a hit limit, the accountants' limits ----------------------------


def test_agreement_count_pmf_is_the_alpha_sweeps_law():
    from pate_app.experiments.alpha_sweep import max_count_pmf

    for n, alpha in ((1, 0.5), (7, 0.01), (50, 0.3), (400, 0.9)):
        pmf = planning.agreement_count_pmf(n, alpha)
        assert pmf.shape == (n + 1,) and math.isclose(pmf.sum(), 1.0, abs_tol=1e-12) and (pmf >= 0).all()
        top = max_count_pmf(n, alpha)  # the law of max(c, 1)
        assert np.allclose(pmf[2:], top[2:], rtol=1e-9, atol=1e-15)
        assert math.isclose(pmf[0] + pmf[1], top[1], rel_tol=1e-9)
        assert math.isclose(float(np.arange(n + 1) @ pmf), n * alpha, rel_tol=1e-9)  # E[c] = n alpha
    one = planning.agreement_count_pmf(5, 1.0)
    assert one[5] == 1.0 and one[:5].sum() == 0.0
    for kwargs, name in (({"num_teachers": 0, "alpha": 0.5}, "num_teachers"),
                         ({"num_teachers": planning.MAX_PLAN_TEACHERS + 1, "alpha": 0.5}, "num_teachers"),
                         ({"num_teachers": 5, "alpha": 0.0}, "alpha"), ({"num_teachers": 5, "alpha": 1.5}, "alpha")):
        with pytest.raises(ValueError, match=f"^{name} "):
            planning.agreement_count_pmf(**kwargs)


def test_agreement_count_pmf_matches_coordinated_votes():
    from ensembles.histograms import coordinated_votes
    from ensembles.synthetic import alpha_mixture

    n, alpha, samples = 40, 0.4, 3000
    rng = np.random.default_rng(7)
    votes = coordinated_votes(alpha_mixture(n, 1 + n, alpha, rng), samples, rng)
    counts = np.bincount((votes == 0).sum(axis=1), minlength=n + 1)
    pmf = planning.agreement_count_pmf(n, alpha)
    # Kolmogorov distance of the empirical law of the shared token's count (1.63/sqrt(r): the 1% level).
    assert np.max(np.abs(np.cumsum(counts) / samples - np.cumsum(pmf))) < 1.63 / math.sqrt(samples)


@pytest.mark.parametrize(("hits", "p", "steps"), [(1, 0.3, 1), (2, 0.3, 5), (3, 0.05, 40), (5, 0.9, 8), (4, 0.2, 1000)])
def test_expected_steps_to_hits_is_the_sum_of_survivals(hits, p, steps):
    # E[min(Q, T)] = sum_{k < Q} P[T > k] = sum_{k < Q} P[Bin(k, p) < hits]
    direct = sum(float(binom.cdf(hits - 1, k, p)) for k in range(steps))
    assert planning.expected_steps_to_hits(hits, p, steps) == pytest.approx(direct, rel=1e-10)
    quantile = planning.steps_to_hits_quantile(hits, p, 0.9, steps)
    assert quantile == min(steps, hits + int(nbinom.ppf(0.9, hits, p)))


def test_expected_steps_to_hits_edges():
    assert planning.expected_steps_to_hits(0, 0.5, 10) == 0.0  # no hit affordable: no query runs
    assert planning.expected_steps_to_hits(3, 0.0, 10) == 10.0  # never a hit: the query limit ends it
    assert planning.steps_to_hits_quantile(3, 0.0, 0.99, 10) == 10
    with pytest.raises(ValueError, match="^hit_probability "):
        planning.expected_steps_to_hits(3, 1.5, 10)


def test_step_limits_are_the_accountants():
    budget = (1.0, 1e-5)
    for accountant in ("pld", "basic", "advanced"):
        event = mechanisms_registry.build_mechanism("dp-argmax", 0.1, 1e-7).event
        limits = planning.step_limits(accountant, event, *budget)
        k = limits.max_steps
        assert k >= 10 and not limits.capped and limits.max_hits is None
        cls = accountants_registry.accountant_class(accountant)
        charged = cls(budget=budget)
        for _ in range(k):  # one step at a time, as a run charges them
            charged.compose(event)
        with pytest.raises(BudgetExhaustedError):
            charged.compose(event)
    event = mechanisms_registry.build_mechanism("boundary-dp-argmax", 0.005, 1e-11).event
    limits = planning.step_limits("target-charging", event, *budget)
    accountant = accountants_registry.accountant_class("target-charging")(budget=budget)
    assert limits.max_hits == accountant.max_hits_for(event) >= 1 and limits.max_steps is None
    accountant.record(Release(None, event, target_hit=False))
    assert limits.max_queries == accountant.max_queries


def test_run_expectation_adds_groups_and_bounds_the_shared_query_limit():
    plain = planning.StepLimits("pld", 1.0, 1e-6, 100, None, None, False)
    assert planning.run_expectation(plain, 0.25, groups=3) == planning.RunExpectation(300.0, 75.0, True)
    assert planning.run_expectation(plain, 0.25, groups=3, steps_per_group=40).tokens == 30.0
    tct = planning.StepLimits("target-charging", 1.0, 1e-6, None, 4, 60, False)
    one = planning.run_expectation(tct, 0.5, 0.05)
    assert one.exact and one.steps == pytest.approx(planning.expected_steps_to_hits(4, 0.05, 60))
    # Three groups share the 60 queries: the figure counts each up to 20, a lower bound on the mean of
    # min(60, T_1 + T_2 + T_3) (each T_g the step of its group's 4th hit).
    three = planning.run_expectation(tct, 0.5, 0.05, groups=3)
    rng = np.random.default_rng(1)
    totals = np.minimum(60, (4 + rng.negative_binomial(4, 0.05, size=(20000, 3))).sum(axis=1))
    assert not three.exact and three.steps <= totals.mean()
    assert three.tokens == pytest.approx(0.5 * three.steps)


# -- the per-step laws are the mechanisms' ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dp-argmax", "boundary-dp-argmax", "dp-weighted-sampling",
                                  "boundary-dp-weighted-sampling"])
@pytest.mark.parametrize(("e", "d"), [(1.0, 0.1), (2.0, 0.05)])
@pytest.mark.parametrize("n", [9, 10])
def test_per_count_outcomes_are_the_exact_laws(name, e, d, n):
    mechanism = mechanisms_registry.build_mechanism(name, e, d, "replace-one")
    token, target, exact = plan.per_count_outcomes(name, mechanism, n)
    assert exact and token.shape == target.shape == (n + 1,)
    assert token.max() > 0.05  # the parameters reach the mechanism's release
    for c in range(n + 1):
        law = mechanism.output_distribution(agreement_histogram(c, n), num_teachers=n)
        released = float(np.sum(law.probabilities))
        assert token[c] == pytest.approx(released, abs=1e-12), c
        assert target[c] == pytest.approx(getattr(law, "target", 0.0), abs=1e-12), c


def test_gaussian_outcomes_bound_the_exact_law_and_equal_it_above_the_noise():
    n, vocab = 16, 24
    # The threshold n//2 + 1 = 9 is at least T + 2 = 8: no token but the shared one can clear it, the law is exact.
    exact_mechanism = GaussianThresholdArgMax(0.5, vocab_size=vocab, threshold=n // 2 + 1)
    assert exact_mechanism.truncation_bound + 2 <= n // 2 + 1
    token, _, exact = plan.per_count_outcomes("gaussian-threshold-argmax", exact_mechanism, n, vocab)
    assert exact
    for c in range(n + 1):
        law = exact_mechanism.output_distribution(agreement_histogram(c, n), num_teachers=n)
        assert token[c] == pytest.approx(1.0 - law.fail, abs=1e-12), c
    # More noise: a lower bound on releasing a token some teacher voted for.
    for mechanism, name in ((GaussianNoisyArgMax(2.0, vocab_size=vocab), "gaussian-argmax"),
                            (GaussianThresholdArgMax(2.0, vocab_size=vocab, threshold=n // 2 + 1),
                             "gaussian-threshold-argmax")):
        token, _, exact = plan.per_count_outcomes(name, mechanism, n, vocab)
        assert not exact and token.max() > 0.5
        for c in range(n + 1):
            law = mechanism.output_distribution(agreement_histogram(c, n), num_teachers=n)
            voted = float(law.probabilities[: n - c + (1 if c else 0)].sum())  # tokens 0 .. n - c hold the votes
            assert token[c] <= voted + 1e-12, (name, c)


def test_subsampled_gaussian_outcomes_bound_the_exact_law():
    """GNMax on teachers subsampled at rate 1/2 (``--subsample-teachers``): the planner's token probability is at
    most the exact law's probability of releasing a voted token (the binomial mixture over the kept votes), at every
    shared count, and not trivially small."""
    from mechanisms.subsampled import SubsampledTeachers

    n, vocab, rate = 6, 10, 0.5
    for name, inner in (("gaussian-argmax", GaussianNoisyArgMax(0.6, vocab_size=vocab, relation="add-remove-one")),
                        ("gaussian-threshold-argmax", GaussianThresholdArgMax(0.6, vocab_size=vocab, threshold=2,
                                                                             relation="add-remove-one"))):
        mechanism = SubsampledTeachers(inner, rate)
        token, target, exact = plan.per_count_outcomes(name, mechanism, n, vocab)
        assert not exact and not target.any() and token[n] > 0.5
        for c in range(n + 1):
            law = mechanism.output_distribution(agreement_histogram(c, n), num_teachers=n)
            voted = sum(law.probability(j) for j in ([0] if c else []) + list(range(1, n - c + 1)))
            assert token[c] <= voted + 1e-9, (name, c)


# -- the printed runs -------------------------------------------------------------------------------------------


def _filled(argv):
    return [{"DATA": "bundled", "LEDGER": "run.sqlite"}.get(word, word) for word in argv]


def _check_generate_accepts(entry: dict) -> None:
    """``generate``'s own parser and pre-run checks take the printed command, and it is the entry's run."""
    run = entry["run"]
    assert run["command"] == " ".join(run["argv"]) and run["argv"][:2] == ["pate-accountant", "generate"]
    args = build_parser("generate").parse_args(_filled(run["argv"])[1:])
    assert (args.mechanism, args.accountant, args.relation) == (entry["mechanism"], entry["accountant"],
                                                               entry["relation"])
    assert args.teachers == entry["teachers"] and args.groups == entry["groups"]
    assert (args.step_epsilon, args.step_delta) == (entry["step_epsilon"], entry["step_delta"])
    assert (args.budget_epsilon, args.budget_delta) == (entry["budget"]["epsilon"], entry["budget"]["delta"])
    assert (args.records, args.max_tokens) == (entry["records"], entry["max_tokens"])
    assert args.subsample_teachers == entry["subsample_teachers"]
    from pate_accountant.tct import NO_LIMIT
    from pate_app.run import build_accountant, build_mechanism, check_groups, check_noise_floor

    n = check_groups(args.groups, args.teachers, args.accountant)  # the teachers split evenly into the groups
    assert n == entry["teachers_per_group"]
    budget = (args.budget_epsilon, args.budget_delta)
    mechanism = build_mechanism(args.mechanism, args.step_epsilon, args.step_delta, args.relation, num_teachers=n,
                                subsample=args.subsample_teachers)
    check_inputs(range(args.teachers), n, mechanism, args.accountant, budget)
    check_reachable(mechanism, n)
    check_noise_floor(mechanism, n, entry.get("vocab_size", 49152))  # the noise does not decide its releases
    # Its limits are its accountant's, as generate builds it.
    accountant = accountants_registry.accountant_class(args.accountant)
    limits = entry["limits"]
    if "steps_per_group" in limits:
        steps = limits["steps_per_group"]
        assert accountant(budget=budget).can_afford(mechanism.event, steps)
        assert limits["capped"] or not accountant(budget=budget).can_afford(mechanism.event, steps + 1)
    elif args.accountant == "individual-charging":  # planned for the worst teacher: its per-teacher limit
        built = build_accountant(args.accountant, budget, mechanism=mechanism, num_teachers=n)
        assert built.per_teacher_limit == limits["hits_per_group"] and limits["queries"] is None
    else:
        fresh = accountant(budget=budget)
        assert fresh.max_hits_for(mechanism.event) == limits["hits_per_group"]
        fresh.record(Release(None, mechanism.event, target_hit=False))
        # a pure query (BetweenThresholds) has no query limit: None in the entry
        assert fresh.max_queries == (NO_LIMIT if limits["queries"] is None else limits["queries"])


def test_plan_best_prints_runs_that_generate_accepts(capsys):
    # 300 teachers, agreement 0.9: the Gaussian aggregators win, and plain DPArgMax does best in four groups.
    d = run_json(capsys, "best", "--teachers", "300", "--alpha", "0.9")
    assert d["command"] == "plan best" and d["fits"] and d["best"] is not None
    ranked = [d["best"], *d["runners_up"]]
    tokens = [entry["expected_private_tokens"] for entry in ranked]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] == max(
        entry["expected_private_tokens"] for entry in d["configurations"])
    assert len({(e["mechanism"], e["accountant"], e["subsample_teachers"]) for e in ranked}) == len(ranked)
    assert any(entry["groups"] > 1 for entry in ranked)
    for entry in ranked:
        assert entry["tokens_per_epsilon"] == pytest.approx(entry["expected_private_tokens"])
        assert entry["tokens_per_record"] == pytest.approx(24 * entry["token_probability"])
        assert entry["figure"] in ("expected value", "lower bound")
        assert entry["records"] * entry["max_tokens"] >= entry["expected_steps"]  # the budget ends the run
    # Every printed command, the runners-up's included.  A command with --groups needs generate --groups.
    for entry in d["configurations"]:
        _check_generate_accepts(entry)
    assert main(["plan", "best", "--teachers", "300", "--alpha", "0.9"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan best: 300 teachers, agreement alpha 0.9")
    assert "best run: " in text and "runners-up:" in text and "not compared:" in text and "assumptions:" in text
    for entry in ranked:
        assert entry["run"]["command"] in text


def test_plan_best_never_prints_a_run_whose_noise_decides(capsys):
    """Issue 32, item 6: 30 teachers, agreement 0.5, budget (10, 1e-5) picked thresholded GNMax at step epsilon 1,
    where noise alone clears the threshold of 16 over the 49,152-token vocabulary at nearly every step without a
    majority (generate now refuses it).  Every configuration printed passes generate's noise check, and the step
    epsilon 1 Gaussian entries are gone."""
    from pate_app.run import NOISE_RELEASE_LIMIT, build_mechanism, noise_release

    d = run_json(capsys, "best", "--teachers", "30", "--alpha", "0.5", "--budget-epsilon", "10",
                 "--budget-delta", "1e-5")
    assert d["fits"]
    gaussian = [e for e in d["configurations"] if e["mechanism"].startswith("gaussian")]
    assert gaussian
    for entry in d["configurations"]:
        _check_generate_accepts(entry)
    for entry in gaussian:
        n = entry["teachers_per_group"]
        mech = build_mechanism(entry["mechanism"], entry["step_epsilon"], entry["step_delta"], num_teachers=n)
        assert noise_release(mech, n, 49152) <= NOISE_RELEASE_LIMIT
        assert not (entry["step_epsilon"] == 1.0 and n == 30)
    # the configuration it printed before: refused by generate's check
    loud = build_mechanism("gaussian-threshold-argmax", 1.0, 2e-6, num_teachers=30)
    assert noise_release(loud, 30, 49152) > 0.99


def test_plan_best_user_records_cap_the_run(capsys):
    d = run_json(capsys, "best", "--teachers", "300", "--alpha", "0.9", "--records", "2", "--max-tokens", "10",
                 "--runners-up", "0")
    assert d["runners_up"] == [] and d["best"]["records"] == 2
    assert d["best"]["expected_steps"] <= 20 and d["best"]["expected_private_tokens"] <= 20
    _check_generate_accepts(d["best"])


def test_plan_best_says_when_nothing_fits(capsys):
    d = run_json(capsys, "best", "--teachers", "100", "--alpha", "0.3", "--budget-epsilon", "0.5")
    assert not d["fits"] and d["best"] is None and d["runners_up"] == []
    assert all(entry["expected_private_tokens"] < 1.0 for entry in d["configurations"])
    m = d["needed_teachers"]
    assert m is not None and m > 100
    needed = d["with_needed_teachers"]
    assert needed["teachers"] == m and needed["expected_private_tokens"] >= 1.0
    _check_generate_accepts(needed)
    assert main(["plan", "best", "--teachers", "100", "--alpha", "0.3", "--budget-epsilon", "0.5"]) == 0
    text = capsys.readouterr().out
    assert f"no run releases a private token at this budget with 100 teachers; you need about {m}\n" in text
    assert "best run:" not in text and needed["run"]["command"] in text


def test_plan_best_expected_tokens_match_a_run_of_the_real_accountant():
    """The printed best target-charged plan, run step by step through the registered mechanism and the
    accountant generate builds, on histograms drawn from the agreement model: the mean private tokens and
    charged steps agree with the plan's expectations."""
    planner = plan.BestPlanner(budget_epsilon=4.0, budget_delta=1e-5, relation="replace-one", alpha=0.5,
                               max_tokens=24)
    entry = planner.evaluate("boundary-dp-argmax", "target-charging", 1000, 1)
    assert entry is not None and entry["figure"] == "expected value" and entry["expected_private_tokens"] > 10
    n, budget = entry["teachers_per_group"], (4.0, 1e-5)
    mechanism = mechanisms_registry.build_mechanism("boundary-dp-argmax", entry["step_epsilon"], entry["step_delta"])
    token, target, _ = plan.per_count_outcomes("boundary-dp-argmax", mechanism, n)
    pmf = planning.agreement_count_pmf(n, 0.5)
    rng = np.random.default_rng(3)
    runs, tokens, steps = 60, [], []
    cap = entry["records"] * entry["max_tokens"]
    for _ in range(runs):
        accountant = accountants_registry.accountant_class("target-charging")(budget=budget)
        made = released = 0
        while made < cap and accountant.can_afford(mechanism.event):
            c = rng.choice(n + 1, p=pmf)
            u = rng.random()  # the step's outcome from its exact law: target, token or fail
            hit, out = u < target[c], target[c] <= u < target[c] + token[c]
            accountant.record(Release(0 if out else None, mechanism.event, target_hit=bool(hit)))
            made, released = made + 1, released + out
        tokens.append(released)
        steps.append(made)
    se = np.std(tokens, ddof=1) / math.sqrt(runs)
    assert abs(np.mean(tokens) - entry["expected_private_tokens"]) < 4 * se + 0.02 * entry["expected_private_tokens"]
    assert abs(np.mean(steps) - entry["expected_steps"]) < 4 * np.std(steps, ddof=1) / math.sqrt(runs) + 1


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--teachers", "300", "--alpha", "0"], "--alpha"),
        (["--teachers", "300", "--alpha", "1.5"], "--alpha"),
        (["--teachers", "0", "--alpha", "0.5"], "--teachers"),
        (["--teachers", "2000000", "--alpha", "0.5"], "--teachers"),
        (["--teachers", "300", "--alpha", "0.5", "--budget-epsilon", "1000"], "--budget-epsilon"),
        (["--teachers", "300", "--alpha", "0.5", "--max-tokens", "0"], "--max-tokens"),
        (["--teachers", "300"], "--alpha"),
    ],
)
def test_plan_best_bad_input_is_one_line_naming_the_option(capsys, argv, option):
    assert main(["plan", "best", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and option in lines[0], err


def test_plan_has_one_step_delta(capsys):
    """Issue 23, item 4: `--aggregator-delta` (the delta0 of C_delta) and `--step-delta` named one quantity; the
    old spelling is a deprecated alias of --step-delta, and a plan prints one per-step delta."""
    new = run_json(capsys, "yields", "--eps0", "0.02", "--step-delta", "1e-9")
    assert main(["plan", "yields", "--eps0", "0.02", "--aggregator-delta", "1e-9", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == new
    assert "--aggregator-delta is a deprecated spelling of --step-delta" in captured.err
    assert new["aggregator_delta"] == new["delta0"] == new["run"]["step_delta"] == 1e-9
    assert new["num_teachers"] == math.ceil(2 * math.log(1e9) / 0.02)
    for sub in (["hits", "--eps0", "0.02"], ["yields", "--eps0", "0.02"], ["for-tokens", "--tokens", "10"],
                ["compare", "--queries", "10", "--target-rate", "0.1", "--eps0", "0.1", "--teachers", "50"]):
        parser = build_parser("plan")
        assert main(["plan", *sub, "--help"]) == 0
        text = capsys.readouterr().out
        assert "--step-delta" in text and "--aggregator-delta D" not in text, sub
        del parser
    # Without --step-delta, for-tokens's teachers are C_delta/eps0 at the run's own step delta.
    d = run_json(capsys, "for-tokens", "--tokens", "1000")
    assert d["aggregator_delta"] == d["delta0"] == d["run"]["step_delta"]
    assert d["num_teachers"] == d["run"]["num_teachers"] == math.ceil(
        2 * math.log(1 / d["run"]["step_delta"]) / d["eps0"] * (1 - 1e-12))
