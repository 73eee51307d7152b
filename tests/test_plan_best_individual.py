"""``plan best --public-agreement P`` (docs/planning.md, "The best run: plan best"): the public-candidate query
generate runs (BetweenThresholds, thresholds from n) under target charging, individual charging and PLD.

* the law of the counted teachers (the generator's random inclusion rate) against a quadrature and against the
  generator's own draws; the per-step law against the real mechanism;
* ``P = 0`` releases nothing (and is said so); without ``--public-agreement`` the query is not compared, and why;
* individual charging is planned for the worst teacher charged on every hit: never cheaper than the even spread
  it prints as optimistic, and the real accountant, built as generate builds it, affords exactly the planned hits
  charged to the same teachers and refuses the next;
* every printed command parses with generate's parser and passes its pre-run checks, and no planned run exceeds
  its budget under its own accountant;
* a bad ``--public-agreement`` is a one-line usage error naming the option and the value.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import binom
from test_plan_configurations import _check_generate_accepts

from mechanisms import registry as mechanisms_registry
from mechanisms.between_thresholds import BETWEEN
from pate_accountant import planning
from pate_accountant import registry as accountants_registry
from pate_accountant.cli import main
from pate_accountant.errors import BudgetExhaustedError
from pate_accountant.release import Release
from pate_app import planning as plan
from pate_app.run import build_accountant

PUBLIC = ("between-thresholds", "target-charging"), ("between-thresholds", "individual-charging"), (
    "between-thresholds", "pld")


def _plan_json(*argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "best", *argv, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def with_public():
    """300 teachers at agreement 0.9, the public model's candidate the shared token half the time."""
    return _plan_json("--teachers", "300", "--alpha", "0.9", "--public-agreement", "0.5", "--runners-up", "8")


# -- the law of one step --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "alpha"), [(2, 0.5), (7, 0.3), (20, 0.5), (40, 0.9)])
def test_included_count_pmf_is_the_integral_over_the_rate(n, alpha):
    pmf = planning.agreement_count_pmf(n, alpha)
    got = planning.included_count_pmf(pmf, n)
    expected = np.zeros(n + 1)
    for c in range(n + 1):
        for k in range(c + 1):  # nu ~ U[1/n, 1], c' | c, nu ~ Bin(c, nu)
            value, _ = integrate.quad(lambda nu, k=k, c=c: binom.pmf(k, c, nu), 1.0 / n, 1.0, epsabs=1e-14)
            expected[k] += pmf[c] * value / (1.0 - 1.0 / n)
    assert np.allclose(got, expected, atol=1e-12) and got.sum() == pytest.approx(1.0, abs=1e-12)
    one = planning.included_count_pmf([0.0, 1.0], n)  # one vote: counted with probability E[nu]
    assert one[1] == pytest.approx((1.0 + 1.0 / n) / 2.0, rel=1e-12)
    assert np.array_equal(planning.included_count_pmf(pmf[:2], 1), pmf[:2])  # n = 1: nu = 1


def test_included_count_pmf_is_the_generators_law():
    """The generator's own draws (``individual_charging_draws``) on coordinated votes of the alpha mixture: the
    counted teachers voting the shared token follow the planned law."""
    from ensembles.generation import individual_charging_draws
    from ensembles.histograms import coordinated_votes
    from ensembles.synthetic import alpha_mixture

    n, alpha, samples = 30, 0.4, 4000
    rng = np.random.default_rng(11)
    votes = coordinated_votes(alpha_mixture(n, 1 + n, alpha, rng), samples, rng)
    active = np.arange(n)
    counted = np.array([int((individual_charging_draws(rng, n, active)[1] & (row == 0)).sum()) for row in votes])
    law = planning.included_count_pmf(planning.agreement_count_pmf(n, alpha), n)
    empirical = np.bincount(counted, minlength=n + 1) / samples
    assert np.max(np.abs(np.cumsum(empirical) - np.cumsum(law))) < 1.63 / math.sqrt(samples)


def test_public_candidate_step_law_matches_the_real_mechanism():
    """The step's hit and release rates, the candidate always the shared token (P = 1), against runs of the
    registered mechanism on counts drawn from the planned law; the token figure leaves out what the noise alone
    releases."""
    n, alpha, e = 60, 0.6, 0.1
    mechanism = mechanisms_registry.build_mechanism("between-thresholds", e, 1e-7, "replace-one", num_teachers=n)
    shared = planning.included_count_pmf(planning.agreement_count_pmf(n, alpha), n)
    other = planning.included_count_pmf([0.0, 1.0], n)
    law = plan.public_candidate_outcomes(mechanism, n, shared, other, 1.0)
    rng = np.random.default_rng(5)
    samples = 20000
    codes = mechanism.run_batch(rng.choice(n + 1, size=samples, p=shared), rng=rng).values
    hit, released = np.mean(codes == BETWEEN), np.mean(codes != 0)
    noise = law["noise_release"]
    assert noise == pytest.approx(sum(mechanism.outcome_probabilities(0)[1:]), rel=1e-12)
    se = math.sqrt(0.25 / samples)
    assert abs(hit - law["target"]) < 4 * se
    assert abs((released - noise) - law["token"]) < 4 * se
    assert 0.0 < law["token"] < released  # a lower bound on the releases
    # A candidate the teachers do not share is charged (its one vote gives at least a voteless token's hits) and
    # never counted as a private token.
    half = plan.public_candidate_outcomes(mechanism, n, shared, other, 0.5)
    assert half["token"] == pytest.approx(0.5 * law["token"], rel=1e-12)
    assert half["target"] >= 0.5 * law["target"] + 0.5 * mechanism.outcome_probabilities(0)[1] - 1e-15


def test_public_agreement_zero_releases_nothing():
    n = 300
    mechanism = mechanisms_registry.build_mechanism("between-thresholds", 0.01, 1e-7, "replace-one", num_teachers=n)
    shared = planning.included_count_pmf(planning.agreement_count_pmf(n, 0.9), n)
    zero = plan.public_candidate_outcomes(mechanism, n, shared, planning.included_count_pmf([0.0, 1.0], n), 0.0)
    assert zero["token"] == 0.0 and zero["target"] > 0.0  # nothing released the teachers back, hits still charged
    d = _plan_json("--teachers", "300", "--alpha", "0.9", "--public-agreement", "0", "--runners-up", "0")
    assert d["public_agreement"] == 0.0
    assert not [e for e in d["configurations"] if e["mechanism"] == "between-thresholds"]
    reasons = {(item["mechanism"], item["accountant"]): item["why"] for item in d["not_compared"]}
    for pair in PUBLIC:
        assert reasons[pair].startswith("--public-agreement 0: "), pair


def test_without_public_agreement_the_query_is_not_compared_and_the_reason_names_the_option():
    d = _plan_json("--teachers", "300", "--alpha", "0.9", "--runners-up", "0")
    assert d["public_agreement"] is None
    assert not [e for e in d["configurations"] if e["mechanism"] == "between-thresholds"]
    reasons = {(item["mechanism"], item["accountant"]): item["why"] for item in d["not_compared"]}
    for accountant in ("target-charging", "individual-charging", "pld", "basic", "advanced"):
        assert "--public-agreement P" in reasons[("between-thresholds", accountant)]
    assert "individual-charging" not in {e["accountant"] for e in d["configurations"]}


# -- individual charging: the worst teacher -------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "g", "n"), [(1, 1, 1), (3, 2, 10), (31, 72, 300), (1341, 81, 300), (5, 300, 300)])
def test_worst_teacher_is_never_cheaper_than_the_even_spread(limit, g, n):
    worst = planning.individual_charging_hits(limit, g, n, "worst")
    even = planning.individual_charging_hits(limit, g, n, "even")
    assert worst == limit <= even
    assert planning.individual_charges(even, g, n, "even") <= limit < planning.individual_charges(even + 1, g, n, "even")
    for hits in (0, 1, limit, even):
        assert planning.individual_charges(hits, g, n, "worst") >= planning.individual_charges(hits, g, n, "even")
    with pytest.raises(ValueError, match="^spread "):
        planning.individual_charges(1, g, n, "uniform")


def test_individual_charging_entry_is_conservative_and_its_accountant_agrees(with_public):
    entries = [e for e in with_public["configurations"] if e["accountant"] == "individual-charging"]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["mechanism"] == "between-thresholds" and entry["groups"] == 1 and entry["figure"] == "lower bound"
    details = entry["individual"]
    worst, even = details["worst_teacher"], details["even_spread"]
    tau = details["per_teacher_limit"]
    assert entry["limits"] == {"hits_per_group": tau, "queries": None} and worst["hits"] == tau
    # The ranked figure is the conservative one: never more hits or tokens, nor a cheaper worst teacher.
    assert worst["epsilon_at_planned_hits"] >= even["epsilon_at_planned_hits"]
    assert worst["epsilon_at_planned_hits"] <= with_public["budget"]["epsilon"]
    assert even["hits"] >= worst["hits"] and even["expected_private_tokens"] >= entry["expected_private_tokens"]
    # The accountant generate builds: the planned hits, all charging the same teachers, fit; the next is refused.
    n, budget = entry["teachers"], (entry["budget"]["epsilon"], entry["budget"]["delta"])
    mechanism = mechanisms_registry.build_mechanism("between-thresholds", entry["step_epsilon"], entry["step_delta"],
                                                    entry["relation"], num_teachers=n)
    accountant = build_accountant("individual-charging", budget, mechanism=mechanism, num_teachers=n)
    same = frozenset(range(details["charged_per_hit"]))
    hit = Release("between", mechanism.event, target_hit=True, charged_teachers=same)
    for _ in range(worst["hits"]):
        accountant.record(hit)
    spent = accountant.spent()
    assert spent[0] <= budget[0] and spent[1] <= budget[1]
    with pytest.raises(BudgetExhaustedError):
        accountant.record(hit)
    # Spread evenly (in turn), the optimistic number of hits fits too: the figure is reachable under its assumption.
    spread = build_accountant("individual-charging", budget, mechanism=mechanism, num_teachers=n)
    g = details["charged_per_hit"]
    for h in range(even["hits"]):
        teachers = frozenset(int(t) for t in (np.arange(g) + h * g) % n)
        spread.record(Release("between", mechanism.event, target_hit=True, charged_teachers=teachers))
    assert int(spread.counters.max()) == planning.individual_charges(even["hits"], g, n, "even") <= tau


# -- the printed runs ------------------------------------------------------------------------------------------


def test_public_candidate_runs_are_ranked_and_generate_accepts_them(with_public):
    d = with_public
    assert d["public_agreement"] == 0.5 and d["fits"]
    found = {(e["mechanism"], e["accountant"]) for e in d["configurations"]}
    assert set(PUBLIC) <= found
    ranked = [d["best"], *d["runners_up"]]
    tokens = [e["expected_private_tokens"] for e in ranked]
    assert tokens == sorted(tokens, reverse=True)
    assert tokens[0] == max(e["expected_private_tokens"] for e in d["configurations"])
    assert set(PUBLIC) <= {(e["mechanism"], e["accountant"]) for e in ranked}
    reasons = {(item["mechanism"], item["accountant"]) for item in d["not_compared"]}
    assert not reasons & set(PUBLIC)  # compared: no longer listed as not compared
    for entry in d["configurations"]:
        if entry["mechanism"] == "between-thresholds":
            _check_generate_accepts(entry)
            assert entry["public_agreement"] == 0.5 and not entry["law_exact"]
            assert entry["records"] * entry["max_tokens"] >= entry["expected_steps"]


def test_no_planned_run_exceeds_its_budget(with_public):
    """The planned hits (target charging) and steps (PLD) of the public-candidate runs, charged through the
    accountant generate builds: all fit within the budget, and one more is refused."""
    for entry in with_public["configurations"]:
        if entry["mechanism"] != "between-thresholds" or entry["accountant"] == "individual-charging":
            continue  # individual charging: test_individual_charging_entry_is_conservative_and_its_accountant_agrees
        n, budget = entry["teachers_per_group"], (entry["budget"]["epsilon"], entry["budget"]["delta"])
        mechanism = mechanisms_registry.build_mechanism("between-thresholds", entry["step_epsilon"],
                                                        entry["step_delta"], entry["relation"], num_teachers=n)
        accountant = accountants_registry.accountant_class(entry["accountant"])(budget=budget)
        if entry["accountant"] == "target-charging":
            hits = entry["limits"]["hits_per_group"]
            for _ in range(hits):
                accountant.record(Release("between", mechanism.event, target_hit=True))
            with pytest.raises(BudgetExhaustedError):
                accountant.record(Release("between", mechanism.event, target_hit=True))
        else:
            steps = entry["limits"]["steps_per_group"]
            accountant.compose(mechanism.event, steps)
            assert not accountant.can_afford(mechanism.event)
        spent = accountant.spent()
        assert spent[0] <= budget[0] and spent[1] <= budget[1], entry["accountant"]


def test_the_text_answer_says_what_individual_charging_assumes(capsys):
    assert main(["plan", "best", "--teachers", "300", "--alpha", "0.9", "--public-agreement", "0.5",
                 "--runners-up", "8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan best: 300 teachers, agreement alpha 0.9, public agreement 0.5, ")
    assert "between-thresholds charged by individual-charging" in text
    assert "the worst teacher charged on every hit (conservative)" in text
    assert "optimistic, not ranked: charges spread evenly over the 300 teachers" in text
    assert "any number of queries (a pure query)" in text
    assert "public candidate (between-thresholds, --public-agreement 0.5)" in text


@pytest.mark.parametrize("value", ["1.5", "-0.1", "abc", "nan"])
def test_bad_public_agreement_is_one_line_naming_the_option_and_the_value(capsys, value):
    assert main(["plan", "best", "--teachers", "300", "--alpha", "0.9", f"--public-agreement={value}"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and "--public-agreement" in lines[0] and value in lines[0], err
